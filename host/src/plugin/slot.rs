//! One tenant's place in the router: its plugin (a WASM instance in its own Store, or a
//! builtin), its circuit breaker, and how a batch's rows of that tenant are run — in
//! `transform-batch` chunks where the plugin allows it, within a time budget per batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use super::breaker::{CircuitBreaker, Gate, Transition};
use super::builtin::Builtin;
use super::component::LoadedPlugin;
use super::instance::{TenantInstance, Trapped};
use super::limits::Limits;
use super::{PluginError, RowResult, TransformFailure, output};
use crate::outbox::{OutboxRow, TenantId};

/// Most rows handed to one `transform-batch` call, …
const MAX_BATCH_ROWS: usize = 64;
/// … and most payload bytes: the rows are copied into the guest's memory at once, which must
/// stay well inside `memory_mb`.
const MAX_BATCH_BYTES: usize = 256 * 1024;
/// A tenant whose current plugin call has run this long is "stalled": other batches skip its
/// rows instead of queueing behind the call. Normal calls take microseconds; a 64-row batch
/// of a JavaScript guest about 15 ms.
pub const STALL_AFTER: Duration = Duration::from_millis(20);
/// How often a batch checks whether a busy tenant's lock is free.
const LOCK_POLL: Duration = Duration::from_micros(200);
/// Successful single-row calls after which an instance's rows go to `transform-batch`: a
/// plugin proves itself row by row first, so a broken one (a spinning plugin, say) fails on
/// one row and one `call_timeout`, not on a whole chunk first.
const BATCH_CALLS_AFTER: u32 = 64;

/// A tenant's transform logic as configured: everything needed to (re)create its runner.
pub struct TenantTemplate {
    pub code: PluginCode,
    pub config: Vec<(String, String)>,
    pub limits: Limits,
}

/// Where the logic lives.
pub enum PluginCode {
    Wasm(Arc<LoadedPlugin>),
    Builtin(String),
}

impl TenantTemplate {
    /// The plugin file, for WASM plugins.
    pub fn path(&self) -> Option<&std::path::Path> {
        match &self.code {
            PluginCode::Wasm(plugin) => Some(plugin.path()),
            PluginCode::Builtin(_) => None,
        }
    }
}

/// A live, configured plugin for one tenant.
pub enum Runner {
    Wasm(Box<TenantInstance>),
    Native(Builtin),
}

impl Runner {
    /// Instantiates and configures `template` for `tenant`.
    pub fn create(template: &TenantTemplate, tenant: &TenantId) -> Result<Self, PluginError> {
        match &template.code {
            PluginCode::Wasm(plugin) => {
                TenantInstance::create(plugin, tenant, &template.config, &template.limits)
                    .map(|i| Self::Wasm(Box::new(i)))
            }
            PluginCode::Builtin(name) => Builtin::configure(name, &template.config)
                .map(Self::Native)
                .map_err(|message| PluginError::Config {
                    key: format!("builtin {name:?} (tenant {tenant})"),
                    message,
                }),
        }
    }
}

/// What other batches may learn about a tenant without waiting for its lock.
pub struct SlotStatus {
    pub breaker: Mutex<CircuitBreaker>,
    /// When the running plugin call began, in µs since [`clock_origin`]; 0 = no call.
    busy_since_us: AtomicU64,
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

impl SlotStatus {
    fn new(limits: &Limits) -> Self {
        Self {
            breaker: Mutex::new(CircuitBreaker::new(
                limits.breaker_failures,
                limits.breaker_cooldown,
            )),
            busy_since_us: AtomicU64::new(0),
        }
    }

    /// Whether the tenant should be left out of the next claim: breaker open, or a call of
    /// its plugin has been running for longer than [`STALL_AFTER`].
    pub fn unavailable(&self, now: Instant) -> bool {
        matches!(lock(&self.breaker).gate(now), Gate::Paused(_)) || self.stalled(now)
    }

    fn stalled(&self, now: Instant) -> bool {
        match self.busy_since_us.load(Ordering::Acquire) {
            0 => false,
            since => {
                micros_since_origin(now).saturating_sub(since) > STALL_AFTER.as_micros() as u64
            }
        }
    }

    fn call_started(&self) {
        self.busy_since_us
            .store(micros_since_origin(Instant::now()), Ordering::Release);
    }

    fn call_ended(&self) {
        self.busy_since_us.store(0, Ordering::Release);
    }
}

/// A tenant's slot: template, live runner (`None` after a trap, until the next row needs it)
/// and status.
pub struct TenantSlot {
    pub tenant: TenantId,
    pub template: Arc<TenantTemplate>,
    runner: Option<Runner>,
    pub status: Arc<SlotStatus>,
    /// Whether rows go to `transform-batch`: after [`BATCH_CALLS_AFTER`] successful rows in a
    /// row, until a `transform-batch` call traps or runs out of time (then the plugin is called
    /// row by row for good, which isolates the offending row).
    batch_calls: BatchCalls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchCalls {
    /// Row by row; this many successes in a row so far.
    Probation(u32),
    On,
    Off,
}

impl BatchCalls {
    fn after_row(self, ok: bool) -> Self {
        match self {
            Self::Probation(n) if ok && n + 1 >= BATCH_CALLS_AFTER => Self::On,
            Self::Probation(n) if ok => Self::Probation(n + 1),
            Self::Probation(_) => Self::Probation(0),
            other => other,
        }
    }
}

impl TenantSlot {
    pub fn new(tenant: TenantId, template: Arc<TenantTemplate>, runner: Option<Runner>) -> Self {
        let status = Arc::new(SlotStatus::new(&template.limits));
        Self {
            tenant,
            template,
            runner,
            status,
            batch_calls: BatchCalls::Probation(0),
        }
    }

    /// Swaps in a new version (hot reload), between two groups.
    pub fn replace(&mut self, template: Arc<TenantTemplate>, runner: Runner) {
        self.template = template;
        self.runner = Some(runner);
        self.batch_calls = BatchCalls::Probation(0);
    }

    /// Runs a batch's rows of this tenant (in id order). Rows left when the tenant's time
    /// budget for the batch (`call_timeout`) is used up are deferred, so a slow plugin delays
    /// its own rows only; the first row always runs, so every batch makes progress.
    pub fn run_group(&mut self, rows: &[&OutboxRow]) -> Vec<RowResult> {
        let budget = self.template.limits.call_timeout;
        let started = Instant::now();
        let mut results: Vec<RowResult> = Vec::with_capacity(rows.len());
        while results.len() < rows.len() {
            let now = Instant::now();
            if let Gate::Paused(until) = lock(&self.status.breaker).gate(now) {
                let remaining = until - now;
                results.extend(rows[results.len()..].iter().map(|_| {
                    Err(TransformFailure::Paused {
                        tenant: self.tenant.clone(),
                        remaining,
                    })
                }));
                break;
            }
            if !results.is_empty() && now - started >= budget {
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
            let chunk = batch_chunk(rest);
            if self.batch_calls == BatchCalls::On && chunk > 1 && self.runs_wasm() {
                if let Some(batch) = self.run_batch_call(&rest[..chunk]) {
                    results.extend(batch);
                }
                // On `None` the loop retries the same rows one at a time.
                continue;
            }
            let result = self.run_one(rest[0]);
            self.record(&result);
            self.batch_calls = self.batch_calls.after_row(result.is_ok());
            results.push(result);
        }
        results
    }

    fn runs_wasm(&self) -> bool {
        !matches!(self.template.code, PluginCode::Builtin(_))
    }

    fn ensure_runner(&mut self) -> Result<&mut Runner, TransformFailure> {
        if self.runner.is_none() {
            let runner = Runner::create(&self.template, &self.tenant)
                .map_err(|e| TransformFailure::Unavailable(e.to_string()))?;
            self.runner = Some(runner);
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
                status.call_started();
                let answer = instance.transform(row);
                status.call_ended();
                match answer {
                    Ok(answer) => answer,
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
                status.call_started();
                let answers = instance.transform_batch(rows);
                status.call_ended();
                answers
            }
            Ok(Runner::Native(_)) => {
                self.batch_calls = BatchCalls::Off;
                return None;
            }
            Err(failure) => {
                // Creating the instance failed: every row of the call fails alike.
                let results: Vec<RowResult> = rows.iter().map(|_| Err(failure.clone())).collect();
                for r in &results {
                    self.record(r);
                }
                return Some(results);
            }
        };
        match answers {
            Ok(answers) => {
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
                tracing::warn!(tenant = %self.tenant, rows = rows.len(), error.type = "trap",
                    reason = %trapped.reason,
                    "plugin's transform-batch failed; calling this tenant's plugin row by row");
                self.runner = None;
                self.batch_calls = BatchCalls::Off;
                None
            }
        }
    }

    /// A trapped Store is poisoned: drop it, re-create it for the next row.
    fn discard(&mut self, trapped: Trapped, row: Option<&OutboxRow>) -> TransformFailure {
        let row = row.map(|r| r.id.to_string()).unwrap_or_default();
        tracing::warn!(tenant = %self.tenant, row, error.type = if trapped.deadline { "deadline" } else { "trap" },
            reason = %trapped.reason, "plugin trapped; discarding the tenant's instance");
        self.runner = None;
        trapped.into_failure()
    }

    /// Feeds a row's outcome to the circuit breaker and logs its transitions.
    fn record(&self, result: &RowResult) {
        let mut breaker = lock(&self.status.breaker);
        let transition = match result {
            Ok(_) => breaker.record_success(),
            Err(TransformFailure::DeadlineExceeded(_)) => breaker.record_deadline(Instant::now()),
            Err(TransformFailure::Deferred(_) | TransformFailure::Paused { .. }) => {
                Transition::None
            }
            Err(_) => breaker.record_failure(Instant::now()),
        };
        match transition {
            Transition::Opened => tracing::error!(
                tenant = %self.tenant,
                cooldown = ?self.template.limits.breaker_cooldown,
                "circuit breaker opened: tenant paused after repeated plugin failures or a call that ran into its call_timeout"
            ),
            Transition::Closed => {
                tracing::warn!(tenant = %self.tenant, "circuit breaker closed: tenant resumed")
            }
            Transition::None => {}
        }
    }
}

/// How many of `rows` go into the next `transform-batch` call.
fn batch_chunk(rows: &[&OutboxRow]) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for row in rows.iter().take(MAX_BATCH_ROWS) {
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
    use crate::outbox::OutboxId;

    fn row(payload: usize) -> OutboxRow {
        OutboxRow {
            id: OutboxId::Int(1),
            tenant: TenantId("t".into()),
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
        assert_eq!(batch_chunk(&refs), MAX_BATCH_ROWS);
        let big: Vec<OutboxRow> = (0..10).map(|_| row(100 * 1024)).collect();
        let refs: Vec<&OutboxRow> = big.iter().collect();
        assert_eq!(batch_chunk(&refs), 2);
        let huge = [row(10 * 1024 * 1024)];
        let refs: Vec<&OutboxRow> = huge.iter().collect();
        assert_eq!(batch_chunk(&refs), 1, "one row always fits");
    }

    #[test]
    fn batch_calls_start_after_a_run_of_successes_and_failures_restart_the_count() {
        let mut b = BatchCalls::Probation(0);
        for _ in 0..BATCH_CALLS_AFTER - 1 {
            b = b.after_row(true);
        }
        assert_eq!(b.after_row(false), BatchCalls::Probation(0));
        assert_eq!(b.after_row(true), BatchCalls::On);
        assert_eq!(BatchCalls::On.after_row(false), BatchCalls::On);
        assert_eq!(BatchCalls::Off.after_row(true), BatchCalls::Off);
    }

    #[test]
    fn a_long_running_call_marks_the_tenant_stalled() {
        let status = SlotStatus::new(&Limits::default());
        let now = Instant::now();
        assert!(!status.unavailable(now));
        status.call_started();
        assert!(!status.stalled(Instant::now()));
        assert!(status.stalled(Instant::now() + STALL_AFTER * 2));
        status.call_ended();
        assert!(!status.stalled(Instant::now() + STALL_AFTER * 2));
    }

    #[test]
    fn builtin_groups_run_every_row_and_stamp_headers() {
        let template = Arc::new(TenantTemplate {
            code: PluginCode::Builtin("route-by-aggregate".into()),
            config: vec![],
            limits: Limits::default(),
        });
        let tenant = TenantId("t".into());
        let runner = Runner::create(&template, &tenant).unwrap();
        let mut slot = TenantSlot::new(tenant, template, Some(runner));
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
