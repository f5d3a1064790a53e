//! What the plugin router records into the relay's [`Metrics`]: per tenant and plugin, how
//! long a batch's rows took in the plugin and how each came out. Recorded once per tenant per
//! batch (counts summed first), so the cost does not grow with the rows.

use std::time::Duration;

use crate::model::TenantId;
use crate::model::{RowResult, TransformFailure};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::{NO_PLUGIN, PluginOutcome};

/// The `outcome` label of a plugin's result for one row; `None` for rows not run (deferred,
/// tenant paused).
pub fn outcome_label(result: &RowResult) -> Option<PluginOutcome> {
    Some(match result {
        Ok(_) => PluginOutcome::Ok,
        Err(TransformFailure::Retryable { .. }) => PluginOutcome::Retryable,
        Err(TransformFailure::Permanent { .. }) => PluginOutcome::Permanent,
        Err(TransformFailure::Trapped(_)) => PluginOutcome::Trap,
        Err(TransformFailure::DeadlineExceeded(_)) => PluginOutcome::Timeout,
        Err(TransformFailure::InvalidOutput(_)) => PluginOutcome::InvalidOutput,
        Err(TransformFailure::NoPlugin(_)) => PluginOutcome::NoPlugin,
        Err(TransformFailure::Unavailable(_)) => PluginOutcome::Unavailable,
        // Encoding follows the plugin call: its failures are not the plugin's outcome.
        Err(
            TransformFailure::Deferred(_)
            | TransformFailure::Paused { .. }
            | TransformFailure::SchemaMismatch(_)
            | TransformFailure::SchemaUnavailable(_),
        ) => return None,
    })
}

/// Records one tenant's group of a batch: `plugin` ran it in `took` (`None`: it did not run).
pub fn record_group(
    metrics: &Metrics,
    tenant: &TenantId,
    plugin: &str,
    took: Option<Duration>,
    results: &[RowResult],
) {
    let mut counts: Vec<(PluginOutcome, u64)> = Vec::new();
    for outcome in results.iter().filter_map(outcome_label) {
        match counts.iter_mut().find(|(o, _)| *o == outcome) {
            Some((_, n)) => *n += 1,
            None => counts.push((outcome, 1)),
        }
    }
    if took.is_none() && counts.is_empty() {
        return;
    }
    let plugin = metrics.plugin_label(tenant, plugin);
    metrics
        .plugin
        .transformed(&metrics.tenant(tenant), plugin, took, &counts);
}

/// Records rows no plugin could take (no `[plugins.default]` for their tenant).
pub fn record_no_plugin(metrics: &Metrics, tenant: &TenantId, rows: usize) {
    let rows = [(PluginOutcome::NoPlugin, rows as u64)];
    metrics
        .plugin
        .transformed(&metrics.tenant(tenant), NO_PLUGIN, None, &rows);
}
