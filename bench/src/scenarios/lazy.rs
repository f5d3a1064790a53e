//! `lazy`: live tenants' start-up (issue #40). 1,000 configured tenants `t0`…`t999` over 220
//! distinct plugin files — [`RUST_VARIANTS`] copies of the Rust reference plugin and
//! [`PYTHON_VARIANTS`] of the Python one, each made distinct by a custom section (see
//! [`super::tenants`]) — tenant `tN` running file `N % 220` (so `t0` runs a Rust file and
//! `t200` a Python one), each with its own `config`. `[plugins] cache_max_mb` is
//! [`CACHE_MAX_MB`], which the 220 compiled files exceed.
//!
//! With `load = "lazy"` and then `load = "eager"`, each with a fresh compile cache and again
//! with the cache that start left, one `sluice run` per start with [`RUST_ROWS`] rows of `t0`
//! and [`PYTHON_ROWS`] of `t200` in the outbox before the spawn: from the spawn, the time to
//! the log's "relay started", to `/readyz` answering 200, to the first and the last row of
//! `t0` leaving the outbox (sent) and the same for `t200`; once `t0`'s rows are all sent,
//! [`LATE_ROWS`] rows of `t1` (another Rust file) are inserted and timed from their insert to
//! their first and last row sent (lazy: its compile comes while `t200`'s may still be under
//! way); the relay's peak RSS; afterwards the compile cache directory's size on disk and its
//! number of `*.cwasm` files.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::startup::{CACHE_HIT_LINE, READY_LINE, ms};
use super::tenants::distinct_plugins;
use crate::cli::Settings;
use crate::outbox::{self, BenchTable, OtherTenant, Tenants};
use crate::relay::{self, Measured};
use crate::report::Figure;
use crate::{kafka, names};
use sluice_testkit::DbTable;
use sluice_testkit::config::{RelayConfig, Tenant};

pub(super) const NAME: &str = "lazy";

const TENANTS: usize = 1_000;
const RUST_VARIANTS: usize = 200;
const PYTHON_VARIANTS: usize = 20;
const CACHE_MAX_MB: u64 = 512;
/// Runs file 0, a Rust one.
const RUST_TENANT: &str = "t0";
/// Runs file 200, a Python one.
const PYTHON_TENANT: &str = "t200";
const RUST_ROWS: u64 = 10_000;
const PYTHON_ROWS: u64 = 100;
/// Runs file 1, a Rust one; its rows are inserted once `t0`'s are sent, while `t200`'s
/// plugin may still be compiling (lazy).
const LATE_TENANT: &str = "t1";
const LATE_ROWS: u64 = 100;
const POLL: Duration = Duration::from_millis(20);
/// Longest a start may take until both tenants' rows are sent (an eager start with an empty
/// cache compiles 20 Python components: minutes on 2 shared cores).
const TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    Lazy,
    Eager,
}

impl Load {
    fn setting(self) -> &'static str {
        match self {
            Self::Lazy => "lazy",
            Self::Eager => "eager",
        }
    }
}

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let rust = settings.reference_plugin()?;
    let python = settings.python_plugin()?;
    let files = tempfile::tempdir().context("cannot create a directory for the plugins")?;
    let rust_dir = files.path().join("rust");
    let python_dir = files.path().join("python");
    for dir in [&rust_dir, &python_dir] {
        std::fs::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut plugins = distinct_plugins(&rust, &rust_dir, RUST_VARIANTS)?;
    plugins.extend(distinct_plugins(&python, &python_dir, PYTHON_VARIANTS)?);
    let table = outbox::create(settings, NAME, None).await?;
    let measured = measure(settings, &table, &plugins).await;
    table.drop_table().await;
    measured
}

async fn measure(
    settings: &Settings,
    table: &DbTable,
    plugins: &[PathBuf],
) -> anyhow::Result<Vec<Figure>> {
    let prefix = names::topic_prefix(NAME);
    kafka::create_topics(&settings.kafka, &kafka::topics(&prefix)).await?;
    let mut figures = vec![
        Figure::new(NAME, "tenants", TENANTS as f64, "tenants"),
        Figure::new(NAME, "distinct plugin files", plugins.len() as f64, "files"),
        Figure::new(NAME, "cache_max_mb", CACHE_MAX_MB as f64, "MiB"),
    ];
    for load in [Load::Lazy, Load::Eager] {
        let cache = tempfile::tempdir().context("cannot create a temporary compile cache")?;
        for cache_state in ["empty", "filled"] {
            let label = format!("{NAME}-{}-{cache_state}-cache", load.setting());
            eprintln!(
                "    load = {:?}, {cache_state} compile cache",
                load.setting()
            );
            let start = Start {
                label: &label,
                load,
                table,
                prefix: &prefix,
                plugins,
                cache: cache.path(),
            };
            let measured = start.measure(settings).await?;
            for figure in &measured {
                eprintln!("      {}: {:.1} {}", figure.name, figure.value, figure.unit);
            }
            figures.extend(measured);
        }
    }
    Ok(figures)
}

/// One start of the relay.
struct Start<'a> {
    label: &'a str,
    load: Load,
    table: &'a DbTable,
    prefix: &'a str,
    plugins: &'a [PathBuf],
    cache: &'a Path,
}

/// Times since the spawn; `None` until seen.
#[derive(Debug, Default)]
struct Marks {
    started: Option<Duration>,
    ready: Option<Duration>,
    rust_first: Option<Duration>,
    rust_last: Option<Duration>,
    python_first: Option<Duration>,
    python_last: Option<Duration>,
    late_inserted: Option<Duration>,
    late_first: Option<Duration>,
    late_last: Option<Duration>,
}

impl Marks {
    fn complete(&self) -> bool {
        self.started.is_some()
            && self.ready.is_some()
            && self.rust_last.is_some()
            && self.python_last.is_some()
            && self.late_last.is_some()
    }
}

impl Start<'_> {
    fn config(&self, settings: &Settings, listen: &str) -> RelayConfig {
        RelayConfig {
            database_url: settings.database_url.clone(),
            table: self.table.name.clone(),
            kafka: settings.kafka.clone(),
            relay: settings.relay.clone(),
            cache_dir: Some(self.cache.to_path_buf()),
            plugins_extra: Some(format!(
                "load = \"{}\"\ncache_max_mb = {CACHE_MAX_MB}",
                self.load.setting()
            )),
            tenants: (0..TENANTS)
                .zip(self.plugins.iter().cycle())
                .map(|(i, path)| Tenant {
                    name: format!("t{i}"),
                    path: path.clone(),
                    config: vec![("topic_prefix".to_owned(), self.prefix.to_owned())],
                })
                .collect(),
            telemetry: Some(listen.to_owned()),
            ..RelayConfig::default()
        }
    }

    async fn measure(&self, settings: &Settings) -> anyhow::Result<Vec<Figure>> {
        let table = self.table;
        table.truncate().await?;
        for (name, rows) in [(RUST_TENANT, RUST_ROWS), (PYTHON_TENANT, PYTHON_ROWS)] {
            let other = OtherTenant { name, rows };
            table.insert(0, Some(Tenants::Other(other))).await?;
        }
        let listen = format!("127.0.0.1:{}", free_port()?);
        let config = self.config(settings, &listen);

        let spawned = Instant::now();
        let mut relay = relay::start(&settings.sluice, &config, "info")?;
        let mut marks = Marks::default();
        while !marks.complete() {
            relay.ensure_running()?;
            let now = spawned.elapsed();
            if marks.started.is_none() && relay.log().contains(READY_LINE) {
                marks.started = Some(now);
            }
            if marks.ready.is_none() && ready(&listen).await {
                marks.ready = Some(now);
            }
            let rust = unsent(table, RUST_TENANT).await?;
            see(
                &mut marks.rust_first,
                &mut marks.rust_last,
                rust,
                RUST_ROWS,
                now,
            );
            let python = unsent(table, PYTHON_TENANT).await?;
            see(
                &mut marks.python_first,
                &mut marks.python_last,
                python,
                PYTHON_ROWS,
                now,
            );
            if marks.late_inserted.is_none() && marks.rust_last.is_some() {
                let other = OtherTenant {
                    name: LATE_TENANT,
                    rows: LATE_ROWS,
                };
                table.insert(0, Some(Tenants::Other(other))).await?;
                marks.late_inserted = Some(spawned.elapsed());
            }
            if let Some(inserted) = marks.late_inserted {
                let late = unsent(table, LATE_TENANT).await?;
                let since = spawned.elapsed().saturating_sub(inserted);
                see(
                    &mut marks.late_first,
                    &mut marks.late_last,
                    late,
                    LATE_ROWS,
                    since,
                );
            }
            if now > TIMEOUT {
                bail!(
                    "after {TIMEOUT:?}: {marks:?}, {rust} rows of {RUST_TENANT} and {python} of \
                     {PYTHON_TENANT} unsent; the log ends:\n{}",
                    relay.log_tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
        let stopped = relay.stop_measured().await?;
        let (cache_bytes, compiled) = disk_usage(self.cache)?;

        let at = |mark: Option<Duration>| mark.map_or(f64::NAN, ms);
        let label = self.label;
        Ok(vec![
            Figure::new(label, "spawn → \"relay started\"", at(marks.started), "ms"),
            Figure::new(label, "spawn → /readyz 200", at(marks.ready), "ms"),
            Figure::new(
                label,
                "spawn → t0's first row sent",
                at(marks.rust_first),
                "ms",
            ),
            Figure::new(
                label,
                "spawn → t0's last row sent",
                at(marks.rust_last),
                "ms",
            ),
            Figure::new(
                label,
                "spawn → t200's first row sent (Python)",
                at(marks.python_first),
                "ms",
            ),
            Figure::new(
                label,
                "spawn → t200's last row sent (Python)",
                at(marks.python_last),
                "ms",
            ),
            Figure::new(
                label,
                "spawn → t1's rows inserted (t0's all sent)",
                at(marks.late_inserted),
                "ms",
            ),
            Figure::new(
                label,
                "t1's rows inserted → its first row sent",
                at(marks.late_first),
                "ms",
            ),
            Figure::new(
                label,
                "t1's rows inserted → its last row sent",
                at(marks.late_last),
                "ms",
            ),
            Figure::new(label, "relay peak RSS", stopped.last.peak_rss_mib(), "MiB"),
            Figure::new(
                label,
                "plugins loaded from the cache",
                stopped.log.matches(CACHE_HIT_LINE).count() as f64,
                "plugins",
            ),
            Figure::new(
                label,
                "compile cache on disk afterwards",
                cache_bytes as f64 / (1024.0 * 1024.0),
                "MiB",
            )
            .at_most(CACHE_MAX_MB as f64),
            Figure::new(
                label,
                "compiled files in the cache",
                compiled as f64,
                "files",
            ),
        ])
    }
}

/// Records the first time `unsent` fell below `rows` and the first time it reached 0.
fn see(
    first: &mut Option<Duration>,
    last: &mut Option<Duration>,
    unsent: i64,
    rows: u64,
    now: Duration,
) {
    let unsent = u64::try_from(unsent).unwrap_or(0);
    if first.is_none() && unsent < rows {
        *first = Some(now);
    }
    if last.is_none() && unsent == 0 {
        *last = Some(now);
    }
}

/// Rows of `tenant` (a name without quotes) not sent yet.
async fn unsent(table: &DbTable, tenant: &str) -> anyhow::Result<i64> {
    let sql =
        format!("SELECT COUNT(*) FROM {{t}} WHERE tenant = '{tenant}' AND published_at IS NULL");
    Ok(table.try_scalar(&sql).await?.unwrap_or(0))
}

/// Whether `/readyz` on `listen` answers 200.
async fn ready(listen: &str) -> bool {
    let listen = listen.to_owned();
    tokio::task::spawn_blocking(move || {
        sluice_testkit::scrape::http_get_at(&listen, "/readyz").is_some_and(|(code, _)| code == 200)
    })
    .await
    .unwrap_or(false)
}

/// A TCP port free right now on 127.0.0.1.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Bytes allocated on disk under `dir` (recursively) and the number of `*.cwasm` files.
fn disk_usage(dir: &Path) -> anyhow::Result<(u64, usize)> {
    let mut bytes = 0;
    let mut compiled = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))?
        {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                pending.push(entry.path());
                continue;
            }
            bytes += meta.blocks() * 512;
            if entry.path().extension().is_some_and(|e| e == "cwasm") {
                compiled += 1;
            }
        }
    }
    Ok((bytes, compiled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_record_the_first_row_and_the_last() {
        let (mut first, mut last) = (None, None);
        let s = Duration::from_secs;
        see(&mut first, &mut last, 10, 10, s(1));
        assert_eq!((first, last), (None, None));
        see(&mut first, &mut last, 9, 10, s(2));
        see(&mut first, &mut last, 5, 10, s(3));
        assert_eq!((first, last), (Some(s(2)), None));
        see(&mut first, &mut last, 0, 10, s(4));
        see(&mut first, &mut last, 0, 10, s(5));
        assert_eq!((first, last), (Some(s(2)), Some(s(4))));
    }

    #[test]
    fn disk_usage_counts_nested_files_and_cwasm_ones() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("sub"))?;
        std::fs::write(dir.path().join("a.cwasm"), vec![1u8; 10_000])?;
        std::fs::write(dir.path().join("sub/b.cwasm"), vec![1u8; 10_000])?;
        std::fs::write(dir.path().join("sub/c.lock"), b"x")?;
        let (bytes, compiled) = disk_usage(dir.path())?;
        assert_eq!(compiled, 2);
        assert!(bytes >= 20_000, "{bytes}");
        Ok(())
    }
}
