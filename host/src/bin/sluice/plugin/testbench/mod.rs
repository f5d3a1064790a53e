//! `sluice plugin test`: exercise a plugin file without a database or broker. Rows come in
//! as JSON lines with the outbox columns; messages go out as JSON lines, which `--expect`
//! compares with a golden file ([`diff_expected`]).

mod diff;

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use sluice::config::Config;
use sluice::encoding::registry::settings::DEFAULT_LATEST_TTL;
use sluice::encoding::{
    Encoder, FileSchemas, FormatsSpec, MessageFormats, RegistryClient, RegistrySettings,
    SchemaEncoder, SchemaSource,
};
use sluice::model::OutboundMessage;
use sluice::model::{ColumnValue, OutboxId, OutboxRow, RowResult, TenantId, TransformFailure};
use sluice::plugin::{PluginRouter, PluginSource, PluginSpec, PluginsSettings, RowTransformer};

pub(crate) use diff::unified as diff_expected;

/// Counts of a `plugin test` run.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TestSummary {
    pub rows: usize,
    pub messages: usize,
    pub failed_rows: usize,
    /// Input lines that were not valid rows (reported on the output, not run).
    pub invalid_lines: usize,
}

/// One input line: the outbox columns. Only `aggregate_type`, `aggregate_id` and `event_type`
/// are required. `payload` is any JSON value and reaches the plugin as its JSON text (as a
/// `jsonb` column would); `payload_text` / `payload_base64` give text or raw bytes instead.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputRow {
    /// A JSON number (an integer key) or string (a uuid, a ULID …), as the table's key.
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    tenant: Option<String>,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    #[serde(default)]
    payload: Option<Value>,
    #[serde(default)]
    payload_text: Option<String>,
    #[serde(default)]
    payload_base64: Option<String>,
    #[serde(default)]
    headers: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    attempts: Option<i32>,
    /// The extra columns (`[database.columns] extra`), in name order: strings are
    /// text, integers and other numbers integers and floats, `true`/`false` booleans, `null`
    /// NULL, `{"timestamp": "RFC 3339"}` a timestamp, `{"base64": "…"}` bytes, and any other
    /// object or array JSON.
    #[serde(default)]
    extra: Option<serde_json::Map<String, Value>>,
}

/// An input row's extra column value (see [`InputRow::extra`]).
fn extra_value(name: &str, value: Value) -> Result<ColumnValue, String> {
    Ok(match value {
        Value::Null => ColumnValue::Null,
        Value::Bool(b) => ColumnValue::Boolean(b),
        Value::String(s) => ColumnValue::Text(s),
        Value::Number(n) => match n.as_i64() {
            Some(i) => ColumnValue::Integer(i),
            None => ColumnValue::Float(n.as_f64().unwrap_or_default()),
        },
        Value::Object(o) if o.len() == 1 && o.contains_key("timestamp") => {
            let at = o["timestamp"].as_str().unwrap_or_default();
            let at = DateTime::parse_from_rfc3339(at)
                .map_err(|e| format!("extra: {name}: timestamp {at:?}: {e}"))?;
            ColumnValue::Timestamp(at.with_timezone(&Utc))
        }
        Value::Object(o) if o.len() == 1 && o.contains_key("base64") => {
            let b = o["base64"].as_str().unwrap_or_default();
            ColumnValue::Bytes(
                BASE64
                    .decode(b)
                    .map_err(|e| format!("extra: {name}: base64: {e}"))?,
            )
        }
        json => ColumnValue::Json(json.to_string()),
    })
}

/// What `sluice plugin test` runs: a plugin, its config, and the limits and call grouping
/// that `sluice run` would give it — on their own, or on top of a tenant of a `sluice.toml`.
#[derive(Debug, Clone)]
pub(crate) struct TestOptions {
    /// The plugin; with `tenant`, replaces the tenant's (e.g. a new build of it).
    pub source: Option<PluginSource>,
    /// `configure` pairs; with `tenant`, added to (and overriding) the tenant's `config`.
    pub config: Vec<(String, String)>,
    /// `memory_mb`; default as in `sluice.toml`.
    pub memory_mb: Option<u64>,
    /// `call_timeout`; default as in `sluice.toml`.
    pub call_timeout: Option<Duration>,
    /// `recycle_memory_percent`; default as in `sluice.toml`.
    pub recycle_memory_percent: Option<u8>,
    /// Rows per plugin call from the first row on (1: `transform` row by row); `None`: as
    /// the relay does (row by row for a probation, then `transform-batch` chunks).
    pub batch_size: Option<usize>,
    /// Run every row as this tenant of a `sluice.toml`.
    pub tenant: Option<ConfiguredTenant>,
    /// `--value-format`, `--value-schema`, … : on top of the tenant's format keys.
    pub formats: FormatsSpec,
}

/// A tenant of a `sluice.toml` as `sluice run` resolves it: its own `[tenants.<name>]` entry
/// completed from `[plugins.default]` ([`PluginSpec::inherit`]), or — for a name without an
/// entry — `[plugins.default]` itself.
#[derive(Debug, Clone)]
pub(crate) struct ConfiguredTenant {
    pub name: String,
    /// The resolved plugin, config and limits.
    pub spec: PluginSpec,
    /// Whether the file has a `[tenants.<name>]` entry (else the default plugin runs).
    pub configured: bool,
    /// The file's `[plugins]` (its compile cache, instance cap).
    plugins: PluginsSettings,
    /// The file's `[schema_registry]`, for a tenant whose messages are encoded.
    registry: Option<RegistrySettings>,
}

impl ConfiguredTenant {
    /// Tenant `name` of `config`. Problems of the file's `[plugins]` and of this tenant's
    /// entry are errors; the rest of the file (database, broker) is not needed here.
    pub(crate) fn of(config: &Config, name: &str) -> anyhow::Result<Self> {
        let own_key = format!("tenants.{name}");
        let problems: Vec<String> = config
            .problems()
            .into_iter()
            .filter(|p| {
                p.key.starts_with("plugins")
                    || p.key == own_key
                    || p.key.starts_with(&format!("{own_key}."))
            })
            .map(|p| p.to_string())
            .collect();
        if !problems.is_empty() {
            anyhow::bail!("{}", problems.join("; "));
        }
        let default = config.plugins.default.as_ref();
        let (spec, configured) = match config.tenants.get(name) {
            Some(entry) => (entry.inherit(default), true),
            None => match default {
                Some(default) => (default.clone(), false),
                None => anyhow::bail!(
                    "tenant {name:?} has no [tenants.{name}] entry and there is no \
                     [plugins.default]: sluice run has no plugin for its rows"
                ),
            },
        };
        Ok(Self {
            name: name.to_owned(),
            spec,
            configured,
            plugins: config.plugins.clone(),
            registry: config.schema_registry.clone(),
        })
    }
}

impl TestOptions {
    /// The plugin entry these options amount to: the tenant's, or a plain one, with the
    /// options on top.
    fn spec(&self) -> anyhow::Result<PluginSpec> {
        let mut spec = match &self.tenant {
            Some(tenant) => tenant.spec.clone(),
            None => PluginSpec::default(),
        };
        match &self.source {
            Some(PluginSource::Wasm(path)) => {
                (spec.path, spec.builtin) = (Some(path.clone()), None)
            }
            Some(PluginSource::Builtin(name)) => {
                (spec.path, spec.builtin) = (None, Some(name.clone()))
            }
            None if spec.source().is_none() => {
                anyhow::bail!("no plugin: give a plugin file, --builtin NAME or a tenant")
            }
            None => {}
        }
        let config = spec.config.get_or_insert_with(Default::default);
        for (k, v) in &self.config {
            config.insert(k.clone(), toml::Value::String(v.clone()));
        }
        spec.limits.memory_mb = self.memory_mb.or(spec.limits.memory_mb);
        spec.limits.call_timeout = self.call_timeout.or(spec.limits.call_timeout);
        spec.limits.recycle_memory_percent = self
            .recycle_memory_percent
            .or(spec.limits.recycle_memory_percent);
        spec.call_batch_rows = self.batch_size;
        spec.formats = self.formats.clone().or(&spec.formats);
        Ok(spec)
    }

    /// What encodes the messages, when the spec asks for it: the schema files given on the
    /// command line (no registry), else the config file's registry, else the spec's own
    /// schema files.
    fn encoder(&self, spec: &PluginSpec) -> anyhow::Result<Option<SchemaEncoder>> {
        let formats = &spec.formats;
        if !formats.encodes() {
            return Ok(None);
        }
        if let Err(problems) = formats.resolve("plugin") {
            let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
            anyhow::bail!("{}", problems.join("; "));
        }
        let from_files = self.formats.value_schema.is_some() || self.formats.key_schema.is_some();
        let registry = self.tenant.as_ref().and_then(|t| t.registry.as_ref());
        let source: Arc<dyn SchemaSource> = match registry {
            Some(settings) if !from_files => {
                Arc::new(RegistryClient::new(settings).map_err(anyhow::Error::msg)?)
            }
            _ => Arc::new(FileSchemas),
        };
        Ok(Some(SchemaEncoder::new(source, DEFAULT_LATEST_TTL)))
    }

    /// The plugin settings the router starts from: a tenant with its own entry runs as a
    /// configured tenant, as in `sluice run`; anything else runs the spec as
    /// `[plugins.default]`.
    fn settings(&self, spec: PluginSpec) -> (PluginsSettings, BTreeMap<String, PluginSpec>) {
        let mut settings = PluginsSettings {
            // A plugin that cannot start is the answer, not a quarantine to wait out.
            strict_startup: true,
            ..PluginsSettings::default()
        };
        if let Some(tenant) = &self.tenant {
            // The file's compile cache, as `sluice run` would use.
            settings.cache_dir = tenant.plugins.cache_dir.clone();
            settings.cache_max_mb = tenant.plugins.cache_max_mb;
        }
        match &self.tenant {
            Some(tenant) if tenant.configured => {
                (settings, BTreeMap::from([(tenant.name.clone(), spec)]))
            }
            _ => (
                PluginsSettings {
                    default: Some(spec),
                    ..settings
                },
                BTreeMap::new(),
            ),
        }
    }
}

/// Rows handed to the router at once: the default `relay.batch_size`, so time budgets and
/// `transform-batch` chunks fall as they would in `sluice run`.
const ROWS_PER_TRANSFORM: usize = 500;
/// Rounds of putting deferred rows back before giving up on them (each round runs at least
/// one row, so only a stuck plugin gets here).
const MAX_DEFER_ROUNDS: usize = 10_000;

/// What one input line became, in input order.
enum Entry {
    Invalid { line: usize, message: String },
    Row(OutboxRow),
}

/// Runs every row of `input` through the plugin — on the relay's own code path (the plugin
/// router and a tenant runner: `transform-batch` chunks, output checks, limits, circuit
/// breaker, builtins) — and writes one JSON line per output message, per filtered row, per
/// failed row and per invalid input line, in input order. Rows without a `tenant` run as
/// rows without a tenant do in `sluice run`; each named tenant gets its own instance.
pub(crate) fn run(
    options: &TestOptions,
    input: impl BufRead,
    mut out: impl Write,
) -> anyhow::Result<TestSummary> {
    let spec = options.spec()?;
    if let Some(problem) = spec.problems("plugin", true).into_iter().next() {
        anyhow::bail!("{problem}");
    }
    let encoder = options.encoder(&spec)?;
    let (settings, tenants) = options.settings(spec);
    let router = PluginRouter::from_settings(&settings, &tenants)?;
    let tenant = options.tenant.as_ref().map(|t| t.name.as_str());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut summary = TestSummary::default();
    let mut chunk: Vec<Entry> = Vec::new();
    let mut rows_in_chunk = 0;
    for (n, line) in input.lines().enumerate() {
        let line_no = n + 1;
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match parse_row(&line, line_no, tenant) {
            Ok(row) => {
                chunk.push(Entry::Row(row));
                rows_in_chunk += 1;
            }
            Err(message) => chunk.push(Entry::Invalid {
                line: line_no,
                message,
            }),
        }
        if rows_in_chunk == ROWS_PER_TRANSFORM {
            run_chunk(
                &runtime,
                &router,
                encoder.as_ref(),
                std::mem::take(&mut chunk),
                &mut summary,
                &mut out,
            )?;
            rows_in_chunk = 0;
        }
    }
    run_chunk(
        &runtime,
        &router,
        encoder.as_ref(),
        chunk,
        &mut summary,
        &mut out,
    )?;
    Ok(summary)
}

/// Transforms the rows of `chunk` (putting deferred rows back, as the relay's next batch
/// would take them) and writes every entry's lines.
fn run_chunk(
    runtime: &tokio::runtime::Runtime,
    router: &PluginRouter,
    encoder: Option<&SchemaEncoder>,
    chunk: Vec<Entry>,
    summary: &mut TestSummary,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let rows: Vec<&OutboxRow> = chunk
        .iter()
        .filter_map(|e| match e {
            Entry::Row(row) => Some(row),
            Entry::Invalid { .. } => None,
        })
        .collect();
    let mut results: Vec<Option<RowResult>> = (0..rows.len()).map(|_| None).collect();
    let mut pending: Vec<usize> = (0..rows.len()).collect();
    for _ in 0..MAX_DEFER_ROUNDS {
        if pending.is_empty() {
            break;
        }
        let batch: Arc<[OutboxRow]> = pending.iter().map(|&i| rows[i].clone()).collect();
        let outcome = runtime.block_on(router.transform(batch));
        let mut deferred = Vec::new();
        for (index, result) in pending.into_iter().zip(outcome) {
            match result {
                Err(TransformFailure::Deferred(_)) => deferred.push(index),
                other => results[index] = Some(other),
            }
        }
        pending = deferred;
    }
    let results: Vec<RowResult> = results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(TransformFailure::Unavailable(
                    "deferred again and again: the plugin made no progress".into(),
                ))
            })
        })
        .collect();
    // Encoded as the relay does between plugin and sink.
    let results = match encoder {
        Some(encoder) => runtime.block_on(encoder.encode_rows(results)),
        None => results,
    };
    let mut results = results.into_iter();
    for entry in &chunk {
        match entry {
            Entry::Invalid { line, message } => {
                summary.invalid_lines += 1;
                writeln!(out, "{}", json!({ "line": line, "error": message }))?;
            }
            Entry::Row(row) => {
                summary.rows += 1;
                let result = results
                    .next()
                    .unwrap_or_else(|| Err(TransformFailure::Unavailable("no result".into())));
                write_result(row, result, summary, out)?;
            }
        }
    }
    Ok(())
}

fn write_result(
    row: &OutboxRow,
    result: RowResult,
    summary: &mut TestSummary,
    out: &mut impl Write,
) -> std::io::Result<()> {
    match result {
        Ok(messages) if messages.is_empty() => {
            writeln!(out, "{}", json!({ "row": row.id, "filtered": true }))
        }
        Ok(messages) => {
            summary.messages += messages.len();
            for m in &messages {
                writeln!(out, "{}", message_json(m))?;
            }
            Ok(())
        }
        Err(failure) => {
            summary.failed_rows += 1;
            // Scrubbed as `last_error` is: with `--tenant`, the plugin's config may hold
            // secrets that an error quotes.
            let error = sluice::secret::scrub(&failure.to_string()).into_owned();
            writeln!(
                out,
                "{}",
                json!({ "row": row.id, "error": error, "kind": kind(&failure) })
            )
        }
    }
}

fn kind(failure: &TransformFailure) -> &'static str {
    match failure {
        TransformFailure::Retryable { .. } => "retryable",
        TransformFailure::Permanent { .. } => "permanent",
        TransformFailure::Trapped(_) | TransformFailure::DeadlineExceeded(_) => "trap",
        TransformFailure::InvalidOutput(_) => "invalid-output",
        TransformFailure::SchemaMismatch(_) => "schema-mismatch",
        TransformFailure::SchemaUnavailable(_)
        | TransformFailure::NoPlugin(_)
        | TransformFailure::Unavailable(_)
        | TransformFailure::Paused { .. }
        | TransformFailure::Deferred(_) => "unavailable",
    }
}

/// One input line as a row; `tenant`: the tenant every row runs as (`--tenant`), which a
/// row's own `tenant` may only repeat.
fn parse_row(line: &str, line_no: usize, tenant: Option<&str>) -> Result<OutboxRow, String> {
    let input: InputRow =
        serde_json::from_str(line).map_err(|e| format!("line {line_no}: invalid row: {e}"))?;
    let id = match input.id {
        None => OutboxId::Int(line_no as i64),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(n) => OutboxId::Int(n),
            None => {
                return Err(format!(
                    "line {line_no}: id {n} is not a 64-bit integer (write it as a string)"
                ));
            }
        },
        Some(Value::String(s)) => OutboxId::Text(s.into()),
        Some(other) => {
            return Err(format!(
                "line {line_no}: id must be a number or a string, got {other}"
            ));
        }
    };
    let tenant = match (tenant, input.tenant) {
        (Some(forced), Some(own)) if own != forced => {
            return Err(format!(
                "line {line_no}: tenant {own:?}, but every row runs as tenant {forced:?} \
                 (--tenant); leave `tenant` out"
            ));
        }
        (Some(forced), _) => Some(forced.to_owned()),
        (None, own) => own,
    };
    let payload = match (&input.payload, &input.payload_text, &input.payload_base64) {
        (Some(v), None, None) => v.to_string().into_bytes(),
        (None, Some(t), None) => t.clone().into_bytes(),
        (None, None, Some(b)) => BASE64
            .decode(b)
            .map_err(|e| format!("line {line_no}: payload_base64: {e}"))?,
        (None, None, None) => Vec::new(),
        _ => {
            return Err(format!(
                "line {line_no}: give only one of payload, payload_text, payload_base64"
            ));
        }
    };
    let headers = input
        .headers
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s.into_bytes())),
            other => Err(format!(
                "line {line_no}: headers: value of {k:?} must be a string, got {other}"
            )),
        })
        .collect::<Result<_, _>>()?;
    let extra = input
        .extra
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| {
            let value = extra_value(&name, value).map_err(|e| format!("line {line_no}: {e}"))?;
            Ok((Arc::from(name), value))
        })
        .collect::<Result<_, String>>()?;
    Ok(OutboxRow {
        id,
        tenant: TenantId::from_column(tenant),
        aggregate_type: input.aggregate_type,
        aggregate_id: input.aggregate_id,
        event_type: input.event_type,
        payload,
        headers,
        created_at: input.created_at.unwrap_or_else(Utc::now),
        attempts: input.attempts.unwrap_or(0),
        extra,
        replay: None,
    })
}

/// Bytes as a JSON string when they are UTF-8, else `{"base64": "…"}`.
fn bytes_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => Value::String(s.to_owned()),
        Err(_) => json!({ "base64": BASE64.encode(bytes) }),
    }
}

fn message_json(m: &OutboundMessage) -> Value {
    // Encoded bytes are binary even when they happen to be UTF-8: always base64.
    let encoded = |bytes: &[u8], is: bool| match is {
        true => json!({ "base64": BASE64.encode(bytes) }),
        false => bytes_json(bytes),
    };
    let formats = m.encoding.as_ref().and_then(|e| e.get::<MessageFormats>());
    let (key_encoded, value_encoded) = (
        formats.is_some_and(|f| f.key.is_some()),
        formats.is_some_and(|f| f.value.is_some()),
    );
    let mut line = json!({
        "row": m.row,
        "topic": m.topic,
        "partition": m.partition,
        "key": m.key.as_deref().map(|k| encoded(k, key_encoded)),
        "payload": m.payload.as_deref().map(|p| encoded(p, value_encoded)),
        "headers": m.headers.iter().map(|(k, v)| json!([k, bytes_json(v)])).collect::<Vec<_>>(),
    });
    // Only when the plugin set one (contract 0.3.0): older plugins' golden files stay valid.
    if let Some(ms) = m.timestamp_ms {
        line["timestamp_ms"] = json!(ms);
    }
    // Only when the plugin named one (contract 0.2.0): older golden files stay valid.
    for (name, record) in [
        ("value_record", &m.value_record),
        ("key_record", &m.key_record),
    ] {
        if let Some(record) = record {
            line[name] = json!(record);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn json_payload_reaches_the_plugin_as_json_text() {
        let row = parse_row(
            r#"{"aggregate_type":"order","aggregate_id":"1","event_type":"created","payload":{"a":1}}"#,
            3,
            None,
        )
        .unwrap();
        assert_eq!(row.payload, br#"{"a":1}"#);
        assert_eq!(row.id, OutboxId::Int(3));
        assert_eq!(row.tenant.as_str(), "default");
    }

    #[test]
    fn extra_columns_take_their_type_from_the_json_value() {
        let row = parse_row(
            r#"{"aggregate_type":"o","aggregate_id":"1","event_type":"e","extra":{"t":"x",
               "i":-7,"f":2.5,"b":true,"n":null,"at":{"timestamp":"1970-01-01T00:00:01.5Z"},
               "raw":{"base64":"AP8="},"j":{"k":[1]}}}"#,
            1,
            None,
        )
        .unwrap();
        let at = DateTime::from_timestamp_millis(1_500).unwrap();
        assert_eq!(
            row.extra,
            vec![
                (Arc::from("at"), ColumnValue::Timestamp(at)),
                (Arc::from("b"), ColumnValue::Boolean(true)),
                (Arc::from("f"), ColumnValue::Float(2.5)),
                (Arc::from("i"), ColumnValue::Integer(-7)),
                (Arc::from("j"), ColumnValue::Json(r#"{"k":[1]}"#.into())),
                (Arc::from("n"), ColumnValue::Null),
                (Arc::from("raw"), ColumnValue::Bytes(vec![0, 255])),
                (Arc::from("t"), ColumnValue::Text("x".into())),
            ],
            "in name order"
        );
        let bad = r#"{"aggregate_type":"o","aggregate_id":"1","event_type":"e",
                      "extra":{"at":{"timestamp":"yesterday"}}}"#;
        let err = parse_row(bad, 4, None).unwrap_err();
        assert!(err.contains("line 4") && err.contains("at"), "{err}");
    }

    #[test]
    fn missing_column_names_the_line_and_field() {
        let err = parse_row(r#"{"aggregate_type":"order","event_type":"x"}"#, 7, None).unwrap_err();
        assert!(
            err.contains("line 7") && err.contains("aggregate_id"),
            "{err}"
        );
    }

    const ROW: &str = r#""aggregate_type":"order","aggregate_id":"1","event_type":"created""#;

    #[test]
    fn any_id_passes_through_as_the_table_would_give_it() {
        let id = |id: &str| parse_row(&format!("{{\"id\":{id},{ROW}}}"), 1, None).map(|r| r.id);
        assert_eq!(id("42"), Ok(OutboxId::Int(42)));
        let uuid = "0b9f4c1e-7d0a-4c55-9a55-3f1c1b8e2d10";
        assert_eq!(id(&format!("\"{uuid}\"")), Ok(OutboxId::Text(uuid.into())));
        assert_eq!(id("\"evt-01\""), Ok(OutboxId::Text("evt-01".into())));
        // A string stays a string (a text key "42" is not the integer 42).
        assert_eq!(id("\"42\""), Ok(OutboxId::Text("42".into())));
        for bad in ["1.5", "18446744073709551615", "true", "[1]"] {
            let err = id(bad).unwrap_err();
            assert!(err.contains("line 1") && err.contains("id"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_forced_tenant_applies_to_every_row_and_a_different_one_is_refused() {
        let row = parse_row(&format!("{{{ROW}}}"), 1, Some("acme")).unwrap();
        assert_eq!(row.tenant, TenantId::named("acme"));
        let row = parse_row(&format!("{{\"tenant\":\"acme\",{ROW}}}"), 1, Some("acme")).unwrap();
        assert_eq!(row.tenant, TenantId::named("acme"));
        let err =
            parse_row(&format!("{{\"tenant\":\"zeta\",{ROW}}}"), 2, Some("acme")).unwrap_err();
        assert!(
            err.contains("line 2") && err.contains("zeta") && err.contains("--tenant"),
            "{err}"
        );
    }

    fn config(text: &str) -> Config {
        Config::parse(text, Path::new("sluice.toml")).unwrap()
    }

    const FILE: &str = "[database]\nurl = \"x\"\n\
        [plugins.default]\nbuiltin = \"route-by-aggregate\"\nconfig = { topic_prefix = \"d.\" }\n\
        memory_mb = 64\nallowed_topics = [\"d.*\"]\n\
        [tenants.acme]\npath = \"acme.wasm\"\nconfig = { topic_prefix = \"a.\", mode = \"x\" }\n\
        allowed_topics = [\"a.*\"]\n\
        [tenants.plain]\ncall_timeout = \"20ms\"\n";

    #[test]
    fn a_tenant_is_resolved_as_the_relay_does_and_options_go_on_top() {
        let file = config(FILE);
        let acme = ConfiguredTenant::of(&file, "acme").unwrap();
        assert!(acme.configured);
        assert_eq!(
            acme.spec,
            file.tenants["acme"].inherit(file.plugins.default.as_ref())
        );
        let options = TestOptions {
            source: None,
            config: vec![("mode".into(), "y".into())],
            memory_mb: None,
            call_timeout: Some(Duration::from_millis(5)),
            recycle_memory_percent: None,
            batch_size: None,
            tenant: Some(acme),
            formats: FormatsSpec::default(),
        };
        let spec = options.spec().unwrap();
        assert_eq!(spec.source(), Some(PluginSource::Wasm("acme.wasm".into())));
        assert_eq!(
            spec.config_pairs(),
            vec![
                ("mode".to_owned(), "y".to_owned()),
                ("topic_prefix".to_owned(), "a.".to_owned())
            ],
            "--set overrides the tenant's key and keeps the others"
        );
        assert_eq!(spec.limits.allowed_topics, Some(vec!["a.*".to_owned()]));
        assert_eq!(spec.limits.memory_mb, Some(64), "the platform limit");
        assert_eq!(
            spec.limits.call_timeout,
            Some(Duration::from_millis(5)),
            "the flag"
        );
        let (settings, tenants) = options.settings(spec);
        assert!(settings.default.is_none() && tenants.contains_key("acme"));

        // A plugin argument replaces the tenant's plugin, nothing else.
        let replaced = TestOptions {
            source: Some(PluginSource::Builtin("route-by-aggregate".into())),
            ..options
        };
        let spec = replaced.spec().unwrap();
        assert_eq!(spec.path, None);
        assert_eq!(spec.limits.allowed_topics, Some(vec!["a.*".to_owned()]));

        let plain = ConfiguredTenant::of(&file, "plain").unwrap();
        assert_eq!(
            plain.spec.limits.allowed_topics,
            Some(vec!["d.*".to_owned()])
        );
        assert_eq!(
            plain.spec.limits.call_timeout,
            Some(Duration::from_millis(20))
        );
        // A name without an entry runs [plugins.default], as in `sluice run`.
        let other = ConfiguredTenant::of(&file, "other").unwrap();
        assert!(!other.configured);
        assert_eq!(Some(&other.spec), file.plugins.default.as_ref());
        let err = ConfiguredTenant::of(&config("[database]\nurl = \"x\"\n"), "other")
            .unwrap_err()
            .to_string();
        assert!(err.contains("[plugins.default]"), "{err}");
        // Problems of the entry are errors; the database's are not this command's.
        let broken = FILE
            .replace("url = \"x\"\n", "")
            .replace("memory_mb = 64", "memory_mb = 0");
        let err = ConfiguredTenant::of(&config(&broken), "acme")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("plugins.default.memory_mb") && !err.contains("database"),
            "{err}"
        );
    }

    #[test]
    fn binary_bytes_are_base64_in_output() {
        assert_eq!(bytes_json(b"hi"), json!("hi"));
        assert_eq!(bytes_json(&[0xff]), json!({ "base64": "/w==" }));
    }

    #[test]
    fn values_are_encoded_with_a_schema_file_and_misfits_named() {
        let dir = tempfile::tempdir().unwrap();
        let schema = dir.path().join("order.avsc");
        std::fs::write(
            &schema,
            r#"{"type":"record","name":"Order","fields":[{"name":"n","type":"long"}]}"#,
        )
        .unwrap();
        let options = TestOptions {
            source: Some(PluginSource::Builtin("route-by-aggregate".into())),
            config: vec![],
            memory_mb: None,
            call_timeout: None,
            recycle_memory_percent: None,
            batch_size: None,
            tenant: None,
            formats: FormatsSpec {
                value_format: Some(sluice::encoding::Format::Avro),
                value_schema: Some(schema),
                ..FormatsSpec::default()
            },
        };
        let input = concat!(
            r#"{"aggregate_type": "order", "aggregate_id": "a", "event_type": "E", "payload": {"n": 1}}"#,
            "\n",
            r#"{"aggregate_type": "order", "aggregate_id": "b", "event_type": "E", "payload": {"n": "one"}}"#,
            "\n"
        );
        let mut out = Vec::new();
        let summary = run(&options, input.as_bytes(), &mut out).unwrap();
        assert_eq!((summary.messages, summary.failed_rows), (1, 1));
        let lines: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Magic 0, schema id 0 (no registry), then n = 1 as a zigzag varint (2).
        assert_eq!(
            lines[0]["payload"],
            json!({ "base64": BASE64.encode([0, 0, 0, 0, 0, 2]) })
        );
        assert_eq!(lines[0]["key"], json!("a"), "the key stays raw");
        assert_eq!(lines[1]["kind"], "schema-mismatch");
        let error = lines[1]["error"].as_str().unwrap();
        assert!(
            error.contains("order-value") && error.contains("$.n: expected an integer"),
            "{error}"
        );
    }
}
