//! `partitions`: partitioned outbox tables (issue #42) next to a plain one, through Sluice's
//! PostgreSQL store driver (no Kafka, no plugin). Two tables get the same `--rows` backlog,
//! created 10 to 19 days ago: a plain table from `sluice migrate`, and the table an
//! application or pg_partman declares, `PARTITION BY RANGE (created_at)` with `PRIMARY KEY
//! (id, created_at)`, one partition per day from 20 days ago to tomorrow (22) plus a DEFAULT
//! one, then `sluice migrate`. Each is drained as `sql-ceiling` drains (`--workers`
//! connections, claim 500 → mark `published_at` → commit): rows/s, the drain speed of the
//! claim and of the mark by id and `created_at`. Then every row is dated sent 8 days ago and
//! retention (7 days) removes them all: on the plain table the pruner's chunked deletes
//! (`relay.retention_mode = "delete"`; 1,000 rows a statement, 50 ms apart) and the `VACUUM`
//! its dead rows need; on the partitioned table `retention_mode = "drop-partitions"`
//! (detach and drop). Wall time and PostgreSQL's CPU seconds (every `postgres` process; other
//! clients of the server count too) of each.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sluice::store::{self, MarkMode, OutboxStore, StoreOptions, TableName, TableSpec};
use sluice_testkit::{Database, DbTable, Servers};

use super::sql_ceiling::{drain_with_workers, open_shared};
use crate::cli::Settings;
use crate::names;
use crate::outbox;
use crate::procstat::{POSTGRES, SystemSample};
use crate::report::Figure;

pub(super) const NAME: &str = "partitions";

/// `relay.retention` of the prune step.
const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The pruner's pause between two full chunks (`store/prune.rs`), to tell its work from its
/// waiting.
const CHUNK_PAUSE: Duration = Duration::from_millis(50);
const CHUNK: u64 = 1_000;

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let mut figures = Vec::new();
    for partitioned in [false, true] {
        let label = format!(
            "{NAME}-{}",
            if partitioned { "partitioned" } else { "plain" }
        );
        let table = create(settings, partitioned).await?;
        let measured = measure(settings, &table, partitioned, &label).await;
        table.drop_table().await;
        figures.extend(measured?);
    }
    Ok(figures)
}

/// The plain table (`sluice migrate`) or the partitioned one (plain SQL, then `sluice
/// migrate`).
async fn create(settings: &Settings, partitioned: bool) -> anyhow::Result<DbTable> {
    if !partitioned {
        return outbox::create(settings, "part_plain", None).await;
    }
    let servers = Servers {
        postgres: settings.database_url.clone(),
        mariadb: settings.mysql_url.clone(),
    };
    let table = DbTable::open(&servers, Database::Postgres, names::table("part_parted")).await?;
    table
        .try_execute(
            "CREATE TABLE {t} (id bigserial, tenant text, aggregate_type text NOT NULL,
                               aggregate_id text NOT NULL, event_type text NOT NULL,
                               payload jsonb, headers jsonb NOT NULL DEFAULT '{}',
                               created_at timestamptz NOT NULL DEFAULT now(),
                               PRIMARY KEY (id, created_at))
               PARTITION BY RANGE (created_at)",
        )
        .await?;
    let today = "(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')";
    for k in -20..=1 {
        table
            .try_execute(&format!(
                "CREATE TABLE \"{name}_d{n}\" PARTITION OF {{t}}
                    FOR VALUES FROM ({today} + {k} * interval '1 day')
                                TO ({today} + {k1} * interval '1 day')",
                name = table.name,
                n = k + 100,
                k1 = k + 1,
            ))
            .await?;
    }
    table
        .try_execute(&format!(
            "CREATE TABLE \"{}_default\" PARTITION OF {{t}} DEFAULT",
            table.name
        ))
        .await?;
    store::migrate(&table.url, &spec(&table)?, &options(), None)
        .await
        .context("sluice migrate of the partitioned table")?;
    Ok(table)
}

fn spec(table: &DbTable) -> anyhow::Result<TableSpec> {
    Ok(TableSpec::new(TableName::parse(&table.name)?))
}

fn options() -> StoreOptions {
    StoreOptions {
        mark: MarkMode::PublishedAt,
        ..StoreOptions::default()
    }
}

async fn measure(
    settings: &Settings,
    table: &DbTable,
    partitioned: bool,
    label: &str,
) -> anyhow::Result<Vec<Figure>> {
    let rows = settings.rows;
    // 256-byte rows as every scenario's, created 10 to 19 days ago.
    table
        .try_execute(&format!(
            "INSERT INTO {{t}} (aggregate_type, aggregate_id, event_type, payload, created_at)
             SELECT CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END, 'agg-' || (g % 1000),
                    'Created', jsonb_build_object('n', g, 'pad', repeat('x', 236)),
                    now() - (10 + g % 10) * interval '1 day'
               FROM generate_series(1, {rows}) AS g"
        ))
        .await?;
    table.try_execute("VACUUM ANALYZE {t}").await?;
    let store = open_shared(&table.url, &spec(table)?, options(), settings.workers).await?;
    let (drained, drain_time) = drain_with_workers(&store, settings.workers).await?;
    if drained != rows {
        bail!("{label}: marked {drained} rows, expected {rows}");
    }
    let mut figures = super::rate_figures(label, drained, drain_time);

    // Every row sent 8 days ago: all past the retention.
    table
        .try_execute("UPDATE {t} SET published_at = now() - interval '8 days'")
        .await?;
    table.try_execute("VACUUM ANALYZE {t}").await?;
    let before = SystemSample::now();
    let start = Instant::now();
    let removed = if partitioned {
        let round = store.maintain_partitions(Some(RETENTION)).await?;
        figures.push(Figure::new(
            label,
            "partitions dropped",
            round.dropped.len() as f64,
            "partitions",
        ));
        let left = table.try_count().await?;
        rows - u64::try_from(left).unwrap_or(0)
    } else {
        store.prune_sent(RETENTION).await?
    };
    let prune_time = start.elapsed();
    let after_prune = SystemSample::now();
    let vacuum_start = Instant::now();
    if !partitioned {
        // The dead rows the deletes left, as autovacuum would reclaim them.
        table.try_execute("VACUUM {t}").await?;
    }
    let vacuum_time = vacuum_start.elapsed();
    let after = SystemSample::now();
    if removed != rows {
        bail!("{label}: retention removed {removed} rows, expected {rows}");
    }
    let pauses = if partitioned {
        Duration::ZERO
    } else {
        CHUNK_PAUSE * u32::try_from(rows / CHUNK).unwrap_or(u32::MAX)
    };
    figures.extend([
        Figure::new(label, "retention: rows removed", removed as f64, "rows"),
        Figure::new(label, "retention: time", prune_time.as_secs_f64(), "s"),
        Figure::new(
            label,
            "retention: time less the pruner's pauses",
            prune_time.saturating_sub(pauses).as_secs_f64(),
            "s",
        ),
        Figure::new(
            label,
            "retention: PostgreSQL CPU",
            before.server_seconds(&after_prune, POSTGRES),
            "CPU s",
        ),
        Figure::new(
            label,
            "VACUUM after it: time",
            vacuum_time.as_secs_f64(),
            "s",
        ),
        Figure::new(
            label,
            "VACUUM after it: PostgreSQL CPU",
            after_prune.server_seconds(&after, POSTGRES),
            "CPU s",
        ),
    ]);
    Ok(figures)
}
