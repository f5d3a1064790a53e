//! `metrics-overhead` and `tracing-overhead`: what metrics, or span export, cost a drain.
//! `--pairs` pairs of drains (default settings, WASM reference plugin, the `--rows` backlog),
//! each drain against a broker started for it: one with the feature off, one with it on —
//! `[telemetry] listen` set (metrics recorded, endpoints served, the backlog sampled,
//! librdkafka's statistics on), or `[tracing]` exporting every row (`sample_ratio = 1.0`: the
//! standard rows have no parent, so each gets a trace of its own, four spans) to an OTLP/HTTP
//! stub on this machine that answers every export with 200 (its CPU is not the relay's).
//! The order alternates from pair to pair, so whatever drifts during the run (the database's
//! caches, other load) falls on both sides alike.
//!
//! One drain varies by ±7 % from the next in either mode, more than the cost being measured,
//! so the figure is the median of the per-pair ratios on / off, with its quartiles: with
//! enough pairs that median is steady to a point or two where a comparison of two medians is
//! not.

use super::THROUGHPUT;
use super::drain::{self, Drain};
use crate::brokers::Broker;
use crate::cli::Settings;
use crate::outbox;
use crate::report::Figure;
use crate::stats::{percentile, sorted};
use sluice_testkit::DbTable;
use sluice_testkit::OwnTansu;
use sluice_testkit::config::Plugin;

pub(super) const NAME: &str = "metrics-overhead";
/// The scenario of span export's cost.
pub(super) const TRACING_NAME: &str = "tracing-overhead";

/// What a pair's second drain turns on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Feature {
    Metrics,
    Tracing,
}

impl Feature {
    fn name(self) -> &'static str {
        match self {
            Self::Metrics => NAME,
            Self::Tracing => TRACING_NAME,
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Self::Metrics => "metrics",
            Self::Tracing => "tracing",
        }
    }
}

/// One drain's figures.
#[derive(Debug, Clone, Copy)]
struct Measured {
    rows_per_second: f64,
    relay_cpu_per_1k: f64,
}

pub(super) async fn run(settings: &Settings, feature: Feature) -> anyhow::Result<Vec<Figure>> {
    let name = feature.name();
    let noun = feature.noun();
    let collector = match feature {
        Feature::Tracing => Some(OtlpStub::start().await?),
        Feature::Metrics => None,
    };
    let plugin = Plugin::Wasm(settings.reference_plugin()?);
    let table = outbox::create(settings, "overhead", None).await?;
    // (pair, metrics on): off first in even pairs, on first in odd ones.
    let order: Vec<(usize, bool)> = (0..settings.pairs)
        .flat_map(|pair| {
            let on_first = pair % 2 == 1;
            [(pair, on_first), (pair, !on_first)]
        })
        .collect();
    let drains = outbox::for_each(table, order, async |table, (pair, on)| {
        let tracing = collector.as_ref().filter(|_| on).map(OtlpStub::endpoint);
        let measured = measure(
            settings,
            table,
            &plugin,
            on && feature == Feature::Metrics,
            tracing,
        )
        .await?;
        eprintln!(
            "    pair {}: {noun} {}: {:.0} rows/s, relay CPU {:.2} ms per 1,000 rows",
            pair + 1,
            if on { "on " } else { "off" },
            measured.rows_per_second,
            measured.relay_cpu_per_1k * 1000.0
        );
        Ok((pair, on, measured))
    })
    .await?;

    let side = |on: bool, pick: fn(&Measured) -> f64| -> Vec<f64> {
        drains
            .iter()
            .filter(|(_, o, _)| *o == on)
            .map(|(_, _, m)| pick(m))
            .collect()
    };
    let ratios = |pick: fn(&Measured) -> f64| -> Vec<f64> {
        (0..settings.pairs)
            .filter_map(|pair| {
                let of = |on: bool| {
                    drains
                        .iter()
                        .find(|(p, o, _)| *p == pair && *o == on)
                        .map(|(_, _, m)| pick(m))
                };
                Some(of(true)? / of(false)?)
            })
            .collect()
    };
    let rate = |m: &Measured| m.rows_per_second;
    let cpu = |m: &Measured| m.relay_cpu_per_1k;
    let throughput_ratios = sorted(ratios(rate));
    let slower = throughput_ratios.iter().filter(|r| **r < 1.0).count();
    let quartile = |p: f64| percentile(&throughput_ratios, p).unwrap_or(f64::NAN);
    let median = |values: Vec<f64>| percentile(&sorted(values), 50.0).unwrap_or(f64::NAN);

    let pairs = settings.pairs;
    let median_ratio = Figure::new(
        name,
        "throughput on / off: median of the pairs",
        quartile(50.0),
        "ratio",
    );
    // Metrics must cost at most 3 %; tracing every row costs what it costs (stated).
    let median_ratio = match feature {
        Feature::Metrics => median_ratio.at_least(0.97),
        Feature::Tracing => median_ratio,
    };
    Ok(vec![
        Figure::new(
            name,
            &format!("{THROUGHPUT}, {noun} off (median of {pairs})"),
            median(side(false, rate)),
            "rows/s",
        ),
        Figure::new(
            name,
            &format!("{THROUGHPUT}, {noun} on (median of {pairs})"),
            median(side(true, rate)),
            "rows/s",
        ),
        median_ratio,
        Figure::new(
            name,
            "throughput on / off: first quartile",
            quartile(25.0),
            "ratio",
        ),
        Figure::new(
            name,
            "throughput on / off: third quartile",
            quartile(75.0),
            "ratio",
        ),
        Figure::new(
            name,
            &format!("pairs where {noun} on was slower"),
            slower as f64,
            "pairs",
        ),
        Figure::new(
            name,
            &format!("relay CPU per 1,000 rows, {noun} off (median)"),
            median(side(false, cpu)),
            "CPU s",
        ),
        Figure::new(
            name,
            &format!("relay CPU per 1,000 rows, {noun} on (median)"),
            median(side(true, cpu)),
            "CPU s",
        ),
        Figure::new(
            name,
            "relay CPU on / off: median of the pairs",
            median(ratios(cpu)),
            "ratio",
        ),
    ])
}

async fn measure(
    settings: &Settings,
    table: &DbTable,
    plugin: &Plugin,
    metrics: bool,
    tracing: Option<String>,
) -> anyhow::Result<Measured> {
    let broker = OwnTansu::fresh()?;
    let telemetry = if metrics {
        Some(format!(
            "127.0.0.1:{}",
            sluice_testkit::broker::try_free_port()?
        ))
    } else {
        None
    };
    let settings = Settings {
        kafka: broker.bootstrap(),
        telemetry,
        ..settings.clone()
    };
    let drain = Drain {
        label: NAME,
        stem: "overhead",
        plugin: plugin.clone(),
        rows: settings.rows,
        cache_dir: None,
        extra: tracing.map(|endpoint| {
            (
                String::new(),
                format!("[tracing]\notlp_endpoint = \"{endpoint}\"\nsample_ratio = 1.0\n"),
            )
        }),
        broker: Broker::Kafka,
    };
    let figures = drain::measure(&settings, &drain, table).await?;
    let value = |name: &str| {
        figures
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.value)
            .ok_or_else(|| anyhow::anyhow!("no figure {name:?} was measured"))
    };
    let measured = Measured {
        rows_per_second: value(THROUGHPUT)?,
        relay_cpu_per_1k: value("relay CPU per 1,000 rows")?,
    };
    drop(broker);
    Ok(measured)
}

/// An OTLP/HTTP endpoint that reads each request and answers 200 with an empty
/// `ExportTraceServiceResponse`, so the relay's export runs as against a collector while the
/// benchmark spends next to nothing on it.
struct OtlpStub {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpStub {
    async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(Self::serve(stream));
            }
        });
        Ok(Self { port, task })
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Answers the requests of one keep-alive connection until it closes.
    async fn serve(stream: tokio::net::TcpStream) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let mut stream = BufReader::new(stream);
        loop {
            let mut length = 0usize;
            let mut line = String::new();
            loop {
                line.clear();
                match stream.read_line(&mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let header = line.trim_end();
                if header.is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            if stream.read_exact(&mut body).await.is_err() {
                return;
            }
            let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
            if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

impl Drop for OtlpStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}
