//! The command line's shape: every command, argument and its help text.

use sluice::encoding::Format;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::plugin::scaffold::Language;
use sluice::app::admin::Target;
use sluice::app::logging::LogFormat;
use sluice::app::replay::{DEFAULT_RATE, TimeArg};
use sluice::store::{DEFAULT_CHANNEL, PartitionInterval};

/// What `sluice --help` ends with: the six commands operators run most, as they run them.
const EXAMPLES: &str = "\
Examples:
  sluice migrate --config /etc/sluice/sluice.toml
      Create the outbox table, or complete and check yours (as the table's
      owner, before the relays of a new version start)
  sluice config check --config /etc/sluice/sluice.toml --connect
      Every problem of a config, plugins loaded, table and broker asked
      (exit 1 on a problem): in CI and before each deploy
  sluice run --config /etc/sluice/sluice.toml
      Relay until SIGTERM (under systemd: systemctl start sluice)
  sluice status --config /etc/sluice/sluice.toml
      The slowest tenants first: backlog, oldest due row, dead rows, state
  sluice dead replay --config /etc/sluice/sluice.toml --tenant acme
      Make a tenant's dead-lettered rows due again (see sluice dead list)
  sluice replay --config /etc/sluice/sluice.toml --since 2h --rate 500
      Publish the rows sent in the last two hours again (mark = published_at)

More: sluice COMMAND --help, man sluice, docs/operations.md";

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Transactional outbox relay: PostgreSQL, MySQL/MariaDB or SQLite → WebAssembly plugin → Kafka",
    after_help = EXAMPLES
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as text for people, or one JSON object per line for log collectors.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "SLUICE_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormatArg,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(arg: LogFormatArg) -> Self {
        match arg {
            LogFormatArg::Text => Self::Text,
            LogFormatArg::Json => Self::Json,
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Create the outbox table, or upgrade and check one the application created (idempotent).
    Migrate {
        /// The database, the table and its `[database.columns]`: from a config file, or
        /// `--database-url URL [--table outbox]` for Sluice's own column names.
        #[command(flatten)]
        target: TableTarget,
        /// PostgreSQL: also install a statement-level trigger that NOTIFYs on every insert (costs
        /// inserting transactions a database-wide lock at commit; see docs/operations.md).
        #[arg(long, conflicts_with = "drop_notify_trigger")]
        notify_trigger: bool,
        /// Channel the trigger notifies (set `relay.notify_channel` to the same name).
        #[arg(long, default_value = DEFAULT_CHANNEL)]
        notify_channel: String,
        /// Remove the NOTIFY trigger installed by --notify-trigger.
        #[arg(long)]
        drop_notify_trigger: bool,
        /// PostgreSQL: create the table partitioned by created_at, one partition per UTC day
        /// or hour (`daily` or `hourly`), with a DEFAULT partition and partitions made ahead
        /// (the relay's pruner keeps making them; see docs/operations.md).
        #[arg(long, value_name = "daily|hourly")]
        partitioned: Option<PartitionInterval>,
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
    /// Backlog, oldest due row, dead rows, state and plugin per tenant: from the database, and
    /// from a running relay's /status when `[telemetry] listen` names one that answers.
    Status {
        #[arg(long, short)]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Ask the running relay at `[telemetry] listen` to read its configuration and plugins
    /// again and apply what changed (needs `[telemetry] reload = true` and its credentials):
    /// for images without a shell or `kill`. Prints what changed; exit 2 when a part did not
    /// apply.
    Reload {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check a configuration file.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
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
    /// Publish sent rows again (relay.mark = "published_at"): the rows sent in a time window
    /// (or listed by id) are made due again, spread out by --rate, so the running relays send
    /// them beside live rows, every message with a `sluice-replay` header. Counts first and asks
    /// (unless --yes); needs only the database, not the relay's host.
    Replay {
        #[command(flatten)]
        target: TableTarget,
        #[command(flatten)]
        args: ReplayArgs,
    },
    /// Print a shell completion script, e.g. `sluice completions bash >
    /// ~/.local/share/bash-completion/completions/sluice` (the Debian package installs those
    /// for bash, zsh and fish).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page sluice(1) (`sluice man | man -l -`), or with --out-dir write it and
    /// one page per command (sluice-run(1), sluice-config-check(1), …) into a directory.
    Man {
        /// Write every page here as NAME.1 instead of printing sluice(1).
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

/// Which outbox table: from a config file, or from a URL and table name.
#[derive(clap::Args)]
pub(crate) struct TableTarget {
    /// Take database.url (or SLUICE_DATABASE_URL), database.table and [database.columns] from
    /// this config file.
    #[arg(long, short, global = true)]
    pub config: Option<PathBuf>,
    /// Database URL: postgres://127.0.0.1:5432/app, mysql://user@127.0.0.1:3306/app or
    /// sqlite:///path/app.db [env: SLUICE_DATABASE_URL]
    #[arg(long, global = true, conflicts_with = "config")]
    pub database_url: Option<String>,
    /// Outbox table name (`table` or `schema.table`), with Sluice's own column names
    /// [default: outbox]
    #[arg(long, global = true, conflicts_with = "config")]
    pub table: Option<String>,
}

impl TableTarget {
    pub(crate) fn target(&self) -> Target<'_> {
        match &self.config {
            Some(path) => Target::Config(path),
            None => Target::Url {
                url: self.database_url.clone(),
                table: self.table.as_deref(),
            },
        }
    }
}

/// `sluice replay`'s selection, pace and safety switches.
#[derive(clap::Args)]
pub(crate) struct ReplayArgs {
    /// Rows sent (published_at) at or after TIME: an RFC 3339 time (2026-12-06T15:00:00Z,
    /// 2026-12-06T16:00:00+01:00) or a duration before now by the database's clock (2h, 30m,
    /// 1d). Required unless --ids is given.
    // Hyphen values reach the parser, which says what a TIME is (`-5m` is not one), instead
    // of clap's "unexpected argument '-5'".
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub since: Option<TimeArg>,
    /// Rows sent before TIME (same forms as --since) [default: now].
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub until: Option<TimeArg>,
    /// Only rows of this tenant (`default` for rows without tenant).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only rows of this aggregate type.
    #[arg(long)]
    pub aggregate_type: Option<String>,
    /// Only rows of this event type.
    #[arg(long)]
    pub event_type: Option<String>,
    /// Only the rows whose ids are listed in FILE, one per line (`-`: standard input); with
    /// --since/--until, those of them sent in the window.
    #[arg(long, value_name = "FILE")]
    pub ids: Option<PathBuf>,
    /// Rows made due per second: the relays send the replay at about this rate beside live
    /// rows.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RATE, allow_hyphen_values = true)]
    pub rate: NonZeroU32,
    /// Count the rows and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask before replaying (for scripts).
    #[arg(long, short)]
    pub yes: bool,
    /// Replay although relay.ordering = "key" (old events reach consumers after newer ones
    /// of their key), or without --config.
    #[arg(long)]
    pub force: bool,
    /// After making the rows due, show them being sent until none is left (Ctrl-C stops
    /// watching, not the replay).
    #[arg(long)]
    pub wait: bool,
}

#[derive(Subcommand)]
pub(crate) enum ConfigCommand {
    /// List every problem of a configuration (exit 1), or none (exit 0): keys and the rules
    /// between them, every plugin loads and accepts its tenant's config, allow-lists parse.
    Check {
        #[arg(long, short)]
        config: PathBuf,
        /// Also check the table's schema and that the broker answers.
        #[arg(long)]
        connect: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum DeadCommand {
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
pub(crate) enum PluginCommand {
    /// Create a plugin project (source, build script with the pinned toolchain, sample rows
    /// and their expected output, README) from the built-in templates.
    New {
        /// Plugin name: lowercase letters, digits and '-', starting with a letter.
        name: String,
        /// rust, python or js.
        #[arg(long, value_parser = parse_language)]
        lang: Language,
        /// Directory to create (must not exist) [default: ./NAME].
        #[arg(long, value_name = "DEST")]
        dir: Option<PathBuf>,
    },
    /// Validate a component against the sluice:plugin world and print its info(), its digest
    /// (to pin with `sha256 = "…"`) and, with trusted keys, its signer. FILE may be an
    /// `oci://host/repo:tag` reference: it is pulled as `sluice run` pulls it.
    Check {
        file: PathBuf,
        /// Take `[plugins] trusted_keys` and `[plugins.registries]` from this sluice.toml.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// A minisign public key (base64 line) the signature must be made with; repeatable.
        /// With one (or trusted_keys in --config), an unsigned or wrongly signed file fails.
        #[arg(long = "trusted-key", value_name = "KEY")]
        trusted_keys: Vec<String>,
    },
    /// Push a component to an OCI registry (one application/wasm layer, as `wkg oci push`
    /// does), with FILE.minisig as a signature layer when it exists; prints the manifest
    /// digest and the component's pin.
    Push {
        file: PathBuf,
        /// oci://host[:port]/repository:tag
        to: String,
        /// Take `[plugins.registries]` (credentials, plain_http, ca_location) from this
        /// sluice.toml.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Run rows (JSON lines with the outbox columns) through a plugin, on the relay's own code
    /// path, and print the messages; with --expect, compare them with a golden file (exit 3 on
    /// a difference). With --config sluice.toml --tenant T, run them as tenant T of that file
    /// (its plugin, config, allowed_topics and limits, as `sluice run` resolves them).
    Test {
        /// The plugin component (.wasm); with --tenant, replaces the tenant's plugin (its
        /// config and limits stay).
        #[arg(
            required_unless_present_any = ["builtin", "config"],
            conflicts_with = "builtin"
        )]
        file: Option<PathBuf>,
        /// A plugin built into Sluice instead of a file (e.g. route-by-aggregate).
        #[arg(long, value_name = "NAME")]
        builtin: Option<String>,
        /// JSON-lines file of rows, or `-` for standard input.
        #[arg(long)]
        input: PathBuf,
        /// Plugin config entry passed to `configure` (repeatable); with --tenant, added to
        /// (and overriding) the tenant's config.
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_pair)]
        set: Vec<(String, String)>,
        /// The sluice.toml to take --tenant from. (Deprecated: `--config KEY=VALUE` is the old
        /// spelling of `--set KEY=VALUE` and still works, with a warning.)
        #[arg(long, short, value_name = "SLUICE.TOML")]
        config: Vec<String>,
        /// Run every row as this tenant of --config: its [tenants.<name>] entry completed from
        /// [plugins.default] as `sluice run` does; a name without an entry runs
        /// [plugins.default].
        #[arg(long, value_name = "NAME", requires = "config")]
        tenant: Option<String>,
        /// Golden file: print nothing but a diff, and exit 3, if the output differs from it.
        #[arg(long, value_name = "FILE")]
        expect: Option<PathBuf>,
        /// The plugin's memory cap, as `memory_mb` in sluice.toml [default: 128].
        #[arg(long, value_name = "MIB")]
        memory_mb: Option<u64>,
        /// Wall-clock limit of one plugin call, as `call_timeout` in sluice.toml [default: 500ms].
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        call_timeout: Option<Duration>,
        /// Replace the instance between calls once its memory passes this share of
        /// --memory-mb, as `recycle_memory_percent` in sluice.toml (100: never) [default: 75].
        #[arg(long, value_name = "PERCENT")]
        recycle_memory_percent: Option<u8>,
        /// Rows per plugin call from the first row on: 1 calls `transform` row by row, more
        /// calls `transform-batch`. Default: as `sluice run` (row by row for 64 rows, then
        /// `transform-batch` with up to 64 rows).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
        batch_size: Option<u64>,
        #[command(flatten)]
        encoding: Box<EncodingArgs>,
    },
}

fn parse_language(s: &str) -> Result<Language, String> {
    s.parse()
}

pub(crate) fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// `plugin test`'s encoding flags (boxed in the command: they would make every other command
/// as large).
#[derive(Debug, clap::Args)]
pub(crate) struct EncodingArgs {
    /// Encode each message's value as `sluice run` does with `value_format` (avro,
    /// protobuf, json-schema; raw: as returned): against --value-schema FILE without a
    /// registry (schema id 0), else the --config file's [schema_registry].
    #[arg(long, value_name = "FORMAT")]
    pub value_format: Option<Format>,
    /// The schema file to encode the value with (Avro JSON, .proto text, JSON Schema).
    #[arg(long, value_name = "FILE")]
    pub value_schema: Option<PathBuf>,
    /// The record (Protobuf: message) full name, as `value_record`.
    #[arg(long, value_name = "NAME")]
    pub value_record: Option<String>,
    /// As --value-format, for the key.
    #[arg(long, value_name = "FORMAT")]
    pub key_format: Option<Format>,
    /// As --value-schema, for the key.
    #[arg(long, value_name = "FILE")]
    pub key_schema: Option<PathBuf>,
    /// As --value-record, for the key.
    #[arg(long, value_name = "NAME")]
    pub key_record: Option<String>,
}
