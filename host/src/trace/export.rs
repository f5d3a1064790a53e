//! Getting spans to the collector without ever holding up a row: the relay hands each span to
//! a bounded queue ([`SpanQueue::push`] never waits; a full queue drops the span and counts
//! it), and one background task sends them in batches with the OpenTelemetry OTLP exporter
//! (HTTP/protobuf), each export bounded by `export_timeout`. A collector that refuses,
//! is unreachable or never answers loses spans, counted in `sluice_trace_spans_dropped_total`;
//! it never costs a row, a worker or readiness.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use tokio::sync::mpsc;

use super::TraceCounters;
use super::settings::TracingSettings;
use crate::shutdown::Shutdown;

/// Spans sent in one request at most: the SDKs' batch span processor default
/// (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
const MAX_EXPORT_BATCH: usize = 512;
/// How long the task gathers spans into a batch after the first one arrived: short, so a
/// test or an operator sees spans within a second, long enough that a busy relay sends
/// hundreds per request.
const GATHER_FOR: Duration = Duration::from_millis(200);
/// Longest wait for the last export at shutdown: a stalled collector must not hold up the
/// process's exit for a whole `export_timeout`.
const FINAL_EXPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// The exporter could not be built from valid settings (an HTTP client that cannot start).
#[derive(Debug, thiserror::Error)]
#[error("cannot start the OTLP exporter for {endpoint}: {message}")]
pub struct ExportError {
    endpoint: String,
    message: String,
}

/// Where the relay puts finished spans: bounded, never waits.
#[derive(Debug, Clone)]
pub(super) struct SpanQueue {
    sender: mpsc::Sender<SpanData>,
    counters: TraceCounters,
}

impl SpanQueue {
    /// Queues `span` for export, or drops and counts it when the queue is full (the
    /// collector is slower than the relay, or not answering).
    pub(super) fn push(&self, span: SpanData) {
        if self.sender.try_send(span).is_err() {
            self.counters.spans_dropped.inc();
        }
    }
}

/// The export task, ready to be run as a background service.
pub struct ExportTask {
    exporter: opentelemetry_otlp::SpanExporter,
    receiver: mpsc::Receiver<SpanData>,
    timeout: Duration,
    counters: TraceCounters,
    endpoint: String,
}

/// The queue and the task that empties it, for `settings` (already checked).
pub(super) fn start(
    settings: &TracingSettings,
    counters: &TraceCounters,
) -> Result<(SpanQueue, ExportTask), ExportError> {
    let endpoint = settings.traces_url().unwrap_or_default();
    let fail = |message: String| ExportError {
        endpoint: endpoint.clone(),
        message,
    };
    let headers: HashMap<String, String> = settings
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.expose().to_owned()))
        .collect();
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint.clone())
        .with_timeout(settings.export_timeout)
        .with_headers(headers)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    exporter.set_resource(
        &Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .build(),
    );
    let (sender, receiver) = mpsc::channel(settings.queue_size);
    let queue = SpanQueue {
        sender,
        counters: counters.clone(),
    };
    let task = ExportTask {
        exporter,
        receiver,
        timeout: settings.export_timeout,
        counters: counters.clone(),
        endpoint,
    };
    Ok((queue, task))
}

impl ExportTask {
    /// Sends queued spans until `shutdown` fires, then what is left once (briefly).
    pub async fn run(mut self, mut shutdown: Shutdown) {
        let mut failing = false;
        // Spans gathered when the stop came: sent with the rest of the queue, not dropped.
        let mut gathered = Vec::new();
        loop {
            let first = tokio::select! {
                span = self.receiver.recv() => span,
                () = shutdown.recv() => None,
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            let until = tokio::time::Instant::now() + GATHER_FOR;
            while batch.len() < MAX_EXPORT_BATCH {
                match tokio::time::timeout_at(until, self.receiver.recv()).await {
                    Ok(Some(span)) => batch.push(span),
                    Ok(None) | Err(_) => break,
                }
            }
            if shutdown.is_shutdown() {
                gathered = batch;
                break;
            }
            // A stalled collector must not hold up the process's exit for `export_timeout`.
            let spans = batch.len() as u64;
            let outcome = tokio::select! {
                outcome = self.export(batch, self.timeout) => outcome,
                () = shutdown.recv() => {
                    self.counters.spans_dropped.inc_by(spans);
                    break;
                }
            };
            match (&outcome, failing) {
                (Err(why), false) => tracing::warn!(endpoint = %self.endpoint, error = %why,
                    "exporting spans failed; spans are dropped (sluice_trace_spans_dropped_total) until the collector answers again"),
                (Ok(()), true) => {
                    tracing::info!(endpoint = %self.endpoint, "exporting spans works again");
                }
                _ => {}
            }
            failing = outcome.is_err();
        }
        self.flush(gathered).await;
    }

    /// Sends what is still queued (after `gathered`) once, at shutdown: in requests of the
    /// usual size (a collector's request size limit holds at shutdown too), all within
    /// [`FINAL_EXPORT_TIMEOUT`]; the first failure drops the rest (counted), as does the end of
    /// that time.
    async fn flush(&mut self, mut rest: Vec<SpanData>) {
        // Spans the relay hands over from now on are dropped (and counted) at once.
        self.receiver.close();
        while let Ok(span) = self.receiver.try_recv() {
            rest.push(span);
        }
        let deadline = tokio::time::Instant::now() + self.timeout.min(FINAL_EXPORT_TIMEOUT);
        let mut rest = rest.into_iter().peekable();
        while rest.peek().is_some() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let batch: Vec<SpanData> = rest.by_ref().take(MAX_EXPORT_BATCH).collect();
            let size = batch.len();
            let sent = if left.is_zero() {
                self.counters.spans_dropped.inc_by(size as u64);
                Err(format!(
                    "not sent within {}",
                    humantime::format_duration(FINAL_EXPORT_TIMEOUT)
                ))
            } else {
                self.export(batch, left).await
            };
            if let Err(why) = sent {
                let unsent = rest.len();
                self.counters.spans_dropped.inc_by(unsent as u64);
                tracing::warn!(endpoint = %self.endpoint, error = %why, spans = size + unsent,
                    "the last spans could not be exported at shutdown (counted in sluice_trace_spans_dropped_total)");
                return;
            }
        }
    }

    /// What is queued (tests: spans as the relay handed them over).
    #[cfg(test)]
    pub(super) fn queued(&mut self) -> Vec<SpanData> {
        let mut spans = Vec::new();
        while let Ok(span) = self.receiver.try_recv() {
            spans.push(span);
        }
        spans
    }

    /// One export request, bounded by `timeout`; its spans are counted as exported or dropped.
    async fn export(&self, batch: Vec<SpanData>, timeout: Duration) -> Result<(), String> {
        let spans = batch.len() as u64;
        let outcome = match tokio::time::timeout(timeout, self.exporter.export(batch)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "the collector did not answer within {}",
                // Whole milliseconds: the time left at shutdown is not a round number.
                humantime::format_duration(Duration::from_millis(
                    u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)
                ))
            )),
        };
        match outcome {
            Ok(()) => self.counters.spans_exported.inc_by(spans),
            Err(_) => self.counters.spans_dropped.inc_by(spans),
        };
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Tracing, TracingSettings};

    fn settings(endpoint: &str, queue_size: usize) -> TracingSettings {
        TracingSettings {
            otlp_endpoint: Some(endpoint.into()),
            queue_size,
            export_timeout: Duration::from_millis(500),
            ..TracingSettings::default()
        }
    }

    fn span() -> SpanData {
        use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
        SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "x".into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let counters = TraceCounters::default();
        let (queue, _task) = start(&settings("http://127.0.0.1:9", 2), &counters).unwrap();
        for _ in 0..5 {
            queue.push(span());
        }
        assert_eq!(counters.spans_dropped.get(), 3);
    }

    #[tokio::test]
    async fn spans_the_collector_does_not_take_are_counted_as_dropped() {
        // Nothing listens on the port: the connection is refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let counters = TraceCounters::default();
        let (tracing, task) =
            Tracing::exporting(&settings(&endpoint, 16), counters.clone()).unwrap();
        assert!(tracing.exports());
        let (stop, stopping) = crate::shutdown::channel();
        let running = tokio::spawn(task.run(stopping));
        let queue = &tracing.export.as_ref().unwrap().queue;
        for _ in 0..4 {
            queue.push(span());
        }
        let started = std::time::Instant::now();
        while counters.spans_dropped.get() < 4 && started.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(counters.spans_dropped.get(), 4);
        assert_eq!(counters.spans_exported.get(), 0);
        stop.trigger();
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .unwrap()
            .unwrap();
    }
}
