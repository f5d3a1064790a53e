//! What tracing records (`[tracing]`, docs/operations.md "Tracing"): spans exported and
//! dropped, and rows whose `traceparent` or `tracestate` was not valid. The counters are the tracing module's
//! own ([`TraceCounters`]), registered here so they are exposed with the rest.

use prometheus_client::registry::Registry;

use crate::trace::TraceCounters;

/// Registers `counters` (prefix `sluice_` added by the caller's registry).
pub(super) fn register(r: &mut Registry, counters: &TraceCounters) {
    r.register(
        "trace_spans_exported",
        "Spans the OTLP collector accepted ([tracing])",
        counters.spans_exported.clone(),
    );
    r.register(
        "trace_spans_dropped",
        "Spans lost: the export queue was full, or the collector failed or did not answer within tracing.export_timeout",
        counters.spans_dropped.clone(),
    );
    r.register(
        "trace_contexts_invalid",
        "Rows whose traceparent or tracestate (headers or trace_context column) is not valid W3C Trace Context; an invalid traceparent is not passed on, an invalid tracestate is dropped",
        counters.contexts_invalid.clone(),
    );
}
