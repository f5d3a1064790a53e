//! The in-memory store's fixture: the table is the store's own state, read and changed as an
//! application's SQL would (an insert gets the next id of a sequence and `created_at` now; a
//! `headers` column that is not a JSON object of strings is what the drivers reject at claim).

use chrono::Utc;

use super::{Fixture, NewRow, RowState};
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::store::StoreOptions;
use crate::store::memory::MemoryStore;
use crate::store::rows::parse_headers;

/// A fresh in-memory table; the stores opened on it share it.
pub(super) struct MemoryFixture {
    table: MemoryStore,
}

impl Fixture for MemoryFixture {
    type Store = MemoryStore;

    async fn new() -> Self {
        Self {
            table: MemoryStore::new(StoreOptions::default()),
        }
    }

    async fn insert(&self, rows: &[NewRow]) -> Vec<i64> {
        let mut ids = Vec::new();
        for r in rows {
            let id = self.table.next_id();
            let headers = parse_headers(&r.headers);
            self.table.insert(OutboxRow {
                id: OutboxId::Int(id),
                tenant: TenantId::from_column(r.tenant.map(str::to_owned)),
                aggregate_type: r.aggregate_type.to_owned(),
                aggregate_id: r.aggregate_id.clone(),
                event_type: r.event_type.to_owned(),
                payload: r.payload.clone().into_bytes(),
                headers: headers.clone().unwrap_or_default(),
                created_at: Utc::now(),
                attempts: 0,
                extra: Vec::new(),
                replay: None,
            });
            if let Err(error) = headers
                && let Some(row) = self.table.state().rows.get_mut(&id)
            {
                row.undecodable = Some(error);
            }
            ids.push(id);
        }
        ids
    }

    async fn delete(&self, id: i64) {
        self.table.state().rows.remove(&id);
    }

    async fn count(&self) -> i64 {
        self.table.state().rows.len() as i64
    }

    async fn state(&self, id: i64) -> Option<RowState> {
        let now = Utc::now();
        let state = self.table.state();
        let row = state.rows.get(&id)?;
        Some(RowState {
            published: row.sent(),
            dead: row.dead(),
            attempts: row.attempts,
            last_error: row.last_error.clone(),
            waiting: row.next_attempt_at.is_some_and(|at| at > now),
        })
    }

    async fn make_due(&self, id: i64) {
        if let Some(row) = self.table.state().rows.get_mut(&id) {
            row.next_attempt_at = None;
        }
    }

    /// An in-memory table needs no migration: a store on it.
    async fn migrated(&self, options: StoreOptions) -> MemoryStore {
        self.table.open(options)
    }

    async fn open(&self, options: StoreOptions) -> MemoryStore {
        self.table.open(options)
    }

    async fn cleanup(self) {}
}
