//! Test doubles for the relay loop, all in memory: a transformer that follows a script and a
//! sink that records what it was asked to publish and answers as scripted. The outbox is the
//! store's own in-memory table (`crate::store::memory`), held to the store conformance suite.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::model::OutboundMessage;
use crate::model::RowResult;
use crate::model::{OutboxId, OutboxRow, TenantId};
use crate::plugin::RowTransformer;
use crate::sink::{Delivered, PublishFault, Sink, SinkError};
use crate::store::memory::MemoryStore;
use crate::store::{MarkMode, StoreOptions};

// ---------------------------------------------------------------------------------------------
// The outbox

/// An empty in-memory outbox marking sent rows with `published_at`, so a test can still read
/// a sent row's state.
pub(super) fn empty_store() -> MemoryStore {
    MemoryStore::new(StoreOptions {
        mark: MarkMode::PublishedAt,
        ..StoreOptions::default()
    })
}

/// The row with id `id` of `tenant`, as an application would insert it.
pub(super) fn outbox_row(id: i64, tenant: &str, aggregate_type: &str) -> OutboxRow {
    OutboxRow {
        id: OutboxId::Int(id),
        tenant: TenantId::named(tenant),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: format!("agg-{id}"),
        event_type: "Happened".to_owned(),
        payload: format!("{{\"n\":{id}}}").into_bytes(),
        headers: vec![("trace".to_owned(), format!("t-{id}").into_bytes())],
        created_at: chrono::Utc::now(),
        attempts: 0,
        extra: Vec::new(),
        replay: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Transformer

type Script = Box<dyn Fn(&OutboxRow) -> RowResult + Send + Sync>;

/// A transformer that answers each row as its script says and remembers what it was told
/// about publishing.
pub(super) struct ScriptedTransformer {
    script: Mutex<Script>,
    /// Results added (positive) or left out (negative) at the end: a transformer that
    /// miscounts.
    pub miscount: Mutex<isize>,
    /// Panic on the next `transform` call.
    pub panic_once: AtomicBool,
    /// `record_publish` calls: tenant, delivered, refused.
    pub publishes: Mutex<Vec<(String, usize, usize)>>,
}

impl ScriptedTransformer {
    pub(super) fn new(
        script: impl Fn(&OutboxRow) -> RowResult + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::new(Box::new(script)),
            miscount: Mutex::new(0),
            panic_once: AtomicBool::new(false),
            publishes: Mutex::new(Vec::new()),
        })
    }

    /// Routes every row to one message on topic `t.<aggregate_type>`.
    pub(super) fn routing() -> Arc<Self> {
        Self::new(|row| Ok(vec![message(row, &format!("t.{}", row.aggregate_type))]))
    }

    pub(super) fn set_script(
        &self,
        script: impl Fn(&OutboxRow) -> RowResult + Send + Sync + 'static,
    ) {
        *self.script.lock().unwrap() = Box::new(script);
    }
}

/// A message of `row` to `topic`, its payload the row's.
pub(super) fn message(row: &OutboxRow, topic: &str) -> OutboundMessage {
    OutboundMessage {
        row: row.id.clone(),
        broker: crate::model::Broker::Kafka,
        topic: topic.to_owned(),
        key: Some(row.aggregate_id.as_bytes().to_vec()),
        payload: Some(row.payload.clone()),
        headers: Vec::new(),
        partition: None,
        encoding: None,
        value_record: None,
        key_record: None,
        timestamp_ms: None,
    }
}

impl RowTransformer for ScriptedTransformer {
    async fn transform(&self, rows: Arc<[OutboxRow]>) -> Vec<RowResult> {
        if self.panic_once.swap(false, Ordering::SeqCst) {
            panic!("scripted transformer panic");
        }
        let mut results: Vec<RowResult> = {
            let script = self.script.lock().unwrap();
            rows.iter().map(&*script).collect()
        };
        let miscount = *self.miscount.lock().unwrap();
        if miscount < 0 {
            results.truncate(results.len().saturating_sub(miscount.unsigned_abs()));
        }
        for _ in 0..miscount.max(0) {
            results.push(Ok(Vec::new()));
        }
        results
    }

    fn record_publish(&self, tenant: &TenantId, delivered: usize, refused: usize) {
        self.publishes
            .lock()
            .unwrap()
            .push((tenant.as_str().to_owned(), delivered, refused));
    }
}

// ---------------------------------------------------------------------------------------------
// Sink

type Answer = Box<dyn Fn(&OutboundMessage) -> Result<(), SinkError> + Send + Sync>;

/// A sink that records every message it is asked to publish and answers as scripted; an
/// acknowledgement says nothing of where the message went.
pub(super) struct RecordingSink {
    pub published: Mutex<Vec<OutboundMessage>>,
    pub calls: AtomicUsize,
    answer: Answer,
    /// Never report: the batch waits forever.
    pub hang: bool,
}

impl RecordingSink {
    /// Acknowledges everything.
    pub(super) fn acking() -> Self {
        Self::answering(|_| Ok(()))
    }

    pub(super) fn answering(
        answer: impl Fn(&OutboundMessage) -> Result<(), SinkError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            published: Mutex::new(Vec::new()),
            calls: AtomicUsize::new(0),
            answer: Box::new(answer),
            hang: false,
        }
    }

    pub(super) fn hanging() -> Self {
        Self {
            hang: true,
            ..Self::acking()
        }
    }

    /// Messages published for row `id` (dead-letter copies included).
    pub(super) fn for_row(&self, id: i64) -> Vec<OutboundMessage> {
        self.published
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.row == OutboxId::Int(id))
            .cloned()
            .collect()
    }
}

/// A publish failure of `topic` for which `fault` is to blame.
pub(super) fn publish_error(topic: &str, fault: PublishFault) -> SinkError {
    SinkError::publish_failed(topic, format!("scripted {fault:?}"), fault)
}

impl Sink for RecordingSink {
    async fn publish(&self, messages: &[OutboundMessage]) -> Vec<Result<Delivered, SinkError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.published
            .lock()
            .unwrap()
            .extend(messages.iter().cloned());
        if self.hang {
            std::future::pending::<()>().await;
        }
        messages
            .iter()
            .map(|m| (self.answer)(m).map(|()| Delivered::default()))
            .collect()
    }

    fn probe(&self, _timeout: Duration) -> Result<(), SinkError> {
        Ok(())
    }

    fn flush(&self, _timeout: Duration) -> Result<(), SinkError> {
        Ok(())
    }
}
