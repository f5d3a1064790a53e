//! The pgbench ceiling: PostgreSQL's own limit for claiming and deleting the standard backlog,
//! measured by `pgbench` (libpq, no Sluice code): 2 clients, each transaction one
//! `DELETE … WHERE id IN (SELECT id … ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED) RETURNING`
//! the columns a relay reads, until the table is empty.

use std::process::Command;

use anyhow::{Context, bail};

use super::sql_ceiling::BATCH_SIZE;
use crate::outbox::BenchTable;
use sluice_testkit::DbTable;

/// Found on `PATH` (Debian's `postgresql-client` puts it in /usr/bin).
const PGBENCH: &str = "pgbench";
/// Concurrent clients, as the SQL ceiling's connections.
const CLIENTS: u64 = 2;

/// Fills `table` with `rows` standard rows and deletes them with pgbench; returns rows per
/// second over pgbench's own elapsed time (connection set-up excluded, as the SQL ceiling's).
pub(super) async fn ceiling(table: &DbTable, rows: u64) -> anyhow::Result<f64> {
    table.fill(rows, None).await?;
    let script = tempfile::Builder::new()
        .suffix(".sql")
        .tempfile()
        .context("cannot create pgbench's script file")?;
    std::fs::write(
        script.path(),
        table.sql(&format!(
            "DELETE FROM {{t}} WHERE id IN \
             (SELECT id FROM {{t}} ORDER BY id LIMIT {BATCH_SIZE} FOR UPDATE SKIP LOCKED) \
             RETURNING id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempts;\n"
        )),
    )
    .context("cannot write pgbench's script")?;
    // Every claim but the last is full (the LIMIT counts locked rows only); one more
    // transaction per client finds the table empty and costs next to nothing.
    let per_client = rows.div_ceil(BATCH_SIZE as u64).div_ceil(CLIENTS) + 1;
    let mut command = Command::new(PGBENCH);
    command
        .args(["-n", "-c", &CLIENTS.to_string(), "-j", &CLIENTS.to_string()])
        .arg("-t")
        .arg(per_client.to_string())
        .arg("-f")
        .arg(script.path())
        .arg(&table.url);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .context("pgbench's runner panicked")?
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow::anyhow!(
                "pgbench is not installed (Debian/Ubuntu: apt-get install postgresql-client)"
            ),
            _ => anyhow::Error::new(e).context("cannot start pgbench"),
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "pgbench failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            stdout.trim()
        );
    }
    let left = table.try_count().await?;
    if left != 0 {
        bail!("pgbench left {left} of {rows} rows");
    }
    // Dead rows out of the way: the next fill starts from an empty file, as after a drain.
    table.truncate().await?;
    let elapsed = elapsed_seconds(&stdout)?;
    Ok(rows as f64 / elapsed)
}

/// pgbench's run time from its summary: transactions processed / tps (which excludes the
/// initial connection time).
fn elapsed_seconds(summary: &str) -> anyhow::Result<f64> {
    let after = |prefix: &str| {
        summary
            .lines()
            .find_map(|line| line.trim().strip_prefix(prefix))
            .with_context(|| format!("pgbench printed no {prefix:?}: {summary}"))
    };
    let processed = after("number of transactions actually processed:")?;
    let processed: f64 = processed
        .split('/')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("unreadable transaction count {processed:?}"))?;
    let tps = after("tps =")?;
    let tps: f64 = tps
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .filter(|t: &f64| *t > 0.0)
        .with_context(|| format!("unreadable tps {tps:?}"))?;
    Ok(processed / tps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_time_is_read_from_the_summary() {
        let summary = "number of transactions actually processed: 402/402\n\
                       number of failed transactions: 0 (0.000%)\n\
                       latency average = 4.975 ms\n\
                       tps = 402.000000 (without initial connection time)\n";
        assert_eq!(elapsed_seconds(summary).ok(), Some(1.0));
        assert!(elapsed_seconds("tps = 1.0").is_err());
    }
}
