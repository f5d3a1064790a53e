//! The relay loop in process: an in-memory outbox, a scripted transformer and a recording
//! sink (see [`fakes`]), so each behaviour of a batch is checked in milliseconds.

mod fakes;

use std::sync::Arc;
use std::time::Duration;

use fakes::{RecordingSink, ScriptedTransformer, empty_store, message, outbox_row, publish_error};

use super::*;
use crate::model::TransformFailure;
use crate::model::{OutboundMessage, OutboxId, OutboxRow};
use crate::relay::RetrySettings;
use crate::sink::PublishFault;
use crate::store::memory::{CommitFailure, MemoryStore};

type TestRelay = Relay<MemoryStore, Arc<ScriptedTransformer>, RecordingSink>;

const MAX_ATTEMPTS: u32 = 3;

fn settings() -> RelaySettings {
    RelaySettings {
        batch_size: 100,
        workers: 1,
        adaptive_concurrency: true,
        min_poll_interval: Duration::from_millis(1),
        poll_interval: Duration::from_millis(10),
        retry: RetryPolicy::new(&RetrySettings {
            initial: Duration::from_secs(60),
            max: Duration::from_secs(60),
            jitter: 0.0,
            max_attempts: MAX_ATTEMPTS,
            ..RetrySettings::default()
        }),
        dead_letter_topic: None,
        dead_letter_broker: crate::model::Broker::Kafka,
        shutdown_timeout: Duration::from_millis(100),
    }
}

/// A store holding rows 1..=n of tenant `a`, aggregate type `order`.
fn store_with(n: i64) -> MemoryStore {
    let store = empty_store();
    for id in 1..=n {
        store.insert(outbox_row(id, "a", "order"));
    }
    store
}

fn relay(
    store: &MemoryStore,
    transformer: &Arc<ScriptedTransformer>,
    sink: RecordingSink,
    settings: RelaySettings,
) -> Arc<TestRelay> {
    Arc::new(Relay::new(
        Arc::new(store.clone()),
        Arc::clone(transformer),
        sink,
        settings,
    ))
}

fn retryable(message: &str) -> TransformFailure {
    TransformFailure::Retryable {
        code: "test".into(),
        message: message.into(),
    }
}

#[tokio::test]
async fn a_fan_out_row_is_sent_only_when_every_one_of_its_messages_was_acknowledged() {
    let store = store_with(2);
    // Row 1 fans out to three topics, row 2 to one.
    let transformer = ScriptedTransformer::new(|row| {
        Ok(match row.id {
            OutboxId::Int(1) => vec![message(row, "x"), message(row, "y"), message(row, "z")],
            _ => vec![message(row, "x")],
        })
    });
    let sink = RecordingSink::answering(|m| match m.topic.as_str() {
        "y" => Err(publish_error("y", PublishFault::Failed)),
        _ => Ok(()),
    });
    let relay = relay(&store, &transformer, sink, settings());

    let report = relay.run_batch().await.unwrap();

    assert_eq!(
        (report.claimed, report.sent, report.failed, report.messages),
        (2, 1, 1, 4)
    );
    let fanned = store.row(1);
    assert!(!fanned.sent(), "one of its messages was not acknowledged");
    assert_eq!(fanned.attempts, 1);
    assert!(fanned.last_error.unwrap().contains("publish to y failed"));
    assert!(store.row(2).sent());
    assert_eq!(relay.sink().for_row(1).len(), 3, "all three were sent");
}

#[tokio::test]
async fn rows_without_messages_are_marked_sent_without_publishing_anything() {
    let store = store_with(3);
    let transformer = ScriptedTransformer::new(|row| match row.id {
        OutboxId::Int(2) => Ok(vec![message(row, "x")]),
        _ => Ok(Vec::new()),
    });
    let relay = relay(&store, &transformer, RecordingSink::acking(), settings());

    let report = relay.run_batch().await.unwrap();

    assert_eq!((report.sent, report.failed, report.messages), (3, 0, 1));
    assert!((1..=3).all(|id| store.row(id).sent()));
    assert_eq!(relay.sink().published.lock().unwrap().len(), 1);

    // A batch whose rows are all dropped does not call the sink at all.
    store.insert(outbox_row(4, "a", "order"));
    transformer.set_script(|_| Ok(Vec::new()));
    let calls = relay.sink().calls.load(std::sync::atomic::Ordering::SeqCst);
    relay.run_batch().await.unwrap();
    assert!(store.row(4).sent());
    assert_eq!(
        relay.sink().calls.load(std::sync::atomic::Ordering::SeqCst),
        calls
    );
}

#[tokio::test]
async fn deferred_rows_are_put_back_untouched_and_claimed_again() {
    let store = store_with(2);
    let transformer = ScriptedTransformer::new(|row| match row.id {
        OutboxId::Int(1) => Err(TransformFailure::Deferred("plugin busy".into())),
        _ => Ok(vec![message(row, "x")]),
    });
    let relay = relay(&store, &transformer, RecordingSink::acking(), settings());

    let report = relay.run_batch().await.unwrap();

    assert_eq!((report.sent, report.failed, report.deferred), (1, 0, 1));
    let deferred = store.row(1);
    assert!(!deferred.sent());
    assert_eq!(deferred.attempts, 0, "no attempt counted");
    assert_eq!(deferred.last_error, None);
    assert!(
        relay.sink().for_row(1).is_empty(),
        "nothing of it published"
    );
    assert!(store.state().locked.is_empty(), "lock released");

    transformer.set_script(|row| Ok(vec![message(row, "x")]));
    relay.run_batch().await.unwrap();
    assert!(store.row(1).sent(), "claimed again by the next batch");
}

#[tokio::test]
async fn every_row_that_goes_dead_gets_its_own_dead_letter_copy() {
    let store = empty_store();
    store.insert(outbox_row(1, "a", "order"));
    store.insert(outbox_row(2, "a", "order"));
    store.insert(outbox_row(3, "a", "order"));
    // Row 4 has used up all but its last attempt.
    store.insert(OutboxRow {
        attempts: MAX_ATTEMPTS as i32 - 1,
        ..outbox_row(4, "b", "customer")
    });
    let transformer = ScriptedTransformer::new(|row| match row.id {
        OutboxId::Int(1) => Err(TransformFailure::Permanent {
            code: "bad".into(),
            message: "row one is bad".into(),
        }),
        OutboxId::Int(2) => Err(retryable("row two, try again")),
        OutboxId::Int(3) => Ok(vec![message(row, "x")]),
        _ => Err(retryable("row four, out of attempts")),
    });
    let mut settings = settings();
    settings.dead_letter_topic = Some("dead".into());
    let relay = relay(&store, &transformer, RecordingSink::acking(), settings);

    let report = relay.run_batch().await.unwrap();

    assert_eq!((report.sent, report.failed, report.dead), (1, 3, 2));
    assert!(store.row(1).dead() && store.row(4).dead());
    assert!(!store.row(2).dead(), "row 2 has attempts left");
    let copies: Vec<OutboundMessage> = relay
        .sink()
        .published
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m.topic == "dead")
        .cloned()
        .collect();
    assert_eq!(copies.len(), 2);
    for (copy, id, why) in [
        (&copies[0], 1, "row one is bad"),
        (&copies[1], 4, "row four"),
    ] {
        let header = |name: &str| {
            copy.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        assert_eq!(header("sluice-outbox-id"), id.to_string());
        assert!(
            header("sluice-error").contains(why),
            "{}",
            header("sluice-error")
        );
        assert_eq!(
            copy.payload.as_deref(),
            Some(store.row(id).row.payload.as_slice())
        );
    }
}

#[tokio::test]
async fn a_dead_letter_copy_that_was_not_published_is_noted_and_the_row_is_dead_anyway() {
    let store = store_with(1);
    let transformer = ScriptedTransformer::new(|_| {
        Err(TransformFailure::Permanent {
            code: "bad".into(),
            message: "no".into(),
        })
    });
    let sink = RecordingSink::answering(|m| Err(publish_error(&m.topic, PublishFault::Refused)));
    let mut settings = settings();
    settings.dead_letter_topic = Some("dead".into());
    let relay = relay(&store, &transformer, sink, settings);

    relay.run_batch().await.unwrap();

    let row = store.row(1);
    assert!(row.dead());
    assert!(
        row.last_error
            .unwrap()
            .contains("dead-letter copy not published")
    );
}

#[tokio::test]
async fn rows_the_store_could_not_decode_are_dead_at_once_and_never_published() {
    let store = store_with(2);
    store.state().rows.get_mut(&1).unwrap().undecodable =
        Some("headers column: value of \"n\" must be a string".into());
    let mut settings = settings();
    settings.dead_letter_topic = Some("dead".into());
    let relay = relay(
        &store,
        &ScriptedTransformer::routing(),
        RecordingSink::acking(),
        settings,
    );

    let report = relay.run_batch().await.unwrap();

    assert_eq!((report.claimed, report.sent, report.dead), (2, 1, 1));
    let row = store.row(1);
    assert!(row.dead());
    assert_eq!(row.attempts, 1);
    assert!(relay.sink().for_row(1).is_empty(), "no copy either");
}

#[tokio::test]
async fn publish_results_reach_each_tenants_health_and_broker_outages_cost_no_attempt() {
    let store = empty_store();
    store.insert(outbox_row(1, "a", "order"));
    store.insert(outbox_row(2, "a", "order"));
    store.insert(outbox_row(3, "a", "ghost"));
    store.insert(outbox_row(4, "b", "order"));
    store.insert(outbox_row(5, "c", "order"));
    let transformer = ScriptedTransformer::new(|row| match row.tenant.as_str() {
        "c" => Ok(Vec::new()),
        _ => Ok(vec![message(
            row,
            &format!("{}.{}", row.tenant, row.aggregate_type),
        )]),
    });
    let sink = RecordingSink::answering(|m| match m.topic.as_str() {
        "a.ghost" => Err(publish_error("a.ghost", PublishFault::Refused)),
        "b.order" => Err(publish_error("b.order", PublishFault::Unavailable)),
        _ => Ok(()),
    });
    let relay = relay(&store, &transformer, sink, settings());

    relay.run_batch().await.unwrap();

    // Tenant b's failure was the broker's and tenant c published nothing: neither is told.
    assert_eq!(
        *transformer.publishes.lock().unwrap(),
        vec![("a".to_owned(), 2, 1)]
    );
    assert_eq!(
        store.row(3).attempts,
        1,
        "a refused message costs an attempt"
    );
    let outage = store.row(4);
    assert_eq!(outage.attempts, 0, "an outage costs none");
    assert!(outage.last_error.is_some() && outage.next_attempt_at.is_some());
}

#[tokio::test]
async fn a_commit_that_fails_after_publishing_is_settled_and_not_published_again() {
    for failure in [CommitFailure::MarkMismatch, CommitFailure::Database] {
        let store = store_with(3);
        store.state().failing_commits.push_back(failure);
        let transformer = ScriptedTransformer::new(|row| match row.id {
            OutboxId::Int(3) => Err(retryable("later")),
            _ => Ok(vec![message(row, "x")]),
        });
        let relay = relay(&store, &transformer, RecordingSink::acking(), settings());

        let report = relay.run_batch().await.unwrap();

        assert!(report.commit_error.is_some(), "{failure:?}");
        assert_eq!(store.state().settles, 1);
        assert_eq!((report.sent, report.failed, report.unsettled), (2, 1, 0));
        assert!(store.row(1).sent() && store.row(2).sent());
        assert_eq!(store.row(3).attempts, 1, "the failure is recorded too");

        // Nothing is left to claim: the published batch does not come round again.
        let again = relay.run_batch().await.unwrap();
        assert_eq!(again.claimed, 0);
        assert_eq!(relay.sink().published.lock().unwrap().len(), 2);
    }
}

#[tokio::test]
async fn rows_a_settling_found_locked_are_settled_again_shortly_after() {
    let store = store_with(3);
    store
        .state()
        .failing_commits
        .push_back(CommitFailure::Database);
    store.state().settles_finding_rows_locked = 2;
    let relay = relay(
        &store,
        &ScriptedTransformer::routing(),
        RecordingSink::acking(),
        settings(),
    );

    let report = relay.run_batch().await.unwrap();

    assert_eq!((report.sent, report.unsettled), (3, 0));
    assert_eq!(store.state().settles, 3);
    assert!((1..=3).all(|id| store.row(id).sent()));
}

#[tokio::test]
async fn rows_of_a_commit_being_settled_are_put_back_by_other_workers_at_once() {
    let store = store_with(3);
    let relay = relay(
        &store,
        &ScriptedTransformer::routing(),
        RecordingSink::acking(),
        settings(),
    );
    // Another worker's failed commit of row 2 is being settled.
    let settling = relay.held_back.committing_while(vec![OutboxId::Int(2)]);

    let report = relay.run_batch().await.unwrap();

    assert_eq!((report.claimed, report.deferred, report.sent), (3, 3, 0));
    assert!(relay.sink().published.lock().unwrap().is_empty());
    assert!(
        store.state().locked.is_empty(),
        "the claim was rolled back at once"
    );
    drop(settling);
    assert_eq!(relay.run_batch().await.unwrap().sent, 3);
}

#[tokio::test]
async fn a_row_the_database_refuses_to_record_is_held_back_instead_of_published_in_a_loop() {
    let store = store_with(2);
    store
        .state()
        .failing_commits
        .push_back(CommitFailure::Database);
    store.state().refusing.insert(2);
    let relay = relay(
        &store,
        &ScriptedTransformer::routing(),
        RecordingSink::acking(),
        settings(),
    );

    let first = relay.run_batch().await.unwrap();
    assert_eq!((first.sent, first.unsettled), (1, 1));
    assert!(store.row(1).sent());
    assert!(!store.row(2).sent());

    // Claimed again at once, but held: put back without being published again.
    let second = relay.run_batch().await.unwrap();
    assert_eq!((second.claimed, second.deferred), (1, 1));
    assert_eq!(relay.sink().for_row(2).len(), 1);
    assert_eq!(
        fill(&second, 100),
        Fill::Empty,
        "no work: the relay backs off"
    );

    // Once the hold is over it is published again and, the database willing, recorded.
    store.state().refusing.clear();
    tokio::time::sleep(held_back::FIRST_HOLD + Duration::from_millis(50)).await;
    relay.run_batch().await.unwrap();
    assert!(store.row(2).sent());
    assert_eq!(relay.sink().for_row(2).len(), 2);
}

#[tokio::test]
async fn a_commit_failure_whose_settling_fails_too_leaves_the_rows_unsent_and_counted() {
    let store = store_with(2);
    store
        .state()
        .failing_commits
        .push_back(CommitFailure::Database);
    store.state().settle_fails = true;
    let relay = relay(
        &store,
        &ScriptedTransformer::routing(),
        RecordingSink::acking(),
        settings(),
    );

    let report = relay.run_batch().await.unwrap();

    assert!(report.commit_error.is_some());
    assert_eq!((report.sent, report.failed, report.unsettled), (0, 0, 2));
    assert!(!store.row(1).sent() && !store.row(2).sent());
    assert!(store.state().locked.is_empty());
}

#[tokio::test]
async fn a_transformer_that_returns_too_few_or_too_many_results_fails_the_batch_cleanly() {
    for miscount in [-1, 1] {
        let store = store_with(3);
        let transformer = ScriptedTransformer::routing();
        *transformer.miscount.lock().unwrap() = miscount;
        let relay = relay(&store, &transformer, RecordingSink::acking(), settings());

        let err = relay.run_batch().await.unwrap_err();

        let expected = (3 + miscount) as usize;
        assert!(
            matches!(err, BatchError::ResultCount(ResultCountMismatch { rows: 3, results }) if results == expected),
            "{err}"
        );
        assert!(relay.sink().published.lock().unwrap().is_empty());
        let state = store.state();
        assert_eq!((state.commits, state.rollbacks), (0, 1));
        assert!(state.locked.is_empty());
        assert!(
            state
                .rows
                .values()
                .all(|r| !r.sent() && r.attempts == 0 && r.last_error.is_none())
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_that_outlasts_shutdown_timeout_is_rolled_back() {
    let store = store_with(5);
    let relay = relay(
        &store,
        &ScriptedTransformer::routing(),
        RecordingSink::hanging(),
        settings(),
    );
    let (trigger, stop) = crate::shutdown::channel();
    let running = tokio::spawn({
        let relay = Arc::clone(&relay);
        async move { relay.run(stop).await }
    });
    // Wait until the batch is waiting for its delivery reports.
    while relay.sink().calls.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(store.state().locked.len(), 5);

    trigger.trigger();
    let stats = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("stopped soon after shutdown_timeout")
        .unwrap()
        .expect("a requested stop is no failure");

    assert_eq!(stats.rows_sent, 0);
    let state = store.state();
    assert_eq!((state.commits, state.rollbacks), (0, 1));
    assert!(state.locked.is_empty());
    assert!(state.rows.values().all(|r| !r.sent() && r.attempts == 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_that_panics_stops_the_others_and_makes_run_fail() {
    let store = store_with(5);
    let transformer = ScriptedTransformer::routing();
    transformer
        .panic_once
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut settings = settings();
    settings.workers = 3;
    let relay = relay(&store, &transformer, RecordingSink::acking(), settings);
    // Never triggered: only the failure may end the run.
    let (_trigger, stop) = crate::shutdown::channel();

    let ran = tokio::time::timeout(Duration::from_secs(5), relay.run(stop))
        .await
        .expect("the other workers were stopped");

    assert_eq!(
        ran,
        Err(RelayError::WorkerPanicked(
            "scripted transformer panic".into()
        ))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_relays_everything_due_and_ends_by_itself() {
    let store = store_with(250);
    let mut settings = settings();
    settings.workers = 2;
    let relay = relay(
        &store,
        &ScriptedTransformer::routing(),
        RecordingSink::acking(),
        settings,
    );
    let (_trigger, stop) = crate::shutdown::channel();

    let stats = tokio::time::timeout(Duration::from_secs(5), relay.drain(stop))
        .await
        .expect("drain ends when nothing is due")
        .unwrap();

    assert_eq!(stats.rows_sent, 250);
    assert!(store.state().rows.values().all(|r| r.sent()));
}

#[test]
fn a_batch_whose_rows_were_all_put_back_counts_as_empty_for_the_pacer() {
    let report = |claimed, deferred| BatchReport {
        claimed,
        deferred,
        ..BatchReport::default()
    };
    assert_eq!(fill(&report(0, 0), 10), Fill::Empty);
    assert_eq!(fill(&report(3, 3), 10), Fill::Empty);
    assert_eq!(fill(&report(3, 1), 10), Fill::Partial);
    assert_eq!(fill(&report(10, 1), 10), Fill::Full);
}

#[test]
fn store_error_pause_backs_off() {
    assert_eq!(store_error_pause(1), STORE_ERROR_PAUSE);
    assert_eq!(store_error_pause(2), STORE_ERROR_PAUSE * 2);
    assert_eq!(store_error_pause(100), STORE_ERROR_MAX_PAUSE);
}
