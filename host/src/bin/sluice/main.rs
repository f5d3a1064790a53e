//! The `sluice` command line: parse arguments, call into the library ([`sluice::app`]), print.

mod cli;
mod ops;
mod print;

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use cli::{Cli, Command, ConfigCommand, DeadCommand, PluginCommand};
use sluice::app::admin::{self, TriggerChange};
use sluice::config::Config;
use sluice::plugin::PluginSource;
use sluice::plugin::{scaffold, testbench};
use sluice::shutdown::{self, Signals};
use sluice::store::{OutboxStore, ReplaySelection};

/// How long exiting waits for blocking work still running: a plugin compile abandoned by a
/// stop during start-up, a metadata request. Neither holds anything that needs finishing.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// Exit status of `sluice drain` when it finished but some rows failed.
const DRAIN_ROWS_FAILED: u8 = 2;
/// Exit status of `sluice plugin test --expect` when the output differs from the golden file
/// (1 is any error, 2 a usage error).
const EXPECT_DIFFERS: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    sluice::app::logging::init(cli.log_format.into());
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let ok = |()| ExitCode::SUCCESS;
    match cli.command {
        Command::Migrate {
            target,
            notify_trigger,
            notify_channel,
            drop_notify_trigger,
        } => {
            let trigger = match (notify_trigger, drop_notify_trigger) {
                (true, _) => TriggerChange::Install(notify_channel),
                (false, true) => TriggerChange::Drop,
                (false, false) => TriggerChange::Keep,
            };
            let migrated = on_runtime(admin::migrate(&target.target(), &trigger))?;
            print::migrated(&migrated, &trigger);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { config } => {
            let config = Config::load(&config)?;
            on_runtime(async { sluice::app::run(config, stop_on_signal("relay")?).await }).map(ok)
        }
        Command::Drain { config } => {
            let config = Config::load(&config)?;
            let report =
                on_runtime(async { sluice::app::drain(config, stop_on_signal("drain")?).await })?;
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
        Command::Config {
            command: ConfigCommand::Check { config, connect },
        } => on_runtime(ops::config_check(&config, connect)),
        Command::Plugin { command } => plugin(command),
        Command::Dead { target, command } => on_runtime(dead(target.target(), command)).map(ok),
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

fn plugin(command: PluginCommand) -> anyhow::Result<ExitCode> {
    match command {
        PluginCommand::New { name, lang, dir } => {
            let dest = dir.unwrap_or_else(|| PathBuf::from(&name));
            scaffold::create(&name, lang, &dest)?;
            println!(
                "created {} ({lang} plugin {name}); next: {}/build.sh, then see {}/README.md",
                dest.display(),
                dest.display(),
                dest.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Check { file } => {
            let info = testbench::check(&file)?;
            println!(
                "{}: OK (exports sluice:plugin/transformer@0.1.0)",
                file.display()
            );
            println!("name:    {}", info.name);
            println!("version: {}", info.version);
            if let Some(schema) = info.config_schema {
                println!("config schema: {schema}");
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Test {
            file,
            builtin,
            input,
            config,
            expect,
            memory_mb,
            call_timeout,
            recycle_memory_percent,
            batch_size,
        } => {
            let source = match (file, builtin) {
                (Some(file), _) => PluginSource::Wasm(file),
                (None, Some(name)) => PluginSource::Builtin(name),
                (None, None) => bail!("give a plugin file or --builtin NAME"),
            };
            let options = testbench::TestOptions {
                source,
                config,
                memory_mb,
                call_timeout,
                recycle_memory_percent,
                batch_size: batch_size.and_then(|n| usize::try_from(n).ok()),
            };
            plugin_test(&options, &input, expect.as_deref())
        }
    }
}

/// `sluice plugin test`: the messages on stdout, or with `expect` only the diff from it.
fn plugin_test(
    options: &testbench::TestOptions,
    input: &Path,
    expect: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let expected = match expect {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --expect {}", path.display()))?,
        ),
        None => None,
    };
    let mut captured = Vec::new();
    let summary = {
        let stdout = std::io::stdout();
        let out: Box<dyn Write + '_> = match expected {
            Some(_) => Box::new(&mut captured),
            None => Box::new(stdout.lock()),
        };
        if input.as_os_str() == "-" {
            testbench::run(options, std::io::stdin().lock(), out)?
        } else {
            let f = std::fs::File::open(input)
                .with_context(|| format!("cannot open --input {}", input.display()))?;
            testbench::run(options, BufReader::new(f), out)?
        }
    };
    std::io::stdout().flush()?;
    eprintln!(
        "{} rows, {} messages, {} failed rows, {} invalid lines",
        summary.rows, summary.messages, summary.failed_rows, summary.invalid_lines
    );
    if summary.invalid_lines > 0 {
        bail!("{} input lines were not valid rows", summary.invalid_lines);
    }
    let (Some(expected), Some(path)) = (expected, expect) else {
        return Ok(ExitCode::SUCCESS);
    };
    let actual = String::from_utf8_lossy(&captured);
    match testbench::diff_expected(&expected, &actual, &path.display().to_string()) {
        None => {
            eprintln!("output matches {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Some(diff) => {
            print!("{diff}");
            std::io::stdout().flush()?;
            eprintln!(
                "output differs from {} (- expected, + plugin output)",
                path.display()
            );
            Ok(ExitCode::from(EXPECT_DIFFERS))
        }
    }
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
