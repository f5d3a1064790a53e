//! Dead-letter copies: when rows go dead, a copy of each is published to
//! `relay.retry.dead_letter_topic` with headers saying why.

use crate::message::Message;
use crate::outbox::{Disposition, OutboxRow, RowFailure};
use crate::sink::Sink;

/// Publishes a copy of every row of `failed_rows` (indices into `rows`, matching the tail of
/// `failed`) that goes dead. The row is dead either way; a failed copy is noted in its
/// `last_error`.
pub async fn publish<K: Sink>(
    sink: &K,
    topic: &str,
    rows: &[OutboxRow],
    failed_rows: &[usize],
    failed: &mut [RowFailure],
) {
    let offset = failed.len() - failed_rows.len();
    let dead: Vec<(usize, usize)> = failed_rows
        .iter()
        .enumerate()
        .filter(|(i, _)| failed[offset + i].disposition == Disposition::Dead)
        .map(|(i, row)| (offset + i, *row))
        .collect();
    if dead.is_empty() {
        return;
    }
    let copies: Vec<Message> = dead
        .iter()
        .map(|(f, r)| dead_letter_message(topic, &rows[*r], &failed[*f].error))
        .collect();
    let results = sink.publish(&copies).await;
    for ((f, _), result) in dead.iter().zip(results) {
        if let Err(e) = result {
            tracing::error!(row = %failed[*f].id, error = %e, "dead-letter copy not published");
            failed[*f]
                .error
                .push_str(&format!(" (dead-letter copy not published: {e})"));
        }
    }
}

/// The dead-letter copy of a row: its payload untouched, keyed by aggregate id, with the row's
/// headers and Sluice's `sluice-*` headers explaining why it died.
fn dead_letter_message(topic: &str, row: &OutboxRow, error: &str) -> Message {
    let mut headers = row.headers.clone();
    headers.extend([
        ("sluice-error".to_owned(), error.as_bytes().to_vec()),
        (
            "sluice-attempts".to_owned(),
            (row.attempts + 1).to_string().into_bytes(),
        ),
        (
            "sluice-outbox-id".to_owned(),
            row.id.to_string().into_bytes(),
        ),
        (
            "sluice-tenant".to_owned(),
            row.tenant.as_str().as_bytes().to_vec(),
        ),
        (
            "sluice-aggregate-type".to_owned(),
            row.aggregate_type.as_bytes().to_vec(),
        ),
        (
            "sluice-event-type".to_owned(),
            row.event_type.as_bytes().to_vec(),
        ),
    ]);
    Message {
        row: row.id.clone(),
        topic: topic.to_owned(),
        key: Some(row.aggregate_id.as_bytes().to_vec()),
        payload: Some(row.payload.clone()),
        headers,
        partition: None,
    }
}
