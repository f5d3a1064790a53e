//! Deleting in bounded chunks (pruning sent rows, purging dead ones): each statement deletes
//! at most [`CHUNK`] rows — a short transaction, little WAL or undo at once — with a pause
//! between full chunks that leaves the database to the relay and the application.

use std::time::Duration;

use super::statement::{Run, Statement};

/// Rows deleted per statement.
pub(crate) const CHUNK: i64 = 1_000;
/// Pause between two full chunks.
const CHUNK_PAUSE: Duration = Duration::from_millis(50);

/// The rows a chunked delete has deleted so far.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    total: u64,
}

impl Chunks {
    /// Counts a chunk's `deleted` rows; whether another chunk follows (after a pause): only
    /// when this one was full.
    pub(crate) async fn more(&mut self, deleted: u64) -> bool {
        self.total += deleted;
        if deleted < CHUNK as u64 {
            return false;
        }
        tokio::time::sleep(CHUNK_PAUSE).await;
        true
    }

    /// Rows deleted in all chunks.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
}

/// Runs `statement` (a `DELETE` of at most [`CHUNK`] rows) until a chunk comes back short;
/// returns the rows deleted.
pub(crate) async fn delete_in_chunks<R: Run>(
    run: &R,
    statement: &Statement,
) -> Result<u64, sqlx::Error> {
    let mut chunks = Chunks::default();
    while chunks.more(run.execute(statement).await?).await {}
    Ok(chunks.total())
}
