//! Reading a relay's HTTP endpoints: a plain HTTP/1.0 GET, and the samples of its `/metrics`
//! (Prometheus text format).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, bail};

/// How long a request may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// A plain HTTP/1.0 GET of `path` on `127.0.0.1:port`: the status code and the body, or
/// `None` when nothing answers (the relay is not listening yet).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_at(&format!("127.0.0.1:{port}"), path)
}

/// [`http_get`] of `addr` (`host:port`).
pub fn http_get_at(addr: &str, path: &str) -> Option<(u16, String)> {
    http_request(addr, "GET", path, None)
}

/// A plain HTTP/1.0 request (`method` `path`, with `authorization` as the `Authorization`
/// header when given) to `addr`: the status code and the body.
pub fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT)).ok()?;
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    // HTTP/1.0: the body ends with the connection, never chunked.
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// `GET /metrics` from the relay listening on `listen` (`host:port`); the body.
pub async fn metrics(listen: &str) -> anyhow::Result<String> {
    let addr = listen.to_owned();
    let answer = tokio::task::spawn_blocking(move || http_get_at(&addr, "/metrics"))
        .await
        .context("the scrape task failed")?;
    match answer {
        Some((200, body)) => Ok(body),
        Some((code, _)) => bail!("http://{listen}/metrics answered {code}"),
        None => bail!("http://{listen}/metrics sent no HTTP response"),
    }
}

/// The samples of a Prometheus text exposition: `name{labels}` → value.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of every sample of metric `name` whose labels include each of `labels`
/// (`key="value"` strings).
pub fn metric_sum(samples: &HashMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            metric == name && labels.iter().all(|l| rest.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

/// The sum of every series of `name` (any labels) in the exposition `text`; 0 when there is
/// none.
pub fn sum(text: &str, name: &str) -> f64 {
    metric_sum(&parse_metrics(text), name, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_label_set_of_exactly_that_name() {
        let samples = parse_metrics(
            "# HELP x_seconds t\n\
             x_seconds_sum{tenant=\"a\"} 1.5\n\
             x_seconds_sum{tenant=\"b\"} 2\n\
             x_seconds_sum_other 100\n\
             x_seconds_count 7\n",
        );
        assert_eq!(metric_sum(&samples, "x_seconds_sum", &[]), 3.5);
        assert_eq!(
            metric_sum(&samples, "x_seconds_sum", &["tenant=\"b\""]),
            2.0
        );
        assert_eq!(metric_sum(&samples, "x_seconds_count", &[]), 7.0);
        assert_eq!(metric_sum(&samples, "missing", &[]), 0.0);
    }
}
