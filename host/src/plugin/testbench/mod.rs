//! `sluice plugin check` and `sluice plugin test`: exercise a plugin file without a database or
//! broker. Rows come in as JSON lines with the outbox columns; messages go out as JSON lines,
//! which `--expect` compares with a golden file ([`diff_expected`]).

mod diff;

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::model::OutboundMessage;
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::plugin::router::compile_cache;
use crate::plugin::wasm::bindings::types::PluginInfo;
use crate::plugin::wasm::component::LoadedPlugin;
use crate::plugin::wasm::engine::PluginEngine;
use crate::plugin::wasm::host_api::TenantShared;
use crate::plugin::wasm::instance::TenantInstance;
use crate::plugin::{
    Limits, PluginError, PluginRouter, PluginSource, PluginSpec, PluginsSettings, RowResult,
    RowTransformer, TransformFailure,
};

pub use diff::unified as diff_expected;

/// Validates `path` against the world and returns its `info()` (its text escaped and cut).
/// Instantiation and `info()` are bounded by the default `call_timeout`, time spent sleeping
/// in host calls included, so a hostile file cannot hang the command.
pub fn check(path: &Path) -> Result<PluginInfo, PluginError> {
    let engine = PluginEngine::new()?;
    let plugin = Arc::new(LoadedPlugin::load_cached(
        &engine,
        path,
        compile_cache(&PluginsSettings::default()).as_ref(),
    )?);
    let shared = TenantShared::new(TenantId::none());
    let mut instance = TenantInstance::instantiate(&plugin, &shared, &Limits::default())?;
    instance.info().map_err(|message| PluginError::BadPlugin {
        path: path.to_owned(),
        message: format!("info() failed: {message}"),
    })
}

/// Counts of a `plugin test` run.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TestSummary {
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
    #[serde(default)]
    id: Option<i64>,
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
}

/// What `sluice plugin test` runs: a plugin, its config, and the limits and call grouping
/// that `sluice run` would give it.
#[derive(Debug, Clone)]
pub struct TestOptions {
    pub source: PluginSource,
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
}

impl TestOptions {
    /// The `[plugins.default]` entry these options amount to.
    fn spec(&self) -> PluginSpec {
        let (path, builtin) = match &self.source {
            PluginSource::Wasm(path) => (Some(path.clone()), None),
            PluginSource::Builtin(name) => (None, Some(name.clone())),
        };
        PluginSpec {
            path,
            builtin,
            config: Some(
                self.config
                    .iter()
                    .map(|(k, v)| (k.clone(), toml::Value::String(v.clone())))
                    .collect(),
            ),
            memory_mb: self.memory_mb,
            call_timeout: self.call_timeout,
            recycle_memory_percent: self.recycle_memory_percent,
            call_batch_rows: self.batch_size,
            ..PluginSpec::default()
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
/// router and a tenant slot: `transform-batch` chunks, output checks, limits, circuit
/// breaker, builtins) — and writes one JSON line per output message, per filtered row, per
/// failed row and per invalid input line, in input order. Rows without a `tenant` run as
/// rows without a tenant do in `sluice run`; each named tenant gets its own instance.
pub fn run(
    options: &TestOptions,
    input: impl BufRead,
    mut out: impl Write,
) -> anyhow::Result<TestSummary> {
    let spec = options.spec();
    if let Some((key, message)) = spec.problems("plugin", true).into_iter().next() {
        anyhow::bail!("{key}: {message}");
    }
    let settings = PluginsSettings {
        default: Some(spec),
        // A plugin that cannot start is the answer, not a quarantine to wait out.
        strict_startup: true,
        ..PluginsSettings::default()
    };
    let router = PluginRouter::from_settings(&settings, &BTreeMap::new())?;
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
        match parse_row(&line, line_no) {
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
                std::mem::take(&mut chunk),
                &mut summary,
                &mut out,
            )?;
            rows_in_chunk = 0;
        }
    }
    run_chunk(&runtime, &router, chunk, &mut summary, &mut out)?;
    Ok(summary)
}

/// Transforms the rows of `chunk` (putting deferred rows back, as the relay's next batch
/// would take them) and writes every entry's lines.
fn run_chunk(
    runtime: &tokio::runtime::Runtime,
    router: &PluginRouter,
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
    let mut results = results.into_iter();
    for entry in &chunk {
        match entry {
            Entry::Invalid { line, message } => {
                summary.invalid_lines += 1;
                writeln!(out, "{}", json!({ "line": line, "error": message }))?;
            }
            Entry::Row(row) => {
                summary.rows += 1;
                let result = results.next().flatten().unwrap_or_else(|| {
                    Err(TransformFailure::Unavailable(
                        "deferred again and again: the plugin made no progress".into(),
                    ))
                });
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
            writeln!(
                out,
                "{}",
                json!({ "row": row.id, "error": failure.to_string(), "kind": kind(&failure) })
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
        TransformFailure::NoPlugin(_)
        | TransformFailure::Unavailable(_)
        | TransformFailure::Paused { .. }
        | TransformFailure::Deferred(_) => "unavailable",
    }
}

fn parse_row(line: &str, line_no: usize) -> Result<OutboxRow, String> {
    let input: InputRow =
        serde_json::from_str(line).map_err(|e| format!("line {line_no}: invalid row: {e}"))?;
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
    Ok(OutboxRow {
        id: OutboxId::Int(input.id.unwrap_or(line_no as i64)),
        tenant: TenantId::from_column(input.tenant),
        aggregate_type: input.aggregate_type,
        aggregate_id: input.aggregate_id,
        event_type: input.event_type,
        payload,
        headers,
        created_at: input.created_at.unwrap_or_else(Utc::now),
        attempts: input.attempts.unwrap_or(0),
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
    json!({
        "row": m.row,
        "topic": m.topic,
        "partition": m.partition,
        "key": m.key.as_deref().map(bytes_json),
        "payload": m.payload.as_deref().map(bytes_json),
        "headers": m.headers.iter().map(|(k, v)| json!([k, bytes_json(v)])).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_payload_reaches_the_plugin_as_json_text() {
        let row = parse_row(
            r#"{"aggregate_type":"order","aggregate_id":"1","event_type":"created","payload":{"a":1}}"#,
            3,
        )
        .unwrap();
        assert_eq!(row.payload, br#"{"a":1}"#);
        assert_eq!(row.id, OutboxId::Int(3));
        assert_eq!(row.tenant.as_str(), "default");
    }

    #[test]
    fn missing_column_names_the_line_and_field() {
        let err = parse_row(r#"{"aggregate_type":"order","event_type":"x"}"#, 7).unwrap_err();
        assert!(
            err.contains("line 7") && err.contains("aggregate_id"),
            "{err}"
        );
    }

    #[test]
    fn binary_bytes_are_base64_in_output() {
        assert_eq!(bytes_json(b"hi"), json!("hi"));
        assert_eq!(bytes_json(&[0xff]), json!({ "base64": "/w==" }));
    }
}
