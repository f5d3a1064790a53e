//! Secrets by reference, end to end: `${env:…}` and `${file:…}` values reach the database,
//! the broker and the plugins, and a known secret never shows in any output — log lines (text
//! and JSON, Sluice's own, librdkafka's and a careless plugin's), `/status`, `/metrics`,
//! `sluice status` (text and `--json`), `sluice dead list`, `sluice config check`, and the
//! error a refused start exits with. Unresolvable references are named, never their values.

use std::path::Path;
use std::time::Duration;

use sluice_testkit::free_port;
use sluice_testkit::*;

/// Writes `value` to `dir/name` (with a trailing newline, as editors and `kubectl create
/// secret` leave it) and returns the path.
fn secret_file(dir: &Path, name: &str, value: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("{value}\n")).expect("write secret file");
    path.display().to_string()
}

fn assert_no_secret(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(
            !text.contains(secret),
            "{what} shows the secret {secret:?}:\n{text}"
        );
    }
}

fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_relay_never_shows_a_secret_it_was_given() {
    let s = Scenario::new("secrets", &["order", "customer"]).await;
    s.table.insert_rows(4, None).await;
    s.table.insert_rows(3, Some("careless")).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let tag = unique("c");
    let db_password = format!("Db-Canary-{tag}");
    // A multi-line key longer than any log line keeps (a PEM key, a service account's JSON):
    // its head is what would show if it were folded or cut before being scrubbed.
    let api_key_head = format!("Api-Canary-{tag}");
    let api_key = format!("{api_key_head}\n{}\n-----END-----", "k".repeat(1_500));
    let kafka_password = format!("Kafka-Canary-{tag}");
    let bogus_broker = format!("broker-canary-{tag}.invalid").replace('_', "-");
    let env_name = format!("SLUICE_TEST_DB_PASSWORD_{}", std::process::id());
    // Given to each `sluice` process, never set in this one: other tests share the process.
    let env = [(env_name.as_str(), db_password.as_str())];
    let table_file = secret_file(dir.path(), "table", &s.table.name);
    let api_key_file = secret_file(dir.path(), "api-key", &api_key);
    let broker_file = secret_file(dir.path(), "broker", &bogus_broker);
    let port = free_port();
    // PostgreSQL here trusts 127.0.0.1, so any password connects: what matters is where the
    // password goes. The table name and the first broker come from files, which makes them
    // secrets too, and both are logged by name: the scrubbing must catch them.
    let config = format!(
        r#"
[database]
url = "postgres://postgres:${{env:{env_name}}}@127.0.0.1:5432/test"
table = "${{file:{table_file}}}"

[relay]
poll_interval = "100ms"

[kafka]
"bootstrap.servers" = "${{file:{broker_file}}}:9092,{bootstrap}"
"sasl.password" = "{kafka_password}"

[plugins.default]
builtin = "route-by-aggregate"
config = {{ topic_prefix = "{prefix}" }}

[tenants.careless]
path = "{hostile}"
config = {{ mode = "echo-secret", topic_prefix = "{prefix}", api_key = "${{file:{api_key_file}}}" }}

[telemetry]
listen = "127.0.0.1:{port}"
sample_interval = "1s"
"#,
        bootstrap = kafka_bootstrap(),
        prefix = s.prefix,
        hostile = test_plugin("test_hostile").display(),
    );
    let secrets = [
        db_password.as_str(),
        api_key_head.as_str(),
        kafka_password.as_str(),
        bogus_broker.as_str(),
        s.table.name.as_str(),
    ];
    let config_path = dir.path().join("sluice.toml");
    std::fs::write(&config_path, &config).expect("write config");
    let config_arg = config_path.display().to_string();

    let relay = RelayProcess::launch(
        &config,
        &RelayLaunch {
            env: &env,
            ..RelayLaunch::default()
        },
    )
    .expect("start relay");
    let settled = wait_until(SCENARIO_WAIT, || async {
        s.table.unsent().await == 3
            && s.table
                .scalar_i64("SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL")
                .await
                == 3
    })
    .await;
    assert!(settled, "rows did not settle: {}", relay.log());
    let delivered = s.consume(4, Duration::from_millis(500));
    assert_eq!(
        delivered.len(),
        4,
        "the default tenant's rows were delivered"
    );
    let stored: Vec<Option<String>> = s
        .table
        .unsent_rows()
        .await
        .into_iter()
        .map(|(_, _, e)| e)
        .collect();
    // The plugin quotes the key it was given in its errors: what the table keeps of them is
    // scrubbed too (and shows the key did reach the plugin).
    assert!(
        stored.iter().all(|e| e
            .as_deref()
            .is_some_and(|e| e.contains("upstream refused api key [redacted] for row"))),
        "{stored:?}"
    );

    // /status and /metrics once the sampler saw the dead rows.
    let status_seen = wait_until(SCENARIO_WAIT, || async {
        http_get(port, "/status")
            .is_some_and(|(code, body)| code == 200 && body.contains("careless"))
    })
    .await;
    assert!(status_seen, "no /status with the tenant");
    let (_, status) = http_get(port, "/status").expect("/status");
    assert_no_secret("/status", &status, &secrets);
    let (_, metrics) = http_get(port, "/metrics").expect("/metrics");
    assert_no_secret("/metrics", &metrics, &secrets);

    for args in [
        vec!["status", "--config", &config_arg],
        vec!["status", "--json", "--config", &config_arg],
        vec!["dead", "list", "--config", &config_arg],
        vec!["config", "check", "--connect", "--config", &config_arg],
    ] {
        let out = sluice_with_env(&args, &env);
        let text = output_text(&out);
        assert!(out.status.success(), "sluice {args:?} failed: {text}");
        assert_no_secret(&format!("sluice {}", args.join(" ")), &text, &secrets);
    }
    let dead = output_text(&sluice_with_env(
        &["dead", "list", "--config", &config_arg],
        &env,
    ));
    assert!(
        dead.contains("upstream refused api key [redacted] for row"),
        "dead list shows the error with the key scrubbed: {dead}"
    );

    let exit = relay.stop();
    assert!(exit.success, "relay did not exit 0: {}", exit.log);
    assert_no_secret("the relay's log", &exit.log, &secrets);
    assert!(
        exit.log.contains("configured with api_key=[redacted]"),
        "the plugin's own log line is scrubbed, not dropped: {}",
        exit.log
    );

    // The same in JSON log lines, at every level, through a drain that replays the dead rows.
    let out = sluice_with_env(&["dead", "replay", "--all", "--config", &config_arg], &env);
    assert!(out.status.success(), "{}", output_text(&out));
    let out = sluice_with_env(
        &["drain", "--log-format", "json", "--config", &config_arg],
        // Every level of Sluice's and librdkafka's own lines; the compiler's trace is noise.
        &[
            (
                "RUST_LOG",
                "debug,sluice=trace,librdkafka=trace,rdkafka=trace",
            ),
            env[0],
        ],
    );
    let text = output_text(&out);
    assert!(
        text.contains("[redacted]") && text.lines().any(|l| l.starts_with('{')),
        "JSON lines with scrubbed values: {text}"
    );
    assert_no_secret("drain's JSON log at trace level", &text, &secrets);
    s.finish().await;
}

#[test]
fn config_check_names_unresolvable_references_and_never_prints_a_value() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let canary = format!("Check-Canary;{}", unique("x"));
    // A secret that is not a valid table name: the table check's message quotes the name.
    let table_file = secret_file(dir.path(), "table", &canary);
    let missing_var = format!("SLUICE_TEST_UNSET_{}", std::process::id());
    let config = format!(
        r#"
[database]
url = "postgres://127.0.0.1:5432/test"
table = "${{file:{table_file}}}"

[kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"sasl.username" = "${{env:{missing_var}}}"
"ssl.key.password" = "${{file:no-such-secret}}"
"client.id" = "${{vault:kv/sluice}}"
"sasl.oauthbearer.config" = "literal $${{not a reference}} here"

[plugins.default]
builtin = "route-by-aggregate"
"#
    );
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, &config).expect("write config");
    let arg = path.display().to_string();
    let out = sluice(&["config", "check", "--config", &arg]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for expected in [
        format!("kafka.\"sasl.username\": environment variable {missing_var} is not set"),
        format!(
            "kafka.\"ssl.key.password\": cannot read file {}",
            dir.path().join("no-such-secret").display()
        ),
        "kafka.\"client.id\": unknown reference kind `vault`".to_owned(),
        "database.table: invalid table name \"[redacted]\"".to_owned(),
    ] {
        assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
    }
    assert_no_secret("config check", &text, &[&canary]);

    // `run` refuses to start with the same problems, and names them the same way.
    let out = sluice(&["run", "--config", &arg]);
    let text = output_text(&out);
    assert!(!out.status.success(), "run started: {text}");
    assert!(
        text.contains(&missing_var) && text.contains("database.table"),
        "{text}"
    );
    assert_no_secret("the refused start", &text, &[&canary]);
}

#[test]
fn a_database_password_is_hidden_however_the_url_is_written() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let tag = unique("p");
    // Not percent-encoded, as people write them: the URL no longer parses, and its error
    // would show it.
    let in_userinfo = format!("Hash#Canary?{tag}");
    let in_query = format!("Query-Canary-{tag}");
    let env_name = format!("SLUICE_TEST_PW_{}", std::process::id());
    let config = format!(
        r#"
[database]
url = "postgres://root:${{env:{env_name}}}@127.0.0.1:5432/test"

[kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"#
    );
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, &config).expect("write config");
    let arg = path.display().to_string();
    let out = sluice_with_env(
        &["config", "check", "--connect", "--config", &arg],
        &[(env_name.as_str(), in_userinfo.as_str())],
    );
    let text = output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("database"), "{text}");
    assert_no_secret(
        "config check --connect",
        &text,
        &[&in_userinfo, "Hash#Canary"],
    );

    let url = format!("postgres://root@127.0.0.1:1/test?password={in_query}");
    let out = sluice_with_env(
        &["config", "check", "--connect", "--config", &arg],
        &[("SLUICE_DATABASE_URL", url.as_str())],
    );
    let text = output_text(&out);
    assert!(text.contains("password=***"), "{text}");
    assert_no_secret("config check --connect", &text, &[&in_query]);
}
