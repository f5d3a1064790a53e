//! Reading a relay's `/metrics` (Prometheus text format) from the benchmark.

use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// `GET /metrics` from the relay listening on `listen` (`host:port`); the body.
pub async fn metrics(listen: &str) -> anyhow::Result<String> {
    tokio::time::timeout(SCRAPE_TIMEOUT, get(listen, "/metrics"))
        .await
        .with_context(|| format!("scraping http://{listen}/metrics timed out"))?
}

async fn get(listen: &str, path: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(listen)
        .await
        .with_context(|| format!("cannot connect to {listen}"))?;
    // HTTP/1.0: the body ends with the connection, never chunked.
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {listen}\r\n\r\n").as_bytes())
        .await
        .context("cannot send the scrape request")?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .context("cannot read the scrape response")?;
    let response = String::from_utf8_lossy(&response);
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        bail!("http://{listen}{path} sent no HTTP response");
    };
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!(
            "http://{listen}{path} answered {}",
            head.lines().next().unwrap_or("")
        );
    }
    Ok(body.to_owned())
}

/// The sum of every series of `name` (any labels) in `text`; 0 when there is none.
pub fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            // `name` itself, not a longer name that starts with it.
            let rest = match rest.as_bytes().first() {
                Some(b'{') => &rest[rest.find('}')? + 1..],
                Some(b' ') => rest,
                _ => return None,
            };
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_label_set_of_exactly_that_name() {
        let text = "# HELP x_seconds t\n\
                    x_seconds_sum{tenant=\"a\"} 1.5\n\
                    x_seconds_sum{tenant=\"b\"} 2\n\
                    x_seconds_sum_other 100\n\
                    x_seconds_count 7\n";
        assert_eq!(sum(text, "x_seconds_sum"), 3.5);
        assert_eq!(sum(text, "x_seconds_count"), 7.0);
        assert_eq!(sum(text, "missing"), 0.0);
    }
}
