//! One tenant's live plugin instance: its own Store (memory cap, epoch deadline) and the calls
//! into the guest. A trapped instance is poisoned; the owner drops it and creates a new one.

use std::sync::Arc;

use wasmtime::{Store, Trap};

use super::bindings::Plugin;
use super::bindings::types::{self as wit, PluginInfo};
use super::component::LoadedPlugin;
use super::engine::PluginEngine;
use super::engine::deadline_ticks;
use super::host_api::HostState;
use super::limits::Limits;
use super::{PluginError, TransformFailure};
use crate::outbox::{OutboxRow, TenantId};

/// A configured instance of a plugin for one tenant.
pub struct TenantInstance {
    store: Store<HostState>,
    bindings: Plugin,
    limits: Limits,
    engine: Arc<PluginEngine>,
}

impl TenantInstance {
    /// Instantiates `plugin` in a fresh Store for `tenant` and calls `configure(config)`.
    pub fn create(
        plugin: &Arc<LoadedPlugin>,
        tenant: &TenantId,
        config: &[(String, String)],
        limits: &Limits,
    ) -> Result<Self, PluginError> {
        let mut instance = Self::instantiate(plugin, tenant, limits)?;
        let engine = Arc::clone(&instance.engine);
        let _running = engine.enter();
        instance.arm();
        let configured = instance
            .bindings
            .sluice_plugin_transformer()
            .call_configure(&mut instance.store, config)
            .map_err(|e| PluginError::Instantiate {
                path: plugin.path().to_owned(),
                tenant: tenant.clone(),
                message: describe_trap(&e, limits),
            })?;
        configured.map_err(|message| PluginError::Configure {
            path: plugin.path().to_owned(),
            tenant: tenant.clone(),
            message,
        })?;
        Ok(instance)
    }

    /// Instantiates `plugin` in a fresh Store without configuring it (for `info()`).
    pub fn instantiate(
        plugin: &Arc<LoadedPlugin>,
        tenant: &TenantId,
        limits: &Limits,
    ) -> Result<Self, PluginError> {
        let _running = plugin.engine().enter();
        let engine = plugin.engine().engine();
        let mut store = Store::new(
            engine,
            HostState::new(tenant.clone(), limits.store_limits()),
        );
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(deadline_ticks(limits.call_timeout));
        let instance_err = |message: String| PluginError::Instantiate {
            path: plugin.path().to_owned(),
            tenant: tenant.clone(),
            message,
        };
        let bindings = plugin
            .pre()
            .instantiate(&mut store)
            .map_err(|e| instance_err(describe_trap(&e, limits)))?;
        Ok(Self {
            store,
            bindings,
            limits: limits.clone(),
            engine: Arc::clone(plugin.engine()),
        })
    }

    /// Sets a fresh deadline before each call into the guest.
    fn arm(&mut self) {
        self.store
            .set_epoch_deadline(deadline_ticks(self.limits.call_timeout));
    }

    /// The plugin's `info()`.
    pub fn info(&mut self) -> Result<PluginInfo, String> {
        let engine = Arc::clone(&self.engine);
        let _running = engine.enter();
        self.arm();
        self.bindings
            .sluice_plugin_transformer()
            .call_info(&mut self.store)
            .map_err(|e| describe_trap(&e, &self.limits))
    }

    /// Runs one row through the plugin. `Err` means the call trapped and this instance is
    /// poisoned and must be dropped; the plugin's own answer (messages or error) is `Ok`, to
    /// be checked with [`super::output::accept`].
    pub fn transform(&mut self, row: &OutboxRow) -> Result<Answer, Trapped> {
        let input = to_wit_row(row);
        let engine = Arc::clone(&self.engine);
        let _running = engine.enter();
        self.arm();
        self.bindings
            .sluice_plugin_transformer()
            .call_transform(&mut self.store, &input)
            .map_err(|e| Trapped::from_error(&e, &self.limits))
    }

    /// Runs several rows through the plugin's `transform-batch` in one call (one deadline for
    /// the whole call). A result list of the wrong length is refused.
    pub fn transform_batch(&mut self, rows: &[&OutboxRow]) -> Result<Vec<Answer>, Trapped> {
        let input: Vec<wit::OutboxRow> = rows.iter().map(|row| to_wit_row(row)).collect();
        let engine = Arc::clone(&self.engine);
        let _running = engine.enter();
        self.arm();
        let answers = self
            .bindings
            .sluice_plugin_transformer()
            .call_transform_batch(&mut self.store, &input)
            .map_err(|e| Trapped::from_error(&e, &self.limits))?;
        if answers.len() != rows.len() {
            return Err(Trapped {
                reason: format!(
                    "plugin's transform-batch returned {} results for {} rows",
                    answers.len(),
                    rows.len()
                ),
                deadline: false,
            });
        }
        Ok(answers)
    }

    /// Counters the guest reported through `counter-add`.
    pub fn counters(&self) -> &std::collections::HashMap<String, u64> {
        self.store.data().counters()
    }
}

/// The plugin's own answer for one row.
pub type Answer = Result<Vec<wit::OutputMessage>, wit::TransformError>;

/// A guest call that trapped; the instance must be discarded.
#[derive(Debug, Clone, PartialEq)]
pub struct Trapped {
    pub reason: String,
    /// The call ran into its `call_timeout`.
    pub deadline: bool,
}

impl Trapped {
    fn from_error(error: &wasmtime::Error, limits: &Limits) -> Self {
        Self {
            reason: describe_trap(error, limits),
            deadline: matches!(error.downcast_ref::<Trap>(), Some(Trap::Interrupt)),
        }
    }

    /// The row's failure.
    pub fn into_failure(self) -> TransformFailure {
        if self.deadline {
            TransformFailure::DeadlineExceeded(self.reason)
        } else {
            TransformFailure::Trapped(self.reason)
        }
    }
}

/// Converts a claimed row to the WIT record.
pub fn to_wit_row(row: &OutboxRow) -> wit::OutboxRow {
    wit::OutboxRow {
        id: row.id.to_string(),
        tenant: row.tenant.as_str().to_owned(),
        aggregate_type: row.aggregate_type.clone(),
        aggregate_id: row.aggregate_id.clone(),
        event_type: row.event_type.clone(),
        payload: row.payload.clone(),
        headers: row.headers.clone(),
        created_at_ms: row.created_at.timestamp_millis(),
        attempt: u32::try_from(row.attempts.saturating_add(1)).unwrap_or(1),
    }
}

/// Human-readable reason for a failed guest call: deadline, memory cap or other trap.
fn describe_trap(error: &wasmtime::Error, limits: &Limits) -> String {
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => format!(
            "plugin exceeded its call_timeout of {}",
            humantime::format_duration(limits.call_timeout)
        ),
        _ => {
            let text = format!("{error:#}");
            if text.contains("forcing trap when growing memory") {
                format!(
                    "plugin exceeded its memory limit of {} MiB: {text}",
                    limits.memory_bytes / (1024 * 1024)
                )
            } else {
                format!("plugin trapped: {text}")
            }
        }
    }
}
