//! The relay's encoding step, between the plugins and the sink: each message whose tenant set
//! `key_format`/`value_format` gets its JSON encoded against the subject's schema and framed.
//! Schemas are cached: ids and parsed schemas for good (a registry id never changes its
//! schema), a subject's latest version for `latest_ttl`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::Value as Json;

use super::Encoder;
use super::format::{AvroSchema, JsonSchema, ProtoSchema};
use super::framing;
use super::settings::{FieldEncoding, Format, MessageFormats, SchemaVersion};
use super::source::{RegisteredSchema, RegistryError, SchemaSource};
use crate::model::OutboundMessage;
use crate::model::{RowResult, TransformFailure};

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EncodeError {
    /// The message does not fit its schema: the row's own fault (never published, dead at
    /// once).
    #[error("{field} does not fit subject {subject}{version} (schema id {id}): {detail}")]
    Mismatch {
        /// `key` or `value`.
        field: &'static str,
        /// The registry subject.
        subject: String,
        /// ` version <n>`, or empty when the version is not known (a schema looked up or
        /// registered by its text, a schema file).
        version: String,
        /// The schema's registry id.
        id: u32,
        /// Where in the JSON and why.
        detail: String,
    },
    /// No schema to encode with: the registry is down or refused, the subject has no such
    /// version, the schema is not of the configured format. Not the row's fault: retried.
    #[error("{field}: {detail}")]
    NoSchema {
        /// `key` or `value`.
        field: &'static str,
        /// The registry's answer, or why the schema cannot be used.
        detail: String,
    },
}

impl From<EncodeError> for TransformFailure {
    fn from(e: EncodeError) -> Self {
        match e {
            EncodeError::Mismatch { .. } => TransformFailure::SchemaMismatch(e.to_string()),
            EncodeError::NoSchema { .. } => TransformFailure::SchemaUnavailable(e.to_string()),
        }
    }
}

/// A schema ready to encode with.
#[derive(Debug)]
enum Parsed {
    Avro(AvroSchema),
    Protobuf(ProtoSchema),
    Json(JsonSchema),
}

/// A subject's schema as used: registry id and version, and the parsed schema.
#[derive(Debug)]
struct Resolved {
    id: u32,
    version: Option<u32>,
    parsed: Arc<Parsed>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Lookup {
    Version(SchemaVersion),
    /// The configured schema file's text: registered (`auto_register`) or looked up.
    Find {
        schema: Arc<str>,
        register: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SubjectKey {
    subject: String,
    lookup: Lookup,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ParsedKey {
    id: u32,
    format: Format,
    record: Option<String>,
}

struct Cached {
    resolved: Arc<Resolved>,
    fetched: Instant,
}

/// Encodes messages against registry schemas, with the caches.
pub struct SchemaEncoder {
    source: Arc<dyn SchemaSource>,
    latest_ttl: Duration,
    subjects: Mutex<HashMap<SubjectKey, Cached>>,
    parsed: Mutex<HashMap<ParsedKey, Arc<Parsed>>>,
}

impl Encoder for SchemaEncoder {
    fn encode_rows(&self, results: Vec<RowResult>) -> BoxFuture<'_, Vec<RowResult>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(results.len());
            // Subjects without a schema in this batch: asked once, not once per row (a
            // registry that times out would otherwise hold the batch for a timeout per row).
            let mut missing = HashMap::new();
            for result in results {
                out.push(match result {
                    Ok(mut messages) => match self.encode_all(&mut messages, &mut missing).await {
                        Ok(()) => Ok(messages),
                        Err(e) => Err(e.into()),
                    },
                    failed => failed,
                });
            }
            out
        })
    }
}

impl SchemaEncoder {
    /// An encoder asking `source`, trusting a subject's latest version for `latest_ttl`.
    pub fn new(source: Arc<dyn SchemaSource>, latest_ttl: Duration) -> Self {
        Self {
            source,
            latest_ttl,
            subjects: Mutex::default(),
            parsed: Mutex::default(),
        }
    }

    async fn encode_all(
        &self,
        messages: &mut [OutboundMessage],
        missing: &mut HashMap<String, EncodeError>,
    ) -> Result<(), EncodeError> {
        for m in messages.iter_mut() {
            let Some(encoding) = m.encoding.clone() else {
                continue;
            };
            // Never published unencoded: a plan of another type is a bug, and fails the row.
            let Some(formats) = encoding.get::<MessageFormats>() else {
                return Err(EncodeError::NoSchema {
                    field: "value",
                    detail: format!("{encoding:?} is not a schema encoding"),
                });
            };
            if let (Some(enc), Some(key)) = (&formats.key, &m.key) {
                let enc = formats.with_declared(enc.naming(m.key_record.as_deref()));
                m.key = Some(self.encode_once(&enc, &m.topic, key, missing).await?);
            }
            if let (Some(enc), Some(value)) = (&formats.value, &m.payload) {
                let enc = formats.with_declared(enc.naming(m.value_record.as_deref()));
                m.payload = Some(self.encode_once(&enc, &m.topic, value, missing).await?);
            }
        }
        Ok(())
    }

    /// [`SchemaEncoder::encode`], unless the subject already had no schema in this batch.
    async fn encode_once(
        &self,
        enc: &FieldEncoding,
        topic: &str,
        bytes: &[u8],
        missing: &mut HashMap<String, EncodeError>,
    ) -> Result<Vec<u8>, EncodeError> {
        let subject = enc.subject(topic);
        if let Some(e) = missing.get(&subject) {
            return Err(e.clone());
        }
        let encoded = self.encode(enc, &subject, bytes).await;
        if let Err(e @ EncodeError::NoSchema { .. }) = &encoded {
            missing.insert(subject, e.clone());
        }
        encoded
    }

    /// `bytes` (the plugin's JSON) encoded and framed for `subject` (`enc`'s subject of the
    /// message's topic).
    async fn encode(
        &self,
        enc: &FieldEncoding,
        subject: &str,
        bytes: &[u8],
    ) -> Result<Vec<u8>, EncodeError> {
        let field = enc.field.name();
        let resolved = self
            .resolve(enc, subject)
            .await
            .map_err(|detail| EncodeError::NoSchema { field, detail })?;
        let mismatch = |detail: String| EncodeError::Mismatch {
            field,
            subject: subject.to_owned(),
            version: resolved
                .version
                .map_or_else(String::new, |v| format!(" version {v}")),
            id: resolved.id,
            detail,
        };
        match &*resolved.parsed {
            Parsed::Avro(schema) => {
                let json = match serde_json::from_slice::<Json>(bytes) {
                    Ok(json) => json,
                    // A `string` key may be the plain text the plugin returned.
                    Err(_) if schema.takes_text() => match std::str::from_utf8(bytes) {
                        Ok(text) => Json::String(text.to_owned()),
                        Err(_) => return Err(mismatch("not UTF-8 text".into())),
                    },
                    Err(e) => return Err(mismatch(not_json(&e))),
                };
                let data = schema.encode(&json).map_err(mismatch)?;
                Ok(framing::frame(resolved.id, None, &data))
            }
            Parsed::Protobuf(schema) => {
                let data = schema.encode(bytes).map_err(mismatch)?;
                Ok(framing::frame(resolved.id, Some(schema.indexes()), &data))
            }
            Parsed::Json(schema) => {
                let json: Json =
                    serde_json::from_slice(bytes).map_err(|e| mismatch(not_json(&e)))?;
                schema.validate(&json).map_err(mismatch)?;
                Ok(framing::frame(resolved.id, None, bytes))
            }
        }
    }

    async fn resolve(&self, enc: &FieldEncoding, subject: &str) -> Result<Arc<Resolved>, String> {
        let lookup = match &enc.schema {
            Some(schema) => Lookup::Find {
                schema: Arc::clone(schema),
                register: enc.auto_register,
            },
            None => Lookup::Version(enc.version),
        };
        let key = SubjectKey {
            subject: subject.to_owned(),
            lookup,
        };
        let stale = {
            let subjects = self.subjects.lock().unwrap_or_else(|p| p.into_inner());
            match subjects.get(&key) {
                Some(c) if !self.expired(&key.lookup, c.fetched) => {
                    return Ok(Arc::clone(&c.resolved));
                }
                Some(c) => Some(Arc::clone(&c.resolved)),
                None => None,
            }
        };
        let fetched = match &key.lookup {
            Lookup::Version(v) => self.source.version(subject, *v).await,
            Lookup::Find { schema, register } => {
                let schema_type = enc.format.schema_type().unwrap_or("AVRO");
                self.source
                    .find(subject, schema_type, schema, *register)
                    .await
            }
        };
        let registered = match fetched {
            Ok(r) => r,
            // A subject's latest version that was known keeps encoding while the registry is
            // down, for another `latest_ttl` before it is asked again: a registry outage does
            // not stop a drain, nor cost a request (and its timeout) per message.
            Err(e) if e.is_outage() && stale.is_some() => {
                tracing::warn!(subject, error = %e, ttl = ?self.latest_ttl,
                    "schema registry unavailable; encoding with the latest version seen");
                let stale = stale.ok_or_else(|| e.to_string())?;
                self.remember(key, &stale);
                return Ok(stale);
            }
            Err(e) => return Err(explain(e, enc, subject)),
        };
        let resolved = Arc::new(self.parse(enc, subject, &registered)?);
        if stale.as_ref().is_some_and(|s| s.id != resolved.id) {
            tracing::info!(subject, id = resolved.id, version = ?resolved.version,
                "subject's latest schema changed");
        }
        self.remember(key, &resolved);
        Ok(resolved)
    }

    /// Caches `resolved` for `key` as fetched now.
    fn remember(&self, key: SubjectKey, resolved: &Arc<Resolved>) {
        let cached = Cached {
            resolved: Arc::clone(resolved),
            fetched: Instant::now(),
        };
        self.subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, cached);
    }

    fn expired(&self, lookup: &Lookup, fetched: Instant) -> bool {
        matches!(lookup, Lookup::Version(SchemaVersion::Latest))
            && fetched.elapsed() >= self.latest_ttl
    }

    fn parse(
        &self,
        enc: &FieldEncoding,
        subject: &str,
        registered: &RegisteredSchema,
    ) -> Result<Resolved, String> {
        let expected = enc.format.schema_type().unwrap_or("AVRO");
        let version = registered
            .version
            .map_or_else(String::new, |v| format!(" version {v}"));
        if !registered.schema_type.eq_ignore_ascii_case(expected) {
            return Err(format!(
                "subject {subject}{version} holds a {} schema, but {}_format is {}",
                registered.schema_type,
                enc.field.name(),
                enc.format.name()
            ));
        }
        let key = ParsedKey {
            id: registered.id,
            format: enc.format,
            record: enc.record.clone(),
        };
        let cached = self
            .parsed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let parsed = match cached {
            Some(p) => p,
            None => {
                let text = &registered.schema;
                let parsed = match enc.format {
                    Format::Protobuf => {
                        ProtoSchema::parse(text, enc.record.as_deref()).map(Parsed::Protobuf)
                    }
                    Format::JsonSchema => JsonSchema::parse(text).map(Parsed::Json),
                    _ => AvroSchema::parse(text).map(Parsed::Avro),
                }
                .map_err(|e| {
                    format!(
                        "subject {subject}{version} (schema id {}): {e}",
                        registered.id
                    )
                })?;
                let parsed = Arc::new(parsed);
                self.parsed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, Arc::clone(&parsed));
                parsed
            }
        };
        Ok(Resolved {
            id: registered.id,
            version: registered.version,
            parsed,
        })
    }
}

fn not_json(e: &serde_json::Error) -> String {
    format!("the plugin's output is not JSON ({e})")
}

/// A registry error with what to do about it.
fn explain(e: RegistryError, enc: &FieldEncoding, subject: &str) -> String {
    match (&e, &enc.schema, enc.version) {
        (RegistryError::NotFound(_), None, _) if enc.auto_register => format!(
            "{e} (auto_register is set, but neither {}_schema nor the plugin declares a \
             schema ({}) for {})",
            enc.field.name(),
            enc.format.name(),
            enc.record.as_deref().map_or_else(
                || "its messages (it declares none, or several without a record named)".to_owned(),
                |r| format!("record {r}")
            )
        ),
        (RegistryError::NotFound(_), None, SchemaVersion::Latest) => format!(
            "{e} (register a schema under subject {subject}, or give {}_schema with \
             auto_register = true)",
            enc.field.name()
        ),
        (RegistryError::NotFound(_), Some(_), _) if !enc.auto_register => format!(
            "{e} ({}_schema is not registered under subject {subject}; register it, or set \
             auto_register = true)",
            enc.field.name()
        ),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::future::BoxFuture;

    use super::*;
    use crate::encoding::settings::{Field, SubjectStrategy};
    use crate::model::Encoding;

    /// A registry in memory: one subject per schema, counting the requests.
    struct Fake {
        schemas: Mutex<HashMap<String, RegisteredSchema>>,
        requests: AtomicUsize,
        down: std::sync::atomic::AtomicBool,
    }

    impl Fake {
        fn new(subject: &str, id: u32, schema_type: &str, schema: &str) -> Arc<Self> {
            let fake = Arc::new(Self {
                schemas: Mutex::default(),
                requests: AtomicUsize::new(0),
                down: Default::default(),
            });
            fake.set(subject, id, schema_type, schema);
            fake
        }

        fn set(&self, subject: &str, id: u32, schema_type: &str, schema: &str) {
            self.schemas.lock().unwrap().insert(
                subject.to_owned(),
                RegisteredSchema {
                    id,
                    version: Some(id),
                    schema_type: schema_type.into(),
                    schema: schema.into(),
                },
            );
        }
    }

    impl SchemaSource for Fake {
        fn version(
            &self,
            subject: &str,
            _version: SchemaVersion,
        ) -> BoxFuture<'_, Result<RegisteredSchema, RegistryError>> {
            self.requests.fetch_add(1, Ordering::SeqCst);
            let answer = if self.down.load(Ordering::SeqCst) {
                Err(RegistryError::Unreachable("connection refused".into()))
            } else {
                self.schemas
                    .lock()
                    .unwrap()
                    .get(subject)
                    .cloned()
                    .ok_or_else(|| RegistryError::NotFound(format!("subject {subject} not found")))
            };
            Box::pin(async move { answer })
        }

        fn find(
            &self,
            _subject: &str,
            _schema_type: &str,
            _schema: &str,
            _register: bool,
        ) -> BoxFuture<'_, Result<RegisteredSchema, RegistryError>> {
            Box::pin(async { Err(RegistryError::Refused("not in this fake".into())) })
        }
    }

    const ORDER: &str =
        r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"}]}"#;

    fn avro_value() -> FieldEncoding {
        FieldEncoding {
            format: Format::Avro,
            field: Field::Value,
            strategy: SubjectStrategy::TopicName,
            record: None,
            version: SchemaVersion::Latest,
            auto_register: false,
            schema: None,
        }
    }

    fn message(payload: &[u8]) -> OutboundMessage {
        OutboundMessage {
            row: crate::model::OutboxId::Int(1),
            broker: crate::model::Broker::Kafka,
            topic: "orders".into(),
            key: Some(b"k".to_vec()),
            payload: Some(payload.to_vec()),
            headers: Vec::new(),
            partition: None,
            encoding: Some(Encoding::new(Arc::new(MessageFormats {
                key: None,
                value: Some(avro_value()),
                declared: Default::default(),
            }))),
            value_record: None,
            key_record: None,
            timestamp_ms: None,
        }
    }

    fn encoder(fake: &Arc<Fake>, ttl: Duration) -> SchemaEncoder {
        SchemaEncoder::new(Arc::clone(fake) as Arc<dyn SchemaSource>, ttl)
    }

    #[tokio::test]
    async fn one_registry_request_serves_many_rows_until_the_ttl_runs_out() {
        let fake = Fake::new("orders-value", 3, "AVRO", ORDER);
        let encoder = encoder(&fake, Duration::from_secs(3600));
        let rows: Vec<RowResult> = (0..100)
            .map(|_| Ok(vec![message(b"{\"id\": 1}")]))
            .collect();
        let out = encoder.encode_rows(rows).await;
        assert!(out.iter().all(Result::is_ok));
        assert_eq!(fake.requests.load(Ordering::SeqCst), 1);
        let Ok(first) = &out[0] else { unreachable!() };
        assert_eq!(first[0].payload.as_deref(), Some(&[0, 0, 0, 0, 3, 2][..]));
        // The key stays raw: only the value is encoded.
        assert_eq!(first[0].key.as_deref(), Some(&b"k"[..]));

        // With a zero TTL, a new latest version is read on the next message.
        let encoder =
            super::SchemaEncoder::new(Arc::clone(&fake) as Arc<dyn SchemaSource>, Duration::ZERO);
        encoder
            .encode_rows(vec![Ok(vec![message(b"{\"id\": 1}")])])
            .await;
        fake.set("orders-value", 4, "AVRO", ORDER);
        let out = encoder
            .encode_rows(vec![Ok(vec![message(b"{\"id\": 1}")])])
            .await;
        let Ok(m) = &out[0] else { unreachable!() };
        assert_eq!(m[0].payload.as_deref().unwrap()[4], 4);
    }

    #[tokio::test]
    async fn a_misfit_fails_the_row_as_its_own_fault_and_an_outage_as_nobodys() {
        let fake = Fake::new("orders-value", 3, "AVRO", ORDER);
        let encoder = encoder(&fake, Duration::ZERO);
        let out = encoder
            .encode_rows(vec![
                Ok(vec![message(b"{\"id\": \"x\"}")]),
                Ok(vec![message(b"nope")]),
            ])
            .await;
        match &out[0] {
            Err(TransformFailure::SchemaMismatch(e)) => assert_eq!(
                e,
                "value does not fit subject orders-value version 3 (schema id 3): \
                 $.id: expected an integer, found a string"
            ),
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&out[1], Err(TransformFailure::SchemaMismatch(e)) if e.contains("not JSON"))
        );

        // Down with a cached latest version: keeps encoding with it.
        fake.down.store(true, Ordering::SeqCst);
        let out = encoder
            .encode_rows(vec![Ok(vec![message(b"{\"id\": 1}")])])
            .await;
        assert!(out[0].is_ok(), "{:?}", out[0]);

        // ... and asks again only after another TTL, not once per message.
        let ttl = Duration::from_millis(200);
        let cached = super::SchemaEncoder::new(Arc::clone(&fake) as Arc<dyn SchemaSource>, ttl);
        fake.down.store(false, Ordering::SeqCst);
        cached
            .encode_rows(vec![Ok(vec![message(b"{\"id\": 1}")])])
            .await;
        tokio::time::sleep(ttl).await;
        fake.down.store(true, Ordering::SeqCst);
        let before = fake.requests.load(Ordering::SeqCst);
        let rows: Vec<RowResult> = (0..50).map(|_| Ok(vec![message(b"{\"id\": 1}")])).collect();
        let out = cached.encode_rows(rows).await;
        assert!(out.iter().all(Result::is_ok));
        assert_eq!(
            fake.requests.load(Ordering::SeqCst) - before,
            1,
            "one request per TTL"
        );
        // Down with nothing cached: the row waits.
        let fresh =
            super::SchemaEncoder::new(Arc::clone(&fake) as Arc<dyn SchemaSource>, Duration::ZERO);
        let out = fresh
            .encode_rows(vec![Ok(vec![message(b"{\"id\": 1}")])])
            .await;
        assert!(
            matches!(&out[0], Err(TransformFailure::SchemaUnavailable(e)) if e.contains("unreachable")),
            "{:?}",
            out[0]
        );
    }

    #[tokio::test]
    async fn a_schema_of_another_format_is_not_the_rows_fault() {
        let fake = Fake::new(
            "orders-value",
            3,
            "PROTOBUF",
            "syntax = \"proto3\"; message M {}",
        );
        let out = encoder(&fake, Duration::ZERO)
            .encode_rows(vec![Ok(vec![message(b"{}")])])
            .await;
        assert!(
            matches!(&out[0], Err(TransformFailure::SchemaUnavailable(e))
                if e.contains("holds a PROTOBUF schema, but value_format is avro")),
            "{:?}",
            out[0]
        );
    }

    #[tokio::test]
    async fn a_plan_the_encoder_does_not_know_fails_the_row_closed() {
        let fake = Fake::new("orders-value", 3, "AVRO", ORDER);
        let mut stray = message(b"{\"id\": 1}");
        stray.encoding = Some(Encoding::new(Arc::new("not a MessageFormats".to_owned())));
        let out = encoder(&fake, Duration::ZERO)
            .encode_rows(vec![Ok(vec![stray])])
            .await;
        assert!(
            matches!(&out[0], Err(TransformFailure::SchemaUnavailable(e))
                if e.contains("is not a schema encoding")),
            "never published unencoded: {:?}",
            out[0]
        );
    }
}
