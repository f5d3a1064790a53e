//! One tenant's live plugin instance: its own `wasmtime::Store` (memory cap, epoch deadline, copy
//! budget) and the calls into the guest, each bounded in wall-clock time (see [`super::call`]). A
//! trapped instance is poisoned; the owner drops it and creates a new one.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::{PoolConcurrencyLimitError, Trap};

use crate::model::TransformFailure;
use crate::model::{ColumnValue, OutboxId, OutboxRow};
use crate::plugin::PluginError;
use crate::plugin::limits::{LimitExceeded, Limits};
use crate::plugin::wasm::bindings::types::{self as wit, PluginInfo};
use crate::plugin::wasm::call::WaitedPastDeadline;
use crate::plugin::wasm::component::LoadedPlugin;
use crate::plugin::wasm::contract::Exports;
use crate::plugin::wasm::engine::PluginEngine;
use crate::plugin::wasm::engine::deadline_ticks;
use crate::plugin::wasm::guest_output::{GUEST_OUTPUT_TAIL, GuestOutput};
use crate::plugin::wasm::host_api::{HostState, TenantShared};
use crate::text::{MAX_LOGGED, bounded};

/// Longest plugin name or version kept from `info()`.
const MAX_INFO_FIELD: usize = 256;
/// Longest config schema kept from `info()`.
const MAX_CONFIG_SCHEMA: usize = 64 * 1024;
/// Most record schemas kept from `info()`.
const MAX_DECLARED_SCHEMAS: usize = 256;

/// A configured instance of a plugin for one tenant.
pub(crate) struct WasmInstance {
    wasm_store: wasmtime::Store<HostState>,
    bindings: Exports,
    limits: Limits,
    engine: Arc<PluginEngine>,
    /// Linear memory once instantiated and configured.
    baseline_memory: usize,
}

impl WasmInstance {
    /// Instantiates `plugin` in a fresh `wasmtime::Store` for `tenant` and calls
    /// `configure(config)`.
    pub(crate) fn create(
        plugin: &Arc<LoadedPlugin>,
        shared: &Arc<TenantShared>,
        config: &[(String, String)],
        limits: &Limits,
    ) -> Result<Self, PluginError> {
        let mut instance = Self::instantiate(plugin, shared, limits)?;
        if plugin.version().is_none() {
            // Once per loaded file, so `sluice_plugin_info` shows the version a reload brought.
            match instance.info() {
                Ok(info) => {
                    plugin.set_declared_schemas(&info.schemas);
                    plugin.set_version(info.version);
                }
                Err(_) => {
                    plugin.set_version(String::new());
                    // A failed call leaves the `wasmtime::Store` unusable: start from a fresh one.
                    instance = Self::instantiate(plugin, shared, limits)?;
                }
            }
        }
        let tenant = shared.tenant();
        let config: Vec<(&str, &str)> = config
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let configured = instance
            .call(|bindings, wasm_store| bindings.configure(wasm_store, &config))
            .map_err(|trapped| PluginError::Instantiate {
                path: plugin.path().to_owned(),
                tenant: tenant.clone(),
                message: trapped.reason,
            })?;
        configured.map_err(|message| PluginError::Configure {
            path: plugin.path().to_owned(),
            tenant: tenant.clone(),
            message: bounded(&message, MAX_LOGGED).into_owned(),
        })?;
        instance.baseline_memory = instance.memory_bytes();
        Ok(instance)
    }

    /// Instantiates `plugin` in a fresh `wasmtime::Store` without configuring it (for `info()`).
    pub(crate) fn instantiate(
        plugin: &Arc<LoadedPlugin>,
        shared: &Arc<TenantShared>,
        limits: &Limits,
    ) -> Result<Self, PluginError> {
        let slot = plugin.engine().memory_slot();
        if u64::try_from(limits.memory_bytes).unwrap_or(u64::MAX) > slot {
            // The pool's slots were sized at start from the largest `memory_mb` then.
            return Err(PluginError::Instantiate {
                path: plugin.path().to_owned(),
                tenant: shared.tenant().clone(),
                message: format!(
                    "memory_mb {} is larger than the plugin instance pool's memory slots ({} MiB, \
                     sized at start from the largest memory_mb configured then): restart to \
                     apply it",
                    limits.memory_bytes >> 20,
                    slot >> 20
                ),
            });
        }
        let _running = plugin.engine().enter();
        let mut state = HostState::new(Arc::clone(shared), limits.limiter());
        state.deadline = Instant::now() + limits.call_timeout;
        let mut wasm_store = wasmtime::Store::new(plugin.engine().engine(), state);
        wasm_store.limiter(|state| &mut state.limiter);
        wasm_store.set_epoch_deadline(deadline_ticks(limits.call_timeout));
        // What the host may copy out of the guest per call: results and host-call arguments.
        wasm_store.set_hostcall_fuel(limits.copy_budget());
        let instantiated = match plugin.pre().instantiate(&mut wasm_store) {
            Ok(bindings) => bindings,
            Err(e) if e.downcast_ref::<PoolConcurrencyLimitError>().is_some() => {
                return Err(PluginError::PoolExhausted {
                    message: bounded(&format!("{e:#}"), MAX_LOGGED).into_owned(),
                });
            }
            Err(e) => {
                let state = wasm_store.data();
                let trapped = Trapped::from_error(&e, limits)
                    .with_budgeted_output(&state.output, &state.shared);
                return Err(PluginError::Instantiate {
                    path: plugin.path().to_owned(),
                    tenant: shared.tenant().clone(),
                    message: trapped.reason,
                });
            }
        };
        let bindings = instantiated;
        let baseline_memory = wasm_store.data().limiter.memory_used();
        Ok(Self {
            wasm_store,
            bindings,
            limits: limits.clone(),
            engine: Arc::clone(plugin.engine()),
            baseline_memory,
        })
    }

    /// Calls into the guest, synchronously: a fresh epoch deadline (for guest code) and
    /// wall-clock deadline (for time spent waiting in host functions), both `call_timeout`.
    fn call<T>(
        &mut self,
        f: impl FnOnce(&Exports, &mut wasmtime::Store<HostState>) -> wasmtime::Result<T>,
    ) -> Result<T, Trapped> {
        let _running = self.engine.enter();
        // Deadlines count from the moment they are armed, so arm after entering.
        let timeout = self.limits.call_timeout;
        self.wasm_store.set_epoch_deadline(deadline_ticks(timeout));
        self.wasm_store.data_mut().deadline = Instant::now() + timeout;
        let output = self.wasm_store.data().output.clone();
        output.clear();
        match f(&self.bindings, &mut self.wasm_store) {
            Ok(value) => Ok(value),
            Err(e) => {
                let trapped = Trapped::from_error(&e, &self.limits);
                Err(trapped.with_budgeted_output(&output, &self.wasm_store.data().shared))
            }
        }
    }

    /// Linear memory of the instance's `wasmtime::Store` now, in bytes.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.wasm_store.data().limiter.memory_used()
    }

    /// Linear memory right after instantiation and `configure`, in bytes.
    pub(crate) fn baseline_memory_bytes(&self) -> usize {
        self.baseline_memory
    }

    /// The plugin's `info()`, with its text made safe to print.
    pub(crate) fn info(&mut self) -> Result<PluginInfo, String> {
        let info = self
            .call(|bindings, wasm_store| bindings.info(wasm_store))
            .map_err(|trapped| trapped.reason)?;
        Ok(PluginInfo {
            name: bounded(&info.name, MAX_INFO_FIELD).into_owned(),
            version: bounded(&info.version, MAX_INFO_FIELD).into_owned(),
            config_schema: info
                .config_schema
                .map(|s| bounded(&s, MAX_CONFIG_SCHEMA).into_owned()),
            // Kept as declared (they are registered verbatim), but no more of them than a
            // plugin can sensibly emit records of; the copy budget bounds their size.
            schemas: info
                .schemas
                .into_iter()
                .take(MAX_DECLARED_SCHEMAS)
                .collect(),
        })
    }

    /// Runs one row through the plugin. `Err` means the call trapped and this instance is
    /// poisoned and must be dropped; the plugin's own answer (messages or error) is `Ok`, to
    /// be checked with [`crate::plugin::output::accept`].
    pub(crate) fn transform(&mut self, row: &OutboxRow) -> Result<Answer, Trapped> {
        let parts = WitParts::of(row);
        let input = parts.row(row);
        self.call(|bindings, wasm_store| bindings.transform(wasm_store, input))
    }

    /// Runs several rows through the plugin's `transform-batch` in one call (one deadline for
    /// the whole call). A result list of the wrong length is refused.
    pub(crate) fn transform_batch(&mut self, rows: &[&OutboxRow]) -> Result<Vec<Answer>, Trapped> {
        let parts: Vec<WitParts<'_>> = rows.iter().map(|row| WitParts::of(row)).collect();
        let input: Vec<wit::OutboxRow<'_>> = parts
            .iter()
            .zip(rows)
            .map(|(parts, row)| parts.row(row))
            .collect();
        let answers =
            self.call(|bindings, wasm_store| bindings.transform_batch(wasm_store, &input))?;
        if answers.len() != rows.len() {
            return Err(Trapped {
                reason: format!(
                    "plugin's transform-batch returned {} results for {} rows",
                    answers.len(),
                    rows.len()
                ),
                deadline: false,
                guest_output: None,
                limit: None,
            });
        }
        Ok(answers)
    }
}

pub(crate) use crate::plugin::wasm::contract::Answer;

/// A guest call that trapped; the instance must be discarded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Trapped {
    /// Why, bounded and free of control characters.
    pub reason: String,
    /// The call ran into its `call_timeout`.
    pub deadline: bool,
    /// The end of what the guest wrote to stdout/stderr during the call (escaped, at most
    /// [`GUEST_OUTPUT_TAIL`] bytes before escaping), for the log; its last
    /// [`GUEST_OUTPUT_IN_REASON`] bytes are in `reason` too.
    pub guest_output: Option<String>,
    /// The sandbox limit the call ran into, if that is why it stopped (a metrics label).
    pub limit: Option<&'static str>,
}

/// Bytes of the guest's output quoted in a trap's reason: with the trap's own text (at most
/// [`MAX_LOGGED`]) it stays within what `last_error` keeps ([`crate::text::MAX_STORED`]).
pub(crate) const GUEST_OUTPUT_IN_REASON: usize = 900;

impl Trapped {
    fn from_error(error: &wasmtime::Error, limits: &Limits) -> Self {
        if error.downcast_ref::<WaitedPastDeadline>().is_some() {
            return Self::wall_clock(limits);
        }
        Self {
            reason: describe_trap(error, limits),
            deadline: matches!(error.downcast_ref::<Trap>(), Some(Trap::Interrupt)),
            guest_output: None,
            limit: limit_hit(error),
        }
    }

    /// The call waited in a host function (a WASI sleep, say) until its deadline passed.
    fn wall_clock(limits: &Limits) -> Self {
        Self {
            reason: format!(
                "plugin exceeded its call_timeout of {} (waiting in a host call such as a sleep)",
                humantime::format_duration(limits.call_timeout)
            ),
            deadline: true,
            guest_output: None,
            limit: Some("call_timeout"),
        }
    }

    /// Quotes what the guest wrote during the call (a panic message or traceback), if the
    /// tenant's log budget has a line left: the quote is logged, and a plugin that writes to
    /// stderr and then traps must not log past its budget.
    fn with_budgeted_output(self, output: &GuestOutput, shared: &TenantShared) -> Self {
        if output.text(0).is_none() {
            return self;
        }
        if shared.take_log_line() {
            return self.with_output(output);
        }
        let mut trapped = self;
        trapped.reason = format!(
            "{}; guest stderr not quoted (its log lines are rate-limited)",
            trapped.reason
        );
        trapped
    }

    /// Quotes what the guest wrote during the call: a panic message or traceback.
    fn with_output(mut self, output: &GuestOutput) -> Self {
        if let Some(quoted) = output.text(GUEST_OUTPUT_IN_REASON) {
            self.reason = format!("{}; guest stderr: {quoted}", self.reason);
            self.guest_output = output.text(GUEST_OUTPUT_TAIL);
        }
        self
    }

    /// The row's failure.
    pub(crate) fn into_failure(self) -> TransformFailure {
        if self.deadline {
            TransformFailure::DeadlineExceeded(self.reason)
        } else {
            TransformFailure::Trapped(self.reason)
        }
    }
}

/// What a row's WIT record needs that the row does not hold in that form: its id as text,
/// its headers as borrowed pairs and its extra columns as WIT values. Everything else is
/// borrowed from the row as it is.
pub(crate) struct WitParts<'r> {
    id: std::borrow::Cow<'r, str>,
    headers: Vec<(&'r str, &'r [u8])>,
    extra: Vec<wit::ExtraColumn<'r>>,
}

/// An extra column's value as the WIT carries it (timestamps in milliseconds).
fn wit_value(value: &ColumnValue) -> wit::ColumnValue<'_> {
    match value {
        ColumnValue::Null => wit::ColumnValue::Null,
        ColumnValue::Text(s) => wit::ColumnValue::Text(s),
        ColumnValue::Integer(n) => wit::ColumnValue::Integer(*n),
        ColumnValue::Float(f) => wit::ColumnValue::Float(*f),
        ColumnValue::Boolean(b) => wit::ColumnValue::Boolean(*b),
        ColumnValue::Timestamp(t) => wit::ColumnValue::TimestampMs(t.timestamp_millis()),
        ColumnValue::Json(s) => wit::ColumnValue::Json(s),
        ColumnValue::Bytes(b) => wit::ColumnValue::Bytes(b),
    }
}

impl<'r> WitParts<'r> {
    pub(crate) fn of(row: &'r OutboxRow) -> Self {
        Self {
            id: match &row.id {
                OutboxId::Int(id) => std::borrow::Cow::Owned(id.to_string()),
                OutboxId::Text(id) => std::borrow::Cow::Borrowed(id),
            },
            headers: row
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect(),
            extra: row
                .extra
                .iter()
                .map(|(name, value)| wit::ExtraColumn {
                    name: name.as_ref(),
                    value: wit_value(value),
                })
                .collect(),
        }
    }

    /// The WIT record of `row` (the row these parts were made from).
    pub(crate) fn row<'a>(&'a self, row: &'a OutboxRow) -> wit::OutboxRow<'a> {
        wit::OutboxRow {
            id: &self.id,
            tenant: row.tenant.as_str(),
            aggregate_type: &row.aggregate_type,
            aggregate_id: &row.aggregate_id,
            event_type: &row.event_type,
            payload: &row.payload,
            headers: &self.headers,
            created_at_ms: row.created_at.timestamp_millis(),
            attempt: u32::try_from(row.attempts.saturating_add(1)).unwrap_or(1),
            extra: &self.extra,
        }
    }
}

/// wasmtime's text when a call's results (or a host call's arguments) needed more copying
/// than the hostcall fuel allows.
const FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

/// Human-readable reason for a failed guest call: deadline, memory cap, copy budget or other
/// trap. Bounded: the trap text carries guest-chosen function names in its backtrace.
/// Which sandbox limit stopped the call, if one did.
fn limit_hit(error: &wasmtime::Error) -> Option<&'static str> {
    if let Some(Trap::Interrupt) = error.downcast_ref::<Trap>() {
        return Some("call_timeout");
    }
    match error.downcast_ref::<LimitExceeded>() {
        Some(LimitExceeded::Memory(_)) => return Some("memory"),
        Some(LimitExceeded::TableElements) => return Some("table_elements"),
        None => {}
    }
    format!("{error:#}")
        .contains(FUEL_EXHAUSTED)
        .then_some("output_copy")
}

fn describe_trap(error: &wasmtime::Error, limits: &Limits) -> String {
    if let Some(Trap::Interrupt) = error.downcast_ref::<Trap>() {
        return format!(
            "plugin exceeded its call_timeout of {}",
            humantime::format_duration(limits.call_timeout)
        );
    }
    if let Some(limit) = error.downcast_ref::<LimitExceeded>() {
        return limit.to_string();
    }
    let text = format!("{error:#}");
    if text.contains(FUEL_EXHAUSTED) {
        return format!(
            "plugin returned more than {} bytes from one call (twice its max_batch_output_bytes)",
            limits.copy_budget()
        );
    }
    format!("plugin trapped: {}", bounded(&text, MAX_LOGGED))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use wasmtime_wasi::p2::OutputStream;

    use super::*;
    use crate::model::TenantId;

    fn trapped() -> Trapped {
        Trapped {
            reason: "plugin exceeded its call_timeout of 500ms".into(),
            deadline: true,
            guest_output: None,
            limit: Some("call_timeout"),
        }
    }

    fn written(text: &str) -> GuestOutput {
        let mut output = GuestOutput::default();
        output
            .write(Bytes::copy_from_slice(text.as_bytes()))
            .unwrap();
        output
    }

    /// A plugin that writes to stderr and then traps (or runs into its deadline), again and
    /// again on fresh instances, gets its stderr quoted only while the tenant's log budget
    /// lasts: the quote is a log line too.
    #[test]
    fn quoting_a_trapped_guests_stderr_takes_from_the_tenants_log_budget() {
        let shared = TenantShared::new(TenantId::named("attacker"));
        let output = written("attacker's line");
        let mut quoted = 0;
        for _ in 0..1_000 {
            let trap = trapped().with_budgeted_output(&output, &shared);
            if trap.guest_output.is_some() {
                assert!(trap.reason.contains("guest stderr: attacker's line"));
                quoted += 1;
            } else {
                assert!(
                    trap.reason
                        .ends_with("guest stderr not quoted (its log lines are rate-limited)"),
                    "{}",
                    trap.reason
                );
            }
        }
        // The burst (100 lines), plus what refilled while the loop ran (microseconds).
        assert!((100..=101).contains(&quoted), "{quoted} quotes");
        assert!(
            !shared.take_log_line(),
            "the quotes used the budget the guest's own log lines draw on"
        );
    }

    #[test]
    fn a_guest_that_wrote_nothing_takes_nothing_from_the_budget() {
        let shared = TenantShared::new(TenantId::named("quiet"));
        let output = written("  \n");
        for _ in 0..1_000 {
            let trap = trapped().with_budgeted_output(&output, &shared);
            assert_eq!(trap.reason, trapped().reason);
        }
        assert!(shared.log_budget_at_rest(Instant::now()));
    }
}
