//! The drain ratios `all` prints after the drains: the WASM relay against the database's own
//! ceiling, the naive relay and the native router.

use super::{THROUGHPUT, drain, naive, sql_ceiling};
use crate::report::{Figure, Report};

pub const NAME: &str = "ratios";

/// drain-wasm / sql-ceiling (target ≥ 0.75), / naive (≥ 30), / drain-native (≥ 0.95); a
/// ratio whose inputs were not measured is left out.
pub fn figures(report: &Report) -> anyhow::Result<Vec<Figure>> {
    let wasm_label = drain::Routing::Wasm.label();
    let Some(wasm) = report.value(wasm_label, THROUGHPUT) else {
        eprintln!("no ratios: {wasm_label} was not measured");
        return Ok(Vec::new());
    };
    let against = [
        (sql_ceiling::NAME, 0.75),
        (naive::NAME, 30.0),
        (drain::Routing::Native.label(), 0.95),
    ];
    let mut figures = Vec::new();
    for (other, target) in against {
        match report.value(other, THROUGHPUT) {
            Some(base) if base > 0.0 => figures.push(
                Figure::new(NAME, &format!("{wasm_label} / {other}"), wasm / base, "×")
                    .at_least(target),
            ),
            _ => eprintln!("no ratio {wasm_label} / {other}: {other} was not measured"),
        }
    }
    Ok(figures)
}
