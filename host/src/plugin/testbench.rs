//! `sluice plugin check` and `sluice plugin test`: exercise a plugin file without a database or
//! broker. Rows come in as JSON lines with the outbox columns; messages go out as JSON lines.

use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::model::OutboundMessage;
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::plugin::settings::plugin_cache_dir;
use crate::plugin::wasm::bindings::types::PluginInfo;
use crate::plugin::wasm::component::LoadedPlugin;
use crate::plugin::wasm::engine::PluginEngine;
use crate::plugin::wasm::host_api::TenantShared;
use crate::plugin::wasm::instance::TenantInstance;
use crate::plugin::{Limits, PluginError, TransformFailure, output};

/// Validates `path` against the world and returns its `info()` (its text escaped and cut).
/// Instantiation and `info()` are bounded by the default `call_timeout`, time spent sleeping
/// in host calls included, so a hostile file cannot hang the command.
pub fn check(path: &Path) -> Result<PluginInfo, PluginError> {
    let engine = PluginEngine::new()?;
    let plugin = Arc::new(LoadedPlugin::load_cached(
        &engine,
        path,
        plugin_cache_dir(None).as_deref(),
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

/// Runs every row of `input` through the plugin and writes one JSON line per output message,
/// per filtered row and per error. Every guest call is bounded by the default limits
/// (`call_timeout`, `memory_mb`, output sizes), as in `sluice run`.
pub fn run(
    path: &Path,
    config: &[(String, String)],
    input: impl BufRead,
    mut out: impl Write,
) -> anyhow::Result<TestSummary> {
    let engine = PluginEngine::new()?;
    let plugin = Arc::new(LoadedPlugin::load_cached(
        &engine,
        path,
        plugin_cache_dir(None).as_deref(),
    )?);
    let shared = TenantShared::new(TenantId::none());
    let limits = Limits::default();
    let mut instance = Some(TenantInstance::create(&plugin, &shared, config, &limits)?);
    let mut summary = TestSummary::default();

    for (n, line) in input.lines().enumerate() {
        let line_no = n + 1;
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let row = match parse_row(&line, line_no) {
            Ok(row) => row,
            Err(message) => {
                summary.invalid_lines += 1;
                writeln!(out, "{}", json!({ "line": line_no, "error": message }))?;
                continue;
            }
        };
        summary.rows += 1;
        if instance.is_none() {
            instance = Some(TenantInstance::create(&plugin, &shared, config, &limits)?);
        }
        let Some(inst) = instance.as_mut() else {
            continue;
        };
        let result = inst
            .transform(&row)
            .map_err(|trapped| trapped.into_failure())
            .and_then(|answer| output::accept(&limits, &row, answer));
        match result {
            Ok(messages) if messages.is_empty() => {
                writeln!(out, "{}", json!({ "row": row.id, "filtered": true }))?;
            }
            Ok(messages) => {
                summary.messages += messages.len();
                for m in &messages {
                    writeln!(out, "{}", message_json(m))?;
                }
            }
            Err(failure) => {
                summary.failed_rows += 1;
                if matches!(
                    failure,
                    TransformFailure::Trapped(_) | TransformFailure::DeadlineExceeded(_)
                ) {
                    instance = None;
                }
                writeln!(
                    out,
                    "{}",
                    json!({ "row": row.id, "error": failure.to_string(), "kind": kind(&failure) })
                )?;
            }
        }
    }
    Ok(summary)
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
