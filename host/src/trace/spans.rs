//! One batch's trace work: before publishing, every message of a row that carries a trace
//! context gets `traceparent` (and `tracestate`) headers ([`Tracing::stamp`]); with export on,
//! a sampled row's messages name the relay's own publish span as their parent, and after the
//! publish reports the row's spans are built and queued ([`BatchSpans::finish`]):
//!
//! - `sluice.outbox.wait`: from the row's `created_at` to the claim;
//! - `sluice.transform`: the batch's transform step, with the row's tenant and outcome;
//! - `send <destination>` (kind producer), one per message: the batch's publish step, with
//!   the broker, destination, attempt and result, and where the broker stored the message as
//!   far as its acknowledgement says ([`Delivered`]): the partition written (else the one the
//!   plugin chose) and the Kafka offset or JetStream stream sequence;
//!
//! all children of the application's span (the row's `traceparent`); a row without one that
//! the sample ratio picks gets a trace of its own under a `sluice.row` root span.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Display;
use std::time::SystemTime;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{
    IdGenerator, SamplingDecision, ShouldSample, SpanData, SpanEvents, SpanLinks,
};

use super::context::{self, RowContext, TRACEPARENT, TRACESTATE, TraceParent};
use super::{Exporting, Tracing};
use crate::model::{
    Broker, Delivered, Headers, OutboundMessage, OutboxId, OutboxRow, RowResult, TenantId,
    TransformFailure,
};

/// Name of the span of a row's wait in the outbox.
const WAIT_SPAN: &str = "sluice.outbox.wait";
/// Name of the span of a row's transform.
const TRANSFORM_SPAN: &str = "sluice.transform";
/// Name of the root span of a row that came without a parent.
const ROW_SPAN: &str = "sluice.row";

/// A sampled row of the batch: what its spans need once the batch is published.
#[derive(Debug)]
struct Traced {
    trace_id: TraceId,
    /// The application's span; `None`: the row had no context ([`Traced::root`] instead).
    parent: Option<SpanId>,
    /// The relay's own root span, for a row without a parent.
    root: Option<SpanId>,
    state: TraceState,
    id: OutboxId,
    tenant: String,
    plugin: Option<String>,
    attempt: i64,
    created_at: SystemTime,
    /// The transform's outcome (`ok`, `dropped`, or the failure's kind) and error text.
    outcome: &'static str,
    error: Option<String>,
}

impl Traced {
    /// The span the relay's spans of this row hang under.
    fn under(&self) -> SpanId {
        self.parent.or(self.root).unwrap_or(SpanId::INVALID)
    }
}

/// The sampled rows of one batch, waiting for their publish reports.
#[derive(Debug)]
pub struct BatchSpans {
    claimed_at: SystemTime,
    transform: (SystemTime, SystemTime),
    rows: HashMap<OutboxId, Traced>,
}

impl Tracing {
    /// Puts each row's trace context on its messages (see the module docs for what wins over
    /// a plugin's own headers); with export on, decides which rows are sampled and returns
    /// them, for [`BatchSpans::finish`] after publishing. `claimed_at` and
    /// `transform_started` are when the batch was claimed and handed to the plugins;
    /// `plugin_of` names a tenant's plugin (asked for sampled rows only).
    pub fn stamp(
        &self,
        rows: &[OutboxRow],
        results: &mut [RowResult],
        (claimed_at, transform_started): (SystemTime, SystemTime),
        plugin_of: &dyn Fn(&TenantId) -> Option<String>,
    ) -> Option<BatchSpans> {
        let transform_ended = SystemTime::now();
        let mut sampled = HashMap::new();
        for (row, result) in rows.iter().zip(results.iter_mut()) {
            let found = match context::from_headers(&row.headers) {
                Ok(found) => {
                    if let Some(why) = found.as_ref().and_then(|c| c.invalid_state) {
                        self.invalid_state(row, why);
                    }
                    found
                }
                Err(why) => {
                    self.invalid(row, &why);
                    if let Ok(messages) = result {
                        // Not passed on, whatever a plugin copied from the row.
                        messages.iter_mut().for_each(|m| clear(&mut m.headers));
                    }
                    continue;
                }
            };
            let traced = self
                .export
                .as_ref()
                .and_then(|e| e.sample(row, found.as_ref(), result, plugin_of));
            match (&traced, &self.export, result) {
                (Some(traced), Some(export), Ok(messages)) => {
                    let state = found.as_ref().and_then(|c| c.state.as_deref());
                    for message in messages {
                        let parent = TraceParent {
                            trace_id: traced.trace_id.to_bytes(),
                            span_id: export.ids.new_span_id().to_bytes(),
                            flags: 1,
                        };
                        set(&mut message.headers, &parent, state);
                    }
                }
                // Not sampled (or no export): the row's context goes on as it came.
                (None, _, Ok(messages)) => {
                    if let Some(found) = &found {
                        for message in messages {
                            set(&mut message.headers, &found.parent, found.state.as_deref());
                        }
                    }
                }
                _ => {}
            }
            if let Some(traced) = traced {
                sampled.insert(row.id.clone(), traced);
            }
        }
        (!sampled.is_empty()).then_some(BatchSpans {
            claimed_at,
            transform: (transform_started, transform_ended),
            rows: sampled,
        })
    }
}

impl Exporting {
    /// The row's trace if it is sampled: its parent's flag decides, the ratio for a row
    /// without one. Rows not run (deferred, paused tenants) are not traced this time.
    fn sample(
        &self,
        row: &OutboxRow,
        found: Option<&RowContext>,
        result: &RowResult,
        plugin_of: &dyn Fn(&TenantId) -> Option<String>,
    ) -> Option<Traced> {
        let (outcome, error) = match result {
            Ok(messages) if messages.is_empty() => ("dropped", None),
            Ok(_) => ("ok", None),
            Err(TransformFailure::Deferred(_) | TransformFailure::Paused { .. }) => return None,
            Err(failure) => (failure_kind(failure), Some(failure.to_string())),
        };
        let remote = found.map(|c| {
            SpanContext::new(
                TraceId::from_bytes(c.parent.trace_id),
                SpanId::from_bytes(c.parent.span_id),
                TraceFlags::new(c.parent.flags),
                true,
                TraceState::NONE,
            )
        });
        let trace_id = remote
            .as_ref()
            .map_or_else(|| self.ids.new_trace_id(), SpanContext::trace_id);
        let parent_cx = remote.map(|sc| Context::new().with_remote_span_context(sc));
        let decision = self.sampler.should_sample(
            parent_cx.as_ref(),
            trace_id,
            WAIT_SPAN,
            &SpanKind::Internal,
            &[],
            &[],
        );
        if decision.decision != SamplingDecision::RecordAndSample {
            return None;
        }
        let state = found
            .and_then(|c| c.state.as_deref())
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        Some(Traced {
            trace_id,
            parent: found.map(|c| SpanId::from_bytes(c.parent.span_id)),
            root: found.is_none().then(|| self.ids.new_span_id()),
            state,
            id: row.id.clone(),
            tenant: row.tenant.as_str().to_owned(),
            plugin: plugin_of(&row.tenant),
            attempt: i64::from(row.attempts) + 1,
            created_at: row.created_at.into(),
            outcome,
            error,
        })
    }

    fn span(
        &self,
        row: &Traced,
        (span_id, parent): (SpanId, SpanId),
        (name, kind): (Cow<'static, str>, SpanKind),
        (start, end): (SystemTime, SystemTime),
        attributes: Vec<KeyValue>,
        status: Status,
    ) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                row.trace_id,
                span_id,
                TraceFlags::SAMPLED,
                false,
                row.state.clone(),
            ),
            parent_span_id: parent,
            parent_span_is_remote: row.parent == Some(parent),
            span_kind: kind,
            name,
            start_time: start,
            // The database's clock wrote `created_at`: never end a span before it started.
            end_time: end.max(start),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        }
    }
}

impl BatchSpans {
    /// Builds and queues the spans of the batch's sampled rows: `messages` were published
    /// from `publish_started` on, with `reports` one per message.
    pub fn finish<E: Display>(
        self,
        tracing: &Tracing,
        messages: &[OutboundMessage],
        reports: &[Result<Delivered, E>],
        publish_started: SystemTime,
    ) {
        let Some(export) = &tracing.export else {
            return;
        };
        let published = SystemTime::now();
        for (message, report) in messages.iter().zip(reports) {
            let Some(row) = self.rows.get(&message.row) else {
                continue;
            };
            let Some(span_id) = header(&message.headers, TRACEPARENT)
                .and_then(|v| TraceParent::parse(v).ok())
                .map(|p| SpanId::from_bytes(p.span_id))
            else {
                continue;
            };
            let mut attributes = vec![
                KeyValue::new("messaging.system", message.broker.as_str()),
                KeyValue::new("messaging.operation.name", "send"),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.destination.name", message.topic.clone()),
                KeyValue::new("sluice.outbox.id", row.id.to_string()),
                KeyValue::new("sluice.tenant", row.tenant.clone()),
                KeyValue::new("sluice.attempt", row.attempt),
            ];
            let delivered = report.as_ref().ok().copied().unwrap_or_default();
            where_stored(message, delivered, &mut attributes);
            let status = match report {
                Ok(_) => Status::Unset,
                Err(e) => Status::error(e.to_string()),
            };
            export.queue.push(export.span(
                row,
                (span_id, row.under()),
                (format!("send {}", message.topic).into(), SpanKind::Producer),
                (publish_started, published),
                attributes,
                status,
            ));
        }
        for row in self.rows.values() {
            let common = || {
                vec![
                    KeyValue::new("sluice.outbox.id", row.id.to_string()),
                    KeyValue::new("sluice.tenant", row.tenant.clone()),
                ]
            };
            export.queue.push(export.span(
                row,
                (export.ids.new_span_id(), row.under()),
                (WAIT_SPAN.into(), SpanKind::Internal),
                (row.created_at, self.claimed_at),
                common(),
                Status::Unset,
            ));
            let mut attributes = common();
            attributes.push(KeyValue::new("sluice.transform.outcome", row.outcome));
            attributes.push(KeyValue::new("sluice.attempt", row.attempt));
            if let Some(plugin) = &row.plugin {
                attributes.push(KeyValue::new("sluice.plugin", plugin.clone()));
            }
            export.queue.push(
                export.span(
                    row,
                    (export.ids.new_span_id(), row.under()),
                    (TRANSFORM_SPAN.into(), SpanKind::Internal),
                    self.transform,
                    attributes,
                    row.error
                        .as_ref()
                        .map_or(Status::Unset, |e| Status::error(e.clone())),
                ),
            );
            if let Some(root) = row.root {
                export.queue.push(export.span(
                    row,
                    (root, SpanId::INVALID),
                    (ROW_SPAN.into(), SpanKind::Internal),
                    (row.created_at, published),
                    common(),
                    Status::Unset,
                ));
            }
        }
    }
}

/// The publish span's attributes saying where the broker stored `message`: the partition it
/// wrote (else the one the plugin chose, for a message not acknowledged) and its position.
fn where_stored(message: &OutboundMessage, delivered: Delivered, attributes: &mut Vec<KeyValue>) {
    if let Some(partition) = delivered.partition.or(message.partition) {
        attributes.push(KeyValue::new(
            "messaging.destination.partition.id",
            partition.to_string(),
        ));
    }
    let Some(offset) = delivered.offset else {
        return;
    };
    match message.broker {
        Broker::Kafka => attributes.push(KeyValue::new("messaging.kafka.offset", offset)),
        // The semantic conventions name no JetStream position: `messaging.message.id` is the
        // message's own id (its `Nats-Msg-Id`), not where the stream put it, and `messaging.*`
        // is theirs to extend; so the stream sequence is Sluice's own attribute.
        Broker::Nats => attributes.push(KeyValue::new(NATS_SEQUENCE, offset)),
        Broker::Rabbitmq | Broker::Redis => {}
    }
}

/// The attribute of a NATS publish span with the JetStream stream sequence of the message.
const NATS_SEQUENCE: &str = "sluice.nats.stream.sequence";

/// The kind of a failed transform, as the `sluice.transform.outcome` attribute names it.
fn failure_kind(failure: &TransformFailure) -> &'static str {
    match failure {
        TransformFailure::Retryable { .. } => "retryable",
        TransformFailure::Permanent { .. } => "permanent",
        TransformFailure::Trapped(_) => "trap",
        TransformFailure::DeadlineExceeded(_) => "timeout",
        TransformFailure::Deferred(_) => "deferred",
        TransformFailure::InvalidOutput(_) => "invalid_output",
        TransformFailure::NoPlugin(_) => "no_plugin",
        TransformFailure::SchemaMismatch(_) => "schema_mismatch",
        TransformFailure::SchemaUnavailable(_) => "schema_unavailable",
        TransformFailure::Unavailable(_) => "unavailable",
        TransformFailure::Paused { .. } => "paused",
    }
}

/// The first value of header `name` (ASCII case ignored), as text.
fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
}

/// Drops every `traceparent`/`tracestate` header (ASCII case ignored).
fn clear(headers: &mut Headers) {
    headers.retain(|(k, _)| {
        !k.eq_ignore_ascii_case(TRACEPARENT) && !k.eq_ignore_ascii_case(TRACESTATE)
    });
}

/// Replaces the message's trace context with `parent` and `state`: the host's, like the
/// other host-stamped headers, so consumers see exactly one.
fn set(headers: &mut Headers, parent: &TraceParent, state: Option<&str>) {
    clear(headers);
    headers.push((TRACEPARENT.to_owned(), parent.to_string().into_bytes()));
    if let Some(state) = state {
        headers.push((TRACESTATE.to_owned(), state.as_bytes().to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Broker, TenantId};
    use crate::trace::{TraceCounters, TracingSettings};

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const UNSAMPLED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

    /// The one place rows are built (the model's fields change more often than this test).
    fn row(id: i64, headers: &[(&str, &str)]) -> OutboxRow {
        OutboxRow {
            id: OutboxId::Int(id),
            tenant: TenantId::none(),
            aggregate_type: "order".into(),
            aggregate_id: format!("o-{id}"),
            event_type: "Created".into(),
            payload: Vec::new(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
                .collect(),
            created_at: chrono::Utc::now() - chrono::Duration::seconds(3),
            attempts: 0,
            extra: Default::default(),
            replay: None,
        }
    }

    /// What a plugin returned for `row`: one message, with `headers`.
    fn message(row: &OutboxRow, headers: &[(&str, &str)]) -> OutboundMessage {
        OutboundMessage {
            row: row.id.clone(),
            broker: Broker::Kafka,
            topic: "orders".into(),
            key: None,
            payload: None,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
                .collect(),
            partition: Some(2),
            timestamp_ms: None,
            encoding: None,
            value_record: None,
            key_record: None,
        }
    }

    fn headers_of(result: &RowResult) -> Vec<(String, String)> {
        result.as_ref().unwrap()[0]
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect()
    }

    fn value<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
        headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn now() -> (SystemTime, SystemTime) {
        (SystemTime::now(), SystemTime::now())
    }

    fn attribute(span: &SpanData, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    }

    fn no_plugin(_: &TenantId) -> Option<String> {
        Some("builtin:route-by-aggregate".into())
    }

    /// Exporting toward a port nothing listens on; the task is not run, its queue is read.
    fn exporting(ratio: f64) -> (Tracing, crate::trace::ExportTask) {
        let settings = TracingSettings {
            otlp_endpoint: Some("http://127.0.0.1:9".into()),
            sample_ratio: ratio,
            ..TracingSettings::default()
        };
        Tracing::exporting(&settings, TraceCounters::default()).unwrap()
    }

    #[test]
    fn without_export_the_rows_context_replaces_the_plugins_and_is_passed_on_unchanged() {
        let tracing = Tracing::propagation_only(TraceCounters::default());
        let rows = [
            row(1, &[("traceparent", PARENT), ("tracestate", "a=b")]),
            row(2, &[]),
            row(3, &[("traceparent", "00-zz-01")]),
        ];
        let plugin_header = [("TraceParent", UNSAMPLED), ("x", "1")];
        let mut results: Vec<RowResult> = rows
            .iter()
            .map(|r| Ok(vec![message(r, &plugin_header)]))
            .collect();
        let spans = tracing.stamp(&rows, &mut results, now(), &no_plugin);
        assert!(spans.is_none(), "no spans without export");

        let first = headers_of(&results[0]);
        assert_eq!(value(&first, "traceparent"), [PARENT], "{first:?}");
        assert_eq!(value(&first, "tracestate"), ["a=b"]);
        assert_eq!(value(&first, "x"), ["1"]);
        // No context in the row: the plugin's own header is left alone.
        assert_eq!(value(&headers_of(&results[1]), "traceparent"), [UNSAMPLED]);
        // An invalid one is not passed on, whatever the plugin copied; counted.
        assert!(value(&headers_of(&results[2]), "traceparent").is_empty());
        assert_eq!(tracing.counters.contexts_invalid.get(), 1);
    }

    #[test]
    fn a_sampled_row_gets_the_relays_publish_span_as_parent_and_three_spans() {
        let (tracing, mut task) = exporting(0.0);
        let rows = [
            row(1, &[("traceparent", PARENT), ("tracestate", "a=b")]),
            row(2, &[("traceparent", UNSAMPLED)]),
            row(3, &[]),
        ];
        let mut results: Vec<RowResult> = rows.iter().map(|r| Ok(vec![message(r, &[])])).collect();
        let spans = tracing
            .stamp(&rows, &mut results, now(), &no_plugin)
            .expect("one row sampled");
        let first = headers_of(&results[0]);
        let sent = TraceParent::parse(value(&first, "traceparent")[0]).unwrap();
        let parent = TraceParent::parse(PARENT).unwrap();
        assert_eq!(sent.trace_id, parent.trace_id);
        assert_ne!(sent.span_id, parent.span_id);
        assert!(sent.sampled());
        assert_eq!(value(&first, "tracestate"), ["a=b"]);
        // Not sampled: unchanged; no context and ratio 0: nothing.
        assert_eq!(value(&headers_of(&results[1]), "traceparent"), [UNSAMPLED]);
        assert!(value(&headers_of(&results[2]), "traceparent").is_empty());

        let messages: Vec<OutboundMessage> = results.into_iter().flat_map(|r| r.unwrap()).collect();
        // The broker wrote the sampled row's message elsewhere than the plugin asked (2).
        let stored = Delivered {
            partition: Some(5),
            offset: Some(42),
        };
        let reports: Vec<Result<Delivered, String>> = vec![
            Ok(stored),
            Ok(Delivered::default()),
            Ok(Delivered::default()),
        ];
        spans.finish(&tracing, &messages, &reports, SystemTime::now());
        let exported = task.queued();
        let names: Vec<&str> = exported.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        for name in ["send orders", WAIT_SPAN, TRANSFORM_SPAN] {
            assert!(names.contains(&name), "{names:?}");
        }
        for span in &exported {
            assert_eq!(span.span_context.trace_id().to_bytes(), parent.trace_id);
            assert_eq!(span.parent_span_id.to_bytes(), parent.span_id);
            assert!(span.parent_span_is_remote);
        }
        let publish = exported.iter().find(|s| s.name == "send orders").unwrap();
        assert_eq!(publish.span_context.span_id().to_bytes(), sent.span_id);
        assert_eq!(publish.span_kind, SpanKind::Producer);
        assert_eq!(
            attribute(publish, "messaging.destination.partition.id").as_deref(),
            Some("5")
        );
        assert_eq!(
            attribute(publish, "messaging.kafka.offset").as_deref(),
            Some("42")
        );
        assert_eq!(attribute(publish, "sluice.attempt").as_deref(), Some("1"));
        let wait = exported.iter().find(|s| s.name == WAIT_SPAN).unwrap();
        let waited = wait.end_time.duration_since(wait.start_time).unwrap();
        assert!(waited.as_secs() >= 2, "from created_at: {waited:?}");
        let transform = exported.iter().find(|s| s.name == TRANSFORM_SPAN).unwrap();
        assert_eq!(
            attribute(transform, "sluice.transform.outcome").as_deref(),
            Some("ok")
        );
        assert_eq!(
            attribute(transform, "sluice.plugin").as_deref(),
            Some("builtin:route-by-aggregate")
        );
    }

    #[test]
    fn a_row_without_parent_picked_by_the_ratio_gets_a_trace_of_its_own() {
        let (tracing, mut task) = exporting(1.0);
        let rows = [row(1, &[])];
        let mut results: Vec<RowResult> = vec![Ok(vec![message(&rows[0], &[])])];
        let spans = tracing
            .stamp(&rows, &mut results, now(), &no_plugin)
            .unwrap();
        let sent = TraceParent::parse(value(&headers_of(&results[0]), "traceparent")[0]).unwrap();
        let messages = results.pop().unwrap().unwrap();
        spans.finish(
            &tracing,
            &messages,
            &[Err("broker down")],
            SystemTime::now(),
        );
        let exported = task.queued();
        assert_eq!(exported.len(), 4);
        let root = exported.iter().find(|s| s.name == ROW_SPAN).unwrap();
        assert_eq!(root.parent_span_id, SpanId::INVALID);
        for span in exported.iter().filter(|s| s.name != ROW_SPAN) {
            assert_eq!(span.parent_span_id, root.span_context.span_id());
            assert_eq!(span.span_context.trace_id().to_bytes(), sent.trace_id);
        }
        let publish = exported.iter().find(|s| s.name == "send orders").unwrap();
        assert_eq!(publish.status, Status::error("broker down"));
        // Not stored: the partition the plugin chose, no offset.
        assert_eq!(
            attribute(publish, "messaging.destination.partition.id").as_deref(),
            Some("2")
        );
        assert_eq!(attribute(publish, "messaging.kafka.offset"), None);
    }

    #[test]
    fn failed_and_deferred_rows() {
        let (tracing, mut task) = exporting(1.0);
        let rows = [
            row(1, &[("traceparent", PARENT)]),
            row(2, &[("traceparent", PARENT)]),
        ];
        let mut results: Vec<RowResult> = vec![
            Err(TransformFailure::Retryable {
                code: "busy".into(),
                message: "try later".into(),
            }),
            Err(TransformFailure::Deferred("budget".into())),
        ];
        let spans = tracing
            .stamp(&rows, &mut results, now(), &no_plugin)
            .unwrap();
        spans.finish::<String>(&tracing, &[], &[], SystemTime::now());
        let exported = task.queued();
        // The failed row: its wait and its transform (an error); the deferred row: nothing.
        assert_eq!(exported.len(), 2, "{exported:?}");
        let transform = exported.iter().find(|s| s.name == TRANSFORM_SPAN).unwrap();
        assert!(matches!(transform.status, Status::Error { .. }));
        assert!(
            transform
                .attributes
                .iter()
                .any(|kv| kv.key.as_str() == "sluice.transform.outcome"
                    && kv.value.as_str() == "retryable")
        );
    }

    #[test]
    fn each_broker_names_the_position_it_reports_its_own_way() {
        let row = row(1, &[]);
        let stored = Delivered {
            partition: None,
            offset: Some(7),
        };
        let attributes_of = |broker: Broker| {
            let mut attributes = Vec::new();
            let mut message = message(&row, &[]);
            message.broker = broker;
            message.partition = None;
            where_stored(&message, stored, &mut attributes);
            attributes
                .iter()
                .map(|kv| format!("{}={}", kv.key, kv.value))
                .collect::<Vec<_>>()
        };
        assert_eq!(attributes_of(Broker::Kafka), ["messaging.kafka.offset=7"]);
        assert_eq!(attributes_of(Broker::Nats), [format!("{NATS_SEQUENCE}=7")]);
        assert!(attributes_of(Broker::Redis).is_empty());
    }
}
