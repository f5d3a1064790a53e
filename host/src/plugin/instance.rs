//! One tenant's live plugin instance: its own Store (memory cap, epoch deadline) and the calls
//! into the guest. A trapped instance is poisoned; the owner drops it and creates a new one.

use std::sync::Arc;

use wasmtime::{Store, Trap};

use super::bindings::Plugin;
use super::bindings::types::{self as wit, PluginInfo};
use super::component::LoadedPlugin;
use super::engine::deadline_ticks;
use super::host_api::HostState;
use super::limits::Limits;
use super::{PluginError, TransformFailure};
use crate::message::Message;
use crate::outbox::{OutboxRow, TenantId};

/// A configured instance of a plugin for one tenant.
pub struct TenantInstance {
    store: Store<HostState>,
    bindings: Plugin,
    limits: Limits,
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
        })
    }

    /// Sets a fresh deadline before each call into the guest.
    fn arm(&mut self) {
        self.store
            .set_epoch_deadline(deadline_ticks(self.limits.call_timeout));
    }

    /// The plugin's `info()`.
    pub fn info(&mut self) -> Result<PluginInfo, String> {
        self.arm();
        self.bindings
            .sluice_plugin_transformer()
            .call_info(&mut self.store)
            .map_err(|e| describe_trap(&e, &self.limits))
    }

    /// Runs one row through the plugin and validates its output. `Err(Trapped)` means this
    /// instance is poisoned and must be dropped.
    pub fn transform(&mut self, row: &OutboxRow) -> Result<Vec<Message>, TransformFailure> {
        self.arm();
        let input = to_wit_row(row);
        let result = self
            .bindings
            .sluice_plugin_transformer()
            .call_transform(&mut self.store, &input)
            .map_err(|e| TransformFailure::Trapped(describe_trap(&e, &self.limits)))?;
        match result {
            Ok(messages) if messages.len() > self.limits.max_outputs_per_row => {
                Err(TransformFailure::InvalidOutput(format!(
                    "plugin returned {} messages for one row; max_outputs_per_row is {}",
                    messages.len(),
                    self.limits.max_outputs_per_row
                )))
            }
            Ok(messages) => messages
                .into_iter()
                .map(|m| self.validate(row, m))
                .collect(),
            Err(wit::TransformError::Retryable(d)) => Err(TransformFailure::Retryable {
                code: d.code,
                message: d.message,
            }),
            Err(wit::TransformError::Permanent(d)) => Err(TransformFailure::Permanent {
                code: d.code,
                message: d.message,
            }),
        }
    }

    /// Counters the guest reported through `counter-add`.
    pub fn counters(&self) -> &std::collections::HashMap<String, u64> {
        self.store.data().counters()
    }

    fn validate(
        &self,
        row: &OutboxRow,
        m: wit::OutputMessage,
    ) -> Result<Message, TransformFailure> {
        if m.topic.is_empty() {
            return Err(TransformFailure::InvalidOutput(
                "plugin returned a message with an empty topic".into(),
            ));
        }
        if !self.limits.topic_allowed(&m.topic) {
            return Err(TransformFailure::InvalidOutput(format!(
                "plugin routed to topic {:?}, which is not in tenant {}'s allowed_topics",
                m.topic, row.tenant
            )));
        }
        let size = m.key.as_ref().map_or(0, Vec::len)
            + m.payload.as_ref().map_or(0, Vec::len)
            + m.headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        if size > self.limits.max_message_bytes {
            return Err(TransformFailure::InvalidOutput(format!(
                "plugin returned a {size}-byte message for topic {:?}; max_message_bytes is {}",
                m.topic, self.limits.max_message_bytes
            )));
        }
        Ok(Message {
            row: row.id,
            topic: m.topic,
            key: m.key,
            payload: m.payload,
            headers: stamp_headers(m.headers, row),
            partition: m.partition,
        })
    }
}

/// Header names the host owns: whatever a plugin sets under these names is replaced.
pub const TENANT_HEADER: &str = "sluice-tenant";
pub const OUTBOX_ID_HEADER: &str = "sluice-outbox-id";

/// Drops any `sluice-tenant` / `sluice-outbox-id` the plugin set and appends the true values,
/// so consumers can trust them.
fn stamp_headers(mut headers: Vec<(String, Vec<u8>)>, row: &OutboxRow) -> Vec<(String, Vec<u8>)> {
    headers.retain(|(k, _)| {
        !k.eq_ignore_ascii_case(TENANT_HEADER) && !k.eq_ignore_ascii_case(OUTBOX_ID_HEADER)
    });
    headers.push((
        TENANT_HEADER.to_owned(),
        row.tenant.as_str().as_bytes().to_vec(),
    ));
    headers.push((OUTBOX_ID_HEADER.to_owned(), row.id.to_string().into_bytes()));
    headers
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
