//! `[schema_registry]` and the per-plugin-section format keys (`value_format`, `key_format`,
//! `subject_strategy`, …) as written, and resolved into what the encoder needs per tenant.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::problem::Problem;

/// How long a subject's latest version is trusted before it is asked for again.
pub const DEFAULT_LATEST_TTL: Duration = Duration::from_secs(60);
/// Budget of one registry request (connect + answer).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// `[schema_registry]`: a Confluent-compatible Schema Registry (Confluent, Karapace, Apicurio's
/// `ccompat` API, Redpanda).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// Base URL, e.g. `http://registry:8081` (a path prefix is kept: Apicurio serves the
    /// Confluent API under `/apis/ccompat/v7`).
    pub url: String,
    /// Basic authentication (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    /// Basic authentication (with `username`); `${file:…}` keeps it out of the file.
    #[serde(default)]
    pub password: Option<String>,
    /// Bearer authentication instead of basic.
    #[serde(default)]
    pub bearer_token: Option<String>,
    /// Budget of one request, e.g. `"5s"`.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// PEM file of the CA that signed the registry's certificate (`https://` URLs), trusted in
    /// addition to the system's.
    #[serde(default)]
    pub ca_location: Option<PathBuf>,
    /// How long a subject's latest version is used before the registry is asked again: a
    /// newly registered version is picked up within it.
    #[serde(default = "default_latest_ttl", with = "humantime_serde")]
    pub latest_ttl: Duration,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

fn default_latest_ttl() -> Duration {
    DEFAULT_LATEST_TTL
}

impl RegistrySettings {
    /// Values that cannot work, each with its key.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        match reqwest::Url::parse(&self.url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            Ok(url) => problems.push(Problem::new(
                "schema_registry.url",
                format!("scheme {:?} is not http or https", url.scheme()),
            )),
            Err(e) => problems.push(Problem::new(
                "schema_registry.url",
                format!("not a URL ({e})"),
            )),
        }
        if self.username.is_some() != self.password.is_some() {
            problems.push(Problem::new(
                "schema_registry.username",
                "basic authentication needs both username and password",
            ));
        }
        if self.bearer_token.is_some() && self.username.is_some() {
            problems.push(Problem::new(
                "schema_registry.bearer_token",
                "set either bearer_token or username/password, not both",
            ));
        }
        if self.timeout.is_zero() {
            problems.push(Problem::new("schema_registry.timeout", "must be above 0"));
        }
        problems
    }
}

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

/// The format keys of one plugin section as written (unset: inherited from
/// `[plugins.default]`, then raw).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FormatsSpec {
    /// `value_format`.
    pub value_format: Option<Format>,
    /// `key_format`.
    pub key_format: Option<Format>,
    /// `subject_strategy`.
    pub subject_strategy: Option<SubjectStrategy>,
    /// `value_record`.
    pub value_record: Option<String>,
    /// `key_record`.
    pub key_record: Option<String>,
    /// `value_schema_version`.
    pub value_schema_version: Option<SchemaVersion>,
    /// `key_schema_version`.
    pub key_schema_version: Option<SchemaVersion>,
    /// `value_schema`.
    pub value_schema: Option<PathBuf>,
    /// `key_schema`.
    pub key_schema: Option<PathBuf>,
    /// `auto_register`.
    pub auto_register: Option<bool>,
}

impl FormatsSpec {
    /// Fills unset keys from `fallback`.
    pub fn or(self, fallback: &FormatsSpec) -> FormatsSpec {
        FormatsSpec {
            value_format: self.value_format.or(fallback.value_format),
            key_format: self.key_format.or(fallback.key_format),
            subject_strategy: self.subject_strategy.or(fallback.subject_strategy),
            value_record: self.value_record.or_else(|| fallback.value_record.clone()),
            key_record: self.key_record.or_else(|| fallback.key_record.clone()),
            value_schema_version: self.value_schema_version.or(fallback.value_schema_version),
            key_schema_version: self.key_schema_version.or(fallback.key_schema_version),
            value_schema: self.value_schema.or_else(|| fallback.value_schema.clone()),
            key_schema: self.key_schema.or_else(|| fallback.key_schema.clone()),
            auto_register: self.auto_register.or(fallback.auto_register),
        }
    }

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
        let (format, record, version, schema) = match field {
            Field::Value => (
                self.value_format,
                &self.value_record,
                self.value_schema_version,
                &self.value_schema,
            ),
            Field::Key => (
                self.key_format,
                &self.key_record,
                self.key_schema_version,
                &self.key_schema,
            ),
        };
        let name = field.name();
        let format = match format {
            None | Some(Format::Raw) => {
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
            Some(f) => f,
        };
        let strategy = self.subject_strategy.unwrap_or_default();
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
        let auto_register = self.auto_register.unwrap_or(false);
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
            version: version.unwrap_or_default(),
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
