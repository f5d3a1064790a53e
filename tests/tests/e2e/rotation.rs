//! Credential rotation on SIGHUP, end to end: the relay reads its config's `${file:…}`
//! references again, replaces its producer while rows are in flight (none lost, none sent
//! twice), opens new database connections with a changed URL, and keeps the credentials in
//! use when a secret file became unreadable, saying so. (Authentication failures and their fix
//! by a SIGHUP against a SASL broker: tests/tests/secure_kafka.rs.)

use std::path::Path;
use std::time::Duration;

use sluice_testkit::*;

fn write(dir: &Path, name: &str, value: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("{value}\n")).expect("write file");
    path.display().to_string()
}

/// `count` lines of the log that contain `needle`.
fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_swaps_the_producer_mid_stream_and_no_row_is_lost_or_sent_twice() {
    let s = Scenario::new("rotate_kafka", &["order", "customer"]).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let client_id = write(dir.path(), "client-id", "sluice-0");
    // `client.id` stands in for a rotated password: any change of [kafka] makes a new producer.
    let config = s.config("batch_size = 50", "").replace(
        "[kafka]\n",
        &format!("[kafka]\n\"client.id\" = \"${{file:{client_id}}}\"\n"),
    );
    assert!(config.contains("client.id"), "{config}");
    let relay = RelayProcess::start(&config).expect("start relay");
    let started = relay.wait_started(SCENARIO_WAIT).await;
    assert!(started, "{}", relay.log());
    let rounds = 8;
    for round in 1..=rounds {
        s.table.insert_rows(150, None).await;
        write(dir.path(), "client-id", &format!("sluice-{round}"));
        relay.hangup();
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.unsent().await == 0 }).await;
    assert!(drained, "rows left unsent: {}", relay.log());
    let received = s.consume(150 * rounds, Duration::from_secs(2));
    let counts = count_by_id(&received);
    assert_eq!(counts.len(), 150 * rounds, "every row arrived");
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "rows published twice: {twice:?}");
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let swaps = lines_with(&exit.log, "config reload: new kafka producer");
    // Signals that arrive while one is being handled are merged: at least a few swaps, each
    // while rows were moving.
    assert!(swaps >= 3, "only {swaps} producer swaps:\n{}", exit.log);
    s.finish().await;
}

/// How many database sessions have `application_name` = `name`.
async fn connections_named(name: &str) -> i64 {
    let pool = pool().await;
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(name)
        .fetch_one(&pool)
        .await
        .expect("pg_stat_activity")
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_gives_new_database_connections_the_rotated_url() {
    let s = Scenario::new("rotate_db", &["order", "customer"]).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let (before, after) = (unique("before"), unique("after"));
    // The application name stands in for a rotated password (the server here trusts every
    // password): it shows which URL a connection was opened with.
    let name_file = write(dir.path(), "app-name", &before);
    let config = with_database_url(
        &s.config("", ""),
        &format!("{}?application_name=${{file:{name_file}}}", database_url()),
    );
    assert!(config.contains("application_name"), "{config}");
    let relay = RelayProcess::start(&config).expect("start relay");
    s.table.insert_rows(20, None).await;
    let sent = wait_until(SCENARIO_WAIT, || async { s.table.unsent().await == 0 }).await;
    assert!(sent, "{}", relay.log());
    assert!(
        connections_named(&before).await > 0,
        "the relay's connections use the first URL"
    );

    write(dir.path(), "app-name", &after);
    relay.hangup();
    let applied = wait_until(SCENARIO_WAIT, || async {
        relay
            .log()
            .contains("config reload: new database connections use the re-read database.url")
    })
    .await;
    assert!(applied, "{}", relay.log());
    // The old sessions end (as an operator would end them after revoking the old password);
    // the pool opens new ones with the new URL, and rows keep flowing.
    let pool = pool().await;
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&before)
    .execute(&pool)
    .await
    .expect("terminate old sessions");
    s.table.insert_rows(20, None).await;
    let sent = wait_until(SCENARIO_WAIT, || async { s.table.unsent().await == 0 }).await;
    assert!(sent, "rows after the rotation: {}", relay.log());
    assert!(
        connections_named(&after).await > 0,
        "new connections use the new URL"
    );
    assert_eq!(
        connections_named(&before).await,
        0,
        "no connection came back with the old URL"
    );
    let received = s.consume(40, Duration::from_millis(500));
    assert_eq!(count_by_id(&received).len(), 40);
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_secret_file_keeps_the_credentials_in_use_and_says_so() {
    let s = Scenario::new("rotate_gone", &["order", "customer"]).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let client_id = write(dir.path(), "client-id", "sluice-kept");
    let name_file = write(dir.path(), "app-name", &unique("kept"));
    let config = with_database_url(
        &s.config("", ""),
        &format!("{}?application_name=${{file:{name_file}}}", database_url()),
    )
    .replace(
        "[kafka]\n",
        &format!("[kafka]\n\"client.id\" = \"${{file:{client_id}}}\"\n"),
    );
    let relay = RelayProcess::start(&config).expect("start relay");
    let started = relay.wait_started(SCENARIO_WAIT).await;
    assert!(started, "{}", relay.log());
    std::fs::remove_file(&client_id).expect("remove");
    std::fs::remove_file(&name_file).expect("remove");
    relay.hangup();
    let said = wait_until(SCENARIO_WAIT, || async {
        let log = relay.log();
        log.contains("config reload: keeping the current [kafka] settings")
            && log.contains("config reload: keeping the current [database] settings")
    })
    .await;
    let log = relay.log();
    assert!(said, "{log}");
    assert!(
        log.contains(&format!("cannot read file {client_id}")),
        "the log names the file: {log}"
    );
    assert_eq!(
        lines_with(&log, "config reload: new kafka producer"),
        0,
        "{log}"
    );
    s.table.insert_rows(10, None).await;
    let sent = wait_until(SCENARIO_WAIT, || async { s.table.unsent().await == 0 }).await;
    assert!(
        sent,
        "rows still flow on the kept credentials: {}",
        relay.log()
    );
    assert_eq!(
        count_by_id(&s.consume(10, Duration::from_millis(500))).len(),
        10
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    s.finish().await;
}
