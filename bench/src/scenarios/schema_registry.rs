//! `schema-registry` (issue #24): what encoding every value as Avro costs. The same backlog
//! of `--rows` standard rows (default 200,000; `{"n": …, "pad": "xxx…"}`, 256 bytes of JSON) is
//! drained by `sluice run` with the WASM reference plugin, once publishing the JSON as it is
//! (`raw`) and once with `value_format = "avro"` against the test Schema Registry of the test
//! kit (record `bench.Row {n: long, pad: string}`, subject `bench.Row`: record-name
//! strategy), alternating [`PAIRS`] times on one table. Figures:
//! each case's median rows/s and relay CPU per 1,000 rows, the median of the per-pair ratios
//! avro / raw (target ≥ 0.8) and the registry requests per Avro drain (the cache at work).

use super::drain::{Drain, measure, median_run};
use crate::brokers::Broker;
use crate::cli::Settings;
use crate::outbox;
use crate::report::Figure;
use crate::stats::summarize;
use anyhow::Context;
use sluice_testkit::config::Plugin;
use sluice_testkit::registry::TestRegistry;

pub(super) const NAME: &str = "schema-registry";

const PAIRS: usize = 3;
const TARGET: f64 = 0.8;
const STEM: &str = "schema_reg";
/// The record's full name: its subject (record-name strategy).
const RECORD: &str = "bench.Row";
const CPU: &str = "relay CPU per 1,000 rows";
const SCHEMA: &str = r#"{"type": "record", "name": "Row", "namespace": "bench",
  "fields": [{"name": "n", "type": "long"}, {"name": "pad", "type": "string"}]}"#;

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = Plugin::Wasm(settings.reference_plugin()?);
    let registry = TestRegistry::start().context("cannot start the test schema registry")?;
    // Record-name subjects: each drain's topics are named anew (`names::topic_prefix`).
    registry.register(RECORD, "AVRO", SCHEMA);
    let raw = Drain {
        label: "schema-registry (raw)",
        stem: STEM,
        plugin: plugin.clone(),
        rows: settings.rows,
        cache_dir: None,
        extra: None,
        broker: Broker::Kafka,
    };
    let avro = Drain {
        label: "schema-registry (avro)",
        extra: Some((
            format!(
                "value_format = \"avro\"\nsubject_strategy = \"record-name\"\n\
                 value_record = \"{RECORD}\""
            ),
            format!("[schema_registry]\nurl = \"{}\"", registry.url()),
        )),
        ..raw.clone()
    };
    let table = outbox::create(settings, STEM, None).await?;
    let measured = pairs(settings, &raw, &avro, &table, &registry).await;
    table.drop_table().await;
    let (raw_runs, avro_runs, ratios, cpu_ratios, requests) = measured?;
    let mut figures = median_run(raw.label, raw_runs);
    figures.extend(median_run(avro.label, avro_runs));
    let ratio = summarize(&ratios).context("no pair was measured")?;
    let cpu_ratio = summarize(&cpu_ratios).context("no pair was measured")?;
    let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    eprintln!(
        "    avro / raw rows/s per pair: {} (target ≥ {TARGET})",
        ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    figures.extend([
        Figure::new(
            NAME,
            "avro / raw rows/s, median of pairs",
            ratio.p50,
            "ratio",
        ),
        Figure::new(NAME, "avro / raw rows/s, lowest pair", lowest, "ratio"),
        Figure::new(
            NAME,
            "avro / raw relay CPU per row, median",
            cpu_ratio.p50,
            "ratio",
        ),
        Figure::new(
            NAME,
            "registry requests per Avro drain",
            requests,
            "requests",
        ),
    ]);
    Ok(figures)
}

type Pairs = (Vec<Vec<Figure>>, Vec<Vec<Figure>>, Vec<f64>, Vec<f64>, f64);

/// [`PAIRS`] drains of each case, alternating on one table.
async fn pairs(
    settings: &Settings,
    raw: &Drain<'_>,
    avro: &Drain<'_>,
    table: &sluice_testkit::DbTable,
    registry: &TestRegistry,
) -> anyhow::Result<Pairs> {
    use crate::outbox::BenchTable;
    let (mut raw_runs, mut avro_runs, mut ratios, mut cpu_ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut requests = 0;
    for pair in 1..=PAIRS {
        eprintln!("    pair {pair}/{PAIRS}: raw, then avro");
        let r = measure(settings, raw, table).await?;
        table.truncate().await?;
        let before = registry.requests();
        let a = measure(settings, avro, table).await?;
        requests += registry.requests() - before;
        table.truncate().await?;
        ratios.push(a[0].value / r[0].value);
        cpu_ratios.push(value(&a, CPU)? / value(&r, CPU)?);
        raw_runs.push(r);
        avro_runs.push(a);
    }
    Ok((
        raw_runs,
        avro_runs,
        ratios,
        cpu_ratios,
        requests as f64 / PAIRS as f64,
    ))
}

fn value(figures: &[Figure], name: &str) -> anyhow::Result<f64> {
    figures
        .iter()
        .find(|f| f.name == name)
        .map(|f| f.value)
        .with_context(|| format!("no figure {name:?}"))
}
