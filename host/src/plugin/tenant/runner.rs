//! Running one batch's rows of a tenant: its live instance (created on demand, counted
//! against the quota, replaced after a trap or when its memory grew), the circuit breaker fed
//! with each outcome, and the batch's time and output budgets.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::model::{OutboxRow, TenantId};
use crate::model::{PauseReason, RowResult, TransformFailure};
use crate::plugin::PluginError;
use crate::plugin::output;
use crate::plugin::tenant::batching::{BatchMode, OutputBudget, batch_chunk};
use crate::plugin::tenant::breaker::{CircuitBreaker, Gate, Transition};
use crate::plugin::tenant::health::{TenantHealth, log_transition};
use crate::plugin::tenant::quota::{InstanceQuota, QuotaPermit};
use crate::plugin::tenant::template::{PluginCode, PluginInstance, TenantTemplate};
use crate::plugin::tenant::watch::Watch;
use crate::plugin::wasm::instance::Trapped;

/// Longest a row of a quarantined tenant that was already claimed waits before it is looked
/// at again (later claims leave the tenant out altogether while it is quarantined).
const QUARANTINED_ROW_WAIT: Duration = Duration::from_secs(5);

/// What runs a tenant's rows, behind the tenant's lock: its template, its live instance
/// (`None` after a trap or eviction, until the next row needs it) and its health.
pub(crate) struct TenantRunner {
    pub(crate) tenant: TenantId,
    pub(crate) template: Arc<TenantTemplate>,
    instance: Option<PluginInstance>,
    /// Held while `instance` lives: its place in the instance budget.
    permit: Option<QuotaPermit>,
    quota: Option<Arc<InstanceQuota>>,
    pub(crate) health: Arc<TenantHealth>,
    /// Whether rows go to `transform-batch`: after the tenant's probation of successful rows
    /// in a row ([`CallBatching`](crate::plugin::limits::CallBatching)), until a `transform-batch`
    /// call fails (see [`BatchMode`]).
    batch: BatchMode,
    /// Why the next instance is created (a metrics label): why the last one went.
    next_instance: &'static str,
}

impl TenantRunner {
    /// The runner of `tenant`; `quota` is the instance budget it counts against (none in
    /// tests and tools that run one tenant).
    pub(crate) fn new(
        tenant: TenantId,
        template: Arc<TenantTemplate>,
        instance: Option<PluginInstance>,
        quota: Option<Arc<InstanceQuota>>,
        watch: Arc<Watch>,
    ) -> Self {
        let health = Arc::new(TenantHealth::new(
            tenant.clone(),
            Arc::clone(&template),
            watch,
        ));
        let batch = BatchMode::start(&template.limits.batching);
        let mut runner = Self {
            tenant,
            template,
            instance: None,
            permit: None,
            quota,
            health,
            batch,
            next_instance: "start",
        };
        if let Some(instance) = instance {
            runner.install(instance);
        }
        runner
    }

    /// Swaps in a new version (hot reload, or a quarantined tenant that starts now), between
    /// two groups. The breaker starts afresh: the old version's failures say nothing about the
    /// new one (logged when it had been tripped).
    pub(crate) fn replace(
        &mut self,
        template: Arc<TenantTemplate>,
        instance: Option<PluginInstance>,
    ) {
        self.health.set_template(Arc::clone(&template));
        self.batch = BatchMode::start(&template.limits.batching);
        self.template = template;
        if self.health.with_breaker(CircuitBreaker::reset) {
            tracing::warn!(tenant = %self.tenant,
                "circuit breaker reset: the tenant switched to another plugin version");
        }
        match instance {
            Some(instance) => {
                self.next_instance = "reload";
                self.install(instance);
            }
            None => self.drop_instance(),
        }
        self.next_instance = "reload";
    }

    /// Installs a freshly created instance if the tenant has none (a quarantined tenant's
    /// first successful start). Returns whether it was installed.
    pub(crate) fn install_if_empty(&mut self, instance: PluginInstance) -> bool {
        if self.instance.is_some() {
            return false;
        }
        self.install(instance);
        self.instance.is_some()
    }

    fn install(&mut self, instance: PluginInstance) {
        if self.take_permit().is_err() {
            // No room: the instance is dropped; the next row creates one when there is.
            return;
        }
        self.instance = Some(instance);
        self.note_memory();
        self.health.set_has_instance(true);
        self.health.instantiations.add(self.next_instance);
    }

    /// The budget this tenant's instances count against.
    pub(crate) fn quota(&self) -> Option<&Arc<InstanceQuota>> {
        self.quota.as_ref()
    }

    /// Makes sure the tenant holds a permit of its instance budget, dropping idle instances
    /// of other tenants on that budget while it is spent. Fails (with the reason) only when
    /// every other instance is busy.
    fn take_permit(&mut self) -> Result<(), String> {
        let Some(quota) = &self.quota else {
            return Ok(());
        };
        while self.permit.is_none() {
            match quota.try_acquire() {
                Some(permit) => self.permit = Some(permit),
                None if quota.evict_one() => {}
                None => return Err(quota.busy_reason()),
            }
        }
        Ok(())
    }

    /// Tells the budget how much memory the instance holds now.
    fn note_memory(&mut self) {
        if let (Some(permit), Some(PluginInstance::Wasm(instance))) =
            (&mut self.permit, &self.instance)
        {
            permit.set_bytes(instance.memory_bytes());
        }
    }

    /// Drops the live instance (after a trap, or to make room); the next row creates another.
    pub(crate) fn drop_instance(&mut self) {
        self.next_instance = "evicted";
        self.instance = None;
        self.permit = None;
        self.health.set_has_instance(false);
    }

    /// Runs a batch's rows of this tenant (in id order). Rows left when the tenant's time
    /// budget for the batch (`call_timeout`) or its output budget (`max_batch_output_bytes`)
    /// is used up are deferred, so a slow or prolific plugin delays its own rows only; the
    /// first row always runs, so every batch makes progress.
    pub(crate) fn run_group(&mut self, rows: &[&OutboxRow]) -> Vec<RowResult> {
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
        if self.template.pending() {
            // The router loads it and leaves the tenant out of claims until it is loaded.
            let why = format!("tenant {}'s plugin is being compiled", self.tenant);
            return rows
                .iter()
                .map(|_| Err(TransformFailure::Deferred(why.clone())))
                .collect();
        }
        let budget = self.template.limits.call_timeout;
        let mut output = OutputBudget::new(self.template.limits.max_batch_output_bytes);
        let started = now;
        let mut results: Vec<RowResult> = Vec::with_capacity(rows.len());
        while results.len() < rows.len() {
            let now = Instant::now();
            if let Gate::Paused(until) = self.health.gate(now) {
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
                self.health.limit_hits.add("batch_time_budget");
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
            if self.batch.batch_calls() && chunk > 1 && self.runs_wasm() {
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
        if output.hit() {
            self.health.limit_hits.add("batch_output_budget");
        }
        self.note_memory();
        results
    }

    fn runs_wasm(&self) -> bool {
        matches!(self.template.code, PluginCode::Wasm(_))
    }

    fn ensure_instance(&mut self) -> Result<&mut PluginInstance, TransformFailure> {
        while self.instance.is_none() {
            self.take_permit().map_err(TransformFailure::Deferred)?;
            match PluginInstance::create(&self.template, &self.health.shared) {
                Ok(instance) => self.install(instance),
                // The pool is shared by every tenant: an idle instance of this budget gives
                // its slots back, else the rows wait for a later batch (not a plugin failure).
                Err(e @ PluginError::PoolExhausted { .. }) => {
                    if !self.quota.as_ref().is_some_and(|quota| quota.evict_one()) {
                        self.permit = None;
                        return Err(TransformFailure::Deferred(e.to_string()));
                    }
                }
                Err(e) => {
                    self.permit = None;
                    return Err(TransformFailure::Unavailable(e.to_string()));
                }
            }
        }
        self.instance
            .as_mut()
            .ok_or_else(|| TransformFailure::Unavailable("instance missing".into()))
    }

    fn run_one(&mut self, row: &OutboxRow) -> RowResult {
        // An Arc clone, not a copy of the limits (allow-list included) per row.
        let template = Arc::clone(&self.template);
        let health = Arc::clone(&self.health);
        let answer = match self.ensure_instance()? {
            PluginInstance::Builtin(builtin) => builtin.transform(row),
            PluginInstance::Wasm(instance) => {
                let answer = {
                    let _stamp = health.stamp_call();
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
        output::accept_formatted(&template.limits, template.formats.as_ref(), row, answer)
    }

    /// One `transform-batch` call for `rows`; `None` when it trapped (the instance is
    /// discarded and this tenant falls back to row-by-row calls, which do not count the trap
    /// against any row).
    fn run_batch_call(&mut self, rows: &[&OutboxRow]) -> Option<Vec<RowResult>> {
        let health = Arc::clone(&self.health);
        let answers = match self.ensure_instance() {
            Ok(PluginInstance::Wasm(instance)) => {
                let _stamp = health.stamp_call();
                instance.transform_batch(rows)
            }
            Ok(PluginInstance::Builtin(_)) => {
                self.batch.stop_batch_calls();
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
                let (limits, formats) = (&self.template.limits, self.template.formats.as_ref());
                let results: Vec<RowResult> = rows
                    .iter()
                    .zip(answers)
                    .map(|(row, answer)| output::accept_formatted(limits, formats, row, answer))
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
                self.drop_instance();
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
        let Some(PluginInstance::Wasm(instance)) = &self.instance else {
            return;
        };
        let (used, baseline) = (instance.memory_bytes(), instance.baseline_memory_bytes());
        if used <= threshold || baseline >= threshold {
            return;
        }
        let replaced = self.health.recycled.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(tenant = %self.tenant, reason = "memory", memory_bytes = used,
            started_with_bytes = baseline, threshold_bytes = threshold, replaced,
            "replacing the tenant's plugin instance: its memory passed recycle_memory_percent of memory_mb");
        self.drop_instance();
        self.next_instance = "recycle";
    }

    /// A trapped `wasmtime::Store` is poisoned: drop it, re-create it for the next row.
    fn discard(&mut self, trapped: Trapped, row: Option<&OutboxRow>) -> TransformFailure {
        let row = row.map(|r| r.id.to_string()).unwrap_or_default();
        tracing::warn!(tenant = %self.tenant, row, error.type = if trapped.deadline { "deadline" } else { "trap" },
            reason = %trapped.reason, guest_output = trapped.guest_output.as_deref().unwrap_or(""),
            "plugin trapped; discarding the tenant's instance");
        self.count_limit(&trapped);
        self.drop_instance();
        self.next_instance = "after_trap";
        trapped.into_failure()
    }

    fn count_limit(&self, trapped: &Trapped) {
        if let Some(limit) = trapped.limit {
            self.health.limit_hits.add(limit);
        }
    }

    /// Feeds a row's outcome to the circuit breaker and logs its transitions. Only the
    /// instance's health counts: a row's own `permanent` error or refused output does not.
    fn record(&self, result: &RowResult) {
        if let Err(TransformFailure::InvalidOutput(_)) = result {
            self.health.limit_hits.add("output");
        }
        let transition = self.health.with_breaker(|breaker| match result {
            Ok(_) => breaker.record_success(),
            Err(TransformFailure::DeadlineExceeded(_)) => breaker.record_deadline(Instant::now()),
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
                | TransformFailure::NoPlugin(_)
                // Encoding follows the plugin call and never reaches here.
                | TransformFailure::SchemaMismatch(_)
                | TransformFailure::SchemaUnavailable(_),
            ) => Transition::None,
        });
        log_transition(&self.tenant, &self.template, transition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::limits::Limits;
    use crate::plugin::tenant::batching::tests::row;

    fn builtin(limits: Limits) -> Arc<TenantTemplate> {
        Arc::new(TenantTemplate::new(
            PluginCode::Builtin("route-by-aggregate".into()),
            vec![],
            limits,
        ))
    }

    fn new_runner(
        template: Arc<TenantTemplate>,
        quota: Option<Arc<InstanceQuota>>,
    ) -> TenantRunner {
        TenantRunner::new(TenantId::named("t"), template, None, quota, Arc::default())
    }

    #[test]
    fn a_quarantined_template_pauses_rows_without_running_them() {
        let template = builtin(Limits::default());
        template
            .quarantine
            .failed("configure failed".into(), Instant::now());
        let mut runner = new_runner(Arc::clone(&template), None);
        let rows: Vec<OutboxRow> = (0..2).map(|_| row(4)).collect();
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        let results = runner.run_group(&refs);
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
        assert!(runner.health.unavailable(Instant::now()));
        assert!(template.quarantine.clear());
        assert!(runner.run_group(&refs).iter().all(Result::is_ok));
    }

    #[test]
    fn rows_past_the_output_budget_are_deferred_but_the_first_always_passes() {
        // Each builtin message is a few dozen bytes; a 1-byte budget admits only the first.
        let limits = Limits {
            max_batch_output_bytes: 1,
            ..Limits::default()
        };
        let mut runner = new_runner(builtin(limits), None);
        let rows: Vec<OutboxRow> = (0..3).map(|_| row(4)).collect();
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        let results = runner.run_group(&refs);
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
        let mut runner = new_runner(builtin(limits), None);
        let rows: Vec<OutboxRow> = (0..3).map(|_| row(4)).collect();
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        runner.run_group(&refs);
        runner.record(&Err(TransformFailure::InvalidOutput("topic".into())));
        let hits = runner.health.limit_hits.snapshot();
        // One budget hit per batch, however many rows it deferred.
        assert_eq!(hits.get("batch_output_budget"), Some(&1));
        assert_eq!(hits.get("output"), Some(&1));
        assert_eq!(
            runner.health.instantiations.snapshot().get("start"),
            Some(&1)
        );

        runner.drop_instance();
        runner.next_instance = "recycle";
        runner.run_group(&refs[..1]);
        runner.replace(builtin(Limits::default()), None);
        runner.run_group(&refs[..1]);
        let made = runner.health.instantiations.snapshot();
        assert_eq!(made.get("recycle"), Some(&1));
        assert_eq!(made.get("reload"), Some(&1));
    }

    #[test]
    fn permanent_errors_do_not_trip_the_breaker_but_instance_failures_do() {
        let limits = Limits {
            breaker_failures: 2,
            ..Limits::default()
        };
        let runner = new_runner(builtin(limits), None);
        let permanent = Err(TransformFailure::Permanent {
            code: "bad-row".into(),
            message: "malformed".into(),
        });
        let refused = Err(TransformFailure::InvalidOutput("topic".into()));
        for _ in 0..10 {
            runner.record(&permanent);
            runner.record(&refused);
        }
        assert!(!runner.health.unavailable(Instant::now()));
        runner.record(&Err(TransformFailure::Trapped("trap".into())));
        runner.record(&Err(TransformFailure::Retryable {
            code: "c".into(),
            message: "m".into(),
        }));
        assert!(runner.health.unavailable(Instant::now()));
    }

    #[test]
    fn the_quota_caps_live_instances_and_frees_them_on_drop() {
        // Runners outside a tenant map are never on the eviction clock: `b` must wait for `a`.
        let quota = InstanceQuota::new(1, usize::MAX, "of the test (max 1)".into());
        let template = builtin(Limits::default());
        let mut a = new_runner(Arc::clone(&template), Some(Arc::clone(&quota)));
        let mut b = new_runner(Arc::clone(&template), Some(Arc::clone(&quota)));
        let rows = [row(4)];
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        assert!(a.run_group(&refs)[0].is_ok());
        assert_eq!(quota.live(), 1);
        assert!(a.health.has_instance());
        let deferred = b.run_group(&refs);
        let Err(TransformFailure::Deferred(why)) = &deferred[0] else {
            panic!("{deferred:?}");
        };
        assert!(why.contains("of the test (max 1) are all busy"), "{why}");
        a.drop_instance();
        assert_eq!(quota.live(), 0);
        assert!(b.run_group(&refs)[0].is_ok());
        assert_eq!(quota.live(), 1);
    }

    #[test]
    fn builtin_groups_run_every_row_and_stamp_headers() {
        let mut runner = new_runner(builtin(Limits::default()), None);
        let rows: Vec<OutboxRow> = (0..3).map(|_| row(4)).collect();
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        let results = runner.run_group(&refs);
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
