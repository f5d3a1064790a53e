//! Binding ids (one placeholder each: MySQL has no array parameters), and the shared
//! statements run on MySQL's pool ([`crate::store::statement`]).

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySql, MySqlArguments, MySqlPool, MySqlRow};
use sqlx::query::Query;

use crate::model::OutboxId;
use crate::store::schema::KeyKind;
use crate::store::statement::impl_run;

impl_run!(MySqlPool, MySqlRow, DateTime<Utc>, |time| time);

pub(super) type MyQuery<'q> = Query<'q, MySql, MySqlArguments>;

/// The number of placeholders a statement for `n` values gets: the next power of two, the rest
/// bound as NULL (which matches no row). Statements differ only by their placeholders, and
/// sqlx prepares (and caches, up to 100 per connection) each text: with one text per batch size
/// the cache would overflow, and every statement it evicts is closed with a packet MySQL does
/// not answer, which stalls the next statement for a delayed ACK (40 ms) under Nagle's
/// algorithm. Powers of two keep each connection at a handful of texts.
pub(super) fn placeholder_count(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// Binds a NULL of the id's type, for the placeholders beyond the values.
pub(super) fn bind_null_id<'q>(query: MyQuery<'q>, key: &KeyKind) -> MyQuery<'q> {
    match key {
        KeyKind::Int => query.bind(None::<i64>),
        KeyKind::Text { .. } => query.bind(None::<String>),
    }
}

/// Binds `id` as the type the id column compares with: an integer, or its text.
pub(super) fn bind_id<'q>(query: MyQuery<'q>, id: &OutboxId) -> MyQuery<'q> {
    match id {
        OutboxId::Int(n) => query.bind(*n),
        OutboxId::Text(text) => query.bind(text.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_come_in_a_few_sizes() {
        let sizes: std::collections::BTreeSet<usize> = (1..=1000).map(placeholder_count).collect();
        assert_eq!(sizes.len(), 11);
        assert_eq!(placeholder_count(0), 1);
        assert_eq!(placeholder_count(500), 512);
        assert_eq!(placeholder_count(1000), 1024);
    }
}
