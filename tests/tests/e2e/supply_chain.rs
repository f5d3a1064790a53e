//! Plugins you can trust: `sha256` pins, minisign signatures checked against
//! `[plugins] trusted_keys`, and plugins pulled from a real OCI registry (Debian's
//! docker-registry, pushed to with the ORAS project's client). Each attack is refused and
//! named, and the other tenants keep running.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_testkit::*;

/// The media type a signature layer has (docs/plugins.md).
const SIGNATURE_MEDIA_TYPE: &str = "application/vnd.sluice.plugin.signature.minisign";

/// The `sha256 = "…"` value `sluice plugin check` prints for `file`.
fn pin_of(file: &Path) -> String {
    let out = sluice(&["plugin", "check", &file.display().to_string()]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("pin:     sha256 = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or_else(|| panic!("no pin line in {stdout}"))
        .to_owned()
}

/// `[tenants.<name>]` running the plugin at `path` (a file or an `oci://` reference) with the
/// scenario's topic prefix, and `lines` (e.g. a pin).
fn tenant_entry(s: &Scenario, name: &str, path: &str, lines: &str) -> String {
    format!(
        "[tenants.{name}]\npath = \"{path}\"\n{lines}config = {{ topic_prefix = \"{}\" }}\n",
        s.prefix
    )
}

/// Reads `n` messages and checks that the first version (the reference plugin: topics
/// order/customer) made all of them, none the fan-out build it was swapped for (a/b).
fn assert_all_from_the_first_version(s: &Scenario, n: usize) {
    let got = s.consume(n, Duration::from_secs(2));
    assert_eq!(got.len(), n);
    let topics: Vec<&str> = got.iter().map(|m| m.topic.as_str()).collect();
    assert!(
        topics
            .iter()
            .all(|t| !t.ends_with(".a") && !t.ends_with(".b")),
        "{topics:?}"
    );
}

/// Replaces `path` atomically, as a deployment would.
fn replace(path: &Path, with: &Path) {
    let tmp = path.with_extension("new");
    std::fs::copy(with, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `[plugins.default]`'s `path = "<reference plugin>"` line of a scenario config replaced by
/// `lines`.
fn default_plugin(config: &str, lines: &str) -> String {
    let line = format!("path = \"{}\"", reference_plugin().display());
    assert!(config.contains(&line), "{config}");
    config.replacen(&line, lines, 1)
}

/// A copy of `plugin` in `dir` named `name`.
fn copy_in(dir: &Path, name: &str, plugin: &Path) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(plugin, &path).unwrap();
    path
}

/// The problems `sluice config check` prints for `config`, and whether it failed.
fn config_check(config: &str) -> (bool, String) {
    let out = sluice_with_config(&["config", "check"], config);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pinned_file_swapped_after_plugin_check_is_refused_and_the_old_version_keeps_running() {
    let s = Scenario::new("pin_swap", &["order", "customer", "a", "b"]).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = copy_in(dir.path(), "router.wasm", &reference_plugin());
    let pin = pin_of(&plugin);
    let config = default_plugin(
        &s.config("", ""),
        &format!("path = \"{}\"\nsha256 = \"{pin}\"", plugin.display()),
    );
    let relay = RelayProcess::start(&config).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    s.table.insert_rows(10, None).await;
    assert!(wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await);

    // The file is swapped for another build after it was checked and pinned.
    replace(&plugin, &test_plugin("test_fanout"));
    let fanout = pin_of(&test_plugin("test_fanout"));
    let refused = wait_until(SCENARIO_WAIT, || async {
        relay.log().contains("sha256 pin is")
    })
    .await;
    assert!(refused, "{}", relay.log());
    s.table.insert_rows(10, None).await;
    assert!(
        wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await,
        "{}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    // The reason names the tenant, the pinned and the found digest.
    let line = exit
        .log
        .lines()
        .find(|l| l.contains("sha256 pin is"))
        .unwrap()
        .to_owned();
    assert!(
        line.contains(&format!("sha256 pin is sha256:{pin}")),
        "{line}"
    );
    assert!(
        line.contains(&format!("plugin's bytes are sha256:{fanout}")),
        "{line}"
    );
    assert!(line.contains("tenant"), "{line}");

    // Every row went through the pinned version (order/customer), none through the swap (a/b).
    assert_all_from_the_first_version(&s, 20);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pin_that_does_not_match_at_start_quarantines_its_tenant_or_stops_a_strict_start() {
    let s = Scenario::new("pin_start", &["order", "customer"]).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = copy_in(dir.path(), "acme.wasm", &reference_plugin());
    let found = pin_of(&plugin);
    let wrong = pin_of(&test_plugin("test_fanout"));
    // acme pins another digest; beta runs the same file unpinned (a file is loaded once, a
    // pin is checked per tenant).
    let path = plugin.display().to_string();
    let acme = tenant_entry(&s, "acme", &path, &format!("sha256 = \"{wrong}\"\n"))
        + &tenant_entry(&s, "beta", &path, "");
    let config = s.config("", &acme);

    let (ok, text) = config_check(&config);
    assert!(!ok, "{text}");
    assert!(text.contains("tenants.acme"), "{text}");
    assert!(
        text.contains(&format!("sha256 pin is sha256:{wrong}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("bytes are sha256:{found}")),
        "{text}"
    );

    // Without strict_startup the other tenants run; acme's rows wait.
    s.table.insert_rows(5, Some("acme")).await;
    s.table.insert_rows(5, Some("beta")).await;
    s.table.insert_rows(5, None).await;
    let exit = s
        .relay_until(&config, || async { s.table.count().await == 5 })
        .await;
    assert!(exit.log.contains("tenant quarantined"), "{}", exit.log);
    assert_eq!(s.consume(10, Duration::from_secs(1)).len(), 10);

    let strict = config.replace(
        "[tenants.acme]",
        "[plugins]\nstrict_startup = true\n\n[tenants.acme]",
    );
    let mut relay = RelayProcess::start(&strict).unwrap();
    let status = relay.wait_exit(SCENARIO_WAIT).await.unwrap();
    assert!(!status.success());
    let log = relay.log();
    assert!(
        log.contains("tenant acme") && log.contains(&wrong) && log.contains(&found),
        "{log}"
    );
    assert_eq!(s.table.count().await, 5, "acme's rows are still there");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_trusted_keys_only_plugins_signed_by_one_of_them_load() {
    let s = Scenario::new("signed", &["order", "customer"]).await;
    let dir = tempfile::tempdir().unwrap();
    let trusted = SigningKey::generate().unwrap();
    let stranger = SigningKey::generate().unwrap();

    let good = copy_in(dir.path(), "good.wasm", &reference_plugin());
    trusted.sign(&good, "release 1.0 of the router").unwrap();
    let foreign = copy_in(dir.path(), "foreign.wasm", &reference_plugin());
    stranger.sign(&foreign, "someone else's build").unwrap();
    // Signed, then changed: the signature is of other bytes.
    let tampered = copy_in(dir.path(), "tampered.wasm", &reference_plugin());
    trusted
        .sign(&tampered, "release 1.0 of the router")
        .unwrap();
    replace(&tampered, &test_plugin("test_fanout"));
    let unsigned = copy_in(dir.path(), "unsigned.wasm", &reference_plugin());

    let tenant = |name: &str, path: &Path| tenant_entry(&s, name, &path.display().to_string(), "");
    let port = free_port();
    let extra = format!(
        "{}{}{}[telemetry]\nlisten = \"127.0.0.1:{port}\"\n",
        tenant("foreign", &foreign),
        tenant("tampered", &tampered),
        tenant("unsigned", &unsigned),
    );
    let config = RelayConfig {
        plugins_extra: Some(format!(
            "trusted_keys = [\"{}\", \"{}\"]",
            SigningKey::generate().unwrap().public(),
            trusted.public()
        )),
        ..RelayConfig::for_tests(&s.table.name, &kafka_bootstrap(), &s.prefix)
    }
    .render();
    let config = default_plugin(&config, &format!("path = \"{}\"", good.display())) + "\n" + &extra;

    let (ok, text) = config_check(&config);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "signed by key {}, which is not in [plugins] trusted_keys",
            stranger.id()
        )),
        "{text}"
    );
    assert!(text.contains("does not match these bytes"), "{text}");
    assert!(
        text.contains("not signed, and [plugins] trusted_keys requires"),
        "{text}"
    );
    for name in ["foreign", "tampered", "unsigned"] {
        assert!(text.contains(&format!("tenants.{name}")), "{name}: {text}");
    }

    // `plugin check` names the signer of the exact file.
    let out = sluice(&[
        "plugin",
        "check",
        &good.display().to_string(),
        "--trusted-key",
        &trusted.public(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "signer:  minisign:{} (release 1.0 of the router)",
            trusted.id()
        )),
        "{stdout}"
    );
    let out = sluice(&[
        "plugin",
        "check",
        &tampered.display().to_string(),
        "--trusted-key",
        &trusted.public(),
    ]);
    assert!(!out.status.success());

    // The relay runs the signed default plugin; the refused tenants' rows wait.
    for tenant in ["foreign", "tampered", "unsigned"] {
        s.table.insert_rows(3, Some(tenant)).await;
    }
    s.table.insert_rows(4, None).await;
    let relay = RelayProcess::start(&config).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    assert!(wait_until(SCENARIO_WAIT, || async { s.table.count().await == 9 }).await);
    let text = sluice_testkit::scrape::metrics(&format!("127.0.0.1:{port}"))
        .await
        .unwrap();
    let info = text
        .lines()
        .find(|l| l.starts_with("sluice_plugin_info{") && l.contains("tenant=\"_default\""))
        .unwrap_or_else(|| panic!("{text}"))
        .to_owned();
    assert!(
        info.contains(&format!("signer=\"minisign:{}\"", trusted.id())),
        "{info}"
    );
    assert!(
        info.contains(&format!("source=\"{}\"", good.display())),
        "{info}"
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert_eq!(s.consume(4, Duration::from_secs(1)).len(), 4);
    s.finish().await;
}

/// `[plugins]` lines for `registry`: plain HTTP, the cache in `cache`.
fn registry_lines(registry: &OciRegistry, cache: &Path, more: &str) -> String {
    format!(
        "cache_dir = \"{}\"\n{more}\n[plugins.registries.\"{}\"]\nplain_http = true\n",
        cache.display(),
        registry.host()
    )
}

/// A scenario config whose default plugin is `path` (an `oci://` reference) with `lines`
/// after it, and `plugins` in `[plugins]`.
fn oci_config(s: &Scenario, plugins: &str, path: &str, lines: &str, extra: &str) -> String {
    let config = RelayConfig {
        plugins_extra: Some(plugins.to_owned()),
        extra: Some(extra.to_owned()),
        ..RelayConfig::for_tests(&s.table.name, &kafka_bootstrap(), &s.prefix)
    }
    .render();
    default_plugin(&config, &format!("path = \"{path}\"\n{lines}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_pulled_by_tag_runs_from_the_cache_when_the_registry_is_down_and_a_moved_tag_is_refused()
 {
    let s = Scenario::new("oci_pull", &["order", "customer", "a", "b"]).await;
    let mut registry = OciRegistry::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = SigningKey::generate().unwrap();
    let router = copy_in(dir.path(), "router.wasm", &reference_plugin());
    let signature = key.sign(&router, "router 1").unwrap();
    let manifest = registry
        .push(
            "acme/router:1",
            &[
                (&router, "application/wasm"),
                (&signature, SIGNATURE_MEDIA_TYPE),
            ],
        )
        .unwrap();
    let pin = pin_of(&router);
    let reference = format!("oci://{}/acme/router:1", registry.host());
    let cache = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = oci_config(
        &s,
        &registry_lines(
            &registry,
            cache.path(),
            &format!("trusted_keys = [\"{}\"]", key.public()),
        ),
        &reference,
        &format!("sha256 = \"{pin}\""),
        &format!("[telemetry]\nlisten = \"127.0.0.1:{port}\"\n"),
    );

    // `plugin check` pulls it as the relay does.
    let out = sluice_with_config(&["plugin", "check", &reference], &config);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("source:  {reference}@{manifest}")),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("sha256 = \"{pin}\"")), "{stdout}");

    let relay = RelayProcess::start(&config).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    assert!(
        relay.log().contains(&manifest),
        "the resolved digest is logged: {}",
        relay.log()
    );
    s.table.insert_rows(10, None).await;
    assert!(wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await);
    let text = sluice_testkit::scrape::metrics(&format!("127.0.0.1:{port}"))
        .await
        .unwrap();
    assert!(
        text.contains(&format!("source=\"{reference}@{manifest}\"")),
        "{text}"
    );
    assert!(
        text.contains(&format!("signer=\"minisign:{}\"", key.id())),
        "{text}"
    );

    // The tag moves to another build, signed by the same trusted key: the pin refuses it on
    // SIGHUP (tags are re-resolved only then), and the pinned version keeps running.
    let fanout = copy_in(dir.path(), "router-2.wasm", &test_plugin("test_fanout"));
    let fanout_signature = key.sign(&fanout, "router 2").unwrap();
    let moved = registry
        .push(
            "acme/router:1",
            &[
                (&fanout, "application/wasm"),
                (&fanout_signature, SIGNATURE_MEDIA_TYPE),
            ],
        )
        .unwrap();
    assert_ne!(moved, manifest);
    relay.hangup();
    let refused = wait_until(SCENARIO_WAIT, || async {
        relay.log().contains("sha256 pin is") && relay.log().contains(&moved)
    })
    .await;
    assert!(refused, "{}", relay.log());
    s.table.insert_rows(10, None).await;
    assert!(wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await);
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);

    // The registry goes away: a new start takes the cached copy the tag last resolved to —
    // the moved tag was pulled and cached too, so the pin still decides (it refuses it) and
    // the relay must not start the tenant on it.
    registry.stop();
    s.table.insert_rows(10, None).await;
    let relay = RelayProcess::start(&config).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    let cached = wait_until(SCENARIO_WAIT, || async {
        relay.log().contains("using the cached copy")
    })
    .await;
    assert!(cached, "{}", relay.log());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        s.table.count().await,
        10,
        "no row went through the moved tag"
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(exit.log.contains("tenant quarantined"), "{}", exit.log);

    // Pinned to the manifest digest instead of the tag, it starts from the cache.
    let by_digest = format!("oci://{}/acme/router@{manifest}", registry.host());
    let digest_config = config.replace(&reference, &by_digest);
    registry.restart().unwrap();
    let warm = sluice_with_config(&["plugin", "check", &by_digest], &digest_config);
    assert!(
        warm.status.success(),
        "{}",
        String::from_utf8_lossy(&warm.stderr)
    );
    registry.stop();
    let exit = s
        .relay_until(&digest_config, || async { s.table.count().await == 0 })
        .await;
    assert!(exit.log.contains("using the cached copy"), "{}", exit.log);

    assert_all_from_the_first_version(&s, 30);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_that_serves_wrong_or_cut_blobs_is_refused_and_other_tenants_run() {
    let s = Scenario::new("oci_attacks", &["order", "customer"]).await;
    let registry = OciRegistry::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let router = copy_in(dir.path(), "router.wasm", &reference_plugin());
    let blob = format!("sha256:{}", pin_of(&router));
    registry
        .push("acme/flipped:1", &[(&router, "application/wasm")])
        .unwrap();
    let other = copy_in(dir.path(), "other.wasm", &test_plugin("test_fanout"));
    let other_blob = format!("sha256:{}", pin_of(&other));
    registry
        .push("acme/cut:1", &[(&other, "application/wasm")])
        .unwrap();
    let not_wasm = dir.path().join("readme.txt");
    std::fs::write(&not_wasm, "not a component").unwrap();
    registry
        .push("acme/text:1", &[(&not_wasm, "text/plain")])
        .unwrap();

    // The registry now serves one flipped byte under the first digest, and half of the second.
    let file = registry.blob_file(&blob);
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let file = registry.blob_file(&other_blob);
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();

    let host = registry.host();
    let tenant = |name: &str, path: String| tenant_entry(&s, name, &path, "");
    let cache = tempfile::tempdir().unwrap();
    let extra = [
        tenant("flipped", format!("oci://{host}/acme/flipped:1")),
        tenant("cut", format!("oci://{host}/acme/cut:1")),
        tenant("text", format!("oci://{host}/acme/text:1")),
        tenant("missing", format!("oci://{host}/acme/missing:1")),
    ]
    .concat();
    let config = RelayConfig {
        plugins_extra: Some(registry_lines(&registry, cache.path(), "")),
        extra: Some(extra),
        ..RelayConfig::for_tests(&s.table.name, &kafka_bootstrap(), &s.prefix)
    }
    .render();

    let (ok, text) = config_check(&config);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("blob {blob} does not match its digest")),
        "{text}"
    );
    assert!(
        text.contains(&format!("blob {other_blob} is truncated")),
        "{text}"
    );
    assert!(
        text.contains("has no application/wasm layer (its layers: text/plain)"),
        "{text}"
    );
    assert!(text.contains("tenants.missing"), "{text}");

    for name in ["flipped", "cut", "text", "missing"] {
        s.table.insert_rows(2, Some(name)).await;
    }
    s.table.insert_rows(5, None).await;
    let exit = s
        .relay_until(&config, || async { s.table.count().await == 8 })
        .await;
    assert_eq!(
        exit.log.matches("tenant quarantined").count(),
        4,
        "{}",
        exit.log
    );
    assert_eq!(s.consume(5, Duration::from_secs(1)).len(), 5);
    // Nothing of the refused blobs was cached.
    let cached: Vec<_> = walk(cache.path());
    assert!(
        cached
            .iter()
            .all(|p| !p.to_string_lossy().contains(&blob.replace(':', "-"))),
        "{cached:?}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_credentials_come_from_a_file() {
    let s = Scenario::new("oci_auth", &["order", "customer"]).await;
    let registry = OciRegistry::start_with_basic_auth("ci", "s3cret-pull").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let router = copy_in(dir.path(), "router.wasm", &reference_plugin());
    registry
        .push("acme/router:1", &[(&router, "application/wasm")])
        .unwrap();
    let password = dir.path().join("registry-password");
    std::fs::write(&password, "wrong\n").unwrap();
    let cache = tempfile::tempdir().unwrap();
    let plugins = format!(
        "{}username = \"ci\"\npassword = \"${{file:{}}}\"\n",
        registry_lines(&registry, cache.path(), ""),
        password.display()
    );
    let reference = format!("oci://{}/acme/router:1", registry.host());
    let config = oci_config(&s, &plugins, &reference, "", "");

    let (ok, text) = config_check(&config);
    assert!(!ok, "{text}");
    assert!(
        text.contains("Not authorized") || text.contains("401"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");

    std::fs::write(&password, "s3cret-pull\n").unwrap();
    s.table.insert_rows(5, None).await;
    let exit = s
        .relay_until(&config, || async { s.table.count().await == 0 })
        .await;
    assert!(!exit.log.contains("s3cret"), "{}", exit.log);
    assert_eq!(s.consume(5, Duration::from_secs(1)).len(), 5);
    s.finish().await;
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_build_deployed_before_its_signature_is_refused_until_the_signature_arrives() {
    let s = Scenario::new("signed_reload", &["order", "customer", "a", "b"]).await;
    let dir = tempfile::tempdir().unwrap();
    let key = SigningKey::generate().unwrap();
    let plugin = copy_in(dir.path(), "router.wasm", &reference_plugin());
    key.sign(&plugin, "router 1").unwrap();
    let config = RelayConfig {
        plugins_extra: Some(format!("trusted_keys = [\"{}\"]", key.public())),
        ..RelayConfig::for_tests(&s.table.name, &kafka_bootstrap(), &s.prefix)
    }
    .render();
    let config = default_plugin(&config, &format!("path = \"{}\"", plugin.display()));
    let relay = RelayProcess::start(&config).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());

    // The new build lands first: its old signature does not cover it.
    let next = copy_in(dir.path(), "next.wasm", &test_plugin("test_fanout"));
    let next_signature = key.sign(&next, "router 2").unwrap();
    replace(&plugin, &next);
    let refused = wait_until(SCENARIO_WAIT, || async {
        relay.log().contains("does not match these bytes")
    })
    .await;
    assert!(refused, "{}", relay.log());
    s.table.insert_rows(5, None).await;
    assert!(wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await);
    assert_all_from_the_first_version(&s, 5);

    // Then its signature: the watcher notices it and loads the build.
    let mut signature = plugin.as_os_str().to_owned();
    signature.push(".minisig");
    replace(Path::new(&signature), &next_signature);
    let reloaded = wait_until(SCENARIO_WAIT, || async {
        relay.log().contains("plugin reloaded")
    })
    .await;
    assert!(reloaded, "{}", relay.log());
    s.table.insert_rows(5, None).await;
    assert!(wait_until(SCENARIO_WAIT, || async { s.table.count().await == 0 }).await);
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    let fanned = s.consume(15, Duration::from_secs(2));
    let to_a = fanned.iter().filter(|m| m.topic.ends_with(".a")).count();
    assert_eq!(to_a, 5, "the new build fans each row out to a and b");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sluice_plugin_push_writes_what_oras_reads_and_the_relay_pulls() {
    let registry = OciRegistry::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = SigningKey::generate().unwrap();
    let router = copy_in(dir.path(), "router.wasm", &reference_plugin());
    let signature = key.sign(&router, "router 1").unwrap();
    let s = Scenario::new("oci_push", &["order", "customer"]).await;
    let cache = tempfile::tempdir().unwrap();
    let reference = format!("oci://{}/acme/pushed:1", registry.host());
    let config = oci_config(
        &s,
        &registry_lines(
            &registry,
            cache.path(),
            &format!("trusted_keys = [\"{}\"]", key.public()),
        ),
        &reference,
        "",
        "",
    );

    let out = sluice_with_config(
        &["plugin", "push", &router.display().to_string(), &reference],
        &config,
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("sha256 = \"{}\"", pin_of(&router))),
        "{stdout}"
    );

    // oras reads the component and its signature back byte for byte.
    let layers = registry
        .pull("acme/pushed:1", &dir.path().join("pulled"))
        .unwrap();
    assert_eq!(layers.len(), 2, "{layers:?}");
    assert_eq!(layers[0].0, "application/wasm");
    assert_eq!(layers[0].1, std::fs::read(&router).unwrap());
    assert_eq!(layers[1].0, SIGNATURE_MEDIA_TYPE);
    assert_eq!(layers[1].1, std::fs::read(&signature).unwrap());

    // And the relay pulls it, signature checked.
    s.table.insert_rows(3, None).await;
    let exit = s
        .relay_until(&config, || async { s.table.count().await == 0 })
        .await;
    assert!(exit.log.contains("pulled plugin"), "{}", exit.log);
    assert_eq!(s.consume(3, Duration::from_secs(1)).len(), 3);
    s.finish().await;
}

/// An `https://` registry whose certificate a CA of the test's own signed: trusted only through
/// `[plugins.registries."…"] ca_location`.
#[tokio::test(flavor = "multi_thread")]
async fn an_https_registry_is_trusted_through_ca_location() {
    use sluice_testkit::secure_broker::{TestCa, TlsProxy};
    let registry = OciRegistry::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let router = copy_in(dir.path(), "router.wasm", &reference_plugin());
    registry
        .push("acme/router:1", &[(&router, "application/wasm")])
        .unwrap();
    let ca = TestCa::new(dir.path(), "registry-ca").expect("a CA");
    let (cert, key) = ca.issue_server().expect("a server certificate");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = TlsProxy::start(listener, &cert, &key, registry.host()).expect("TLS in front");
    let host = format!("localhost:{}", proxy.port());
    let s = Scenario::new("oci_tls", &["order", "customer"]).await;
    let cache = tempfile::tempdir().unwrap();
    let config_with = |ca_line: &str| {
        oci_config(
            &s,
            &format!(
                "cache_dir = \"{}\"\n\n[plugins.registries.\"{host}\"]\n{ca_line}",
                cache.path().display()
            ),
            &format!("oci://{host}/acme/router:1"),
            "",
            "",
        )
    };

    let (ok, text) = config_check(&config_with(""));
    assert!(!ok, "an untrusted certificate was accepted: {text}");
    assert!(text.contains("cannot read the manifest"), "{text}");
    // Why, not only that the request failed.
    assert!(text.contains("certificate verify failed"), "{text}");

    let trusted = config_with(&format!("ca_location = \"{}\"\n", ca.pem.display()));
    let (ok, text) = config_check(&trusted);
    assert!(ok, "{text}");
    s.table.insert_rows(3, None).await;
    s.relay_until(&trusted, || async { s.table.count().await == 0 })
        .await;
    assert_eq!(s.consume(3, Duration::from_secs(1)).len(), 3);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_signed_by_another_tenants_key_is_refused_for_this_tenant_at_start_and_on_reload()
{
    let s = Scenario::new("tenant_keys", &["order", "customer", "a", "b"]).await;
    let dir = tempfile::tempdir().unwrap();
    let acme_key = SigningKey::generate().unwrap();
    let beta_key = SigningKey::generate().unwrap();
    let acme_file = copy_in(dir.path(), "acme.wasm", &reference_plugin());
    acme_key.sign(&acme_file, "acme router 1").unwrap();
    let beta_file = copy_in(dir.path(), "beta.wasm", &reference_plugin());
    beta_key.sign(&beta_file, "beta router 1").unwrap();
    // Each tenant trusts its own key only; gamma runs acme's file (shared by path) but trusts
    // beta's key.
    let keys = |key: &SigningKey| format!("trusted_keys = [\"{}\"]\n", key.public());
    let tenants = tenant_entry(
        &s,
        "acme",
        &acme_file.display().to_string(),
        &keys(&acme_key),
    ) + &tenant_entry(
        &s,
        "beta",
        &beta_file.display().to_string(),
        &keys(&beta_key),
    ) + &tenant_entry(
        &s,
        "gamma",
        &acme_file.display().to_string(),
        &keys(&beta_key),
    );
    let config = s.config("", &tenants);
    let refusal = |tenant: &str| {
        format!(
            "(tenant {tenant}): refused: signed by key {} (a key of tenants.acme.trusted_keys), \
             which is not in tenants.{tenant}.trusted_keys ({})",
            acme_key.id(),
            beta_key.id()
        )
    };

    let (ok, text) = config_check(&config);
    assert!(!ok, "{text}");
    assert!(text.contains("tenants.gamma"), "{text}");
    assert!(text.contains(&refusal("gamma")), "{text}");
    assert!(
        !text.contains("(tenant acme): refused") && !text.contains("(tenant beta): refused"),
        "{text}"
    );

    // At start: gamma is quarantined, acme and beta run.
    for tenant in ["acme", "beta", "gamma"] {
        s.table.insert_rows(5, Some(tenant)).await;
    }
    let relay = RelayProcess::start(&config).unwrap();
    assert!(relay.wait_started(SCENARIO_WAIT).await, "{}", relay.log());
    assert!(
        wait_until(SCENARIO_WAIT, || async { s.table.count().await == 5 }).await,
        "{}",
        relay.log()
    );
    assert!(
        relay.log().contains("tenant quarantined"),
        "{}",
        relay.log()
    );
    assert!(relay.log().contains(&refusal("gamma")), "{}", relay.log());

    // On reload: beta's file is replaced by another build signed with acme's key. beta keeps
    // its running version.
    let staged = copy_in(dir.path(), "staged.wasm", &test_plugin("test_fanout"));
    let staged_signature = acme_key.sign(&staged, "not beta's").unwrap();
    let mut beta_signature = beta_file.as_os_str().to_owned();
    beta_signature.push(".minisig");
    std::fs::rename(&staged_signature, &beta_signature).unwrap();
    std::fs::rename(&staged, &beta_file).unwrap();
    relay.hangup();
    let refused = wait_until(SCENARIO_WAIT, || async {
        relay.log().contains(&refusal("beta"))
            && relay
                .log()
                .contains("new plugin version refused for this tenant; it keeps the old version")
    })
    .await;
    assert!(refused, "{}", relay.log());
    s.table.insert_rows(5, Some("beta")).await;
    assert!(
        wait_until(SCENARIO_WAIT, || async { s.table.count().await == 5 }).await,
        "{}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    // acme's 5 and beta's 10 rows went through the first version (order/customer), none
    // through the refused build (a/b); gamma's 5 rows wait.
    assert_all_from_the_first_version(&s, 15);
    s.finish().await;
}
