//! Tenants as a platform runs them: one file per tenant in `[plugins] tenants_dir`, added,
//! changed and removed while the relay runs, without a restart; a broken file keeps the
//! running version; the same through a directory swapped the way Kubernetes swaps a mounted
//! ConfigMap; `POST /reload` only with the credentials.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use sluice_testkit::config::toml_string;
use sluice_testkit::scrape::http_request;
use sluice_testkit::*;

const TOKEN: &str = "r3load-t0ken";

/// Writes `path` atomically (a temporary file renamed over it), as a platform should.
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A tenant file running the reference plugin, writing to `<prefix><aggregate type>`.
fn tenant_file(prefix: &str) -> String {
    format!(
        "path = {}\nconfig = {{ topic_prefix = {} }}\n",
        toml_string(&reference_plugin().to_string_lossy()),
        toml_string(prefix)
    )
}

/// A relay config without `[plugins.default]`, its tenants in `dir`, `/reload` served.
fn config(s: &Scenario, dir: &Path, port: u16) -> String {
    let mut config = RelayConfig {
        plugins_extra: Some(format!(
            "tenants_dir = {}",
            toml_string(&dir.to_string_lossy())
        )),
        default_plugin: None,
        ..RelayConfig::for_tests(&s.table.name, &kafka_bootstrap(), &s.prefix)
    }
    .render();
    config.push_str(&format!(
        "\n[telemetry]\nlisten = \"127.0.0.1:{port}\"\nbearer_token = \"{TOKEN}\"\nreload = true\n"
    ));
    config
}

/// Waits (up to 20 s) until the relay logged `line`.
async fn logged(relay: &RelayProcess, line: &str) {
    let found = wait_until(Duration::from_secs(20), || async {
        relay.log().contains(line)
    })
    .await;
    assert!(found, "no {line:?} logged: {}", relay.log_tail());
}

/// Unsent rows of `tenant`: `(count, most attempts)`.
async fn waiting(s: &Scenario, tenant: &str) -> (usize, i32) {
    let rows = s.table.unsent_rows().await;
    let of: Vec<_> = rows
        .iter()
        .filter(|(t, _, _)| t.as_deref() == Some(tenant))
        .collect();
    (of.len(), of.iter().map(|(_, a, _)| *a).max().unwrap_or(0))
}

async fn drained_except(s: &Scenario, except: &[&str]) -> bool {
    s.table
        .unsent_rows()
        .await
        .iter()
        .all(|(t, _, _)| t.as_deref().is_some_and(|t| except.contains(&t)))
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_come_change_and_go_as_files_while_the_relay_runs() {
    let suffixes: Vec<String> = ["a", "a2", "b", "c", "d"]
        .iter()
        .flat_map(|t| [format!("{t}.order"), format!("{t}.customer")])
        .collect();
    let suffixes: Vec<&str> = suffixes.iter().map(String::as_str).collect();
    let s = Scenario::new("live_tenants", &suffixes).await;
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.d");
    std::fs::create_dir(&tenants).unwrap();
    for t in ["a", "b", "c"] {
        write_atomic(
            &tenants.join(format!("{t}.toml")),
            &tenant_file(&format!("{}{t}.", s.prefix)),
        );
    }
    // What a platform's directory also holds: an editor's swap file; and a tenant file that
    // does not check at start, which holds up its own tenant only.
    std::fs::write(tenants.join(".a.toml.swp"), b"\0\0not toml").unwrap();
    std::fs::write(tenants.join("zz.toml"), "memory_mb = 0\n").unwrap();
    let port = free_port();
    let config_text = config(&s, &tenants, port);
    let relay = RelayProcess::start(&config_text).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    let addr = format!("127.0.0.1:{port}");

    for t in ["a", "b", "c"] {
        s.table.insert_rows(10, Some(t)).await;
    }
    assert!(
        wait_until(SCENARIO_WAIT, || async { s.table.unsent().await == 0 }).await,
        "{}",
        relay.log_tail()
    );

    // A fourth tenant's file appears: its rows flow within seconds.
    write_atomic(
        &tenants.join("d.toml"),
        &tenant_file(&format!("{}d.", s.prefix)),
    );
    logged(&relay, "tenant added").await;
    s.table.insert_rows(10, Some("d")).await;
    assert!(
        wait_until(Duration::from_secs(20), || async {
            s.table.unsent().await == 0
        })
        .await,
        "tenant d did not start: {}",
        relay.log_tail()
    );

    // A tenant's `config` rotated: its next messages use it.
    write_atomic(
        &tenants.join("a.toml"),
        &tenant_file(&format!("{}a2.", s.prefix)),
    );
    logged(&relay, "tenant changed").await;
    s.table.insert_rows(10, Some("a")).await;

    // A tenant file deleted: its rows wait (not dead), the others flow.
    std::fs::remove_file(tenants.join("c.toml")).unwrap();
    logged(&relay, "tenant removed").await;
    s.table.insert_rows(10, Some("c")).await;
    s.table.insert_rows(10, Some("b")).await;

    // A broken file (a partial write, left as it is): b keeps its running version.
    std::fs::write(tenants.join("b.toml"), "path = ").unwrap();
    std::os::unix::fs::symlink("loop2.toml", tenants.join("loop1.toml")).unwrap();
    std::os::unix::fs::symlink("loop1.toml", tenants.join("loop2.toml")).unwrap();
    logged(&relay, "its running version keeps running").await;
    s.table.insert_rows(10, Some("b")).await;
    assert!(
        wait_until(SCENARIO_WAIT, || async { drained_except(&s, &["c"]).await }).await,
        "{}",
        relay.log_tail()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(waiting(&s, "c").await, (10, 0), "c's rows wait, untouched");

    // /status names the waiting tenant and the one on its old version.
    let (code, status) = http_request(&addr, "GET", "/status", Some(&format!("Bearer {TOKEN}")))
        .expect("status answers");
    assert_eq!(code, 200, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let changes = &status["tenant_changes"];
    assert!(changes["waiting"]["c"].is_string(), "{status}");
    assert!(
        changes["waiting"]["zz"]
            .as_str()
            .is_some_and(|why| why.contains("zz.toml: memory_mb")),
        "{status}"
    );
    assert!(
        changes["kept_old_version"]["b"]
            .as_str()
            .is_some_and(|why| why.contains("tenants.d/b.toml") || why.contains("b.toml")),
        "{status}"
    );
    // POST /reload: refused without the credentials, answered with them (422: b still
    // does not check, and is named).
    let (code, _) = http_request(&addr, "POST", "/reload", None).expect("answers");
    assert_eq!(code, 401);
    let (code, body) =
        http_request(&addr, "POST", "/reload", Some(&format!("Bearer {TOKEN}"))).expect("answers");
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("b.toml"), "{body}");
    // The same from the command line, with the config's credentials: exit 2, b named.
    let out = sluice_with_config(&["reload"], &config_text);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("b.toml"), "{stdout}");
    // The file fixed, and c back: everything flows.
    write_atomic(
        &tenants.join("b.toml"),
        &tenant_file(&format!("{}b.", s.prefix)),
    );
    write_atomic(
        &tenants.join("c.toml"),
        &tenant_file(&format!("{}c.", s.prefix)),
    );
    assert!(
        wait_until(SCENARIO_WAIT, || async { s.table.unsent().await == 0 }).await,
        "{}",
        relay.log_tail()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(!exit.log.contains("panicked"), "{}", exit.log);

    // Every row delivered (at least once), a's last ten under its rotated prefix.
    let got = s.consume(80, Duration::from_secs(3));
    let mut by_tenant: HashMap<String, Vec<String>> = HashMap::new();
    for m in &got {
        let tenant = m.topic[s.prefix.len()..]
            .split('.')
            .next()
            .unwrap()
            .to_owned();
        by_tenant
            .entry(tenant)
            .or_default()
            .push(m.header("id").unwrap());
    }
    let count = |t: &str| by_tenant.get(t).map_or(0, Vec::len);
    assert_eq!(
        (count("a"), count("a2"), count("b"), count("c"), count("d")),
        (10, 10, 30, 20, 10),
        "{by_tenant:?}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_swapped_as_kubernetes_swaps_a_configmap_applies() {
    let s = Scenario::new(
        "live_k8s",
        &["k.order", "k.customer", "k2.order", "k2.customer"],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("tenants");
    std::fs::create_dir(&mount).unwrap();
    // The kubelet's layout: a timestamped directory, `..data` pointing at it, and one
    // symlink per key through `..data`.
    let version = |n: u32, prefix: &str| {
        let v = mount.join(format!("..2026_12_06_00_00_0{n}.000"));
        std::fs::create_dir(&v).unwrap();
        std::fs::write(v.join("k.toml"), tenant_file(prefix)).unwrap();
        let tmp = mount.join("..data_tmp");
        std::os::unix::fs::symlink(v.file_name().unwrap(), &tmp).unwrap();
        std::fs::rename(&tmp, mount.join("..data")).unwrap();
    };
    version(1, &format!("{}k.", s.prefix));
    std::os::unix::fs::symlink("..data/k.toml", mount.join("k.toml")).unwrap();
    let port = free_port();
    let relay = RelayProcess::start(&config(&s, &mount, port)).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    s.table.insert_rows(10, Some("k")).await;
    assert!(
        wait_until(SCENARIO_WAIT, || async { s.table.unsent().await == 0 }).await,
        "{}",
        relay.log_tail()
    );
    version(2, &format!("{}k2.", s.prefix));
    logged(&relay, "tenant changed").await;
    s.table.insert_rows(10, Some("k")).await;
    assert!(
        wait_until(SCENARIO_WAIT, || async { s.table.unsent().await == 0 }).await,
        "{}",
        relay.log_tail()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let got = s.consume(20, Duration::from_secs(2));
    let k2 = got
        .iter()
        .filter(|m| m.topic.starts_with(&format!("{}k2.", s.prefix)))
        .count();
    assert_eq!((got.len(), k2), (20, 10));
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lazy_tenants_start_on_their_first_row_without_failing_it() {
    let s = Scenario::new(
        "live_lazy",
        &["l1.order", "l1.customer", "l2.order", "l2.customer"],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.d");
    std::fs::create_dir(&tenants).unwrap();
    // Two plugin files, so each tenant's first row asks for a compile of its own.
    let other = dir.path().join("router-copy.wasm");
    std::fs::copy(reference_plugin(), &other).unwrap();
    std::fs::write(
        tenants.join("l1.toml"),
        tenant_file(&format!("{}l1.", s.prefix)),
    )
    .unwrap();
    std::fs::write(
        tenants.join("l2.toml"),
        format!(
            "path = {}\nconfig = {{ topic_prefix = {} }}\n",
            toml_string(&other.to_string_lossy()),
            toml_string(&format!("{}l2.", s.prefix))
        ),
    )
    .unwrap();
    let port = free_port();
    let config = config(&s, &tenants, port).replace(
        "[plugins]\n",
        &format!(
            "[plugins]\nload = \"lazy\"\ncache_dir = {}\n",
            toml_string(&dir.path().join("cache").to_string_lossy())
        ),
    );
    assert!(config.contains("load = \"lazy\""), "{config}");
    let relay = RelayProcess::start(&config).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    assert!(
        !relay.log().contains("plugin loaded for its first row"),
        "nothing compiled before a row asked: {}",
        relay.log()
    );
    s.table.insert_rows(10, Some("l1")).await;
    s.table.insert_rows(10, Some("l2")).await;
    assert!(
        wait_until(SCENARIO_WAIT, || async { s.table.unsent().await == 0 }).await,
        "{}",
        relay.log_tail()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert_eq!(
        exit.log.matches("plugin loaded for its first row").count(),
        2,
        "each file once: {}",
        exit.log
    );
    // Waiting for a compile is no failure: no row was retried or failed.
    let stopped = exit.log.lines().rev().find(|l| l.contains("relay stopped"));
    assert!(
        stopped.is_some_and(|l| l.contains("rows_failed=0")),
        "{}",
        exit.log
    );
    let got = s.consume(20, Duration::from_secs(2));
    assert_eq!(got.len(), 20);
    s.finish().await;
}
