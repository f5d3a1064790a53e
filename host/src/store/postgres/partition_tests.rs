//! Partitioned outbox tables on a real PostgreSQL: tables an application (or pg_partman)
//! declares `PARTITION BY RANGE (created_at)` with `PRIMARY KEY (id, created_at)`, created
//! here with plain SQL; `sluice migrate --partitioned`; and `relay.retention_mode =
//! "drop-partitions"`, which must never drop a partition holding a row that is unsent, dead,
//! waiting or sent within the retention.

use std::time::Duration;

use sluice_testkit::{Database, DbTable};
use sqlx::{Connection, Executor};

use crate::model::OutboxId;
use crate::store::{
    self, BatchOutcome, ClaimedBatch, ColumnMap, ColumnName, Disposition, MarkMode, Ordering,
    OutboxStore, PartitionInterval, RowFailure, Store, StoreOptions, TableName, TableSpec,
};

/// The start of today, UTC (the partitions' bounds), whatever the session's time zone.
const TODAY: &str = "(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')";
const DAY: Duration = Duration::from_secs(24 * 3600);

fn spec(t: &DbTable) -> TableSpec {
    TableSpec::new(TableName::parse(&t.name).expect("table name"))
}

fn published_at() -> StoreOptions {
    StoreOptions {
        mark: MarkMode::PublishedAt,
        ..StoreOptions::default()
    }
}

/// An application's partitioned table with Sluice's column names (`id_type`: the id's
/// declaration), one partition per day from 40 days ago to 2 days ahead, and a DEFAULT one;
/// then `sluice migrate` adds what Sluice needs.
async fn app_table(stem: &str, id_type: &str) -> DbTable {
    let t = DbTable::fresh(Database::Postgres, stem).await;
    t.execute(&format!(
        "CREATE TABLE {{t}} (id {id_type}, tenant text, aggregate_type text NOT NULL,
                             aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb,
                             headers jsonb NOT NULL DEFAULT '{{}}',
                             created_at timestamptz NOT NULL DEFAULT now(),
                             PRIMARY KEY (id, created_at))
           PARTITION BY RANGE (created_at)"
    ))
    .await;
    daily_partitions(&t, -40, 2).await;
    t.execute(&format!(
        "CREATE TABLE \"{}_default\" PARTITION OF {{t}} DEFAULT",
        t.name
    ))
    .await;
    store::migrate(&t.url, &spec(&t), &published_at(), None)
        .await
        .expect("migrate");
    t
}

/// Partitions `{t}_d<k>` for the UTC days `from..=to` relative to today.
async fn daily_partitions(t: &DbTable, from: i32, to: i32) {
    for k in from..=to {
        t.execute(&format!(
            "CREATE TABLE \"{name}_d{n}\" PARTITION OF {{t}}
                FOR VALUES FROM ({TODAY} + {k} * interval '1 day')
                            TO ({TODAY} + {k1} * interval '1 day')",
            name = t.name,
            n = k + 100,
            k1 = k + 1,
        ))
        .await;
    }
}

/// Inserts one row created `days_ago` days ago (noon UTC) with `id` if given; returns the id.
async fn insert_at(t: &DbTable, id: Option<i64>, days_ago: i32, aggregate: &str) -> i64 {
    let (columns, value) = match id {
        Some(id) => ("id, ", format!("{id}, ")),
        None => ("", String::new()),
    };
    t.scalar_i64(&format!(
        "INSERT INTO {{t}} ({columns}aggregate_type, aggregate_id, event_type, payload, created_at)
         VALUES ({value}'order', '{aggregate}', 'OrderCreated', '{{}}',
                 {TODAY} + interval '12 hours' - {days_ago} * interval '1 day')
         RETURNING id"
    ))
    .await
}

async fn open(t: &DbTable, options: StoreOptions) -> Store {
    store::open(&t.url, &spec(t), options, 2)
        .await
        .expect("open")
}

fn layout(store: &Store) -> &crate::store::schema::Layout {
    match store {
        Store::Postgres(pg) => pg.layout(),
        _ => panic!("a PostgreSQL store"),
    }
}

fn sent(rows: &[crate::model::OutboxRow]) -> BatchOutcome {
    BatchOutcome {
        sent: rows.iter().map(|r| r.id.clone()).collect(),
        failed: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_is_claimed_and_marked_across_its_partitions() {
    let t = app_table("part_plain", "bigserial").await;
    let store = open(&t, published_at()).await;
    assert!(layout(&store).keyed_with_created_at);
    let old = insert_at(&t, None, 3, "a").await;
    let today = insert_at(&t, None, 0, "b").await;
    let claim = store.claim(10, &[]).await.expect("claim");
    let ids: Vec<OutboxId> = claim.rows.iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids, vec![OutboxId::Int(old), OutboxId::Int(today)]);
    let outcome = sent(&claim.rows);
    claim.batch.complete(outcome).await.expect("complete");
    assert_eq!(t.unsent().await, 0);
    assert_eq!(t.count().await, 2, "published_at mode keeps the rows");
    t.drop_table().await;
}

/// Nothing in a partitioned table keeps two partitions from holding the same id (an
/// application inserting its own ids, a restored partition): each row is marked by its id and
/// its `created_at`, and a batch never holds two rows of one id — marking by id alone would
/// change both, fail the row count and roll the batch back for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_in_two_partitions_is_marked_one_row_at_a_time() {
    let t = app_table("part_dupe", "bigint").await;
    insert_at(&t, Some(7), 5, "a").await;
    insert_at(&t, Some(7), 1, "b").await;
    insert_at(&t, Some(8), 1, "c").await;
    let store = open(&t, published_at()).await;

    // Both rows of id 7 come first in claim order (which one first is not set); one waits.
    let first = store.claim(10, &[]).await.expect("claim");
    let aggregates: Vec<&str> = first.rows.iter().map(|r| r.aggregate_id.as_str()).collect();
    assert_eq!(
        aggregates.len(),
        2,
        "the second id 7 waits for a later batch"
    );
    assert_eq!(aggregates[1], "c");
    let (taken, waiting) = match aggregates[0] {
        "a" => ("a", "b"),
        _ => ("b", "a"),
    };
    let outcome = BatchOutcome {
        sent: vec![OutboxId::Int(8)],
        failed: vec![RowFailure {
            id: OutboxId::Int(7),
            error: "later".into(),
            disposition: Disposition::Retry(Duration::from_secs(3600)),
        }],
    };
    first.batch.complete(outcome).await.expect("complete");
    let state = |a: &str| {
        format!(
            "SELECT attempts::text || ' ' || (published_at IS NOT NULL)::text FROM {{t}}
              WHERE aggregate_id = '{a}'"
        )
    };
    let row_state = |rows: Vec<Vec<Option<String>>>| rows[0][0].clone().unwrap_or_default();
    assert_eq!(row_state(t.text_rows(&state(taken)).await), "1 false");
    assert_eq!(row_state(t.text_rows(&state(waiting)).await), "0 false");
    assert_eq!(row_state(t.text_rows(&state("c")).await), "0 true");

    let second = store.claim(10, &[]).await.expect("claim");
    let aggregates: Vec<&str> = second
        .rows
        .iter()
        .map(|r| r.aggregate_id.as_str())
        .collect();
    assert_eq!(aggregates, [waiting]);
    let outcome = sent(&second.rows);
    second.batch.complete(outcome).await.expect("complete");
    assert_eq!(row_state(t.text_rows(&state(waiting)).await), "0 true");
    assert_eq!(row_state(t.text_rows(&state(taken)).await), "1 false");
    t.drop_table().await;
}

/// `sluice replay` on a partitioned table: of two sent rows that share an id, only the one the
/// window selects is replayed, and marking it sent again (by id and time) clears its marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_takes_only_the_selected_row_of_an_id_and_the_keyed_mark_clears_its_marker() {
    let t = app_table("part_replay", "bigint").await;
    insert_at(&t, Some(7), 5, "old").await;
    insert_at(&t, Some(7), 1, "recent").await;
    // Sent: the old row two days ago, the recent one a minute ago.
    t.execute(
        "UPDATE {t} SET published_at = CASE aggregate_id
                         WHEN 'old' THEN now() - interval '2 days'
                         ELSE now() - interval '1 minute' END",
    )
    .await;
    let store = open(&t, published_at()).await;
    assert!(store.can_replay());
    let now = store.database_now().await.expect("now");
    let filter = store::ReplayFilter {
        since: Some(now - chrono::TimeDelta::hours(1)),
        until: Some(now),
        ids: Some(vec!["7".into()]),
        ..store::ReplayFilter::default()
    };
    assert_eq!(store.count_replayable(&filter).await.expect("count"), 1);
    let pace = store::ReplayPace {
        id: "r-1".into(),
        start: now,
        rate: std::num::NonZeroU32::new(1_000_000).expect("rate"),
    };
    let replayed = store
        .replay_sent(&filter, &pace, &mut |_| {})
        .await
        .expect("replay");
    assert_eq!(replayed, 1, "only the row of the window");
    let state = "SELECT aggregate_id || ' ' || (published_at IS NOT NULL)::text || ' ' ||
                        coalesce(replay_id, '-')
                   FROM {t} ORDER BY aggregate_id";
    let rows = |rows: Vec<Vec<Option<String>>>| -> Vec<String> {
        rows.into_iter()
            .map(|r| r[0].clone().unwrap_or_default())
            .collect()
    };
    assert_eq!(
        rows(t.text_rows(state).await),
        ["old true -", "recent false r-1"]
    );

    let claim = store.claim(10, &[]).await.expect("claim");
    assert_eq!(claim.rows.len(), 1);
    assert_eq!(claim.rows[0].aggregate_id, "recent");
    assert_eq!(claim.rows[0].replay.as_deref(), Some("r-1"));
    let outcome = sent(&claim.rows);
    claim.batch.complete(outcome).await.expect("complete");
    assert_eq!(
        rows(t.text_rows(state).await),
        ["old true -", "recent true -"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_order_holds_across_partitions() {
    let t = app_table("part_order", "bigint GENERATED ALWAYS AS IDENTITY").await;
    insert_at(&t, None, 2, "k").await;
    insert_at(&t, None, 0, "k").await;
    insert_at(&t, None, 0, "other").await;
    let options = StoreOptions {
        ordering: Ordering::Key,
        ..published_at()
    };
    let store = open(&t, options).await;
    let claim = store.claim(10, &[]).await.expect("claim");
    let aggregates: Vec<&str> = claim.rows.iter().map(|r| r.aggregate_id.as_str()).collect();
    assert_eq!(aggregates, ["k", "other"], "the later row of k waits");
    claim.batch.abandon().await.expect("abandon");
    t.drop_table().await;
}

/// A uuid id: `sluice migrate` adds the order column (a `bigserial`, as PostgreSQL before 17
/// cannot add an identity column to a partitioned table) and rows are marked by id and time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uuid_keyed_partitioned_table_gets_its_order_column_from_migrate() {
    let t = app_table("part_uuid", "uuid DEFAULT gen_random_uuid()").await;
    insert_at_uuid(&t, 2).await;
    insert_at_uuid(&t, 0).await;
    let store = open(&t, StoreOptions::default()).await;
    assert_eq!(layout(&store).order.as_str(), "sluice_seq");
    let claim = store.claim(10, &[]).await.expect("claim");
    assert_eq!(claim.rows.len(), 2);
    let outcome = sent(&claim.rows);
    claim.batch.complete(outcome).await.expect("complete");
    assert_eq!(t.count().await, 0, "delete mode removes them");
    t.drop_table().await;
}

async fn insert_at_uuid(t: &DbTable, days_ago: i32) {
    t.execute(&format!(
        "INSERT INTO {{t}} (aggregate_type, aggregate_id, event_type, payload, created_at)
         VALUES ('order', 'u', 'OrderCreated', '{{}}', now() - {days_ago} * interval '1 day')"
    ))
    .await;
}

/// The application's own names (`[database.columns]`), partitioned by its time column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_columns_key_the_rows_by_the_mapped_id_and_time() {
    let t = DbTable::fresh(Database::Postgres, "part_mapped").await;
    t.execute(
        "CREATE TABLE {t} (event_id bigserial, aggregatetype text NOT NULL,
                           aggregateid text NOT NULL, type text NOT NULL, payload jsonb,
                           occurred_at timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),
                           PRIMARY KEY (event_id, occurred_at))
           PARTITION BY RANGE (occurred_at)",
    )
    .await;
    t.execute(&format!(
        "CREATE TABLE \"{}_all\" PARTITION OF {{t}} DEFAULT",
        t.name
    ))
    .await;
    let col = |n: &str| ColumnName::parse(n).expect("column");
    let spec = TableSpec {
        name: TableName::parse(&t.name).expect("table"),
        columns: ColumnMap {
            id: col("event_id"),
            aggregate_type: col("aggregatetype"),
            aggregate_id: col("aggregateid"),
            event_type: col("type"),
            created_at: col("occurred_at"),
            ..ColumnMap::default()
        },
    };
    store::migrate(&t.url, &spec, &published_at(), None)
        .await
        .expect("migrate");
    t.execute(
        "INSERT INTO {t} (aggregatetype, aggregateid, type, payload) VALUES ('o', 'x', 'E', '{}')",
    )
    .await;
    let store = store::open(&t.url, &spec, published_at(), 2)
        .await
        .expect("open");
    assert!(layout(&store).keyed_with_created_at);
    let claim = store.claim(10, &[]).await.expect("claim");
    assert_eq!(claim.rows.len(), 1);
    let outcome = sent(&claim.rows);
    claim.batch.complete(outcome).await.expect("complete");
    assert_eq!(t.unsent().await, 0);
    t.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notify_trigger_fires_for_inserts_through_the_partitioned_table() {
    let t = app_table("part_notify", "bigserial").await;
    let store = open(&t, published_at()).await;
    let channel = format!("{}_new", t.name);
    store
        .install_notify_trigger(&channel)
        .await
        .expect("trigger");
    let mut listener = sqlx::postgres::PgListener::connect(&t.url)
        .await
        .expect("listen");
    listener.listen(&channel).await.expect("listen");
    insert_at(&t, None, 0, "n").await;
    let note = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification within 10 s")
        .expect("notification");
    assert_eq!(note.channel(), channel);
    t.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_partitioned_creates_the_table_its_default_and_the_partitions_ahead() {
    let t = DbTable::fresh(Database::Postgres, "part_migr").await;
    let interval = Some(PartitionInterval::Daily);
    store::migrate(&t.url, &spec(&t), &published_at(), interval)
        .await
        .expect("migrate --partitioned");
    // Idempotent, as every migrate.
    store::migrate(&t.url, &spec(&t), &published_at(), interval)
        .await
        .expect("again");
    let partitions = t
        .scalar_i64(&format!(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = '{}'::regclass",
            t.name
        ))
        .await;
    assert_eq!(partitions, 1 + 1 + 7, "DEFAULT, today, 7 ahead");
    let store = open(&t, published_at()).await;
    let partitioning = store
        .partitioning()
        .await
        .expect("read")
        .expect("partitioned");
    assert!(partitioning.by_created_at);
    assert_eq!(partitioning.interval, interval);
    let round = store.maintain_partitions(None).await.expect("round");
    assert!(round.created.is_empty(), "{round:?}");
    // Rows land in today's partition, not in the DEFAULT one.
    t.insert_rows(3, None).await;
    let in_default = t
        .scalar_i64(&format!("SELECT count(*) FROM \"{}_default\"", t.name))
        .await;
    assert_eq!(in_default, 0);
    // A plain table is not turned into a partitioned one.
    let plain = DbTable::create(Database::Postgres, "part_migr_plain").await;
    let err = store::migrate(&plain.url, &spec(&plain), &published_at(), interval)
        .await
        .expect_err("refused")
        .to_string();
    assert!(err.contains("not partitioned"), "{err}");
    plain.drop_table().await;
    // Another interval on the table would cut hourly partitions inside the daily ones.
    let err = store::migrate(
        &t.url,
        &spec(&t),
        &published_at(),
        Some(PartitionInterval::Hourly),
    )
    .await
    .expect_err("refused")
    .to_string();
    assert!(err.contains("was set up --partitioned daily"), "{err}");
    t.drop_table().await;
}

/// `--partitioned` on a table whose partitions pg_partman (or a script) makes, named its own
/// way (`outbox_p2026_12_06`): Sluice's partitions (`outbox_p20261206`) would overlap theirs
/// — its own made ahead failing each round with a warning, and pg_partman's maintenance
/// failing once Sluice made a day first. Refused; the table is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_partitioned_refuses_a_table_whose_partitions_something_else_makes() {
    let t = app_table("part_partman", "bigserial").await;
    let before = t
        .scalar_i64("SELECT count(*) FROM pg_inherits WHERE inhparent = '{t}'::regclass")
        .await;
    let err = store::migrate(
        &t.url,
        &spec(&t),
        &published_at(),
        Some(PartitionInterval::Daily),
    )
    .await
    .expect_err("refused")
    .to_string();
    assert!(
        err.contains("partitions are made by something else")
            && err.contains("without --partitioned"),
        "{err}"
    );
    let after = t
        .scalar_i64("SELECT count(*) FROM pg_inherits WHERE inhparent = '{t}'::regclass")
        .await;
    assert_eq!(after, before, "no partition made");
    let store = open(&t, published_at()).await;
    let partitioning = store
        .partitioning()
        .await
        .expect("read")
        .expect("partitioned");
    assert_eq!(partitioning.interval, None, "no comment written");
    t.drop_table().await;
}

/// Old partitions: one wholly sent long ago (dropped), and one each holding an unsent row, a
/// dead row, a row waiting for its retry, a row sent within the retention (each kept); a
/// partition whose range is not wholly older than the retention, and the DEFAULT partition,
/// are kept whatever they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_partitions_drops_only_old_partitions_whose_rows_were_all_sent_long_ago() {
    let t = app_table("part_drop", "bigserial").await;
    let name = |days_ago: i32| format!("{}_d{}", t.name, 100 - days_ago);
    // Rows of the day `days_ago` days ago that `only` selects get `set`.
    let fill = |days_ago: i32, set: &str, only: &str| {
        format!(
            "UPDATE {{t}} SET {set}
              WHERE {only} AND created_at >= {TODAY} - {days_ago} * interval '1 day'
                AND created_at < {TODAY} - {} * interval '1 day'",
            days_ago - 1
        )
    };
    let sent_long_ago = "published_at = now() - interval '20 days', attempts = 1";
    for days_ago in [30, 29, 28, 27, 26, 6] {
        insert_at(&t, None, days_ago, "sent").await;
        t.execute(&fill(days_ago, sent_long_ago, "true")).await;
    }
    // Day 29: one unsent row beside the sent one; 28: a dead row; 27: a row waiting for its
    // retry; 26: a row sent yesterday.
    let unsent = "published_at IS NULL";
    insert_at(&t, None, 29, "unsent").await;
    insert_at(&t, None, 28, "dead").await;
    let dead = "dead_at = now() - interval '20 days', attempts = 5";
    t.execute(&fill(28, dead, unsent)).await;
    insert_at(&t, None, 27, "waiting").await;
    let waiting = "next_attempt_at = now() + interval '1 hour', attempts = 1";
    t.execute(&fill(27, waiting, unsent)).await;
    insert_at(&t, None, 26, "recent").await;
    let recent = "published_at = now() - interval '1 day'";
    t.execute(&fill(26, recent, unsent)).await;
    // Sent long ago, but in the DEFAULT partition.
    t.execute(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, created_at, published_at)
         VALUES ('order', 'default', 'E', now() - interval '300 days', now() - interval '200 days')",
    )
    .await;

    let store = open(&t, published_at()).await;
    store
        .check_drop_partitions()
        .await
        .expect("partitioned by created_at");
    let round = store
        .maintain_partitions(Some(7 * DAY))
        .await
        .expect("round");
    // Partitions end up to 40 days ago; those ending 8 days ago or earlier lie wholly before
    // the retention: 33, of which the four below hold rows that must stay.
    let dropped: Vec<String> = round.dropped.iter().map(|n| n.replace('"', "")).collect();
    assert!(dropped.contains(&name(30)), "{round:?}");
    assert_eq!(dropped.len(), 33 - 4, "{round:?}");
    let mut kept: Vec<String> = round.kept.iter().map(|n| n.replace('"', "")).collect();
    kept.sort();
    assert_eq!(kept, [name(29), name(28), name(27), name(26)], "{round:?}");
    // Day 6 is within the retention: not even a candidate.
    assert!(!kept.contains(&name(6)), "{round:?}");
    let left = t
        .text_rows("SELECT aggregate_id FROM {t} ORDER BY created_at, id")
        .await;
    let left: Vec<&str> = left.iter().filter_map(|r| r[0].as_deref()).collect();
    assert_eq!(
        left,
        [
            "default", "sent", "unsent", "sent", "dead", "sent", "waiting", "sent", "recent",
            "sent"
        ]
    );
    // The next round finds nothing more to drop.
    let again = store
        .maintain_partitions(Some(7 * DAY))
        .await
        .expect("round");
    assert!(again.dropped.is_empty(), "{again:?}");
    t.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_partitions_is_refused_on_a_table_that_is_not_partitioned() {
    let t = DbTable::create(Database::Postgres, "part_refused").await;
    let store = open(&t, published_at()).await;
    let err = store
        .check_drop_partitions()
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("retention_mode") && err.contains("partitioned by RANGE"),
        "{err}"
    );
    t.drop_table().await;
}

/// `relay.fair_share` on a partitioned table: the walk over the tenants takes each tenant's
/// oldest rows across the partitions, and they are marked by id and time like the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_shares_take_each_tenants_oldest_rows_across_partitions() {
    let t = app_table("part_fair", "bigserial").await;
    let options = StoreOptions {
        fair_share: std::num::NonZeroUsize::new(1),
        ..published_at()
    };
    // The tenant index the walk needs.
    store::migrate(&t.url, &spec(&t), &options, None)
        .await
        .expect("migrate");
    for (tenant, days_ago) in [("big", 3), ("big", 2), ("big", 1), ("small", 0)] {
        t.execute(&format!(
            "INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, created_at)
             VALUES ('{tenant}', 'order', 'x', 'E', now() - {days_ago} * interval '1 day')"
        ))
        .await;
    }
    let store = open(&t, options).await;
    let claim = store.claim(2, &[]).await.expect("claim");
    let mut tenants: Vec<&str> = claim.rows.iter().map(|r| r.tenant.as_str()).collect();
    tenants.sort();
    assert_eq!(
        tenants,
        ["big", "small"],
        "one head each, not big's two oldest"
    );
    let outcome = sent(&claim.rows);
    claim.batch.complete(outcome).await.expect("complete");
    assert_eq!(t.unsent().await, 2);
    t.drop_table().await;
}

/// `t` with every day in `days_ago` holding one row sent 20 days ago.
async fn sent_long_ago(t: &DbTable, days_ago: &[i32]) {
    for &k in days_ago {
        insert_at(t, None, k, "sent").await;
    }
    t.execute("UPDATE {t} SET published_at = now() - interval '20 days', attempts = 1")
        .await;
}

/// A partition pg_partman (or a DBA) made under another role: the relay's user owns the table
/// but not the partition, so `DROP TABLE` is refused. The round says so and what to do, the
/// partition and its rows stay (the detach is rolled back with it), and the relay goes on
/// claiming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_owned_by_another_role_is_kept_and_the_error_says_ownership_is_needed() {
    let t = app_table("part_owner", "bigserial").await;
    sent_long_ago(&t, &[30]).await;
    let (relay, other) = (format!("{}_relay", t.name), format!("{}_other", t.name));
    let old = format!("{}_d70", t.name);
    for sql in [
        format!("CREATE ROLE \"{relay}\" LOGIN"),
        format!("CREATE ROLE \"{other}\""),
        format!("ALTER TABLE {{t}} OWNER TO \"{relay}\""),
    ] {
        t.execute(&sql).await;
    }
    // Every partition the relay's, but day 30's another role's.
    let partitions = t
        .text_rows(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = '{t}'::regclass",
        )
        .await;
    for row in &partitions {
        let name = row[0].as_deref().expect("name");
        let owner = if name == old { &other } else { &relay };
        t.execute(&format!("ALTER TABLE \"{name}\" OWNER TO \"{owner}\""))
            .await;
    }
    let (scheme, rest) = t.url.split_once("://").expect("url");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let url = format!("{scheme}://{relay}@{host}");
    let store = store::open(&url, &spec(&t), published_at(), 2)
        .await
        .expect("open as the relay's role");
    // Not even allowed to read the partition (its rows are read straight from it), then —
    // granted what pg_partman's inherit_privileges copies from the table — not its owner.
    for (grant, said) in [
        (None, "permission denied for table"),
        (
            Some(format!(
                "GRANT SELECT, UPDATE, DELETE ON \"{old}\" TO \"{relay}\""
            )),
            "must be owner of table",
        ),
    ] {
        if let Some(grant) = grant {
            t.execute(&grant).await;
        }
        let err = store
            .maintain_partitions(Some(7 * DAY))
            .await
            .expect_err("not the partition's owner")
            .to_string();
        assert!(
            err.contains(&format!("cannot drop partition {old}"))
                && err.contains("to own the partition")
                && err.contains(said),
            "{err}"
        );
    }
    let still = t
        .scalar_i64(&format!(
            "SELECT count(*) FROM pg_inherits WHERE inhrelid = '\"{old}\"'::regclass"
        ))
        .await;
    assert_eq!(still, 1, "still attached");
    assert_eq!(t.count().await, 1, "the row is still there");
    // The relay relays on.
    let live = insert_at(&t, None, 0, "live").await;
    let claim = store.claim(10, &[]).await.expect("claim");
    assert_eq!(ids_of(&claim.rows), vec![OutboxId::Int(live)]);
    claim.batch.complete(sent(&claim.rows)).await.expect("mark");
    drop(store);
    // The roles' objects (the table and its partitions) go with them.
    for sql in [
        format!("DROP OWNED BY \"{relay}\", \"{other}\""),
        format!("DROP ROLE \"{relay}\""),
        format!("DROP ROLE \"{other}\""),
    ] {
        t.execute(&sql).await;
    }
    t.drop_table().await;
}

fn ids_of(rows: &[crate::model::OutboxRow]) -> Vec<OutboxId> {
    rows.iter().map(|r| r.id.clone()).collect()
}

/// An operator detaches an old partition while the pruner is between its first look and the
/// table lock (here: the operator's `DETACH PARTITION` queued behind a reader, the pruner's
/// lock queued behind it). Under the lock the partition is no longer the table's: it is left
/// alone — not dropped, no error — and the round goes on with the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_detached_by_an_operator_during_a_round_is_left_alone() {
    let t = app_table("part_detach", "bigserial").await;
    sent_long_ago(&t, &[30, 29]).await;
    let first = format!("{}_d70", t.name);
    let store = std::sync::Arc::new(open(&t, published_at()).await);
    let mut reader = sqlx::PgConnection::connect(&t.url).await.expect("reader");
    reader.execute("BEGIN").await.expect("begin");
    reader
        .execute(sqlx::AssertSqlSafe(t.sql("SELECT count(*) FROM {t}")))
        .await
        .expect("read");
    let operator = {
        let (url, sql) = (
            t.url.clone(),
            t.sql(&format!("ALTER TABLE {{t}} DETACH PARTITION \"{first}\"")),
        );
        tokio::spawn(async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.expect("operator");
            conn.execute(sqlx::AssertSqlSafe(sql))
                .await
                .expect("detach");
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let round = {
        let store = std::sync::Arc::clone(&store);
        tokio::spawn(async move { store.maintain_partitions(Some(7 * DAY)).await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    reader.execute("COMMIT").await.expect("commit");
    operator.await.expect("operator");
    let round = round.await.expect("round").expect("the round goes on");
    let dropped: Vec<String> = round.dropped.iter().map(|n| n.replace('"', "")).collect();
    assert!(!dropped.contains(&first), "{round:?}");
    assert!(
        dropped.contains(&format!("{}_d71", t.name)),
        "the next one is dropped: {round:?}"
    );
    let detached = t
        .scalar_i64(&format!("SELECT count(*) FROM \"{first}\""))
        .await;
    assert_eq!(detached, 1, "the operator's table is untouched");
    t.execute(&format!("DROP TABLE \"{first}\"")).await;
    t.drop_table().await;
}
