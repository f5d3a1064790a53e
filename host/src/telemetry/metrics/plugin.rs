//! What the plugins record: per tenant and plugin, how long a batch's rows took and how each
//! came out; and [`PluginStates`], the per-tenant plugin state the app reads from the router
//! at each scrape (paused, quarantined, plugin identity, instances, limits, guest counters).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::{HistogramFamily, TenantLabel, label_values, latency_histogram};
use crate::telemetry::TenantLabels;

/// The `plugin` label value of rows no plugin could take (no `[plugins.default]`).
pub(crate) const NO_PLUGIN: &str = "_none";

label_values! {
    /// The `outcome` label values of `sluice_transform_calls_total`.
    pub enum PluginOutcome {
        Ok => "ok",
        Retryable => "retryable",
        Permanent => "permanent",
        Trap => "trap",
        Timeout => "timeout",
        InvalidOutput => "invalid_output",
        Unavailable => "unavailable",
        /// Only ever seen with `plugin="_none"` ([`NO_PLUGIN`]).
        NoPlugin => "no_plugin",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantPlugin {
    tenant: Arc<str>,
    plugin: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantPluginOutcome {
    tenant: Arc<str>,
    plugin: Arc<str>,
    outcome: PluginOutcome,
}

/// The plugin call families.
#[derive(Debug)]
pub struct PluginMetrics {
    /// Every `plugin` label value recorded so far (bounded: configured paths, the default
    /// plugin's, `_none` and `_other`), to find a tenant's series to remove.
    plugins: Mutex<HashSet<Arc<str>>>,
    transform_duration: HistogramFamily<TenantPlugin>,
    transform_calls: Family<TenantPluginOutcome, Counter>,
}

impl Default for PluginMetrics {
    fn default() -> Self {
        Self {
            plugins: Mutex::default(),
            transform_duration: Family::new_with_constructor(latency_histogram),
            transform_calls: Family::default(),
        }
    }
}

impl PluginMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register_with_unit(
            "transform_duration",
            "Time to run one batch's rows of a tenant through its plugin, by tenant and plugin",
            Unit::Seconds,
            self.transform_duration.clone(),
        );
        r.register(
            "transform_calls",
            "Rows run through a plugin, by tenant, plugin and outcome (ok, retryable, permanent, trap, timeout, invalid_output, unavailable, no_plugin)",
            self.transform_calls.clone(),
        );
    }

    /// Starts the transform series of each configured tenant (and `_default`) with the
    /// plugin it runs at 0. The plugin a tenant runs is fixed by the config (a reload changes
    /// the file's content, not its path), so these are the label sets there will be.
    pub fn initialise<'a>(&self, plugins: impl IntoIterator<Item = (Arc<str>, &'a str)>) {
        for (tenant, plugin) in plugins {
            let plugin = self.plugin(plugin);
            let _ = self.transform_duration.get_or_create(&TenantPlugin {
                tenant: Arc::clone(&tenant),
                plugin: Arc::clone(&plugin),
            });
            let outcomes = PluginOutcome::ALL
                .iter()
                .filter(|&&o| o != PluginOutcome::NoPlugin);
            for &outcome in outcomes {
                let _ = self.transform_calls.get_or_create(&TenantPluginOutcome {
                    tenant: Arc::clone(&tenant),
                    plugin: Arc::clone(&plugin),
                    outcome,
                });
            }
        }
    }

    /// The label value `plugin`, kept to find series by.
    fn plugin(&self, plugin: &str) -> Arc<str> {
        let mut plugins = self.plugins.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = plugins.get(plugin) {
            return Arc::clone(known);
        }
        let label: Arc<str> = Arc::from(plugin);
        plugins.insert(Arc::clone(&label));
        label
    }

    /// Removes every series of the label value `tenant`.
    pub(super) fn forget_tenant(&self, tenant: &Arc<str>) {
        let plugins: Vec<Arc<str>> = {
            let plugins = self.plugins.lock().unwrap_or_else(PoisonError::into_inner);
            plugins.iter().cloned().collect()
        };
        for plugin in plugins {
            self.transform_duration.remove(&TenantPlugin {
                tenant: Arc::clone(tenant),
                plugin: Arc::clone(&plugin),
            });
            for &outcome in PluginOutcome::ALL {
                self.transform_calls.remove(&TenantPluginOutcome {
                    tenant: Arc::clone(tenant),
                    plugin: Arc::clone(&plugin),
                    outcome,
                });
            }
        }
    }

    /// One batch's rows of the tenant labelled `tenant` ran through `plugin` in `took`
    /// (`None`: not run, e.g. no plugin), with these counts by outcome.
    pub fn transformed(
        &self,
        tenant: &Arc<str>,
        plugin: &str,
        took: Option<Duration>,
        outcomes: &[(PluginOutcome, u64)],
    ) {
        let plugin = self.plugin(plugin);
        if let Some(took) = took {
            self.transform_duration
                .get_or_create(&TenantPlugin {
                    tenant: Arc::clone(tenant),
                    plugin: Arc::clone(&plugin),
                })
                .observe(took.as_secs_f64());
        }
        for &(outcome, rows) in outcomes {
            self.transform_calls
                .get_or_create(&TenantPluginOutcome {
                    tenant: Arc::clone(tenant),
                    plugin: Arc::clone(&plugin),
                    outcome,
                })
                .inc_by(rows);
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginInfo {
    tenant: Arc<str>,
    plugin: String,
    plugin_version: String,
    digest: String,
    source: String,
    signer: String,
}

/// What identifies a loaded plugin's bytes in `sluice_plugin_info` (empty strings for
/// builtins).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Loaded<'a> {
    pub(crate) digest: &'a str,
    pub(crate) source: &'a str,
    pub(crate) signer: &'a str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantReason {
    tenant: Arc<str>,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLimit {
    tenant: Arc<str>,
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantCounter {
    tenant: Arc<str>,
    name: String,
}

/// The per-tenant plugin state of one scrape: filled from the router, then encoded. Tenants
/// without their own label value share one (the gauges: but for the laggards'); their gauges
/// say whether any of them is paused.
#[derive(Debug)]
pub(crate) struct PluginStates {
    paused: Family<TenantLabel, Gauge>,
    quarantined: Family<TenantLabel, Gauge>,
    info: Family<PluginInfo, Gauge>,
    custom: Family<TenantCounter, Counter>,
    instantiations: Family<TenantReason, Counter>,
    limit_hits: Family<TenantLimit, Counter>,
}

impl PluginStates {
    /// Every gauge label value of `tenants` (see [`TenantLabels::gauge_values`]) neither
    /// paused nor quarantined.
    pub(crate) fn new(tenants: &TenantLabels) -> Self {
        let states = Self {
            paused: Family::default(),
            quarantined: Family::default(),
            info: Family::default(),
            custom: Family::default(),
            instantiations: Family::default(),
            limit_hits: Family::default(),
        };
        for tenant in tenants.gauge_values() {
            let _ = states.paused.get_or_create(&TenantLabel {
                tenant: Arc::clone(&tenant),
            });
            let _ = states.quarantined.get_or_create(&TenantLabel { tenant });
        }
        states
    }

    pub(crate) fn paused(&self, tenant: &Arc<str>) {
        let tenant = Arc::clone(tenant);
        self.paused.get_or_create(&TenantLabel { tenant }).set(1);
    }

    pub(crate) fn quarantined(&self, tenant: &Arc<str>) {
        let tenant = Arc::clone(tenant);
        self.quarantined
            .get_or_create(&TenantLabel { tenant })
            .set(1);
    }

    /// The plugin `tenant` runs: its name, its version, the loaded bytes' digest, where they
    /// came from and who signed them.
    pub(crate) fn info(&self, tenant: &Arc<str>, plugin: &str, version: &str, loaded: Loaded<'_>) {
        self.info
            .get_or_create(&PluginInfo {
                tenant: Arc::clone(tenant),
                plugin: plugin.to_owned(),
                plugin_version: version.to_owned(),
                digest: loaded.digest.to_owned(),
                source: loaded.source.to_owned(),
                signer: loaded.signer.to_owned(),
            })
            .set(1);
    }

    /// `n` plugin instances of `tenant` were created for `reason`.
    pub(crate) fn instantiations(&self, tenant: &Arc<str>, reason: &'static str, n: u64) {
        let tenant = Arc::clone(tenant);
        self.instantiations
            .get_or_create(&TenantReason { tenant, reason })
            .inc_by(n);
    }

    /// `tenant`'s plugin ran into `limit` `n` times.
    pub(crate) fn limit_hits(&self, tenant: &Arc<str>, limit: &'static str, n: u64) {
        let tenant = Arc::clone(tenant);
        self.limit_hits
            .get_or_create(&TenantLimit { tenant, limit })
            .inc_by(n);
    }

    /// The guest's own counter `name` (host `counter-add`) reads `value`.
    pub(crate) fn custom(&self, tenant: &Arc<str>, name: &str, value: u64) {
        let (tenant, name) = (Arc::clone(tenant), name.to_owned());
        self.custom
            .get_or_create(&TenantCounter { tenant, name })
            .inc_by(value);
    }

    /// Writes the families into a scrape.
    pub(crate) fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut encoder;
        encode_family(
            e,
            "sluice_tenant_paused",
            "Whether the tenant's circuit breaker has paused it (1) or not (0)",
            &self.paused,
        )?;
        encode_family(
            e,
            "sluice_tenant_quarantined",
            "Whether the tenant's plugin failed to start and its rows wait (1) or not (0)",
            &self.quarantined,
        )?;
        encode_family(
            e,
            "sluice_plugin_info",
            "The plugin a tenant runs: its version (from its info()), the loaded bytes' digest, their source (file, or OCI reference with the manifest digest) and signer (minisign key id, empty without trusted_keys); they change on hot reload",
            &self.info,
        )?;
        encode_family(
            e,
            "sluice_plugin_custom",
            "The guest's own counters (host counter-add), at most 32 names per tenant",
            &self.custom,
        )?;
        encode_family(
            e,
            "sluice_plugin_instantiations",
            "Plugin instances created, by reason: start, reload, after_trap, recycle \
             (recycle_memory_percent), evicted (re-created after making room)",
            &self.instantiations,
        )?;
        encode_family(
            e,
            "sluice_tenant_limit_hits",
            "Sandbox limits a tenant's plugin ran into: call_timeout, memory, table_elements, \
             output_copy, output (a refused message), batch_time_budget, batch_output_budget",
            &self.limit_hits,
        )
    }
}

/// Writes one family, `name` and `help` first, into a scrape.
fn encode_family(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    family: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(metric)
}
