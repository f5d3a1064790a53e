//! `[database]` (the database, the outbox table, its columns, the SQLite lease) and what is
//! wrong with it on its own; how the store claims and marks rows: the `[relay]` keys that
//! decide its SQL.

use std::num::NonZeroUsize;
use std::time::Duration;

use serde::Deserialize;

use super::columns::{ColumnsSettings, TableSpec};
use super::dialect::Driver;
use crate::problem::Problem;
use crate::secret::SecretUrl;

/// Environment variable that overrides `database.url`, so secrets can stay out of the file.
pub const DATABASE_URL_ENV: &str = "SLUICE_DATABASE_URL";

/// `[database]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// Connection URL (`postgres://…`, `mysql://…`, `sqlite://PATH`); `SLUICE_DATABASE_URL`
    /// overrides it.
    #[serde(default)]
    pub url: Option<SecretUrl>,
    /// SQLite only: how long a claim's lease keeps its rows from other relays.
    #[serde(default, with = "humantime_serde")]
    pub lease: Option<Duration>,
    /// Outbox table name, optionally schema-qualified (`schema.table`).
    #[serde(default = "default_table")]
    pub table: String,
    /// `[database.columns]`: which column holds what, for a table the application created
    /// with its own names (e.g. Debezium's).
    #[serde(default)]
    pub columns: ColumnsSettings,
}

fn default_table() -> String {
    "outbox".to_owned()
}

impl DatabaseSettings {
    /// The outbox table with its column mapping, validated (names are identifiers, no column
    /// mapped twice or onto a bookkeeping column).
    pub fn table_spec(&self) -> Result<TableSpec, Problem> {
        TableSpec::from_settings(&self.table, &self.columns)
    }

    /// The database `url` names, if it names one Sluice knows.
    pub fn driver(&self) -> Option<Driver> {
        self.url
            .as_ref()
            .and_then(|url| Driver::of(url.expose()).ok())
    }

    /// What is wrong with `[database]` on its own: no URL, the table and its columns, a lease
    /// where the database holds row locks instead. (How long a lease must be depends on the
    /// producer's timeout: a rule between sections, checked by the configuration.)
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        match &self.url {
            None => problems.push(Problem::new(
                "database.url",
                format!("missing (set it in the file or in {DATABASE_URL_ENV})"),
            )),
            Some(url) if url.expose().trim().is_empty() => {
                problems.push(Problem::new("database.url", "is empty"))
            }
            Some(_) => {}
        }
        problems.extend(self.table_spec().err());
        if let (Some(d), Some(_)) = (self.driver(), self.lease)
            && !d.leases()
        {
            problems.push(Problem::new(
                "database.lease",
                format!(
                    "only SQLite claims rows with a lease; {} holds row locks instead \
                     (remove the key)",
                    d.name()
                ),
            ));
        }
        problems
    }
}

/// How long a SQLite claim keeps its rows from other relays (`database.lease`). It must outlast
/// a batch — claim, transform, publish (up to the producer's `message.timeout.ms`, 30 s by
/// default) and mark — or another relay may claim and publish the rows again; two minutes
/// leave a wide margin over the default timeout.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(120);
/// What a lease must exceed the producer's `message.timeout.ms` by: the rest of a batch (the
/// claim, the transform, waiting for room in the producer's queue, the mark).
pub const LEASE_MARGIN: Duration = Duration::from_secs(30);

/// How a row is marked once all of its messages were acknowledged (`relay.mark`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MarkMode {
    /// `DELETE` the row (fastest; the outbox holds only unsent rows).
    #[default]
    Delete,
    /// `UPDATE … SET published_at = now()` (keeps an audit trail).
    PublishedAt,
}

/// Whether rows of one key must be published in claim order (`relay.ordering`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// Any order; rows of a key may be in flight together (fastest).
    #[default]
    None,
    /// Rows with the same (tenant, aggregate_type, aggregate_id) are published in claim
    /// order: a row is claimed only once every earlier row of its key was sent.
    Key,
}

/// In `ordering = "key"`: whether a dead row still holds back the later rows of its key
/// (`relay.ordering_after_dead`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AfterDead {
    /// Later rows of the key proceed once the row is dead.
    #[default]
    Skip,
    /// Later rows wait until the dead row is replayed and sent.
    Block,
}

/// How the store claims and marks rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// What happens to a sent row (`relay.mark`); default delete.
    pub mark: MarkMode,
    /// Whether rows of one key are published in claim order (`relay.ordering`); default none.
    pub ordering: Ordering,
    /// With key ordering, whether a dead row holds back its key (`relay.ordering_after_dead`);
    /// default skip.
    pub after_dead: AfterDead,
    /// PostgreSQL: the rows of each waiting tenant a batch takes before filling up in claim
    /// order (`relay.fair_share`); `None` (default): claim order only.
    pub fair_share: Option<NonZeroUsize>,
    /// SQLite: how long a claim's lease lasts (the other databases hold row locks instead).
    pub lease: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            mark: MarkMode::default(),
            ordering: Ordering::default(),
            after_dead: AfterDead::default(),
            fair_share: None,
            lease: DEFAULT_LEASE,
        }
    }
}
