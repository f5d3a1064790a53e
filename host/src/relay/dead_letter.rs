//! Dead-letter copies: when rows go dead, a copy of each is published to
//! `relay.retry.dead_letter_topic` with headers saying why.

use super::outcome::{Failure, Fate, Outcomes};
use crate::model::OutboxRow;
use crate::model::{Broker, OutboundMessage};
use crate::sink::Sink;
use crate::store::Disposition;

/// Publishes a copy of every row of `outcomes` that goes dead. The row is dead either way; a
/// copy that was not published is noted in its `last_error`.
pub(super) async fn publish<K: Sink>(
    sink: &K,
    broker: Broker,
    topic: &str,
    outcomes: &mut Outcomes<'_>,
) {
    // Each copy is paired with the failure it reports on as it is made.
    let (copies, failures): (Vec<OutboundMessage>, Vec<&mut Failure>) = outcomes
        .rows_mut()
        .iter_mut()
        .filter_map(|o| {
            let row = o.row;
            match &mut o.fate {
                Fate::Failed(f) if f.disposition == Disposition::Dead => {
                    Some((dead_letter_message(broker, topic, row, &f.error), f))
                }
                _ => None,
            }
        })
        .unzip();
    if copies.is_empty() {
        return;
    }
    let results = sink.publish(&copies).await;
    for (index, failure) in failures.into_iter().enumerate() {
        let error = match results.get(index) {
            Some(Ok(_)) => continue,
            Some(Err(e)) => e.to_string(),
            None => "sink returned no delivery report".to_owned(),
        };
        tracing::error!(row = %copies[index].row, error = %error, "dead-letter copy not published");
        failure
            .error
            .push_str(&format!(" (dead-letter copy not published: {error})"));
    }
}

/// The dead-letter copy of a row: its payload untouched, keyed by aggregate id, with the row's
/// headers and Sluice's `sluice-*` headers explaining why it died.
fn dead_letter_message(
    broker: Broker,
    topic: &str,
    row: &OutboxRow,
    error: &str,
) -> OutboundMessage {
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
    OutboundMessage {
        row: row.id.clone(),
        broker,
        topic: topic.to_owned(),
        key: Some(row.aggregate_id.as_bytes().to_vec()),
        payload: Some(row.payload.clone()),
        headers,
        partition: None,
        encoding: None,
        value_record: None,
        key_record: None,
        timestamp_ms: None,
    }
}
