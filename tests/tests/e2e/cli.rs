//! The command line: migrate, config and plugin errors, `plugin check` and `plugin test`.

use std::io::Write;
use std::time::Duration;

use sluice_testkit::*;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write_config(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_twice_is_harmless_and_creates_columns_and_partial_index() {
    let table = DbTable::create(Database::Postgres, "migrate").await;
    let again = sluice(&[
        "migrate",
        "--database-url",
        &database_url(),
        "--table",
        &table.name,
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    let columns = table
        .scalar_i64(&format!(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = '{}'
               AND column_name IN ('published_at','attempts','next_attempt_at','last_error','dead_at','headers')",
            table.name
        ))
        .await;
    assert_eq!(columns, 6);
    let index: String = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE tablename = $1 AND indexname LIKE '%unsent%'",
    )
    .bind(&table.name)
    .fetch_one(table.pg_pool())
    .await
    .unwrap();
    assert!(
        index.contains("WHERE ((published_at IS NULL) AND (dead_at IS NULL))"),
        "{index}"
    );
    table.drop_table().await;
}

#[test]
fn migrate_refuses_a_table_name_that_is_not_an_identifier() {
    let out = sluice(&[
        "migrate",
        "--database-url",
        &database_url(),
        "--table",
        "outbox; DROP TABLE x",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("invalid table name"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_reports_a_missing_config_file() {
    let out = sluice(&["run", "--config", "/nonexistent/sluice.toml"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("/nonexistent/sluice.toml") && err.contains("cannot read"),
        "{err}"
    );
}

/// Runs `sluice run` with `config` and returns its stderr; the run must fail.
fn run_must_fail(config: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(&dir, config);
    let out = sluice(&["run", "--config", &path]);
    assert!(!out.status.success(), "sluice run accepted:\n{config}");
    stderr(&out)
}

/// A config whose default plugin is `plugin` with `plugin_config` (inline table body), with
/// `strict_startup` so a plugin that cannot start stops `sluice run` (without it the tenants
/// using it are quarantined and the relay runs: see sandbox_breaches.rs).
fn plugin_config(plugin: &std::path::Path, plugin_config: &str) -> String {
    format!(
        "[database]\nurl = \"{}\"\n[kafka]\n\"bootstrap.servers\" = \"127.0.0.1:9092\"\n\
         [plugins]\nstrict_startup = true\n[plugins.default]\npath = \"{}\"\nconfig = {{ {plugin_config} }}\n",
        database_url(),
        plugin.display()
    )
}

#[test]
fn run_names_an_unknown_config_key() {
    let err = run_must_fail("[database]\nurl = \"postgres://x\"\n[relay]\nbatch_sise = 10\n");
    assert!(err.contains("batch_sise"), "{err}");
}

#[test]
fn run_names_an_invalid_duration() {
    let err =
        run_must_fail("[database]\nurl = \"postgres://x\"\n[relay]\npoll_interval = \"often\"\n");
    assert!(
        err.contains("poll_interval") && err.contains("often"),
        "{err}"
    );
}

#[test]
fn run_refuses_a_file_that_is_not_a_component_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus.wasm");
    std::fs::write(&bogus, b"definitely not wasm").unwrap();
    let err = run_must_fail(&plugin_config(&bogus, ""));
    let named = err.contains("bogus.wasm") && err.contains("not a valid WebAssembly component");
    assert!(named, "{err}");
}

#[test]
fn run_refuses_a_component_without_the_transformer_export() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.wasm");
    // The host accepts the text format too; an empty component exports nothing.
    std::fs::write(&empty, b"(component)").unwrap();
    let err = run_must_fail(&plugin_config(&empty, ""));
    assert!(
        err.contains("empty.wasm") && err.contains("transformer"),
        "{err}"
    );
}

#[test]
fn run_refuses_a_plugin_config_the_plugin_rejects() {
    let err = run_must_fail(&plugin_config(&reference_plugin(), "topic_prefx = \"x.\""));
    assert!(
        err.contains("rejected its config") && err.contains("topic_prefx"),
        "{err}"
    );
}

#[test]
fn plugin_check_prints_info() {
    let plugin = reference_plugin();
    let out = sluice(&["plugin", "check", &plugin.display().to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("name:    route-by-aggregate"), "{text}");
    assert!(text.contains("topic_prefix"), "config schema shown: {text}");
    // The contract version read from the component's export, and the file's digest as
    // coreutils' sha256sum computes it.
    assert!(
        text.contains(": OK (exports sluice:plugin/transformer@0.3.0)"),
        "{text}"
    );
    let sum = std::process::Command::new("sha256sum")
        .arg(&plugin)
        .output()
        .expect("sha256sum");
    let sum = String::from_utf8_lossy(&sum.stdout);
    let hex = sum.split_whitespace().next().unwrap_or_default();
    assert_eq!(hex.len(), 64, "{sum}");
    assert!(text.contains(&format!("digest:  sha256:{hex}")), "{text}");
}

#[test]
fn plugin_check_rejects_a_core_module() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("core.wasm");
    std::fs::write(&module, b"\0asm\x01\0\0\0").unwrap();
    let out = sluice(&["plugin", "check", &module.display().to_string()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("core WebAssembly module, not a component"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn plugin_test_prints_routed_messages_and_errors_as_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.jsonl");
    let mut f = std::fs::File::create(&rows).unwrap();
    writeln!(f, r#"{{"id": 7, "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "OrderCreated", "payload": {{"total": 3}}, "headers": {{"trace": "t1"}}}}"#).unwrap();
    writeln!(
        f,
        r#"{{"id": 8, "aggregate_type": "", "aggregate_id": "o-2", "event_type": "Broken"}}"#
    )
    .unwrap();
    drop(f);
    let out = sluice(&[
        "plugin",
        "test",
        &reference_plugin().display().to_string(),
        "--input",
        &rows.display().to_string(),
        "--set",
        "topic_prefix=shop.",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["topic"], "shop.order");
    assert_eq!(lines[0]["key"], "o-1");
    assert_eq!(lines[0]["payload"], r#"{"total":3}"#);
    let headers = lines[0]["headers"].as_array().unwrap();
    assert!(headers.contains(&serde_json::json!(["id", "7"])));
    assert!(headers.contains(&serde_json::json!(["event-type", "OrderCreated"])));
    assert!(headers.contains(&serde_json::json!(["trace", "t1"])));
    assert_eq!(lines[1]["row"], 8);
    assert_eq!(lines[1]["kind"], "permanent");
}

#[test]
fn plugin_test_names_a_bad_input_line() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.jsonl");
    std::fs::write(&rows, "{\"aggregate_type\": \"order\"}\n").unwrap();
    let out = sluice(&[
        "plugin",
        "test",
        &reference_plugin().display().to_string(),
        "--input",
        &rows.display().to_string(),
    ]);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("line 1") && stdout.contains("aggregate_id"),
        "{stdout}"
    );
}

/// The JSON lines `plugin test` printed.
fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The value of header `name` of one output message.
fn header<'a>(message: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    message["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .map(|h| &h[1])
}

#[test]
fn plugin_test_takes_uuid_and_text_ids_as_the_table_gives_them() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.jsonl");
    let uuid = "0b9f4c1e-7d0a-4c55-9a55-3f1c1b8e2d10";
    let mut f = std::fs::File::create(&rows).unwrap();
    for id in [format!("\"{uuid}\""), "\"evt-01\"".into(), "42".into()] {
        writeln!(f, r#"{{"id": {id}, "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "OrderCreated"}}"#).unwrap();
    }
    drop(f);
    let out = plugin_test(
        &reference_plugin(),
        &["--input", &rows.display().to_string()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["row"], uuid);
    assert_eq!(
        header(&lines[0], "sluice-outbox-id"),
        Some(&serde_json::json!(uuid))
    );
    assert_eq!(lines[1]["row"], "evt-01");
    assert_eq!(
        header(&lines[1], "sluice-outbox-id"),
        Some(&serde_json::json!("evt-01"))
    );
    assert_eq!(lines[2]["row"], 42, "an integer key stays a number");
    assert_eq!(
        header(&lines[2], "sluice-outbox-id"),
        Some(&serde_json::json!("42"))
    );
}

/// A sluice.toml (no database URL: `plugin test` needs none) whose tenant `acme` runs its own
/// copy of the reference plugin (a path relative to the file) with its own config and a
/// narrow allow-list, and whose default runs the builtin for `shop.*`.
fn tenant_config(dir: &tempfile::TempDir) -> String {
    std::fs::copy(reference_plugin(), dir.path().join("acme.wasm")).unwrap();
    write_config(
        dir,
        "[database]\n\
         [plugins.default]\nbuiltin = \"route-by-aggregate\"\nconfig = { topic_prefix = \"shop.\" }\n\
         allowed_topics = [\"shop.*\"]\n\
         [tenants.acme]\npath = \"acme.wasm\"\nconfig = { topic_prefix = \"acme.\" }\n\
         allowed_topics = [\"acme.order\"]\n",
    )
}

/// Rows of aggregate `order` and `payment`, as `plugin test` input in `dir`.
fn order_and_payment(dir: &tempfile::TempDir) -> String {
    let path = dir.path().join("mixed.jsonl");
    std::fs::write(
        &path,
        // A fixed created_at: the reference plugin stamps it as the message's timestamp, so
        // two runs print the same.
        "{\"id\": 1, \"aggregate_type\": \"order\", \"aggregate_id\": \"o-1\", \"event_type\": \"E\", \"created_at\": \"2026-01-01T00:00:00Z\"}\n\
         {\"id\": 2, \"aggregate_type\": \"payment\", \"aggregate_id\": \"p-1\", \"event_type\": \"E\", \"created_at\": \"2026-01-01T00:00:00Z\"}\n",
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn plugin_test_runs_as_a_tenant_of_a_sluice_toml_with_its_config_and_allow_list() {
    let dir = tempfile::tempdir().unwrap();
    let config = tenant_config(&dir);
    let rows = order_and_payment(&dir);
    let as_tenant = |tenant: &str, extra: &[&str]| {
        let mut args = vec!["plugin", "test"];
        args.extend_from_slice(extra);
        args.extend(["--input", &rows, "--config", &config, "--tenant", tenant]);
        sluice(&args)
    };

    let acme = as_tenant("acme", &[]);
    assert!(acme.status.success(), "{}", stderr(&acme));
    let lines = json_lines(&acme);
    assert_eq!(
        lines[0]["topic"], "acme.order",
        "its config reached the plugin"
    );
    assert_eq!(
        header(&lines[0], "sluice-tenant"),
        Some(&serde_json::json!("acme"))
    );
    assert_eq!(lines[1]["kind"], "invalid-output", "{lines:?}");
    assert!(
        lines[1]["error"]
            .as_str()
            .unwrap()
            .contains("allowed_topics"),
        "its allow-list refused acme.payment: {lines:?}"
    );
    assert!(
        stderr(&acme).contains("tenant \"acme\": [tenants.acme] of")
            && stderr(&acme).contains("acme.wasm"),
        "{}",
        stderr(&acme)
    );

    // A plugin given as well replaces the tenant's; its config and allow-list stay.
    let rebuilt = as_tenant("acme", &["--builtin", "route-by-aggregate"]);
    assert!(rebuilt.status.success(), "{}", stderr(&rebuilt));
    let lines = json_lines(&rebuilt);
    assert_eq!(lines[0]["topic"], "acme.order");
    assert_eq!(lines[1]["kind"], "invalid-output");

    // A tenant without an entry runs [plugins.default], as the relay does, and is told so.
    let zeta = as_tenant("zeta", &[]);
    assert!(zeta.status.success(), "{}", stderr(&zeta));
    let lines = json_lines(&zeta);
    assert_eq!(lines[0]["topic"], "shop.order");
    assert_eq!(lines[1]["topic"], "shop.payment");
    assert!(
        stderr(&zeta).contains("no [tenants.zeta] entry")
            && stderr(&zeta).contains("[plugins.default]"),
        "{}",
        stderr(&zeta)
    );

    // --tenant needs a file.
    let alone = sluice(&["plugin", "test", "--input", &rows, "--tenant", "acme"]);
    assert_eq!(alone.status.code(), Some(2), "{}", stderr(&alone));
    let alone = sluice(&[
        "plugin", "test", "--input", &rows, "--tenant", "acme", "--config", "x=1",
    ]);
    assert_eq!(alone.status.code(), Some(1), "{}", stderr(&alone));
    assert!(
        stderr(&alone).contains("--tenant needs --config sluice.toml"),
        "{}",
        stderr(&alone)
    );
}

#[test]
fn plugin_test_config_key_value_is_deprecated_and_refused_when_ambiguous() {
    let dir = tempfile::tempdir().unwrap();
    let rows = order_and_payment(&dir);
    let old = plugin_test(
        &reference_plugin(),
        &["--input", &rows, "--config", "topic_prefix=shop."],
    );
    assert!(old.status.success(), "{}", stderr(&old));
    assert_eq!(
        json_lines(&old)[0]["topic"],
        "shop.order",
        "still a plugin setting"
    );
    assert!(
        stderr(&old).contains("deprecated") && stderr(&old).contains("--set topic_prefix=shop."),
        "{}",
        stderr(&old)
    );
    let new = plugin_test(
        &reference_plugin(),
        &["--input", &rows, "--set", "topic_prefix=shop."],
    );
    assert_eq!(new.stdout, old.stdout);
    assert!(!stderr(&new).contains("deprecated"), "{}", stderr(&new));

    // A file named like the setting, where the command runs: refused, not guessed.
    std::fs::write(dir.path().join("topic_prefix=shop."), "").unwrap();
    let ambiguous = std::process::Command::new(sluice_bin())
        .current_dir(dir.path())
        .args(["plugin", "test"])
        .arg(reference_plugin())
        .args(["--input", &rows, "--config", "topic_prefix=shop."])
        .output()
        .unwrap();
    assert_eq!(ambiguous.status.code(), Some(1));
    assert!(
        stderr(&ambiguous).contains("--set topic_prefix=shop.")
            && stderr(&ambiguous).contains("--config ./topic_prefix=shop."),
        "{}",
        stderr(&ambiguous)
    );
    assert!(ambiguous.stdout.is_empty());
}

#[test]
fn compiled_plugins_are_cached_and_reused_on_the_next_start() {
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().display().to_string();
    let env = [("SLUICE_PLUGIN_CACHE_DIR", cache_dir.as_str())];
    let plugin = reference_plugin().display().to_string();
    let first = sluice_with_env(&["plugin", "check", &plugin], &env);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("compiled plugin and cached it"),
        "{}",
        stderr(&first)
    );
    let entries: Vec<_> = std::fs::read_dir(cache.path()).unwrap().collect();
    assert_eq!(entries.len(), 1, "one cache entry per plugin version");

    let second = sluice_with_env(&["plugin", "check", &plugin], &env);
    assert!(second.status.success(), "{}", stderr(&second));
    let log = stderr(&second);
    assert!(
        log.contains("loaded precompiled plugin from cache"),
        "{log}"
    );
    assert!(!log.contains("compiled plugin and cached it"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_relays_the_backlog_and_exits_0() {
    let s = Scenario::new("drain", &["order", "customer"]).await;
    s.table.insert_rows(3_000, None).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&dir, &s.config("", ""));
    let out = sluice(&["drain", "--config", &config]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("3000 rows sent, 0 failed"), "{err}");
    assert_eq!(s.table.count().await, 0);
    assert_eq!(
        count_by_id(&s.consume(3_000, Duration::from_secs(1))).len(),
        3_000
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_exits_2_when_rows_failed() {
    let s = Scenario::new("drainfail", &["order", "customer"]).await;
    s.table.insert_rows(20, None).await;
    s.table.insert_rows(5, Some("refuser")).await;
    let dir = tempfile::tempdir().unwrap();
    let tenants = s.tenant("refuser", "test_fail_permanent", "");
    let config = write_config(&dir, &s.config("", &tenants));
    let out = sluice(&["drain", "--config", &config]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("20 rows sent, 5 failed (5 dead)"), "{err}");
    assert!(err.contains("5 dead"), "{err}");
    s.finish().await;
}

#[test]
fn migrate_refuses_notify_trigger_options_before_touching_a_database_without_notify() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let url = format!("sqlite://{}", db.display());
    for flag in ["--notify-trigger", "--drop-notify-trigger"] {
        let out = sluice(&["migrate", "--database-url", &url, "--table", "outbox", flag]);
        assert!(!out.status.success(), "{flag}");
        let err = stderr(&out);
        assert!(
            err.contains(flag) && err.contains("SQLite has no LISTEN/NOTIFY"),
            "{flag}: {err}"
        );
    }
    // Nothing was migrated: the database file was never created.
    assert!(!db.exists(), "migrate touched {}", db.display());
}

/// `n` rows of aggregate `order`, ids 1..=n, as `plugin test` input in `dir`.
fn order_rows(dir: &tempfile::TempDir, n: usize) -> String {
    let path = dir.path().join(format!("rows-{n}.jsonl"));
    let mut f = std::fs::File::create(&path).unwrap();
    for i in 1..=n {
        writeln!(f, r#"{{"id": {i}, "aggregate_type": "order", "aggregate_id": "o-{i}", "event_type": "OrderCreated", "payload": {{"n": {i}}}, "created_at": "2026-01-01T00:00:00Z"}}"#).unwrap();
    }
    path.display().to_string()
}

fn plugin_test(plugin: &std::path::Path, args: &[&str]) -> std::process::Output {
    let plugin = plugin.display().to_string();
    let mut all = vec!["plugin", "test", plugin.as_str()];
    all.extend_from_slice(args);
    sluice(&all)
}

fn hostile(mode: &str, input: &str, extra: &[&str]) -> std::process::Output {
    let mode = format!("mode={mode}");
    let mut args = vec!["--input", input, "--set", &mode, "--set", "topic_prefix=t."];
    args.extend_from_slice(extra);
    plugin_test(&test_plugin("test_hostile"), &args)
}

#[test]
fn plugin_test_expect_passes_on_equal_output_and_prints_a_diff_with_exit_3_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let rows = order_rows(&dir, 12);
    let plain = plugin_test(&reference_plugin(), &["--input", &rows]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let golden = dir.path().join("expected.jsonl");
    std::fs::write(&golden, &plain.stdout).unwrap();
    let golden_arg = golden.display().to_string();

    let same = plugin_test(
        &reference_plugin(),
        &["--input", &rows, "--expect", &golden_arg],
    );
    assert!(same.status.success(), "{}", stderr(&same));
    assert!(same.stdout.is_empty(), "nothing but a diff is printed");
    assert!(
        stderr(&same).contains("output matches"),
        "{}",
        stderr(&same)
    );

    let changed = String::from_utf8_lossy(&plain.stdout).replace("\"o-7\"", "\"o-seven\"");
    std::fs::write(&golden, changed).unwrap();
    let differs = plugin_test(
        &reference_plugin(),
        &["--input", &rows, "--expect", &golden_arg],
    );
    assert_eq!(differs.status.code(), Some(3), "{}", stderr(&differs));
    let diff = String::from_utf8_lossy(&differs.stdout);
    assert!(diff.contains("@@ -4,7 +4,7 @@"), "{diff}");
    assert!(diff.contains("\n-{") && diff.contains("o-seven"), "{diff}");
    assert!(diff.contains("\n+{") && diff.contains("\"o-7\""), "{diff}");
    assert!(
        stderr(&differs).contains("output differs from"),
        "{}",
        stderr(&differs)
    );
}

#[test]
fn plugin_test_runs_builtins_and_gives_the_same_output_in_any_batch_size() {
    let dir = tempfile::tempdir().unwrap();
    let rows = order_rows(&dir, 150);
    let reference = plugin_test(&reference_plugin(), &["--input", &rows]);
    assert!(reference.status.success(), "{}", stderr(&reference));
    for size in ["1", "7", "64"] {
        let out = plugin_test(
            &reference_plugin(),
            &["--input", &rows, "--batch-size", size],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(out.stdout, reference.stdout, "--batch-size {size}");
    }
    let builtin = sluice(&[
        "plugin",
        "test",
        "--builtin",
        "route-by-aggregate",
        "--input",
        &rows,
    ]);
    assert!(builtin.status.success(), "{}", stderr(&builtin));
    let text = String::from_utf8_lossy(&builtin.stdout);
    assert_eq!(text.lines().count(), 150);
    assert!(text.contains(r#""topic":"outbox.event.order""#), "{text}");
}

#[test]
fn plugin_test_calls_transform_batch_as_the_relay_does() {
    let dir = tempfile::tempdir().unwrap();
    let rows = order_rows(&dir, 20);
    // `short-batch` answers transform-batch with a result missing: only a batch call fails.
    let batched = hostile("short-batch", &rows, &["--batch-size", "4"]);
    assert!(batched.status.success(), "{}", stderr(&batched));
    assert!(
        stderr(&batched).contains("transform-batch failed"),
        "{}",
        stderr(&batched)
    );
    let text = String::from_utf8_lossy(&batched.stdout);
    assert_eq!(
        text.matches(r#""topic":"t.good""#).count(),
        20,
        "no row lost: {text}"
    );
    let single = hostile("short-batch", &rows, &["--batch-size", "1"]);
    assert!(single.status.success(), "{}", stderr(&single));
    assert!(
        !stderr(&single).contains("transform-batch"),
        "{}",
        stderr(&single)
    );
}

#[test]
fn plugin_test_applies_memory_and_call_timeout_flags() {
    let dir = tempfile::tempdir().unwrap();
    let rows = order_rows(&dir, 2);
    // `fat` holds 8 MiB from configure on.
    let fat = hostile("fat", &rows, &["--memory-mb", "4"]);
    assert!(!fat.status.success());
    assert!(
        stderr(&fat).contains("memory limit of 4 MiB"),
        "{}",
        stderr(&fat)
    );
    assert!(
        hostile("fat", &rows, &["--memory-mb", "32"])
            .status
            .success()
    );

    let spin = hostile("loop", &rows, &["--call-timeout", "30ms"]);
    let text = String::from_utf8_lossy(&spin.stdout);
    assert!(text.contains("call_timeout of 30ms"), "{text}");
    assert!(text.contains(r#""kind":"trap""#), "{text}");
}

#[test]
fn a_guest_panic_message_reaches_the_trap_reason() {
    let dir = tempfile::tempdir().unwrap();
    let rows = order_rows(&dir, 1);
    let out = plugin_test(&test_plugin("test_trap"), &["--input", &rows]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(r#""kind":"trap""#), "{text}");
    assert!(
        text.contains("guest stderr:") && text.contains("test-trap plugin refuses row 1"),
        "{text}"
    );
    // In the log too.
    assert!(
        stderr(&out).contains("test-trap plugin refuses row 1"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_leaking_plugin_is_replaced_before_its_cap_and_keeps_batching() {
    let dir = tempfile::tempdir().unwrap();
    // 256 KiB leaked per row: 250 MiB over 1,000 rows, against a 64 MiB cap.
    let rows = order_rows(&dir, 1_000);
    let recycled = hostile("leak", &rows, &["--memory-mb", "64", "--batch-size", "8"]);
    assert!(recycled.status.success(), "{}", stderr(&recycled));
    let log = stderr(&recycled);
    assert!(
        log.matches("replacing the tenant's plugin instance")
            .count()
            >= 2,
        "{log}"
    );
    assert!(
        !log.contains("transform-batch failed"),
        "no call ran into the cap: {log}"
    );
    let text = String::from_utf8_lossy(&recycled.stdout);
    assert_eq!(text.matches(r#""topic":"t.good""#).count(), 1_000, "{log}");

    // Without replacement the batch calls hit the cap; each time the rows of the failed call
    // run one by one (none lost), then batch calls resume.
    let capped = hostile(
        "leak",
        &rows,
        &[
            "--memory-mb",
            "64",
            "--batch-size",
            "8",
            "--recycle-memory-percent",
            "100",
        ],
    );
    let log = stderr(&capped);
    assert!(log.matches("transform-batch failed").count() >= 2, "{log}");
    assert!(
        !log.contains("replacing the tenant's plugin instance"),
        "{log}"
    );
    let text = String::from_utf8_lossy(&capped.stdout);
    assert!(
        text.contains("memory limit of 64 MiB") || log.contains("memory limit of 64 MiB"),
        "{log}"
    );
}

/// `sluice plugin new order-router --lang LANG` into `dir/LANG`; returns that directory.
fn new_project(dir: &std::path::Path, lang: &str) -> std::path::PathBuf {
    let dest = dir.join(lang);
    let out = sluice(&[
        "plugin",
        "new",
        "order-router",
        "--lang",
        lang,
        "--dir",
        &dest.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    dest
}

#[test]
fn plugin_new_writes_a_project_per_language_with_its_name_filled_in() {
    let dir = tempfile::tempdir().unwrap();
    for (lang, source) in [
        ("rust", "src/lib.rs"),
        ("python", "app.py"),
        ("js", "plugin.js"),
    ] {
        let dest = new_project(dir.path(), lang);
        for file in [
            "README.md",
            "build.sh",
            "rows.jsonl",
            "expected.jsonl",
            "wit/sluice.wit",
            source,
        ] {
            let text = std::fs::read_to_string(dest.join(file))
                .unwrap_or_else(|e| panic!("{lang}: {file}: {e}"));
            assert!(
                !text.contains("{{name"),
                "{lang}: {file} keeps a placeholder"
            );
        }
        let source_text = std::fs::read_to_string(dest.join(source)).unwrap();
        assert!(
            source_text.contains("order-router"),
            "{lang}: {source_text}"
        );
        let readme = std::fs::read_to_string(dest.join("README.md")).unwrap();
        assert!(
            readme.contains(
                "sluice plugin test order-router.wasm --input rows.jsonl --expect expected.jsonl"
            ),
            "{lang}: {readme}"
        );
        let again = sluice(&[
            "plugin",
            "new",
            "order-router",
            "--lang",
            lang,
            "--dir",
            &dest.display().to_string(),
        ]);
        assert!(
            !again.status.success(),
            "an existing directory is not overwritten"
        );
    }
    assert!(
        dir.path()
            .join("rust/vendor/sluice-plugin-sdk/src/lib.rs")
            .exists()
    );
    assert!(dir.path().join("python/sluice_plugin/__init__.py").exists());
    assert!(dir.path().join("js/sluice-plugin.js").exists());
    let bad = sluice(&["plugin", "new", "Order_Router", "--lang", "rust"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("lowercase letters"),
        "{}",
        stderr(&bad)
    );
}

/// The golden file of every `plugin new` project is exactly what the builtin route-by-aggregate
/// publishes for its sample rows (topics under `outbox.event.`, the row's headers plus `id` and
/// `event-type`). The conformance suite builds each template and holds it to that file, so a
/// template cannot drift from the builtin a tenant may be moving away from.
#[test]
fn plugin_new_golden_output_is_what_the_builtin_route_by_aggregate_publishes() {
    let dir = tempfile::tempdir().unwrap();
    for lang in ["rust", "python", "js"] {
        let dest = new_project(dir.path(), lang);
        let expected = dest.join("expected.jsonl");
        let test = sluice(&[
            "plugin",
            "test",
            "--builtin",
            "route-by-aggregate",
            "--input",
            &dest.join("rows.jsonl").display().to_string(),
            "--expect",
            &expected.display().to_string(),
        ]);
        assert!(
            test.status.success(),
            "{lang}: the template's expected.jsonl is not the builtin's output:\n{}{}",
            String::from_utf8_lossy(&test.stdout),
            stderr(&test)
        );
        let golden = std::fs::read_to_string(&expected).unwrap();
        assert!(
            golden.contains(r#"["id","1"]"#) && golden.contains(r#""topic":"outbox.event.order""#),
            "{lang}: {golden}"
        );
    }
}
