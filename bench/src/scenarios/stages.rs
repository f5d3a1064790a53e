//! `stages`: where a drain's time goes. One drain (defaults, WASM reference plugin, a fresh
//! broker) with metrics on; right after it, the relay's `/metrics` gives the time its batches
//! spent in each stage: claim (the locking `SELECT` and decoding), transform (the plugin),
//! produce (enqueue → last delivery report) and mark (`DELETE`/`UPDATE` and `COMMIT`).
//!
//! Figures are per 1,000 rows: each stage's batch time, summed over concurrent batches, next
//! to the drain's wall-clock time. Stage time above the wall-clock time is overlap (batches in
//! flight together); a stage that dominates is where the drain waits.
//!
//! With `--baseline <sluice>` the same drain runs with that binary too (alternating, each
//! against its own fresh broker), so a change can be compared with the code before it; with
//! `--plot FILE` the breakdown is also drawn as an SVG bar chart.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use super::THROUGHPUT;
use super::drain::{self, Drain};
use crate::brokers::Broker;
use crate::cli::Settings;
use crate::outbox;
use crate::report::Figure;
use sluice_testkit::DbTable;
use sluice_testkit::OwnTansu;
use sluice_testkit::config::Plugin;
use sluice_testkit::scrape;

pub(super) const NAME: &str = "stages";

/// The stages, as (label, histogram of the relay's `/metrics`).
const STAGES: [(&str, &str); 4] = [
    ("claim", "sluice_claim_duration_seconds"),
    ("transform", "sluice_transform_duration_seconds"),
    ("produce", "sluice_produce_duration_seconds"),
    ("mark + commit", "sluice_mark_duration_seconds"),
];

/// One binary's breakdown.
struct Breakdown {
    label: String,
    rows_per_second: f64,
    /// Wall-clock ms per 1,000 rows.
    wall: f64,
    /// Batch ms per 1,000 rows, per stage (summed over concurrent batches).
    stages: [f64; 4],
    rows_per_batch: f64,
    relay_cpu: f64,
}

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let plugin = Plugin::Wasm(settings.reference_plugin()?);
    let mut binaries = vec![("current".to_owned(), settings.sluice.clone())];
    if let Some(baseline) = &settings.baseline {
        binaries.insert(0, ("baseline".to_owned(), baseline.clone()));
    }
    let table = outbox::create(settings, "stages", None).await?;
    let breakdowns = outbox::for_each(table, &binaries, async |table, (label, sluice)| {
        measure(settings, table, &plugin, label, sluice).await
    })
    .await?;
    if let Some(path) = &settings.plot {
        std::fs::write(path, svg(&breakdowns))
            .with_context(|| format!("cannot write the plot to {}", path.display()))?;
        eprintln!("    stage plot written to {}", path.display());
    }
    let mut figures = Vec::new();
    for b in &breakdowns {
        let scenario = format!("{NAME} ({})", b.label);
        figures.push(Figure::new(
            &scenario,
            THROUGHPUT,
            b.rows_per_second,
            "rows/s",
        ));
        figures.push(Figure::new(
            &scenario,
            "wall clock per 1,000 rows",
            b.wall,
            "ms",
        ));
        for ((stage, _), ms) in STAGES.iter().zip(b.stages) {
            figures.push(Figure::new(
                &scenario,
                &format!("{stage} per 1,000 rows (batch time)"),
                ms,
                "ms",
            ));
        }
        figures.push(Figure::new(
            &scenario,
            "batches in flight (stage time / wall clock)",
            b.stages.iter().sum::<f64>() / b.wall,
            "batches",
        ));
        figures.push(Figure::new(
            &scenario,
            "rows per batch",
            b.rows_per_batch,
            "rows",
        ));
        figures.push(Figure::new(
            &scenario,
            "relay CPU per 1,000 rows",
            b.relay_cpu,
            "CPU s",
        ));
    }
    Ok(figures)
}

async fn measure(
    settings: &Settings,
    table: &DbTable,
    plugin: &Plugin,
    label: &str,
    sluice: &Path,
) -> anyhow::Result<Breakdown> {
    let broker = OwnTansu::fresh()?;
    let listen = format!("127.0.0.1:{}", sluice_testkit::broker::try_free_port()?);
    let settings = Settings {
        kafka: broker.bootstrap(),
        telemetry: Some(listen),
        sluice: sluice.to_path_buf(),
        ..settings.clone()
    };
    let drain = Drain {
        label: NAME,
        stem: "stages",
        plugin: plugin.clone(),
        rows: settings.rows,
        cache_dir: None,
        extra: None,
        broker: Broker::Kafka,
    };
    let (figures, metrics) = drain::measure_with_metrics(&settings, &drain, table).await?;
    let metrics = metrics.context("the relay's metrics were not scraped")?;
    let value = |name: &str| {
        figures
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.value)
            .with_context(|| format!("no figure {name:?}"))
    };
    let rows_per_second = value(THROUGHPUT)?;
    // Every batch of the relay's life, i.e. the whole backlog (the table was filled before
    // the relay started); the empty claims at the end add next to nothing.
    let rows = scrape::sum(&metrics, "sluice_claim_batch_rows_sum");
    let batches = scrape::sum(&metrics, "sluice_claim_batch_rows_count");
    let per_1k = |seconds: f64| seconds * 1000.0 / rows * 1000.0;
    let stages =
        STAGES.map(|(_, histogram)| per_1k(scrape::sum(&metrics, &format!("{histogram}_sum"))));
    let breakdown = Breakdown {
        label: label.to_owned(),
        rows_per_second,
        wall: 1000.0 / rows_per_second * 1000.0,
        stages,
        rows_per_batch: rows / batches,
        relay_cpu: value("relay CPU per 1,000 rows")?,
    };
    eprintln!(
        "    {label}: {rows_per_second:.0} rows/s; per 1,000 rows: wall {:.1} ms, claim {:.1}, transform {:.1}, produce {:.1}, mark {:.1} (batch ms)",
        breakdown.wall, stages[0], stages[1], stages[2], stages[3]
    );
    drop(broker);
    Ok(breakdown)
}

/// Colours of the stages, then of the wall-clock bar.
const COLOURS: [&str; 5] = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#9c9c9c"];

/// Horizontal bars: per binary, the stages stacked (batch time per 1,000 rows) and under them
/// the wall-clock time per 1,000 rows.
fn svg(breakdowns: &[Breakdown]) -> String {
    let max = breakdowns
        .iter()
        .map(|b| b.stages.iter().sum::<f64>().max(b.wall))
        .fold(1.0, f64::max);
    let (left, width, bar, gap) = (190.0, 560.0, 22.0, 18.0);
    let scale = width / max;
    let group = 2.0 * bar + gap;
    let height = 70.0 + group * breakdowns.len() as f64 + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="sans-serif" font-size="12">"#,
        w = left + width + 90.0
    );
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="14">Drain time per 1,000 rows: batch time by stage (stacked) and wall clock</text>"#
    );
    // Legend.
    let mut x = 10.0;
    for (i, (stage, _)) in STAGES.iter().chain([("wall clock", "")].iter()).enumerate() {
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="32" width="12" height="12" fill="{}"/><text x="{}" y="42">{stage}</text>"#,
            COLOURS[i],
            x + 16.0
        );
        x += 30.0 + 7.0 * stage.len() as f64;
    }
    for (n, b) in breakdowns.iter().enumerate() {
        let y = 60.0 + group * n as f64;
        let _ = writeln!(
            out,
            r#"<text x="10" y="{}">{} ({:.0} rows/s)</text>"#,
            y + bar * 0.7,
            b.label,
            b.rows_per_second
        );
        let mut x = left;
        for (i, ms) in b.stages.iter().enumerate() {
            let w = ms * scale;
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{bar}" fill="{}"><title>{}: {ms:.1} ms</title></rect>"#,
                COLOURS[i], STAGES[i].0
            );
            x += w;
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}">{:.1} ms</text>"#,
            x + 4.0,
            y + bar * 0.7,
            b.stages.iter().sum::<f64>()
        );
        let wy = y + bar;
        let ww = b.wall * scale;
        let _ = writeln!(
            out,
            r#"<rect x="{left}" y="{wy:.1}" width="{ww:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}">{:.1} ms wall</text>"#,
            bar * 0.6,
            COLOURS[4],
            left + ww + 4.0,
            wy + bar * 0.5,
            b.wall
        );
    }
    let _ = writeln!(out, "</svg>");
    out
}
