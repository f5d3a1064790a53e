//! `sluice replay` on the databases (see the suite's opening comment): which sent rows a
//! replay makes due again, its staggered due times, the marker the relay reads and clears,
//! and a table without the marker.

use std::num::NonZeroU32;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{DbFixture, NewRow, failure, ids, int_ids, published_at, row, sent};
use crate::model::OutboxId;
use crate::store::{
    self, BatchOutcome, ClaimedBatch, Disposition, OutboxStore, ReplayFilter, ReplayPace, Store,
    StoreOptions,
};

fn pace(store_now: DateTime<Utc>, rate: u32) -> ReplayPace {
    ReplayPace {
        id: store_now.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        start: store_now,
        rate: NonZeroU32::new(rate).unwrap(),
    }
}

fn typed(tenant: Option<&'static str>, id: &str, event_type: &'static str) -> NewRow {
    NewRow {
        event_type,
        ..row(tenant, id, 0)
    }
}

/// Claims everything due and marks it sent; returns the claimed rows' ids and markers.
async fn send_all(store: &Store) -> Vec<(OutboxId, Option<String>)> {
    let claim = store.claim(100, &[]).await.unwrap();
    let got = claim
        .rows
        .iter()
        .map(|r| (r.id.clone(), r.replay.as_deref().map(str::to_owned)))
        .collect();
    let claimed = ids(&claim.rows);
    claim.batch.complete(sent(claimed)).await.unwrap();
    got
}

pub(super) async fn only_sent_rows_of_the_window_and_filters_become_due_again<F: DbFixture>() {
    let f = F::new().await;
    let store = f.migrated(published_at()).await;
    // Sent before the window.
    let early = f.insert(&[typed(Some("acme"), "e", "OrderCreated")]).await;
    send_all(&store).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let since = store.database_now().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Sent in the window: two of acme (one OrderPaid), one without a tenant.
    let window = f
        .insert(&[
            typed(Some("acme"), "a", "OrderCreated"),
            typed(Some("acme"), "b", "OrderPaid"),
            typed(None, "c", "OrderCreated"),
        ])
        .await;
    send_all(&store).await;
    // Dead, and unsent: never replayed.
    let dead = f.insert(&[row(Some("acme"), "d", 9)]).await;
    let claim = store.claim(10, &[]).await.unwrap();
    let failed = vec![failure(dead[0], "fatal", Disposition::Dead)];
    claim
        .batch
        .complete(BatchOutcome {
            sent: vec![],
            failed,
        })
        .await
        .unwrap();
    let unsent = f.insert(&[row(Some("acme"), "u", 10)]).await;

    let in_window = ReplayFilter {
        since: Some(since),
        ..ReplayFilter::default()
    };
    let count = |filter: ReplayFilter| {
        let store = &store;
        async move { store.count_replayable(&filter).await.unwrap() }
    };
    assert_eq!(count(in_window.clone()).await, 3);
    assert_eq!(count(ReplayFilter::default()).await, 4, "every sent row");
    let until_since = ReplayFilter {
        until: Some(since),
        ..ReplayFilter::default()
    };
    assert_eq!(count(until_since).await, 1, "only the early row");
    let acme = ReplayFilter {
        tenant: Some("acme".into()),
        ..in_window.clone()
    };
    assert_eq!(count(acme.clone()).await, 2);
    let default = ReplayFilter {
        tenant: Some("default".into()),
        ..in_window.clone()
    };
    assert_eq!(count(default).await, 1, "rows without a tenant");
    let paid = ReplayFilter {
        event_type: Some("OrderPaid".into()),
        aggregate_type: Some("order".into()),
        ..in_window.clone()
    };
    assert_eq!(count(paid).await, 1);
    let listed = ReplayFilter {
        ids: Some(
            [early[0], window[0], dead[0], unsent[0]]
                .iter()
                .map(ToString::to_string)
                .collect(),
        ),
        ..ReplayFilter::default()
    };
    assert_eq!(count(listed.clone()).await, 2, "the listed sent rows only");
    // Counting (`--dry-run`) changed nothing.
    for &id in window.iter().chain(&early) {
        assert!(f.state(id).await.unwrap().published, "row {id}");
    }

    // Replay acme's rows of the window, all due at once.
    let now = store.database_now().await.unwrap();
    let run = pace(now, 1_000_000);
    let replayed = store.replay_sent(&acme, &run, &mut |_| {}).await.unwrap();
    assert_eq!(replayed, 2);
    for &id in &window[..2] {
        let state = f.state(id).await.unwrap();
        assert!(
            !state.published && !state.dead && !state.waiting,
            "row {id}: {state:?}"
        );
        assert_eq!(state.attempts, 0);
    }
    assert!(f.state(window[2]).await.unwrap().published, "not acme's");
    assert!(
        f.state(early[0]).await.unwrap().published,
        "before the window"
    );
    assert!(f.state(dead[0]).await.unwrap().dead, "dead rows stay dead");
    let progress = store.replay_progress().await.unwrap();
    assert_eq!(progress.len(), 1, "{progress:?}");
    assert_eq!(
        (progress[0].id.as_str(), progress[0].left),
        (run.id.as_str(), 2)
    );
    // The relay claims them with the marker (and the live row without), in claim order.
    let claimed = send_all(&store).await;
    let marker = Some(run.id.clone());
    assert_eq!(
        claimed,
        vec![
            (OutboxId::Int(window[0]), marker.clone()),
            (OutboxId::Int(window[1]), marker.clone()),
            (OutboxId::Int(unsent[0]), None),
        ]
    );
    // Sent again: the marker is cleared, nothing is left to replay.
    assert!(store.replay_progress().await.unwrap().is_empty());
    assert!(f.state(window[0]).await.unwrap().published);
    // The ids list: the sent rows among them only (the live row was sent meanwhile).
    let replayed = store.replay_sent(&listed, &run, &mut |_| {}).await.unwrap();
    assert_eq!(replayed, 3);
    let claimed = send_all(&store).await;
    assert_eq!(
        claimed,
        vec![
            (OutboxId::Int(early[0]), marker.clone()),
            (OutboxId::Int(window[0]), marker.clone()),
            (OutboxId::Int(unsent[0]), marker),
        ]
    );
    assert!(f.state(dead[0]).await.unwrap().dead);
    f.cleanup().await;
}

pub(super) async fn a_replay_is_spread_over_time_at_its_rate_in_chunks<F: DbFixture>() {
    let f = F::new().await;
    let store = f.migrated(published_at()).await;
    let n = 12_000;
    f.insert_bulk(n, Some("acme")).await;
    while store.has_due(&[]).await.unwrap() {
        let claim = store.claim(5_000, &[]).await.unwrap();
        let claimed = ids(&claim.rows);
        claim.batch.complete(sent(claimed)).await.unwrap();
    }
    let now = store.database_now().await.unwrap();
    // 4,000 rows/s: 400 rows every 100 ms, the last due after 2.9 s; chunks of half a
    // second's rows, each marked half a second before its first rows are due.
    let run = pace(now, 4_000);
    let mut steps = Vec::new();
    let filter = ReplayFilter::default();
    let started = std::time::Instant::now();
    let replayed = store
        .replay_sent(&filter, &run, &mut |done| steps.push(done))
        .await
        .unwrap();
    assert_eq!(replayed, n as u64);
    assert_eq!(steps, [2_000, 4_000, 6_000, 8_000, 10_000, 12_000]);
    assert!(
        started.elapsed() >= Duration::from_millis(1_900),
        "the last chunk (due at 2.5 s) is marked 0.5 s ahead, not sooner: {:?}",
        started.elapsed()
    );
    let progress = &store.replay_progress().await.unwrap()[0];
    assert_eq!(progress.left, n);
    assert!(
        (400..n).contains(&progress.due),
        "the first ticks' rows are due, not all: {progress:?}"
    );
    // Due times are kept to the millisecond.
    let last = (progress.last_due_at.unwrap() - now).num_milliseconds();
    assert!((2_899..=2_900).contains(&last), "{last} ms: {progress:?}");
    // A claim takes only the rows whose time has come: a tick's worth per 100 ms since the
    // start (the claim of up to all of them notwithstanding).
    let claim = store.claim(n as usize, &[]).await.unwrap();
    let elapsed = (store.database_now().await.unwrap() - now).num_milliseconds();
    let claimed = claim.rows.len() as i64;
    assert!(
        claimed >= 400 && claimed <= (elapsed / 100 + 1) * 400 && claimed < n,
        "{claimed} rows claimed {elapsed} ms after the start"
    );
    assert!(
        claim
            .rows
            .iter()
            .all(|r| r.replay.as_deref() == Some(run.id.as_str()))
    );
    claim.batch.abandon().await.unwrap();
    f.cleanup().await;
}

pub(super) async fn a_table_without_the_marker_relays_and_refuses_to_replay<F: DbFixture>() {
    let f = F::new().await;
    drop(f.migrated(published_at()).await);
    if f.url().starts_with("sqlite") {
        // SQLite drops no column an index names.
        f.execute(&format!("DROP INDEX \"{}_replay_idx\"", f.table()))
            .await;
    }
    f.execute("ALTER TABLE {t} DROP COLUMN replay_id").await;
    let store = f.open(published_at()).await;
    assert!(!store.can_replay());
    let inserted = f.insert(&[row(None, "a", 1)]).await;
    assert_eq!(
        send_all(&store).await,
        vec![(OutboxId::Int(inserted[0]), None)]
    );
    assert!(f.state(inserted[0]).await.unwrap().published);
    assert!(store.replay_progress().await.unwrap().is_empty());
    let run = pace(Utc::now(), 10);
    let err = store
        .replay_sent(&ReplayFilter::default(), &run, &mut |_| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("run `sluice migrate`"), "{err}");
    // `sluice migrate` adds it, and running it again changes nothing.
    for _ in 0..2 {
        store::migrate(&f.url(), &f.spec(), &StoreOptions::default(), None)
            .await
            .unwrap();
    }
    let store = f.open(published_at()).await;
    assert!(store.can_replay());
    let now = store.database_now().await.unwrap();
    let all = ReplayFilter::default();
    assert_eq!(
        store
            .replay_sent(&all, &pace(now, 10), &mut |_| {})
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        int_ids(&inserted),
        vec![send_all(&store).await[0].0.clone()]
    );
    f.cleanup().await;
}

/// `--since 100y` or an RFC 3339 time before 1970 means "from the first row": it bounds
/// nothing, rather than failing the statement (PostgreSQL: out of range) or matching no row
/// (MySQL/MariaDB: `FROM_UNIXTIME` of a negative number is NULL).
pub(super) async fn a_since_before_1970_takes_every_sent_row<F: DbFixture>() {
    let f = F::new().await;
    let store = f.migrated(published_at()).await;
    f.insert(&[row(None, "a", 1), row(None, "b", 2)]).await;
    send_all(&store).await;
    // `until` a clock tick after the rows were sent.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for since in [
        DateTime::parse_from_rfc3339("1960-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc),
        DateTime::<Utc>::MIN_UTC,
    ] {
        let filter = ReplayFilter {
            since: Some(since),
            until: Some(store.database_now().await.unwrap()),
            ..ReplayFilter::default()
        };
        assert_eq!(
            store.count_replayable(&filter).await.unwrap(),
            2,
            "since {since}"
        );
    }
    f.cleanup().await;
}

/// An ids file as people write them: an id twice (also as `07` for `7`), ids of no row, more
/// ids than one statement binds. Each row is counted and replayed once.
pub(super) async fn listed_ids_are_counted_and_replayed_once_however_often_listed<F: DbFixture>() {
    let f = F::new().await;
    let store = f.migrated(published_at()).await;
    let inserted = f
        .insert(&[row(None, "a", 1), row(None, "b", 2), row(None, "c", 3)])
        .await;
    send_all(&store).await;
    let mut listed: Vec<String> = inserted.iter().map(ToString::to_string).collect();
    // Ids of no row, past the first statement's share, then the first ids again.
    listed.extend((0..1_500).map(|k| (10_000_000 + k).to_string()));
    listed.extend(inserted.iter().map(|id| format!("0{id}")));
    listed.push(inserted[0].to_string());
    let filter = ReplayFilter {
        ids: Some(listed),
        ..ReplayFilter::default()
    };
    assert_eq!(store.count_replayable(&filter).await.unwrap(), 3);
    let now = store.database_now().await.unwrap();
    let replayed = store
        .replay_sent(&filter, &pace(now, 1_000_000), &mut |_| {})
        .await
        .unwrap();
    assert_eq!(replayed, 3);
    let claimed: Vec<OutboxId> = send_all(&store)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(claimed, int_ids(&inserted));
    f.cleanup().await;
}
