//! Start-up and exit: a stop during start-up exits 0 without relaying anything, and an
//! `acks` setting that would make "acknowledged" mean less than "on every in-sync replica"
//! is refused unless explicitly allowed.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sluice_testkit::*;

/// A "database" that accepts connections and never answers: connecting hangs (for up to the
/// pool's 10 s timeout), so the relay is held in start-up.
fn silent_database() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    (
        format!("postgres://postgres@127.0.0.1:{port}/test"),
        accepted,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_start_up_exits_0_without_relaying() {
    let (url, accepted) = silent_database();
    let config = relay_config("outbox", &kafka_bootstrap(), "unused.", "", "")
        .replace(&database_url(), &url);
    let relay = RelayProcess::start(&config).expect("start relay");
    let connecting = wait_until(Duration::from_secs(30), || async {
        accepted.load(Ordering::SeqCst) > 0
    })
    .await;
    assert!(connecting, "never tried to connect: {}", relay.log());
    assert!(relay.log().contains("starting up"), "{}", relay.log());

    let asked = Instant::now();
    let exit = relay.stop();
    let took = asked.elapsed();

    assert!(exit.success, "exit 0, got {:?}: {}", exit.code, exit.log);
    assert!(took < Duration::from_secs(5), "stopped after {took:?}");
    assert!(
        exit.log.contains("stop requested during start-up"),
        "{}",
        exit.log
    );
    assert!(!exit.log.contains("relay started"), "{}", exit.log);
}

#[test]
fn surprising_tenant_inheritance_is_logged_as_a_warning_at_start_up() {
    // The table does not exist, so the relay stops right after the warnings.
    let config = relay_config("no_such_table_here", &kafka_bootstrap(), "unused.", "", "")
        + "[tenants.acme]\nbuiltin = \"route-by-aggregate\"\n";
    let out = run_config(&config);
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("tenants.acme.config"))
        .unwrap_or_else(|| panic!("no warning about tenants.acme.config: {log}"));
    let message = warning
        .split_once("not set")
        .map(|(_, m)| m)
        .unwrap_or_default();
    assert!(
        message.contains("`topic_prefix`") && !message.contains("  "),
        "{warning}"
    );
}

fn run_config(config: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config).unwrap();
    sluice(&["run", "--config", path.to_str().unwrap()])
}

#[tokio::test(flavor = "multi_thread")]
async fn acks_weaker_than_all_are_refused_at_start_up_unless_allowed() {
    let s = Scenario::new("weakacks", &["order", "customer"]).await;
    let weak = |relay_extra: &str| {
        s.config(relay_extra, "").replace(
            "[kafka]\n",
            "[kafka]\n\"acks\" = 1\n\"enable.idempotence\" = false\n",
        )
    };

    let refused = run_config(&weak(""));
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("kafka.\"acks\"") && stderr.contains("allow_weak_acks"),
        "{stderr}"
    );

    s.table.insert_rows(10, None).await;
    let exit = s
        .relay_until(&weak("allow_weak_acks = true"), || async {
            s.table.count().await == 0
        })
        .await;
    assert!(exit.log.contains("kafka acks weaker than"), "{}", exit.log);
    assert_eq!(
        count_by_id(&s.consume(10, Duration::from_secs(1))).len(),
        10
    );
    s.finish().await;
}
