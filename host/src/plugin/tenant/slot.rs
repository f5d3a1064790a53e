//! One tenant's place in the router: its plugin (a WASM instance in its own Store, or a
//! builtin), its circuit breaker and quarantine, and how a batch's rows of that tenant are run
//! — in `transform-batch` chunks where the plugin allows it, within a time budget and an output
//! byte budget per batch.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use crate::model::{OutboxRow, TenantId};
use crate::plugin::builtin::Builtin;
use crate::plugin::limits::{CallBatching, Limits};
use crate::plugin::tenant::breaker::{CircuitBreaker, Gate, Transition};
use crate::plugin::tenant::quarantine::Quarantine;
use crate::plugin::tenant::status::ReasonCounts;
use crate::plugin::wasm::component::LoadedPlugin;
use crate::plugin::wasm::host_api::TenantShared;
use crate::plugin::wasm::instance::{TenantInstance, Trapped};
use crate::plugin::{PauseReason, PluginError, RowResult, TransformFailure, output};

/// Most payload bytes handed to one `transform-batch` call (rows: the tenant's
/// [`CallBatching`]): the rows are copied into the guest's memory at once, which must
/// stay well inside `memory_mb`.
const MAX_BATCH_BYTES: usize = 256 * 1024;
/// A tenant whose current plugin call has run this long is "stalled": other batches skip its
/// rows instead of queueing behind the call. Normal calls take microseconds; a 64-row batch
/// of a JavaScript guest about 15 ms.
pub const STALL_AFTER: Duration = Duration::from_millis(20);
/// How often a batch checks whether a busy tenant's lock is free.
const LOCK_POLL: Duration = Duration::from_micros(200);
/// Longest a row of a quarantined tenant that was already claimed waits before it is looked
/// at again (later claims leave the tenant out altogether while it is quarantined).
const QUARANTINED_ROW_WAIT: Duration = Duration::from_secs(5);

/// A tenant's transform logic as configured: everything needed to (re)create its runner.
pub struct TenantTemplate {
    pub code: PluginCode,
    pub config: Vec<(String, String)>,
    pub limits: Limits,
    /// Set while this plugin + config cannot start; shared by every tenant using the template.
    pub quarantine: Quarantine,
}

/// A tenant's plugin as loaded: the compiled component (shared by every tenant using the
/// file), a builtin, or a file that failed to load.
#[derive(Clone)]
pub enum PluginCode {
    Wasm(Arc<LoadedPlugin>),
    Builtin(String),
    /// A file that failed to load at start-up (without `strict_startup`): its tenants are
    /// quarantined until a reload loads it.
    Broken {
        path: std::path::PathBuf,
        reason: String,
    },
}

impl TenantTemplate {
    pub fn new(code: PluginCode, config: Vec<(String, String)>, limits: Limits) -> Self {
        Self {
            code,
            config,
            limits,
            quarantine: Quarantine::default(),
        }
    }

    /// The plugin file, for WASM plugins.
    pub fn path(&self) -> Option<&std::path::Path> {
        match &self.code {
            PluginCode::Wasm(plugin) => Some(plugin.path()),
            PluginCode::Broken { path, .. } => Some(path),
            PluginCode::Builtin(_) => None,
        }
    }

    /// The loaded file's content hash (WASM plugins).
    pub fn digest(&self) -> Option<&str> {
        match &self.code {
            PluginCode::Wasm(plugin) => Some(plugin.digest()),
            PluginCode::Builtin(_) | PluginCode::Broken { .. } => None,
        }
    }

    /// The version the plugin reports about itself: a WASM plugin's `info()` (known once an
    /// instance was created), Sluice's own for builtins.
    pub fn version(&self) -> Option<&str> {
        match &self.code {
            PluginCode::Wasm(plugin) => plugin.version(),
            PluginCode::Builtin(_) => Some(env!("CARGO_PKG_VERSION")),
            PluginCode::Broken { .. } => None,
        }
    }

    /// How the plugin is named in logs and statuses.
    pub fn describe(&self) -> String {
        match &self.code {
            PluginCode::Builtin(name) => format!("builtin:{name}"),
            _ => self
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        }
    }
}

/// A live, configured plugin for one tenant.
pub enum Runner {
    Wasm(Box<TenantInstance>),
    Native(Builtin),
}

impl Runner {
    /// Instantiates and configures `template` for the tenant of `shared`.
    pub fn create(
        template: &TenantTemplate,
        shared: &Arc<TenantShared>,
    ) -> Result<Self, PluginError> {
        match &template.code {
            PluginCode::Wasm(plugin) => {
                TenantInstance::create(plugin, shared, &template.config, &template.limits)
                    .map(|i| Self::Wasm(Box::new(i)))
            }
            PluginCode::Builtin(name) => Builtin::configure(name, &template.config)
                .map(Self::Native)
                .map_err(|message| PluginError::Config {
                    key: format!("builtin {name:?} (tenant {})", shared.tenant()),
                    message,
                }),
            PluginCode::Broken { path, reason } => Err(PluginError::BadPlugin {
                path: path.clone(),
                message: reason.clone(),
            }),
        }
    }
}

/// Live instances allowed for tenants without their own `[tenants.<name>]` entry.
pub struct InstanceQuota {
    live: AtomicUsize,
    cap: usize,
}

/// One live instance counted against an [`InstanceQuota`]; released on drop.
pub struct QuotaPermit(Arc<InstanceQuota>);

impl Drop for QuotaPermit {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl InstanceQuota {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            live: AtomicUsize::new(0),
            cap: cap.max(1),
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    fn try_acquire(self: &Arc<Self>) -> Option<QuotaPermit> {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| QuotaPermit(Arc::clone(self)))
    }
}

/// What other batches may learn about a tenant without waiting for its lock.
pub struct SlotStatus {
    pub breaker: Mutex<CircuitBreaker>,
    /// When the running plugin call began, in µs since [`clock_origin`]; 0 = no call.
    busy_since_us: AtomicU64,
    /// The tenant's current template (also in the slot, for the hot path).
    template: Mutex<Arc<TenantTemplate>>,
    /// Log budget and counters, shared by every instance the tenant ever gets.
    pub shared: Arc<TenantShared>,
    /// Whether the tenant has a live instance now.
    live: std::sync::atomic::AtomicBool,
    /// Instances replaced because their memory passed `recycle_memory_percent`.
    pub recycled: AtomicU64,
    /// Instances created, by why.
    pub instantiations: ReasonCounts,
    /// Sandbox limits run into, by limit.
    pub limit_hits: ReasonCounts,
}

fn clock_origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn micros_since_origin(t: Instant) -> u64 {
    u64::try_from(t.duration_since(clock_origin()).as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Marks a plugin call as running until dropped — also when the call panics, so a tenant is
/// never left marked stalled (and so excluded from claims) for good.
pub struct CallStamp<'a>(&'a SlotStatus);

impl Drop for CallStamp<'_> {
    fn drop(&mut self) {
        self.0.busy_since_us.store(0, Ordering::Release);
    }
}

impl SlotStatus {
    fn new(tenant: TenantId, template: Arc<TenantTemplate>) -> Self {
        let limits = &template.limits;
        Self {
            breaker: Mutex::new(CircuitBreaker::new(
                limits.breaker_failures,
                limits.breaker_cooldown,
            )),
            busy_since_us: AtomicU64::new(0),
            template: Mutex::new(template),
            shared: TenantShared::new(tenant),
            live: std::sync::atomic::AtomicBool::new(false),
            recycled: AtomicU64::new(0),
            instantiations: ReasonCounts::default(),
            limit_hits: ReasonCounts::default(),
        }
    }

    /// Whether the tenant should be left out of the next claim: breaker open, plugin
    /// quarantined, or a call of its plugin has been running for longer than [`STALL_AFTER`].
    pub fn unavailable(&self, now: Instant) -> bool {
        matches!(lock(&self.breaker).gate(now), Gate::Paused(_))
            || self.template().quarantine.is_quarantined()
            || self.stalled(now)
    }

    pub fn template(&self) -> Arc<TenantTemplate> {
        Arc::clone(&lock(&self.template))
    }

    /// Whether the tenant has a live instance.
    pub fn has_instance(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub fn stalled(&self, now: Instant) -> bool {
        match self.busy_since_us.load(Ordering::Acquire) {
            0 => false,
            since => {
                micros_since_origin(now).saturating_sub(since) > STALL_AFTER.as_micros() as u64
            }
        }
    }

    fn stamp_call(&self) -> CallStamp<'_> {
        self.busy_since_us
            .store(micros_since_origin(Instant::now()), Ordering::Release);
        CallStamp(self)
    }

    /// The tenant's state for status reports.
    pub fn state(&self, now: Instant) -> crate::plugin::tenant::status::TenantState {
        use crate::plugin::tenant::status::TenantState;
        if let Some(q) = self.template().quarantine.state() {
            return TenantState::Quarantined {
                reason: q.reason,
                since: q.since,
                tries: q.tries,
                next_try_in: q.next_try.saturating_duration_since(now),
            };
        }
        if let Gate::Paused(until) = lock(&self.breaker).gate(now) {
            return TenantState::Paused {
                remaining: until - now,
            };
        }
        if self.stalled(now) {
            TenantState::Stalled
        } else {
            TenantState::Running
        }
    }

    /// Feeds a refused/delivered publish report to the breaker and logs its transitions.
    pub fn record_publish(&self, tenant: &TenantId, delivered: usize, refused: usize) {
        let transition = lock(&self.breaker).record_publish(delivered, refused, Instant::now());
        log_transition(tenant, &self.template(), transition);
    }
}

fn log_transition(tenant: &TenantId, template: &TenantTemplate, transition: Transition) {
    match transition {
        Transition::Opened => tracing::error!(
            tenant = %tenant,
            cooldown = ?template.limits.breaker_cooldown,
            "circuit breaker opened: tenant paused after repeated plugin failures, refused publishes, or a call that ran into its call_timeout"
        ),
        Transition::Closed => {
            tracing::warn!(tenant = %tenant, "circuit breaker closed: tenant resumed")
        }
        Transition::None => {}
    }
}

/// A tenant's slot: template, live runner (`None` after a trap or eviction, until the next row
/// needs it) and status.
pub struct TenantSlot {
    pub tenant: TenantId,
    pub template: Arc<TenantTemplate>,
    runner: Option<Runner>,
    /// Held while `runner` lives, for tenants counted against the unconfigured-instance quota.
    permit: Option<QuotaPermit>,
    quota: Option<Arc<InstanceQuota>>,
    pub status: Arc<SlotStatus>,
    /// Whether rows go to `transform-batch`: after the tenant's probation of successful rows
    /// in a row ([`CallBatching`]), until a `transform-batch` call fails (see [`BatchMode`]).
    batch: BatchMode,
    /// Why the next instance is created (a metrics label): why the last one went.
    next_instance: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchCalls {
    /// Row by row; this many successes in a row so far.
    Probation(u32),
    On,
    /// Never (builtins have no `transform-batch`).
    Off,
}

impl BatchCalls {
    /// Where a fresh slot (or a new plugin version) starts.
    fn start(batching: &CallBatching) -> Self {
        match batching.probation {
            0 => Self::On,
            _ => Self::Probation(0),
        }
    }

    /// After one single-row call; `needed`: successes that end the probation.
    fn after_row(self, ok: bool, needed: u32) -> Self {
        match self {
            Self::Probation(n) if ok && n + 1 >= needed => Self::On,
            Self::Probation(n) if ok => Self::Probation(n + 1),
            Self::Probation(_) => Self::Probation(0),
            other => other,
        }
    }
}

/// Good `transform-batch` calls in a row after which earlier failed ones are forgotten (the
/// probation after the next failure starts short again).
const FORGIVE_AFTER_BATCHES: u32 = 16;
/// The probation after a failed `transform-batch` call doubles with each failure not yet
/// forgiven, up to this many doublings (64 rows → 4,096 rows).
const MAX_PROBATION_DOUBLINGS: u32 = 6;

/// How a slot moves between single-row calls and `transform-batch`. A failed batch call
/// (a trap, its memory cap, its deadline) sends the rows back to single-row calls — which
/// isolates the offending row — for a probation that doubles with every failure in a short
/// time, then batch calls resume: a plugin that leaks or trips now and then keeps batching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchMode {
    calls: BatchCalls,
    /// Failed batch calls not yet forgiven.
    failures: u32,
    /// Good batch calls since the last failure.
    good_batches: u32,
}

impl BatchMode {
    fn start(batching: &CallBatching) -> Self {
        Self {
            calls: BatchCalls::start(batching),
            failures: 0,
            good_batches: 0,
        }
    }

    /// Single-row successes that end the current probation: at least one chunk's worth, so
    /// every row of a failed chunk is tried alone.
    fn probation(&self, batching: &CallBatching) -> u32 {
        let base = batching
            .probation
            .max(u32::try_from(batching.max_rows).unwrap_or(u32::MAX));
        match self.failures {
            0 => batching.probation,
            n => base.saturating_mul(1 << (n - 1).min(MAX_PROBATION_DOUBLINGS)),
        }
    }

    fn after_row(&mut self, ok: bool, batching: &CallBatching) {
        self.calls = self.calls.after_row(ok, self.probation(batching));
    }

    fn after_batch(&mut self, ok: bool) {
        if ok {
            self.good_batches += 1;
            if self.good_batches >= FORGIVE_AFTER_BATCHES {
                self.failures = 0;
            }
        } else {
            self.failures = self.failures.saturating_add(1);
            self.good_batches = 0;
            self.calls = BatchCalls::Probation(0);
        }
    }
}

/// Output of one batch's rows of a tenant so far, against `max_batch_output_bytes`.
struct OutputBudget {
    limit: usize,
    spent: usize,
    /// Whether a row was deferred for it (counted once per batch as a limit hit).
    hit: bool,
}

impl OutputBudget {
    /// Keeps a successful result within the budget: a row whose messages would take the
    /// batch past it is deferred to the next batch (the first row always passes, so every
    /// batch makes progress).
    fn admit(&mut self, tenant: &TenantId, result: RowResult) -> RowResult {
        let Ok(messages) = &result else {
            return result;
        };
        let bytes = output::output_bytes(messages);
        if self.spent > 0 && self.spent.saturating_add(bytes) > self.limit {
            self.hit = true;
            return Err(TransformFailure::Deferred(format!(
                "tenant {tenant}'s messages in this batch reached its max_batch_output_bytes ({} bytes)",
                self.limit
            )));
        }
        self.spent = self.spent.saturating_add(bytes);
        result
    }
}

impl TenantSlot {
    /// A slot for `tenant`; `quota` is set for tenants without their own config entry.
    pub fn new(
        tenant: TenantId,
        template: Arc<TenantTemplate>,
        runner: Option<Runner>,
        quota: Option<Arc<InstanceQuota>>,
    ) -> Self {
        let status = Arc::new(SlotStatus::new(tenant.clone(), Arc::clone(&template)));
        let batch = BatchMode::start(&template.limits.batching);
        let mut slot = Self {
            tenant,
            template,
            runner: None,
            permit: None,
            quota,
            status,
            batch,
            next_instance: "start",
        };
        if let Some(runner) = runner {
            slot.install(runner);
        }
        slot
    }

    /// Swaps in a new version (hot reload, or a quarantined tenant that starts now), between
    /// two groups. The breaker starts afresh: the old version's failures say nothing about the
    /// new one (logged when it had been tripped).
    pub fn replace(&mut self, template: Arc<TenantTemplate>, runner: Option<Runner>) {
        *lock(&self.status.template) = Arc::clone(&template);
        self.batch = BatchMode::start(&template.limits.batching);
        self.template = template;
        if lock(&self.status.breaker).reset() {
            tracing::warn!(tenant = %self.tenant,
                "circuit breaker reset: the tenant switched to another plugin version");
        }
        match runner {
            Some(runner) => {
                self.next_instance = "reload";
                self.install(runner);
            }
            None => self.drop_runner(),
        }
        self.next_instance = "reload";
    }

    /// Installs a freshly created runner if the slot has none (a quarantined tenant's first
    /// successful start). Returns whether it was installed.
    pub fn install_if_empty(&mut self, runner: Runner) -> bool {
        if self.runner.is_some() {
            return false;
        }
        self.install(runner);
        self.runner.is_some()
    }

    fn install(&mut self, runner: Runner) {
        if self.permit.is_none()
            && let Some(quota) = &self.quota
        {
            match quota.try_acquire() {
                Some(permit) => self.permit = Some(permit),
                // No room: the runner is dropped; the next row creates one when there is.
                None => return,
            }
        }
        self.runner = Some(runner);
        self.status.live.store(true, Ordering::Release);
        self.status.instantiations.add(self.next_instance);
    }

    /// Drops the live instance (after a trap, or to make room); the next row creates another.
    pub fn drop_runner(&mut self) {
        self.next_instance = "evicted";
        self.runner = None;
        self.permit = None;
        self.status.live.store(false, Ordering::Release);
    }

    /// Runs a batch's rows of this tenant (in id order). Rows left when the tenant's time
    /// budget for the batch (`call_timeout`) or its output budget (`max_batch_output_bytes`)
    /// is used up are deferred, so a slow or prolific plugin delays its own rows only; the
    /// first row always runs, so every batch makes progress.
    pub fn run_group(&mut self, rows: &[&OutboxRow]) -> Vec<RowResult> {
        let now = Instant::now();
        if let Some(q) = self.template.quarantine.state() {
            let remaining = q
                .next_try
                .saturating_duration_since(now)
                .min(QUARANTINED_ROW_WAIT);
            return rows
                .iter()
                .map(|_| {
                    Err(TransformFailure::Paused {
                        tenant: self.tenant.clone(),
                        remaining,
                        reason: PauseReason::Quarantined(q.reason.clone()),
                    })
                })
                .collect();
        }
        let budget = self.template.limits.call_timeout;
        let mut output = OutputBudget {
            limit: self.template.limits.max_batch_output_bytes,
            spent: 0,
            hit: false,
        };
        let started = now;
        let mut results: Vec<RowResult> = Vec::with_capacity(rows.len());
        while results.len() < rows.len() {
            let now = Instant::now();
            if let Gate::Paused(until) = lock(&self.status.breaker).gate(now) {
                let remaining = until - now;
                results.extend(rows[results.len()..].iter().map(|_| {
                    Err(TransformFailure::Paused {
                        tenant: self.tenant.clone(),
                        remaining,
                        reason: PauseReason::CircuitBreaker,
                    })
                }));
                break;
            }
            if !results.is_empty() && now - started >= budget {
                self.status.limit_hits.add("batch_time_budget");
                let why = format!(
                    "tenant {}'s plugin used up this batch's time budget ({})",
                    self.tenant,
                    humantime::format_duration(budget)
                );
                results.extend(
                    rows[results.len()..]
                        .iter()
                        .map(|_| Err(TransformFailure::Deferred(why.clone()))),
                );
                break;
            }
            let rest = &rows[results.len()..];
            let chunk = batch_chunk(rest, self.template.limits.batching.max_rows);
            if self.batch.calls == BatchCalls::On && chunk > 1 && self.runs_wasm() {
                if let Some(batch) = self.run_batch_call(&rest[..chunk]) {
                    for result in batch {
                        results.push(output.admit(&self.tenant, result));
                    }
                }
                // On `None` the loop retries the same rows one at a time.
                continue;
            }
            let result = self.run_one(rest[0]);
            self.record(&result);
            self.batch
                .after_row(result.is_ok(), &self.template.limits.batching);
            results.push(output.admit(&self.tenant, result));
        }
        if output.hit {
            self.status.limit_hits.add("batch_output_budget");
        }
        results
    }

    fn runs_wasm(&self) -> bool {
        matches!(self.template.code, PluginCode::Wasm(_))
    }

    fn ensure_runner(&mut self) -> Result<&mut Runner, TransformFailure> {
        if self.runner.is_none() {
            if self.permit.is_none()
                && let Some(quota) = &self.quota
            {
                let Some(permit) = quota.try_acquire() else {
                    return Err(TransformFailure::Deferred(format!(
                        "all {} instances for tenants without their own [tenants.<name>] entry \
                         (max_unconfigured_instances) are in use",
                        quota.cap()
                    )));
                };
                self.permit = Some(permit);
            }
            match Runner::create(&self.template, &self.status.shared) {
                Ok(runner) => self.install(runner),
                Err(e) => {
                    self.permit = None;
                    return Err(TransformFailure::Unavailable(e.to_string()));
                }
            }
        }
        self.runner
            .as_mut()
            .ok_or_else(|| TransformFailure::Unavailable("instance missing".into()))
    }

    fn run_one(&mut self, row: &OutboxRow) -> RowResult {
        // An Arc clone, not a copy of the limits (allow-list included) per row.
        let template = Arc::clone(&self.template);
        let status = Arc::clone(&self.status);
        let answer = match self.ensure_runner()? {
            Runner::Native(builtin) => builtin.transform(row),
            Runner::Wasm(instance) => {
                let answer = {
                    let _stamp = status.stamp_call();
                    instance.transform(row)
                };
                match answer {
                    Ok(answer) => {
                        self.recycle_if_grown();
                        answer
                    }
                    Err(trapped) => return Err(self.discard(trapped, Some(row))),
                }
            }
        };
        output::accept(&template.limits, row, answer)
    }

    /// One `transform-batch` call for `rows`; `None` when it trapped (the instance is
    /// discarded and this slot falls back to row-by-row calls, which do not count the trap
    /// against any row).
    fn run_batch_call(&mut self, rows: &[&OutboxRow]) -> Option<Vec<RowResult>> {
        let status = Arc::clone(&self.status);
        let answers = match self.ensure_runner() {
            Ok(Runner::Wasm(instance)) => {
                let _stamp = status.stamp_call();
                instance.transform_batch(rows)
            }
            Ok(Runner::Native(_)) => {
                self.batch.calls = BatchCalls::Off;
                return None;
            }
            Err(failure) => {
                // Creating the instance failed (or had to wait): every row of the call alike.
                let results: Vec<RowResult> = rows.iter().map(|_| Err(failure.clone())).collect();
                for r in &results {
                    self.record(r);
                }
                return Some(results);
            }
        };
        match answers {
            Ok(answers) => {
                self.batch.after_batch(true);
                self.recycle_if_grown();
                let limits = &self.template.limits;
                let results: Vec<RowResult> = rows
                    .iter()
                    .zip(answers)
                    .map(|(row, answer)| output::accept(limits, row, answer))
                    .collect();
                for r in &results {
                    self.record(r);
                }
                Some(results)
            }
            Err(trapped) => {
                self.batch.after_batch(false);
                let probation = self.batch.probation(&self.template.limits.batching);
                tracing::warn!(tenant = %self.tenant, rows = rows.len(), error.type = "trap",
                    reason = %trapped.reason, guest_output = trapped.guest_output.as_deref().unwrap_or(""),
                    single_rows = probation,
                    "plugin's transform-batch failed; calling this tenant's plugin row by row for a while, then in batches again");
                self.count_limit(&trapped);
                self.drop_runner();
                self.next_instance = "after_trap";
                None
            }
        }
    }

    /// Replaces the instance (between two calls) when its memory has grown past the tenant's
    /// `recycle_memory_percent` of `memory_mb`: runtimes that leak (componentize-py never frees
    /// what a call returns) or only grow would otherwise run into the cap and trap, failing a
    /// row. Not when the instance started above the threshold: a new one would not be smaller.
    fn recycle_if_grown(&mut self) {
        let threshold = self.template.limits.recycle_memory_bytes();
        let Some(Runner::Wasm(instance)) = &self.runner else {
            return;
        };
        let (used, baseline) = (instance.memory_bytes(), instance.baseline_memory_bytes());
        if used <= threshold || baseline >= threshold {
            return;
        }
        let replaced = self.status.recycled.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(tenant = %self.tenant, reason = "memory", memory_bytes = used,
            started_with_bytes = baseline, threshold_bytes = threshold, replaced,
            "replacing the tenant's plugin instance: its memory passed recycle_memory_percent of memory_mb");
        self.drop_runner();
        self.next_instance = "recycle";
    }

    /// A trapped Store is poisoned: drop it, re-create it for the next row.
    fn discard(&mut self, trapped: Trapped, row: Option<&OutboxRow>) -> TransformFailure {
        let row = row.map(|r| r.id.to_string()).unwrap_or_default();
        tracing::warn!(tenant = %self.tenant, row, error.type = if trapped.deadline { "deadline" } else { "trap" },
            reason = %trapped.reason, guest_output = trapped.guest_output.as_deref().unwrap_or(""),
            "plugin trapped; discarding the tenant's instance");
        self.count_limit(&trapped);
        self.drop_runner();
        self.next_instance = "after_trap";
        trapped.into_failure()
    }

    fn count_limit(&self, trapped: &Trapped) {
        if let Some(limit) = trapped.limit {
            self.status.limit_hits.add(limit);
        }
    }

    /// Feeds a row's outcome to the circuit breaker and logs its transitions. Only the
    /// instance's health counts: a row's own `permanent` error or refused output does not.
    fn record(&self, result: &RowResult) {
        if let Err(TransformFailure::InvalidOutput(_)) = result {
            self.status.limit_hits.add("output");
        }
        let transition = {
            let mut breaker = lock(&self.status.breaker);
            match result {
                Ok(_) => breaker.record_success(),
                Err(TransformFailure::DeadlineExceeded(_)) => {
                    breaker.record_deadline(Instant::now())
                }
                Err(
                    TransformFailure::Trapped(_)
                    | TransformFailure::Retryable { .. }
                    | TransformFailure::Unavailable(_),
                ) => breaker.record_failure(Instant::now()),
                Err(
                    TransformFailure::Permanent { .. }
                    | TransformFailure::InvalidOutput(_)
                    | TransformFailure::Deferred(_)
                    | TransformFailure::Paused { .. }
                    | TransformFailure::NoPlugin(_),
                ) => Transition::None,
            }
        };
        log_transition(&self.tenant, &self.template, transition);
    }
}

/// How many of `rows` go into the next `transform-batch` call (at most `max_rows`).
fn batch_chunk(rows: &[&OutboxRow], max_rows: usize) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for row in rows.iter().take(max_rows) {
        bytes += row.payload.len();
        if n > 0 && bytes > MAX_BATCH_BYTES {
            break;
        }
        n += 1;
    }
    n
}

/// Takes a busy slot's lock, unless the call holding it is stalled: then `None`, and the
/// caller defers the rows instead of waiting up to `call_timeout` behind it.
pub fn lock_unless_stalled<'a>(
    slot: &'a Mutex<TenantSlot>,
    status: &SlotStatus,
) -> Option<MutexGuard<'a, TenantSlot>> {
    loop {
        match slot.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => {
                if status.stalled(Instant::now()) {
                    return None;
                }
                std::thread::sleep(LOCK_POLL);
            }
        }
    }
}

/// A poisoned lock only means another thread panicked mid-call; the slot data is still
/// consistent (at worst an instance that will trap again and be replaced).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::OutboxId;
    use crate::plugin::limits::{BATCH_CALLS_AFTER, MAX_BATCH_ROWS};

    fn row(payload: usize) -> OutboxRow {
        OutboxRow {
            id: OutboxId::Int(1),
            tenant: TenantId::named("t"),
            aggregate_type: "a".into(),
            aggregate_id: "b".into(),
            event_type: "c".into(),
            payload: vec![0; payload],
            headers: Vec::new(),
            created_at: chrono::Utc::now(),
            attempts: 0,
        }
    }

    #[test]
    fn batch_chunks_are_bounded_by_rows_and_bytes() {
        let small: Vec<OutboxRow> = (0..100).map(|_| row(10)).collect();
        let refs: Vec<&OutboxRow> = small.iter().collect();
        assert_eq!(batch_chunk(&refs, MAX_BATCH_ROWS), MAX_BATCH_ROWS);
        assert_eq!(batch_chunk(&refs, 5), 5);
        let big: Vec<OutboxRow> = (0..10).map(|_| row(100 * 1024)).collect();
        let refs: Vec<&OutboxRow> = big.iter().collect();
        assert_eq!(batch_chunk(&refs, MAX_BATCH_ROWS), 2);
        let huge = [row(10 * 1024 * 1024)];
        let refs: Vec<&OutboxRow> = huge.iter().collect();
        assert_eq!(batch_chunk(&refs, MAX_BATCH_ROWS), 1, "one row always fits");
    }

    #[test]
    fn batch_calls_start_after_a_run_of_successes_and_failures_restart_the_count() {
        let relay = CallBatching::RELAY;
        let mut b = BatchMode::start(&relay);
        for _ in 0..BATCH_CALLS_AFTER - 1 {
            b.after_row(true, &relay);
        }
        let mut failed = b;
        failed.after_row(false, &relay);
        assert_eq!(failed.calls, BatchCalls::Probation(0));
        b.after_row(true, &relay);
        assert_eq!(b.calls, BatchCalls::On);
        assert_eq!(BatchCalls::On.after_row(false, 64), BatchCalls::On);
        assert_eq!(BatchCalls::Off.after_row(true, 64), BatchCalls::Off);
        assert_eq!(
            BatchMode::start(&CallBatching::fixed(8)).calls,
            BatchCalls::On
        );
    }

    /// Rows until a probation of `mode` ends.
    fn rows_to_batch_mode(mode: &mut BatchMode, batching: &CallBatching) -> u32 {
        let mut rows = 0;
        while mode.calls != BatchCalls::On {
            mode.after_row(true, batching);
            rows += 1;
        }
        rows
    }

    #[test]
    fn a_failed_batch_call_returns_to_batches_after_a_growing_probation() {
        let relay = CallBatching::RELAY;
        let mut mode = BatchMode::start(&relay);
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), BATCH_CALLS_AFTER);
        mode.after_batch(false);
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), BATCH_CALLS_AFTER);
        mode.after_batch(false);
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), 2 * BATCH_CALLS_AFTER);
        for _ in 0..20 {
            mode.after_batch(false);
        }
        let longest = BATCH_CALLS_AFTER << MAX_PROBATION_DOUBLINGS;
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), longest);
        // A run of good batches forgives: the next failure costs one probation again.
        for _ in 0..FORGIVE_AFTER_BATCHES {
            mode.after_batch(true);
        }
        mode.after_batch(false);
        assert_eq!(rows_to_batch_mode(&mut mode, &relay), BATCH_CALLS_AFTER);
    }

    #[test]
    fn with_fixed_batches_every_row_of_a_failed_chunk_is_tried_alone() {
        let fixed = CallBatching::fixed(8);
        let mut mode = BatchMode::start(&fixed);
        assert_eq!(mode.calls, BatchCalls::On);
        mode.after_batch(false);
        assert_eq!(rows_to_batch_mode(&mut mode, &fixed), 8);
    }

    fn builtin(limits: Limits) -> Arc<TenantTemplate> {
        Arc::new(TenantTemplate::new(
            PluginCode::Builtin("route-by-aggregate".into()),
            vec![],
            limits,
        ))
    }

    fn slot(template: Arc<TenantTemplate>, quota: Option<Arc<InstanceQuota>>) -> TenantSlot {
        TenantSlot::new(TenantId::named("t"), template, None, quota)
    }

    #[test]
    fn a_long_running_call_marks_the_tenant_stalled_until_the_stamp_drops() {
        let status = SlotStatus::new(TenantId::named("t"), builtin(Limits::default()));
        let now = Instant::now();
        assert!(!status.unavailable(now));
        let stamp = status.stamp_call();
        assert!(!status.stalled(Instant::now()));
        assert!(status.stalled(Instant::now() + STALL_AFTER * 2));
        drop(stamp);
        assert!(!status.stalled(Instant::now() + STALL_AFTER * 2));
    }

    #[test]
    fn a_panic_during_a_call_does_not_leave_the_tenant_stalled() {
        let status = SlotStatus::new(TenantId::named("t"), builtin(Limits::default()));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _stamp = status.stamp_call();
            panic!("guest call panicked");
        }));
        assert!(panicked.is_err());
        assert!(!status.stalled(Instant::now() + STALL_AFTER * 2));
    }

    #[test]
    fn a_quarantined_template_pauses_rows_without_running_them() {
        let template = builtin(Limits::default());
        template
            .quarantine
            .failed("configure failed".into(), Instant::now());
        let mut slot = slot(Arc::clone(&template), None);
        let rows: Vec<OutboxRow> = (0..2).map(|_| row(4)).collect();
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        let results = slot.run_group(&refs);
        for r in &results {
            let Err(TransformFailure::Paused {
                reason, remaining, ..
            }) = r
            else {
                panic!("{r:?}");
            };
            assert_eq!(*reason, PauseReason::Quarantined("configure failed".into()));
            assert!(*remaining <= QUARANTINED_ROW_WAIT);
        }
        assert!(slot.status.unavailable(Instant::now()));
        assert!(template.quarantine.clear());
        assert!(slot.run_group(&refs).iter().all(Result::is_ok));
    }

    #[test]
    fn rows_past_the_output_budget_are_deferred_but_the_first_always_passes() {
        // Each builtin message is a few dozen bytes; a 1-byte budget admits only the first.
        let limits = Limits {
            max_batch_output_bytes: 1,
            ..Limits::default()
        };
        let mut slot = slot(builtin(limits), None);
        let rows: Vec<OutboxRow> = (0..3).map(|_| row(4)).collect();
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        let results = slot.run_group(&refs);
        assert!(results[0].is_ok());
        for r in &results[1..] {
            let Err(TransformFailure::Deferred(why)) = r else {
                panic!("{r:?}");
            };
            assert!(why.contains("max_batch_output_bytes"), "{why}");
        }
    }

    #[test]
    fn instances_and_limit_hits_are_counted_by_reason() {
        let limits = Limits {
            max_batch_output_bytes: 1,
            ..Limits::default()
        };
        let mut slot = slot(builtin(limits), None);
        let rows: Vec<OutboxRow> = (0..3).map(|_| row(4)).collect();
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        slot.run_group(&refs);
        slot.record(&Err(TransformFailure::InvalidOutput("topic".into())));
        let hits = slot.status.limit_hits.snapshot();
        // One budget hit per batch, however many rows it deferred.
        assert_eq!(hits.get("batch_output_budget"), Some(&1));
        assert_eq!(hits.get("output"), Some(&1));
        assert_eq!(slot.status.instantiations.snapshot().get("start"), Some(&1));

        slot.drop_runner();
        slot.next_instance = "recycle";
        slot.run_group(&refs[..1]);
        slot.replace(builtin(Limits::default()), None);
        slot.run_group(&refs[..1]);
        let made = slot.status.instantiations.snapshot();
        assert_eq!(made.get("recycle"), Some(&1));
        assert_eq!(made.get("reload"), Some(&1));
    }

    #[test]
    fn permanent_errors_do_not_trip_the_breaker_but_instance_failures_do() {
        let limits = Limits {
            breaker_failures: 2,
            ..Limits::default()
        };
        let slot = slot(builtin(limits), None);
        let permanent = Err(TransformFailure::Permanent {
            code: "bad-row".into(),
            message: "malformed".into(),
        });
        let refused = Err(TransformFailure::InvalidOutput("topic".into()));
        for _ in 0..10 {
            slot.record(&permanent);
            slot.record(&refused);
        }
        assert!(!slot.status.unavailable(Instant::now()));
        slot.record(&Err(TransformFailure::Trapped("trap".into())));
        slot.record(&Err(TransformFailure::Retryable {
            code: "c".into(),
            message: "m".into(),
        }));
        assert!(slot.status.unavailable(Instant::now()));
    }

    #[test]
    fn the_quota_caps_live_instances_and_frees_them_on_drop() {
        let quota = InstanceQuota::new(1);
        let template = builtin(Limits::default());
        let mut a = slot(Arc::clone(&template), Some(Arc::clone(&quota)));
        let mut b = slot(Arc::clone(&template), Some(Arc::clone(&quota)));
        let rows = [row(4)];
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        assert!(a.run_group(&refs)[0].is_ok());
        assert_eq!(quota.live(), 1);
        assert!(a.status.has_instance());
        let deferred = b.run_group(&refs);
        let Err(TransformFailure::Deferred(why)) = &deferred[0] else {
            panic!("{deferred:?}");
        };
        assert!(why.contains("max_unconfigured_instances"), "{why}");
        a.drop_runner();
        assert_eq!(quota.live(), 0);
        assert!(b.run_group(&refs)[0].is_ok());
        assert_eq!(quota.live(), 1);
    }

    #[test]
    fn builtin_groups_run_every_row_and_stamp_headers() {
        let mut slot = slot(builtin(Limits::default()), None);
        let rows: Vec<OutboxRow> = (0..3).map(|_| row(4)).collect();
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        let results = slot.run_group(&refs);
        assert_eq!(results.len(), 3);
        let messages = results[0].as_ref().unwrap();
        assert!(
            messages[0]
                .headers
                .iter()
                .any(|(k, _)| k == output::TENANT_HEADER)
        );
    }
}
