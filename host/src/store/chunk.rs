//! Deleting in bounded chunks (pruning sent rows, purging dead ones): each statement deletes
//! at most [`CHUNK`] rows — a short transaction, little WAL or undo at once — with a pause
//! between full chunks that leaves the database to the relay and the application.

use std::time::Duration;

use super::statement::{Execute, Statement};

/// Rows deleted per statement.
pub(crate) const CHUNK: i64 = 1_000;
/// Pause between two full chunks.
const CHUNK_PAUSE: Duration = Duration::from_millis(50);

/// Runs `statement` (a `DELETE` of at most [`CHUNK`] rows) on `conn` until a chunk comes back
/// short; returns the rows deleted.
pub(crate) async fn delete_in_chunks<DB: Execute>(
    conn: &mut DB::Connection,
    statement: &Statement,
) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let deleted = DB::execute(conn, statement).await?;
        total += deleted;
        if deleted < CHUNK as u64 {
            return Ok(total);
        }
        tokio::time::sleep(CHUNK_PAUSE).await;
    }
}
