//! `languages`: the reference plugin route-by-aggregate written in Rust, Python
//! (componentize-py) and JavaScript (componentize-qjs) — same routing, byte-identical output
//! (tests/conformance) — side by side in one run. Per language: a drain of the
//! `--rows` backlog (default 100,000) with `sluice run` and default settings, median of three
//! (see [`super::drain`]), and the time from spawn to "relay started" with an empty compile
//! cache (cold: compiles) and with the cache that start filled (cached), median of
//! [`STARTUP_RUNS`] each. Ends with a side-by-side table on stderr.
//!
//! The default `memory_mb` (128) fits all three (docs/plugin-languages.md): Python's leak is
//! handled by instance replacement at 75 % of it, so no setting differs between languages.

use std::path::PathBuf;

use anyhow::{Context, bail};
use tempfile::TempDir;

use super::THROUGHPUT;
use super::drain::{Drain, run_median};
use super::startup::{CACHE_HIT_LINE, ms, time_to_ready};
use crate::brokers::Broker;
use crate::cli::Settings;
use crate::names;
use crate::outbox;
use crate::relay::Stopped;
use crate::report::Figure;
use crate::stats::summarize;
use sluice_testkit::DbTable;
use sluice_testkit::config::{Plugin, RelayConfig};

pub(super) const NAME: &str = "languages";

/// Starts per language and cache state; the median is reported.
const STARTUP_RUNS: usize = 3;

const COLD: &str = "start-up, empty compile cache";
const CACHED: &str = "start-up, filled compile cache";
const CPU: &str = "relay CPU per 1,000 rows";
const RSS: &str = "relay peak RSS";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Language {
    Rust,
    Python,
    JavaScript,
}

const LANGUAGES: [Language; 3] = [Language::Rust, Language::Python, Language::JavaScript];

impl Language {
    fn name(self) -> &'static str {
        match self {
            Self::Rust => "Rust",
            Self::Python => "Python",
            Self::JavaScript => "JavaScript",
        }
    }

    /// The scenario label of its figures.
    fn label(self) -> &'static str {
        match self {
            Self::Rust => "languages-rust",
            Self::Python => "languages-python",
            Self::JavaScript => "languages-js",
        }
    }

    /// Table and topic names.
    fn stem(self) -> &'static str {
        match self {
            Self::Rust => "lang_rust",
            Self::Python => "lang_python",
            Self::JavaScript => "lang_js",
        }
    }

    fn plugin(self, settings: &Settings) -> anyhow::Result<PathBuf> {
        match self {
            Self::Rust => settings.reference_plugin(),
            Self::Python => settings.python_plugin(),
            Self::JavaScript => settings.js_plugin(),
        }
    }
}

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    // All three must exist before anything is measured: a missing one should not cost a run.
    let plugins = LANGUAGES
        .iter()
        .map(|language| language.plugin(settings))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut figures = Vec::new();
    for (language, plugin) in LANGUAGES.into_iter().zip(plugins) {
        eprintln!("    {}: start-up", language.name());
        let (started, cache) = startup(settings, language, &plugin).await?;
        figures.extend(started);
        eprintln!(
            "    {}: drain of {} rows",
            language.name(),
            settings.language_rows
        );
        // The cache the start-ups filled: the drain's peak RSS then never includes a compile.
        let drain = Drain {
            label: language.label(),
            stem: language.stem(),
            plugin: Plugin::Wasm(plugin),
            rows: settings.language_rows,
            cache_dir: Some(cache.path().to_path_buf()),
            extra: None,
            broker: Broker::Kafka,
        };
        figures.extend(run_median(settings, &drain).await?);
    }
    eprintln!("\n{}", side_by_side(&figures));
    Ok(figures)
}

/// Median cold and cached start-up of one plugin as the default plugin of an empty outbox,
/// and the last compile cache it filled.
async fn startup(
    settings: &Settings,
    language: Language,
    plugin: &std::path::Path,
) -> anyhow::Result<(Vec<Figure>, TempDir)> {
    let stem = format!("{}_start", language.stem());
    let table = outbox::create(settings, &stem, None).await?;
    let measured = startup_on(settings, &table, &stem, plugin).await;
    table.drop_table().await;
    let (cold, cached, cache) = measured?;
    let label = language.label();
    let figures = vec![
        Figure::new(label, COLD, median(&cold)?, "ms"),
        Figure::new(label, CACHED, median(&cached)?, "ms"),
    ];
    Ok((figures, cache))
}

/// [`STARTUP_RUNS`] pairs of starts, each pair on a fresh compile cache: the cold and cached
/// times in ms and the last cache.
async fn startup_on(
    settings: &Settings,
    table: &DbTable,
    stem: &str,
    plugin: &std::path::Path,
) -> anyhow::Result<(Vec<f64>, Vec<f64>, TempDir)> {
    let mut cold = Vec::with_capacity(STARTUP_RUNS);
    let mut cached = Vec::with_capacity(STARTUP_RUNS);
    let mut cache = tempfile::tempdir().context("cannot create a temporary compile cache")?;
    for run in 0..STARTUP_RUNS {
        if run > 0 {
            cache = tempfile::tempdir().context("cannot create a temporary compile cache")?;
        }
        let config = RelayConfig {
            database_url: settings.database_url.clone(),
            table: table.name.clone(),
            kafka: settings.kafka.clone(),
            cache_dir: Some(cache.path().to_path_buf()),
            default_plugin: Some((
                Plugin::Wasm(plugin.to_path_buf()),
                names::topic_prefix(stem),
            )),
            relay: settings.relay.clone(),
            ..RelayConfig::default()
        };
        let (first, Stopped { log: first_log, .. }) = time_to_ready(settings, &config).await?;
        let (
            second,
            Stopped {
                log: second_log, ..
            },
        ) = time_to_ready(settings, &config).await?;
        if first_log.contains(CACHE_HIT_LINE) || !second_log.contains(CACHE_HIT_LINE) {
            bail!(
                "expected a compile on the first start and {CACHE_HIT_LINE:?} on the second \
                 (cache {}); the second start logged:\n{second_log}",
                cache.path().display()
            );
        }
        cold.push(ms(first));
        cached.push(ms(second));
    }
    Ok((cold, cached, cache))
}

fn median(samples: &[f64]) -> anyhow::Result<f64> {
    summarize(samples)
        .map(|s| s.p50)
        .context("no start-up was measured")
}

/// A Markdown table, one row per language: rows/s, relay CPU ms per 1,000 rows, peak RSS,
/// cold and cached start-up. A figure that is missing shows as "–".
fn side_by_side(figures: &[Figure]) -> String {
    let find = |label: &str, name: &str| {
        figures
            .iter()
            .find(|f| f.scenario == label && f.name == name)
            .map(|f| f.value)
    };
    let cell = |value: Option<f64>, decimals: usize| {
        value.map_or_else(|| "–".to_owned(), |v| format!("{v:.decimals$}"))
    };
    let mut out = String::from(
        "| plugin | rows/s | relay CPU ms per 1,000 rows | peak RSS MiB | start-up, cold ms | start-up, cached ms |\n\
         |---|---|---|---|---|---|\n",
    );
    for language in LANGUAGES {
        let label = language.label();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            language.name(),
            cell(find(label, THROUGHPUT), 0),
            // The drain reports CPU seconds per 1,000 rows.
            cell(find(label, CPU).map(|s| s * 1000.0), 1),
            cell(find(label, RSS), 1),
            cell(find(label, COLD), 0),
            cell(find(label, CACHED), 0),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_language_in_its_units() {
        let figures = vec![
            Figure::new("languages-rust", THROUGHPUT, 40_123.4, "rows/s"),
            Figure::new("languages-rust", CPU, 0.0125, "CPU s"),
            Figure::new("languages-rust", RSS, 30.94, "MiB"),
            Figure::new("languages-rust", COLD, 812.6, "ms"),
            Figure::new("languages-rust", CACHED, 95.2, "ms"),
            Figure::new("languages-python", THROUGHPUT, 9_000.0, "rows/s"),
        ];
        let table = side_by_side(&figures);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2 + LANGUAGES.len());
        assert_eq!(lines[2], "| Rust | 40123 | 12.5 | 30.9 | 813 | 95 |");
        assert_eq!(lines[3], "| Python | 9000 | – | – | – | – |");
        assert_eq!(lines[4], "| JavaScript | – | – | – | – | – |");
    }

    #[test]
    fn median_of_three_is_the_middle_one() {
        assert_eq!(median(&[900.0, 100.0, 300.0]).ok(), Some(300.0));
        assert!(median(&[]).is_err());
    }
}
