//! PostgreSQL's rows: ids as the `text[]` parameter the statements cast to the id column's
//! type, and the shared statements run on its pool ([`crate::store::statement`]).

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::PgRow;

use crate::model::OutboxId;
use crate::store::statement::impl_execute;

impl_execute!(Postgres, PgRow, DateTime<Utc>, |time| time);

/// Ids as the `text[]` parameter the statements cast to the id column's type.
pub(crate) fn key_params<'a>(ids: impl Iterator<Item = &'a OutboxId>) -> Vec<String> {
    ids.map(OutboxId::to_string).collect()
}
