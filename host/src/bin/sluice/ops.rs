//! Printing `sluice status` and `sluice config check`.

use std::path::Path;
use std::process::ExitCode;

use sluice::app::status::{self, StatusSource};
use sluice::config::Config;

pub async fn status(config: &Config, json: bool) -> anyhow::Result<()> {
    let (report, source) = status::status(config).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", status::render_table(&report));
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

pub async fn config_check(path: &Path, connect: bool) -> anyhow::Result<ExitCode> {
    let problems = sluice::app::check::check(path, connect).await;
    if problems.is_empty() {
        let what = if connect {
            "config, plugins, table and broker"
        } else {
            "config and plugins"
        };
        println!("{}: OK ({what})", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    for problem in &problems {
        println!("{}: {problem}", path.display());
    }
    match problems.len() {
        1 => eprintln!("1 problem"),
        n => eprintln!("{n} problems"),
    }
    Ok(ExitCode::FAILURE)
}
