//! Traces through the outbox: the W3C Trace Context a row carries continues into every message
//! published for it, and, with `[tracing]`, the relay exports its own spans for each row —
//! waited in the outbox, transformed, published — as children of the application's span, so a
//! trace shows the request, the relay and the consumer without a gap (docs/operations.md,
//! "Tracing").
//!
//! - [`context`][]: `traceparent`/`tracestate` values, from headers or a `trace_context` column
//! - [`settings`][]: `[tracing]`
//! - [`spans`][]: one batch's spans, from the rows' contexts to the publish reports
//! - [`export`][]: the bounded queue and the OTLP/HTTP export task
//!
//! Without `[tracing]` the relay only passes contexts on: no span is built, nothing is queued.

pub mod context;
mod export;
pub mod settings;
mod spans;

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::trace::{RandomIdGenerator, Sampler};
use prometheus_client::metrics::counter::Counter;

pub use export::{ExportError, ExportTask};
pub use settings::TracingSettings;
pub use spans::BatchSpans;

use crate::model::OutboxRow;

/// What tracing counts, registered with the metrics when `[telemetry] listen` is set
/// (`sluice_trace_spans_exported_total`, `sluice_trace_spans_dropped_total`,
/// `sluice_trace_contexts_invalid_total`). Clones count into the same values.
#[derive(Debug, Clone, Default)]
pub struct TraceCounters {
    /// Spans the collector accepted.
    pub spans_exported: Counter,
    /// Spans lost: the queue was full, or the collector failed or did not answer in time.
    pub spans_dropped: Counter,
    /// Rows whose `traceparent` did not parse (not passed on), or whose `tracestate` is not
    /// valid (dropped; the `traceparent` passed on).
    pub contexts_invalid: Counter,
}

/// The relay's tracing: passing contexts on always; exporting spans with `[tracing]`.
#[derive(Debug, Default)]
pub struct Tracing {
    export: Option<Exporting>,
    counters: TraceCounters,
    /// An invalid `traceparent` is logged once per process (then only counted): it is the
    /// application's doing, and the same code writes it into every row.
    warned_invalid: AtomicBool,
    /// The same for an invalid `tracestate`.
    warned_invalid_state: AtomicBool,
}

/// What exporting needs: where spans go, which are kept, new ids, and the scope they carry.
#[derive(Debug)]
struct Exporting {
    queue: export::SpanQueue,
    sampler: Sampler,
    ids: RandomIdGenerator,
    scope: InstrumentationScope,
}

impl Tracing {
    /// Passes rows' contexts on, exports nothing: the relay without `[tracing]`.
    pub fn propagation_only(counters: TraceCounters) -> Self {
        Self {
            counters,
            ..Self::default()
        }
    }

    /// Exports spans as `settings` (already checked) say; the returned task must run (as a
    /// background service) for spans to leave the process.
    pub fn exporting(
        settings: &TracingSettings,
        counters: TraceCounters,
    ) -> Result<(Self, ExportTask), ExportError> {
        let (queue, task) = export::start(settings, &counters)?;
        let exporting = Exporting {
            queue,
            // Parent-based: a row's parent decides by its sampled flag; the ratio only
            // decides for rows without one (the SDKs' `parentbased_traceidratio`).
            sampler: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))),
            ids: RandomIdGenerator::default(),
            scope: InstrumentationScope::builder("sluice")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        };
        Ok((
            Self {
                export: Some(exporting),
                counters,
                warned_invalid: AtomicBool::new(false),
                warned_invalid_state: AtomicBool::new(false),
            },
            task,
        ))
    }

    /// Whether spans are exported (`[tracing]` is set).
    pub fn exports(&self) -> bool {
        self.export.is_some()
    }

    /// Counts (and logs, the first time) a row whose `traceparent` is not taken.
    fn invalid(&self, row: &OutboxRow, why: &context::InvalidTraceParent) {
        self.counters.contexts_invalid.inc();
        if !self.warned_invalid.swap(true, Ordering::Relaxed) {
            tracing::warn!(row = %row.id, tenant = %row.tenant, error = %why,
                "a row's traceparent is not valid W3C Trace Context; it is not passed on (logged once, counted in sluice_trace_contexts_invalid_total)");
        }
    }

    /// Counts (and logs, the first time) a row whose `tracestate` is dropped.
    fn invalid_state(&self, row: &OutboxRow, why: context::InvalidTraceState) {
        self.counters.contexts_invalid.inc();
        if !self.warned_invalid_state.swap(true, Ordering::Relaxed) {
            tracing::warn!(row = %row.id, tenant = %row.tenant, error = %why,
                "a row's tracestate is not valid W3C Trace Context; it is dropped, its traceparent passed on (logged once, counted in sluice_trace_contexts_invalid_total)");
        }
    }
}
