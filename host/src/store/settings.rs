//! How the store claims and marks rows: the `[relay]` keys that decide its SQL.

use serde::Deserialize;

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreOptions {
    pub mark: MarkMode,
    pub ordering: Ordering,
    pub after_dead: AfterDead,
}
