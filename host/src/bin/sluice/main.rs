//! The `sluice` command line: parse arguments, call into the library ([`sluice::app`]), print;
//! and what only the command line needs (`sluice drain`'s progress, `sluice plugin new|test`).

mod cli;
mod manuals;
mod ops;
mod plugin;
mod print;
mod progress;
mod replay;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use cli::{Cli, Command, ConfigCommand, DeadCommand};
use sluice::app::admin::{self, TriggerChange};
use sluice::config::Config;
use sluice::shutdown::{self, Signals};
use sluice::store::{OutboxStore, ReplaySelection};

/// How long exiting waits for blocking work still running: a plugin compile abandoned by a
/// stop during start-up, a metadata request. Neither holds anything that needs finishing.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// Exit status of `sluice drain` when it finished but some rows failed.
const DRAIN_ROWS_FAILED: u8 = 2;
fn main() -> ExitCode {
    let cli = Cli::parse();
    sluice::secret::install_panic_hook();
    // `config check` reports what it finds as its list of problems: the log lines of the work
    // it does (a plugin that cannot start, a broker that does not answer) would say it twice.
    if !matches!(cli.command, Command::Config { .. }) {
        sluice::app::logging::init(cli.log_format.into());
    }
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", sluice::secret::scrub(&error_chain(&e)));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes (see [`sluice::text::error_chain`]).
fn error_chain(e: &anyhow::Error) -> String {
    sluice::text::error_chain(e.as_ref())
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let ok = |()| ExitCode::SUCCESS;
    match cli.command {
        Command::Migrate {
            target,
            notify_trigger,
            notify_channel,
            drop_notify_trigger,
            partitioned,
        } => {
            let trigger = match (notify_trigger, drop_notify_trigger) {
                (true, _) => TriggerChange::Install(notify_channel),
                (false, true) => TriggerChange::Drop,
                (false, false) => TriggerChange::Keep,
            };
            let migrated = on_runtime(admin::migrate(&target.target(), &trigger, partitioned))?;
            print::migrated(&migrated, &trigger);
            if let Some(interval) = partitioned {
                println!(
                    "partitioned by created_at, {interval}: a DEFAULT partition and {} partitions \
                     ahead; a relay's pruner keeps making them",
                    interval.ahead()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { config } => {
            let config = Config::load(&config)?;
            on_runtime(async { sluice::app::run(config, stop_on_signal("relay")?).await }).map(ok)
        }
        Command::Drain { config } => {
            let config = Config::load(&config)?;
            let report = on_runtime(async {
                sluice::app::drain(config, stop_on_signal("drain")?, progress::report).await
            })?;
            let (s, after) = (&report.stats, &report.after);
            eprintln!(
                "drained: {} rows sent, {} failed ({} dead); left unsent: {} due, {} waiting for a retry, {} dead",
                s.rows_sent, s.rows_failed, s.rows_dead, after.due, after.waiting, after.dead
            );
            Ok(match report.all_delivered() {
                true => ExitCode::SUCCESS,
                false => ExitCode::from(DRAIN_ROWS_FAILED),
            })
        }
        Command::Status { config, json } => {
            let config = Config::load(&config)?;
            on_runtime(ops::status(&config, json)).map(ok)
        }
        Command::Reload { config } => {
            // Only `[telemetry]` is needed to reach the relay: a problem elsewhere (a tenant
            // file that does not check) is what the relay's answer reports.
            let config = Config::load_unchecked(&config)?;
            let problems: Vec<String> = config
                .telemetry
                .problems()
                .iter()
                .map(ToString::to_string)
                .collect();
            if !problems.is_empty() {
                anyhow::bail!("{}", problems.join("; "));
            }
            on_runtime(ops::reload(&config))
        }
        Command::Config {
            command: ConfigCommand::Check { config, connect },
        } => on_runtime(ops::config_check(&config, connect)),
        Command::Plugin { command } => plugin::run(command),
        Command::Dead { target, command } => on_runtime(dead(target.target(), command)).map(ok),
        Command::Replay { target, args } => on_runtime(replay::run(target.target(), args)).map(ok),
        Command::Completions { shell } => {
            manuals::completions(shell, &mut std::io::stdout()).map(ok)
        }
        Command::Man { out_dir } => match out_dir {
            Some(dir) => manuals::write_man_pages(&dir).map(ok),
            None => manuals::man_page(&mut std::io::stdout()).map(ok),
        },
    }
}

/// Runs `work` on a new runtime, then shuts the runtime down without waiting more than
/// [`EXIT_GRACE`] for blocking work that is still running.
fn on_runtime<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = rt.block_on(work);
    rt.shutdown_timeout(EXIT_GRACE);
    result
}

/// Installs the SIGINT/SIGTERM handlers now (a stop during start-up counts too) and returns
/// the stop they trigger.
fn stop_on_signal(what: &'static str) -> anyhow::Result<shutdown::Shutdown> {
    let mut signals = Signals::install().context("cannot listen for SIGTERM and SIGINT")?;
    let (trigger, stop) = shutdown::channel();
    tokio::spawn(async move {
        let name = signals.recv().await;
        tracing::info!(signal = name, "stopping after the batch in hand ({what})");
        trigger.trigger();
    });
    Ok(stop)
}

async fn dead(target: admin::Target<'_>, command: DeadCommand) -> anyhow::Result<()> {
    let store = target.open().await?;
    match command {
        DeadCommand::List { tenant, limit } => {
            let rows = store.dead_rows(tenant.as_deref(), limit).await?;
            print::dead_rows(&rows)?;
            eprintln!("{} dead rows", rows.len());
        }
        DeadCommand::Replay { id, tenant, all } => {
            let selection = match (id, tenant, all) {
                (Some(id), _, _) => ReplaySelection::Id(id),
                (None, Some(t), _) => ReplaySelection::Tenant(t),
                (None, None, true) => ReplaySelection::All,
                (None, None, false) => bail!("give --id ID, --tenant T or --all"),
            };
            let n = store.replay_dead(&selection).await?;
            println!("{n} dead rows are due again");
        }
        DeadCommand::Purge { older_than, tenant } => {
            let n = store.purge_dead(older_than, tenant.as_deref()).await?;
            println!("{n} dead rows purged");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect: {source}")]
    struct Wrapping {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_already_says_is_not_repeated() {
        let io = std::io::Error::other("certificate verify failed (hostname mismatch)");
        let e = anyhow::Error::new(Wrapping { source: io }).context("opening the store");
        assert_eq!(
            error_chain(&e),
            "opening the store: cannot connect: certificate verify failed (hostname mismatch)"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&plain), "outer: inner");
    }
}
