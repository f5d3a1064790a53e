//! `sluice-bench`: the benchmark harness of Sluice. It drives the real `sluice` binary (release
//! build) against a real PostgreSQL and a real Kafka-protocol broker, measures it from the
//! outside (row counts in the outbox, messages in Kafka, `/proc` of the relay process) and
//! prints every figure with its unit, then a Markdown table of all of them plus the machine.
//!
//! # Running
//!
//! ```sh
//! bench/run                     # everything: services, plugins, release builds, then `all`
//! bench/run --quick             # smoke test: 20,000-row backlogs, 10 s windows (~2 min)
//! bench/run --out results.md    # also write the Markdown table to a file
//! target/release/sluice-bench latency --duration 30s   # one scenario (services already up)
//! ```
//!
//! Full sizes (200,000-row backlogs, 60 s windows) should take about 6 minutes on 2 cores. Defaults:
//! database `postgres://root@127.0.0.1:5432/test` (`--database-url` or `SLUICE_DATABASE_URL`),
//! broker `127.0.0.1:9092` (`--kafka` or `SLUICE_BENCH_KAFKA`), the `sluice` binary next to
//! this executable (`--sluice`), the reference plugin built in `plugins/` (`--plugin`).
//!
//! # Scenarios (in the order `all` runs them)
//!
//! Each one migrates its own outbox table with `sluice migrate`, creates its own topics
//! (3 partitions), fills the table with 256-byte JSON rows (two aggregate types, 1,000 ids) and
//! drops the table at the end. Relays run as child processes with `RUST_LOG=warn`.
//!
//! - `sql-ceiling` — the database's own limit for Sluice's SQL, through Sluice's store driver:
//!   `--workers` connections each looping claim (500 rows, `FOR UPDATE SKIP LOCKED`) → decode →
//!   `DELETE` → `COMMIT` over the `--rows` backlog. No Kafka, no plugin. rows/s.
//! - `naive` — an honest seed-style relay inside this crate: one loop, one transaction per 500
//!   rows claimed through the store driver, each message sent and awaited one at a time, then
//!   the batch marked; 10,000 rows. rows/s.
//! - `drain-native`, `drain-wasm` — `sluice run` with the built-in router resp. the WASM
//!   reference plugin draining the `--rows` backlog: rows/s, relay CPU seconds per 1,000 rows,
//!   peak RSS. `all` then prints the ratios drain-wasm / sql-ceiling (target ≥ 0.75),
//!   / naive (≥ 30) and / drain-native (≥ 0.95).
//! - `latency` — twice, polling only (`latency-poll`) and with a NOTIFY trigger and
//!   `notify_channel` (`latency-notify`): 1,000 rows/s (10 per transaction every 10 ms) for
//!   `--duration` into an idle relay; per row, commit → producer timestamp (a lower bound of the
//!   acknowledgement) and commit → consumer receipt (an upper bound), p50/p95/p99/max in ms.
//!   Targets p50 ≤ 10 ms, p99 ≤ 50 ms.
//! - `idle` — an idle relay on an empty outbox in its own database for `--duration`:
//!   transactions/s it causes there (target ≤ 1) and its CPU %.
//! - `noisy` — tenant isolation: a well-behaved tenant's drain rate alone and with 200 rows of a
//!   tenant whose plugin spins forever; ratio target ≥ 0.9.
//! - `startup` — 50 tenants with the WASM plugin: time to "relay started" with an empty
//!   compile cache and again with the cache filled.
//! - `notify-cost` — what the NOTIFY trigger costs writers: single-row insert transactions/s of
//!   8 connections without and with the trigger.
//! - `sql-ceiling-mariadb`, `drain-native-mariadb`, `sql-ceiling-sqlite`,
//!   `drain-native-sqlite` — the same ceiling and drain on MariaDB (`--mysql-url`, default
//!   `mysql://root@127.0.0.1:3306/test`) and on a SQLite file in a temporary directory; then
//!   `database-ratios`: each database's drain / its own ceiling. `sluice-bench databases` runs
//!   sql-ceiling and drain-native on all three databases in one go.
//!
//! Not in `all`: `metrics-overhead` — `--pairs` (default 10) pairs of `drain-wasm`-style drains,
//! one with metrics off and one with `[telemetry] listen` set, the order alternating, each
//! against a broker started for it: the median of the per-pair throughput ratios on / off
//! (target ≥ 0.97, i.e. metrics cost ≤ 3 %) with its quartiles, and relay CPU per 1,000 rows.
//! `tracing-overhead` is the same with `[tracing]` exporting every row (to an OTLP/HTTP stub
//! in the benchmark process) in place of metrics.
//!
//! Also not in `all`: `languages` — the reference plugin in Rust, Python and JavaScript
//! (`--plugin`, `--python-plugin`, `--js-plugin`): per language, time to "relay started" with an
//! empty and a filled compile cache (median of 3) and a drain of `--rows` (default 100,000;
//! median of 3) with rows/s, relay CPU per 1,000 rows and peak RSS; then a side-by-side table.
//!
//! Also not in `all`: `tenants` — many tenants (issue #23): drains of the same backlog
//! (default 60,000 rows) with no tenant, with 1,000 configured tenants (`[tenants.tN]`) and
//! with 10,000 free-form tenant values, alternating 3 times, each against a fresh broker:
//! rows/s, peak RSS and the ratios to one tenant (targets ≥ 0.85 and ≥ 0.60, RSS ≤ 1 GiB),
//! plus start-up time and RSS with 1,000 configured tenants.
//!
//! Also not in `all`: `lazy` — live tenants' start-up (issue #40): 1,000 configured tenants
//! over 200 distinct Rust and 20 distinct Python plugin files (`--python-plugin`),
//! `[plugins] load = "lazy"` then `"eager"`, each with an empty and then the filled compile
//! cache (`cache_max_mb = 512`): time to "relay started", to `/readyz` 200 and to a Rust and a
//! Python tenant's first and last row sent, peak RSS and the compile cache's size on disk.
//!
//! Also not in `all`: `schema-registry` — the same backlog drained with values published raw
//! and as Avro through the test kit's Schema Registry, alternating 3 times: rows/s, relay CPU
//! per 1,000 rows, the ratio avro / raw (target ≥ 0.8) and registry requests per drain.
//!
//! Also not in `all`: `brokers` — the pipeline measurement for each broker (issue #41): the
//! SQL ceiling once, then for Kafka, NATS JetStream, RabbitMQ and Redis Streams (`--broker`)
//! the produce ceiling through the client the broker's sink uses, and a drain with the WASM
//! reference plugin and `broker = "…"` (two backlogs into one relay): drain rows/s, the
//! pipeline limit, drain / limit, relay and broker CPU per 1,000 rows; then the brokers side by
//! side. Brokers at `--nats-url`, `--rabbitmq-url`, `--redis-url`; Kafka is a fresh Tansu.
//!
//! Also not in `all`: `partitions` — partitioned outbox tables (issue #42) through the store
//! driver: a plain and a partitioned table drained of the same backlog (claim + mark by id and
//! `created_at`), then retention removes every row: chunked deletes and VACUUM against dropped
//! partitions, wall time and PostgreSQL CPU.

mod brokers;
mod cli;
mod drain_watch;
mod kafka;
mod machine;
mod names;
mod outbox;
mod procstat;
mod relay;
mod report;
mod scenarios;
mod stats;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let outcome = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|runtime| runtime.block_on(scenarios::run(cli)));
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: at least one scenario failed (see the table above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
