//! The `sluice` command line: parse arguments, load config, call into the library.

use std::io::{BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use sluice::config::{Config, DATABASE_URL_ENV, MarkMode, Retention, validate_channel};
use sluice::outbox::dead::ReplaySelection;
use sluice::outbox::{self, PgOutbox, StoreOptions, TableName, TableSpec, notify, prune};
use sluice::plugin::{PluginRouter, testbench};
use sluice::retry::RetryPolicy;
use sluice::sink::{KafkaSink, Sink};
use sluice::text::{MAX_LOGGED, bounded};
use sluice::{Relay, RelaySettings, RelayStats, progress, shutdown};

/// How often plugin files are checked for replacement.
const PLUGIN_WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// Longest the producer may take to deliver what is still queued at shutdown (capped by
/// `relay.shutdown_timeout`).
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(10);
/// How long exiting waits for blocking work still running: a plugin compile abandoned by a
/// stop during start-up, a metadata request. Neither holds anything that needs finishing.
const EXIT_GRACE: Duration = Duration::from_secs(1);

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Transactional outbox relay: PostgreSQL → WebAssembly plugin → Kafka"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the outbox table, or upgrade and check one the application created (idempotent).
    Migrate {
        /// The database, the table and its `[database.columns]`: from a config file, or
        /// `--database-url URL [--table outbox]` for Sluice's own column names.
        #[command(flatten)]
        target: TableTarget,
        /// Also install a statement-level trigger that NOTIFYs on every insert (costs
        /// inserting transactions a database-wide lock at commit; see docs/operations.md).
        #[arg(long, conflicts_with = "drop_notify_trigger")]
        notify_trigger: bool,
        /// Channel the trigger notifies (set `relay.notify_channel` to the same name).
        #[arg(long, default_value = notify::DEFAULT_CHANNEL)]
        notify_channel: String,
        /// Remove the NOTIFY trigger installed by --notify-trigger.
        #[arg(long)]
        drop_notify_trigger: bool,
    },
    /// Relay outbox rows to Kafka until SIGINT/SIGTERM.
    Run {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Relay every row that is due now, then exit: 0 when all were delivered, 2 when some
    /// failed (rescheduled or dead), 1 on error. Shows progress on a terminal.
    Drain {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Inspect or try out a plugin without a database or broker.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// List or replay dead-lettered rows.
    Dead {
        #[command(flatten)]
        target: TableTarget,
        #[command(subcommand)]
        command: DeadCommand,
    },
}

/// Which outbox table: from a config file, or from a URL and table name.
#[derive(clap::Args)]
struct TableTarget {
    /// Take database.url (or SLUICE_DATABASE_URL), database.table and [database.columns] from
    /// this config file.
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    /// PostgreSQL URL, e.g. postgres://127.0.0.1:5432/app [env: SLUICE_DATABASE_URL]
    #[arg(long, global = true, conflicts_with = "config")]
    database_url: Option<String>,
    /// Outbox table name (`table` or `schema.table`), with Sluice's own column names
    /// [default: outbox]
    #[arg(long, global = true, conflicts_with = "config")]
    table: Option<String>,
}

impl TableTarget {
    // SLUICE_DATABASE_URL is read here rather than by clap, so that it does not count as a
    // `--database-url` conflicting with `--config` (whose URL it overrides, as for `run`).
    fn resolve(&self) -> anyhow::Result<(String, TableSpec)> {
        if let Some(path) = &self.config {
            let config = Config::load(path)?;
            let spec = config.database.table_spec()?;
            return Ok((config.database_url().to_owned(), spec));
        }
        let Some(url) = self
            .database_url
            .clone()
            .or_else(|| std::env::var(DATABASE_URL_ENV).ok())
        else {
            bail!("give --config FILE or --database-url URL (or set {DATABASE_URL_ENV})");
        };
        let table =
            TableName::parse(self.table.as_deref().unwrap_or("outbox")).context("--table")?;
        Ok((url, TableSpec::new(table)))
    }
}

#[derive(Subcommand)]
enum DeadCommand {
    /// Print dead rows, oldest first.
    List {
        /// Only rows of this tenant (`default` for rows without tenant).
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Make dead rows due again, with attempts reset to 0.
    Replay {
        /// The row's id (an integer, or e.g. a uuid for such tables).
        #[arg(long, conflicts_with_all = ["tenant", "all"])]
        id: Option<String>,
        #[arg(long, conflicts_with = "all")]
        tenant: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Delete dead rows for good (in chunks), e.g. `--older-than 30d`.
    Purge {
        /// Only rows dead for at least this long ("0s" for all).
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// Only rows of this tenant (`default` for rows without tenant).
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Validate a component against the sluice:plugin world and print its info().
    Check { file: PathBuf },
    /// Run rows (JSON lines with the outbox columns) through a plugin and print the messages.
    Test {
        file: PathBuf,
        /// JSON-lines file of rows, or `-` for standard input.
        #[arg(long)]
        input: PathBuf,
        /// Plugin config entry passed to `configure` (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_pair)]
        config: Vec<(String, String)>,
    },
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not for log files and collectors.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Exit status of `sluice drain` when it finished but some rows failed.
const DRAIN_ROWS_FAILED: u8 = 2;

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
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
            runtime()?.block_on(migrate(&target, trigger)).map(ok)
        }
        Command::Run { config } => {
            let config = Config::load(&config)?;
            with_runtime(|rt| rt.block_on(relay(config)))?.map(ok)
        }
        Command::Drain { config } => {
            let config = Config::load(&config)?;
            with_runtime(|rt| rt.block_on(drain(config)))?
        }
        Command::Plugin { command } => plugin(command).map(ok),
        Command::Dead { target, command } => runtime()?.block_on(dead(target, command)).map(ok),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Runs `f` on a new runtime, then shuts the runtime down without waiting more than
/// [`EXIT_GRACE`] for blocking work that is still running.
fn with_runtime<R>(f: impl FnOnce(&tokio::runtime::Runtime) -> R) -> anyhow::Result<R> {
    let rt = runtime()?;
    let result = f(&rt);
    rt.shutdown_timeout(EXIT_GRACE);
    Ok(result)
}

/// What `sluice migrate` does with the NOTIFY trigger.
enum TriggerChange {
    Keep,
    Install(String),
    Drop,
}

async fn migrate(target: &TableTarget, trigger: TriggerChange) -> anyhow::Result<()> {
    let (url, spec) = target.resolve()?;
    let url = url.as_str();
    if let TriggerChange::Install(channel) = &trigger {
        validate_channel(channel)
            .map_err(anyhow::Error::msg)
            .context("--notify-channel")?;
    }
    let pool = outbox::connect(url, 1)
        .await
        .with_context(|| format!("cannot connect to the database at {}", redact(url)))?;
    let layout = outbox::migrate(&pool, &spec).await?;
    let table = spec.name;
    println!("outbox table {table} is ready ({})", layout.summary());
    match trigger {
        TriggerChange::Keep => {}
        TriggerChange::Install(channel) => {
            notify::install_trigger(&pool, &table, &channel).await?;
            println!(
                "NOTIFY trigger installed: every insert into {table} notifies channel {channel:?} \
                 (set relay.notify_channel = \"{channel}\")"
            );
        }
        TriggerChange::Drop => {
            notify::drop_trigger(&pool, &table).await?;
            println!("NOTIFY trigger of {table} removed");
        }
    }
    Ok(())
}

type PgRelay = Relay<PgOutbox, Arc<PluginRouter>, KafkaSink>;

/// Connects the database and the producer and wires the relay (shared by `run` and `drain`).
async fn assemble(config: &Config, router: Arc<PluginRouter>) -> anyhow::Result<Arc<PgRelay>> {
    let table = config.database.table_spec()?;
    let url = config.database_url();
    // One connection per worker's open batch, plus one for probes and maintenance.
    let connections = u32::try_from(config.relay.workers + 1).unwrap_or(u32::MAX);
    let pool = outbox::connect(url, connections)
        .await
        .with_context(|| format!("cannot connect to the database at {}", redact(url)))?;
    let options = StoreOptions {
        mark: config.relay.mark,
        ordering: config.relay.ordering,
        after_dead: config.relay.ordering_after_dead,
    };
    let store = PgOutbox::new(pool, table, options).await?;
    if let Some((key, value)) = config.weak_acks() {
        tracing::warn!(key, value = %value,
            "kafka acks weaker than \"all\" (allowed by relay.allow_weak_acks): a broker failure can lose messages of rows already marked sent");
    }
    let properties = config.kafka_properties();
    // Creating a producer starts librdkafka's threads: blocking work.
    let sink = tokio::task::spawn_blocking(move || KafkaSink::new(&properties))
        .await
        .context("creating the kafka producer")??;
    let settings = RelaySettings {
        batch_size: config.relay.batch_size,
        workers: config.relay.workers,
        min_poll_interval: config.relay.min_poll_interval,
        poll_interval: config.relay.poll_interval,
        retry: RetryPolicy::new(&config.relay.retry),
        dead_letter_topic: config.relay.retry.dead_letter_topic.clone(),
        shutdown_timeout: config.relay.shutdown_timeout,
    };
    Ok(Arc::new(Relay::new(store, router, sink, settings)))
}

/// Loads the plugins, then connects the database and the producer. Returns `None` when a stop
/// was requested meanwhile: start-up is abandoned before anything was claimed.
async fn start(
    config: &Config,
    stop: &mut shutdown::Shutdown,
) -> anyhow::Result<Option<(Arc<PluginRouter>, Arc<PgRelay>)>> {
    let starting = async {
        // Plugins first: a broken plugin file is reported without touching the database.
        // Compiling and instantiating are blocking work.
        let plugins = config.clone();
        let router = tokio::task::spawn_blocking(move || PluginRouter::from_config(&plugins))
            .await
            .context("loading plugins")??;
        let router = Arc::new(router);
        let relay = assemble(config, Arc::clone(&router)).await?;
        Ok::<_, anyhow::Error>((router, relay))
    };
    tokio::select! {
        started = starting => started.map(Some),
        _ = stop.recv() => Ok(None),
    }
}

/// Installs the SIGINT/SIGTERM handlers now, and triggers `stop` when one arrives.
fn stop_on_signal(trigger: shutdown::ShutdownTrigger, what: &'static str) -> anyhow::Result<()> {
    let mut signals =
        shutdown::Signals::install().context("cannot listen for SIGTERM and SIGINT")?;
    tokio::spawn(async move {
        let name = signals.recv().await;
        tracing::info!(signal = name, "stopping after the batch in hand ({what})");
        trigger.trigger();
    });
    Ok(())
}

/// Flushes the producer at exit. Everything queued belongs to a batch that was either
/// committed (and so acknowledged) or rolled back (and will be published again): a failed
/// flush loses nothing. Flushing blocks, and so does dropping the producer (the last handle of
/// `relay`): both happen on a blocking thread.
async fn flush(relay: Arc<PgRelay>, config: &Config) {
    let flush_for = SHUTDOWN_FLUSH.min(config.relay.shutdown_timeout);
    let flushed = tokio::task::spawn_blocking(move || {
        let flushed = relay.sink().flush(flush_for);
        drop(relay);
        flushed
    })
    .await;
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e,
            "producer still had undelivered messages at exit; their rows stay unsent"),
        Err(e) => tracing::warn!(error = %e, "flushing the producer failed"),
    }
}

fn log_stats(stats: &RelayStats, what: &str) {
    tracing::info!(
        batches = stats.batches,
        rows_sent = stats.rows_sent,
        rows_failed = stats.rows_failed,
        rows_dead = stats.rows_dead,
        rows_unsettled = stats.rows_unsettled,
        messages = stats.messages,
        "{what}"
    );
}

async fn relay(config: Config) -> anyhow::Result<()> {
    // Signals are handled from here on: a stop during start-up exits 0 like any other.
    let (trigger, mut stop) = shutdown::channel();
    stop_on_signal(trigger, "relay")?;
    tracing::info!(table = %config.database.table,
        "starting up: loading plugins, connecting to the database and the broker");
    let Some((router, relay)) = start(&config, &mut stop).await? else {
        tracing::info!("stop requested during start-up; exiting without relaying");
        return Ok(());
    };
    spawn_plugin_watcher(Arc::clone(&router));
    if let Some(channel) = &config.relay.notify_channel {
        notify::spawn_listener(
            config.database_url().to_owned(),
            channel.clone(),
            relay.pacer(),
            stop.clone(),
        );
    }
    if let (MarkMode::PublishedAt, Retention::Keep(retention)) =
        (config.relay.mark, config.relay.retention)
    {
        let table = config.database.table_spec()?;
        let pool = outbox::connect(config.database_url(), 1).await?;
        prune::spawn_pruner(
            pool,
            table,
            retention,
            config.relay.prune_interval,
            stop.clone(),
        );
    }
    tracing::info!(
        table = %config.database.table,
        batch_size = config.relay.batch_size,
        workers = config.relay.workers,
        notify_channel = config.relay.notify_channel.as_deref().unwrap_or("(none)"),
        "relay started"
    );
    let ran = relay.run(stop).await;
    let stats = relay.counters().snapshot();
    flush(relay, &config).await;
    log_stats(&stats, "relay stopped");
    // A supervisor must restart a relay whose workers died: exit non-zero.
    ran.context("the relay stopped without being asked to")?;
    Ok(())
}

async fn drain(config: Config) -> anyhow::Result<ExitCode> {
    let (trigger, mut stop) = shutdown::channel();
    stop_on_signal(trigger, "drain")?;
    let Some((_router, relay)) = start(&config, &mut stop).await? else {
        bail!("drain interrupted during start-up; nothing was relayed");
    };
    let store_view = relay_backlog(&config).await?;
    let before = store_view.backlog().await?;
    tracing::info!(table = %config.database.table, due = before.due, "draining");
    let (progress_done, progress_stop) = shutdown::channel();
    let progress = tokio::spawn(progress::report(
        relay.counters(),
        u64::try_from(before.due).unwrap_or(0),
        progress_stop,
    ));
    let drained = relay.drain(stop.clone()).await;
    progress_done.trigger();
    let _ = progress.await;
    let stats = relay.counters().snapshot();
    flush(relay, &config).await;
    let after = store_view.backlog().await?;
    log_stats(&stats, "drain finished");
    eprintln!(
        "drained: {} rows sent, {} failed ({} dead); left unsent: {} due, {} waiting for a retry, {} dead",
        stats.rows_sent, stats.rows_failed, stats.rows_dead, after.due, after.waiting, after.dead
    );
    drained.context("the drain stopped on a failure")?;
    if stop.is_shutdown() {
        bail!("drain interrupted; {} rows are still due", after.due);
    }
    Ok(if stats.rows_failed > 0 || stats.rows_unsettled > 0 {
        ExitCode::from(DRAIN_ROWS_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

/// A second handle on the outbox for counting rows (the relay owns its own).
async fn relay_backlog(config: &Config) -> anyhow::Result<PgOutbox> {
    let table = config.database.table_spec()?;
    let pool = outbox::connect(config.database_url(), 1).await?;
    Ok(PgOutbox::new(pool, table, StoreOptions::default()).await?)
}

/// Reloads replaced plugin files (checked every [`PLUGIN_WATCH_INTERVAL`]) and all plugin
/// files on SIGHUP.
fn spawn_plugin_watcher(router: Arc<PluginRouter>) {
    tokio::spawn(async move {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; plugin files are still watched");
                None
            }
        };
        let mut tick = tokio::time::interval(PLUGIN_WATCH_INTERVAL);
        loop {
            let force = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            };
            if force {
                tracing::info!("SIGHUP: reloading plugins");
            }
            let router = Arc::clone(&router);
            // Compiling and instantiating are blocking work.
            let _ = tokio::task::spawn_blocking(move || router.reload(force)).await;
        }
    });
}

fn plugin(command: PluginCommand) -> anyhow::Result<()> {
    match command {
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
            Ok(())
        }
        PluginCommand::Test {
            file,
            input,
            config,
        } => {
            let stdout = std::io::stdout();
            let summary = if input.as_os_str() == "-" {
                testbench::run(&file, &config, std::io::stdin().lock(), stdout.lock())?
            } else {
                let f = std::fs::File::open(&input)
                    .with_context(|| format!("cannot open --input {}", input.display()))?;
                testbench::run(&file, &config, BufReader::new(f), stdout.lock())?
            };
            std::io::stdout().flush()?;
            eprintln!(
                "{} rows, {} messages, {} failed rows, {} invalid lines",
                summary.rows, summary.messages, summary.failed_rows, summary.invalid_lines
            );
            if summary.invalid_lines > 0 {
                bail!("{} input lines were not valid rows", summary.invalid_lines);
            }
            Ok(())
        }
    }
}

async fn dead(target: TableTarget, command: DeadCommand) -> anyhow::Result<()> {
    let (url, table) = target.resolve()?;
    let pool = outbox::connect(&url, 1)
        .await
        .with_context(|| format!("cannot connect to the database at {}", redact(&url)))?;
    match command {
        DeadCommand::List { tenant, limit } => {
            let rows = outbox::dead::list(&pool, &table, tenant.as_deref(), limit).await?;
            // The columns are the application's text: printed escaped and bounded.
            let safe = |text: &str| bounded(text, MAX_LOGGED).into_owned();
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "id\ttenant\taggregate\tevent_type\tattempts\tdead_at\tlast_error"
            )?;
            for r in &rows {
                writeln!(
                    out,
                    "{}\t{}\t{}/{}\t{}\t{}\t{}\t{}",
                    safe(&r.id.to_string()),
                    safe(r.tenant.as_deref().unwrap_or("default")),
                    safe(&r.aggregate_type),
                    safe(&r.aggregate_id),
                    safe(&r.event_type),
                    r.attempts,
                    r.dead_at.to_rfc3339(),
                    safe(r.last_error.as_deref().unwrap_or_default()),
                )?;
            }
            eprintln!("{} dead rows", rows.len());
        }
        DeadCommand::Replay { id, tenant, all } => {
            let selection = match (id, tenant, all) {
                (Some(id), _, _) => ReplaySelection::Id(id),
                (None, Some(t), _) => ReplaySelection::Tenant(t),
                (None, None, true) => ReplaySelection::All,
                (None, None, false) => bail!("give --id ID, --tenant T or --all"),
            };
            let n = outbox::dead::replay(&pool, &table, &selection).await?;
            println!("{n} dead rows are due again");
        }
        DeadCommand::Purge { older_than, tenant } => {
            let n = outbox::dead::purge(&pool, &table, older_than, tenant.as_deref()).await?;
            println!("{n} dead rows purged");
        }
    }
    Ok(())
}

/// Hides the password of a database URL in messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}
