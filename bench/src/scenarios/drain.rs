//! `drain-native` and `drain-wasm`: one `sluice run` (default settings) draining the `--rows`
//! backlog, with the router built into the host resp. the WASM reference plugin. Reports
//! rows/s, the relay's CPU seconds per 1,000 rows and its peak RSS.
//!
//! Rows/s and CPU cover the same window: from the first row leaving the table to the last
//! (see [`crate::drain_watch`]), so plugin compilation at start-up is not counted. Each drain
//! runs [`RUNS`] times (a fresh backlog each time) and the median run is reported, with the
//! CPU the database server and the broker used over its window, and the machine's load.

use std::path::PathBuf;

use super::THROUGHPUT;
use crate::brokers::{self, Broker};
use crate::cli::Settings;
use crate::drain_watch::{DrainWatch, Drained, Rows};
use crate::outbox::{self, BenchTable, Tenants};
use crate::procstat::{ProcSample, cpu_seconds};
use crate::relay::{self, Measured, RelayProcess};
use crate::report::Figure;
use crate::{kafka, names};
use sluice_testkit::DbTable;
use sluice_testkit::config::{Plugin, RelayConfig, Tenant};

/// The router under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Routing {
    /// `builtin = "route-by-aggregate"`.
    Native,
    /// The reference plugin's `.wasm`.
    Wasm,
}

impl Routing {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Native => "drain-native",
            Self::Wasm => "drain-wasm",
        }
    }

    fn stem(self) -> &'static str {
        match self {
            Self::Native => "drain_native",
            Self::Wasm => "drain_wasm",
        }
    }

    fn plugin(self, settings: &Settings) -> anyhow::Result<Plugin> {
        Ok(match self {
            Self::Native => Plugin::Builtin("route-by-aggregate"),
            Self::Wasm => Plugin::Wasm(settings.reference_plugin()?),
        })
    }
}

/// Drains per scenario; the median is reported (single runs vary by ±15 % here).
const RUNS: usize = 3;

pub(super) async fn run(settings: &Settings, routing: Routing) -> anyhow::Result<Vec<Figure>> {
    let plugin = routing.plugin(settings)?;
    let drain = Drain {
        label: routing.label(),
        stem: routing.stem(),
        plugin,
        rows: settings.rows,
        cache_dir: None,
        extra: None,
        broker: Broker::Kafka,
    };
    run_median(settings, &drain).await
}

/// What [`run_median`] drains.
#[derive(Clone)]
pub(super) struct Drain<'a> {
    /// Scenario label of the figures.
    pub label: &'a str,
    /// Table and topic names.
    pub stem: &'a str,
    pub plugin: Plugin,
    pub rows: u64,
    /// `[plugins] cache_dir`; `None` keeps Sluice's default.
    pub cache_dir: Option<PathBuf>,
    /// Raw lines for `[plugins.default]` and raw sections for the end of the config (the
    /// schema-registry scenario's `value_format` and `[schema_registry]`, the brokers
    /// scenario's `[nats]`, `[rabbitmq]` or `[redis]`).
    pub extra: Option<(String, String)>,
    /// The default plugin's `broker`: Kafka topics are created before the drain (at
    /// `settings.kafka`); another broker's destinations are the caller's to make, and its
    /// section is the caller's to put in `extra`.
    pub broker: Broker,
}

/// Drains `drain.rows` through `drain.plugin` [`RUNS`] times; returns the median run's
/// figures with the slowest and fastest rows/s.
pub(super) async fn run_median(
    settings: &Settings,
    drain: &Drain<'_>,
) -> anyhow::Result<Vec<Figure>> {
    let Drain { label, stem, .. } = *drain;
    let table = outbox::create(settings, stem, None).await?;
    let mut runs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        match measure(settings, drain, &table).await {
            Ok(figures) => runs.push(figures),
            Err(e) => {
                table.drop_table().await;
                return Err(e);
            }
        }
        table.truncate().await?;
    }
    table.drop_table().await;
    Ok(median_run(label, runs))
}

/// Of several runs' figures of [`measure`] (throughput first; at least one run), the median
/// run's, with the slowest and fastest rows/s added.
pub(super) fn median_run(label: &str, mut runs: Vec<Vec<Figure>>) -> Vec<Figure> {
    runs.sort_by(|a, b| a[0].value.total_cmp(&b[0].value));
    let all: Vec<String> = runs.iter().map(|r| format!("{:.0}", r[0].value)).collect();
    eprintln!("    {label} runs, rows/s: {}", all.join(", "));
    let mut median = runs.remove(runs.len() / 2);
    let slowest = runs.first().map_or(median[0].value, |r| r[0].value);
    let fastest = runs.last().map_or(median[0].value, |r| r[0].value);
    median.push(Figure::new(label, "slowest run", slowest, "rows/s"));
    median.push(Figure::new(label, "fastest run", fastest, "rows/s"));
    median
}

pub(super) async fn measure(
    settings: &Settings,
    drain: &Drain<'_>,
    table: &DbTable,
) -> anyhow::Result<Vec<Figure>> {
    Ok(measure_with_metrics(settings, drain, table).await?.0)
}

/// [`measure`], and with `settings.telemetry` set, the relay's `/metrics` as scraped right
/// after the drain (before the relay is stopped).
pub(super) async fn measure_with_metrics(
    settings: &Settings,
    drain: &Drain<'_>,
    table: &DbTable,
) -> anyhow::Result<(Vec<Figure>, Option<String>)> {
    let prefix = names::topic_prefix(drain.stem);
    measure_tenants(settings, drain, table, &prefix, None, Vec::new(), None).await
}

/// The config of a relay draining `table` as `drain` says, with `sections` as its
/// `[tenants.*]` and the default plugin writing to the topics of `prefix`.
pub(super) fn relay_config(
    settings: &Settings,
    drain: &Drain<'_>,
    table: &DbTable,
    prefix: &str,
    sections: Vec<Tenant>,
) -> RelayConfig {
    RelayConfig {
        database_url: settings.database_url.clone(),
        table: table.name.clone(),
        kafka: settings.kafka.clone(),
        cache_dir: drain.cache_dir.clone(),
        default_plugin: Some((drain.plugin.clone(), prefix.to_owned())),
        tenants: sections,
        relay: settings.relay.clone(),
        telemetry: settings.telemetry.clone(),
        default_plugin_extra: default_plugin_extra(drain),
        extra: drain.extra.as_ref().map(|(_, sections)| sections.clone()),
        ..RelayConfig::default()
    }
}

/// The raw lines of `[plugins.default]`: `broker = "…"` unless Kafka (the default), then
/// `drain.extra`'s.
fn default_plugin_extra(drain: &Drain<'_>) -> Option<String> {
    let broker = (drain.broker != Broker::Kafka).then(|| format!("broker = \"{}\"", drain.broker));
    let extra = drain
        .extra
        .as_ref()
        .map(|(plugin, _)| plugin.clone())
        .filter(|lines| !lines.is_empty());
    match (broker, extra) {
        (Some(broker), Some(extra)) => Some(format!("{broker}\n{extra}")),
        (broker, extra) => broker.or(extra),
    }
}

/// [`measure_with_metrics`] of a backlog whose rows belong to `tenants`, with `sections` as
/// the relay's `[tenants.*]` and `plugins_extra` as raw lines of its `[plugins]`; the default
/// plugin writes to the topics of `prefix`.
pub(super) async fn measure_tenants(
    settings: &Settings,
    drain: &Drain<'_>,
    table: &DbTable,
    prefix: &str,
    tenants: Option<Tenants<'_>>,
    sections: Vec<Tenant>,
    plugins_extra: Option<&str>,
) -> anyhow::Result<(Vec<Figure>, Option<String>)> {
    let (relay, drained) = drain_backlog(
        settings,
        drain,
        table,
        prefix,
        tenants,
        sections,
        plugins_extra,
    )
    .await?;
    let metrics = match &settings.telemetry {
        Some(listen) => Some(sluice_testkit::scrape::metrics(listen).await?),
        None => None,
    };
    let stopped = relay.stop_measured().await?;
    let figures = window_figures(drain, &drained, &stopped.last);
    Ok((figures, metrics))
}

/// Fills `table` with `drain.rows` rows (of `tenants`), starts a relay on it (with `sections`
/// as its `[tenants.*]`, `plugins_extra` in its `[plugins]`, the default plugin writing to the
/// topics of `prefix`) and waits until it has drained them; the relay is left running.
async fn drain_backlog(
    settings: &Settings,
    drain: &Drain<'_>,
    table: &DbTable,
    prefix: &str,
    tenants: Option<Tenants<'_>>,
    sections: Vec<Tenant>,
    plugins_extra: Option<&str>,
) -> anyhow::Result<(RelayProcess, Drained)> {
    if drain.broker == Broker::Kafka {
        kafka::create_topics(&settings.kafka, &kafka::topics(prefix)).await?;
    }
    table.fill(drain.rows, tenants).await?;
    let watch = DrainWatch::prepare(&settings.database_url, table, Rows::All).await?;
    let mut config = relay_config(settings, drain, table, prefix, sections);
    config.plugins_extra = plugins_extra.map(str::to_owned);
    let mut relay = relay::start(&settings.sluice, &config, "warn")?;
    let drained = watch.run(&mut relay).await?;
    Ok((relay, drained))
}

/// The figures of `drained`'s window, which ended before `end` (the relay's reading).
fn window_figures(drain: &Drain<'_>, drained: &Drained, end: &ProcSample) -> Vec<Figure> {
    let label = drain.label;
    let cpu = cpu_seconds(end.cpu_ticks.saturating_sub(drained.start.cpu_ticks));
    let (postgres, _, busy) = drained.system.0.until(&drained.system.1);
    let broker = drained
        .system
        .0
        .server_seconds(&drained.system.1, brokers::server_command(drain.broker));
    let per_1k = |cpu: f64| cpu / drained.rows as f64 * 1000.0;
    vec![
        Figure::new(label, THROUGHPUT, drained.rows_per_second(), "rows/s"),
        Figure::new(label, "relay CPU per 1,000 rows", per_1k(cpu), "CPU s"),
        Figure::new(
            label,
            "PostgreSQL CPU per 1,000 rows",
            per_1k(postgres),
            "CPU s",
        ),
        Figure::new(
            label,
            &format!("{} CPU per 1,000 rows", brokers::server_label(drain.broker)),
            per_1k(broker),
            "CPU s",
        ),
        Figure::new(label, "machine busy during the drain", busy, "%"),
        Figure::new(label, "relay peak RSS", end.peak_rss_mib(), "MiB"),
        Figure::new(
            label,
            "relay memory mappings after the drain",
            end.mappings as f64,
            "VMAs",
        ),
        Figure::new(label, "rows in window", drained.rows as f64, "rows"),
        Figure::new(label, "drain time", drained.elapsed.as_secs_f64(), "s"),
    ]
}

/// [`measure`], then a second backlog of `drain.rows` drained by the same relay, started
/// after the first was drained: its database connections open, its plugin instances live,
/// as in a relay that has been running for a while. Returns both drains' figures (first,
/// second). The first drain's window includes what a relay pays once per connection and
/// instance — with TLS to PostgreSQL, ~90 ms of CPU per connection
/// ([docs/benchmarks.md](../../docs/benchmarks.md)) — which the ceilings pay before they
/// start timing.
pub(super) async fn measure_twice(
    settings: &Settings,
    drain: &Drain<'_>,
    table: &DbTable,
) -> anyhow::Result<(Vec<Figure>, Vec<Figure>)> {
    let prefix = names::topic_prefix(drain.stem);
    measure_tenants_twice(settings, drain, table, &prefix, None, Vec::new(), None).await
}

/// [`measure_twice`] of backlogs whose rows belong to `tenants` (both backlogs alike), with
/// `sections` and `plugins_extra` as in [`measure_tenants`]. A free-form tenant's instance
/// is created by its first row, so the first drain of 10,000 free-form tenants pays 10,000
/// instance creations; the second finds them resident.
pub(super) async fn measure_tenants_twice(
    settings: &Settings,
    drain: &Drain<'_>,
    table: &DbTable,
    prefix: &str,
    tenants: Option<Tenants<'_>>,
    sections: Vec<Tenant>,
    plugins_extra: Option<&str>,
) -> anyhow::Result<(Vec<Figure>, Vec<Figure>)> {
    let (mut relay, first) = drain_backlog(
        settings,
        drain,
        table,
        prefix,
        tenants,
        sections,
        plugins_extra,
    )
    .await?;
    let first = window_figures(drain, &first, &relay.sample()?);
    // The relay polls an empty table meanwhile; the rows appear at once, with the commit.
    let watch = DrainWatch::expect(
        &settings.database_url,
        table,
        drain.rows,
        table.next_id().await?,
    )
    .await?;
    table.insert(drain.rows, tenants).await?;
    let second = watch.run(&mut relay).await?;
    let stopped = relay.stop_measured().await?;
    Ok((first, window_figures(drain, &second, &stopped.last)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(broker: Broker, extra: Option<(String, String)>) -> Drain<'static> {
        Drain {
            label: "l",
            stem: "s",
            plugin: Plugin::Builtin("route-by-aggregate"),
            rows: 1,
            cache_dir: None,
            extra,
            broker,
        }
    }

    #[test]
    fn a_drain_to_another_broker_names_it_in_the_default_plugin_section() {
        assert_eq!(default_plugin_extra(&drain(Broker::Kafka, None)), None);
        assert_eq!(
            default_plugin_extra(&drain(Broker::Nats, Some((String::new(), "[nats]".into()))))
                .as_deref(),
            Some("broker = \"nats\"")
        );
        assert_eq!(
            default_plugin_extra(&drain(
                Broker::Redis,
                Some(("value_format = \"avro\"".into(), String::new()))
            ))
            .as_deref(),
            Some("broker = \"redis\"\nvalue_format = \"avro\"")
        );
        assert_eq!(
            default_plugin_extra(&drain(Broker::Kafka, Some(("x = 1".into(), String::new()))))
                .as_deref(),
            Some("x = 1")
        );
    }
}
