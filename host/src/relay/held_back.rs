//! Rows this relay process must not publish right now: rows whose outcome the database
//! refused to record, and rows of a batch whose failed commit is being settled.
//!
//! When a batch's commit fails after its messages were published and a fresh transaction
//! cannot record some row either (a trigger raising on it, a constraint), that row stays
//! unsent and would be claimed, published and refused again at once, over and over: a
//! duplicate storm. Such a row is held back instead: claimed rows that are held are put back
//! untouched, not published, until their hold ends. The hold doubles with every refusal in a
//! row, from [`FIRST_HOLD`] up to [`LONGEST_HOLD`], so a row the database keeps refusing is
//! re-published at most about once per [`LONGEST_HOLD`] by each relay process.
//!
//! A failed commit rolls its batch back, which on PostgreSQL and MySQL unlocks the rows until
//! the fresh transaction that settles them locks them again (on SQLite they stay leased to the
//! batch meanwhile). Rows are registered as committing before each commit,
//! so another worker of this process that claims them in that gap puts its claim back at once
//! instead of publishing them a second time.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::model::OutboxId;

/// Hold after the first refusal.
pub(super) const FIRST_HOLD: Duration = Duration::from_secs(1);
/// Longest hold: a row the database keeps refusing is tried this often.
pub(super) const LONGEST_HOLD: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
struct Hold {
    until: Instant,
    refusals: u32,
}

/// The rows held back by this relay process.
#[derive(Debug, Default)]
pub(super) struct HeldBack {
    holds: Mutex<HashMap<OutboxId, Hold>>,
    /// Rows in a commit (and its settling), with the number of batches committing them.
    committing: Mutex<HashMap<OutboxId, u32>>,
}

/// Rows registered as committing until this is dropped.
#[derive(Debug)]
pub(super) struct Committing<'a> {
    held: &'a HeldBack,
    ids: Vec<OutboxId>,
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        let mut committing = self.held.committing();
        for id in &self.ids {
            if let Some(n) = committing.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    committing.remove(id);
                }
            }
        }
    }
}

impl HeldBack {
    fn holds(&self) -> std::sync::MutexGuard<'_, HashMap<OutboxId, Hold>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn committing(&self) -> std::sync::MutexGuard<'_, HashMap<OutboxId, u32>> {
        self.committing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `id` is held at `now`.
    pub(super) fn is_held(&self, id: &OutboxId, now: Instant) -> bool {
        self.holds().get(id).is_some_and(|h| h.until > now)
    }

    /// Registers `ids` as committing until the returned guard is dropped.
    pub(super) fn committing_while<'a>(&'a self, ids: Vec<OutboxId>) -> Committing<'a> {
        let mut committing = self.committing();
        for id in &ids {
            *committing.entry(id.clone()).or_default() += 1;
        }
        Committing { held: self, ids }
    }

    /// Whether any of `ids` is in a commit of this process.
    pub(super) fn any_committing<'a>(&self, ids: impl IntoIterator<Item = &'a OutboxId>) -> bool {
        let committing = self.committing();
        !committing.is_empty() && ids.into_iter().any(|id| committing.contains_key(id))
    }

    /// Holds `id` after the database refused its outcome at `now`; returns for how long.
    pub(super) fn hold(&self, id: &OutboxId, now: Instant) -> Duration {
        let mut holds = self.holds();
        // Forget rows not refused again within a longest hold (sent by someone else, or
        // recorded since): the map only keeps rows that are still trouble.
        holds.retain(|_, h| now.saturating_duration_since(h.until) < LONGEST_HOLD);
        let refusals = holds.get(id).map_or(1, |h| h.refusals.saturating_add(1));
        let doublings = refusals.saturating_sub(1).min(16);
        let pause = FIRST_HOLD.saturating_mul(1 << doublings).min(LONGEST_HOLD);
        holds.insert(
            id.clone(),
            Hold {
                until: now + pause,
                refusals,
            },
        );
        pause
    }

    /// Ends the holds of rows whose outcome was recorded.
    pub(super) fn release<'a>(&self, ids: impl IntoIterator<Item = &'a OutboxId>) {
        let mut holds = self.holds();
        if holds.is_empty() {
            return;
        }
        for id in ids {
            holds.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_double_with_every_refusal_up_to_the_longest() {
        let held = HeldBack::default();
        let id = OutboxId::Int(7);
        let t0 = Instant::now();
        assert!(!held.is_held(&id, t0));
        assert_eq!(held.hold(&id, t0), FIRST_HOLD);
        assert!(held.is_held(&id, t0));
        assert!(!held.is_held(&id, t0 + FIRST_HOLD), "the hold ends");
        assert!(!held.is_held(&OutboxId::Int(8), t0), "only that row");
        let mut now = t0 + FIRST_HOLD;
        assert_eq!(held.hold(&id, now), FIRST_HOLD * 2);
        for _ in 0..20 {
            now += LONGEST_HOLD / 2;
            held.hold(&id, now);
        }
        assert_eq!(held.hold(&id, now), LONGEST_HOLD);
    }

    #[test]
    fn a_recorded_row_is_released_and_starts_over() {
        let held = HeldBack::default();
        let id = OutboxId::Int(7);
        let t0 = Instant::now();
        held.hold(&id, t0);
        held.hold(&id, t0);
        held.release([&id]);
        assert!(!held.is_held(&id, t0));
        assert_eq!(held.hold(&id, t0), FIRST_HOLD);
    }

    #[test]
    fn rows_are_committing_until_their_guard_is_dropped() {
        let held = HeldBack::default();
        let ids = [OutboxId::Int(1), OutboxId::Int(2)];
        {
            let _first = held.committing_while(ids.to_vec());
            let _second = held.committing_while(vec![OutboxId::Int(2)]);
            assert!(held.any_committing([&OutboxId::Int(3), &OutboxId::Int(1)]));
            assert!(!held.any_committing([&OutboxId::Int(3)]));
        }
        assert!(!held.any_committing(&ids));
    }

    #[test]
    fn rows_not_refused_again_for_a_while_are_forgotten() {
        let held = HeldBack::default();
        let t0 = Instant::now();
        held.hold(&OutboxId::Int(1), t0);
        held.hold(&OutboxId::Int(2), t0 + LONGEST_HOLD * 3);
        assert_eq!(held.holds().len(), 1);
    }
}
