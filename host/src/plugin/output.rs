//! What the host accepts from a plugin: the checks every returned message must pass before
//! anything of its row is published, and the headers the host stamps itself.
//!
//! Everything a plugin returns is hostile input: text that ends up in an error (and so in a
//! log line and in `last_error`) is escaped and cut with [`bounded`]; topics must be valid
//! Kafka topic names; header names must not carry control characters (a NUL ends a name in
//! librdkafka, so `sluice-tenant\0x` would reach consumers as a second `sluice-tenant`).

use std::sync::Arc;

use crate::encoding::MessageFormats;
use crate::model::{Encoding, OutboundMessage, OutboxRow, RowResult, TransformFailure};
use crate::plugin::limits::Limits;
use crate::plugin::wasm::bindings::types as wit;
use crate::text::{MAX_LOGGED, bounded};

/// Header names the host owns: whatever a plugin sets under these names is replaced.
pub const TENANT_HEADER: &str = "sluice-tenant";
/// Carries the row's outbox id.
pub const OUTBOX_ID_HEADER: &str = "sluice-outbox-id";
/// On every message of a row `sluice replay` made due again: the replay's id.
pub const REPLAY_HEADER: &str = "sluice-replay";
const HOST_HEADERS: [&str; 3] = [TENANT_HEADER, OUTBOX_ID_HEADER, REPLAY_HEADER];

/// What each header costs towards `max_message_bytes` on top of its name and value: a broker,
/// librdkafka and every consumer allocate a record per header, so 200,000 empty headers are
/// not an empty message.
pub const HEADER_OVERHEAD_BYTES: usize = 32;
/// Kafka's own limit on topic name length.
pub const MAX_TOPIC_LEN: usize = 249;
/// Longest plugin error code kept.
const MAX_ERROR_CODE: usize = 128;
/// Longest topic or header name quoted in an error.
const MAX_QUOTED: usize = 256;

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
            code: bounded(&d.code, MAX_ERROR_CODE).into_owned(),
            message: bounded(&d.message, MAX_LOGGED).into_owned(),
        }),
        Err(wit::TransformError::Permanent(d)) => Err(TransformFailure::Permanent {
            code: bounded(&d.code, MAX_ERROR_CODE).into_owned(),
            message: bounded(&d.message, MAX_LOGGED).into_owned(),
        }),
    }
}

/// Bytes a message counts towards `max_message_bytes` and the batch output budget: key,
/// payload, and each header's name, value and [`HEADER_OVERHEAD_BYTES`].
pub fn message_bytes<'a>(
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    headers: impl IntoIterator<Item = &'a (String, Vec<u8>)>,
) -> usize {
    key.map_or(0, <[u8]>::len)
        + payload.map_or(0, <[u8]>::len)
        + headers
            .into_iter()
            .map(|(k, v)| k.len() + v.len() + HEADER_OVERHEAD_BYTES)
            .sum::<usize>()
}

/// Bytes of a row's accepted messages (see [`message_bytes`]).
pub fn output_bytes(messages: &[OutboundMessage]) -> usize {
    messages
        .iter()
        .map(|m| m.topic.len() + message_bytes(m.key.as_deref(), m.payload.as_deref(), &m.headers))
        .sum()
}

fn invalid(message: String) -> TransformFailure {
    TransformFailure::InvalidOutput(message)
}

fn accept_message(
    limits: &Limits,
    row: &OutboxRow,
    m: wit::OutputMessage,
) -> Result<OutboundMessage, TransformFailure> {
    check_topic(limits, row, &m.topic)?;
    if m.headers.len() > limits.max_headers_per_message {
        return Err(invalid(format!(
            "plugin returned a message with {} headers for topic {:?}; max_headers_per_message is {}",
            m.headers.len(),
            m.topic,
            limits.max_headers_per_message
        )));
    }
    if let Some((name, _)) = m
        .headers
        .iter()
        .find(|(name, _)| name.chars().any(char::is_control))
    {
        return Err(invalid(format!(
            "plugin returned a header name with a control character: \"{}\"",
            bounded(name, MAX_QUOTED)
        )));
    }
    for (field, record) in [
        ("value-record", &m.value_record),
        ("key-record", &m.key_record),
    ] {
        if let Some(record) = record
            && !is_record_name(record)
        {
            return Err(invalid(format!(
                "plugin returned {field} \"{}\", which is not a record name (dot-separated \
                 names of ASCII letters, digits and '_', not starting with a digit, at most \
                 {MAX_QUOTED} bytes)",
                bounded(record, MAX_QUOTED)
            )));
        }
    }
    if let Some(ms) = m.timestamp_ms
        && ms < 0
    {
        // Kafka takes no record timestamp before the epoch (-1 means "none").
        return Err(invalid(format!(
            "plugin returned timestamp-ms {ms}, before 1970-01-01 (none: leave it unset)"
        )));
    }
    let size = message_bytes(m.key.as_deref(), m.payload.as_deref(), &m.headers);
    if size > limits.max_message_bytes {
        return Err(invalid(format!(
            "plugin returned a {size}-byte message for topic {:?}; max_message_bytes is {} \
             (key + payload + headers, {HEADER_OVERHEAD_BYTES} bytes per header on top)",
            m.topic, limits.max_message_bytes
        )));
    }
    Ok(OutboundMessage {
        row: row.id.clone(),
        broker: limits.broker,
        topic: m.topic,
        key: m.key,
        payload: m.payload,
        headers: stamp_headers(m.headers, row),
        partition: m.partition,
        encoding: None,
        value_record: m.value_record,
        key_record: m.key_record,
        timestamp_ms: m.timestamp_ms,
    })
}

/// [`accept`], then marks each message with the tenant's `key_format`/`value_format`, for
/// the relay's encoding step.
pub fn accept_formatted(
    limits: &Limits,
    formats: Option<&Arc<MessageFormats>>,
    row: &OutboxRow,
    answer: Result<Vec<wit::OutputMessage>, wit::TransformError>,
) -> RowResult {
    let mut messages = accept(limits, row, answer)?;
    if let Some(formats) = formats {
        for m in &mut messages {
            m.encoding = Some(Encoding::new(Arc::clone(formats)));
        }
    }
    Ok(messages)
}

/// An Avro full name or Protobuf message name: `com.acme.OrderCreated`. It may become a
/// registry subject (record strategies), so nothing else is let through.
fn is_record_name(name: &str) -> bool {
    name.len() <= MAX_QUOTED
        && name.split('.').all(|part| {
            part.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

/// A topic must be a valid destination name on the tenant's broker (a Kafka topic name, a
/// NATS subject, …) before it may be checked against the allow-list or quoted in an error
/// without escaping.
fn check_topic(limits: &Limits, row: &OutboxRow, topic: &str) -> Result<(), TransformFailure> {
    if topic.is_empty() {
        return Err(invalid(
            "plugin returned a message with an empty topic".into(),
        ));
    }
    if let Err(why) = crate::sink::check_destination(limits.broker, topic) {
        return Err(invalid(format!(
            "plugin routed to \"{}\" ({} bytes), which is not a valid {} ({why})",
            bounded(topic, MAX_QUOTED),
            topic.len(),
            crate::sink::destination_noun(limits.broker),
        )));
    }
    if !limits.topic_allowed(topic) {
        return Err(invalid(format!(
            "plugin routed to topic {topic:?}, which is not in tenant {}'s allowed_topics",
            row.tenant
        )));
    }
    Ok(())
}

/// Whether a header name is one of the host's, compared without regard to case — Unicode
/// case included, character by character after mapping to upper case and back to lower case
/// (the rule of Java's `equalsIgnoreCase`, which some consumers use): `Sluice-Tenant`,
/// `ſluice-tenant` (long s) and `SLUİCE-TENANT` (dotted capital I) are all host-owned.
pub fn host_owned(name: &str) -> bool {
    HOST_HEADERS.iter().any(|host| {
        name.chars().count() == host.len()
            && name.chars().zip(host.chars()).all(|(c, h)| fold(c) == h)
    })
}

/// One character's case-insensitive identity: upper case, then lower case, keeping the first
/// character of each mapping.
fn fold(c: char) -> char {
    let upper = c.to_uppercase().next().unwrap_or(c);
    upper.to_lowercase().next().unwrap_or(upper)
}

/// Drops every header the plugin set under a host-owned name (see [`host_owned`]) and appends
/// the true values, so consumers see exactly one of each and can trust them.
fn stamp_headers(mut headers: Vec<(String, Vec<u8>)>, row: &OutboxRow) -> Vec<(String, Vec<u8>)> {
    headers.retain(|(k, _)| !host_owned(k));
    headers.reserve_exact(2 + usize::from(row.replay.is_some()));
    headers.push((
        TENANT_HEADER.to_owned(),
        row.tenant.as_str().as_bytes().to_vec(),
    ));
    headers.push((OUTBOX_ID_HEADER.to_owned(), row.id.to_string().into_bytes()));
    if let Some(replay) = &row.replay {
        headers.push((REPLAY_HEADER.to_owned(), replay.as_bytes().to_vec()));
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{OutboxId, TenantId};
    use crate::plugin::limits::LimitsSpec;

    fn row() -> OutboxRow {
        OutboxRow {
            id: OutboxId::Int(3),
            tenant: TenantId::named("acme"),
            aggregate_type: "order".into(),
            aggregate_id: "o".into(),
            event_type: "E".into(),
            payload: Vec::new(),
            headers: Vec::new(),
            created_at: chrono::Utc::now(),
            attempts: 0,
            extra: Vec::new(),
            replay: None,
        }
    }

    fn message(topic: &str, headers: Vec<(String, Vec<u8>)>) -> wit::OutputMessage {
        wit::OutputMessage {
            topic: topic.into(),
            key: None,
            payload: Some(vec![b'x'; 10]),
            headers,
            partition: None,
            value_record: None,
            key_record: None,
            timestamp_ms: None,
        }
    }

    #[test]
    fn a_timestamp_is_kept_and_one_before_the_epoch_is_refused() {
        let stamped = wit::OutputMessage {
            timestamp_ms: Some(1_767_323_045_000),
            ..message("t", vec![])
        };
        let out = accept(&Limits::default(), &row(), Ok(vec![stamped])).unwrap();
        assert_eq!(out[0].timestamp_ms, Some(1_767_323_045_000));
        let before = wit::OutputMessage {
            timestamp_ms: Some(-5),
            ..message("t", vec![])
        };
        let err = accept(&Limits::default(), &row(), Ok(vec![before])).unwrap_err();
        assert!(err.to_string().contains("timestamp-ms -5"), "{err}");
    }

    #[test]
    fn record_names_are_kept_and_anything_else_is_refused() {
        let named = wit::OutputMessage {
            value_record: Some("com.acme.OrderShipped".into()),
            key_record: Some("_K1".into()),
            ..message("t", vec![])
        };
        let out = accept(&Limits::default(), &row(), Ok(vec![named])).unwrap();
        assert_eq!(
            out[0].value_record.as_deref(),
            Some("com.acme.OrderShipped")
        );
        assert_eq!(out[0].key_record.as_deref(), Some("_K1"));
        for bad in ["", "a..b", "1abc", "a/b", "../x", "a b", "é"] {
            let m = wit::OutputMessage {
                value_record: Some(bad.into()),
                ..message("t", vec![])
            };
            let err = accept(&Limits::default(), &row(), Ok(vec![m])).unwrap_err();
            assert!(
                err.to_string().contains("not a record name"),
                "{bad:?}: {err}"
            );
        }
    }

    fn limits(spec: LimitsSpec) -> Limits {
        Limits::resolve(&spec, None).unwrap()
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
    fn a_replayed_row_carries_the_replay_header_which_plugins_cannot_forge() {
        let forged = vec![("SLUICE-REPLAY".to_owned(), b"forged".to_vec())];
        // A live row: a plugin's `sluice-replay` is dropped, none is added.
        let live = accept(
            &Limits::default(),
            &row(),
            Ok(vec![message("t", forged.clone())]),
        );
        assert!(
            !live.unwrap()[0]
                .headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case(REPLAY_HEADER))
        );
        // A replayed row: every message gets the replay's id.
        let replayed = OutboxRow {
            replay: Some("2026-12-06T15:30:00.000Z".into()),
            ..row()
        };
        let answer = Ok(vec![message("t", forged), message("u", vec![])]);
        for m in accept(&Limits::default(), &replayed, answer).unwrap() {
            let replay: Vec<&[u8]> = m
                .headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(REPLAY_HEADER))
                .map(|(_, v)| v.as_slice())
                .collect();
            assert_eq!(replay, [b"2026-12-06T15:30:00.000Z".as_slice()]);
        }
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

    #[test]
    fn unicode_case_variants_of_host_headers_are_host_owned() {
        for name in [
            "sluice-tenant",
            "SLUICE-TENANT",
            "Sluice-Outbox-Id",
            "\u{17f}luice-tenant",    // ſ, long s: upper case S
            "SLU\u{130}CE-TENANT",    // İ, capital I with dot: lower case i
            "slu\u{131}ce-outbox-id", // ı, dotless i: upper case I
        ] {
            assert!(host_owned(name), "{name:?}");
        }
        for name in [
            "sluice-tenants",
            "sluice-tenant ",
            "xsluice-tenant",
            "sluice_tenant",
            "",
        ] {
            assert!(!host_owned(name), "{name:?}");
        }
        let forged = vec![
            ("\u{17f}luice-tenant".to_owned(), b"root".to_vec()),
            ("SLU\u{130}CE-OUTBOX-ID".to_owned(), b"1".to_vec()),
        ];
        let out = accept(&Limits::default(), &row(), Ok(vec![message("t", forged)])).unwrap();
        let names: Vec<&str> = out[0].headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, [TENANT_HEADER, OUTBOX_ID_HEADER]);
    }

    #[test]
    fn header_names_with_control_characters_fail_the_row() {
        for name in ["sluice-tenant\0", "a\nb", "\u{1b}[31m"] {
            let answer = Ok(vec![message("t", vec![(name.to_owned(), b"x".to_vec())])]);
            let err = accept(&Limits::default(), &row(), answer).unwrap_err();
            assert!(matches!(err, TransformFailure::InvalidOutput(_)), "{err}");
            let text = err.to_string();
            assert!(text.contains("control character"), "{text}");
            assert!(!text.chars().any(|c| c.is_control()), "{text:?}");
        }
    }

    #[test]
    fn header_count_and_per_header_overhead_are_enforced() {
        let empty = |n: usize| vec![(String::new(), Vec::new()); n];
        let l = limits(LimitsSpec {
            max_headers_per_message: Some(10),
            ..LimitsSpec::default()
        });
        let err = accept(&l, &row(), Ok(vec![message("t", empty(11))])).unwrap_err();
        assert!(err.to_string().contains("max_headers_per_message"), "{err}");
        assert!(accept(&l, &row(), Ok(vec![message("t", empty(10))])).is_ok());
        // 200,000 empty headers are not an empty message.
        let l = limits(LimitsSpec {
            max_headers_per_message: Some(1_000_000),
            ..LimitsSpec::default()
        });
        let err = accept(&l, &row(), Ok(vec![message("t", empty(200_000))])).unwrap_err();
        assert!(err.to_string().contains("max_message_bytes"), "{err}");
    }

    #[test]
    fn destinations_follow_the_tenants_broker_and_messages_carry_it() {
        use crate::model::Broker;
        let on = |broker| Limits {
            broker,
            ..Limits::default()
        };
        let ok = accept(
            &on(Broker::Redis),
            &row(),
            Ok(vec![message("orders:acme", vec![])]),
        )
        .unwrap();
        assert_eq!(ok[0].broker, Broker::Redis);
        let err = accept(
            &on(Broker::Kafka),
            &row(),
            Ok(vec![message("orders:acme", vec![])]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not a valid Kafka topic name"), "{err}");
        let err = accept(
            &on(Broker::Nats),
            &row(),
            Ok(vec![message("orders..acme", vec![])]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("not a valid NATS subject") && err.contains("empty tokens"),
            "{err}"
        );
        for wildcard in ["orders.*", "orders.>", "orders.#"] {
            for broker in Broker::ALL {
                assert!(
                    accept(&on(broker), &row(), Ok(vec![message(wildcard, vec![])])).is_err(),
                    "{broker} {wildcard}"
                );
            }
        }
    }

    #[test]
    fn topics_must_be_kafka_topic_names_and_are_quoted_safely() {
        for bad in ["a\0b", "a b", "..", "x/y", "\u{e9}t\u{e9}"] {
            let err = accept(&Limits::default(), &row(), Ok(vec![message(bad, vec![])]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("not a valid Kafka topic name"),
                "{bad:?}: {err}"
            );
            assert!(!err.chars().any(|c| c.is_control()), "{err:?}");
        }
        let long = "t".repeat(1 << 20);
        let err = accept(&Limits::default(), &row(), Ok(vec![message(&long, vec![])]))
            .unwrap_err()
            .to_string();
        assert!(err.len() < 2 * MAX_LOGGED, "{} bytes", err.len());
        assert!(err.contains("1048576 bytes"), "{err}");
        assert!(
            accept(
                &Limits::default(),
                &row(),
                Ok(vec![message(&"t".repeat(249), vec![])])
            )
            .is_ok()
        );
    }

    #[test]
    fn plugin_error_text_is_escaped_and_bounded() {
        let answer = Err(wit::TransformError::Permanent(wit::ErrorDetail {
            code: "c\0de".into(),
            message: format!("bad\0{}", "x".repeat(4 << 20)),
        }));
        let err = accept(&Limits::default(), &row(), answer).unwrap_err();
        let text = err.to_string();
        assert!(!text.contains('\0'), "NUL escaped");
        assert!(text.contains("c\\u{0}de"), "{text}");
        assert!(text.len() < 2 * MAX_LOGGED, "{} bytes", text.len());
    }
}
