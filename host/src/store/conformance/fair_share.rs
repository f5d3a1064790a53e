//! `relay.fair_share`, on every database: a batch first takes the oldest due rows of each
//! tenant with rows waiting, then fills up in claim order; tenants take turns when more wait
//! than a batch holds. The guarantees of the claim stay: disjoint claimers, paused tenants,
//! key order.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;

use super::{DbFixture, ids, row, sent, tenants};
use crate::model::{OutboxId, OutboxRow};
use crate::store::{self, ClaimedBatch, Ordering, OutboxStore, StoreError, StoreOptions};

fn fair(share: usize) -> StoreOptions {
    StoreOptions {
        fair_share: NonZeroUsize::new(share),
        ..StoreOptions::default()
    }
}

/// A tenant name that lives as long as the test (rows take `&'static str`).
fn name(n: usize) -> &'static str {
    Box::leak(format!("t{n:02}").into_boxed_str())
}

/// The claimed rows' ids by tenant, each list in claim order.
fn by_tenant(rows: &[OutboxRow]) -> BTreeMap<String, Vec<i64>> {
    let mut map: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in rows {
        let OutboxId::Int(id) = r.id else {
            panic!("integer ids")
        };
        map.entry(r.tenant.to_string()).or_default().push(id);
    }
    map
}

pub(super) async fn a_small_tenant_is_not_held_back_behind_a_big_tenants_backlog<F: DbFixture>() {
    let f = F::new().await;
    let store = f.migrated(fair(2)).await;
    let big = f
        .insert(
            &(0..50)
                .map(|n| row(Some("big"), "b", n))
                .collect::<Vec<_>>(),
        )
        .await;
    let small = f
        .insert(
            &(0..3)
                .map(|n| row(Some("small"), "s", n))
                .collect::<Vec<_>>(),
        )
        .await;
    let no_tenant = f
        .insert(&(0..3).map(|n| row(None, "n", n)).collect::<Vec<_>>())
        .await;
    let claim = store.claim(12, &[]).await.unwrap();
    let got = by_tenant(&claim.rows);
    // Two heads of each (the rows without a tenant too), then the oldest of the rest: the
    // big tenant's next rows.
    assert_eq!(got["small"], small[..2], "{got:?}");
    assert_eq!(got["(no tenant)"], no_tenant[..2], "{got:?}");
    assert_eq!(got["big"], big[..8], "{got:?}");
    claim.batch.complete(sent(ids(&claim.rows))).await.unwrap();
    // In claim order alone the small tenant's rows would wait behind all 50.
    let fifo = f.open(StoreOptions::default()).await;
    let claim = fifo.claim(10, &[]).await.unwrap();
    assert_eq!(by_tenant(&claim.rows).keys().collect::<Vec<_>>(), ["big"]);
    claim.batch.abandon().await.unwrap();
    f.cleanup().await;
}

/// Right after a bulk load of one tenant (no statistics yet: on PostgreSQL the claim then
/// must not sort the backlog, see `postgres::CLAIM_BEGIN`), the first claim takes the small
/// tenant's rows that came after it, then the backlog's oldest.
pub(super) async fn the_first_claim_after_a_bulk_load_takes_the_small_tenants_rows<F: DbFixture>() {
    let f = F::new().await;
    let store = f.migrated(fair(10)).await;
    f.insert_bulk(20_000, Some("big")).await;
    let small = f
        .insert(&[row(Some("small"), "s", 0), row(Some("small"), "s", 1)])
        .await;
    let claim = store.claim(500, &[]).await.unwrap();
    let got = by_tenant(&claim.rows);
    assert_eq!(got["small"], small, "{got:?}");
    let big = &got["big"];
    assert_eq!(big.len(), 498);
    assert!(
        big.is_sorted() && big.iter().all(|id| *id < small[0]),
        "{big:?}"
    );
    claim.batch.abandon().await.unwrap();
    f.cleanup().await;
}

pub(super) async fn tenants_take_turns_when_more_wait_than_a_batch_holds<F: DbFixture>() {
    let f = F::new().await;
    let store = f.migrated(fair(1)).await;
    // Tenant t00's backlog first (claim order would take only its rows), then 29 tenants
    // with two rows each, and rows without a tenant.
    f.insert(
        &(0..40)
            .map(|n| row(Some(name(0)), "a", n))
            .collect::<Vec<_>>(),
    )
    .await;
    for t in 1..30 {
        f.insert(&[row(Some(name(t)), "a", 0), row(Some(name(t)), "a", 1)])
            .await;
    }
    f.insert(&[row(None, "x", 0)]).await;
    let mut seen = BTreeSet::new();
    let mut turns = Vec::new();
    for _ in 0..3 {
        let claim = store.claim(10, &[]).await.unwrap();
        assert_eq!(claim.rows.len(), 10);
        let got = by_tenant(&claim.rows);
        // One head each: ten tenants a batch, none twice.
        assert!(got.values().all(|ids| ids.len() == 1), "{got:?}");
        turns.push(got.keys().cloned().collect::<Vec<_>>());
        seen.extend(got.into_keys());
        claim.batch.complete(sent(ids(&claim.rows))).await.unwrap();
    }
    assert_eq!(seen.len(), 30, "every tenant had its turn: {turns:?}");
    // The walk after t29 finds no tenant: the row without one, then from the first tenant
    // each one's second row, then the rest in claim order (t00's backlog).
    let claim = store.claim(100, &[]).await.unwrap();
    let got = by_tenant(&claim.rows);
    assert_eq!(got.len(), 31, "{got:?}");
    assert_eq!(got[name(0)].len(), 39);
    assert_eq!(claim.rows.len(), 39 + 29 + 1);
    claim.batch.complete(sent(ids(&claim.rows))).await.unwrap();
    assert_eq!(f.count().await, 0);
    f.cleanup().await;
}

pub(super) async fn concurrent_fair_claims_are_disjoint_and_skip_paused_tenants<F: DbFixture>() {
    let f = F::new().await;
    let one = f.migrated(fair(3)).await;
    let two = f.open(fair(3)).await;
    for t in 0..6 {
        f.insert(
            &(0..10)
                .map(|n| row(Some(name(t)), "k", n))
                .collect::<Vec<_>>(),
        )
        .await;
    }
    let paused = tenants(&["t05"]);
    let a = one.claim(12, &paused).await.unwrap();
    let b = two.claim(12, &paused).await.unwrap();
    let a_ids: BTreeSet<_> = ids(&a.rows).into_iter().collect();
    let b_ids: BTreeSet<_> = ids(&b.rows).into_iter().collect();
    assert_eq!(a_ids.len(), 12);
    assert_eq!(b_ids.len(), 12);
    assert!(a_ids.is_disjoint(&b_ids));
    for claim in [&a, &b] {
        let got = by_tenant(&claim.rows);
        assert!(!got.contains_key("t05"), "a paused tenant's rows: {got:?}");
        // Each tenant's rows in a batch are in claim order.
        assert!(got.values().all(|ids| ids.is_sorted()), "{got:?}");
    }
    a.batch.abandon().await.unwrap();
    b.batch.abandon().await.unwrap();
    f.cleanup().await;
}

pub(super) async fn fair_heads_keep_key_order<F: DbFixture>() {
    let f = F::new().await;
    let options = StoreOptions {
        ordering: Ordering::Key,
        ..fair(5)
    };
    let store = f.migrated(options).await;
    let a = f
        .insert(&[
            row(Some("a"), "k1", 0),
            row(Some("a"), "k1", 1),
            row(Some("a"), "k2", 2),
        ])
        .await;
    let b = f.insert(&[row(Some("b"), "k1", 3)]).await;
    let claim = store.claim(10, &[]).await.unwrap();
    let got = by_tenant(&claim.rows);
    // The second row of a/k1 waits for the first to be sent.
    assert_eq!(got["a"], vec![a[0], a[2]]);
    assert_eq!(got["b"], b);
    claim.batch.complete(sent(ids(&claim.rows))).await.unwrap();
    let claim = store.claim(10, &[]).await.unwrap();
    assert_eq!(ids(&claim.rows), vec![OutboxId::Int(a[1])]);
    claim.batch.abandon().await.unwrap();
    f.cleanup().await;
}

pub(super) async fn a_table_without_the_tenant_index_or_a_tenant_column_is_refused<F: DbFixture>() {
    let f = F::new().await;
    // Without `fair_share`, `sluice migrate` leaves the index out: it costs every insert.
    let _store = f.migrated(StoreOptions::default()).await;
    let index = format!("{}_unsent_tenant_idx", f.table());
    let refused = store::open(&f.url(), &f.spec(), fair(10), 1).await;
    let Err(err @ StoreError::FairShare { .. }) = refused else {
        panic!("opened without the index: {:?}", refused.err())
    };
    let message = err.to_string();
    assert!(
        message.starts_with("relay.fair_share: outbox table")
            && message.contains("no index led by its tenant column")
            && message.contains("CREATE INDEX")
            && message.contains(&index),
        "{message}"
    );
    // `sluice migrate` with fair_share creates it, and the store opens.
    let _fair = f.migrated(fair(10)).await;
    f.cleanup().await;

    let f = F::new().await;
    f.create_debezium_table().await;
    let spec = f.debezium_spec();
    store::migrate(&f.url(), &spec, &fair(10), None)
        .await
        .unwrap();
    let refused = store::open(&f.url(), &spec, fair(10), 1).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("has no tenant column"), "{message}");
    f.cleanup().await;
}

pub(super) async fn the_tenant_the_fill_serves_is_passed_over_once_and_never_left_out_for_good<
    F: DbFixture,
>() {
    let f = F::new().await;
    let store = f.migrated(fair(2)).await;
    f.insert(
        &(0..50)
            .map(|n| row(Some("big"), "b", n))
            .collect::<Vec<_>>(),
    )
    .await;
    f.insert(
        &(0..3)
            .map(|n| row(Some("small"), "s", n))
            .collect::<Vec<_>>(),
    )
    .await;
    let mut claims = Vec::new();
    for round in 0..3 {
        if round == 1 {
            // Enough other tenants waiting that heads alone fill the next batch.
            for t in 0..12 {
                f.insert(&[row(Some(name(t)), "u", 0)]).await;
            }
        }
        let claim = store.claim(10, &[]).await.unwrap();
        claims.push(by_tenant(&claim.rows));
        claim.batch.complete(sent(ids(&claim.rows))).await.unwrap();
    }
    // The first fill took eight of big's rows: the next walk passes big over (the fill would
    // serve it), and as that batch is all heads and has no fill, big's turn comes back.
    assert_eq!(claims[0]["big"].len(), 8, "{claims:?}");
    assert!(!claims[1].contains_key("big"), "{claims:?}");
    assert_eq!(claims[1].len(), 10, "{claims:?}");
    assert!(claims[2].contains_key("big"), "{claims:?}");
    f.cleanup().await;
}
