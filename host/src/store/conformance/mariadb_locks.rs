//! MariaDB/MySQL: a claim must not make the application's inserts wait. Under InnoDB's
//! default REPEATABLE READ a locking read that reaches the end of the unsent rows takes a
//! next-key lock on the gap after them, and every insert waits for the claimer's commit.

use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Connection, MySqlConnection};

use super::databases::{MyFixture, my};
use super::{Fixture, row};
use crate::store::{ClaimedBatch, OutboxStore, StoreOptions};

/// Inserts one row on a fresh connection that waits at most 2 s for a lock; returns how
/// long it took, or the error.
async fn insert_with_short_wait(f: &MyFixture) -> Result<Duration, sqlx::Error> {
    let mut conn = MySqlConnection::connect(&my::url()).await?;
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 2")
        .execute(&mut conn)
        .await?;
    let started = Instant::now();
    sqlx::query(AssertSqlSafe(f.sql(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'new', 'OrderCreated', '{}')",
    )))
    .execute(&mut conn)
    .await?;
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_do_not_wait_for_an_open_claim() {
    let f = MyFixture::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    f.insert(&(1..=5).map(|n| row(None, "k", n)).collect::<Vec<_>>())
        .await;
    // A claim that reads past the last unsent row (limit above the backlog), held open
    // as while the relay waits for the broker.
    let claim = store.claim(500, &[]).await.unwrap();
    assert_eq!(claim.len(), 5);
    let took = insert_with_short_wait(&f)
        .await
        .expect("the insert must not wait for the relay's open claim");
    assert!(took < Duration::from_secs(1), "insert took {took:?}");
    claim.batch.abandon().await.unwrap();
    f.cleanup().await;
}

/// The same claim at REPEATABLE READ does block the insert: the test above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_claim_at_repeatable_read_would_block_inserts() {
    let f = MyFixture::new().await;
    let _store = f.migrated(StoreOptions::default()).await;
    f.insert(&(1..=5).map(|n| row(None, "k", n)).collect::<Vec<_>>())
        .await;
    let mut claimer = MySqlConnection::connect(&my::url()).await.unwrap();
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut claimer)
        .await
        .unwrap();
    let mut tx = claimer.begin().await.unwrap();
    let claimed = sqlx::query(AssertSqlSafe(f.sql(
        "SELECT id FROM {t} WHERE published_at IS NULL AND dead_at IS NULL
          ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED",
    )))
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(claimed.len(), 5);
    let err = insert_with_short_wait(&f)
        .await
        .expect_err("REPEATABLE READ's gap lock blocks the insert");
    assert!(err.to_string().contains("Lock wait timeout"), "{err}");
    tx.rollback().await.unwrap();
    f.cleanup().await;
}
