//! Runs a batch's tenant groups on a few blocking threads ("lanes") instead of one thread per
//! group: a batch with 500 tenants costs two or three threads, not 500. Guest calls are
//! synchronous CPU work, so more lanes than cores only add switching.
//!
//! A lane takes the next group whose tenant is free. A tenant busy in another batch is passed
//! over and tried again later; one whose running call is stalled has its rows deferred
//! rather than waited for. When every lane is inside a stalled call and groups are still
//! waiting, one more lane starts, so a few hostile tenants cannot hold up the others' rows
//! for longer than [`STALL_AFTER`] per extra lane (bounded by [`MAX_LANES`]).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::model::OutboxRow;
use crate::model::{RowResult, TransformFailure};
use crate::plugin::tenant::watch::STALL_AFTER;
use crate::plugin::tenant::{LOCK_POLL, Tenant, lock};

/// Lanes a batch may grow to when its lanes are stuck in stalled calls.
const MAX_LANES: usize = 32;

/// A tenant's rows of the batch (indices into the batch).
pub(super) struct Group {
    pub(super) tenant: Arc<Tenant>,
    pub(super) indices: Vec<usize>,
}

/// A group after its run: one output per index, and how long the plugin took (`None`: it
/// did not run).
pub(super) struct Ran {
    pub(super) group: Group,
    pub(super) outputs: Vec<RowResult>,
    pub(super) took: Option<Duration>,
}

/// The groups still waiting, and when each lane's current call started (0: between calls).
struct Queue {
    waiting: Mutex<VecDeque<Group>>,
    busy_since: Vec<AtomicU64>,
    origin: Instant,
}

impl Queue {
    fn stamp(&self) -> u64 {
        // +1 so that a call starting at the origin is still "busy".
        self.origin.elapsed().as_micros() as u64 + 1
    }

    /// Whether every lane in `0..lanes` is inside a call that started over STALL_AFTER ago.
    fn all_stalled(&self, lanes: usize) -> bool {
        let now = self.stamp();
        self.busy_since[..lanes].iter().all(|since| {
            let since = since.load(Ordering::Acquire);
            since != 0 && now.saturating_sub(since) > STALL_AFTER.as_micros() as u64
        })
    }

    fn is_empty(&self) -> bool {
        lock(&self.waiting).is_empty()
    }
}

/// Runs `groups` (largest first) on at most `lanes` blocking threads, plus extra lanes while
/// all of them are stalled; returns every group with its outputs, in no particular order.
pub(super) async fn run(rows: Arc<[OutboxRow]>, mut groups: Vec<Group>, lanes: usize) -> Vec<Ran> {
    groups.sort_by_key(|g| std::cmp::Reverse(g.indices.len()));
    let lanes = lanes.clamp(1, MAX_LANES).min(groups.len().max(1));
    let queue = Arc::new(Queue {
        waiting: Mutex::new(groups.into()),
        busy_since: (0..MAX_LANES).map(|_| AtomicU64::new(0)).collect(),
        origin: Instant::now(),
    });
    let mut running = JoinSet::new();
    let spawn = |running: &mut JoinSet<Vec<Ran>>, lane: usize| {
        let (queue, rows) = (Arc::clone(&queue), Arc::clone(&rows));
        running.spawn_blocking(move || run_lane(&queue, lane, &rows));
    };
    for lane in 0..lanes {
        spawn(&mut running, lane);
    }
    let mut started = lanes;
    let mut ran = Vec::new();
    loop {
        tokio::select! {
            joined = running.join_next() => match joined {
                Some(Ok(done)) => ran.extend(done),
                // A lane that panicked loses its groups: their rows get no result and are
                // reported unavailable by the caller.
                Some(Err(e)) => tracing::error!(error = %e, "plugin lane failed"),
                None => break,
            },
            () = tokio::time::sleep(STALL_AFTER), if started < MAX_LANES => {
                if !queue.is_empty() && queue.all_stalled(started) {
                    spawn(&mut running, started);
                    started += 1;
                }
            }
        }
    }
    ran
}

/// One lane: takes groups until none is left.
fn run_lane(queue: &Queue, lane: usize, rows: &[OutboxRow]) -> Vec<Ran> {
    let mut ran = Vec::new();
    // Groups passed over in a row because their tenant was busy: once every waiting group
    // was passed over, the lane pauses briefly instead of spinning.
    let mut passed = 0;
    loop {
        let Some(group) = lock(&queue.waiting).pop_front() else {
            return ran;
        };
        let Some(mut runner) = group.tenant.try_runner() else {
            if group.tenant.health.stalled(Instant::now()) {
                let outputs = group
                    .indices
                    .iter()
                    .map(|_| {
                        Err(TransformFailure::Deferred(
                            "the tenant's plugin is busy with a slow call in another batch".into(),
                        ))
                    })
                    .collect();
                ran.push(Ran {
                    group,
                    outputs,
                    took: None,
                });
                passed = 0;
                continue;
            }
            let mut waiting = lock(&queue.waiting);
            waiting.push_back(group);
            passed += 1;
            if passed >= waiting.len() {
                drop(waiting);
                std::thread::sleep(LOCK_POLL);
                passed = 0;
            }
            continue;
        };
        passed = 0;
        let batch: Vec<&OutboxRow> = group.indices.iter().map(|&i| &rows[i]).collect();
        queue.busy_since[lane].store(queue.stamp(), Ordering::Release);
        let started = Instant::now();
        let outputs = match catch_unwind(AssertUnwindSafe(|| runner.run_group(&batch))) {
            Ok(outputs) => outputs,
            Err(_) => {
                // As when each group had its own thread: this group's rows fail cleanly (and
                // are retried), the lane goes on with the others, and the instance the panic
                // left mid-call is not used again.
                tracing::error!(tenant = %group.tenant.health.shared.tenant(),
                    "running a tenant's rows panicked; its rows are retried");
                runner.drop_instance();
                group
                    .indices
                    .iter()
                    .map(|_| {
                        Err(TransformFailure::Unavailable(
                            "plugin worker panicked".into(),
                        ))
                    })
                    .collect()
            }
        };
        let took = started.elapsed();
        queue.busy_since[lane].store(0, Ordering::Release);
        drop(runner);
        group.tenant.enlist_if_live();
        ran.push(Ran {
            group,
            outputs,
            took: Some(took),
        });
    }
}
