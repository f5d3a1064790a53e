//! The scenarios, the order `all` runs them in, and the end of a run (table, `--out`).

mod brokers;
mod db_drain;
mod drain;
mod fairness;
mod idle;
mod languages;
mod latency;
mod lazy;
mod metrics_overhead;
mod naive;
mod noisy;
mod notify_cost;
mod partitions;
mod pgbench;
mod pipeline;
mod ratios;
mod replay;
mod scale_out;
mod schema_registry;
mod sql_ceiling;
mod stages;
mod startup;
mod tenants;

use anyhow::Context;

use crate::brokers::Broker;
use crate::cli::{Cli, Command, Settings};
use crate::machine::Machine;
use crate::report::{Figure, Report};
use sluice_testkit::Database;

/// Name of the rows/s figure of sql-ceiling, naive and the drains (the ratios look it up).
const THROUGHPUT: &str = "throughput";

/// Throughput, rows and time of a scenario that moved `rows` rows in `elapsed`.
fn rate_figures(scenario: &str, rows: u64, elapsed: std::time::Duration) -> Vec<Figure> {
    vec![
        Figure::new(
            scenario,
            THROUGHPUT,
            rows as f64 / elapsed.as_secs_f64(),
            "rows/s",
        ),
        Figure::new(scenario, "rows", rows as f64, "rows"),
        Figure::new(scenario, "time", elapsed.as_secs_f64(), "s"),
    ]
}

/// One measured step; `latency` is two steps, `all` adds the ratios after the drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    SqlCeiling,
    Naive,
    DrainNative,
    DrainWasm,
    Ratios,
    Pipeline,
    Stages,
    MetricsOverhead,
    TracingOverhead,
    ScaleOut,
    LatencyPoll,
    LatencyNotify,
    Idle,
    Noisy,
    Startup,
    NotifyCost,
    Languages,
    Tenants,
    Lazy,
    Fairness,
    SchemaRegistry,
    Replay,
    /// sql-ceiling on MariaDB or SQLite.
    SqlCeilingOn(Database),
    /// drain-native on MariaDB or SQLite.
    DrainOn(Database),
    /// Each database's drain against its own ceiling.
    DatabaseRatios,
    /// One broker's produce ceiling and drains, against the SQL ceiling measured before.
    Broker(Broker),
    /// The brokers side by side.
    BrokersSummary,
    Partitions,
}

impl Step {
    /// The scenario label in the output.
    fn label(self) -> String {
        match self {
            Self::SqlCeilingOn(database) => sql_ceiling::label(database),
            Self::DrainOn(database) => db_drain::label(database),
            Self::DatabaseRatios => ratios::DATABASES.to_owned(),
            Self::Broker(broker) => brokers::label(broker),
            other => other.fixed_label().to_owned(),
        }
    }

    fn fixed_label(self) -> &'static str {
        match self {
            Self::SqlCeiling => sql_ceiling::NAME,
            Self::Naive => naive::NAME,
            Self::DrainNative => drain::Routing::Native.label(),
            Self::DrainWasm => drain::Routing::Wasm.label(),
            Self::Ratios => ratios::NAME,
            Self::Pipeline => pipeline::NAME,
            Self::Stages => stages::NAME,
            Self::MetricsOverhead => metrics_overhead::NAME,
            Self::TracingOverhead => metrics_overhead::TRACING_NAME,
            Self::ScaleOut => scale_out::NAME,
            Self::LatencyPoll => latency::Wakeup::Poll.label(),
            Self::LatencyNotify => latency::Wakeup::Notify.label(),
            Self::Idle => idle::NAME,
            Self::Noisy => noisy::NAME,
            Self::Startup => startup::NAME,
            Self::NotifyCost => notify_cost::NAME,
            Self::Languages => languages::NAME,
            Self::Tenants => tenants::NAME,
            Self::Lazy => lazy::NAME,
            Self::Fairness => fairness::NAME,
            Self::SchemaRegistry => schema_registry::NAME,
            Self::Replay => replay::NAME,
            Self::BrokersSummary => brokers::SUMMARY,
            Self::Partitions => partitions::NAME,
            Self::SqlCeilingOn(_) | Self::DrainOn(_) | Self::DatabaseRatios | Self::Broker(_) => "",
        }
    }

    async fn run(self, settings: &Settings, report: &Report) -> anyhow::Result<Vec<Figure>> {
        match self {
            Self::SqlCeiling => sql_ceiling::run(settings, Database::Postgres).await,
            Self::SqlCeilingOn(database) => sql_ceiling::run(settings, database).await,
            Self::DrainOn(database) => db_drain::run(settings, database).await,
            Self::DatabaseRatios => ratios::databases(report),
            Self::Naive => naive::run(settings).await,
            Self::DrainNative => drain::run(settings, drain::Routing::Native).await,
            Self::DrainWasm => drain::run(settings, drain::Routing::Wasm).await,
            Self::Ratios => ratios::figures(report),
            Self::Pipeline => pipeline::run(settings).await,
            Self::Stages => stages::run(settings).await,
            Self::MetricsOverhead => {
                metrics_overhead::run(settings, metrics_overhead::Feature::Metrics).await
            }
            Self::TracingOverhead => {
                metrics_overhead::run(settings, metrics_overhead::Feature::Tracing).await
            }
            Self::ScaleOut => scale_out::run(settings).await,
            Self::LatencyPoll => latency::run(settings, latency::Wakeup::Poll).await,
            Self::LatencyNotify => latency::run(settings, latency::Wakeup::Notify).await,
            Self::Idle => idle::run(settings).await,
            Self::Noisy => noisy::run(settings).await,
            Self::Startup => startup::run(settings).await,
            Self::NotifyCost => notify_cost::run(settings).await,
            Self::Languages => languages::run(settings).await,
            Self::Tenants => tenants::run(settings).await,
            Self::Lazy => lazy::run(settings).await,
            Self::Fairness => fairness::run(settings).await,
            Self::SchemaRegistry => schema_registry::run(settings).await,
            Self::Replay => replay::run(settings).await,
            Self::Broker(broker) => brokers::run(settings, broker, report).await,
            Self::BrokersSummary => brokers::summary(settings, report),
            Self::Partitions => partitions::run(settings).await,
        }
    }
}

/// What a command runs, in order.
fn steps(command: Command, settings: &Settings) -> Vec<Step> {
    match command {
        Command::All => vec![
            Step::SqlCeiling,
            Step::Naive,
            Step::DrainNative,
            Step::DrainWasm,
            Step::Ratios,
            Step::Pipeline,
            Step::Stages,
            Step::ScaleOut,
            Step::LatencyPoll,
            Step::LatencyNotify,
            Step::Idle,
            Step::Noisy,
            Step::Startup,
            Step::NotifyCost,
            Step::SqlCeilingOn(Database::Mariadb),
            Step::DrainOn(Database::Mariadb),
            Step::SqlCeilingOn(Database::Sqlite),
            Step::DrainOn(Database::Sqlite),
            Step::DatabaseRatios,
        ],
        Command::SqlCeiling => vec![Step::SqlCeiling],
        Command::Naive => vec![Step::Naive],
        Command::DrainNative => vec![Step::DrainNative],
        Command::DrainWasm => vec![Step::DrainWasm],
        Command::Pipeline => vec![Step::Pipeline],
        Command::Stages => vec![Step::Stages],
        Command::MetricsOverhead => vec![Step::MetricsOverhead],
        Command::TracingOverhead => vec![Step::TracingOverhead],
        Command::ScaleOut => vec![Step::ScaleOut],
        Command::Latency => vec![Step::LatencyPoll, Step::LatencyNotify],
        Command::Idle => vec![Step::Idle],
        Command::Noisy => vec![Step::Noisy],
        Command::Startup => vec![Step::Startup],
        Command::NotifyCost => vec![Step::NotifyCost],
        Command::Languages => vec![Step::Languages],
        Command::Tenants => vec![Step::Tenants],
        Command::Lazy => vec![Step::Lazy],
        Command::Fairness => vec![Step::Fairness],
        Command::SchemaRegistry => vec![Step::SchemaRegistry],
        Command::Replay => vec![Step::Replay],
        Command::Databases => vec![
            Step::SqlCeiling,
            Step::DrainNative,
            Step::SqlCeilingOn(Database::Mariadb),
            Step::DrainOn(Database::Mariadb),
            Step::SqlCeilingOn(Database::Sqlite),
            Step::DrainOn(Database::Sqlite),
            Step::DatabaseRatios,
        ],
        Command::Partitions => vec![Step::Partitions],
        Command::Brokers => std::iter::once(Step::SqlCeiling)
            .chain(settings.brokers.iter().copied().map(Step::Broker))
            .chain(std::iter::once(Step::BrokersSummary))
            .collect(),
    }
}

/// Runs the command's steps, printing each result as it finishes, then the Markdown table
/// (also to `--out`). A failed step is reported and the next one runs; returns whether all
/// steps ran.
pub(crate) async fn run(cli: Cli) -> anyhow::Result<bool> {
    let settings = cli.options.resolve()?;
    let mut report = Report::default();
    for step in steps(cli.command, &settings) {
        eprintln!("==> {}", step.label());
        match step.run(&settings, &report).await {
            Ok(figures) => report.add(figures),
            Err(e) => report.fail(&step.label(), &e),
        }
    }
    let machine = Machine::detect(&settings.database_url, &settings.mysql_url).await;
    let table = report.markdown(&machine, &settings);
    println!("\n{table}");
    if let Some(out) = &settings.out {
        std::fs::write(out, &table)
            .with_context(|| format!("cannot write the results to {}", out.display()))?;
        eprintln!("==> results written to {}", out.display());
    }
    Ok(report.all_ran())
}
