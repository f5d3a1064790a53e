//! `sql-ceiling`: a database's own limit for Sluice's SQL, measured through Sluice's store
//! driver for that database. `--workers` tasks share one store (a connection each): claim 500
//! rows (PostgreSQL and MariaDB: `FOR UPDATE SKIP LOCKED` in a transaction held until the mark;
//! SQLite: a committed lease) → decode them → mark them sent (`DELETE`) → commit, until a claim
//! comes back empty. No Kafka, no plugin: no relay on this database can drain faster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sluice::store::{
    self, BatchOutcome, ClaimedBatch, OutboxStore, StoreOptions, TableName, TableSpec,
};

use super::rate_figures;
use crate::cli::Settings;
use crate::outbox::{self, BenchTable};
use crate::procstat;
use crate::report::Figure;
use sluice_testkit::{Database, DbTable};

/// Rows per claim: Sluice's default `relay.batch_size`.
pub(super) const BATCH_SIZE: usize = 500;

pub(super) const NAME: &str = "sql-ceiling";
/// The figure of this process's CPU time (the driver's side: statements, TLS, decoding) per
/// 1,000 rows, for comparison with a relay's CPU per row.
pub(super) const CLIENT_CPU: &str = "client CPU per 1,000 rows";

/// The scenario's label on `database` (PostgreSQL keeps the plain name the ratios use).
pub(super) fn label(database: Database) -> String {
    match database {
        Database::Postgres => NAME.to_owned(),
        other => format!("{NAME}-{}", other.label()),
    }
}

pub(super) async fn run(settings: &Settings, database: Database) -> anyhow::Result<Vec<Figure>> {
    let table = outbox::create_on(settings, database, "sql_ceiling").await?;
    let measured = measure(settings, &table).await;
    table.drop_table().await;
    let (rows, elapsed, cpu) = measured?;
    let label = label(database);
    let mut figures = rate_figures(&label, rows, elapsed);
    figures.push(Figure::new(
        &label,
        CLIENT_CPU,
        cpu / rows as f64 * 1000.0,
        "CPU s",
    ));
    figures.push(Figure::new(
        &label,
        "connections",
        settings.workers as f64,
        "connections",
    ));
    Ok(figures)
}

/// Fills the table, then drains it with the workers; returns rows deleted, the time taken and
/// this process's CPU seconds meanwhile (nothing else runs in it then).
async fn measure(settings: &Settings, table: &DbTable) -> anyhow::Result<(u64, Duration, f64)> {
    table.fill(settings.rows, None).await?;
    let spec = TableSpec::new(TableName::parse(&table.name)?);
    let store = open_shared(&table.url, &spec, StoreOptions::default(), settings.workers).await?;
    let cpu_before = procstat::sample(std::process::id())?.cpu_ticks;
    let (rows, elapsed) = drain_with_workers(&store, settings.workers).await?;
    let cpu_ticks = procstat::sample(std::process::id())?.cpu_ticks - cpu_before;
    if rows != settings.rows {
        bail!("deleted {rows} rows, expected {}", settings.rows);
    }
    Ok((rows, elapsed, procstat::cpu_seconds(cpu_ticks)))
}

/// The table of `spec` at `url` opened with a connection for each of `workers` tasks.
pub(super) async fn open_shared(
    url: &str,
    spec: &TableSpec,
    options: StoreOptions,
    workers: usize,
) -> anyhow::Result<Arc<store::Store>> {
    let connections = u32::try_from(workers).unwrap_or(u32::MAX);
    let store = store::open(url, spec, options, connections)
        .await
        .context("cannot open the store")?;
    Ok(Arc::new(store))
}

/// `workers` tasks sharing `store`, each claiming, decoding and marking (as the store's
/// `mark` says) until a claim comes back empty; returns the rows marked and the time taken.
pub(super) async fn drain_with_workers(
    store: &Arc<store::Store>,
    workers: usize,
) -> anyhow::Result<(u64, Duration)> {
    let start = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| tokio::spawn(worker(Arc::clone(store))))
        .collect();
    let mut rows = 0;
    for task in tasks {
        rows += task.await.context("a drain worker panicked")??;
    }
    Ok((rows, start.elapsed()))
}

/// One worker's loop; returns the rows it marked.
async fn worker(store: Arc<store::Store>) -> anyhow::Result<u64> {
    let mut marked = 0u64;
    let mut decoded_bytes = 0usize;
    loop {
        let claim = store.claim(BATCH_SIZE, &[]).await.context("claim failed")?;
        if claim.is_empty() {
            claim
                .batch
                .abandon()
                .await
                .context("ending an empty claim failed")?;
            std::hint::black_box(decoded_bytes);
            return Ok(marked);
        }
        let sent: Vec<_> = claim
            .rows
            .iter()
            .map(|row| {
                decoded_bytes += row.payload.len() + row.aggregate_id.len() + row.headers.len();
                row.id.clone()
            })
            .collect();
        marked += sent.len() as u64;
        claim
            .batch
            .complete(BatchOutcome {
                sent,
                failed: Vec::new(),
            })
            .await
            .context("marking failed")?;
    }
}
