//! Hot reload: replacing a plugin file swaps in the new version without a restart, and every
//! row is handled by exactly one version (none lost, none published by both); a broken new
//! file keeps the old version running.

use std::collections::HashMap;
use std::time::Duration;

use sluice_testkit::*;

/// Replaces `path` atomically, as a deployment would.
fn replace(path: &std::path::Path, with: &std::path::Path) {
    let tmp = path.with_extension("new");
    std::fs::copy(with, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn replacing_the_plugin_file_mid_stream_hands_every_row_to_exactly_one_version() {
    let s = Scenario::new("reload", &["order", "customer", "a", "b"]).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("router.wasm");
    // v1 routes by aggregate (topics order/customer); v2 fans out to topics a and b.
    std::fs::copy(reference_plugin(), &plugin).unwrap();
    let config = s.config("", "").replace(
        &reference_plugin().display().to_string(),
        &plugin.display().to_string(),
    );
    let relay = RelayProcess::start(&config).unwrap();

    let mut inserted = 0;
    for round in 0..60 {
        if round == 20 {
            // Not a component: must be refused while v1 keeps running.
            std::fs::write(dir.path().join("broken.wasm"), b"garbage").unwrap();
            replace(&plugin, &dir.path().join("broken.wasm"));
        }
        if round == 30 {
            replace(&plugin, &test_plugin("test_fanout"));
        }
        s.table.insert_rows(20, None).await;
        inserted += 20;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await;
    assert!(drained, "{}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(
        exit.log.contains("the old version keeps running"),
        "{}",
        exit.log
    );
    assert!(exit.log.contains("plugin reloaded"), "{}", exit.log);

    let got = s.consume(inserted, Duration::from_secs(3));
    let mut v1: HashMap<String, usize> = HashMap::new();
    let mut v2: HashMap<String, usize> = HashMap::new();
    for m in &got {
        let id = m.header("id").unwrap();
        let by = if m.topic.ends_with(".a") || m.topic.ends_with(".b") {
            &mut v2
        } else {
            &mut v1
        };
        *by.entry(id).or_default() += 1;
    }
    assert!(
        !v1.is_empty() && !v2.is_empty(),
        "both versions handled rows"
    );
    for id in 1..=inserted {
        let id = id.to_string();
        match (v1.get(&id), v2.get(&id)) {
            (Some(1), None) | (None, Some(2)) => {}
            other => panic!("row {id}: v1/v2 messages {other:?}"),
        }
    }
    s.finish().await;
}
