//! The per-plugin-section format keys (`value_format`, `key_format`, `subject_strategy`, …) as
//! written, and resolved into what the encoder needs per tenant.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Deserializer};

use crate::problem::Problem;
use crate::setting_group::setting_group;

/// What the bytes of a message's key or value are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// Published as the plugin returned them (the default).
    Raw,
    /// The plugin's JSON, encoded as Avro binary against the subject's schema.
    Avro,
    /// The plugin's JSON (proto3 JSON mapping), encoded as a Protobuf message.
    Protobuf,
    /// The plugin's JSON, validated against the subject's JSON Schema.
    JsonSchema,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "raw" => Ok(Format::Raw),
            "avro" => Ok(Format::Avro),
            "protobuf" => Ok(Format::Protobuf),
            "json-schema" => Ok(Format::JsonSchema),
            other => Err(format!(
                "unknown format {other:?}: raw, avro, protobuf or json-schema"
            )),
        }
    }
}

impl Format {
    /// The registry's `schemaType` of this format (`None`: raw).
    pub fn schema_type(self) -> Option<&'static str> {
        match self {
            Format::Raw => None,
            Format::Avro => Some("AVRO"),
            Format::Protobuf => Some("PROTOBUF"),
            Format::JsonSchema => Some("JSON"),
        }
    }

    /// As written in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Avro => "avro",
            Format::Protobuf => "protobuf",
            Format::JsonSchema => "json-schema",
        }
    }
}

/// How a message's subject is named (Confluent's `subject.name.strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubjectStrategy {
    /// `<topic>-value` / `<topic>-key` (the default).
    #[default]
    TopicName,
    /// The record's full name (`value_record`/`key_record`).
    RecordName,
    /// `<topic>-<record full name>`.
    TopicRecordName,
}

/// Which version of a subject's schema encodes: the latest (re-read after `latest_ttl`) or a
/// pinned one. Written `"latest"` or a version number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SchemaVersion {
    /// The subject's latest version.
    #[default]
    Latest,
    /// This version of the subject.
    Pinned(u32),
}

impl<'de> Deserialize<'de> for SchemaVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(i64),
            Text(String),
        }
        match Written::deserialize(d)? {
            Written::Text(t) if t == "latest" => Ok(SchemaVersion::Latest),
            Written::Number(n) if n >= 1 && n <= i64::from(u32::MAX) => {
                Ok(SchemaVersion::Pinned(n as u32))
            }
            Written::Number(n) => Err(serde::de::Error::custom(format!(
                "schema version {n} is not a registry version (1 or more)"
            ))),
            Written::Text(t) => Err(serde::de::Error::custom(format!(
                "schema version {t:?}: write \"latest\" or a version number"
            ))),
        }
    }
}

/// Key or value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// The message key.
    Key,
    /// The message value (payload).
    Value,
}

impl Field {
    /// `key` or `value`, as in subject names and config keys.
    pub fn name(self) -> &'static str {
        match self {
            Field::Key => "key",
            Field::Value => "value",
        }
    }
}

setting_group! {
    /// The format keys of one plugin section as written (unset: inherited from
    /// `[plugins.default]`, then raw); [`FormatsSpec::resolve`] checks them together.
    pub struct FormatsSpec => FormatValues {
        /// `raw` publishes the plugin's bytes as they are; `avro`, `protobuf` and `json-schema` encode the plugin's JSON against the subject's schema from `[schema_registry]`, in Confluent's wire format ([schema-registry.md](schema-registry.md)). Inherited by every tenant that does not set it.
        value_format: Format = Format::Raw => "`\"raw\"`";
        /// As `value_format`, for the message key.
        key_format: Format = Format::Raw => "`\"raw\"`";
        /// `topic-name` (`<topic>-value`), `record-name`, `topic-record-name` ([schema-registry.md](schema-registry.md#configuration)).
        subject_strategy: SubjectStrategy = SubjectStrategy::TopicName => "`\"topic-name\"`";
        /// The record's (Protobuf message's) full name, for the record strategies and to pick a Protobuf message.
        value_record: String => "—";
        /// As `value_record`, for the key.
        key_record: String => "—";
        /// `"latest"` (re-read after `latest_ttl`) or a version number.
        value_schema_version: SchemaVersion = SchemaVersion::Latest => "`\"latest\"`";
        /// As `value_schema_version`, for the key.
        key_schema_version: SchemaVersion = SchemaVersion::Latest => "`\"latest\"`";
        /// A schema file, looked up under the subject (or registered with `auto_register`).
        value_schema: PathBuf => "—";
        /// As `value_schema`, for the key.
        key_schema: PathBuf => "—";
        /// Register `value_schema`/`key_schema` under the subject — or, without a file, the schema the plugin declares for the record.
        auto_register: bool = false => "`false`";
    }
}

impl FormatsSpec {
    /// Whether any of key and value is encoded.
    pub fn encodes(&self) -> bool {
        [self.value_format, self.key_format]
            .iter()
            .any(|f| matches!(f, Some(f) if *f != Format::Raw))
    }

    /// Resolves relative schema file paths against the config file's directory.
    pub fn resolve_paths(value: &mut Option<PathBuf>, base: &Path) {
        if let Some(p) = value
            && p.is_relative()
        {
            *p = base.join(&*p);
        }
    }

    /// Checks the keys and reads the schema files: what the encoder needs, or the problems
    /// (each at `key` + sub-key). `None`: key and value are both raw.
    pub fn resolve(&self, key: &str) -> Result<Option<Arc<MessageFormats>>, Vec<Problem>> {
        let mut problems = Vec::new();
        let value = self.field(key, Field::Value, &mut problems);
        let message_key = self.field(key, Field::Key, &mut problems);
        if !problems.is_empty() {
            return Err(problems);
        }
        if value.is_none() && message_key.is_none() {
            return Ok(None);
        }
        Ok(Some(Arc::new(MessageFormats {
            key: message_key,
            value,
            declared: DeclaredSchemas::default(),
        })))
    }

    fn field(&self, key: &str, field: Field, problems: &mut Vec<Problem>) -> Option<FieldEncoding> {
        let values = self.values();
        // `version` as written (is it set?), `version_used` with its default.
        let (format, record, version, version_used, schema) = match field {
            Field::Value => (
                values.value_format,
                &self.value_record,
                self.value_schema_version,
                values.value_schema_version,
                &self.value_schema,
            ),
            Field::Key => (
                values.key_format,
                &self.key_record,
                self.key_schema_version,
                values.key_schema_version,
                &self.key_schema,
            ),
        };
        let name = field.name();
        let format = match format {
            Format::Raw => {
                for (set, sub) in [
                    (record.is_some(), "record"),
                    (version.is_some(), "schema_version"),
                    (schema.is_some(), "schema"),
                ] {
                    if set {
                        problems.push(Problem::new(
                            format!("{key}.{name}_{sub}"),
                            format!("has no effect while {name}_format is raw"),
                        ));
                    }
                }
                return None;
            }
            f => f,
        };
        let strategy = values.subject_strategy;
        if strategy != SubjectStrategy::TopicName && record.is_none() {
            problems.push(Problem::new(
                format!("{key}.{name}_record"),
                format!(
                    "missing: subject_strategy {:?} names subjects after the record \
                     (e.g. {name}_record = \"com.acme.OrderCreated\")",
                    strategy_name(strategy)
                ),
            ));
        }
        if let Some(r) = record
            && r.trim().is_empty()
        {
            problems.push(Problem::new(format!("{key}.{name}_record"), "is empty"));
        }
        let auto_register = values.auto_register;
        let schema_text = match schema {
            Some(path) => match std::fs::read_to_string(path) {
                Ok(text) => Some(Arc::<str>::from(text)),
                Err(e) => {
                    problems.push(Problem::new(
                        format!("{key}.{name}_schema"),
                        format!("cannot read {}: {e}", path.display()),
                    ));
                    None
                }
            },
            None => None,
        };
        if auto_register && matches!(version, Some(SchemaVersion::Pinned(_))) {
            problems.push(Problem::new(
                format!("{key}.{name}_schema_version"),
                "a pinned version cannot be combined with auto_register = true",
            ));
        }
        Some(FieldEncoding {
            format,
            field,
            strategy,
            record: record.clone(),
            version: version_used,
            auto_register,
            schema: schema_text,
        })
    }
}

fn strategy_name(s: SubjectStrategy) -> &'static str {
    match s {
        SubjectStrategy::TopicName => "topic-name",
        SubjectStrategy::RecordName => "record-name",
        SubjectStrategy::TopicRecordName => "topic-record-name",
    }
}

/// How one tenant's messages are encoded: `None` fields are raw.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageFormats {
    /// How the key is encoded (`None`: raw).
    pub key: Option<FieldEncoding>,
    /// How the value is encoded (`None`: raw).
    pub value: Option<FieldEncoding>,
    /// The schemas the tenant's plugin declares (filled when the plugin first runs): what
    /// `auto_register` registers when the section names no schema file.
    pub declared: DeclaredSchemas,
}

/// A schema a plugin ships for a record it emits (contract 0.2.0 `plugin-info.schemas`).
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredSchema {
    /// The record's (Protobuf: message's) full name.
    pub record: String,
    /// How the schema is written.
    pub format: Format,
    /// The schema text.
    pub schema: Arc<str>,
}

/// A plugin's declared schemas, set once by its first instance.
pub type DeclaredSchemas = Arc<std::sync::OnceLock<Vec<DeclaredSchema>>>;

impl MessageFormats {
    /// The declared schema to register for `enc` (a message's field): the one of its format
    /// named by its record, or, without a record, the only one of its format.
    pub fn declared_for(&self, enc: &FieldEncoding) -> Option<Arc<str>> {
        let declared = self.declared.get()?;
        let mut of_format = declared.iter().filter(|d| d.format == enc.format);
        let found = match &enc.record {
            Some(record) => of_format.find(|d| &d.record == record),
            None => match (of_format.next(), of_format.next()) {
                (Some(only), None) => Some(only),
                _ => None,
            },
        };
        found.map(|d| Arc::clone(&d.schema))
    }

    /// `enc` with the plugin's declared schema to register, when it registers
    /// (`auto_register`) and the section names no schema file.
    pub fn with_declared<'a>(&self, enc: Cow<'a, FieldEncoding>) -> Cow<'a, FieldEncoding> {
        if !enc.auto_register || enc.schema.is_some() {
            return enc;
        }
        match self.declared_for(&enc) {
            Some(schema) => Cow::Owned(FieldEncoding {
                schema: Some(schema),
                ..enc.into_owned()
            }),
            None => enc,
        }
    }
}

/// How a message's key or value is encoded.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldEncoding {
    /// Never [`Format::Raw`].
    pub format: Format,
    /// Key or value.
    pub field: Field,
    /// How the subject is named.
    pub strategy: SubjectStrategy,
    /// The record's full name (Avro record, Protobuf message), for the record strategies and
    /// to pick a Protobuf message other than the file's first.
    pub record: Option<String>,
    /// Which version of the subject's schema.
    pub version: SchemaVersion,
    /// Register `schema` (or, without one, the schema the plugin declares for the record)
    /// under the subject instead of reading the subject's versions.
    pub auto_register: bool,
    /// The schema file's text (`value_schema`/`key_schema`).
    pub schema: Option<Arc<str>>,
}

impl FieldEncoding {
    /// This encoding with the record a message named (contract 0.2.0 `value-record` /
    /// `key-record`) in place of the section's.
    pub fn naming(&self, record: Option<&str>) -> std::borrow::Cow<'_, FieldEncoding> {
        match record {
            Some(r) if self.record.as_deref() != Some(r) => {
                std::borrow::Cow::Owned(FieldEncoding {
                    record: Some(r.to_owned()),
                    ..self.clone()
                })
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }

    /// The registry subject of a message to `topic`.
    pub fn subject(&self, topic: &str) -> String {
        let record = self.record.as_deref().unwrap_or_default();
        match self.strategy {
            SubjectStrategy::TopicName => format!("{topic}-{}", self.field.name()),
            SubjectStrategy::RecordName => record.to_owned(),
            SubjectStrategy::TopicRecordName => format!("{topic}-{record}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: Format) -> FormatsSpec {
        FormatsSpec {
            value_format: Some(value),
            ..FormatsSpec::default()
        }
    }

    #[test]
    fn subjects_follow_confluents_strategies() {
        let mut spec = spec(Format::Avro);
        let topic_name = spec.resolve("t").unwrap().unwrap();
        assert_eq!(
            topic_name.value.as_ref().unwrap().subject("orders"),
            "orders-value"
        );
        assert!(topic_name.key.is_none());
        spec.value_record = Some("com.acme.OrderCreated".into());
        spec.subject_strategy = Some(SubjectStrategy::RecordName);
        let value = spec.resolve("t").unwrap().unwrap().value.clone().unwrap();
        assert_eq!(value.subject("orders"), "com.acme.OrderCreated");
        spec.subject_strategy = Some(SubjectStrategy::TopicRecordName);
        let value = spec.resolve("t").unwrap().unwrap().value.clone().unwrap();
        assert_eq!(value.subject("orders"), "orders-com.acme.OrderCreated");
    }

    #[test]
    fn raw_everywhere_needs_no_encoder_and_stray_keys_are_named() {
        assert!(matches!(
            FormatsSpec::default().resolve("plugins.default"),
            Ok(None)
        ));
        let stray = FormatsSpec {
            value_record: Some("X".into()),
            ..FormatsSpec::default()
        };
        let problems = stray.resolve("tenants.a").unwrap_err();
        assert_eq!(problems[0].key, "tenants.a.value_record");
    }

    #[test]
    fn record_strategies_need_a_record() {
        let spec = FormatsSpec {
            value_format: Some(Format::Protobuf),
            subject_strategy: Some(SubjectStrategy::RecordName),
            auto_register: Some(true),
            ..FormatsSpec::default()
        };
        let keys: Vec<String> = spec
            .resolve("tenants.a")
            .unwrap_err()
            .into_iter()
            .map(|p| p.key)
            .collect();
        // auto_register without a file registers what the plugin declares: not a problem.
        assert_eq!(keys, ["tenants.a.value_record"], "{keys:?}");
    }

    #[test]
    fn a_tenant_inherits_each_unset_key() {
        let default = FormatsSpec {
            value_format: Some(Format::Avro),
            subject_strategy: Some(SubjectStrategy::TopicName),
            ..FormatsSpec::default()
        };
        let own = FormatsSpec {
            key_format: Some(Format::Avro),
            value_format: Some(Format::Raw),
            ..FormatsSpec::default()
        };
        let merged = own.or(&default);
        assert_eq!(merged.value_format, Some(Format::Raw));
        assert_eq!(merged.key_format, Some(Format::Avro));
        assert_eq!(merged.subject_strategy, Some(SubjectStrategy::TopicName));
    }

    #[test]
    fn versions_are_latest_or_a_number() {
        #[derive(Deserialize)]
        struct V {
            v: SchemaVersion,
        }
        let v: V = toml::from_str("v = \"latest\"").unwrap();
        assert_eq!(v.v, SchemaVersion::Latest);
        let v: V = toml::from_str("v = 3").unwrap();
        assert_eq!(v.v, SchemaVersion::Pinned(3));
        assert!(toml::from_str::<V>("v = 0").is_err());
        assert!(toml::from_str::<V>("v = \"newest\"").is_err());
    }

    #[test]
    fn a_declared_schema_is_found_by_record_or_as_the_only_one_of_its_format() {
        let mut spec = spec(Format::Avro);
        spec.auto_register = Some(true);
        let formats = spec.resolve("t").unwrap().unwrap();
        let value = formats.value.clone().unwrap();
        let declared = |record: &str, format| DeclaredSchema {
            record: record.into(),
            format,
            schema: Arc::from(format!("schema of {record}")),
        };
        // Nothing declared (yet): the section's own lookup stays.
        assert_eq!(formats.with_declared(Cow::Borrowed(&value)).schema, None);
        let _ = formats.declared.set(vec![
            declared("a.Created", Format::Avro),
            declared("a.Proto", Format::Protobuf),
        ]);
        let only = formats.with_declared(Cow::Borrowed(&value));
        assert_eq!(
            only.schema.as_deref(),
            Some("schema of a.Created"),
            "the only Avro one"
        );
        let named = formats.with_declared(value.naming(Some("a.Created")));
        assert_eq!(named.schema.as_deref(), Some("schema of a.Created"));
        let unknown = formats.with_declared(value.naming(Some("a.Shipped")));
        assert_eq!(
            unknown.schema, None,
            "no schema for a record the plugin did not declare"
        );
        // Without auto_register nothing is registered, declared or not.
        let mut plain = value.clone();
        plain.auto_register = false;
        assert_eq!(formats.with_declared(Cow::Borrowed(&plain)).schema, None);
    }
}
