//! Delivery reports filed by batch. librdkafka hands each message's report to the producer's
//! poll thread with the opaque value given at enqueue; here that value names the batch and
//! the message's place in it, so a batch waits once for all of its reports instead of once per
//! message (no future, channel or allocation per message).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rdkafka::error::KafkaError;
use tokio::sync::oneshot;

use super::Delivered;

/// A message's report: acknowledged (and where it was stored), or why not.
pub(super) type Report = Result<Delivered, KafkaError>;

/// The opaque value of a message: its batch in the high 32 bits, its index in the low 32.
pub(super) type Opaque = usize;

// The opaque packs two 32-bit numbers into librdkafka's pointer-sized opaque.
const _: () = assert!(
    usize::BITS >= 64,
    "Sluice's Kafka sink needs a 64-bit target"
);

/// The batches waiting for reports. One per sink, shared by every producer it creates.
#[derive(Default)]
pub(super) struct Deliveries {
    next_batch: AtomicU32,
    waiting: Mutex<HashMap<u32, Waiting>>,
}

struct Waiting {
    reports: Vec<Option<Report>>,
    remaining: usize,
    done: Option<oneshot::Sender<()>>,
}

impl Deliveries {
    fn waiting(&self) -> MutexGuard<'_, HashMap<u32, Waiting>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a batch of `messages` messages; its reports are filed until the returned
    /// [`Pending`] is waited on or dropped.
    pub(super) fn open(&self, messages: usize) -> Pending<'_> {
        let (done, finished) = oneshot::channel();
        let mut waiting = self.waiting();
        // Numbers wrap after 4 billion batches; one still waiting is skipped.
        let batch = loop {
            let batch = self.next_batch.fetch_add(1, Ordering::Relaxed);
            if !waiting.contains_key(&batch) {
                break batch;
            }
        };
        let mut entry = Waiting {
            reports: (0..messages).map(|_| None).collect(),
            remaining: messages,
            done: Some(done),
        };
        entry.finish_if_complete();
        waiting.insert(batch, entry);
        Pending {
            deliveries: self,
            batch,
            messages,
            finished,
        }
    }

    /// No batch is waiting.
    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        self.waiting().is_empty()
    }

    /// Files the report of the message enqueued with `opaque` (called on the producer's
    /// poll thread). Reports of batches no longer waiting (given up on) are dropped.
    pub(super) fn file(&self, opaque: Opaque, report: Report) {
        let (batch, index) = unpack(opaque);
        if let Some(entry) = self.waiting().get_mut(&batch) {
            entry.file(index, report);
        }
    }
}

impl Waiting {
    fn file(&mut self, index: usize, report: Report) {
        if let Some(slot @ None) = self.reports.get_mut(index) {
            *slot = Some(report);
            self.remaining -= 1;
            self.finish_if_complete();
        }
    }

    fn finish_if_complete(&mut self) {
        if self.remaining == 0
            && let Some(done) = self.done.take()
        {
            let _ = done.send(());
        }
    }
}

/// A batch waiting for its reports; dropping it stops filing them.
pub(super) struct Pending<'d> {
    deliveries: &'d Deliveries,
    batch: u32,
    messages: usize,
    finished: oneshot::Receiver<()>,
}

impl Pending<'_> {
    /// The opaque value to enqueue message `index` with.
    pub(super) fn opaque(&self, index: usize) -> Opaque {
        pack(self.batch, index)
    }

    /// Files the report of a message that never reached librdkafka (refused at enqueue).
    pub(super) fn settle(&self, index: usize, report: Report) {
        self.deliveries.file(self.opaque(index), report);
    }

    /// Waits for every message's report; one per message, in message order.
    pub(super) async fn reports(mut self) -> Vec<Report> {
        // The sender lives in the entry until the last report; it cannot be dropped first.
        let _ = (&mut self.finished).await;
        let reports = self
            .deliveries
            .waiting()
            .remove(&self.batch)
            .map(|e| e.reports)
            .unwrap_or_default();
        // Exactly one per message, whatever happened: a missing one reads as cancelled.
        let mut reports: Vec<Report> = reports
            .into_iter()
            .map(|r| r.unwrap_or(Err(KafkaError::Canceled)))
            .collect();
        reports.resize(self.messages, Err(KafkaError::Canceled));
        reports
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.deliveries.waiting().remove(&self.batch);
    }
}

fn pack(batch: u32, index: usize) -> Opaque {
    ((batch as usize) << 32) | (index & 0xFFFF_FFFF)
}

fn unpack(opaque: Opaque) -> (u32, usize) {
    ((opaque >> 32) as u32, opaque & 0xFFFF_FFFF)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode;

    fn at(offset: i64) -> Report {
        Ok(Delivered {
            partition: Some(0),
            offset: Some(offset),
        })
    }

    fn failed() -> Report {
        Err(KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageTimedOut,
        ))
    }

    #[tokio::test]
    async fn reports_come_back_in_message_order_whatever_order_they_arrive_in() {
        let deliveries = Deliveries::default();
        let pending = deliveries.open(3);
        deliveries.file(pending.opaque(2), at(2));
        pending.settle(1, failed());
        deliveries.file(pending.opaque(0), at(0));
        // A second report for a message already reported is ignored.
        deliveries.file(pending.opaque(0), failed());
        assert_eq!(pending.reports().await, vec![at(0), failed(), at(2)]);
        assert!(deliveries.waiting().is_empty());
    }

    #[tokio::test]
    async fn an_empty_batch_is_complete_at_once() {
        let deliveries = Deliveries::default();
        assert_eq!(deliveries.open(0).reports().await, Vec::<Report>::new());
    }

    #[tokio::test]
    async fn batches_do_not_see_each_others_reports() {
        let deliveries = Deliveries::default();
        let a = deliveries.open(1);
        let b = deliveries.open(1);
        deliveries.file(b.opaque(0), failed());
        deliveries.file(a.opaque(0), at(0));
        assert_eq!(a.reports().await, vec![at(0)]);
        assert_eq!(b.reports().await, vec![failed()]);
    }

    #[test]
    fn a_batch_given_up_on_takes_no_more_reports() {
        let deliveries = Deliveries::default();
        let pending = deliveries.open(2);
        let opaque = pending.opaque(1);
        drop(pending);
        deliveries.file(opaque, at(0));
        assert!(deliveries.waiting().is_empty());
    }

    #[test]
    fn the_opaque_keeps_batch_and_index_apart() {
        assert_eq!(unpack(pack(u32::MAX, 7)), (u32::MAX, 7));
        assert_eq!(unpack(pack(3, 0xFFFF_FFFF)), (3, 0xFFFF_FFFF));
    }
}
