//! Retention: in `published_at` mode the pruner deletes sent rows past `relay.retention`,
//! never unsent or dead ones; `sluice dead purge` deletes dead rows.

use std::time::Duration;

use sluice_testkit::*;

#[tokio::test(flavor = "multi_thread")]
async fn sent_rows_are_pruned_after_retention_and_dead_rows_are_kept_until_purged() {
    let s = Scenario::new("retention", &["order", "customer"]).await;
    s.table.insert_rows(40, None).await;
    s.table.insert_rows(3, Some("refuser")).await;
    let tenants = s.tenant("refuser", "test_fail_permanent", "");
    let config = s.config(
        "mark = \"published_at\"\nretention = \"2s\"\nprune_interval = \"300ms\"",
        &tenants,
    );
    let dead = "SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL";
    let relay = RelayProcess::start(&config).unwrap();
    // First the rows are sent and kept…
    let sent = wait_until(SCENARIO_WAIT, || async {
        s.table
            .scalar_i64("SELECT count(*) FROM {t} WHERE published_at IS NOT NULL")
            .await
            == 40
            && s.table.scalar_i64(dead).await == 3
    })
    .await;
    assert!(sent, "{}", relay.log());
    assert_eq!(s.table.count().await, 43, "sent rows are kept for a while");
    // …then pruned; dead rows stay.
    let pruned = wait_until(Duration::from_secs(30), || async {
        s.table.count().await == 3
    })
    .await;
    let exit = relay.stop();
    assert!(pruned, "{}", exit.log);
    assert!(exit.log.contains("pruned sent rows"), "{}", exit.log);
    assert_eq!(s.table.scalar_i64(dead).await, 3);

    let purge = |older_than: &str| {
        sluice(&[
            "dead",
            "purge",
            "--database-url",
            &database_url(),
            "--table",
            &s.table.name,
            "--older-than",
            older_than,
        ])
    };
    let kept = purge("1h");
    assert!(kept.status.success());
    assert!(String::from_utf8_lossy(&kept.stdout).contains("0 dead rows purged"));
    let purged = purge("0s");
    assert!(
        String::from_utf8_lossy(&purged.stdout).contains("3 dead rows purged"),
        "{}",
        String::from_utf8_lossy(&purged.stderr)
    );
    assert_eq!(s.table.count().await, 0);
    s.finish().await;
}
