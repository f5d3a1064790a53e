//! `scale-out`: one, two and four `sluice run` processes (default settings, WASM reference
//! plugin) on one table, each run against a freshly started broker: the aggregate drain rate
//! and the share of the rows each relay sent (from its own `/metrics`). Several relays on one
//! table are how Sluice goes past one process: `FOR UPDATE SKIP LOCKED` keeps them apart.

use anyhow::Context;

use super::THROUGHPUT;
use crate::broker::{OwnBroker, free_port};
use crate::cli::Settings;
use crate::drain_watch::{DrainWatch, Rows};
use crate::outbox::OutboxTable;
use crate::relay::RelayProcess;
use crate::relay_config::{Plugin, RelayConfig};
use crate::report::Figure;
use crate::{db, kafka, names, scrape};

pub const NAME: &str = "scale-out";
/// Relay processes per step.
const RELAYS: [usize; 3] = [1, 2, 4];

pub async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = Plugin::Wasm(settings.reference_plugin()?);
    let pool = db::pool(&settings.database_url).await?;
    let table = OutboxTable::create(settings, &pool, "scale_out", None).await?;
    let figures = table
        .for_each(RELAYS, async |table, relays| {
            measure(settings, table, &plugin, relays).await
        })
        .await?;
    Ok(figures.into_iter().flatten().collect())
}

async fn measure(
    settings: &Settings,
    table: &OutboxTable,
    plugin: &Plugin,
    relays: usize,
) -> anyhow::Result<Vec<Figure>> {
    let broker = OwnBroker::start()?;
    let prefix = names::topic_prefix("scale_out");
    kafka::create_topics(broker.bootstrap(), &kafka::topics(&prefix)).await?;
    table.fill(settings.rows, None).await?;
    let watch = DrainWatch::prepare(&settings.database_url, table, Rows::All).await?;
    let mut processes = Vec::with_capacity(relays);
    let mut listens = Vec::with_capacity(relays);
    for _ in 0..relays {
        let listen = format!("127.0.0.1:{}", free_port()?);
        let config = RelayConfig {
            database_url: settings.database_url.clone(),
            table: table.name().to_owned(),
            kafka: broker.bootstrap().to_owned(),
            default_plugin: Some((plugin.clone(), prefix.clone())),
            relay: settings.relay.clone(),
            telemetry: Some(listen.clone()),
            ..RelayConfig::default()
        };
        processes.push(RelayProcess::start(&settings.sluice, &config, "warn")?);
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
        p.stop().await?;
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
