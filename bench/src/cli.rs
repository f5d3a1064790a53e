//! The command line: which scenario to run and with what sizes, resolved into [`Settings`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use sluice_testkit::Database;

use crate::brokers::Broker;

/// Where `bench/run` and the tests keep their database.
pub(crate) const DEFAULT_DATABASE_URL: &str = "postgres://root@127.0.0.1:5432/test";
/// MariaDB as `scripts/services.sh` checks it.
pub(crate) const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";
/// Tansu as started by `scripts/services.sh`.
pub(crate) const DEFAULT_KAFKA: &str = "127.0.0.1:9092";
/// NATS with JetStream, RabbitMQ (user guest) and Redis on their usual local ports.
pub(crate) const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";
pub(crate) const DEFAULT_RABBITMQ: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
pub(crate) const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379";

const FULL_ROWS: u64 = 200_000;
const QUICK_ROWS: u64 = 20_000;
const FULL_LANGUAGE_ROWS: u64 = 100_000;
const QUICK_LANGUAGE_ROWS: u64 = 20_000;
const FULL_TENANT_ROWS: u64 = 60_000;
const QUICK_TENANT_ROWS: u64 = 10_000;
const FULL_FAIRNESS_ROWS: u64 = 1_000_000;
const QUICK_FAIRNESS_ROWS: u64 = 100_000;
const FULL_NAIVE_ROWS: u64 = 10_000;
const QUICK_NAIVE_ROWS: u64 = 2_000;
const FULL_DURATION: Duration = Duration::from_secs(60);
const QUICK_DURATION: Duration = Duration::from_secs(10);
const FULL_NOTIFY_COST_DURATION: Duration = Duration::from_secs(10);
const QUICK_NOTIFY_COST_DURATION: Duration = Duration::from_secs(5);

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    about = "Benchmarks of the sluice relay against real PostgreSQL and Kafka (see bench/run)"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub options: Options,
}

#[derive(Subcommand, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// Every scenario below in sequence, then a Markdown table of all figures.
    All,
    /// SQL-only ceiling: claim + decode + DELETE on W connections through Sluice's PostgreSQL
    /// driver, no Kafka, no plugin.
    SqlCeiling,
    /// A naive one-message-at-a-time relay written in this crate, for scale.
    Naive,
    /// `sluice run` with the built-in route-by-aggregate router on the --rows backlog.
    DrainNative,
    /// `sluice run` with the WASM reference plugin on the --rows backlog.
    DrainWasm,
    /// The drain (defaults, WASM reference plugin) as a ratio of the pipeline limit
    /// 1/(1/SQL ceiling + 1/produce ceiling), and of the same with pgbench's claim-and-delete
    /// as the database's ceiling, all measured in each of 3 runs, each against a freshly
    /// started broker (needs `pgbench`).
    Pipeline,
    /// Where a drain's time goes, per stage (claim, transform, produce, mark + commit), from
    /// the relay's own metrics; `--baseline` compares with another sluice binary, `--plot`
    /// draws it.
    Stages,
    /// What metrics cost a drain: `--pairs` pairs of drains with metrics off and on (order
    /// alternating, a fresh broker each), the median of the per-pair throughput ratios. Not
    /// part of `all`.
    MetricsOverhead,
    /// What span export costs a drain: as `metrics-overhead`, with `[tracing]` exporting every
    /// row (to an OTLP/HTTP stub) in place of metrics. Not part of `all`.
    TracingOverhead,
    /// One, two and four `sluice run` processes on one table: aggregate drain rate and the
    /// share of the rows each sent.
    ScaleOut,
    /// Commit → Kafka latency at 1,000 rows/s, polling only and with NOTIFY.
    Latency,
    /// Database transactions/s and CPU % of a relay on an empty outbox.
    Idle,
    /// A good tenant's drain rate alone and next to a tenant whose plugin spins forever.
    Noisy,
    /// Start-up time with 50 WASM tenants, empty and filled compile cache.
    Startup,
    /// Insert rate of single-row transactions without and with the NOTIFY trigger.
    NotifyCost,
    /// The reference plugin in Rust, Python and JavaScript side by side: drain (rows/s, relay
    /// CPU per 1,000 rows, peak RSS) and start-up with an empty and a filled compile cache.
    /// Not part of `all`.
    Languages,
    /// Many tenants (issue #23): drain rows/s and relay peak RSS with no tenant, with 1,000
    /// configured tenants and with 10,000 free-form tenant values; start-up with 1,000
    /// configured. Not part of `all`.
    ///
    /// Cases: "none" (every row of the default tenant, one plugin instance); "1,000
    /// configured" (rows spread evenly over t0…t999, each with its own `[tenants.tN]` section:
    /// the same .wasm, its own config, the same topics); "10,000 free-form" (rows spread over
    /// 10,000 tenant values, no sections: `[plugins.default]` serves them, all 10,000 instances
    /// resident: `max_unconfigured_instances = 10000`). Each drain moves
    /// the same backlog: 60,000 rows (--quick 10,000; --rows sets it), because the free-form
    /// case runs at a few thousand rows/s today and 200,000 rows would take over a minute per
    /// drain. The three cases alternate 3 times, each drain against a broker started for it,
    /// with default settings and the WASM reference plugin; medians are reported, and their
    /// ratios to "none". Before the drains, the relay with 1,000 configured tenants starts
    /// twice on the empty outbox (empty, then filled compile cache): time to "relay started"
    /// and peak RSS by then; then the same over 10 distinct plugin files. Targets: 1,000 configured ≥ 0.85 and 10,000 free-form ≥ 0.60 of
    /// "none", peak RSS ≤ 1 GiB; a missed target is reported, not an error. About 1.5 minutes.
    Tenants,
    /// Live tenants' start-up (issue #40): 1,000 configured tenants over 200 distinct Rust and
    /// 20 distinct Python plugin files, `[plugins] load = "lazy"` and then `"eager"`, each with
    /// an empty and then the filled compile cache (`cache_max_mb = 512`): time from spawn to
    /// "relay started", to /readyz 200 and to the first and last row sent of a Rust tenant
    /// (t0, 10,000 rows) and a Python tenant (t200, 100 rows); peak RSS; the compile cache's
    /// size on disk afterwards. Needs the Python reference plugin (--python-plugin). Not part
    /// of `all`; the eager starts compile 220 components (many minutes on 2 cores).
    Lazy,
    /// A small tenant's commit → produce latency while a big tenant's backlog of 1,000,000
    /// rows (--quick 100,000; --rows sets it) drains, with claims in claim order only and with
    /// `relay.fair_share = 50` (issue #23), on PostgreSQL or (--database) MariaDB or SQLite.
    /// Target: the small tenant's p99 ≤ 1 s with fair_share. Not part of `all`.
    Fairness,
    /// Drains of the same backlog (--rows, default 200,000) with the WASM reference plugin,
    /// values published raw and as Avro through the test Schema Registry (issue #24),
    /// alternating 3 times: rows/s, relay CPU per 1,000 rows, the ratio avro / raw (target
    /// ≥ 0.8) and registry requests per drain. Not part of `all`.
    SchemaRegistry,
    /// Live rows' commit → Kafka latency at --rate while `sluice replay` publishes the --rows
    /// backlog of sent rows (default 200,000) again at 2,000 rows/s, and without a replay
    /// (issue #42). Not part of `all`.
    Replay,
    /// On PostgreSQL, MariaDB and SQLite: the SQL-only ceiling (through each database's driver)
    /// and drain-native, side by side.
    Databases,
    /// The pipeline measurement for each broker (issue #41): the SQL ceiling once, then per
    /// broker (--broker; default kafka, nats, rabbitmq, redis) its produce ceiling through the
    /// client its sink uses, and `sluice run` with the WASM reference plugin and `broker = "…"`
    /// draining the --rows backlog twice (a fresh relay, then a second backlog into the same
    /// relay): drain rows/s, the pipeline limit 1/(1/SQL + 1/produce), drain / limit, relay and
    /// broker CPU per 1,000 rows. Kafka: a fresh Tansu for the ceiling and for the drain; the
    /// others at --nats-url, --rabbitmq-url, --redis-url, with their own stream, queues or
    /// streams made for each measurement and deleted after it. Not part of `all`.
    Brokers,
    /// Partitioned outbox tables (issue #42), through the store driver: a plain and a
    /// partitioned table (`PARTITION BY RANGE (created_at)`, 22 daily partitions) each drained
    /// of the same --rows backlog (claim + mark `published_at`), then retention removes every
    /// row: chunked deletes + VACUUM on the plain table, dropped partitions on the other. Wall
    /// time and PostgreSQL CPU of each. Not part of `all`.
    Partitions,
}

#[derive(clap::Args)]
pub(crate) struct Options {
    /// PostgreSQL URL of the benchmark database.
    #[arg(
        long,
        global = true,
        env = "SLUICE_DATABASE_URL",
        hide_env_values = true,
        default_value = DEFAULT_DATABASE_URL
    )]
    database_url: String,
    /// MySQL/MariaDB URL of the benchmark database (the `databases` scenarios).
    #[arg(
        long,
        global = true,
        env = "SLUICE_BENCH_MYSQL_URL",
        hide_env_values = true,
        default_value = DEFAULT_MYSQL_URL
    )]
    mysql_url: String,
    /// The database of `fairness`: postgres (at --database-url), mariadb (at --mysql-url) or
    /// sqlite (a file in a temporary directory).
    #[arg(long, global = true, default_value = "postgres", value_parser = parse_database)]
    database: Database,
    /// Kafka bootstrap servers.
    #[arg(long, global = true, env = "SLUICE_BENCH_KAFKA", default_value = DEFAULT_KAFKA)]
    kafka: String,
    /// NATS server with JetStream of `brokers`.
    #[arg(long, global = true, env = "SLUICE_BENCH_NATS", default_value = DEFAULT_NATS)]
    nats_url: String,
    /// RabbitMQ broker of `brokers` (`amqp://user:password@host:port/vhost`).
    #[arg(
        long,
        global = true,
        env = "SLUICE_BENCH_RABBITMQ",
        hide_env_values = true,
        default_value = DEFAULT_RABBITMQ
    )]
    rabbitmq_url: String,
    /// Redis server of `brokers`.
    #[arg(long, global = true, env = "SLUICE_BENCH_REDIS", hide_env_values = true, default_value = DEFAULT_REDIS)]
    redis_url: String,
    /// A broker `brokers` measures (repeatable): kafka, nats, rabbitmq or redis [default:
    /// all four, in that order].
    #[arg(long = "broker", global = true, value_name = "BROKER", value_parser = parse_broker)]
    brokers: Vec<Broker>,
    /// Backlog size of sql-ceiling, drain-*, noisy and brokers [default: 200000, --quick 20000]; of
    /// languages [default: 100000, --quick 20000]; of each drain of tenants [default: 60000,
    /// --quick 10000]; of the big tenant of fairness [default: 1000000, --quick 100000].
    #[arg(long, global = true)]
    rows: Option<u64>,
    /// Measuring window of latency and idle [default: 60s, --quick 10s].
    #[arg(long, global = true, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Rows per second the latency scenario offers.
    #[arg(long, global = true, default_value_t = 1000)]
    rate: u64,
    /// Concurrent connections of sql-ceiling (the relay's default relay.workers).
    #[arg(long, global = true, default_value_t = 2)]
    workers: usize,
    /// The sluice binary [default: `sluice` next to this executable].
    #[arg(long, global = true)]
    sluice: Option<PathBuf>,
    /// The WASM reference plugin [default:
    /// <repo>/plugins/target/wasm32-wasip2/release/route_by_aggregate.wasm].
    #[arg(long, global = true)]
    plugin: Option<PathBuf>,
    /// The Python reference plugin of `languages` [default:
    /// <repo>/target/conformance/route_by_aggregate_py.wasm, built by tests/conformance/run or
    /// `plugins/route-by-aggregate-py/build.sh OUT.wasm`].
    #[arg(long, global = true)]
    python_plugin: Option<PathBuf>,
    /// The JavaScript (QuickJS) reference plugin of `languages` [default:
    /// <repo>/target/conformance/route_by_aggregate_js.wasm, built by tests/conformance/run or
    /// `plugins/route-by-aggregate-js/build.sh OUT.wasm`].
    #[arg(long, global = true)]
    js_plugin: Option<PathBuf>,
    /// Extra `[relay]` setting for the relays of drain-*, latency and noisy, as TOML
    /// (repeatable), e.g. `--relay workers=4 --relay batch_size=1000`: for trying settings
    /// side by side; the documented results use the defaults.
    #[arg(long = "relay", global = true, value_name = "KEY=VALUE", value_parser = parse_setting)]
    relay: Vec<(String, String)>,
    /// `[telemetry] listen` address for the relays of drain-*, latency and idle (metrics on),
    /// e.g. `127.0.0.1:19464`: for measuring what metrics cost, side by side with a run
    /// without it.
    #[arg(long, global = true, value_name = "ADDR")]
    telemetry: Option<String>,
    /// `stages`: another sluice binary (e.g. a build of an earlier commit) whose drain is
    /// broken down next to this one's.
    #[arg(long, global = true)]
    baseline: Option<PathBuf>,
    /// `stages`: also draw the breakdown as an SVG bar chart into this file.
    #[arg(long, global = true)]
    plot: Option<PathBuf>,
    /// `metrics-overhead`, `tracing-overhead`: pairs of drains (off, on) [default: 10, --quick 2].
    #[arg(long, global = true)]
    pairs: Option<usize>,
    /// Smaller sizes for a smoke test: 20,000 rows, 10 s windows.
    #[arg(long, global = true)]
    quick: bool,
    /// Also write the Markdown results table to this file.
    #[arg(long, global = true)]
    out: Option<PathBuf>,
}

/// Everything a scenario needs to know, with defaults filled in.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub database_url: String,
    /// MariaDB of the `databases` scenarios (SQLite files live in temporary directories).
    pub mysql_url: String,
    pub kafka: String,
    /// The brokers of `brokers` other than Kafka.
    pub nats_url: String,
    pub rabbitmq_url: String,
    pub redis_url: String,
    /// The brokers `brokers` measures, in order.
    pub brokers: Vec<Broker>,
    /// Backlog of sql-ceiling, drain-* and (good rows of) noisy.
    pub rows: u64,
    /// Backlog of each drain of `languages`.
    pub language_rows: u64,
    /// Backlog of each drain of `tenants`.
    pub tenant_rows: u64,
    /// The big tenant's backlog of `fairness`.
    pub fairness_rows: u64,
    /// The database of `fairness`.
    pub fairness_database: Database,
    /// Backlog of the naive relay.
    pub naive_rows: u64,
    /// Window of latency and idle.
    pub duration: Duration,
    /// Insert phase of notify-cost, per variant.
    pub notify_cost_duration: Duration,
    /// Connections of sql-ceiling.
    pub workers: usize,
    /// Rows per second offered by `latency`.
    pub rate: u64,
    /// The `sluice` binary (absolute).
    pub sluice: PathBuf,
    /// The WASM reference plugin (not checked until a scenario needs it).
    pub plugin: PathBuf,
    /// The Python and JavaScript reference plugins (not checked until `languages` needs them).
    pub python_plugin: PathBuf,
    pub js_plugin: PathBuf,
    /// `tests/plugins/hostile`, used by noisy (not checked until needed).
    pub hostile_plugin: PathBuf,
    /// `tests/plugins/contract-v0-1`, the latency scenarios' router (not checked until needed).
    pub send_time_plugin: PathBuf,
    pub quick: bool,
    pub out: Option<PathBuf>,
    /// `--relay` settings, added to the scenarios' `[relay]`.
    pub relay: Vec<(String, String)>,
    /// `--telemetry`: `[telemetry] listen` of the drain, latency and idle relays.
    pub telemetry: Option<String>,
    /// `--baseline`: a second sluice binary for `stages` (absolute).
    pub baseline: Option<PathBuf>,
    /// `--plot`: where `stages` draws its chart.
    pub plot: Option<PathBuf>,
    /// Pairs of drains of `metrics-overhead`.
    pub pairs: usize,
}

fn parse_setting(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

fn parse_broker(s: &str) -> Result<Broker, String> {
    Broker::ALL
        .into_iter()
        .find(|b| b.as_str() == s)
        .ok_or_else(|| format!("expected kafka, nats, rabbitmq or redis, got {s:?}"))
}

fn parse_database(s: &str) -> Result<Database, String> {
    match s {
        "postgres" => Ok(Database::Postgres),
        "mariadb" | "mysql" => Ok(Database::Mariadb),
        "sqlite" => Ok(Database::Sqlite),
        _ => Err(format!("expected postgres, mariadb or sqlite, got {s:?}")),
    }
}

impl Options {
    /// Fills in defaults and checks what every scenario needs (the sluice binary).
    pub(crate) fn resolve(self) -> anyhow::Result<Settings> {
        if self.workers == 0 {
            bail!("--workers must be at least 1");
        }
        let rows = self
            .rows
            .unwrap_or(if self.quick { QUICK_ROWS } else { FULL_ROWS });
        if rows == 0 {
            bail!("--rows must be at least 1");
        }
        let language_rows = self.rows.unwrap_or(if self.quick {
            QUICK_LANGUAGE_ROWS
        } else {
            FULL_LANGUAGE_ROWS
        });
        let tenant_rows = self.rows.unwrap_or(if self.quick {
            QUICK_TENANT_ROWS
        } else {
            FULL_TENANT_ROWS
        });
        let fairness_rows = self.rows.unwrap_or(if self.quick {
            QUICK_FAIRNESS_ROWS
        } else {
            FULL_FAIRNESS_ROWS
        });
        let duration = self.duration.unwrap_or(if self.quick {
            QUICK_DURATION
        } else {
            FULL_DURATION
        });
        if duration.is_zero() {
            bail!("--duration must be longer than 0");
        }
        let pairs = self.pairs.unwrap_or(if self.quick { 2 } else { 10 });
        if pairs == 0 {
            bail!("--pairs must be at least 1");
        }
        let sluice = match self.sluice {
            Some(path) => path,
            None => std::env::current_exe()
                .context("cannot find this executable's path to locate `sluice` next to it")?
                .with_file_name("sluice"),
        };
        let sluice = existing_file(
            &sluice,
            "the sluice binary (build it with `cargo build --release -p sluice`, or pass --sluice)",
        )?;
        let root = repo_root();
        Ok(Settings {
            database_url: self.database_url,
            mysql_url: self.mysql_url,
            kafka: self.kafka,
            nats_url: self.nats_url,
            rabbitmq_url: self.rabbitmq_url,
            redis_url: self.redis_url,
            brokers: if self.brokers.is_empty() {
                Broker::ALL.to_vec()
            } else {
                self.brokers
            },
            rows,
            language_rows,
            tenant_rows,
            fairness_rows,
            fairness_database: self.database,
            naive_rows: if self.quick {
                QUICK_NAIVE_ROWS
            } else {
                FULL_NAIVE_ROWS
            },
            duration,
            notify_cost_duration: if self.quick {
                QUICK_NOTIFY_COST_DURATION
            } else {
                FULL_NOTIFY_COST_DURATION
            },
            workers: self.workers,
            rate: self.rate,
            relay: self.relay,
            telemetry: self.telemetry,
            sluice,
            plugin: self.plugin.unwrap_or_else(|| root.join(REFERENCE_PLUGIN)),
            python_plugin: self
                .python_plugin
                .unwrap_or_else(|| root.join(PYTHON_PLUGIN)),
            js_plugin: self.js_plugin.unwrap_or_else(|| root.join(JS_PLUGIN)),
            hostile_plugin: root.join(HOSTILE_PLUGIN),
            send_time_plugin: root.join(SEND_TIME_PLUGIN),
            quick: self.quick,
            out: self.out,
            baseline: self
                .baseline
                .map(|path| existing_file(&path, "the --baseline sluice binary"))
                .transpose()?,
            plot: self.plot,
            pairs,
        })
    }
}

const REFERENCE_PLUGIN: &str = "plugins/target/wasm32-wasip2/release/route_by_aggregate.wasm";
const PYTHON_PLUGIN: &str = "target/conformance/route_by_aggregate_py.wasm";
const JS_PLUGIN: &str = "target/conformance/route_by_aggregate_js.wasm";
const HOSTILE_PLUGIN: &str = "tests/plugins/target/wasm32-wasip2/release/test_hostile.wasm";
const SEND_TIME_PLUGIN: &str = "tests/plugins/target/wasm32-wasip2/release/test_contract_v0_1.wasm";

impl Settings {
    /// The WASM reference plugin as an absolute path, or an error saying how to build it.
    pub(crate) fn reference_plugin(&self) -> anyhow::Result<PathBuf> {
        existing_file(
            &self.plugin,
            "the reference plugin (build it with `cd plugins && cargo build --release --target wasm32-wasip2`, or pass --plugin)",
        )
    }

    /// The Python reference plugin as an absolute path, or an error saying how to build it.
    pub(crate) fn python_plugin(&self) -> anyhow::Result<PathBuf> {
        existing_file(
            &self.python_plugin,
            "the Python reference plugin (build it with `plugins/route-by-aggregate-py/build.sh target/conformance/route_by_aggregate_py.wasm`, or pass --python-plugin)",
        )
    }

    /// The JavaScript reference plugin as an absolute path, or an error saying how to build it.
    pub(crate) fn js_plugin(&self) -> anyhow::Result<PathBuf> {
        existing_file(
            &self.js_plugin,
            "the JavaScript reference plugin (build it with `plugins/route-by-aggregate-js/build.sh target/conformance/route_by_aggregate_js.wasm`, or pass --js-plugin)",
        )
    }

    /// The router of the scenarios that read when a message was sent from its Kafka record
    /// timestamp (latency, replay, fairness): `tests/plugins/contract-v0-1` routes like the
    /// reference plugin (`<topic_prefix><aggregate type>`, key = aggregate id, payload as it
    /// is) but, built against contract 0.1.0, sets no timestamp, so the record's CreateTime is
    /// librdkafka's time of the send. The reference plugins set the row's `created_at`
    /// (contract 0.3.0), which says nothing about the relay.
    pub(crate) fn send_time_plugin(&self) -> anyhow::Result<PathBuf> {
        existing_file(
            &self.send_time_plugin,
            "the contract-v0-1 test plugin (build it with `cd tests/plugins && cargo build --release --target wasm32-wasip2`)",
        )
    }

    /// The hostile test plugin as an absolute path, or an error saying how to build it.
    pub(crate) fn hostile_plugin(&self) -> anyhow::Result<PathBuf> {
        existing_file(
            &self.hostile_plugin,
            "the hostile test plugin (build it with `cd tests/plugins && cargo build --release --target wasm32-wasip2`)",
        )
    }
}

/// The repository root: the parent of this crate's directory.
fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest.to_path_buf())
}

/// `path` made absolute (relay configs live in temporary directories, so relative paths would
/// resolve against the wrong place), or an error naming `what` is missing.
fn existing_file(path: &Path, what: &str) -> anyhow::Result<PathBuf> {
    if !path.is_file() {
        bail!("{what}: {} does not exist", path.display());
    }
    std::fs::canonicalize(path)
        .with_context(|| format!("{what}: cannot resolve {}", path.display()))
}
