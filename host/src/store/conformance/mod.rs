//! The store conformance suite: one set of test bodies, run against every store Sluice relays
//! from (PostgreSQL, MySQL/MariaDB, SQLite) and against the in-memory store the relay's unit
//! tests use ([`super::memory`]), as River's `riverdrivertest` does.
//!
//! Each body is a generic function over a [`Fixture`]: a fresh table, with rows inserted and
//! inspected the way an application would (plain SQL on a database, the table's own state in
//! memory), never through the store under test. [`conformance!`] stamps out one
//! `#[tokio::test]` per body and store.
//!
//! The bodies come in three sets:
//!
//! - [`contract`]: the behaviour of [`OutboxStore`] and [`ClaimedBatch`] — claims and their
//!   order, disjoint claimers, rows put back, paused tenants, `has_due`/`backlog`/
//!   `sample_backlog`, failures rescheduled, dead-lettered or waited out, `published_at` mode,
//!   the count check and `settle`, key order, pruning, dead rows, rejected rows. Every store
//!   runs it, the in-memory one included: the relay's tests are only as good as the fake they
//!   run on, and a behaviour the databases have and the fake lacks (or the reverse) fails here.
//! - [`schema`]: what a table must look like — unusable tables refused naming every problem,
//!   an application's (Debezium) table relayed through the column mapping. Only the databases
//!   run it: it is about `sluice migrate`, `store::open` and a database's column types, which
//!   an in-memory table does not have.
//! - [`fair_share`]: `relay.fair_share`'s turns between tenants. The databases run it (the
//!   in-memory store claims in order only).
//! - [`replay`]: `sluice replay` — which sent rows become due again, when, and the marker the
//!   relay reads and clears. The databases run it (the store's own statements).
//!
//! What only one database needs proven (MariaDB's gap locks, SQLite's leases) is in
//! [`mariadb_locks`] and [`sqlite_leases`].
//!
//! The database tables are the test kit's (`sluice_testkit::DbTable`):
//! `SLUICE_TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! `SLUICE_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`), and SQLite files in
//! temporary directories. Run the suite alone with `cargo test -p sluice --lib
//! store::conformance`.

mod contract;
mod databases;
mod fair_share;
mod mariadb_locks;
mod memory;
mod replay;
mod schema;
mod sqlite_leases;

use std::time::Duration;

use crate::model::{ColumnValue, OutboxId, OutboxRow, TenantId};
use crate::store::{
    self, BatchOutcome, ColumnsSettings, Disposition, MarkMode, OutboxStore, RowFailure, Store,
    StoreOptions, TableName, TableSpec,
};

// ---------------------------------------------------------------------------------------------
// Fixtures

/// A row as an application inserts it.
#[derive(Debug, Clone)]
struct NewRow {
    tenant: Option<&'static str>,
    aggregate_type: &'static str,
    aggregate_id: String,
    event_type: &'static str,
    /// JSON text.
    payload: String,
    /// The `headers` column: JSON text.
    headers: String,
}

fn row(tenant: Option<&'static str>, aggregate_id: &str, n: u32) -> NewRow {
    NewRow {
        tenant,
        aggregate_type: "order",
        aggregate_id: aggregate_id.to_owned(),
        event_type: "OrderCreated",
        payload: format!(r#"{{"n":{n}}}"#),
        headers: format!(r#"{{"trace":"t{n}"}}"#),
    }
}

/// A row's bookkeeping, as the application reads it.
#[derive(Debug, Clone, PartialEq)]
struct RowState {
    published: bool,
    dead: bool,
    attempts: i32,
    last_error: Option<String>,
    /// `next_attempt_at` lies in the future.
    waiting: bool,
}

/// A fresh table of one store, and the application's access to it.
trait Fixture: Sized {
    /// The store under test.
    type Store: OutboxStore;

    /// A fresh, not yet created table.
    async fn new() -> Self;
    /// Inserts `rows` one statement each; returns their ids.
    async fn insert(&self, rows: &[NewRow]) -> Vec<i64>;
    async fn delete(&self, id: i64);
    async fn count(&self) -> i64;
    /// The row's bookkeeping, `None` when the row is gone.
    async fn state(&self, id: i64) -> Option<RowState>;
    /// Makes a row waiting for its retry due now, as if its time had come.
    async fn make_due(&self, id: i64);
    /// `sluice migrate` of the standard table, then a store with `options`.
    async fn migrated(&self, options: StoreOptions) -> Self::Store;
    /// Another store on the same table (another relay).
    async fn open(&self, options: StoreOptions) -> Self::Store;
    async fn cleanup(self);
}

/// A fixture on a real database: its URL and table name, and the SQL to create tables of
/// other shapes.
/// An extra column for [`DbFixture::odd_columns`].
struct OddColumn {
    /// Its name as the table has it.
    name: &'static str,
    /// `ALTER TABLE … ADD COLUMN` text (the name quoted as the database needs).
    declared: &'static str,
    /// `SET` clause of its value (empty: a generated column).
    set: &'static str,
    /// What the plugin gets.
    expect: ColumnValue,
}

trait DbFixture: Fixture<Store = Store> {
    fn url(&self) -> String;
    fn table(&self) -> &str;
    /// Inserts `n` rows of `tenant` in bulk (one statement; MariaDB: 1,000 a statement), as
    /// a migration or an import does.
    async fn insert_bulk(&self, n: i64, tenant: Option<&str>);
    /// Creates the table the way an application coming from Debezium has it: columns `id`
    /// (the database's usual key), `aggregatetype`, `aggregateid`, `type`, `payload`; no
    /// tenant, headers, created_at or bookkeeping.
    async fn create_debezium_table(&self);
    /// Inserts into that table.
    async fn insert_debezium(&self, aggregate_type: &str, aggregate_id: &str, payload: &str);
    /// Runs `sql` (`{t}` stands for the quoted table), as an administrator would.
    async fn execute(&self, sql: &str);
    /// Creates a table Sluice cannot use: an id of a non-key type, `aggregate_id` missing,
    /// an integer `payload`, no bookkeeping columns.
    async fn create_unusable_table(&self);

    /// Columns of the database's usual types, as `ALTER TABLE … ADD COLUMN` takes them, in
    /// this order: `region` (text), `n` (a big integer), `flag` (boolean), `score` (double),
    /// `seen_at` (a timestamp), `meta` (JSON), `raw` (binary), `note` (text), `amount` (a
    /// decimal).
    const TYPED_COLUMNS: [&'static str; 9];
    /// `UPDATE … SET` of those columns: `eu-west`, 42, true, 19.5, 2026-01-02 03:04:05.123
    /// UTC, `{"a": [1, 2]}`, the bytes 00 ff, NULL, 12.30.
    const TYPED_VALUES: &'static str;

    /// Statements run once before [`DbFixture::odd_columns`] are added (PostgreSQL: the
    /// enum and domain types they use), `{t}` standing for the table.
    const ODD_SETUP: &'static [&'static str] = &[];
    /// Columns of types applications use beyond the usual ones, each with a value and what a
    /// plugin must get for it ([`OddColumn`]).
    fn odd_columns() -> Vec<OddColumn>;
    /// `SET` clauses that make a row unreadable, each with the column the row's error must
    /// name: a time no time value holds (PostgreSQL's `infinity`, MariaDB's zero date) in the
    /// extra column `late` and in `created_at`. Empty where every value reads (SQLite).
    const UNREADABLE: &'static [(&'static str, &'static str)];

    fn spec(&self) -> TableSpec {
        TableSpec::new(TableName::parse(self.table()).unwrap())
    }

    /// The table of [`DbFixture::create_debezium_table`], through `[database.columns]`.
    fn debezium_spec(&self) -> TableSpec {
        let columns = ColumnsSettings {
            aggregate_type: Some("aggregatetype".into()),
            aggregate_id: Some("aggregateid".into()),
            event_type: Some("type".into()),
            ..Default::default()
        };
        TableSpec::from_settings(self.table(), &columns).unwrap()
    }
}

/// `sluice migrate` of the standard table on `f`'s database, then a store with `options`.
async fn migrated_db(f: &impl DbFixture, options: StoreOptions) -> Store {
    store::migrate(&f.url(), &f.spec(), &options, None)
        .await
        .unwrap_or_else(|e| panic!("migrate {}: {e}", f.table()));
    open_db(f, options).await
}

/// A store on `f`'s table.
async fn open_db(f: &impl DbFixture, options: StoreOptions) -> Store {
    store::open(&f.url(), &f.spec(), options, 3)
        .await
        .unwrap_or_else(|e| panic!("open {}: {e}", f.table()))
}

// ---------------------------------------------------------------------------------------------
// Helpers of the bodies

fn ids(rows: &[OutboxRow]) -> Vec<OutboxId> {
    rows.iter().map(|r| r.id.clone()).collect()
}

fn int_ids(ids: &[i64]) -> Vec<OutboxId> {
    ids.iter().map(|&i| OutboxId::Int(i)).collect()
}

fn sent(ids: Vec<OutboxId>) -> BatchOutcome {
    BatchOutcome {
        sent: ids,
        failed: Vec::new(),
    }
}

fn failure(id: i64, error: &str, disposition: Disposition) -> RowFailure {
    RowFailure {
        id: OutboxId::Int(id),
        error: error.to_owned(),
        disposition,
    }
}

fn tenants(names: &[&str]) -> Vec<TenantId> {
    names
        .iter()
        .map(|n| match *n {
            "" => TenantId::none(),
            name => TenantId::named(name),
        })
        .collect()
}

const HOUR: Duration = Duration::from_secs(3600);

fn published_at() -> StoreOptions {
    StoreOptions {
        mark: MarkMode::PublishedAt,
        ..StoreOptions::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

/// One `#[tokio::test]` per body of the named sets (`contract`, `schema`, `fair_share`) for a
/// fixture.
macro_rules! conformance {
    ($module:ident: $fixture:ty; $($set:ident),+ $(,)?) => {
        mod $module {
            use super::*;
            $(conformance!(@$set $fixture);)+
        }
    };
    (@contract $fixture:ty) => {
        conformance!(@tests contract, $fixture;
            claims_decode_rows_in_insertion_order,
            two_claimers_get_disjoint_rows,
            rows_put_back_behind_full_claims_are_claimed_again,
            paused_tenants_are_skipped,
            has_due_and_backlog_follow_the_rows_states,
            the_backlog_sample_counts_per_tenant_and_reads_at_most_its_limit,
            failures_are_rescheduled_dead_lettered_or_waited_out,
            marking_published_at_keeps_the_row_and_never_claims_it_again,
            a_batch_naming_a_row_it_does_not_hold_fails_the_count_check_and_settle_records_the_rest,
            settle_skips_rows_another_relay_holds,
            key_order_holds_back_later_rows_of_a_key,
            pruning_deletes_only_sent_rows_past_retention,
            dead_rows_are_listed_replayed_and_purged,
            malformed_headers_are_rejected_not_published,
        );
    };
    (@schema $fixture:ty) => {
        conformance!(@tests schema, $fixture;
            unusable_tables_are_refused_naming_every_problem,
            an_application_table_is_relayed_through_the_column_mapping,
            extra_columns_reach_the_row_with_their_types,
            every_other_column_is_extra_with_a_star_and_a_missing_one_is_named,
            odd_extra_values_arrive_typed_or_as_text_and_an_unreadable_one_fails_its_row,
        );
    };
    (@replay $fixture:ty) => {
        conformance!(@tests replay, $fixture;
            only_sent_rows_of_the_window_and_filters_become_due_again,
            a_replay_is_spread_over_time_at_its_rate_in_chunks,
            a_table_without_the_marker_relays_and_refuses_to_replay,
            a_since_before_1970_takes_every_sent_row,
            listed_ids_are_counted_and_replayed_once_however_often_listed,
        );
    };
    (@fair_share $fixture:ty) => {
        conformance!(@tests fair_share, $fixture;
            a_small_tenant_is_not_held_back_behind_a_big_tenants_backlog,
            tenants_take_turns_when_more_wait_than_a_batch_holds,
            concurrent_fair_claims_are_disjoint_and_skip_paused_tenants,
            fair_heads_keep_key_order,
            a_table_without_the_tenant_index_or_a_tenant_column_is_refused,
            the_tenant_the_fill_serves_is_passed_over_once_and_never_left_out_for_good,
            the_first_claim_after_a_bulk_load_takes_the_small_tenants_rows,
        );
    };
    (@tests $set:ident, $fixture:ty; $($body:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $body() {
                super::$set::$body::<$fixture>().await;
            }
        )*
    };
}

conformance!(postgres: databases::PgFixture; contract, schema, fair_share, replay);
conformance!(mariadb: databases::MyFixture; contract, schema, fair_share, replay);
conformance!(sqlite: databases::LiteFixture; contract, schema, fair_share, replay);
conformance!(in_memory: memory::MemoryFixture; contract);
