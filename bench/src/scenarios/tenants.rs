//! `tenants`: what many tenants cost a drain (issue #23). Three cases, each a drain of the
//! same backlog (standard rows, default settings, the WASM reference plugin, a freshly started
//! broker per drain; see [`super::drain`]):
//! - **none**: every row of the default tenant, one plugin instance;
//! - **1,000 configured**: rows spread evenly over tenants `t0`…`t999`, each with its own
//!   `[tenants.tN]` section (the same `.wasm`, its own `config`, the same topics);
//! - **10,000 free-form**: rows spread evenly over 10,000 tenant values without sections, all
//!   served by `[plugins.default]`, with room for every one's instance
//!   (`max_unconfigured_instances = 10000`).
//!
//! Each drain is two backlogs drained by one relay: the first on a fresh relay (which opens
//! its connections, and creates a free-form tenant's instance at its first row: 10,000
//! creations in the free-form case), the second once the first is gone, with every instance
//! resident — a relay that has run for a while. The targets are the second backlog's; the
//! first's figures are reported too.
//!
//! The cases alternate [`RUNS`] times, so drift falls on all three alike; per case the median
//! run is reported, and the ratios of the medians to the one-tenant drain. Before the drains,
//! the relay with 1,000 configured tenants is started twice on the empty outbox (as
//! [`super::startup`] times it: spawn until "relay started"), first with an empty compile
//! cache, then with the cache that start filled: both times, and the peak RSS by then. The
//! drains use that cache, so none of them compiles. The same two starts follow with the 1,000
//! tenants spread over [`DISTINCT`] distinct plugin files (the reference plugin with a custom
//! section naming each appended, so each is compiled and cached on its own, as ten different
//! plugins are), with a compile cache of their own; then a relay so started is sent SIGHUP and
//! timed until it logs that the plugins were reloaded.
//!
//! Targets (issue #45): 1,000 configured ≥ 0.85 and 10,000 free-form ≥ 0.60 of one tenant's
//! rows/s, peak RSS ≤ 1 GiB. A missed target is reported, not an error.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::THROUGHPUT;
use super::drain::{self, Drain, median_run};
use super::startup::{READY_LINE, ms, time_to_ready, wait_for_line};
use crate::brokers::Broker;
use crate::cli::Settings;
use crate::names;
use crate::outbox::{self, BenchTable, Tenants};
use crate::relay::{self, Measured};
use crate::report::Figure;
use sluice_testkit::DbTable;
use sluice_testkit::OwnTansu;
use sluice_testkit::config::{Plugin, RelayConfig, Tenant};

pub(super) const NAME: &str = "tenants";

/// Rounds of the three drains; per case the median is reported.
const RUNS: usize = 3;
/// Tenants with a `[tenants.*]` section in the configured case.
const CONFIGURED: u64 = 1_000;
/// Distinct tenant values in the free-form case.
const FREE_FORM: u64 = 10_000;
/// Distinct plugin files of the second start-up case.
const DISTINCT: usize = 10;
const RATIO_CONFIGURED: f64 = 0.85;
const RATIO_FREE_FORM: f64 = 0.60;
const PEAK_RSS_MIB: f64 = 1024.0;
const RSS: &str = "relay peak RSS";
const MAPPINGS: &str = "relay memory mappings after the drain";
/// Linux's default `vm.max_map_count`: a process with more mappings fails to map memory.
const MAX_MAP_COUNT: f64 = 65_530.0;
/// What the relay logs when a reload SIGHUP asked for is done.
const RELOADED_LINE: &str = "configuration reloaded";

/// Whose rows a drain moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    None,
    Configured,
    FreeForm,
}

const CASES: [Case; 3] = [Case::None, Case::Configured, Case::FreeForm];

impl Case {
    /// The scenario label of the case's figures.
    fn label(self) -> &'static str {
        match self {
            Self::None => "tenants-none",
            Self::Configured => "tenants-1000",
            Self::FreeForm => "tenants-10000",
        }
    }

    fn rows(self) -> Option<Tenants<'static>> {
        match self {
            Self::None => None,
            Self::Configured => Some(Tenants::Spread(CONFIGURED)),
            Self::FreeForm => Some(Tenants::Spread(FREE_FORM)),
        }
    }

    /// `[plugins]` lines of the case: the free-form tenants' instances all stay resident
    /// (10,000 instances of the reference plugin hold ~1.1 MiB of linear memory each, most of
    /// it never touched: ~35 KiB of RSS).
    fn plugins_extra(self) -> Option<&'static str> {
        match self {
            Self::FreeForm => {
                Some("max_unconfigured_instances = 10000\nunconfigured_instances_memory_mb = 16384")
            }
            Self::None | Self::Configured => None,
        }
    }

    fn sections(self, plugin: &Path, prefix: &str) -> Vec<Tenant> {
        match self {
            Self::Configured => configured(plugin, prefix),
            Self::None | Self::FreeForm => Vec::new(),
        }
    }
}

/// `[tenants.t0]`…`[tenants.t999]`: the reference plugin, each with its own `config` naming
/// the same topics as the default plugin's.
fn configured(plugin: &Path, prefix: &str) -> Vec<Tenant> {
    configured_over(&[plugin.to_path_buf()], prefix)
}

/// The same tenants, tenant `tN` running `plugins[N % plugins.len()]`.
fn configured_over(plugins: &[PathBuf], prefix: &str) -> Vec<Tenant> {
    (0..CONFIGURED)
        .zip(plugins.iter().cycle())
        .map(|(i, path)| Tenant {
            name: format!("t{i}"),
            path: path.clone(),
            config: vec![("topic_prefix".to_owned(), prefix.to_owned())],
        })
        .collect()
}

/// `count` distinct files of `plugin` in `dir`: each with a custom section
/// `sluice-bench-variant-N` appended (a custom section may follow the last section of a
/// component), so their digests, compilations and cache entries differ.
pub(super) fn distinct_plugins(
    plugin: &Path,
    dir: &Path,
    count: usize,
) -> anyhow::Result<Vec<PathBuf>> {
    let bytes =
        std::fs::read(plugin).with_context(|| format!("cannot read {}", plugin.display()))?;
    (0..count)
        .map(|n| {
            let name = format!("sluice-bench-variant-{n}");
            // Section id 0, its size, the name's length and the name (all under 128: one
            // LEB128 byte each).
            let mut file = bytes.clone();
            file.extend([0, (name.len() + 1) as u8, name.len() as u8]);
            file.extend(name.as_bytes());
            let path = dir.join(format!("variant-{n}.wasm"));
            std::fs::write(&path, file)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        })
        .collect()
}

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = settings.reference_plugin()?;
    let cache = tempfile::tempdir().context("cannot create a temporary compile cache")?;
    let drain = Drain {
        label: NAME,
        stem: NAME,
        plugin: Plugin::Wasm(plugin.clone()),
        rows: settings.tenant_rows,
        cache_dir: Some(cache.path().to_path_buf()),
        extra: None,
        broker: Broker::Kafka,
    };
    let table = outbox::create(settings, NAME, None).await?;
    let measured = measure(settings, &table, &drain, &plugin).await;
    table.drop_table().await;
    measured
}

async fn measure(
    settings: &Settings,
    table: &DbTable,
    drain: &Drain<'_>,
    plugin: &Path,
) -> anyhow::Result<Vec<Figure>> {
    let mut figures = vec![Figure::new(
        NAME,
        "rows per drain",
        drain.rows as f64,
        "rows",
    )];
    figures.extend(startup(settings, table, drain, plugin).await?);

    // Per case, the first backlog's runs and the second's (see the module documentation).
    let mut firsts: [Vec<Vec<Figure>>; 3] = Default::default();
    let mut runs: [Vec<Vec<Figure>>; 3] = Default::default();
    for round in 1..=RUNS {
        for ((case, runs), firsts) in CASES.into_iter().zip(&mut runs).zip(&mut firsts) {
            eprintln!("    run {round}/{RUNS}: {}", case.label());
            let (_broker, settings) = fresh_broker(settings)?;
            let drain = Drain {
                label: case.label(),
                ..drain.clone()
            };
            let prefix = names::topic_prefix(NAME);
            let sections = case.sections(plugin, &prefix);
            let measured = drain::measure_tenants_twice(
                &settings,
                &drain,
                table,
                &prefix,
                case.rows(),
                sections,
                case.plugins_extra(),
            )
            .await;
            table.truncate().await?;
            let (first, second) = measured?;
            firsts.push(first);
            runs.push(second);
        }
    }

    let first_rates = medians(
        firsts,
        &mut figures,
        |case| format!("{} (first backlog)", case.label()),
        |f| f,
    );
    let rates = medians(
        runs,
        &mut figures,
        |case| case.label().to_owned(),
        |f| {
            if f.name == RSS {
                f.at_most(PEAK_RSS_MIB)
            } else if f.name == MAPPINGS {
                f.at_most(MAX_MAP_COUNT)
            } else {
                f
            }
        },
    );
    let [none, configured, free_form] = first_rates;
    figures.push(Figure::new(
        NAME,
        "first backlog: 1,000 configured / none",
        configured / none,
        "×",
    ));
    figures.push(Figure::new(
        NAME,
        "first backlog: 10,000 free-form / none",
        free_form / none,
        "×",
    ));
    let [none, configured, free_form] = rates;
    figures.push(
        Figure::new(NAME, "1,000 configured / none", configured / none, "×")
            .at_least(RATIO_CONFIGURED),
    );
    figures.push(
        Figure::new(NAME, "10,000 free-form / none", free_form / none, "×")
            .at_least(RATIO_FREE_FORM),
    );
    Ok(figures)
}

/// Per case, the median of its `runs` (labelled `label(case)`, each figure passed through
/// `mark`) added to `figures`; returns the cases' median throughputs.
fn medians(
    runs: [Vec<Vec<Figure>>; 3],
    figures: &mut Vec<Figure>,
    label: impl Fn(Case) -> String,
    mark: impl Fn(Figure) -> Figure,
) -> [f64; 3] {
    let mut rates = [f64::NAN; 3];
    for ((case, runs), rate) in CASES.into_iter().zip(runs).zip(&mut rates) {
        let label = label(case);
        let run: Vec<Figure> = median_run(&label, runs)
            .into_iter()
            .map(|f| {
                mark(Figure {
                    scenario: label.clone(),
                    ..f
                })
            })
            .collect();
        if let Some(median) = run.iter().find(|f| f.name == THROUGHPUT) {
            *rate = median.value;
        }
        figures.extend(run);
    }
    rates
}

/// Two starts of the relay with [`CONFIGURED`] tenants on the empty outbox, the first with
/// `drain`'s empty compile cache, the second with the cache it filled: time to "relay
/// started" and the relay's peak RSS by then.
async fn startup(
    settings: &Settings,
    table: &DbTable,
    drain: &Drain<'_>,
    plugin: &Path,
) -> anyhow::Result<Vec<Figure>> {
    let (_broker, settings) = fresh_broker(settings)?;
    let prefix = names::topic_prefix(NAME);
    let config = drain::relay_config(
        &settings,
        drain,
        table,
        &prefix,
        configured(plugin, &prefix),
    );
    eprintln!("    start-up with {CONFIGURED} configured tenants, empty compile cache");
    let (cold, cold_stop) = time_to_ready(&settings, &config).await?;
    eprintln!("    start-up with {CONFIGURED} configured tenants, filled compile cache");
    let (warm, warm_stop) = time_to_ready(&settings, &config).await?;

    let files = tempfile::tempdir().context("cannot create a directory for the plugins")?;
    let plugins = distinct_plugins(plugin, files.path(), DISTINCT)?;
    let cache = tempfile::tempdir().context("cannot create a temporary compile cache")?;
    let own_cache = Drain {
        label: drain.label,
        stem: drain.stem,
        plugin: drain.plugin.clone(),
        rows: drain.rows,
        cache_dir: Some(cache.path().to_path_buf()),
        extra: None,
        broker: Broker::Kafka,
    };
    let config = drain::relay_config(
        &settings,
        &own_cache,
        table,
        &prefix,
        configured_over(&plugins, &prefix),
    );
    eprintln!(
        "    start-up with {CONFIGURED} tenants over {DISTINCT} plugins, empty compile cache"
    );
    let (cold10, cold10_stop) = time_to_ready(&settings, &config).await?;
    eprintln!(
        "    start-up with {CONFIGURED} tenants over {DISTINCT} plugins, filled compile cache"
    );
    let (warm10, warm10_stop) = time_to_ready(&settings, &config).await?;
    eprintln!("    reload (SIGHUP) with {CONFIGURED} tenants over {DISTINCT} plugins");
    let (reload, reload_rss) = time_to_reload(&settings, &config).await?;
    Ok(vec![
        Figure::new(
            NAME,
            "reload (SIGHUP), 1,000 configured over 10 plugins",
            ms(reload),
            "ms",
        ),
        Figure::new(
            NAME,
            "peak RSS after the reload over 10 plugins",
            reload_rss,
            "MiB",
        ),
        Figure::new(
            NAME,
            "start-up, 1,000 configured over 10 plugins, empty cache",
            ms(cold10),
            "ms",
        ),
        Figure::new(
            NAME,
            "peak RSS at start-up over 10 plugins, empty cache",
            cold10_stop.last.peak_rss_mib(),
            "MiB",
        ),
        Figure::new(
            NAME,
            "start-up, 1,000 configured over 10 plugins, filled cache",
            ms(warm10),
            "ms",
        ),
        Figure::new(
            NAME,
            "peak RSS at start-up over 10 plugins, filled cache",
            warm10_stop.last.peak_rss_mib(),
            "MiB",
        ),
        Figure::new(
            NAME,
            "start-up, 1,000 configured, empty cache",
            ms(cold),
            "ms",
        ),
        Figure::new(
            NAME,
            "peak RSS at start-up, empty cache",
            cold_stop.last.peak_rss_mib(),
            "MiB",
        ),
        Figure::new(
            NAME,
            "start-up, 1,000 configured, filled cache",
            ms(warm),
            "ms",
        ),
        Figure::new(
            NAME,
            "peak RSS at start-up, filled cache",
            warm_stop.last.peak_rss_mib(),
            "MiB",
        ),
    ])
}

/// Starts the relay, waits until it is ready, sends SIGHUP and times it until the log says
/// the plugins were reloaded: the reload's time and the relay's peak RSS by then.
async fn time_to_reload(
    settings: &Settings,
    config: &RelayConfig,
) -> anyhow::Result<(Duration, f64)> {
    let mut relay = relay::start(&settings.sluice, config, "info")?;
    wait_for_line(&mut relay, READY_LINE, Instant::now()).await?;
    let sent = Instant::now();
    relay.signal("HUP")?;
    let took = wait_for_line(&mut relay, RELOADED_LINE, sent).await?;
    let stopped = relay.stop_measured().await?;
    Ok((took, stopped.last.peak_rss_mib()))
}

/// A broker started for one measurement (stopped when dropped) and `settings` pointing at it.
fn fresh_broker(settings: &Settings) -> anyhow::Result<(OwnTansu, Settings)> {
    let broker = OwnTansu::fresh()?;
    let settings = Settings {
        kafka: broker.bootstrap(),
        ..settings.clone()
    };
    Ok((broker, settings))
}
