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

/// `sluice reload`: the relay's answer on stdout; exit 0 when everything applied, 2 when a
/// part did not (the answer says which and why).
pub(crate) async fn reload(config: &Config) -> anyhow::Result<ExitCode> {
    let (code, body) = status::ask_reload(config).await?;
    match code {
        200 | 422 => {
            let pretty = serde_json::from_str::<serde_json::Value>(&body)
                .and_then(|v| serde_json::to_string_pretty(&v))
                .unwrap_or(body);
            println!("{}", scrub(&pretty));
            Ok(if code == 200 {
                ExitCode::SUCCESS
            } else {
                eprintln!("reloaded, but not everything applied: see problems and tenants.refused");
                ExitCode::from(2)
            })
        }
        401 => anyhow::bail!(
            "the relay refused the credentials: give this config the relay's [telemetry] bearer_token or basic_auth_*"
        ),
        404 => {
            anyhow::bail!("the relay does not serve POST /reload: set [telemetry] reload = true")
        }
        other => anyhow::bail!("the relay answered {other}: {}", scrub(&body)),
    }
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
