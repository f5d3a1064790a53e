//! What the host accepts from a plugin: the checks every returned message must pass before
//! anything of its row is published, and the headers the host stamps itself.

use super::bindings::types as wit;
use super::limits::Limits;
use super::{RowResult, TransformFailure};
use crate::message::Message;
use crate::outbox::OutboxRow;

/// Header names the host owns: whatever a plugin sets under these names is replaced.
pub const TENANT_HEADER: &str = "sluice-tenant";
pub const OUTBOX_ID_HEADER: &str = "sluice-outbox-id";

/// Turns a plugin's answer for `row` into messages, or fails the whole row closed: a row with
/// one refused message publishes nothing.
pub fn accept(
    limits: &Limits,
    row: &OutboxRow,
    answer: Result<Vec<wit::OutputMessage>, wit::TransformError>,
) -> RowResult {
    match answer {
        Ok(messages) if messages.len() > limits.max_outputs_per_row => {
            Err(TransformFailure::InvalidOutput(format!(
                "plugin returned {} messages for one row; max_outputs_per_row is {}",
                messages.len(),
                limits.max_outputs_per_row
            )))
        }
        Ok(messages) => messages
            .into_iter()
            .map(|m| accept_message(limits, row, m))
            .collect(),
        Err(wit::TransformError::Retryable(d)) => Err(TransformFailure::Retryable {
            code: d.code,
            message: d.message,
        }),
        Err(wit::TransformError::Permanent(d)) => Err(TransformFailure::Permanent {
            code: d.code,
            message: d.message,
        }),
    }
}

fn accept_message(
    limits: &Limits,
    row: &OutboxRow,
    m: wit::OutputMessage,
) -> Result<Message, TransformFailure> {
    if m.topic.is_empty() {
        return Err(TransformFailure::InvalidOutput(
            "plugin returned a message with an empty topic".into(),
        ));
    }
    if !limits.topic_allowed(&m.topic) {
        return Err(TransformFailure::InvalidOutput(format!(
            "plugin routed to topic {:?}, which is not in tenant {}'s allowed_topics",
            m.topic, row.tenant
        )));
    }
    let size = m.key.as_ref().map_or(0, Vec::len)
        + m.payload.as_ref().map_or(0, Vec::len)
        + m.headers
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
    if size > limits.max_message_bytes {
        return Err(TransformFailure::InvalidOutput(format!(
            "plugin returned a {size}-byte message for topic {:?}; max_message_bytes is {}",
            m.topic, limits.max_message_bytes
        )));
    }
    Ok(Message {
        row: row.id.clone(),
        topic: m.topic,
        key: m.key,
        payload: m.payload,
        headers: stamp_headers(m.headers, row),
        partition: m.partition,
    })
}

/// Drops any `sluice-tenant` / `sluice-outbox-id` the plugin set and appends the true values,
/// so consumers can trust them.
fn stamp_headers(mut headers: Vec<(String, Vec<u8>)>, row: &OutboxRow) -> Vec<(String, Vec<u8>)> {
    headers.retain(|(k, _)| {
        !k.eq_ignore_ascii_case(TENANT_HEADER) && !k.eq_ignore_ascii_case(OUTBOX_ID_HEADER)
    });
    headers.push((
        TENANT_HEADER.to_owned(),
        row.tenant.as_str().as_bytes().to_vec(),
    ));
    headers.push((OUTBOX_ID_HEADER.to_owned(), row.id.to_string().into_bytes()));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LimitsSpec;
    use crate::outbox::{OutboxId, TenantId};

    fn row() -> OutboxRow {
        OutboxRow {
            id: OutboxId::Int(3),
            tenant: TenantId("acme".into()),
            aggregate_type: "order".into(),
            aggregate_id: "o".into(),
            event_type: "E".into(),
            payload: Vec::new(),
            headers: Vec::new(),
            created_at: chrono::Utc::now(),
            attempts: 0,
        }
    }

    fn message(topic: &str, headers: Vec<(String, Vec<u8>)>) -> wit::OutputMessage {
        wit::OutputMessage {
            topic: topic.into(),
            key: None,
            payload: Some(vec![b'x'; 10]),
            headers,
            partition: None,
        }
    }

    fn limits(spec: LimitsSpec) -> Limits {
        Limits::resolve(&spec).unwrap()
    }

    #[test]
    fn forged_host_headers_are_replaced() {
        let forged = vec![
            ("Sluice-Tenant".to_owned(), b"root".to_vec()),
            ("sluice-outbox-id".to_owned(), b"999".to_vec()),
            ("keep".to_owned(), b"1".to_vec()),
        ];
        let out = accept(&Limits::default(), &row(), Ok(vec![message("t", forged)])).unwrap();
        assert_eq!(
            out[0].headers,
            vec![
                ("keep".to_owned(), b"1".to_vec()),
                (TENANT_HEADER.to_owned(), b"acme".to_vec()),
                (OUTBOX_ID_HEADER.to_owned(), b"3".to_vec()),
            ]
        );
    }

    #[test]
    fn one_refused_message_fails_the_whole_row() {
        let l = limits(LimitsSpec {
            allowed_topics: Some(vec!["acme.*".into()]),
            ..LimitsSpec::default()
        });
        let answer = Ok(vec![message("acme.ok", vec![]), message("other", vec![])]);
        let err = accept(&l, &row(), answer).unwrap_err();
        assert!(err.to_string().contains("allowed_topics"), "{err}");
    }

    #[test]
    fn counts_and_sizes_are_enforced() {
        let l = limits(LimitsSpec {
            max_outputs_per_row: Some(1),
            max_message_bytes: Some(5),
            ..LimitsSpec::default()
        });
        let two = Ok(vec![message("a", vec![]), message("b", vec![])]);
        assert!(
            accept(&l, &row(), two)
                .unwrap_err()
                .to_string()
                .contains("max_outputs_per_row")
        );
        let big = Ok(vec![message("a", vec![])]);
        assert!(
            accept(&l, &row(), big)
                .unwrap_err()
                .to_string()
                .contains("max_message_bytes")
        );
        assert!(accept(&l, &row(), Ok(vec![message("", vec![])])).is_err());
    }
}
