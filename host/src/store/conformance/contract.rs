//! The behaviour every store must have, the in-memory one included: claims, locks, marking,
//! failures, key order, observation, maintenance and dead rows (see the suite's opening
//! comment).

use std::time::{Duration, Instant};

use super::{Fixture, HOUR, failure, ids, int_ids, published_at, row, sent, tenants};
use crate::model::{OutboxId, TenantId};
use crate::store::{
    AfterDead, BatchOutcome, ClaimedBatch, Disposition, Ordering, OutboxStore, ReplaySelection,
    StoreError, StoreOptions,
};

pub(super) async fn claims_decode_rows_in_insertion_order<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    let before = chrono::Utc::now() - chrono::Duration::seconds(60);
    let inserted = f
        .insert(&[
            row(Some("acme"), "a1", 1),
            row(None, "a2", 2),
            row(None, "a3", 3),
        ])
        .await;
    let claim = store.claim(10, &[]).await.unwrap();
    assert_eq!(ids(&claim.rows), int_ids(&inserted));
    assert!(claim.rejected.is_empty());
    let first = &claim.rows[0];
    assert_eq!(first.tenant.as_str(), "acme");
    assert_eq!(claim.rows[1].tenant.as_str(), TenantId::DEFAULT_NAME);
    assert_eq!(first.aggregate_type, "order");
    assert_eq!(first.aggregate_id, "a1");
    assert_eq!(first.event_type, "OrderCreated");
    let payload: serde_json::Value = serde_json::from_slice(&first.payload).unwrap();
    assert_eq!(payload, serde_json::json!({"n": 1}));
    assert_eq!(first.headers, vec![("trace".to_owned(), b"t1".to_vec())]);
    assert!(first.created_at > before && first.created_at <= chrono::Utc::now());
    assert_eq!(first.attempts, 0);
    claim.batch.complete(sent(ids(&claim.rows))).await.unwrap();
    assert_eq!(f.count().await, 0, "delete mode removes sent rows");
    assert_eq!(store.backlog().await.unwrap(), Default::default());
    f.cleanup().await;
}

pub(super) async fn two_claimers_get_disjoint_rows<F: Fixture>() {
    let f = F::new().await;
    let first = f.migrated(StoreOptions::default()).await;
    let second = f.open(StoreOptions::default()).await;
    let inserted = f
        .insert(
            &(1..=6)
                .map(|n| row(None, &format!("k{n}"), n))
                .collect::<Vec<_>>(),
        )
        .await;
    let a = first.claim(4, &[]).await.unwrap();
    let b = second.claim(10, &[]).await.unwrap();
    assert_eq!(ids(&a.rows), int_ids(&inserted[..4]));
    assert_eq!(
        ids(&b.rows),
        int_ids(&inserted[4..]),
        "the held rows are skipped"
    );
    assert!(
        second.claim(10, &[]).await.unwrap().is_empty(),
        "nothing is claimable twice"
    );
    let a_ids = ids(&a.rows);
    a.batch.abandon().await.unwrap();
    let again = second.claim(10, &[]).await.unwrap();
    assert_eq!(
        ids(&again.rows),
        a_ids,
        "abandoned rows are claimable again, unchanged"
    );
    assert_eq!(again.rows[0].attempts, 0);
    again.batch.complete(sent(a_ids)).await.unwrap();
    b.batch.complete(sent(ids(&b.rows))).await.unwrap();
    assert_eq!(f.count().await, 0);
    f.cleanup().await;
}

/// While a backlog drains, a claim may start past the rows claimed last (the PostgreSQL
/// driver's claim cursor); rows put back behind it must still come round, soon.
pub(super) async fn rows_put_back_behind_full_claims_are_claimed_again<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    let inserted = f
        .insert(
            &(1..=8)
                .map(|n| row(None, &format!("k{n}"), n))
                .collect::<Vec<_>>(),
        )
        .await;
    let first = store.claim(2, &[]).await.unwrap();
    let second = store.claim(2, &[]).await.unwrap();
    assert_eq!(ids(&first.rows), int_ids(&inserted[..2]));
    assert_eq!(ids(&second.rows), int_ids(&inserted[2..4]));
    first.batch.abandon().await.unwrap();
    // `second` stays open (its rows locked) while later claims are sent at once.
    let mut seen = ids(&second.rows);
    let started = Instant::now();
    while !int_ids(&inserted[..2]).iter().all(|id| seen.contains(id)) {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "rows put back were not claimed again within 3 s; claimed: {seen:?}"
        );
        let claim = store.claim(2, &[]).await.unwrap();
        let claimed = ids(&claim.rows);
        for id in &claimed {
            assert!(!seen.contains(id), "{id} claimed twice");
            seen.push(id.clone());
        }
        claim.batch.complete(sent(claimed)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = ids(&second.rows);
    second.batch.complete(sent(held)).await.unwrap();
    assert_eq!(f.count().await, 8 - seen.len() as i64);
    f.cleanup().await;
}

pub(super) async fn paused_tenants_are_skipped<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    let inserted = f
        .insert(&[
            row(Some("acme"), "a", 1),
            row(None, "b", 2),
            row(Some("beta"), "c", 3),
            // A tenant named "default" is not the rows without a tenant.
            row(Some("default"), "d", 4),
        ])
        .await;
    // "" stands for rows without a tenant.
    let claim = store.claim(10, &tenants(&["acme", ""])).await.unwrap();
    assert_eq!(ids(&claim.rows), int_ids(&inserted[2..]));
    claim
        .batch
        .complete(sent(int_ids(&inserted[2..])))
        .await
        .unwrap();
    assert!(!store.has_due(&tenants(&["acme", ""])).await.unwrap());
    assert!(store.has_due(&tenants(&["acme", "default"])).await.unwrap());
    let claim = store
        .claim(10, &tenants(&["acme", "default"]))
        .await
        .unwrap();
    assert_eq!(ids(&claim.rows), int_ids(&inserted[1..2]));
    claim.batch.abandon().await.unwrap();
    f.cleanup().await;
}

pub(super) async fn the_backlog_sample_counts_per_tenant_and_reads_at_most_its_limit<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    assert!(
        store.sample_backlog(100).await.unwrap().is_empty(),
        "an empty table"
    );
    let inserted = f
        .insert(&[
            row(Some("acme"), "a", 1),
            row(Some("acme"), "b", 2),
            row(Some("globex"), "c", 3),
            row(None, "d", 4),
            row(None, "e", 5),
            row(Some("acme"), "f", 6),
        ])
        .await;
    let claim = store.claim(3, &[]).await.unwrap();
    claim
        .batch
        .complete(BatchOutcome {
            sent: int_ids(&inserted[1..2]),
            failed: vec![
                failure(inserted[0], "fatal", Disposition::Dead),
                failure(inserted[2], "later", Disposition::Retry(HOUR)),
            ],
        })
        .await
        .unwrap();

    // Unsent: acme 6 due and 1 dead, globex 3 waiting, no tenant 4 and 5 due.
    let mut sample = store.sample_backlog(100).await.unwrap();
    sample.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    let counts: Vec<(Option<&str>, i64, i64, bool)> = sample
        .iter()
        .map(|t| {
            (
                t.tenant.as_deref(),
                t.due,
                t.dead,
                t.oldest_due_age.is_some(),
            )
        })
        .collect();
    assert_eq!(
        counts,
        [
            (None, 2, 0, true),
            (Some("acme"), 1, 1, true),
            (Some("globex"), 0, 0, false)
        ]
    );
    let waiting: Vec<(Option<&str>, i64)> = sample
        .iter()
        .map(|t| (t.tenant.as_deref(), t.waiting))
        .collect();
    assert_eq!(waiting, [(None, 0), (Some("acme"), 0), (Some("globex"), 1)]);
    for t in &sample {
        if let Some(age) = t.oldest_due_age {
            assert!(age < Duration::from_secs(600), "{t:?}: the rows are new");
        }
    }

    // Two rows at most of each kind, in claim order: globex's waiting row and row 4.
    let limited = store.sample_backlog(2).await.unwrap();
    let due: i64 = limited.iter().map(|t| t.due).sum();
    let dead: i64 = limited.iter().map(|t| t.dead).sum();
    assert_eq!((due, dead), (1, 1), "{limited:?}");
    // Due and waiting rows together say the sample reached its limit.
    let read: i64 = limited.iter().map(|t| t.due + t.waiting).sum();
    assert_eq!(read, 2, "{limited:?}");
    f.cleanup().await;
}

pub(super) async fn has_due_and_backlog_follow_the_rows_states<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    assert!(!store.has_due(&[]).await.unwrap(), "an empty table");
    let inserted = f
        .insert(&[
            row(None, "a", 1),
            row(None, "b", 2),
            row(None, "c", 3),
            row(None, "d", 4),
        ])
        .await;
    assert!(store.has_due(&[]).await.unwrap());
    let claim = store.claim(3, &[]).await.unwrap();
    claim
        .batch
        .complete(BatchOutcome {
            sent: vec![],
            failed: vec![
                failure(inserted[0], "later", Disposition::Retry(HOUR)),
                failure(inserted[1], "broker", Disposition::Wait(HOUR)),
                failure(inserted[2], "fatal", Disposition::Dead),
            ],
        })
        .await
        .unwrap();
    let backlog = store.backlog().await.unwrap();
    assert_eq!((backlog.due, backlog.waiting, backlog.dead), (1, 2, 1));
    let claim = store.claim(10, &[]).await.unwrap();
    assert_eq!(ids(&claim.rows), int_ids(&inserted[3..]));
    claim
        .batch
        .complete(sent(int_ids(&inserted[3..])))
        .await
        .unwrap();
    assert!(
        !store.has_due(&[]).await.unwrap(),
        "waiting and dead rows are not due"
    );
    f.cleanup().await;
}

pub(super) async fn failures_are_rescheduled_dead_lettered_or_waited_out<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    let inserted = f
        .insert(&[
            row(None, "a", 1),
            row(None, "b", 2),
            row(None, "c", 3),
            row(None, "d", 4),
        ])
        .await;
    let long = format!("boom {}", "x".repeat(10_000));
    let claim = store.claim(10, &[]).await.unwrap();
    claim
        .batch
        .complete(BatchOutcome {
            sent: vec![],
            failed: vec![
                failure(inserted[0], &long, Disposition::Retry(HOUR)),
                failure(inserted[1], "fatal", Disposition::Dead),
                failure(inserted[2], "broker down", Disposition::Wait(HOUR)),
                failure(inserted[3], "try again", Disposition::Retry(Duration::ZERO)),
            ],
        })
        .await
        .unwrap();
    let retried = f.state(inserted[0]).await.unwrap();
    assert!(retried.waiting && !retried.dead && !retried.published);
    assert_eq!(retried.attempts, 1);
    let error = retried.last_error.unwrap();
    assert!(
        error.starts_with("boom xxx") && error.len() <= 2_100,
        "{}",
        error.len()
    );
    let dead = f.state(inserted[1]).await.unwrap();
    assert!(dead.dead && !dead.waiting);
    assert_eq!(
        (dead.attempts, dead.last_error.as_deref()),
        (1, Some("fatal"))
    );
    let waited = f.state(inserted[2]).await.unwrap();
    assert!(waited.waiting);
    assert_eq!(waited.attempts, 0, "the broker's failure does not count");
    let again = store.claim(10, &[]).await.unwrap();
    assert_eq!(
        ids(&again.rows),
        int_ids(&inserted[3..]),
        "a zero delay is due at once"
    );
    assert_eq!(again.rows[0].attempts, 1);
    again.batch.abandon().await.unwrap();
    f.cleanup().await;
}

pub(super) async fn marking_published_at_keeps_the_row_and_never_claims_it_again<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(published_at()).await;
    let inserted = f.insert(&[row(None, "a", 1), row(None, "b", 2)]).await;
    let claim = store.claim(10, &[]).await.unwrap();
    claim
        .batch
        .complete(sent(int_ids(&inserted[..1])))
        .await
        .unwrap();
    let state = f.state(inserted[0]).await.unwrap();
    assert!(state.published && !state.dead);
    assert_eq!(f.count().await, 2);
    let claim = store.claim(10, &[]).await.unwrap();
    assert_eq!(
        ids(&claim.rows),
        int_ids(&inserted[1..]),
        "the row the batch put back is claimable at once; the sent one never again"
    );
    claim.batch.abandon().await.unwrap();
    assert_eq!(store.backlog().await.unwrap().due, 1);
    f.cleanup().await;
}

pub(super) async fn a_batch_naming_a_row_it_does_not_hold_fails_the_count_check_and_settle_records_the_rest<
    F: Fixture,
>() {
    let f = F::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    let inserted = f
        .insert(&[row(None, "a", 1), row(None, "b", 2), row(None, "c", 3)])
        .await;
    // Row 2 is gone (someone deleted it); the outcome still names it.
    f.delete(inserted[1]).await;
    let claim = store.claim(10, &[]).await.unwrap();
    assert_eq!(
        ids(&claim.rows),
        vec![OutboxId::Int(inserted[0]), OutboxId::Int(inserted[2])]
    );
    let outcome = BatchOutcome {
        sent: int_ids(&inserted[..2]),
        failed: vec![failure(inserted[2], "later", Disposition::Retry(HOUR))],
    };
    let err = claim
        .batch
        .complete(BatchOutcome {
            sent: outcome.sent.clone(),
            failed: outcome.failed.clone(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::MarkMismatch {
                expected: 2,
                affected: 1
            }
        ),
        "{err}"
    );
    let untouched = f.state(inserted[0]).await.unwrap();
    assert!(!untouched.published, "nothing of the batch was recorded");
    assert_eq!(f.state(inserted[2]).await.unwrap().attempts, 0);

    // The relay then records what it published in a fresh transaction.
    let settlement = store.settle(&outcome).await.unwrap();
    assert_eq!(settlement.marked, int_ids(&inserted[..1]));
    assert_eq!(settlement.rescheduled, int_ids(&inserted[2..]));
    assert_eq!(
        settlement.skipped,
        int_ids(&inserted[1..2]),
        "the deleted row"
    );
    assert!(settlement.refused.is_empty());
    assert_eq!(f.state(inserted[0]).await, None);
    let rescheduled = f.state(inserted[2]).await.unwrap();
    assert!(rescheduled.waiting);
    assert_eq!(rescheduled.attempts, 1);
    f.cleanup().await;
}

pub(super) async fn settle_skips_rows_another_relay_holds<F: Fixture>() {
    let f = F::new().await;
    let mine = f.migrated(StoreOptions::default()).await;
    let other = f.open(StoreOptions::default()).await;
    let inserted = f.insert(&[row(None, "a", 1), row(None, "b", 2)]).await;
    // As after a commit that failed: the batch rolled back, its rows are free again …
    mine.claim(10, &[])
        .await
        .unwrap()
        .batch
        .abandon()
        .await
        .unwrap();
    // … and another relay claims one of them before the settling.
    let held = other.claim(1, &[]).await.unwrap();
    assert_eq!(ids(&held.rows), int_ids(&inserted[..1]));
    let settlement = mine.settle(&sent(int_ids(&inserted))).await.unwrap();
    assert_eq!(settlement.marked, int_ids(&inserted[1..]));
    assert_eq!(settlement.skipped, int_ids(&inserted[..1]));
    held.batch
        .complete(sent(int_ids(&inserted[..1])))
        .await
        .unwrap();
    assert_eq!(f.count().await, 0);
    f.cleanup().await;
}

pub(super) async fn key_order_holds_back_later_rows_of_a_key<F: Fixture>() {
    let f = F::new().await;
    let skip = StoreOptions {
        ordering: Ordering::Key,
        ..StoreOptions::default()
    };
    let block = StoreOptions {
        after_dead: AfterDead::Block,
        ..skip
    };
    let first = f.migrated(skip).await;
    let second = f.open(skip).await;
    let blocking = f.open(block).await;
    // Key k1: rows 1, 2; key k2: row 3; row 4 is k1 of another tenant.
    let inserted = f
        .insert(&[
            row(None, "k1", 1),
            row(None, "k1", 2),
            row(None, "k2", 3),
            row(Some("acme"), "k1", 4),
        ])
        .await;
    let a = first.claim(10, &[]).await.unwrap();
    let expected = vec![inserted[0], inserted[2], inserted[3]];
    assert_eq!(ids(&a.rows), int_ids(&expected), "one row per key");
    assert!(
        second.claim(10, &[]).await.unwrap().is_empty(),
        "row 2 waits for row 1, held by the first relay's batch"
    );
    a.batch
        .complete(BatchOutcome {
            sent: int_ids(&inserted[2..]),
            failed: vec![failure(inserted[0], "later", Disposition::Retry(HOUR))],
        })
        .await
        .unwrap();
    assert!(
        second.claim(10, &[]).await.unwrap().is_empty(),
        "row 2 waits while row 1 waits for its retry"
    );
    assert!(!second.has_due(&[]).await.unwrap());
    // Row 1's retry falls due (as if the hour had passed) and it fails for good: with
    // AfterDead::Skip row 2 proceeds, with Block it does not.
    f.make_due(inserted[0]).await;
    let again = second.claim(10, &[]).await.unwrap();
    assert_eq!(ids(&again.rows), int_ids(&inserted[..1]));
    again
        .batch
        .complete(BatchOutcome {
            sent: vec![],
            failed: vec![failure(inserted[0], "fatal", Disposition::Dead)],
        })
        .await
        .unwrap();
    let blocked = blocking.claim(10, &[]).await.unwrap();
    assert!(blocked.is_empty(), "Block: row 2 waits");
    blocked.batch.abandon().await.unwrap();
    let proceeds = second.claim(10, &[]).await.unwrap();
    assert_eq!(
        ids(&proceeds.rows),
        int_ids(&inserted[1..2]),
        "Skip: row 2 proceeds"
    );
    proceeds.batch.abandon().await.unwrap();
    f.cleanup().await;
}

pub(super) async fn pruning_deletes_only_sent_rows_past_retention<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(published_at()).await;
    let inserted = f
        .insert(&[
            row(None, "a", 1),
            row(None, "b", 2),
            row(None, "c", 3),
            row(None, "d", 4),
        ])
        .await;
    let claim = store.claim(10, &[]).await.unwrap();
    claim
        .batch
        .complete(BatchOutcome {
            sent: int_ids(&inserted[..2]),
            failed: vec![failure(inserted[2], "fatal", Disposition::Dead)],
        })
        .await
        .unwrap();
    assert_eq!(store.prune_sent(HOUR).await.unwrap(), 0, "not old enough");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.prune_sent(Duration::ZERO).await.unwrap(), 2);
    assert_eq!(f.state(inserted[0]).await, None);
    assert!(
        f.state(inserted[2]).await.unwrap().dead,
        "dead rows are never pruned"
    );
    assert!(
        !f.state(inserted[3]).await.unwrap().published,
        "unsent rows stay"
    );
    f.cleanup().await;
}

pub(super) async fn dead_rows_are_listed_replayed_and_purged<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    let inserted = f
        .insert(&[
            row(Some("acme"), "a", 1),
            row(None, "b", 2),
            row(Some("acme"), "c", 3),
        ])
        .await;
    let claim = store.claim(10, &[]).await.unwrap();
    let dead = inserted
        .iter()
        .map(|&id| failure(id, &format!("fatal {id}"), Disposition::Dead))
        .collect();
    claim
        .batch
        .complete(BatchOutcome {
            sent: vec![],
            failed: dead,
        })
        .await
        .unwrap();
    let all = store.dead_rows(None, 10).await.unwrap();
    let listed: Vec<OutboxId> = all.iter().map(|d| d.id.clone()).collect();
    assert_eq!(listed, int_ids(&inserted));
    assert_eq!(all[0].tenant.as_deref(), Some("acme"));
    assert_eq!(all[1].tenant, None);
    assert_eq!(all[0].aggregate_id, "a");
    assert_eq!(all[0].attempts, 1);
    assert_eq!(
        all[0].last_error.as_deref(),
        Some(format!("fatal {}", inserted[0]).as_str())
    );
    assert!(all[0].dead_at <= chrono::Utc::now());
    assert_eq!(store.dead_rows(Some("acme"), 10).await.unwrap().len(), 2);
    assert_eq!(store.dead_rows(Some("default"), 10).await.unwrap().len(), 1);
    assert_eq!(store.dead_rows(None, 1).await.unwrap().len(), 1);

    let err = store
        .replay_dead(&ReplaySelection::Id("not-a-number".into()))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidId { .. }), "{err}");
    let one = ReplaySelection::Id(inserted[0].to_string());
    assert_eq!(store.replay_dead(&one).await.unwrap(), 1);
    assert_eq!(store.replay_dead(&one).await.unwrap(), 0, "no longer dead");
    let acme = ReplaySelection::Tenant("acme".into());
    assert_eq!(store.replay_dead(&acme).await.unwrap(), 1);
    let replayed = f.state(inserted[2]).await.unwrap();
    assert!(!replayed.dead && !replayed.waiting);
    assert_eq!(replayed.attempts, 0);

    assert_eq!(
        store.purge_dead(HOUR, None).await.unwrap(),
        0,
        "died too recently"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store
            .purge_dead(Duration::ZERO, Some("acme"))
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.purge_dead(Duration::ZERO, None).await.unwrap(), 1);
    assert_eq!(f.state(inserted[1]).await, None);
    let claim = store.claim(10, &[]).await.unwrap();
    assert_eq!(
        ids(&claim.rows),
        vec![OutboxId::Int(inserted[0]), OutboxId::Int(inserted[2])]
    );
    claim.batch.abandon().await.unwrap();
    f.cleanup().await;
}

pub(super) async fn malformed_headers_are_rejected_not_published<F: Fixture>() {
    let f = F::new().await;
    let store = f.migrated(StoreOptions::default()).await;
    let mut bad = row(None, "a", 1);
    bad.headers = r#"{"retries": 5}"#.to_owned();
    let inserted = f.insert(&[bad, row(None, "b", 2)]).await;
    let claim = store.claim(10, &[]).await.unwrap();
    assert_eq!(ids(&claim.rows), int_ids(&inserted[1..]));
    assert_eq!(claim.rejected.len(), 1);
    let rejected = &claim.rejected[0];
    assert_eq!(rejected.id, OutboxId::Int(inserted[0]));
    assert_eq!(rejected.disposition, Disposition::Dead);
    assert!(rejected.error.contains("\"retries\""), "{}", rejected.error);
    let outcome = BatchOutcome {
        sent: ids(&claim.rows),
        failed: claim.rejected.clone(),
    };
    claim.batch.complete(outcome).await.unwrap();
    assert!(f.state(inserted[0]).await.unwrap().dead);
    f.cleanup().await;
}
