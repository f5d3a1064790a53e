//! `sluice config check`: one test per kind of mistake, each listed with its key, every
//! problem of a file at once, exit 1; a good file exits 0. `--connect` adds the table and the
//! broker.

use std::process::Output;

use sluice_testkit::free_port;
use sluice_testkit::*;

fn check(config: &str, connect: bool) -> Output {
    let mut args = vec!["config", "check"];
    if connect {
        args.push("--connect");
    }
    sluice_with_config(&args, config)
}

/// The lines of stdout naming a problem (`<file>: <key>: <message>`).
fn problems(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.ends_with(')') || !l.contains(": OK ("))
        .map(str::to_owned)
        .collect()
}

fn assert_problem(out: &Output, key: &str, says: &str) {
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let problems = problems(out);
    assert!(
        problems
            .iter()
            .any(|p| p.contains(&format!(": {key}: ")) && p.contains(says)),
        "no problem at {key} saying {says:?}: {problems:#?}"
    );
}

fn good(table: &str) -> String {
    relay_config(table, &kafka_bootstrap(), "checked.", "", "")
}

#[test]
fn a_good_file_passes_offline() {
    let out = check(&good("outbox"), false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK (config and plugins)"));
}

#[test]
fn an_unknown_key_is_named() {
    let config = good("outbox").replace("[relay]\n", "[relay]\nbatch_sise = 10\n");
    assert_problem(&check(&config, false), "file", "batch_sise");
}

#[test]
fn every_bad_value_and_broken_rule_is_listed_not_just_the_first() {
    let config = good("outbox")
        .replace(
            "[relay]\n",
            "[relay]\nbatch_size = 0\nprune_interval = \"0s\"\n",
        )
        .replace("[database]\n", "[database]\nlease = \"1m\"\n");
    let out = check(&config, false);
    assert_problem(&out, "relay.batch_size", "");
    assert_problem(&out, "relay.prune_interval", "greater than 0");
    assert_problem(&out, "database.lease", "only SQLite");
    assert!(problems(&out).len() >= 3);
}

#[test]
fn a_missing_plugin_file_is_named_by_its_tenant() {
    let config = good("outbox") + "[tenants.acme]\npath = \"/nonexistent/acme.wasm\"\n";
    assert_problem(&check(&config, false), "tenants.acme", "cannot read file");
}

#[test]
fn the_output_is_the_list_of_problems_and_nothing_else() {
    // A tenant the plugin router quarantines (it would log an ERROR line when it runs); it
    // repeats the default's key, which leaves nothing to warn about.
    let config = good("outbox")
        + "[tenants.acme]\nconfig = { topic_prefix = \"a.\", topic_prefx = \"a.\" }\n";
    let out = check(&config, false);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert!(lines[0].contains(": tenants.acme: "), "{stdout}");
    assert_eq!(stderr, "1 problem\n", "stderr is the count only");

    let out = check(&good("outbox"), false);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "nothing logged");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}

#[test]
fn a_plugin_that_rejects_its_config_is_named() {
    let config = good("outbox") + "[tenants.acme]\nconfig = { topic_prefx = \"a.\" }\n";
    assert_problem(&check(&config, false), "tenants.acme", "topic_prefx");
}

/// `good` with the hostile test plugin as the default (it takes `mode`, which the reference
/// plugin refuses), its allow-list `checked.*`, and tenant `acme` running the reference
/// plugin with `acme_extra` in its entry.
fn own_plugin_tenant(acme_extra: &str) -> String {
    let reference = reference_plugin().display().to_string();
    good("outbox")
        .replace(&reference, &test_plugin("test_hostile").display().to_string())
        .replace(
            "config = { topic_prefix = \"checked.\" }",
            "config = { mode = \"good\", topic_prefix = \"checked.\" }\nallowed_topics = [\"checked.*\"]",
        )
        + &format!("[tenants.acme]\npath = \"{reference}\"\n{acme_extra}")
}

#[test]
fn a_tenant_with_its_own_plugin_gets_no_default_config_and_is_warned_about_it() {
    // Were the default's config passed on, the reference plugin would refuse `mode`.
    let out = check(&own_plugin_tenant(""), false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "warnings alone pass: {stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].contains(": warning: tenants.acme.config: ")
            && lines[0].contains("keys mode, topic_prefix")
            && lines[0].contains("config = {}"),
        "{stdout}"
    );
    assert!(
        lines[1].contains(": warning: tenants.acme.allowed_topics: ")
            && lines[1].contains("checked.*")
            && lines[1].contains("any topic"),
        "{stdout}"
    );
    assert!(lines[2].contains(": OK (config and plugins)"), "{stdout}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "2 warnings\n");

    // Said explicitly, there is nothing to warn about.
    let out = check(
        &own_plugin_tenant("config = {}\nallowed_topics = [\"*\"]\n"),
        false,
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn warnings_come_after_the_problems_and_do_not_change_the_exit_status() {
    // A tenant on the default plugin whose config drops the default's topic_prefix (a
    // warning) and misspells it (a problem: the plugin refuses it).
    let config = good("outbox") + "[tenants.acme]\nconfig = { topic_prefx = \"a.\" }\n";
    let out = check(&config, false);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].contains(": tenants.acme: "), "{stdout}");
    assert!(
        lines[1].contains(": warning: tenants.acme.config: replaces")
            && lines[1].contains("`topic_prefix`"),
        "{stdout}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "1 problem, 1 warning\n"
    );
}

#[test]
fn a_default_plugin_that_is_not_a_component_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus.wasm");
    std::fs::write(&bogus, b"not wasm").unwrap();
    let config = good("outbox").replace(
        &reference_plugin().display().to_string(),
        &bogus.display().to_string(),
    );
    assert_problem(&check(&config, false), "plugins.default", "not a valid");
}

#[test]
fn an_allow_list_pattern_that_does_not_parse_is_named() {
    let config = good("outbox") + "[tenants.acme]\nallowed_topics = [\"acme.**.x\"]\n";
    assert_problem(&check(&config, false), "tenants.acme.allowed_topics", "");
}

#[test]
fn a_telemetry_setting_out_of_range_is_named() {
    let config = good("outbox") + "[telemetry]\nsample_interval = \"10ms\"\n";
    assert_problem(
        &check(&config, false),
        "telemetry.sample_interval",
        "at least 1s",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_checks_the_table_and_the_broker() {
    let table = DbTable::create(Database::Postgres, "checked").await;
    let out = check(&good(&table.name), true);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // No such table, and nothing listening where the broker should be.
    let nobody = format!("127.0.0.1:{}", free_port());
    let config = relay_config("no_such_table_here", &nobody, "checked.", "", "");
    let out = check(&config, true);
    assert_problem(&out, "database", "no_such_table_here");
    assert_problem(&out, "kafka", "not reachable");
    // librdkafka's complaints about the broker are not printed besides the problem.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "2 problems\n");
    table.drop_table().await;
}
