//! How a message travels as a JetStream message, the promise the docs make: the subject is the
//! message's topic; host and plugin headers are NATS headers; the key is the header
//! `sluice-key`; a tombstone is an empty body with `sluice-tombstone: true`; `Nats-Msg-Id` is
//! `{message_id_prefix}{row}-{index}` (index: the message's place among the batch's messages of
//! its row), so a stream drops a message sent again within its duplicate window.
//!
//! NATS headers are text lines: a name must be printable ASCII without `:`, a value UTF-8
//! without line breaks. A message whose key or headers cannot be carried is refused here,
//! naming the header, never altered. So is a subject that is not one literal subject, and a
//! header that would steer JetStream (`Nats-…`) or fake the key or a tombstone.

use std::collections::HashMap;

use async_nats::header::{HeaderMap, HeaderName, HeaderValue, NATS_MESSAGE_ID};
use bytes::Bytes;

use crate::model::{OutboundMessage, OutboxId};
use crate::text::bounded;

/// The header that carries the message key (NATS messages have none).
pub(crate) const KEY_HEADER: &str = "sluice-key";
/// The header that marks a tombstone (a message without a value).
pub(crate) const TOMBSTONE_HEADER: &str = "sluice-tombstone";
/// Headers starting so are JetStream's instructions (`Nats-Expected-Stream`, `Nats-Msg-Id`,
/// `Nats-Rollup`, …): never taken from a plugin.
const RESERVED_PREFIX: &str = "nats-";
/// Longest name quoted in a refusal.
const MAX_QUOTED: usize = 128;

/// A message as it goes on the wire.
#[derive(Debug)]
pub(super) struct Outgoing {
    pub headers: HeaderMap,
    pub payload: Bytes,
}

/// Each message's `Nats-Msg-Id`: `{prefix}{row}-{index}`, `index` counting the messages of the
/// same row in the slice from 0.
pub(super) fn message_ids(prefix: &str, messages: &[OutboundMessage]) -> Vec<String> {
    let mut seen: HashMap<&OutboxId, usize> = HashMap::new();
    messages
        .iter()
        .map(|m| {
            let index = seen.entry(&m.row).or_insert(0);
            let id = format!("{prefix}{}-{index}", m.row);
            *index += 1;
            id
        })
        .collect()
}

/// Whether `subject` is one literal NATS subject: not empty, no whitespace or control
/// characters, no empty token (`a..b`, a leading or trailing `.`), no wildcard token (`*`,
/// `>`). Errors say why.
pub(super) fn check_subject(subject: &str) -> Result<(), String> {
    let quoted = bounded(subject, MAX_QUOTED);
    if subject.is_empty() {
        return Err("the subject is empty".to_owned());
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "subject {quoted:?} holds whitespace or a control character"
        ));
    }
    for token in subject.split('.') {
        match token {
            "" => return Err(format!("subject {quoted:?} has an empty token")),
            "*" | ">" => {
                return Err(format!(
                    "subject {quoted:?} has the wildcard {token:?}: a message goes to one \
                     literal subject"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// `m`'s headers and body as NATS carries them, or why it cannot.
pub(super) fn outgoing(m: &OutboundMessage, message_id: &str) -> Result<Outgoing, String> {
    let mut headers = HeaderMap::new();
    for (name, value) in &m.headers {
        headers.append(header_name(name)?, header_value(name, value)?);
    }
    if let Some(key) = &m.key {
        headers.append(
            HeaderName::from_static(KEY_HEADER),
            text_value("the message key", key)?,
        );
    }
    if m.payload.is_none() {
        headers.append(
            HeaderName::from_static(TOMBSTONE_HEADER),
            HeaderValue::from_lossy("true"),
        );
    }
    headers.append(
        NATS_MESSAGE_ID,
        text_value("the message id (Nats-Msg-Id)", message_id.as_bytes())?,
    );
    let payload = m
        .payload
        .as_deref()
        .map_or_else(Bytes::new, Bytes::copy_from_slice);
    Ok(Outgoing { headers, payload })
}

/// A plugin or host header's name, if NATS can carry it and it is not one Sluice or JetStream
/// gives a meaning.
fn header_name(name: &str) -> Result<HeaderName, String> {
    let quoted = bounded(name, MAX_QUOTED);
    let lower = name.to_ascii_lowercase();
    if lower == KEY_HEADER || lower == TOMBSTONE_HEADER {
        return Err(format!(
            "header {quoted:?} is the NATS sink's own (it carries the key or marks a \
             tombstone); rename it"
        ));
    }
    if lower.starts_with(RESERVED_PREFIX) {
        return Err(format!(
            "header {quoted:?}: headers starting with \"Nats-\" instruct JetStream and are \
             not passed on; rename it"
        ));
    }
    name.parse().map_err(|_| {
        format!(
            "header {quoted:?} cannot be a NATS header name: printable ASCII without ':' \
             or spaces only"
        )
    })
}

/// A header's value, if it is text NATS can carry.
fn header_value(name: &str, value: &[u8]) -> Result<HeaderValue, String> {
    text_value(&format!("header {:?}", bounded(name, MAX_QUOTED)), value)
}

/// `bytes` as a header value: UTF-8 without line breaks (`what` names it in the refusal).
fn text_value(what: &str, bytes: &[u8]) -> Result<HeaderValue, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| format!("{what} is not UTF-8 text, which is all a NATS header can carry"))?;
    text.parse()
        .map_err(|_| format!("{what} holds a line break, which a NATS header cannot carry"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Broker;

    fn message(row: i64) -> OutboundMessage {
        OutboundMessage {
            row: OutboxId::Int(row),
            broker: Broker::Nats,
            topic: "orders.created".to_owned(),
            key: Some(b"order-1".to_vec()),
            payload: Some(b"{}".to_vec()),
            headers: vec![
                ("sluice-tenant".to_owned(), b"acme".to_vec()),
                ("trace".to_owned(), b"t1".to_vec()),
                ("trace".to_owned(), b"t2".to_vec()),
            ],
            partition: None,
            encoding: None,
            value_record: None,
            key_record: None,
            timestamp_ms: None,
        }
    }

    fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        headers.get_all(name).map(HeaderValue::as_str).collect()
    }

    #[test]
    fn message_ids_count_the_messages_of_each_row() {
        let batch = [message(7), message(8), message(7), message(7)];
        assert_eq!(
            message_ids("shop.outbox:", &batch),
            [
                "shop.outbox:7-0",
                "shop.outbox:8-0",
                "shop.outbox:7-1",
                "shop.outbox:7-2"
            ]
        );
        let mut text = message(1);
        text.row = OutboxId::Text("01J-ULID".into());
        assert_eq!(message_ids("", &[text]), ["01J-ULID-0"]);
    }

    #[test]
    fn headers_key_tombstone_and_id_are_mapped_as_documented() {
        let out = outgoing(&message(1), "p1-0").unwrap();
        assert_eq!(values(&out.headers, "sluice-tenant"), ["acme"]);
        assert_eq!(
            values(&out.headers, "trace"),
            ["t1", "t2"],
            "order within a name kept"
        );
        assert_eq!(values(&out.headers, KEY_HEADER), ["order-1"]);
        assert_eq!(values(&out.headers, "Nats-Msg-Id"), ["p1-0"]);
        assert!(values(&out.headers, TOMBSTONE_HEADER).is_empty());
        assert_eq!(out.payload.as_ref(), b"{}");

        let mut tombstone = message(2);
        tombstone.payload = None;
        tombstone.key = None;
        let out = outgoing(&tombstone, "2-0").unwrap();
        assert_eq!(values(&out.headers, TOMBSTONE_HEADER), ["true"]);
        assert!(values(&out.headers, KEY_HEADER).is_empty());
        assert!(out.payload.is_empty());
        // An empty value is a value, not a tombstone.
        let mut empty = message(3);
        empty.payload = Some(Vec::new());
        let out = outgoing(&empty, "3-0").unwrap();
        assert!(values(&out.headers, TOMBSTONE_HEADER).is_empty());
    }

    #[test]
    fn what_nats_headers_cannot_carry_is_refused_naming_the_header() {
        let refused = |edit: &dyn Fn(&mut OutboundMessage)| {
            let mut m = message(1);
            edit(&mut m);
            outgoing(&m, "1-0").err().unwrap_or_default()
        };
        let e = refused(&|m| m.headers.push(("bin".into(), vec![0xff, 0xfe])));
        assert!(e.contains("\"bin\"") && e.contains("UTF-8"), "{e}");
        let e = refused(&|m| m.headers.push(("multi".into(), b"a\r\nb".to_vec())));
        assert!(e.contains("\"multi\"") && e.contains("line break"), "{e}");
        let e = refused(&|m| m.headers.push(("a b".into(), b"x".to_vec())));
        assert!(e.contains("\"a b\""), "{e}");
        let e = refused(&|m| m.headers.push(("a:b".into(), b"x".to_vec())));
        assert!(e.contains("\"a:b\""), "{e}");
        let e = refused(&|m| m.headers.push(("grüße".into(), b"x".to_vec())));
        assert!(e.contains("NATS header name"), "{e}");
        for reserved in [
            "Nats-Expected-Stream",
            "nats-msg-id",
            "Sluice-Key",
            "sluice-tombstone",
        ] {
            let e = refused(&|m| m.headers.push((reserved.into(), b"x".to_vec())));
            assert!(e.contains(reserved), "{e}");
        }
        let e = refused(&|m| m.key = Some(vec![0xc3]));
        assert!(e.contains("key") && e.contains("UTF-8"), "{e}");
        // UTF-8 values are fine.
        let mut m = message(1);
        m.headers
            .push(("utf8".into(), "grüße ✓".as_bytes().to_vec()));
        assert!(outgoing(&m, "1-0").is_ok());
    }

    #[test]
    fn subjects_must_be_one_literal_subject() {
        for good in [
            "orders",
            "orders.created",
            "a.b-c_d.E9",
            "a*b",
            "tenant.acme.>x",
        ] {
            assert_eq!(check_subject(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("a b", "whitespace"),
            ("a\tb", "whitespace"),
            ("a\u{0}b", "control"),
            (".a", "empty token"),
            ("a.", "empty token"),
            ("a..b", "empty token"),
            ("a.*.b", "wildcard"),
            ("a.>", "wildcard"),
            ("*", "wildcard"),
        ] {
            let e = check_subject(bad).err().unwrap_or_default();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
