//! `sluice replay`: the count and the question first, then the rows made due again with a
//! progress bar, and with `--wait` the relays' progress until every replayed row is sent.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::cli::ReplayArgs;
use crate::progress;
use sluice::app::admin::Target;
use sluice::app::replay::{self, PreparedReplay, ReplayRequest};

/// How often `--wait` asks the database how many rows are left.
const WAIT_POLL: Duration = Duration::from_secs(1);

pub(crate) async fn run(target: Target<'_>, args: ReplayArgs) -> anyhow::Result<()> {
    let request = ReplayRequest {
        since: args.since,
        until: args.until,
        tenant: args.tenant,
        aggregate_type: args.aggregate_type,
        event_type: args.event_type,
        ids: args.ids,
        rate: args.rate,
        force: args.force,
    };
    let prepared = replay::prepare(&target, &request).await?;
    let (rows, pace) = (prepared.rows, &prepared.pace);
    // The window as absolute times: what a second run needs to finish a stopped replay.
    let shown = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
    let window = match (prepared.filter.since, prepared.filter.until) {
        (Some(since), Some(until)) => {
            format!(" (sent from {} until {})", shown(since), shown(until))
        }
        (None, Some(until)) => format!(" (sent before {})", shown(until)),
        _ => String::new(),
    };
    println!(
        "{rows} sent rows of {}{window} match{}",
        prepared.table.name,
        if args.dry_run {
            " (dry run: nothing changed)"
        } else {
            ""
        }
    );
    if args.dry_run || rows == 0 {
        return Ok(());
    }
    let spread = (prepared.last_due() - pace.start)
        .to_std()
        .unwrap_or_default();
    println!(
        "replay {}: due from {} at {} rows/s, the last in about {}",
        pace.id,
        pace.start.format("%Y-%m-%d %H:%M:%S UTC"),
        pace.rate,
        humantime::format_duration(Duration::from_secs(spread.as_secs()))
    );
    if !args.yes {
        confirm(rows)?;
    }
    let done = mark(&prepared).await?;
    println!(
        "replay {}: {done} rows are due again; the relays send them with the header \
         sluice-replay: {} (`sluice status` shows what is left)",
        pace.id, pace.id
    );
    if args.wait {
        follow(&prepared, done).await?;
    }
    Ok(())
}

/// Asks on the terminal; without one, `--yes` is needed.
fn confirm(rows: u64) -> anyhow::Result<()> {
    if !std::io::stdin().is_terminal() {
        bail!("standard input is not a terminal: give --yes to replay without asking");
    }
    eprint!("publish these {rows} rows again? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => bail!("not replayed: nothing changed"),
    }
}

/// Makes the rows due again, with a bar (or a log line every few seconds without a terminal).
async fn mark(prepared: &PreparedReplay) -> anyhow::Result<u64> {
    let bar = progress::bar(prepared.rows, "rows made due");
    let mut last_log = Instant::now();
    let total = prepared.rows;
    let mut report = |done: u64| match &bar {
        Some(bar) => bar.set_position(done),
        None if last_log.elapsed() >= progress::LOG_EVERY => {
            last_log = Instant::now();
            tracing::info!(
                rows_done = done,
                rows_total = total,
                "replay: making rows due"
            );
        }
        None => {}
    };
    let done = prepared.run(&mut report).await?;
    if let Some(bar) = bar {
        bar.set_position(done);
        bar.finish();
    }
    Ok(done)
}

/// `--wait`: the replay's rows sent so far, until none is left.
async fn follow(prepared: &PreparedReplay, total: u64) -> anyhow::Result<()> {
    let bar = progress::bar(total, "rows sent again");
    let mut last_log = Instant::now();
    loop {
        let running = prepared.store.replay_progress().await?;
        let left = running
            .iter()
            .find(|p| p.id == prepared.pace.id)
            .map_or(0, |p| u64::try_from(p.left).unwrap_or(0));
        let sent = total.saturating_sub(left);
        match &bar {
            Some(bar) => bar.set_position(sent),
            None if last_log.elapsed() >= progress::LOG_EVERY => {
                last_log = Instant::now();
                tracing::info!(rows_sent = sent, rows_left = left, "replay: sending");
            }
            None => {}
        }
        if left == 0 {
            break;
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
    if let Some(bar) = bar {
        bar.finish();
    }
    println!("replay {}: every row sent again", prepared.pace.id);
    Ok(())
}
