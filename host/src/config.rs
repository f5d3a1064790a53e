//! The `sluice.toml` configuration: its shape, defaults, validation and environment overrides.
//!
//! Unknown keys are errors (a typo must not silently fall back to a default), and every error
//! names the file and the key that is wrong.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::outbox::TableName;

/// Environment variable that overrides `database.url`, so secrets can stay out of the file.
pub const DATABASE_URL_ENV: &str = "SLUICE_DATABASE_URL";
/// Environment variable that overrides `plugins.cache_dir` (also for `sluice plugin …`).
pub const PLUGIN_CACHE_ENV: &str = "SLUICE_PLUGIN_CACHE_DIR";

/// The compile cache directory: the environment override, else `configured`, else the user's
/// cache directory. An empty path disables caching.
pub fn plugin_cache_dir(configured: Option<&Path>) -> Option<PathBuf> {
    let chosen = match std::env::var_os(PLUGIN_CACHE_ENV) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => configured.map(Path::to_path_buf),
    };
    match chosen {
        Some(dir) if dir.as_os_str().is_empty() => None,
        Some(dir) => Some(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("sluice").join("plugins")),
    }
}

/// Rows claimed per transaction. Large enough to amortise the claim/mark round trips, small
/// enough that a batch's transaction stays short.
pub const DEFAULT_BATCH_SIZE: usize = 500;
/// Longest wait between polls of an empty outbox: the idle load is one cheap query per
/// interval, and a row inserted into an idle outbox (without NOTIFY) waits at most this long.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Wait after a poll that found some rows but not a full batch, and the first step of the
/// back-off after an empty poll. Measured (docs/benchmarks.md): 5 ms keeps the insert →
/// publish latency at 1,000 rows/s well under 10 ms at p50 while an idle relay backs off to
/// `poll_interval` within about 2.5 s.
pub const DEFAULT_MIN_POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Concurrent batches per process: while one batch waits for its acknowledgements or its
/// commit, the next is already being claimed and transformed. Two fill both cores of a small
/// machine; more mostly adds row-lock and connection overhead (docs/benchmarks.md).
pub const DEFAULT_WORKERS: usize = 2;
/// In `mark = "published_at"` mode, sent rows older than this are deleted by the pruner.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often the pruner looks for sent rows past `relay.retention`.
pub const DEFAULT_PRUNE_INTERVAL: Duration = Duration::from_secs(60);
/// Wall-clock budget for one plugin call (and one instantiation). A Rust `transform` takes
/// microseconds; this only stops runaway guests.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(500);
/// Linear-memory cap per tenant instance. Python/JS guests need tens of MiB at start-up.
pub const DEFAULT_MEMORY_MB: u64 = 128;
/// How long the batch in hand may take after SIGTERM before it is rolled back; covers the
/// producer's default `message.timeout.ms` of 30 s.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages one row may produce; more fails the row (a runaway fan-out must not flood Kafka).
pub const DEFAULT_MAX_OUTPUTS_PER_ROW: usize = 100;
/// Largest message (key + payload + headers) a plugin may produce: Kafka's own default
/// `message.max.bytes` is 1 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Headers one plugin message may carry (the host's own two come on top). Kafka sets no limit,
/// but each header costs the producer and every consumer an allocation.
pub const DEFAULT_MAX_HEADERS_PER_MESSAGE: usize = 100;
/// Bytes of messages one tenant's plugin may produce in one batch: rows past it wait for the
/// next batch, so a fan-out-heavy tenant cannot hold the relay's memory for everyone.
pub const DEFAULT_MAX_BATCH_OUTPUT_BYTES: usize = 64 * 1024 * 1024;
/// Live plugin instances kept for tenant values without a `[tenants.<name>]` entry (rows carry
/// free-form tenant values); the least recently used idle one is dropped beyond this.
pub const DEFAULT_MAX_UNCONFIGURED_INSTANCES: usize = 64;
/// Consecutive plugin failures after which a tenant is paused.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// How long a tripped tenant stays paused before one row is tried again.
pub const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(30);
/// First retry delay of a failed row.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Longest retry delay: a row keeps being retried at least this often until it is dead.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(300);
/// Growth of the retry delay per attempt.
pub const DEFAULT_RETRY_MULTIPLIER: f64 = 2.0;
/// Each delay is moved by up to ±20 % at random so rows that failed together do not retry in
/// lock-step.
pub const DEFAULT_RETRY_JITTER: f64 = 0.2;
/// Attempts before a row is dead-lettered; with the defaults the last one comes about
/// 8.5 minutes after the first failure.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// Problems loading or validating a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config file {path}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub database: DatabaseConfig,
    #[serde(default)]
    pub relay: RelayConfig,
    /// librdkafka properties, passed through unchanged (values may be strings, numbers or
    /// booleans).
    #[serde(default)]
    pub kafka: BTreeMap<String, toml::Value>,
    #[serde(default)]
    pub plugins: PluginsConfig,
    /// Per-tenant plugin settings, keyed by the value of the row's `tenant` column.
    #[serde(default)]
    pub tenants: BTreeMap<String, PluginSpec>,
}

/// `[database]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// PostgreSQL connection URL; `SLUICE_DATABASE_URL` overrides it.
    #[serde(default)]
    pub url: Option<String>,
    /// Outbox table name, optionally schema-qualified (`schema.table`).
    #[serde(default = "default_table")]
    pub table: String,
}

fn default_table() -> String {
    "outbox".to_owned()
}

/// How a row is marked once all of its messages were acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MarkMode {
    /// `DELETE` the row (fastest; the outbox holds only unsent rows).
    #[default]
    Delete,
    /// `UPDATE … SET published_at = now()` (keeps an audit trail).
    PublishedAt,
}

/// Whether rows of one key must be published in id order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// Any order; rows of a key may be in flight together (fastest).
    #[default]
    None,
    /// Rows with the same (tenant, aggregate_type, aggregate_id) are published in id order:
    /// a row is claimed only once every earlier row of its key was sent.
    Key,
}

/// In `ordering = "key"`: whether a dead row still holds back the later rows of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AfterDead {
    /// Later rows of the key proceed once the row is dead.
    #[default]
    Skip,
    /// Later rows wait until the dead row is replayed and sent.
    Block,
}

/// `[relay]`; unset keys take their values from [`RelayConfig::default`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    pub batch_size: usize,
    /// Concurrent batch pipelines in this process.
    pub workers: usize,
    /// Longest wait between polls when the outbox is empty.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Shortest wait between polls (after a partial batch; first back-off step).
    #[serde(with = "humantime_serde")]
    pub min_poll_interval: Duration,
    /// LISTEN on this channel and poll at once on a notification (polling stays the fallback).
    pub notify_channel: Option<String>,
    pub mark: MarkMode,
    /// In `published_at` mode: how long sent rows are kept before the pruner deletes them.
    pub retention: Retention,
    #[serde(with = "humantime_serde")]
    pub prune_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    pub ordering: Ordering,
    pub ordering_after_dead: AfterDead,
    pub retry: RetryConfig,
}

/// `[relay.retry]`: what happens to a row whose plugin call or publish failed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    #[serde(with = "humantime_serde")]
    pub initial: Duration,
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    pub multiplier: f64,
    /// Fraction (0–1) by which each delay is randomly moved up or down.
    pub jitter: f64,
    /// Attempts (the first delivery included) before the row is dead.
    pub max_attempts: u32,
    /// If set, a copy of every row that goes dead is published here.
    pub dead_letter_topic: Option<String>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            initial: DEFAULT_RETRY_INITIAL,
            max: DEFAULT_RETRY_MAX,
            multiplier: DEFAULT_RETRY_MULTIPLIER,
            jitter: DEFAULT_RETRY_JITTER,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            dead_letter_topic: None,
        }
    }
}

impl RetryConfig {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.initial.is_zero() {
            return Err(("initial", "must be greater than 0".into()));
        }
        if self.max < self.initial {
            return Err(("max", "must not be shorter than relay.retry.initial".into()));
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err((
                "multiplier",
                format!("must be at least 1.0, got {}", self.multiplier),
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err((
                "jitter",
                format!("must be between 0 and 1, got {}", self.jitter),
            ));
        }
        if self.max_attempts == 0 {
            return Err(("max_attempts", "must be at least 1".into()));
        }
        if let Some(topic) = &self.dead_letter_topic {
            crate::plugin::TopicPattern::parse(topic)
                .ok()
                .filter(|p| matches!(p, crate::plugin::TopicPattern::Exact(_)))
                .ok_or((
                    "dead_letter_topic",
                    format!("{topic:?} is not a topic name"),
                ))?;
        }
        Ok(())
    }
}

/// `relay.retention`: a duration, or `"forever"` to keep sent rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    Keep(Duration),
    Forever,
}

impl<'de> Deserialize<'de> for Retention {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "forever" {
            return Ok(Self::Forever);
        }
        humantime::parse_duration(&text)
            .map(Self::Keep)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "{e}: expected a duration such as \"7d\" or \"forever\""
                ))
            })
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: DEFAULT_BATCH_SIZE,
            workers: DEFAULT_WORKERS,
            poll_interval: DEFAULT_POLL_INTERVAL,
            min_poll_interval: DEFAULT_MIN_POLL_INTERVAL,
            notify_channel: None,
            retention: Retention::Keep(DEFAULT_RETENTION),
            prune_interval: DEFAULT_PRUNE_INTERVAL,
            mark: MarkMode::default(),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            ordering: Ordering::default(),
            ordering_after_dead: AfterDead::default(),
            retry: RetryConfig::default(),
        }
    }
}

/// `[plugins]`: the default plugin, the compile cache and what start-up does with a plugin
/// that fails.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsConfig {
    /// Where compiled plugins are cached; `""` disables the cache. Default:
    /// `$XDG_CACHE_HOME/sluice/plugins` or `~/.cache/sluice/plugins`.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// Plugin for rows whose tenant has no `[tenants.<name>]` entry (and rows without tenant).
    #[serde(default)]
    pub default: Option<PluginSpec>,
    /// `true`: refuse to start when any tenant's plugin fails to load, instantiate or
    /// configure. `false` (default): quarantine that tenant (its rows wait) and run the others.
    #[serde(default)]
    pub strict_startup: bool,
    /// Live instances kept for tenants without their own `[tenants.<name>]` entry.
    #[serde(default = "default_max_unconfigured_instances")]
    pub max_unconfigured_instances: usize,
}

impl Default for PluginsConfig {
    fn default() -> Self {
        Self {
            cache_dir: None,
            default: None,
            strict_startup: false,
            max_unconfigured_instances: DEFAULT_MAX_UNCONFIGURED_INSTANCES,
        }
    }
}

fn default_max_unconfigured_instances() -> usize {
    DEFAULT_MAX_UNCONFIGURED_INSTANCES
}

/// A plugin, its configuration and its sandbox limits: `[plugins.default]` (which must name
/// a `path` or `builtin`) and `[tenants.<name>]` (where every key left out is taken from
/// `[plugins.default]`, the plugin and its `config` included).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// Path to the `.wasm` component; relative paths are resolved against the config file.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// A routing plugin compiled into Sluice instead of a `.wasm` file (see
    /// [`crate::plugin::builtin`]); exclusive with `path`.
    #[serde(default)]
    pub builtin: Option<String>,
    /// Passed to the plugin's `configure` as string pairs.
    #[serde(default)]
    pub config: Option<BTreeMap<String, toml::Value>>,
    // Sandbox limits (inlined: serde cannot combine `flatten` with `deny_unknown_fields`).
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    pub call_timeout: Option<Duration>,
    /// Topics the plugin may route to: exact names, or `prefix.*` patterns.
    #[serde(default)]
    pub allowed_topics: Option<Vec<String>>,
    #[serde(default)]
    pub max_outputs_per_row: Option<usize>,
    #[serde(default)]
    pub max_message_bytes: Option<usize>,
    #[serde(default)]
    pub max_headers_per_message: Option<usize>,
    #[serde(default)]
    pub max_batch_output_bytes: Option<usize>,
    #[serde(default)]
    pub circuit_breaker_failures: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub circuit_breaker_cooldown: Option<Duration>,
}

/// Sandbox limits as written; unset fields inherit from `[plugins.default]`, then from
/// Sluice's defaults.
#[derive(Debug, Clone, Default)]
pub struct LimitsSpec {
    pub memory_mb: Option<u64>,
    pub call_timeout: Option<Duration>,
    pub allowed_topics: Option<Vec<String>>,
    pub max_outputs_per_row: Option<usize>,
    pub max_message_bytes: Option<usize>,
    pub max_headers_per_message: Option<usize>,
    pub max_batch_output_bytes: Option<usize>,
    pub circuit_breaker_failures: Option<u32>,
    pub circuit_breaker_cooldown: Option<Duration>,
}

/// Where a tenant's transform logic comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PluginSource {
    /// A WebAssembly component file.
    Wasm(PathBuf),
    /// A plugin built into Sluice, by name.
    Builtin(String),
}

impl PluginSpec {
    /// `path` or `builtin`, whichever is set (validation ensures not both).
    pub fn source(&self) -> Option<PluginSource> {
        match (&self.path, &self.builtin) {
            (Some(p), _) => Some(PluginSource::Wasm(p.clone())),
            (None, Some(b)) => Some(PluginSource::Builtin(b.clone())),
            (None, None) => None,
        }
    }

    pub fn limits(&self) -> LimitsSpec {
        LimitsSpec {
            memory_mb: self.memory_mb,
            call_timeout: self.call_timeout,
            allowed_topics: self.allowed_topics.clone(),
            max_outputs_per_row: self.max_outputs_per_row,
            max_message_bytes: self.max_message_bytes,
            max_headers_per_message: self.max_headers_per_message,
            max_batch_output_bytes: self.max_batch_output_bytes,
            circuit_breaker_failures: self.circuit_breaker_failures,
            circuit_breaker_cooldown: self.circuit_breaker_cooldown,
        }
    }
}

impl LimitsSpec {
    /// Fills unset fields from `fallback`.
    pub fn or(self, fallback: &LimitsSpec) -> LimitsSpec {
        LimitsSpec {
            memory_mb: self.memory_mb.or(fallback.memory_mb),
            call_timeout: self.call_timeout.or(fallback.call_timeout),
            allowed_topics: self
                .allowed_topics
                .or_else(|| fallback.allowed_topics.clone()),
            max_outputs_per_row: self.max_outputs_per_row.or(fallback.max_outputs_per_row),
            max_message_bytes: self.max_message_bytes.or(fallback.max_message_bytes),
            max_headers_per_message: self
                .max_headers_per_message
                .or(fallback.max_headers_per_message),
            max_batch_output_bytes: self
                .max_batch_output_bytes
                .or(fallback.max_batch_output_bytes),
            circuit_breaker_failures: self
                .circuit_breaker_failures
                .or(fallback.circuit_breaker_failures),
            circuit_breaker_cooldown: self
                .circuit_breaker_cooldown
                .or(fallback.circuit_breaker_cooldown),
        }
    }
}

impl Config {
    /// Reads, parses and validates a configuration file, applying environment overrides.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::parse(&text, path)?;
        if let Ok(url) = std::env::var(DATABASE_URL_ENV) {
            config.database.url = Some(url);
        }
        let base = path.parent().unwrap_or(Path::new("."));
        config.resolve_paths(base);
        config.validate(path)?;
        Ok(config)
    }

    /// Parses configuration text; `path` is only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if let Some(p) = self.plugins.default.as_mut().and_then(|d| d.path.as_mut()) {
            resolve(p);
        }
        if let Some(dir) = &mut self.plugins.cache_dir
            && !dir.as_os_str().is_empty()
        {
            resolve(dir);
        }
        for tenant in self.tenants.values_mut() {
            if let Some(p) = &mut tenant.path {
                resolve(p);
            }
        }
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        match &self.database.url {
            None => {
                return Err(invalid(
                    "database.url",
                    format!("missing (set it in the file or in {DATABASE_URL_ENV})"),
                ));
            }
            Some(url) if url.trim().is_empty() => {
                return Err(invalid("database.url", "is empty".into()));
            }
            Some(_) => {}
        }
        TableName::parse(&self.database.table)
            .map_err(|e| invalid("database.table", e.to_string()))?;
        if self.relay.batch_size == 0 || self.relay.batch_size > 100_000 {
            return Err(invalid(
                "relay.batch_size",
                format!(
                    "must be between 1 and 100000, got {}",
                    self.relay.batch_size
                ),
            ));
        }
        if self.relay.poll_interval.is_zero() {
            return Err(invalid(
                "relay.poll_interval",
                "must be greater than 0".into(),
            ));
        }
        if self.relay.workers == 0 || self.relay.workers > MAX_WORKERS {
            return Err(invalid(
                "relay.workers",
                format!(
                    "must be between 1 and {MAX_WORKERS}, got {}",
                    self.relay.workers
                ),
            ));
        }
        if self.relay.min_poll_interval.is_zero()
            || self.relay.min_poll_interval > self.relay.poll_interval
        {
            return Err(invalid(
                "relay.min_poll_interval",
                "must be greater than 0 and not longer than relay.poll_interval".into(),
            ));
        }
        if self.relay.prune_interval.is_zero() {
            return Err(invalid(
                "relay.prune_interval",
                "must be greater than 0".into(),
            ));
        }
        if let Some(channel) = &self.relay.notify_channel {
            validate_channel(channel).map_err(|m| invalid("relay.notify_channel", m))?;
        }
        self.relay
            .retry
            .validate()
            .map_err(|(k, m)| invalid(&format!("relay.retry.{k}"), m))?;
        for (key, value) in &self.kafka {
            kafka_value_string(value)
                .map_err(|m| invalid(&format!("kafka.\"{key}\""), m.to_owned()))?;
        }
        if self.plugins.max_unconfigured_instances == 0 {
            return Err(invalid(
                "plugins.max_unconfigured_instances",
                "must be at least 1".into(),
            ));
        }
        if let Some(default) = &self.plugins.default {
            validate_source(&default.path, &default.builtin, true)
                .map_err(|m| invalid("plugins.default", m))?;
            if let Some(config) = &default.config {
                validate_config_table(config)
                    .map_err(|(k, m)| invalid(&format!("plugins.default.config.{k}"), m))?;
            }
            validate_limits(&default.limits())
                .map_err(|(k, m)| invalid(&format!("plugins.default.{k}"), m))?;
        }
        for (name, tenant) in &self.tenants {
            if name.is_empty() {
                return Err(invalid("tenants", "tenant names must not be empty".into()));
            }
            if tenant.source().is_none() && self.plugins.default.is_none() {
                return Err(invalid(
                    &format!("tenants.{name}.path"),
                    "missing, and there is no [plugins.default] to fall back to".into(),
                ));
            }
            validate_source(&tenant.path, &tenant.builtin, false)
                .map_err(|m| invalid(&format!("tenants.{name}"), m))?;
            if let Some(config) = &tenant.config {
                validate_config_table(config)
                    .map_err(|(k, m)| invalid(&format!("tenants.{name}.config.{k}"), m))?;
            }
            validate_limits(&tenant.limits())
                .map_err(|(k, m)| invalid(&format!("tenants.{name}.{k}"), m))?;
        }
        Ok(())
    }

    /// The database URL (validated to be present by [`Config::load`]).
    pub fn database_url(&self) -> &str {
        self.database.url.as_deref().unwrap_or_default()
    }

    /// The librdkafka properties as strings.
    pub fn kafka_properties(&self) -> BTreeMap<String, String> {
        self.kafka
            .iter()
            .filter_map(|(k, v)| kafka_value_string(v).ok().map(|v| (k.clone(), v)))
            .collect()
    }
}

/// Most concurrent batches a process may run (each holds a database connection).
pub const MAX_WORKERS: usize = 64;
/// Highest `max_headers_per_message` accepted: librdkafka-based consumers handle tens of
/// thousands, but every header is an allocation on each of them.
pub const MAX_HEADERS_PER_MESSAGE: usize = 10_000;

/// A LISTEN/NOTIFY channel name: a plain identifier, since it is interpolated into `LISTEN`
/// and into the trigger function's body.
pub fn validate_channel(channel: &str) -> Result<(), String> {
    let ok = !channel.is_empty()
        && channel.len() <= 63
        && !channel.starts_with(|c: char| c.is_ascii_digit())
        && channel
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid channel name {channel:?}: use 1-63 ASCII letters, digits and '_', not starting with a digit"
        ))
    }
}

fn kafka_value_string(value: &toml::Value) -> Result<String, &'static str> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        _ => Err("librdkafka properties must be strings, numbers or booleans"),
    }
}

/// Converts a plugin `config` table to the string pairs `configure` receives.
pub fn config_pairs(table: &BTreeMap<String, toml::Value>) -> Vec<(String, String)> {
    table
        .iter()
        .filter_map(|(k, v)| kafka_value_string(v).ok().map(|v| (k.clone(), v)))
        .collect()
}

fn validate_config_table(table: &BTreeMap<String, toml::Value>) -> Result<(), (String, String)> {
    for (k, v) in table {
        kafka_value_string(v).map_err(|_| {
            (
                k.clone(),
                "plugin config values must be strings, numbers or booleans".to_owned(),
            )
        })?;
    }
    Ok(())
}

fn validate_source(
    path: &Option<PathBuf>,
    builtin: &Option<String>,
    required: bool,
) -> Result<(), String> {
    match (path, builtin) {
        (Some(_), Some(_)) => Err("set either `path` or `builtin`, not both".into()),
        (None, None) if required => Err("needs `path` (a .wasm component) or `builtin`".into()),
        (_, Some(name)) => {
            crate::plugin::builtin::Builtin::check_name(name).map_err(|m| format!("builtin: {m}"))
        }
        _ => Ok(()),
    }
}

fn validate_limits(limits: &LimitsSpec) -> Result<(), (String, String)> {
    if limits.memory_mb == Some(0) {
        return Err(("memory_mb".into(), "must be greater than 0".into()));
    }
    if limits.call_timeout.is_some_and(|d| d.is_zero()) {
        return Err(("call_timeout".into(), "must be greater than 0".into()));
    }
    if limits.circuit_breaker_failures == Some(0) {
        return Err((
            "circuit_breaker_failures".into(),
            "must be at least 1".into(),
        ));
    }
    if limits.max_message_bytes == Some(0) {
        return Err(("max_message_bytes".into(), "must be greater than 0".into()));
    }
    if let Some(n) = limits.max_headers_per_message
        && n > MAX_HEADERS_PER_MESSAGE
    {
        return Err((
            "max_headers_per_message".into(),
            format!("must be at most {MAX_HEADERS_PER_MESSAGE}, got {n}"),
        ));
    }
    if limits.max_batch_output_bytes == Some(0) {
        return Err((
            "max_batch_output_bytes".into(),
            "must be greater than 0".into(),
        ));
    }
    for pattern in limits.allowed_topics.iter().flatten() {
        crate::plugin::TopicPattern::parse(pattern)
            .map_err(|m| ("allowed_topics".to_owned(), m))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let config = Config::parse(text, Path::new("t.toml"))?;
        config.validate(Path::new("t.toml"))?;
        Ok(config)
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = parse("[database]\nurl = \"postgres://x/y\"\n").unwrap();
        assert_eq!(c.database.table, "outbox");
        assert_eq!(c.relay.batch_size, DEFAULT_BATCH_SIZE);
        assert_eq!(c.relay.poll_interval, DEFAULT_POLL_INTERVAL);
        assert_eq!(c.relay.mark, MarkMode::Delete);
    }

    #[test]
    fn polling_workers_and_retention_have_defaults_and_are_validated() {
        let c = parse("[database]\nurl = \"x\"\n").unwrap();
        assert_eq!(c.relay.workers, DEFAULT_WORKERS);
        assert_eq!(c.relay.min_poll_interval, DEFAULT_MIN_POLL_INTERVAL);
        assert_eq!(c.relay.retention, Retention::Keep(DEFAULT_RETENTION));
        assert_eq!(c.relay.notify_channel, None);
        let c = parse("[database]\nurl = \"x\"\n[relay]\nretention = \"forever\"\n").unwrap();
        assert_eq!(c.relay.retention, Retention::Forever);
        let c = parse("[database]\nurl = \"x\"\n[relay]\nretention = \"36h\"\n").unwrap();
        assert_eq!(
            c.relay.retention,
            Retention::Keep(Duration::from_secs(36 * 3600))
        );
        for (bad, key) in [
            ("workers = 0", "relay.workers"),
            ("workers = 1000", "relay.workers"),
            ("min_poll_interval = \"2s\"", "relay.min_poll_interval"),
            ("notify_channel = \"a-b\"", "relay.notify_channel"),
            ("retention = \"sometimes\"", "retention"),
            ("prune_interval = \"0s\"", "relay.prune_interval"),
        ] {
            let text = format!("[database]\nurl = \"x\"\n[relay]\n{bad}\n");
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn a_plugin_is_a_file_or_a_builtin_not_both() {
        let c =
            parse("[database]\nurl = \"x\"\n[plugins.default]\nbuiltin = \"route-by-aggregate\"\n")
                .unwrap();
        let default = c.plugins.default.unwrap();
        assert_eq!(
            default.source(),
            Some(PluginSource::Builtin("route-by-aggregate".into()))
        );
        for (bad, needle) in [
            (
                "path = \"p.wasm\"\nbuiltin = \"route-by-aggregate\"",
                "not both",
            ),
            ("builtin = \"nope\"", "unknown builtin"),
            ("config = {}", "needs `path`"),
        ] {
            let text = format!("[database]\nurl = \"x\"\n[plugins.default]\n{bad}\n");
            let err = parse(&text).unwrap_err().to_string();
            assert!(
                err.contains(needle) && err.contains("plugins.default"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse("[database]\nurl = \"x\"\n[relay]\nbatchsize = 3\n").unwrap_err();
        assert!(err.to_string().contains("batchsize"), "{err}");
    }

    #[test]
    fn invalid_duration_is_named() {
        let err = parse("[database]\nurl = \"x\"\n[relay]\npoll_interval = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("poll_interval"), "{err}");
    }

    #[test]
    fn bad_table_name_is_refused() {
        let err = parse("[database]\nurl = \"x\"\ntable = \"outbox; drop\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("database.table"), "{err}");
    }

    #[test]
    fn tenant_without_path_needs_a_default_plugin() {
        let err = parse("[database]\nurl = \"x\"\n[tenants.acme]\nconfig = {}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("tenants.acme.path"), "{err}");
    }

    #[test]
    fn kafka_values_of_any_scalar_type_pass_through() {
        let c = parse(
            "[database]\nurl = \"x\"\n[kafka]\n\"linger.ms\" = 5\n\"enable.idempotence\" = false\n",
        )
        .unwrap();
        let props = c.kafka_properties();
        assert_eq!(props["linger.ms"], "5");
        assert_eq!(props["enable.idempotence"], "false");
    }

    #[test]
    fn retry_policy_has_defaults_and_is_validated() {
        let c = parse("[database]\nurl = \"x\"\n").unwrap();
        assert_eq!(c.relay.retry.max_attempts, DEFAULT_MAX_ATTEMPTS);
        assert_eq!(c.relay.retry.dead_letter_topic, None);
        for (bad, key) in [
            ("multiplier = 0.5", "relay.retry.multiplier"),
            ("jitter = 2.0", "relay.retry.jitter"),
            ("max_attempts = 0", "relay.retry.max_attempts"),
            ("initial = \"10s\"\nmax = \"1s\"", "relay.retry.max"),
            (
                "dead_letter_topic = \"dlq.*\"",
                "relay.retry.dead_letter_topic",
            ),
        ] {
            let text = format!("[database]\nurl = \"x\"\n[relay.retry]\n{bad}\n");
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn invalid_topic_pattern_is_refused() {
        let err = parse(
            "[database]\nurl = \"x\"\n[plugins.default]\npath = \"p.wasm\"\nallowed_topics = [\"a*b\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("allowed_topics"), "{err}");
    }

    #[test]
    fn sandbox_keys_have_defaults_and_are_validated() {
        let c = parse("[database]\nurl = \"x\"\n").unwrap();
        assert!(!c.plugins.strict_startup);
        assert_eq!(
            c.plugins.max_unconfigured_instances,
            DEFAULT_MAX_UNCONFIGURED_INSTANCES
        );
        let c = parse(
            "[database]\nurl = \"x\"\n[plugins]\nstrict_startup = true\nmax_unconfigured_instances = 3\n\
             [plugins.default]\nbuiltin = \"route-by-aggregate\"\nmax_headers_per_message = 7\n\
             [tenants.acme]\nmax_batch_output_bytes = 1000\n",
        )
        .unwrap();
        assert!(c.plugins.strict_startup);
        assert_eq!(c.plugins.max_unconfigured_instances, 3);
        let default = c.plugins.default.as_ref().unwrap().limits();
        let acme = c.tenants["acme"].limits().or(&default);
        assert_eq!(acme.max_headers_per_message, Some(7), "inherited");
        assert_eq!(acme.max_batch_output_bytes, Some(1000));
        for (bad, key) in [
            (
                "[plugins]\nmax_unconfigured_instances = 0",
                "plugins.max_unconfigured_instances",
            ),
            (
                "[plugins.default]\nbuiltin = \"route-by-aggregate\"\nmax_headers_per_message = 100000",
                "plugins.default.max_headers_per_message",
            ),
            (
                "[plugins.default]\nbuiltin = \"route-by-aggregate\"\nmax_batch_output_bytes = 0",
                "plugins.default.max_batch_output_bytes",
            ),
        ] {
            let err = parse(&format!("[database]\nurl = \"x\"\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }
}
