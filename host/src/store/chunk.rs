//! Deleting in bounded chunks (pruning sent rows, purging dead ones): each statement deletes
//! at most [`CHUNK`] rows — a short transaction, little WAL or undo at once — with a pause
//! between full chunks that leaves the database to the relay and the application.

use std::time::Duration;

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

/// `d` in whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
