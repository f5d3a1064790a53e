//! `replay`: live rows' commit → Kafka latency while `sluice replay` publishes a large
//! backlog of sent rows again at a rate limit (issue #42), against the same latency without
//! a replay.
//!
//! One PostgreSQL table in `mark = "published_at"` mode holds `--rows` (default 200,000) rows
//! marked sent a minute ago. One `sluice run` (defaults plus `mark = "published_at"`) and a
//! consumer on every partition run throughout (routing as in `latency`, through
//! `tests/plugins/contract-v0-1`). Phase 1 (`replay-baseline`): the `latency`
//! scenario's inserter offers `--rate` live rows/s (default 1,000) for `--duration`. Phase 2
//! (`replay-during`): `sluice replay --since 1h --rate 2000 --yes` schedules every sent row,
//! and the same inserter runs for `--duration` again while the replayed rows come due. Each
//! phase's live rows are measured as in `latency` (commit → produce, commit → consumer;
//! the first second left out); phase 2 also reports the replayed rows the consumer saw during
//! its window (the replay's achieved rate). `sluice replay` paces itself for the replay's
//! length; it is stopped after the window.

use std::time::Duration;

use anyhow::{Context, bail};

use super::latency::{self, Consumer};
use crate::cli::Settings;
use crate::outbox::{self, BenchTable};
use crate::relay::{self, Measured};
use crate::report::Figure;
use crate::{kafka, names};
use sluice_testkit::DbTable;
use sluice_testkit::config::{Plugin, RelayConfig, toml_string};

pub(super) const NAME: &str = "replay";
/// Rows per second the replay is scheduled at.
const REPLAY_RATE: u32 = 2_000;
const WARM_UP: Duration = Duration::from_secs(3);
/// Time after a phase's last insert for its rows to reach the consumer.
const SETTLE: Duration = Duration::from_secs(3);

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let table = outbox::create(settings, "replay", None).await?;
    let measured = measure(settings, &table).await;
    table.drop_table().await;
    measured
}

async fn measure(settings: &Settings, table: &DbTable) -> anyhow::Result<Vec<Figure>> {
    table.fill(settings.rows, None).await?;
    table
        .try_execute("UPDATE {t} SET published_at = now() - interval '1 minute'")
        .await?;
    table.try_execute("VACUUM ANALYZE {t}").await?;
    let prefix = names::topic_prefix("replay");
    let topics = kafka::topics(&prefix);
    kafka::create_topics(&settings.kafka, &topics).await?;
    let consumer = Consumer::start(&settings.kafka, topics).await?;
    let config = RelayConfig {
        database_url: settings.database_url.clone(),
        table: table.name.clone(),
        kafka: settings.kafka.clone(),
        relay: std::iter::once(("mark".to_owned(), toml_string("published_at")))
            .chain(settings.relay.iter().cloned())
            .collect(),
        default_plugin: Some((Plugin::Wasm(settings.send_time_plugin()?), prefix)),
        ..RelayConfig::default()
    };
    let mut relay = relay::start(&settings.sluice, &config, "warn")?;
    relay.sleep(WARM_UP).await?;
    let per_transaction = latency::rows_per_transaction(settings.rate)?;

    let baseline = latency::insert_load(
        &settings.database_url,
        table,
        settings.duration,
        per_transaction,
    )
    .await?;
    relay.sleep(SETTLE).await?;

    let replayed_before = consumer.seen();
    let replay = tokio::process::Command::new(&settings.sluice)
        .args([
            "replay",
            "--database-url",
            &settings.database_url,
            "--table",
            &table.name,
            "--since",
            "1h",
            "--rate",
            &REPLAY_RATE.to_string(),
            "--yes",
            "--force",
        ])
        .env_remove("SLUICE_DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot start sluice replay")?;
    let during = latency::insert_load(
        &settings.database_url,
        table,
        settings.duration,
        per_transaction,
    )
    .await?;
    let window = during.elapsed;
    // Distinct rows seen during phase 2 minus its live rows: the replayed rows sent.
    let replayed_sent = consumer
        .seen()
        .saturating_sub(replayed_before + during.commits.len());
    // `sluice replay` paces itself for the replay's length (--rows / 2,000 s): stop it; the
    // rows it made due are sent anyway.
    let mut replay = replay;
    if let Ok(Some(status)) = replay.try_wait() {
        let output = replay.wait_with_output().await?;
        if !status.success() {
            bail!(
                "sluice replay failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    } else {
        replay.start_kill().context("cannot stop sluice replay")?;
        replay.wait().await?;
    }
    relay.sleep(SETTLE).await?;
    relay.stop_measured().await?;
    let sightings = consumer.finish().await?;

    let mut out = latency::figures("replay-baseline", &baseline, &sightings)?;
    out.extend(latency::figures("replay-during", &during, &sightings)?);
    out.push(Figure::new(
        "replay-during",
        "replayed rows sent in the window",
        replayed_sent as f64,
        "rows",
    ));
    out.push(Figure::new(
        "replay-during",
        "replay rate achieved (limit 2,000)",
        replayed_sent as f64 / window.as_secs_f64(),
        "rows/s",
    ));
    Ok(out)
}
