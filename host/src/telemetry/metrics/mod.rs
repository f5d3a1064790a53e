//! The metric families of a relay, grouped by the part of Sluice that records them, and the
//! registry they are exposed from. Names follow the Prometheus conventions (`sluice_` prefix,
//! base units, `_total` counters); the reference with what each means is in
//! `docs/operations.md`.
//!
//! Each group declares its families, registers them (name, HELP, unit) and records into them;
//! label values are enums (see [`label_values!`]) whose one list both starts every known series
//! at 0 and is the only way to record one:
//!
//! - [`relay`]: claims, poll wake-ups, rows' fates, marks, the batch concurrency limit
//! - [`plugin`]: plugin calls, and the per-tenant plugin state read at scrape time
//! - [`sink`]: messages and bytes acknowledged, produce errors, the producer's queue, latency
//! - [`backlog`]: the sampled outbox gauges (due rows, oldest due row, dead rows)
//! - [`health`]: dependency checks and worker heartbeats (`/healthz`, `/readyz`)
//! - [`process`]: `sluice_build_info` and the `process_*` families
//! - [`trace`]: spans exported and dropped, invalid trace contexts

pub(crate) mod backlog;
pub(crate) mod health;
pub(crate) mod plugin;
pub(crate) mod process;
pub(crate) mod relay;
pub(crate) mod sink;
mod trace;

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::labels::TenantLabels;
use crate::model::TenantId;
pub(crate) use backlog::{BacklogMetrics, TenantSample};
pub(crate) use health::{Dependency, HealthMetrics, ReloadOutcome};
pub(crate) use plugin::{Loaded, NO_PLUGIN, PluginMetrics, PluginOutcome, PluginStates};
pub(crate) use relay::{DeadReason, RelayMetrics, RowOutcome, WakeCause};
pub(crate) use sink::{ProduceError, SinkMetrics};

/// Declares the label values of one label: an enum, its `ALL` list (what is pre-initialised)
/// and the text each value is exposed as.
macro_rules! label_values {
    ($(#[$meta:meta])* $vis:vis enum $name:ident {
        $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in the order they are declared.
            // Unused for a label whose series cannot exist before a value is known (produce
            // errors are per topic).
            #[allow(dead_code)]
            pub(crate) const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The value as exposed.
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl prometheus_client::encoding::EncodeLabelValue for $name {
            fn encode(
                &self,
                encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
            ) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    };
}
pub(crate) use label_values;

/// The label set of families broken down by tenant alone.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TenantLabel {
    pub(crate) tenant: Arc<str>,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s: a claim, a transform or a delivery report is usually milliseconds; the
    // tail shows outages.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric of one relay process, by the part that records it. Cheap to record into from
/// any thread.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    tenants: TenantLabels,
    /// Label values taken away since the last sample: removed again then, in case a batch
    /// that looked its label up before recorded into it after.
    retired: Mutex<Vec<Arc<str>>>,
    pub relay: RelayMetrics,
    pub plugin: PluginMetrics,
    pub sink: SinkMetrics,
    pub backlog: BacklogMetrics,
    pub health: HealthMetrics,
    /// Tracing's counters (exposed whether or not `[tracing]` is set: 0 without it).
    pub trace: crate::trace::TraceCounters,
}

impl Metrics {
    /// The metrics of a relay whose configured tenants `tenants` names, with `librdkafka`'s
    /// version for `sluice_build_info`. Every known label set starts at 0, so a rate over it
    /// exists before the first event.
    pub fn new(tenants: TenantLabels, librdkafka: &str) -> Self {
        let m = Self {
            registry: Registry::default(),
            relay: RelayMetrics::new(&tenants),
            plugin: PluginMetrics::default(),
            sink: SinkMetrics::default(),
            backlog: BacklogMetrics::new(tenants.clone()),
            health: HealthMetrics::default(),
            trace: crate::trace::TraceCounters::default(),
            tenants,
            retired: Mutex::default(),
        };
        let mut registry = Registry::default();
        // Sluice's own metrics carry the prefix; the process collector's `process_*` do not.
        let sluice = registry.sub_registry_with_prefix("sluice");
        process::register_build_info(sluice, librdkafka);
        m.relay.register(sluice);
        m.plugin.register(sluice);
        m.sink.register(sluice);
        m.backlog.register(sluice);
        m.health.register(sluice);
        trace::register(sluice, &m.trace);
        process::register(&mut registry);
        Self { registry, ..m }
    }

    /// Adds a collector read at each scrape (the app's per-tenant plugin state).
    pub fn register_collector(&mut self, collector: impl Collector) {
        self.registry.register_collector(Box::new(collector));
    }

    /// The exposition in the Prometheus text format (version 0.0.4).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    pub fn tenants(&self) -> &TenantLabels {
        &self.tenants
    }

    /// Replaces the tenants configured under `[tenants.*]` (the relay calls it at start;
    /// call it again when the configured tenants change while running). Tenants that gain
    /// their own label value (they fit within `[telemetry] tenant_series` now) start at 0;
    /// those that lose it have every series removed, and their rows count into `_default`
    /// from then on.
    pub fn set_configured_tenants<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let change = self.tenants.set_configured(names);
        for tenant in &change.lost {
            self.forget_tenant(tenant);
        }
        for tenant in &change.gained {
            self.relay.start_tenant(tenant);
        }
        if !change.lost.is_empty() || !change.gained.is_empty() {
            tracing::info!(
                gained = change.gained.len(),
                lost = change.lost.len(),
                labelled = self.tenants.all().len().saturating_sub(1),
                "tenants with their own metric label changed"
            );
        }
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        retired.extend(change.lost);
    }

    /// Replaces the sampled backlog gauges (see [`BacklogMetrics::set_tenant_samples`]), and
    /// removes again what label values lost since the last sample may have had recorded.
    pub fn set_tenant_samples(&self, samples: &[(Option<&str>, TenantSample)]) {
        let retired =
            std::mem::take(&mut *self.retired.lock().unwrap_or_else(PoisonError::into_inner));
        for tenant in retired.iter().filter(|t| !self.tenants.is_taken(t)) {
            self.forget_tenant(tenant);
        }
        self.backlog.set_tenant_samples(samples);
    }

    /// Removes every series of the label value `tenant`.
    fn forget_tenant(&self, tenant: &Arc<str>) {
        self.relay.forget_tenant(tenant);
        self.plugin.forget_tenant(tenant);
        self.sink.forget_tenant(tenant);
        self.backlog.forget_tenant(tenant);
    }

    /// The `plugin` label value of `plugin` run for `tenant` (see
    /// [`TenantLabels::plugin_label`]).
    pub fn plugin_label<'a>(&self, tenant: &TenantId, plugin: &'a str) -> &'a str {
        self.tenants.plugin_label(tenant, plugin)
    }

    /// The label value of `tenant`.
    pub fn tenant(&self, tenant: &TenantId) -> Arc<str> {
        self.tenants.of(tenant)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The value of `series` (name and labels, as exposed) in the exposition `text`.
    pub(crate) fn sample_value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[test]
    fn counters_are_exposed_with_bounded_tenant_labels() {
        let m = Metrics::new(TenantLabels::new(["acme"]), "2.12.1");
        let acme = m.tenant(&TenantId::named("acme"));
        let other = m.tenant(&TenantId::named("someone-else"));
        m.relay.rows_completed(&acme, RowOutcome::Sent, 3);
        m.relay.rows_completed(&other, RowOutcome::Dead, 2);
        m.sink
            .produced(&acme, crate::model::Broker::Kafka, "t.orders", 3, 300);
        let text = m.encode().unwrap();
        assert_eq!(
            sample_value(
                &text,
                "sluice_rows_completed_total{tenant=\"acme\",outcome=\"sent\"}"
            ),
            Some(3.0),
            "{text}"
        );
        assert_eq!(
            sample_value(
                &text,
                "sluice_rows_completed_total{tenant=\"_default\",outcome=\"dead\"}"
            ),
            Some(2.0)
        );
        // Known label sets start at zero.
        assert_eq!(
            sample_value(
                &text,
                "sluice_rows_completed_total{tenant=\"acme\",outcome=\"dead\"}"
            ),
            Some(0.0)
        );
        assert_eq!(
            sample_value(
                &text,
                "sluice_produced_bytes_total{tenant=\"acme\",broker=\"kafka\",topic=\"t.orders\"}"
            ),
            Some(300.0)
        );
        assert!(!text.contains("someone-else"), "{text}");
        assert!(text.contains("sluice_build_info{version="), "{text}");
    }

    #[test]
    fn label_values_are_exposed_as_declared() {
        let m = Metrics::new(TenantLabels::new(None::<&str>), "2.12.1");
        m.relay.poll_woken(WakeCause::Refill);
        let text = m.encode().unwrap();
        assert_eq!(
            sample_value(&text, "sluice_poll_wakeups_total{cause=\"refill\"}"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample_value(&text, "sluice_claims_total{result=\"empty\"}"),
            Some(0.0)
        );
    }
}
