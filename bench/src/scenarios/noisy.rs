//! `noisy`: tenant isolation. A well-behaved tenant (rows without tenant, the WASM reference
//! plugin) drains `--rows` rows, once alone and once with 200 rows of tenant `spinner` spread
//! evenly through the table, whose plugin (`tests/plugins/hostile`, mode `loop`) spins forever;
//! default `call_timeout` and circuit breaker. Only the good tenant's rows are timed. The two
//! cases alternate three times; the medians are compared. Target: with spinner / alone ≥ 0.9.

use crate::cli::Settings;
use crate::drain_watch::{DrainWatch, Rows};
use crate::outbox::{self, BenchTable, OtherTenant, Tenants};
use crate::relay::{self, Measured};
use crate::report::Figure;
use crate::{kafka, names};
use sluice_testkit::DbTable;
use sluice_testkit::config::{Plugin, RelayConfig, Tenant};

pub(super) const NAME: &str = "noisy";

const SPINNER: &str = "spinner";
const SPINNER_ROWS: u64 = 200;
const TARGET_RATIO: f64 = 0.9;
/// Pairs of drains (alone, with spinner) whose medians are compared.
const RUNS: usize = 3;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = settings.reference_plugin()?;
    let hostile = settings.hostile_plugin()?;
    let table = outbox::create(settings, "noisy", None).await?;
    let measured = measure(settings, &table, plugin, hostile).await;
    table.drop_table().await;
    measured
}

async fn measure(
    settings: &Settings,
    table: &DbTable,
    plugin: std::path::PathBuf,
    hostile: std::path::PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    let prefix = names::topic_prefix("noisy");
    kafka::create_topics(&settings.kafka, &kafka::topics(&prefix)).await?;
    let config = RelayConfig {
        database_url: settings.database_url.clone(),
        table: table.name.clone(),
        kafka: settings.kafka.clone(),
        default_plugin: Some((Plugin::Wasm(plugin), prefix.clone())),
        tenants: vec![Tenant {
            name: SPINNER.to_owned(),
            path: hostile,
            config: vec![
                ("mode".to_owned(), "loop".to_owned()),
                ("topic_prefix".to_owned(), prefix),
            ],
        }],
        relay: settings.relay.clone(),
        ..RelayConfig::default()
    };

    // Alternate the two cases RUNS times and compare medians: single drains vary by ±15 %.
    let mut alone_rates = Vec::with_capacity(RUNS);
    let mut noisy_rates = Vec::with_capacity(RUNS);
    for run in 1..=RUNS {
        eprintln!("    run {run}/{RUNS}: good tenant alone");
        alone_rates.push(good_rate(settings, table, &config, None).await?);
        table.truncate().await?;
        eprintln!("    run {run}/{RUNS}: good tenant with {SPINNER_ROWS} spinning rows");
        let spinner = OtherTenant {
            name: SPINNER,
            rows: SPINNER_ROWS,
        };
        noisy_rates.push(good_rate(settings, table, &config, Some(spinner)).await?);
        table.truncate().await?;
    }
    let alone = median(&mut alone_rates);
    let noisy = median(&mut noisy_rates);
    eprintln!("    alone: {alone_rates:.0?} rows/s; with spinner: {noisy_rates:.0?} rows/s");
    Ok(vec![
        Figure::new(NAME, "good rows", settings.rows as f64, "rows"),
        Figure::new(NAME, "spinning rows", SPINNER_ROWS as f64, "rows"),
        Figure::new(NAME, "good tenant alone", alone, "rows/s"),
        Figure::new(NAME, "good tenant with spinner", noisy, "rows/s"),
        Figure::new(NAME, "with spinner / alone", noisy / alone, "×").at_least(TARGET_RATIO),
    ])
}

/// Fills the table (good rows plus `other`'s), runs a relay until the good rows are gone and
/// returns their rows/s.
async fn good_rate(
    settings: &Settings,
    table: &DbTable,
    config: &RelayConfig,
    other: Option<OtherTenant<'_>>,
) -> anyhow::Result<f64> {
    table.fill(settings.rows, other.map(Tenants::Other)).await?;
    let watch = DrainWatch::prepare(&settings.database_url, table, Rows::NoTenant).await?;
    let mut relay = relay::start(&settings.sluice, config, "warn")?;
    let drained = watch.run(&mut relay).await?;
    relay.stop_measured().await?;
    Ok(drained.rows_per_second())
}
