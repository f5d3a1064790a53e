//! Printing `sluice status` and `sluice config check`.

use std::path::Path;
use std::process::ExitCode;

use sluice::app::status::{self, StatusSource};
use sluice::config::Config;
use sluice::secret::scrub;

pub(crate) async fn status(config: &Config, json: bool) -> anyhow::Result<()> {
    let (report, source) = status::status(config).await?;
    // Scrubbed like every output: a tenant's state may quote a plugin's error text.
    if json {
        println!("{}", scrub(&serde_json::to_string_pretty(&report)?));
    } else {
        print!("{}", scrub(&status::render_table(&report)));
    }
    match source {
        StatusSource::DatabaseAndRelay(addr) => {
            eprintln!("backlog from the database; tenant states from the relay at {addr}")
        }
        StatusSource::Database { relay: None } => eprintln!(
            "backlog from the database; no [telemetry] listen, so no relay was asked for tenant states"
        ),
        StatusSource::Database { relay: Some(why) } => {
            eprintln!("backlog from the database; no relay answered for tenant states ({why})")
        }
    }
    Ok(())
}

/// Prints each problem (`<file>: <key>: <message>`), then each warning (`<file>: warning:
/// <key>: <message>`), then `OK` when there is no problem; the counts on stderr. Warnings
/// alone exit 0.
pub(crate) async fn config_check(path: &Path, connect: bool) -> anyhow::Result<ExitCode> {
    let report = sluice::app::check::check(path, connect).await;
    let (problems, warnings) = (&report.problems, &report.warnings);
    for problem in problems {
        println!("{}: {}", path.display(), scrub(&problem.to_string()));
    }
    for warning in warnings {
        println!(
            "{}: warning: {}",
            path.display(),
            scrub(&warning.to_string())
        );
    }
    let counts: Vec<String> = [
        count(problems.len(), "problem", "problems"),
        count(warnings.len(), "warning", "warnings"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !counts.is_empty() {
        eprintln!("{}", counts.join(", "));
    }
    if !problems.is_empty() {
        return Ok(ExitCode::FAILURE);
    }
    let what = if connect {
        "config, plugins, table and broker"
    } else {
        "config and plugins"
    };
    println!("{}: OK ({what})", path.display());
    Ok(ExitCode::SUCCESS)
}

/// `1 problem`, `2 problems`; nothing for none.
fn count(n: usize, one: &str, many: &str) -> Option<String> {
    match n {
        0 => None,
        1 => Some(format!("1 {one}")),
        n => Some(format!("{n} {many}")),
    }
}
