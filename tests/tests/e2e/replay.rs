//! `sluice replay` through the binary on each database: sent rows published again with the
//! `sluice-replay` header while live rows keep flowing, the replay shown by `sluice status`
//! and `/status`; the refusals (key ordering without `--force`, `mark = "delete"`, a table
//! without the marker column).

use std::time::Duration;

use sluice_testkit::*;
use sluice_testkit::{Database, DbTable, free_port};

use crate::databases::topics_for;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Writes `config` to a file in `dir`; returns its path.
fn config_file(dir: &tempfile::TempDir, config: &str) -> String {
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config).expect("write config");
    path.display().to_string()
}

async fn replayed_rows_are_published_again_with_the_header_beside_live_rows(kind: Database) {
    let table = DbTable::create(kind, "replay").await;
    let bootstrap = kafka_bootstrap();
    let (prefix, topics) = topics_for(&table, &bootstrap).await;
    let port = free_port();
    let config = table.config(&bootstrap, &prefix, "", "mark = \"published_at\"", "")
        + &format!("\n[telemetry]\nlisten = \"127.0.0.1:{port}\"\nsample_interval = \"1s\"\n");
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = config_file(&dir, &config);
    let sent = "SELECT COUNT(*) FROM {t} WHERE published_at IS NOT NULL";
    let n = 20;
    table.insert_rows(n, None).await;
    let relay = RelayProcess::start(&config).expect("start relay");
    let all_sent = wait_until(SCENARIO_WAIT, || async {
        table.scalar_i64(sent).await == n
    })
    .await;
    assert!(all_sent, "{}", relay.log());

    // Counted, nothing changed.
    let dry = sluice(&["replay", "--config", &path, "--since", "1h", "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(
        stdout(&dry).contains(&format!("{n} sent rows")),
        "{}",
        stdout(&dry)
    );
    assert_eq!(table.scalar_i64(sent).await, n);

    // 2 rows/s: the replay's last row is due after 9.5 s; the command paces itself that long.
    let replay = std::process::Command::new(sluice_bin())
        .args([
            "replay", "--config", &path, "--since", "1h", "--rate", "2", "--yes",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start sluice replay");
    let mut id = String::new();
    let listed = wait_until(Duration::from_secs(10), || {
        let status = sluice(&["status", "--config", &path, "--json"]);
        let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap_or_default();
        let found = json["replays"][0]["id"].as_str().map(str::to_owned);
        if let Some(found) = &found {
            id = found.clone();
        }
        async move { found.is_some() }
    })
    .await;
    assert!(listed, "sluice status never listed the replay");
    // `sluice status` (from the database) and the relay's `/status` show it running.
    let status = sluice(&["status", "--config", &path, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&status), stderr(&status)));
    let replays = json["replays"].as_array().cloned().unwrap_or_default();
    assert_eq!(replays.len(), 1, "{json}");
    assert_eq!(replays[0]["id"], id.as_str());
    assert!(replays[0]["rows_left"].as_i64().unwrap_or(0) > 0, "{json}");
    assert!(
        replays[0]["eta_seconds"].as_f64().unwrap_or(0.0) > 0.0,
        "{json}"
    );
    let table_view = stdout(&sluice(&["status", "--config", &path]));
    assert!(
        table_view.contains(&format!("replay {id}: ")),
        "{table_view}"
    );
    let relay_sees = wait_until(Duration::from_secs(10), || async {
        http_get(port, "/status").is_some_and(|(_, body)| body.contains(&id))
    })
    .await;
    assert!(relay_sees, "/status never listed replay {id}");

    // Live rows flow meanwhile, ahead of the replay's last rows.
    table.insert_rows(5, Some("live")).await;
    let live_sent = wait_until(Duration::from_secs(8), || async {
        table
            .scalar_i64(
                "SELECT COUNT(*) FROM {t} WHERE tenant = 'live' AND published_at IS NOT NULL",
            )
            .await
            == 5
    })
    .await;
    assert!(
        live_sent,
        "live rows waited for the replay: {}",
        relay.log()
    );
    assert!(
        table
            .scalar_i64("SELECT COUNT(*) FROM {t} WHERE replay_id IS NOT NULL")
            .await
            > 0,
        "the replay was still running while live rows were sent"
    );
    let replay = replay.wait_with_output().expect("sluice replay");
    assert!(
        replay.status.success(),
        "{}{}",
        stdout(&replay),
        stderr(&replay)
    );
    let out = stdout(&replay);
    assert!(out.contains(&format!("{n} rows are due again")), "{out}");
    assert!(out.contains(&format!("sluice-replay: {id}")), "{out}");
    // Then every replayed row is sent again, its marker cleared.
    let done = wait_until(SCENARIO_WAIT, || async {
        table
            .scalar_i64(
                "SELECT COUNT(*) FROM {t} WHERE replay_id IS NOT NULL OR published_at IS NULL",
            )
            .await
            == 0
    })
    .await;
    let exit = relay.stop();
    assert!(done && exit.success, "{}", exit.log);

    let got = consume(
        &bootstrap,
        &topics,
        (2 * n + 5) as usize,
        SCENARIO_WAIT,
        Duration::from_secs(2),
    )
    .expect("consume");
    let replayed: Vec<&Received> = got
        .iter()
        .filter(|m| m.header("sluice-replay").is_some())
        .collect();
    assert_eq!(replayed.len(), n as usize);
    assert!(
        replayed
            .iter()
            .all(|m| m.header("sluice-replay").as_deref() == Some(&id))
    );
    let counts = count_by_id(&got);
    assert!(counts.values().all(|c| *c <= 2), "{counts:?}");
    assert_eq!(got.len(), (2 * n + 5) as usize);
    // Finished: neither status lists it any more.
    let status = sluice(&["status", "--config", &path, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert!(json.get("replays").is_none(), "{json}");
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_replayed_rows_are_published_again_with_the_header_beside_live_rows() {
    replayed_rows_are_published_again_with_the_header_beside_live_rows(Database::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_replayed_rows_are_published_again_with_the_header_beside_live_rows() {
    replayed_rows_are_published_again_with_the_header_beside_live_rows(Database::Mariadb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_replayed_rows_are_published_again_with_the_header_beside_live_rows() {
    replayed_rows_are_published_again_with_the_header_beside_live_rows(Database::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_refuses_key_order_delete_mode_and_a_table_without_the_marker() {
    let table = DbTable::create(Database::Postgres, "replayno").await;
    table.insert_rows(3, None).await;
    table
        .execute("UPDATE {t} SET published_at = now() - interval '1 minute'")
        .await;
    let bootstrap = kafka_bootstrap();
    let dir = tempfile::tempdir().expect("temporary directory");
    let replay = |relay_extra: &str, extra: &[&str]| {
        let config = table.config(&bootstrap, "x.", "", relay_extra, "");
        let path = config_file(&dir, &config);
        let mut args = vec![
            "replay",
            "--config",
            path.as_str(),
            "--since",
            "1h",
            "--yes",
        ];
        args.extend(extra);
        sluice(&args)
    };
    let unsent = "SELECT COUNT(*) FROM {t} WHERE published_at IS NULL";

    let keyed = replay("mark = \"published_at\"\nordering = \"key\"", &[]);
    assert!(!keyed.status.success());
    let err = stderr(&keyed);
    assert!(err.contains("relay.ordering = \"key\""), "{err}");
    assert!(
        err.contains("--force") && err.contains("another topic"),
        "{err}"
    );
    assert_eq!(table.scalar_i64(unsent).await, 0, "nothing changed");
    let forced = replay(
        "mark = \"published_at\"\nordering = \"key\"",
        &["--force", "--rate", "1000"],
    );
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert!(
        stdout(&forced).contains("3 rows are due again"),
        "{}",
        stdout(&forced)
    );
    assert_eq!(table.scalar_i64(unsent).await, 3);

    let delete = replay("", &[]);
    assert!(!delete.status.success());
    let err = stderr(&delete);
    assert!(err.contains("nothing to replay"), "{err}");
    assert!(
        err.contains("published_at") && err.contains("sluice dead replay"),
        "{err}"
    );

    // Without --config the relays' settings are unknown: --force.
    let url = sluice(&[
        "replay",
        "--database-url",
        &table.url,
        "--table",
        &table.name,
        "--since",
        "1h",
        "--yes",
    ]);
    assert!(
        stderr(&url).contains("without --config"),
        "{}",
        stderr(&url)
    );

    table.execute("ALTER TABLE {t} DROP COLUMN replay_id").await;
    let old = replay("mark = \"published_at\"", &[]);
    assert!(!old.status.success());
    assert!(
        stderr(&old).contains("run `sluice migrate`"),
        "{}",
        stderr(&old)
    );
    table.drop_table().await;
}

/// Windows as people type them, on MariaDB (whose `FROM_UNIXTIME` turns a time before 1970
/// into NULL): `--since 100y` counts every sent row; a `--since` after `--until`, in the
/// future, or a negative duration is refused naming it; nothing changes.
#[tokio::test(flavor = "multi_thread")]
async fn replay_windows_are_checked_and_a_since_before_1970_takes_every_row() {
    let table = DbTable::create(Database::Mariadb, "replaywin").await;
    table.insert_rows(4, None).await;
    table
        .execute("UPDATE {t} SET published_at = NOW(6) - INTERVAL 1 MINUTE")
        .await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = table.config(&kafka_bootstrap(), "x.", "", "mark = \"published_at\"", "");
    let path = config_file(&dir, &config);
    let replay = |window: &[&str]| {
        let mut args = vec!["replay", "--config", path.as_str(), "--dry-run"];
        args.extend(window);
        sluice(&args)
    };
    for window in [
        &["--since", "100y"][..],
        &["--since", "1960-01-01T00:00:00Z", "--until", "1s"],
    ] {
        let all = replay(window);
        assert!(all.status.success(), "{window:?}: {}", stderr(&all));
        assert!(
            stdout(&all).starts_with("4 sent rows"),
            "{window:?}: {}",
            stdout(&all)
        );
    }
    for (window, said) in [
        (
            &["--since", "1h", "--until", "2h"][..],
            "is not before --until",
        ),
        (&["--since", "2999-01-01T00:00:00Z"], "is in the future"),
        (&["--since", "-5m"], "is neither an RFC 3339 time"),
    ] {
        let refused = replay(window);
        assert!(!refused.status.success(), "{window:?}");
        assert!(
            stderr(&refused).contains(said),
            "{window:?}: {}",
            stderr(&refused)
        );
    }
    let unsent = "SELECT COUNT(*) FROM {t} WHERE published_at IS NULL";
    assert_eq!(table.scalar_i64(unsent).await, 0, "nothing changed");
    table.drop_table().await;
}
