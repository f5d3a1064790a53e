//! Prints the messages of Kafka topics from the beginning, one JSON line each (used by
//! `scripts/demo`; handy against Tansu, where Debian's kcat does not work).
//!
//! kafka-tail --topic T [--topic T2…] [--bootstrap 127.0.0.1:9092] [--expect N]
//!            [--timeout-secs 30] [--header NAME=VALUE]

use std::time::Duration;

use clap::Parser;
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[arg(long = "topic", required = true)]
    topics: Vec<String>,
    /// Stop once this many (matching) messages were read.
    #[arg(long, default_value_t = usize::MAX)]
    expect: usize,
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// Only print messages carrying this header value.
    #[arg(long, value_name = "NAME=VALUE")]
    header: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = args
        .header
        .as_deref()
        .map(|h| h.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .map(|f| f.ok_or_else(|| anyhow::anyhow!("--header must be NAME=VALUE")))
        .transpose()?;
    let matches = |m: &sluice_testkit::Received| match &filter {
        Some((k, v)) => m.header(k).as_deref() == Some(v.as_str()),
        None => true,
    };
    let messages = sluice_testkit::consume_until(
        &args.bootstrap,
        &args.topics,
        Duration::from_secs(args.timeout_secs),
        Duration::ZERO,
        |got| got.iter().filter(|m| matches(m)).count() >= args.expect,
    )?;
    let mut printed = 0;
    for m in messages.iter().filter(|m| matches(m)) {
        let headers: serde_json::Map<_, _> = m
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), json!(String::from_utf8_lossy(v))))
            .collect();
        println!(
            "{}",
            json!({
                "topic": m.topic,
                "partition": m.partition,
                "key": m.key_str(),
                "payload": String::from_utf8_lossy(m.payload.as_deref().unwrap_or_default()),
                "headers": headers,
            })
        );
        printed += 1;
        if printed >= args.expect {
            break;
        }
    }
    Ok(())
}
