//! SQLite: claims are committed leases, so the application writes while a batch is out, and
//! an expired lease hands the rows to another relay.

use std::time::{Duration, Instant};

use super::databases::LiteFixture;
use super::{Fixture, ids, int_ids, row, sent};
use crate::store::{ClaimedBatch, OutboxStore, StoreError, StoreOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_writes_while_a_batch_is_claimed() {
    let f = LiteFixture::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    f.insert(&[row(None, "a", 1)]).await;
    let claim = store.claim(10, &[]).await.unwrap();
    let started = Instant::now();
    let more = f.insert(&[row(None, "b", 2)]).await;
    assert!(started.elapsed() < Duration::from_secs(1));
    let next = store.claim(10, &[]).await.unwrap();
    assert_eq!(
        ids(&next.rows),
        int_ids(&more),
        "only the new row: the first is leased"
    );
    next.batch.abandon().await.unwrap();
    claim.batch.abandon().await.unwrap();
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_hands_the_rows_to_another_relay_and_the_first_cannot_mark_them() {
    let f = LiteFixture::new().await;
    let short = StoreOptions {
        lease: Duration::from_millis(200),
        ..StoreOptions::default()
    };
    let slow = f.migrated(short).await;
    let other = f.open(short).await;
    let inserted = f.insert(&[row(None, "a", 1), row(None, "b", 2)]).await;
    let stale = slow.claim(10, &[]).await.unwrap();
    assert!(other.claim(10, &[]).await.unwrap().is_empty(), "leased");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(other.has_due(&[]).await.unwrap(), "the lease expired");
    let taken = other.claim(1, &[]).await.unwrap();
    assert_eq!(ids(&taken.rows), int_ids(&inserted[..1]));
    // The slow relay published both; one row is now another relay's.
    let outcome = sent(int_ids(&inserted));
    let err = stale
        .batch
        .complete(sent(int_ids(&inserted)))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::MarkMismatch { .. }), "{err}");
    let settlement = slow.settle(&outcome).await.unwrap();
    assert_eq!(
        settlement.marked,
        int_ids(&inserted[1..]),
        "its expired lease, unclaimed"
    );
    assert_eq!(
        settlement.skipped,
        int_ids(&inserted[..1]),
        "leased by the other relay"
    );
    taken
        .batch
        .complete(sent(int_ids(&inserted[..1])))
        .await
        .unwrap();
    assert_eq!(f.count().await, 0);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_put_back_without_an_outcome_are_claimable_at_once() {
    let f = LiteFixture::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    let inserted = f.insert(&[row(None, "a", 1), row(None, "b", 2)]).await;
    let claim = store.claim(10, &[]).await.unwrap();
    // The relay recorded row 1 and held row 2 back (no outcome for it).
    claim
        .batch
        .complete(sent(int_ids(&inserted[..1])))
        .await
        .unwrap();
    let again = store.claim(10, &[]).await.unwrap();
    assert_eq!(ids(&again.rows), int_ids(&inserted[1..]));
    again.batch.abandon().await.unwrap();
    f.cleanup().await;
}
