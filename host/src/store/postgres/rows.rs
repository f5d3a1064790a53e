//! PostgreSQL's rows: ids as the `text[]` parameter the statements cast to the id column's
//! type, and the shared statements run on its pool ([`crate::store::statement`]).

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgRow};

use crate::model::OutboxId;
use crate::store::statement::impl_run;

impl_run!(PgPool, PgRow, DateTime<Utc>, |time| time);

/// Ids as the `text[]` parameter the statements cast to the id column's type.
pub(crate) fn key_params<'a>(ids: impl Iterator<Item = &'a OutboxId>) -> Vec<String> {
    ids.map(OutboxId::to_string).collect()
}
