//! `relay.fair_share`: a small tenant's rows go out while a big tenant's backlog ahead of
//! them drains, every row still once (PostgreSQL, MariaDB, SQLite); a table without the tenant
//! index is refused with the statement that creates it, and `sluice migrate --config` creates
//! it.

use std::time::Duration;

use sluice_testkit::*;
use sluice_testkit::{Database, DbTable};

use crate::databases::topics_for;

const BIG: i64 = 6_000;

#[tokio::test(flavor = "multi_thread")]
async fn fair_share_without_the_tenant_index_is_refused_naming_the_statement() {
    // The scenario's table is migrated without a config: no tenant index.
    let s = Scenario::new("fair_noidx", &["order", "customer"]).await;
    let config = s.config("fair_share = 10", "");
    let checked = sluice_with_config(&["config", "check", "--connect"], &config);
    let refused = sluice_with_config(&["run"], &config);
    for (what, out) in [("config check", &checked), ("run", &refused)] {
        assert!(!out.status.success(), "{what} succeeded");
        let said = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("relay.fair_share")
                && said.contains("no index led by its tenant column")
                && said.contains("CREATE INDEX IF NOT EXISTS"),
            "{what}: {said}"
        );
    }
    // `sluice migrate --config` creates the index; the relay then starts and delivers.
    migrate_with(&config);
    s.table.insert_rows(10, None).await;
    s.relay_until(&config, || async { s.table.count().await == 0 })
        .await;
    s.finish().await;
}

/// Through `sluice run` on `kind`: the small tenant's rows, behind the whole backlog in claim
/// order, are all sent before half of it. (MariaDB and SQLite walk the tenants in plain reads
/// and then lock, or lease, the rows they picked; PostgreSQL does it in one statement.)
async fn a_small_tenant_goes_first_on(kind: Database) {
    let table = DbTable::create(kind, "fairdb").await;
    let bootstrap = kafka_bootstrap();
    let (prefix, topics) = topics_for(&table, &bootstrap).await;
    table.insert_rows(BIG, Some("big")).await;
    // Behind all of them in claim order.
    table.insert_rows(5, Some("small")).await;
    let relay_settings = "batch_size = 50\nworkers = 2\nfair_share = 5";
    let config = table.config(&bootstrap, &prefix, "", relay_settings, "");
    migrate_with(&config);
    let relay = RelayProcess::start(&config).expect("start relay");
    let small = "SELECT count(*) FROM {t} WHERE tenant = 'small'";
    let big = "SELECT count(*) FROM {t} WHERE tenant = 'big'";
    let small_sent = wait_until(SCENARIO_WAIT, || async {
        table.scalar_i64(small).await == 0
    })
    .await;
    assert!(small_sent, "{}", relay.log());
    let big_left = table.scalar_i64(big).await;
    assert!(
        big_left > BIG / 2,
        "{kind:?}: the small tenant's rows waited for {} of the big tenant's",
        BIG - big_left
    );
    let drained = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    assert!(drained, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let expected = BIG as usize + 5;
    let got = consume(
        &bootstrap,
        &topics,
        expected,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .expect("consume");
    let by_id = count_by_id(&got);
    assert_eq!(by_id.len(), expected, "every row delivered");
    assert!(by_id.values().all(|&n| n == 1), "none twice");
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_tenants_rows_flow_while_a_big_backlog_ahead_of_them_drains() {
    a_small_tenant_goes_first_on(Database::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_mariadb_a_small_tenants_rows_flow_while_a_big_backlog_drains() {
    a_small_tenant_goes_first_on(Database::Mariadb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_sqlite_a_small_tenants_rows_flow_while_a_big_backlog_drains() {
    a_small_tenant_goes_first_on(Database::Sqlite).await;
}

/// `sluice migrate --config` with `config`: the indexes its `[relay]` settings need.
fn migrate_with(config: &str) {
    let migrated = sluice_with_config(&["migrate"], config);
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
}
