//! One message as one stream entry: the `XADD` command and its field layout, which the docs
//! promise and consumers read back.
//!
//! Fields, in this order: `value` (the payload; absent for a tombstone), `sluice-key` (when the
//! message has a key), each header as a field of its own in the message's order (duplicates
//! kept: a stream entry is a list of pairs, not a map), then `sluice-message-id`
//! (`{message_id_prefix}{row}-{index}`, what a consumer de-duplicates by).

use std::collections::HashMap;

use super::settings::RedisSettings;
use crate::model::{OutboundMessage, OutboxId};
use crate::sink::{PublishFault, SinkError};

/// The field holding the payload.
pub(super) const VALUE: &str = "value";
/// The field holding the message key.
pub(super) const KEY: &str = "sluice-key";
/// The field holding the message id.
pub(super) const MESSAGE_ID: &str = "sluice-message-id";

/// How entries are written: the parts of `[redis]` that shape an `XADD`.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    create_streams: bool,
    maxlen: Option<u64>,
    max_message_bytes: usize,
    message_id_prefix: String,
}

impl Layout {
    pub(super) fn new(settings: &RedisSettings) -> Self {
        Self {
            create_streams: settings.create_streams,
            maxlen: settings.maxlen,
            max_message_bytes: settings.max_message_bytes,
            message_id_prefix: settings.message_id_prefix.clone(),
        }
    }

    /// The `XADD` for message `m`, the `index`-th message of its row in the batch; `Err` (the
    /// tenant's fault) for a message no entry can carry: a header named like one of the
    /// sink's own fields, or an entry larger than `max_message_bytes`.
    pub(super) fn xadd(
        &self,
        m: &OutboundMessage,
        index: usize,
    ) -> Result<::redis::Cmd, SinkError> {
        if let Some((name, _)) = m
            .headers
            .iter()
            .find(|(name, _)| [VALUE, KEY, MESSAGE_ID].contains(&name.as_str()))
        {
            return Err(SinkError::publish_failed(
                &m.topic,
                format!(
                    "header {name:?} cannot be carried: a stream entry's {name:?} field is \
                     the sink's own ({VALUE}: payload, {KEY}: key, {MESSAGE_ID}: message id)"
                ),
                PublishFault::Refused,
            ));
        }
        let id = self.message_id(&m.row, index);
        let size = entry_size(m, &id);
        if size > self.max_message_bytes {
            return Err(SinkError::publish_failed(
                &m.topic,
                format!(
                    "the entry is {size} bytes (fields and values), over redis.max_message_bytes \
                     ({} bytes); not sent",
                    self.max_message_bytes
                ),
                PublishFault::Refused,
            ));
        }
        let mut cmd = ::redis::cmd("XADD");
        cmd.arg(m.topic.as_str());
        if !self.create_streams {
            cmd.arg("NOMKSTREAM");
        }
        if let Some(n) = self.maxlen {
            // `~`: Redis trims whole macro nodes, which costs far less than an exact length.
            cmd.arg("MAXLEN").arg("~").arg(n);
        }
        cmd.arg("*");
        if let Some(payload) = &m.payload {
            cmd.arg(VALUE).arg(payload.as_slice());
        }
        if let Some(key) = &m.key {
            cmd.arg(KEY).arg(key.as_slice());
        }
        for (name, value) in &m.headers {
            cmd.arg(name.as_str()).arg(value.as_slice());
        }
        cmd.arg(MESSAGE_ID).arg(id);
        Ok(cmd)
    }

    /// `{message_id_prefix}{row}-{index}`.
    pub(super) fn message_id(&self, row: &OutboxId, index: usize) -> String {
        format!("{}{row}-{index}", self.message_id_prefix)
    }
}

/// Each message's 0-based ordinal among the messages of its row in `messages` (a row that
/// fans out to several messages numbers them in slice order).
pub(super) fn indexes_in_row(messages: &[OutboundMessage]) -> Vec<usize> {
    let mut seen: HashMap<&OutboxId, usize> = HashMap::new();
    messages
        .iter()
        .map(|m| {
            let next = seen.entry(&m.row).or_default();
            let index = *next;
            *next += 1;
            index
        })
        .collect()
}

/// The bytes of an entry's field names and values.
fn entry_size(m: &OutboundMessage, id: &str) -> usize {
    let value = m.payload.as_ref().map_or(0, |p| VALUE.len() + p.len());
    let key = m.key.as_ref().map_or(0, |k| KEY.len() + k.len());
    let headers: usize = m.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
    value + key + headers + MESSAGE_ID.len() + id.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Broker;
    use crate::secret::SecretUrl;

    fn message(row: i64) -> OutboundMessage {
        OutboundMessage {
            row: OutboxId::Int(row),
            broker: Broker::Redis,
            topic: "orders".to_owned(),
            key: Some(b"k1".to_vec()),
            payload: Some(b"{}".to_vec()),
            headers: vec![
                ("sluice-tenant".to_owned(), b"acme".to_vec()),
                ("trace".to_owned(), b"a".to_vec()),
                ("trace".to_owned(), b"b".to_vec()),
            ],
            partition: None,
            encoding: None,
            value_record: None,
            key_record: None,
            timestamp_ms: None,
        }
    }

    fn layout(edit: impl FnOnce(&mut RedisSettings)) -> Layout {
        let mut settings = RedisSettings::new(SecretUrl::read("redis://h".into()));
        edit(&mut settings);
        Layout::new(&settings)
    }

    fn args(cmd: &::redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                ::redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a plain argument>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn fields_are_value_key_headers_in_order_then_the_message_id() {
        let cmd = layout(|_| {}).xadd(&message(7), 0).unwrap();
        assert_eq!(
            args(&cmd),
            [
                "XADD",
                "orders",
                "*",
                "value",
                "{}",
                "sluice-key",
                "k1",
                "sluice-tenant",
                "acme",
                "trace",
                "a",
                "trace",
                "b",
                "sluice-message-id",
                "7-0"
            ]
        );
    }

    #[test]
    fn a_tombstone_has_no_value_field_and_a_keyless_message_no_key_field() {
        let mut m = message(7);
        m.payload = None;
        m.key = None;
        m.headers.clear();
        let cmd = layout(|s| s.message_id_prefix = "p:".into())
            .xadd(&m, 2)
            .unwrap();
        assert_eq!(
            args(&cmd),
            ["XADD", "orders", "*", "sluice-message-id", "p:7-2"]
        );
        // An empty payload is not a tombstone.
        m.payload = Some(Vec::new());
        let cmd = layout(|_| {}).xadd(&m, 0).unwrap();
        assert_eq!(args(&cmd)[3..5], ["value", ""]);
    }

    #[test]
    fn nomkstream_and_maxlen_come_before_the_id() {
        let cmd = layout(|s| {
            s.create_streams = false;
            s.maxlen = Some(100);
        })
        .xadd(&message(1), 0)
        .unwrap();
        assert_eq!(
            args(&cmd)[..7],
            ["XADD", "orders", "NOMKSTREAM", "MAXLEN", "~", "100", "*"]
        );
    }

    #[test]
    fn a_header_named_like_the_sinks_own_fields_is_refused_by_name() {
        for name in [VALUE, KEY, MESSAGE_ID] {
            let mut m = message(1);
            m.headers.push((name.to_owned(), b"x".to_vec()));
            let err = layout(|_| {}).xadd(&m, 0).unwrap_err();
            assert_eq!(err.fault(), Some(PublishFault::Refused));
            let text = err.to_string();
            assert!(
                text.contains("orders") && text.contains(&format!("{name:?}")),
                "{text}"
            );
        }
    }

    #[test]
    fn an_entry_over_max_message_bytes_is_refused_before_sending() {
        let m = message(1);
        // value 5+2, key 10+2, headers 13+4 + 5+1 + 5+1, id 17+3
        let exact = 68;
        assert!(layout(|s| s.max_message_bytes = exact).xadd(&m, 0).is_ok());
        let err = layout(|s| s.max_message_bytes = exact - 1)
            .xadd(&m, 0)
            .unwrap_err();
        assert_eq!(err.fault(), Some(PublishFault::Refused));
        assert!(err.to_string().contains("68 bytes"), "{err}");
    }

    #[test]
    fn indexes_count_the_messages_of_each_row_in_slice_order() {
        let rows = [1, 2, 1, 1, 3, 2];
        let messages: Vec<_> = rows.iter().map(|r| message(*r)).collect();
        assert_eq!(indexes_in_row(&messages), [0, 0, 1, 2, 0, 1]);
    }
}
