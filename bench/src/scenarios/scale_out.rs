//! `scale-out`: one, two and four `sluice run` processes (default settings, WASM reference
//! plugin) on one table, each run against a freshly started broker: the aggregate drain rate
//! and the share of the rows each relay sent (from its own `/metrics`). Several relays on one
//! table are how Sluice goes past one process: `FOR UPDATE SKIP LOCKED` keeps them apart.

use anyhow::Context;

use super::THROUGHPUT;
use crate::cli::Settings;
use crate::drain_watch::{DrainWatch, Rows};
use crate::outbox::{self, BenchTable};
use crate::relay::{self, Measured};
use crate::report::Figure;
use crate::{kafka, names};
use sluice_testkit::DbTable;
use sluice_testkit::OwnTansu;
use sluice_testkit::broker::try_free_port;
use sluice_testkit::config::{Plugin, RelayConfig};
use sluice_testkit::scrape;

pub(super) const NAME: &str = "scale-out";
/// Relay processes per step.
const RELAYS: [usize; 3] = [1, 2, 4];

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = Plugin::Wasm(settings.reference_plugin()?);
    let table = outbox::create(settings, "scale_out", None).await?;
    let figures = outbox::for_each(table, RELAYS, async |table, relays| {
        measure(settings, table, &plugin, relays).await
    })
    .await?;
    Ok(figures.into_iter().flatten().collect())
}

async fn measure(
    settings: &Settings,
    table: &DbTable,
    plugin: &Plugin,
    relays: usize,
) -> anyhow::Result<Vec<Figure>> {
    let broker = OwnTansu::fresh()?;
    let prefix = names::topic_prefix("scale_out");
    kafka::create_topics(&broker.bootstrap(), &kafka::topics(&prefix)).await?;
    table.fill(settings.rows, None).await?;
    let watch = DrainWatch::prepare(&settings.database_url, table, Rows::All).await?;
    let mut processes = Vec::with_capacity(relays);
    let mut listens = Vec::with_capacity(relays);
    for _ in 0..relays {
        let listen = format!("127.0.0.1:{}", try_free_port()?);
        let config = RelayConfig {
            database_url: settings.database_url.clone(),
            table: table.name.clone(),
            kafka: broker.bootstrap(),
            default_plugin: Some((plugin.clone(), prefix.clone())),
            relay: settings.relay.clone(),
            telemetry: Some(listen.clone()),
            ..RelayConfig::default()
        };
        processes.push(relay::start(&settings.sluice, &config, "warn")?);
        listens.push(listen);
    }
    let first = processes.first_mut().context("no relay was started")?;
    let drained = watch.run(first).await?;
    let mut sent = Vec::with_capacity(relays);
    for listen in &listens {
        let metrics = scrape::metrics(listen).await?;
        sent.push(scrape::sum(
            &metrics,
            "sluice_rows_completed_total{tenant=\"_default\",outcome=\"sent\"}",
        ));
    }
    for p in processes {
        p.stop_measured().await?;
    }
    drop(broker);

    let label = format!(
        "{NAME} ({relays} relay{})",
        if relays == 1 { "" } else { "s" }
    );
    let total: f64 = sent.iter().sum();
    let shares: Vec<String> = sent
        .iter()
        .map(|s| format!("{:.0} %", s / total.max(1.0) * 100.0))
        .collect();
    eprintln!(
        "    {label}: {:.0} rows/s; rows sent per relay: {} ({})",
        drained.rows_per_second(),
        sent.iter()
            .map(|s| format!("{s:.0}"))
            .collect::<Vec<_>>()
            .join(" / "),
        shares.join(" / ")
    );
    let mut figures = vec![Figure::new(
        &label,
        THROUGHPUT,
        drained.rows_per_second(),
        "rows/s",
    )];
    let (low, high) = sent
        .iter()
        .fold((f64::MAX, 0.0_f64), |(l, h), s| (l.min(*s), h.max(*s)));
    figures.push(Figure::new(
        &label,
        "smallest share of the rows",
        low / total.max(1.0) * 100.0,
        "%",
    ));
    figures.push(Figure::new(
        &label,
        "largest share of the rows",
        high / total.max(1.0) * 100.0,
        "%",
    ));
    Ok(figures)
}
