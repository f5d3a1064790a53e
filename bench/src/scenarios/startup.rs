//! `startup`: how long `sluice run` takes to be ready with 50 tenants (`t00`…`t49`), each with
//! its own plugin file — a copy of the WASM reference plugin made distinct by a custom section
//! naming the tenant, so every file is compiled and cached on its own — against an empty outbox: from spawn until the log says "relay
//! started", first with an empty compile cache (`[plugins] cache_dir`, a fresh directory) and
//! then with the cache the first start filled. The second start must log "loaded precompiled
//! plugin from cache", or the scenario fails.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::cli::Settings;
use crate::names;
use crate::outbox;
use crate::relay::{self, Measured, RelayProcess, Stopped};
use crate::report::Figure;
use sluice_testkit::DbTable;
use sluice_testkit::config::{RelayConfig, Tenant};

pub(super) const NAME: &str = "startup";

const TENANTS: usize = 50;
pub(super) const READY_LINE: &str = "relay started";
pub(super) const CACHE_HIT_LINE: &str = "loaded precompiled plugin from cache";
const LOG_POLL: Duration = Duration::from_millis(5);
const READY_TIMEOUT: Duration = Duration::from_secs(300);

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = settings.reference_plugin()?;
    let table = outbox::create(settings, "startup", None).await?;
    let measured = measure(settings, &table, plugin).await;
    table.drop_table().await;
    measured
}

async fn measure(
    settings: &Settings,
    table: &DbTable,
    plugin: PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    let cache = tempfile::tempdir().context("cannot create a temporary compile cache")?;
    let files = tempfile::tempdir().context("cannot create a directory for plugin copies")?;
    let original =
        std::fs::read(&plugin).with_context(|| format!("cannot read {}", plugin.display()))?;
    let mut paths = Vec::with_capacity(TENANTS);
    for i in 0..TENANTS {
        let path = files.path().join(format!("t{i:02}.wasm"));
        std::fs::write(&path, distinct_copy(&original, &format!("t{i:02}")))
            .with_context(|| format!("cannot write {}", path.display()))?;
        paths.push(path);
    }
    let prefix = names::topic_prefix("startup");
    let config = RelayConfig {
        database_url: settings.database_url.clone(),
        table: table.name.clone(),
        kafka: settings.kafka.clone(),
        cache_dir: Some(cache.path().to_path_buf()),
        tenants: (0..TENANTS)
            .map(|i| Tenant {
                name: format!("t{i:02}"),
                path: paths[i].clone(),
                config: vec![("topic_prefix".to_owned(), prefix.clone())],
            })
            .collect(),
        ..RelayConfig::default()
    };
    let (cold, Stopped { log: cold_log, .. }) = time_to_ready(settings, &config).await?;
    let (warm, Stopped { log: warm_log, .. }) = time_to_ready(settings, &config).await?;
    let warm_hits = warm_log.matches(CACHE_HIT_LINE).count();
    if warm_hits < TENANTS {
        bail!(
            "the second start logged {CACHE_HIT_LINE:?} {warm_hits} times, not once per plugin \
             ({TENANTS}): the compile cache in {} was not used",
            cache.path().display()
        );
    }
    Ok(vec![
        Figure::new(NAME, "tenants", TENANTS as f64, "tenants"),
        Figure::new(NAME, "first start (compile, fill cache)", ms(cold), "ms"),
        Figure::new(NAME, "second start (cache hit)", ms(warm), "ms"),
        Figure::new(
            NAME,
            "cache hits logged, first start",
            cold_log.matches(CACHE_HIT_LINE).count() as f64,
            "plugins",
        ),
        Figure::new(
            NAME,
            "cache hits logged, second start",
            warm_hits as f64,
            "plugins",
        ),
    ])
}

/// Starts a relay, waits for [`READY_LINE`] in its log, stops it; returns the wait and what
/// the stop left (the log, and the `/proc` reading taken right after the wait).
pub(super) async fn time_to_ready(
    settings: &Settings,
    config: &RelayConfig,
) -> anyhow::Result<(Duration, Stopped)> {
    let started = Instant::now();
    let mut relay = relay::start(&settings.sluice, config, "info")?;
    let ready = wait_for_line(&mut relay, READY_LINE, started).await?;
    Ok((ready, relay.stop_measured().await?))
}

/// Waits until `relay`'s log holds `line` (once more than it did when called); returns the
/// time since `since`.
pub(super) async fn wait_for_line(
    relay: &mut RelayProcess,
    line: &str,
    since: Instant,
) -> anyhow::Result<Duration> {
    let before = relay.log().matches(line).count();
    loop {
        if relay.log().matches(line).count() > before {
            return Ok(since.elapsed());
        }
        relay.ensure_running()?;
        if since.elapsed() > READY_TIMEOUT {
            bail!(
                "no {line:?} within {READY_TIMEOUT:?}; the log ends:\n{}",
                relay.log_tail()
            );
        }
        tokio::time::sleep(LOG_POLL).await;
    }
}

/// `component` with a custom section `sluice-bench` holding `tag` appended: a valid component
/// with the same code and a different content hash.
fn distinct_copy(component: &[u8], tag: &str) -> Vec<u8> {
    const NAME: &[u8] = b"sluice-bench";
    let mut body = leb128(NAME.len());
    body.extend_from_slice(NAME);
    body.extend_from_slice(tag.as_bytes());
    let mut out = component.to_vec();
    out.push(0); // custom section id
    out.extend(leb128(body.len()));
    out.extend(body);
    out
}

fn leb128(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leb128_encodes_like_the_wasm_spec() {
        assert_eq!(leb128(0), [0]);
        assert_eq!(leb128(127), [127]);
        assert_eq!(leb128(128), [0x80, 1]);
        assert_eq!(leb128(624_485), [0xe5, 0x8e, 0x26]);
    }

    #[test]
    fn copies_differ_by_tag_only_at_the_end() {
        let a = distinct_copy(b"\0asm", "t00");
        let b = distinct_copy(b"\0asm", "t01");
        assert_ne!(a, b);
        assert!(a.starts_with(b"\0asm"));
        assert_eq!(a[4], 0, "custom section id");
    }
}
