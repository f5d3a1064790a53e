//! The drain ratios `all` prints after the drains: the WASM relay against the database's own
//! ceiling, the naive relay and the native router.

use super::{THROUGHPUT, db_drain, drain, naive, sql_ceiling};
use crate::report::{Figure, Report};
use sluice_testkit::Database;

pub(super) const NAME: &str = "ratios";
/// The per-database ratios' label.
pub(super) const DATABASES: &str = "database-ratios";

/// drain-wasm / sql-ceiling (target ≥ 0.75), / naive (≥ 30), / drain-native (≥ 0.95); a
/// ratio whose inputs were not measured is left out.
pub(super) fn figures(report: &Report) -> anyhow::Result<Vec<Figure>> {
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

/// Each database's drain-native against its own SQL-only ceiling: how much of what the
/// database allows the relay uses. No target: the ceilings differ by database.
pub(super) fn databases(report: &Report) -> anyhow::Result<Vec<Figure>> {
    let mut figures = Vec::new();
    for database in Database::ALL {
        let drain = match database {
            Database::Postgres => drain::Routing::Native.label().to_owned(),
            other => db_drain::label(other),
        };
        let ceiling = sql_ceiling::label(database);
        match (
            report.value(&drain, THROUGHPUT),
            report.value(&ceiling, THROUGHPUT),
        ) {
            (Some(d), Some(c)) if c > 0.0 => figures.push(Figure::new(
                DATABASES,
                &format!("{drain} / {ceiling}"),
                d / c,
                "×",
            )),
            _ => eprintln!("no ratio {drain} / {ceiling}: not both measured"),
        }
    }
    Ok(figures)
}
