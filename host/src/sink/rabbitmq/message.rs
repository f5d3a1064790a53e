//! How an [`OutboundMessage`] becomes an AMQP message: the routing key is its topic, the body
//! its payload (empty for a tombstone), and its properties say persistent (`delivery_mode`
//! 2), its `message_id` (`{prefix}{row}-{index}`), a timestamp (the message's, else the time
//! of the send; AMQP's is in whole seconds), and the headers as an AMQP
//! field table of byte strings — with `sluice-key` for the key and `sluice-tombstone: true`
//! for a tombstone. Messages RabbitMQ would refuse (or act on: `CC`/`BCC` route a message to
//! more routing keys) fail here, before anything is sent.

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};

use super::faults::exchange_name;
use super::settings::MAX_SHORT_STRING;
use crate::model::{OutboundMessage, OutboxId};
use crate::sink::{PublishFault, SinkError};

/// The header that carries a message's key (AMQP messages have none).
pub(crate) const KEY_HEADER: &str = "sluice-key";
/// The header that marks a tombstone (a message without a payload), with the value `true`.
pub(crate) const TOMBSTONE_HEADER: &str = "sluice-tombstone";

/// `delivery_mode` of a persistent message: written to disk by durable queues.
const PERSISTENT: u8 = 2;

/// Headers RabbitMQ itself acts on in any exchange: sender-selected distribution routes a
/// message to the routing keys they list as well, around the tenant's allow-list.
const ROUTING_HEADERS: [&str; 2] = ["CC", "BCC"];

/// Bytes the properties other than the headers may take in a content header frame, with room
/// to spare; the headers get the rest of the broker's `frame_max`.
const PROPERTIES_RESERVE: usize = 1024;

/// What the sink publishes for one message.
#[derive(Debug)]
pub(super) struct Amqp {
    pub routing_key: ShortString,
    pub properties: BasicProperties,
    /// Encoded size of the headers: they must fit one frame.
    header_bytes: usize,
}

/// What a message is published with, besides itself.
pub(super) struct Mapping<'a> {
    pub exchange: &'a str,
    pub max_message_bytes: usize,
    pub message_id_prefix: &'a str,
}

impl Mapping<'_> {
    /// The AMQP message for `m`, the `index`-th message of its row in the batch; `Err` for a
    /// message that cannot be sent as it is.
    pub(super) fn map(&self, m: &OutboundMessage, index: usize) -> Result<Amqp, SinkError> {
        let refused = |why: String| SinkError::publish_failed(&m.topic, why, PublishFault::Refused);
        let routing_key = ShortString::try_new(m.topic.as_str()).map_err(|_| {
            refused(format!(
                "a routing key is at most {MAX_SHORT_STRING} bytes, this one has {}",
                m.topic.len()
            ))
        })?;
        let body = m.payload.as_deref().unwrap_or_default();
        if body.len() > self.max_message_bytes {
            return Err(refused(format!(
                "the message body has {} bytes, more than rabbitmq.max_message_bytes ({}) \
                 allows on {}",
                body.len(),
                self.max_message_bytes,
                exchange_name(self.exchange)
            )));
        }
        let (headers, header_bytes) = field_table(m).map_err(refused)?;
        let id = format!("{}{}-{index}", self.message_id_prefix, m.row);
        let message_id = ShortString::try_new(id).map_err(|_| {
            SinkError::publish_failed(
                &m.topic,
                format!(
                    "message id of row {} is longer than {MAX_SHORT_STRING} bytes: shorten \
                     rabbitmq.message_id_prefix",
                    m.row
                ),
                PublishFault::Failed,
            )
        })?;
        let properties = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_message_id(message_id)
            .with_timestamp(m.timestamp_ms.map_or_else(now, seconds))
            .with_headers(headers);
        Ok(Amqp {
            routing_key,
            properties,
            header_bytes,
        })
    }
}

impl Amqp {
    /// `Err` naming the sizes when the headers do not fit a frame of `frame_max` bytes (the
    /// broker would close the connection).
    pub(super) fn fits(&self, frame_max: usize) -> Result<(), String> {
        let room = frame_max.saturating_sub(PROPERTIES_RESERVE);
        if self.header_bytes > room {
            Err(format!(
                "the headers take {} bytes, more than the broker's frame_max ({frame_max}) \
                 leaves them ({room})",
                self.header_bytes
            ))
        } else {
            Ok(())
        }
    }
}

/// The headers of `m` as a field table (a header that repeats becomes an array of its values
/// in order), plus the key and tombstone headers, and their encoded size.
fn field_table(m: &OutboundMessage) -> Result<(FieldTable, usize), String> {
    let mut values: BTreeMap<&str, Vec<&[u8]>> = BTreeMap::new();
    for (name, value) in &m.headers {
        if ROUTING_HEADERS.contains(&name.as_str()) {
            return Err(format!(
                "header {name:?} would make RabbitMQ route the message to more routing keys \
                 (sender-selected distribution); rename it"
            ));
        }
        values.entry(name).or_default().push(value);
    }
    if let Some(key) = &m.key {
        values.entry(KEY_HEADER).or_default().push(key);
    }
    if m.payload.is_none() {
        values.entry(TOMBSTONE_HEADER).or_default().push(b"true");
    }
    let mut table = FieldTable::default();
    // Table: 4 bytes of length; per entry a name (1 + n), a type (1), and per string 4 + n.
    let mut size = 4;
    for (name, values) in values {
        let key = ShortString::try_new(name).map_err(|_| {
            format!(
                "a header name is at most {MAX_SHORT_STRING} bytes, {:?}… has {}",
                name.chars().take(20).collect::<String>(),
                name.len()
            )
        })?;
        size += 2 + name.len();
        let value = match values.as_slice() {
            [one] => {
                size += 4 + one.len();
                AMQPValue::LongString(LongString::from(one.to_vec()))
            }
            many => {
                size += 4;
                let items = many.iter().map(|v| {
                    size += 5 + v.len();
                    AMQPValue::LongString(LongString::from(v.to_vec()))
                });
                AMQPValue::FieldArray(FieldArray::from(items.collect::<Vec<_>>()))
            }
        };
        table.insert(key, value);
    }
    Ok((table, size))
}

/// For each message, its ordinal among the messages of the same row before it in the batch
/// (a row's plugin may fan out to several messages).
pub(super) fn indexes_in_row(messages: &[OutboundMessage]) -> Vec<usize> {
    let mut seen: HashMap<&OutboxId, usize> = HashMap::new();
    messages
        .iter()
        .map(|m| {
            let n = seen.entry(&m.row).or_default();
            *n += 1;
            *n - 1
        })
        .collect()
}

/// A message's timestamp in AMQP's unit, whole seconds (rounded down).
fn seconds(ms: i64) -> u64 {
    u64::try_from(ms.div_euclid(1000)).unwrap_or(0)
}

/// Seconds since the epoch, AMQP's `timestamp`.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Broker;

    fn message(row: i64, headers: &[(&str, &str)]) -> OutboundMessage {
        OutboundMessage {
            row: OutboxId::Int(row),
            broker: Broker::Rabbitmq,
            topic: "orders".to_owned(),
            key: Some(b"k1".to_vec()),
            payload: Some(b"{}".to_vec()),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
            partition: None,
            encoding: None,
            value_record: None,
            key_record: None,
            timestamp_ms: None,
        }
    }

    const MAPPING: Mapping<'static> = Mapping {
        exchange: "outbox",
        max_message_bytes: 10,
        message_id_prefix: "shop-",
    };

    fn string(v: &AMQPValue) -> Vec<u8> {
        match v {
            AMQPValue::LongString(s) => s.as_bytes().to_vec(),
            other => panic!("not a long string: {other:?}"),
        }
    }

    #[test]
    fn properties_say_persistent_message_id_and_headers_with_the_key() {
        let m = message(
            7,
            &[("sluice-tenant", "acme"), ("trace", "a"), ("trace", "b")],
        );
        let amqp = MAPPING.map(&m, 2).unwrap();
        assert_eq!(amqp.routing_key.as_str(), "orders");
        let p = &amqp.properties;
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(
            p.message_id().as_ref().map(ShortString::as_str),
            Some("shop-7-2")
        );
        assert!(p.timestamp().is_some());
        let stamped = OutboundMessage {
            timestamp_ms: Some(1_767_323_045_999),
            ..m.clone()
        };
        let at = *MAPPING.map(&stamped, 2).unwrap().properties.timestamp();
        assert_eq!(at, Some(1_767_323_045), "the message's, in seconds");
        let headers = p.headers().as_ref().unwrap().inner();
        assert_eq!(string(&headers["sluice-tenant"]), b"acme");
        assert_eq!(string(&headers["sluice-key"]), b"k1");
        assert!(!headers.contains_key("sluice-tombstone"));
        let AMQPValue::FieldArray(trace) = &headers["trace"] else {
            panic!("{headers:?}")
        };
        let trace: Vec<Vec<u8>> = trace.as_slice().iter().map(string).collect();
        assert_eq!(trace, [b"a".to_vec(), b"b".to_vec()], "in order");
    }

    #[test]
    fn a_tombstone_is_an_empty_body_with_a_header_and_no_key_no_header() {
        let mut m = message(1, &[]);
        m.payload = None;
        m.key = None;
        let amqp = MAPPING.map(&m, 0).unwrap();
        let headers = amqp.properties.headers().as_ref().unwrap().inner();
        assert_eq!(string(&headers["sluice-tombstone"]), b"true");
        assert!(!headers.contains_key("sluice-key"));
    }

    #[test]
    fn what_rabbitmq_would_refuse_or_act_on_is_refused_here() {
        let refused = |m: &OutboundMessage| {
            let e = MAPPING.map(m, 0).unwrap_err();
            assert_eq!(e.fault(), Some(PublishFault::Refused), "{e}");
            e.to_string()
        };
        let mut large = message(1, &[]);
        large.payload = Some(vec![0; 11]);
        assert!(refused(&large).contains("rabbitmq.max_message_bytes (10)"));
        let mut long = message(1, &[]);
        long.topic = "t".repeat(256);
        assert!(refused(&long).contains("at most 255 bytes"));
        assert!(refused(&message(1, &[("CC", "elsewhere")])).contains("\"CC\""));
        let name = "h".repeat(256);
        assert!(refused(&message(1, &[(&name, "v")])).contains("header name"));
        let mut text_id = message(1, &[]);
        text_id.row = OutboxId::Text("x".repeat(300).into());
        let e = MAPPING.map(&text_id, 0).unwrap_err();
        assert_eq!(e.fault(), Some(PublishFault::Failed));
    }

    #[test]
    fn headers_must_fit_a_frame() {
        let value = "v".repeat(5000);
        let amqp = MAPPING.map(&message(1, &[("big", &value)]), 0).unwrap();
        assert!(amqp.fits(131_072).is_ok());
        assert!(amqp.fits(4096).unwrap_err().contains("frame_max (4096)"));
    }

    #[test]
    fn indexes_count_messages_per_row_in_batch_order() {
        let rows = [1, 2, 1, 1, 3, 2].map(|r| message(r, &[]));
        assert_eq!(indexes_in_row(&rows), [0, 0, 1, 2, 0, 1]);
    }
}
