//! The `sluice.toml` configuration: its shape, defaults, validation and environment overrides.
//!
//! Unknown keys are errors (a typo must not silently fall back to a default), and every error
//! names the file and the key that is wrong.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod tenant_files;

pub use crate::problem::Problem;
pub use crate::store::DATABASE_URL_ENV;
pub use tenant_files::{MAX_TENANT_FILE_BYTES, TenantFiles, tenant_of};

use crate::encoding::{Format, RegistrySettings};
use crate::maintenance::pruner::{
    DEFAULT_PRUNE_INTERVAL, Retention, RetentionMode, retention_mode_problems,
};
use crate::model::Broker;
use crate::plugin::{PluginSpec, PluginsSettings};
use crate::relay::{
    DEFAULT_BATCH_SIZE, DEFAULT_MIN_POLL_INTERVAL, DEFAULT_POLL_INTERVAL, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_WORKERS, RelaySettings, RetryPolicy, RetrySettings,
};
use crate::secret;
use crate::sink::{BrokerSettings, KafkaSettings, NatsSettings, RabbitmqSettings, RedisSettings};
use crate::store::{
    AfterDead, DEFAULT_LEASE, DatabaseSettings, LEASE_MARGIN, MarkMode, Ordering, StoreOptions,
    TenantColumn, validate_channel,
};
use crate::telemetry::TelemetrySettings;

/// Problems loading or validating a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The configuration file.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// The file is not TOML, or not of a configuration's shape (unknown key, wrong type).
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The configuration file.
        path: PathBuf,
        /// The parser's error on one line, naming the key (and line and column when known).
        message: String,
    },
    /// Every problem found, not just the first.
    #[error("invalid config file {path}: {}", list(.problems))]
    Invalid {
        /// The configuration file.
        path: PathBuf,
        /// Each problem, at its key.
        problems: Vec<Problem>,
    },
}

/// One problem inline, several one per line.
fn list(problems: &[Problem]) -> String {
    match problems {
        [one] => one.to_string(),
        many => many.iter().map(|p| format!("\n  - {p}")).collect(),
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[database]`: the database and the outbox table (required).
    pub database: DatabaseSettings,
    /// `[relay]`: batching, polling, marking, ordering and retries; every key has a default.
    #[serde(default)]
    pub relay: RelayConfig,
    /// `[kafka]`: librdkafka properties, passed through unchanged.
    #[serde(default)]
    pub kafka: KafkaSettings,
    /// `[nats]`: NATS JetStream, for plugin sections with `broker = "nats"`.
    #[serde(default)]
    pub nats: Option<NatsSettings>,
    /// `[rabbitmq]`: RabbitMQ, for plugin sections with `broker = "rabbitmq"`.
    #[serde(default)]
    pub rabbitmq: Option<RabbitmqSettings>,
    /// `[redis]`: Redis Streams, for plugin sections with `broker = "redis"`.
    #[serde(default)]
    pub redis: Option<RedisSettings>,
    /// `[plugins]`: the compiled-plugin cache, start-up strictness and `[plugins.default]`.
    #[serde(default)]
    pub plugins: PluginsSettings,
    /// Per-tenant plugin settings, keyed by the value of the row's `tenant` column.
    #[serde(default)]
    pub tenants: BTreeMap<String, PluginSpec>,
    /// `[telemetry]`: metrics and health endpoints (off unless `listen` is set).
    #[serde(default)]
    pub telemetry: TelemetrySettings,
    /// `[schema_registry]`: where `value_format`/`key_format` schemas come from.
    #[serde(default)]
    pub schema_registry: Option<RegistrySettings>,
    /// `[tracing]`: where the relay's spans go (no export without it).
    #[serde(default)]
    pub tracing: Option<crate::trace::TracingSettings>,
    /// `${env:…}`/`${file:…}` references that could not be resolved (see [`crate::secret`]),
    /// reported first by [`Config::problems`].
    #[serde(skip)]
    pub unresolved: Vec<Problem>,
    /// The file this configuration was loaded from (re-read on changes and on SIGHUP).
    #[serde(skip)]
    pub origin: Option<PathBuf>,
    /// With `[plugins] tenants_dir`: which tenants came from which file, and the files'
    /// problems (their tenants are in [`Config::tenants`] when they parsed).
    #[serde(skip)]
    pub tenant_files: TenantFiles,
    /// Tenants defined both in this file and by a tenant file (the file's entry is left out).
    #[serde(skip)]
    duplicates: Vec<Problem>,
    /// Set by [`Config::load`]: the tenants its check held up (their tenant file does not
    /// check), with why, so that [`Config::runnable_tenants`] at start-up need not check the
    /// whole configuration again. `None` for a configuration not loaded that way.
    #[serde(skip)]
    held: Option<BTreeMap<String, String>>,
}

/// `[relay]`; unset keys take their values from [`RelayConfig::default`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// Rows claimed per transaction, 1–100000 (default 500).
    pub batch_size: usize,
    /// Most batches in flight at once in this process.
    pub workers: usize,
    /// Let the number of batches in flight follow the pipeline (up to `workers`).
    pub adaptive_concurrency: bool,
    /// Longest wait between polls when the outbox is empty.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Shortest wait between polls (after a partial batch; first back-off step).
    #[serde(with = "humantime_serde")]
    pub min_poll_interval: Duration,
    /// LISTEN on this channel and poll at once on a notification (polling stays the fallback).
    pub notify_channel: Option<String>,
    /// How sent rows are marked: `"delete"` (default) or `"published_at"`.
    pub mark: MarkMode,
    /// In `published_at` mode: how long sent rows are kept before the pruner deletes them.
    pub retention: Retention,
    /// `"delete"` (default): rows past the retention are deleted; `"drop-partitions"`
    /// (PostgreSQL, partitioned tables): their partitions are dropped.
    pub retention_mode: RetentionMode,
    /// How often the pruner runs in `published_at` mode (default `"1m"`).
    #[serde(with = "humantime_serde")]
    pub prune_interval: Duration,
    /// After SIGTERM/SIGINT, how long the batch in hand may take before it is rolled back
    /// (default `"30s"`).
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// `"key"`: rows of one tenant and aggregate go out in claim order; `"none"` (default): no
    /// order.
    pub ordering: Ordering,
    /// With `ordering = "key"`: `"skip"` (default) lets a key's later rows pass a dead one,
    /// `"block"` holds them until it is replayed and sent.
    pub ordering_after_dead: AfterDead,
    /// Tables with a tenant column (every database): each batch first takes up to this many of
    /// the oldest due rows of every tenant with rows waiting (taking turns when they are
    /// more than a batch holds), then fills up in claim order; `0` (default): claim order
    /// only. Keeps small tenants' rows flowing while one tenant's backlog drains.
    pub fair_share: usize,
    /// Accept a `[kafka]` `acks` weaker than `all` (a warning is logged at start-up).
    pub allow_weak_acks: bool,
    /// `[relay.retry]`: back-off, attempts and the dead-letter topic.
    pub retry: RetrySettings,
}

impl RelayConfig {
    /// What is wrong with `[relay]`'s own keys that the loop's settings do not check
    /// ([`RelaySettings::problems`]): the pruner's interval, the notification channel's name,
    /// `[relay.retry]`.
    fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.prune_interval.is_zero() {
            problems.push(Problem::new(
                "relay.prune_interval",
                "must be greater than 0",
            ));
        }
        if let Some(channel) = &self.notify_channel
            && let Err(message) = validate_channel(channel)
        {
            problems.push(Problem::new("relay.notify_channel", message));
        }
        problems.extend(self.retry.problems());
        problems
    }

    /// The loop's settings.
    pub fn settings(&self) -> RelaySettings {
        RelaySettings {
            batch_size: self.batch_size,
            workers: self.workers,
            adaptive_concurrency: self.adaptive_concurrency,
            min_poll_interval: self.min_poll_interval,
            poll_interval: self.poll_interval,
            retry: RetryPolicy::new(&self.retry),
            dead_letter_topic: self.retry.dead_letter_topic.clone(),
            dead_letter_broker: self.retry.dead_letter_broker,
            shutdown_timeout: self.shutdown_timeout,
        }
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: DEFAULT_BATCH_SIZE,
            workers: DEFAULT_WORKERS,
            adaptive_concurrency: true,
            poll_interval: DEFAULT_POLL_INTERVAL,
            min_poll_interval: DEFAULT_MIN_POLL_INTERVAL,
            notify_channel: None,
            retention: Retention::default(),
            retention_mode: RetentionMode::default(),
            prune_interval: DEFAULT_PRUNE_INTERVAL,
            mark: MarkMode::default(),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            ordering: Ordering::default(),
            ordering_after_dead: AfterDead::default(),
            fair_share: 0,
            allow_weak_acks: false,
            retry: RetrySettings::default(),
        }
    }
}

impl Config {
    /// Reads, parses and validates a configuration file, applying environment overrides.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut config = Self::load_unchecked(path)?;
        config.validate(path)?;
        Ok(config)
    }

    /// Reads and parses a file, applying environment overrides and resolving plugin paths,
    /// without checking the values ([`Config::problems`] lists what is wrong).
    pub fn load_unchecked(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::parse(&text, path)?;
        if let Ok(url) = std::env::var(DATABASE_URL_ENV) {
            // It replaces the file's value, and with it whatever was wrong with that value.
            config.unresolved.retain(|p| p.key != "database.url");
            config.database.url = Some(secret::SecretUrl::read(url));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        config.resolve_paths(base);
        config.read_tenant_files(base);
        config.origin = Some(path.to_owned());
        Ok(config)
    }

    /// Adds the tenants of `[plugins] tenants_dir` (relative to `base`, the config file's
    /// directory) to [`Config::tenants`].
    fn read_tenant_files(&mut self, base: &Path) {
        let Some(written) = self.plugins.tenants_dir.clone() else {
            return;
        };
        let mut dir = written.clone();
        resolve_path(&mut dir, base);
        let mut files = TenantFiles::read(&dir, &written);
        for (name, spec) in std::mem::take(&mut files.tenants) {
            if self.tenants.contains_key(&name) {
                let file = files.files.get(&name).map(|f| f.display().to_string());
                self.duplicates.push(Problem::new(
                    format!("tenants.{name}"),
                    format!(
                        "defined both here and by {}: keep one",
                        file.unwrap_or_default()
                    ),
                ));
                files.files.remove(&name);
                continue;
            }
            self.tenants.insert(name, spec);
        }
        self.tenant_files = files;
    }

    /// `[plugins] tenants_dir`, resolved from the config file's directory.
    pub fn tenants_dir(&self) -> Option<PathBuf> {
        let mut dir = self.plugins.tenants_dir.clone()?;
        let base = self
            .origin
            .as_deref()
            .and_then(Path::parent)
            .unwrap_or(Path::new("."));
        resolve_path(&mut dir, base);
        Some(dir)
    }

    /// The tenants that can start, and those defined by a tenant file that does not check,
    /// with why (their rows wait until the file is fixed; `config check` lists them).
    pub fn runnable_tenants(&self) -> (BTreeMap<String, PluginSpec>, BTreeMap<String, String>) {
        let refused = match &self.held {
            Some(held) => held.clone(),
            None => self.held_tenants(&self.problems()),
        };
        let tenants = self
            .tenants
            .iter()
            .filter(|(name, _)| !refused.contains_key(*name))
            .map(|(name, spec)| (name.clone(), spec.clone()))
            .collect();
        (tenants, refused)
    }

    /// The tenants defined by a tenant file that `problems` (this configuration's) concern,
    /// each with its problems joined by `; `.
    fn held_tenants(&self, problems: &[Problem]) -> BTreeMap<String, String> {
        let mut held: BTreeMap<String, String> = BTreeMap::new();
        for problem in problems {
            if let Some(name) = self.tenant_of_problem(problem)
                && self.tenant_file(&name).is_some()
            {
                let why = held.entry(name).or_default();
                if !why.is_empty() {
                    why.push_str("; ");
                }
                why.push_str(&problem.to_string());
            }
        }
        held
    }

    /// The file that defines tenant `name`, when a tenant file does.
    pub fn tenant_file(&self, name: &str) -> Option<&Path> {
        self.tenant_files.files.get(name).map(PathBuf::as_path)
    }

    /// `key` as a problem of tenant `name` reads: inside its tenant file when it has one
    /// (`tenants.d/acme.toml: memory_mb`), else unchanged.
    pub fn tenant_key(&self, name: &str, key: &str) -> String {
        self.tenant_file(name)
            .and_then(|file| tenant_files::in_file(key, name, file))
            .unwrap_or_else(|| key.to_owned())
    }

    /// The tenant a problem is about (by its key), if any.
    pub fn tenant_of_problem(&self, problem: &Problem) -> Option<String> {
        let key = problem.key.as_str();
        if let Some(rest) = key.strip_prefix("tenants.")
            && let Some(name) = self
                .tenants
                .keys()
                .chain(self.tenant_files.files.keys())
                .filter(|name| {
                    rest.strip_prefix(name.as_str())
                        .is_some_and(|r| r.is_empty() || r.starts_with('.'))
                })
                .max_by_key(|name| name.len())
        {
            return Some(name.clone());
        }
        self.tenant_files
            .files
            .iter()
            .find(|(_, file)| {
                let shown = file.display().to_string();
                key.strip_prefix(shown.as_str())
                    .is_some_and(|r| r.is_empty() || r.starts_with(':'))
            })
            .map(|(name, _)| name.clone())
    }

    /// Parses configuration text, resolving `${env:…}` and `${file:…}` references (relative
    /// paths from `path`'s directory) and registering the secrets among the values for
    /// scrubbing (see [`crate::secret`]). Unresolvable references are kept for
    /// [`Config::problems`]; `path` is otherwise only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            path: path.to_owned(),
            message: one_line(e, text),
        };
        let mut tree: toml::Value = toml::from_str(text).map_err(parse_error)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolved = secret::resolve(&mut tree, &secret::Environment::new(base));
        secret::register(&resolved.secrets);
        let mut config = match tree.try_into::<Self>() {
            Ok(config) => config,
            // The file's own text gives the better message (line and column), unless it is
            // only the resolved values that are wrong.
            Err(e) => {
                return Err(toml::from_str::<Self>(text).err().map_or_else(
                    || ConfigError::Parse {
                        path: path.to_owned(),
                        message: e.to_string().trim_end().replace('\n', " "),
                    },
                    parse_error,
                ));
            }
        };
        config.unresolved = resolved.errors;
        Ok(config)
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |p: &mut PathBuf| resolve_path(p, base);
        if let Some(p) = self.plugins.default.as_mut().and_then(|d| d.path.as_mut()) {
            resolve(p);
        }
        if let Some(default) = self.plugins.default.as_mut() {
            default.resolve_schema_paths(base);
        }
        if let Some(ca) = self
            .schema_registry
            .as_mut()
            .and_then(|r| r.ca_location.as_mut())
        {
            resolve(ca);
        }
        if let Some(dir) = &mut self.plugins.cache_dir
            && !dir.as_os_str().is_empty()
        {
            resolve(dir);
        }
        for registry in self.plugins.registries.values_mut() {
            if let Some(ca) = &mut registry.ca_location {
                resolve(ca);
            }
        }
        for tenant in self.tenants.values_mut() {
            tenant.resolve_schema_paths(base);
            if let Some(p) = &mut tenant.path {
                resolve(p);
            }
        }
    }

    /// Refuses a configuration with problems, except that a tenant file that does not check
    /// holds up its own tenant only (its rows wait; see [`Config::runnable_tenants`]) unless
    /// `strict_startup` asks to refuse the start. Records the tenants held up.
    fn validate(&mut self, path: &Path) -> Result<(), ConfigError> {
        let mut problems = self.problems();
        let held = self.held_tenants(&problems);
        if !self.plugins.strict_startup {
            problems.retain(|p| {
                self.tenant_of_problem(p)
                    .is_none_or(|name| self.tenant_file(&name).is_none())
            });
        }
        if problems.is_empty() {
            self.held = Some(held);
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                path: path.to_owned(),
                problems,
            })
        }
    }

    /// Everything wrong with this configuration that can be found without a database,
    /// broker or plugin file: each key's value, and the rules between keys. A tenant file's
    /// problems are named by the file (`tenants.d/acme.toml: memory_mb: …`).
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = self.unresolved.clone();
        // A key whose reference did not resolve has no real value to check.
        let unresolved: Vec<String> = self.unresolved.iter().map(|p| p.key.clone()).collect();
        problems.extend(
            self.value_problems()
                .into_iter()
                .filter(|p| !unresolved.contains(&p.key)),
        );
        problems.extend(self.tenant_files.unreadable.clone());
        problems.extend(self.tenant_files.problems.values().flatten().cloned());
        problems.extend(self.duplicates.iter().cloned());
        self.name_tenant_files(&mut problems);
        problems
    }

    /// Moves each `tenants.<name>…` key of a tenant defined by a file into that file.
    fn name_tenant_files(&self, problems: &mut [Problem]) {
        if self.tenant_files.files.is_empty() {
            return;
        }
        for problem in problems {
            if problem.key.starts_with("tenants.")
                && let Some(name) = self.tenant_of_problem(problem)
            {
                problem.key = self.tenant_key(&name, &problem.key);
            }
        }
    }

    /// Each section's own problems, then the rules between sections.
    fn value_problems(&self) -> Vec<Problem> {
        let mut problems = self.database.problems();
        problems.extend(self.lease_problem());
        if let Some(d) = self.database.driver()
            && !d.notifies()
            && self.relay.notify_channel.is_some()
        {
            problems.push(Problem::new(
                "relay.notify_channel",
                format!(
                    "{} has no LISTEN/NOTIFY: relays poll (relay.poll_interval); remove the key",
                    d.name()
                ),
            ));
        }
        problems.extend(self.relay.settings().problems());
        let r = &self.relay;
        let driver = self.database.driver();
        problems.extend(retention_mode_problems(r.retention_mode, r.mark, driver));
        problems.extend(self.fair_share_problem());
        problems.extend(self.relay.problems());
        problems.extend(self.tracing.iter().flat_map(|t| t.problems()));
        problems.extend(self.kafka.problems());
        problems.extend(self.broker_problems());
        if let Some((key, value)) = self.kafka.weak_acks()
            && !self.relay.allow_weak_acks
        {
            problems.push(Problem::new(
                format!("kafka.\"{key}\""),
                format!(
                    "{value:?} lets the broker acknowledge a message before every in-sync \
                     replica has it, and Sluice marks a row sent on that acknowledgement, so a \
                     broker failure can lose the row's messages; use \"all\" (the default), or \
                     set relay.allow_weak_acks = true to accept that"
                ),
            ));
        }
        problems.extend(self.telemetry.problems());
        problems.extend(self.plugins.problems());
        problems.extend(self.format_problems());
        for (name, tenant) in &self.tenants {
            if name.is_empty() {
                problems.push(Problem::new("tenants", "tenant names must not be empty"));
            }
            let key = format!("tenants.{name}");
            if tenant
                .inherit(self.plugins.default.as_ref())
                .source()
                .is_none()
            {
                problems.push(Problem::new(
                    format!("{key}.path"),
                    "missing, and there is no [plugins.default] to fall back to",
                ));
            }
            problems.extend(tenant.problems(&key, false));
        }
        problems
    }

    /// The brokers plugin sections send to: `[plugins.default]`'s and each tenant's (as it
    /// inherits it), and the dead-letter topic's.
    pub fn brokers_in_use(&self) -> std::collections::BTreeSet<Broker> {
        let default = self.plugins.default.as_ref();
        let mut used: std::collections::BTreeSet<Broker> = default
            .map(PluginSpec::broker)
            .into_iter()
            .chain(self.tenants.values().map(|t| t.inherit(default).broker()))
            .collect();
        if self.relay.retry.dead_letter_topic.is_some() {
            used.insert(self.relay.retry.dead_letter_broker);
        }
        used
    }

    /// The brokers this relay connects to, with their settings: every broker with a section
    /// written (`[nats]`, `[rabbitmq]`, `[redis]`; `[kafka]` when it sets any property), and
    /// Kafka whenever a plugin section sends there (its defaults then apply, as before there
    /// were other brokers).
    pub(crate) fn broker_settings(&self) -> Vec<BrokerSettings> {
        let mut brokers = Vec::new();
        if !self.kafka.properties().is_empty() || self.brokers_in_use().contains(&Broker::Kafka) {
            brokers.push(BrokerSettings::Kafka(self.kafka.properties()));
        }
        // Message ids are outbox ids: without a prefix of their own, two tables' rows 7 would
        // be one message to a broker that drops duplicates (JetStream).
        let prefix = |written: &str| match written {
            "" => format!("{}:", self.database.table),
            written => written.to_owned(),
        };
        brokers.extend(self.nats.clone().map(|mut s| {
            s.message_id_prefix = prefix(&s.message_id_prefix);
            BrokerSettings::Nats(s)
        }));
        brokers.extend(self.rabbitmq.clone().map(|mut s| {
            s.message_id_prefix = prefix(&s.message_id_prefix);
            BrokerSettings::Rabbitmq(s)
        }));
        brokers.extend(self.redis.clone().map(|mut s| {
            s.message_id_prefix = prefix(&s.message_id_prefix);
            BrokerSettings::Redis(s)
        }));
        brokers
    }

    /// How long a batch may wait for its broker's confirmations: the longest of the
    /// configured brokers' timeouts.
    pub fn publish_timeout(&self) -> Duration {
        self.broker_settings()
            .iter()
            .map(|b| match b {
                BrokerSettings::Kafka(_) => self.kafka.message_timeout(),
                BrokerSettings::Nats(s) => s.timeout(),
                BrokerSettings::Rabbitmq(s) => s.timeout(),
                BrokerSettings::Redis(s) => s.timeout(),
            })
            .max()
            .unwrap_or_else(|| self.kafka.message_timeout())
    }

    /// The broker sections' own problems, and a plugin section (or the dead-letter topic)
    /// naming a broker without its section.
    fn broker_problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Some(nats) = &self.nats {
            problems.extend(nats.problems());
        }
        if let Some(rabbitmq) = &self.rabbitmq {
            problems.extend(rabbitmq.problems());
        }
        if let Some(redis) = &self.redis {
            problems.extend(redis.problems());
        }
        let configured = |broker: Broker| match broker {
            Broker::Kafka => true,
            Broker::Nats => self.nats.is_some(),
            Broker::Rabbitmq => self.rabbitmq.is_some(),
            Broker::Redis => self.redis.is_some(),
        };
        let missing =
            |broker: Broker| format!("\"{broker}\" needs a [{broker}] section (at least its url)");
        let default = self.plugins.default.as_ref();
        if let Some(broker) = default.and_then(|d| d.broker)
            && !configured(broker)
        {
            problems.push(Problem::new("plugins.default.broker", missing(broker)));
        }
        for (name, tenant) in &self.tenants {
            if let Some(broker) = tenant.broker
                && !configured(broker)
            {
                problems.push(Problem::new(
                    format!("tenants.{name}.broker"),
                    missing(broker),
                ));
            }
        }
        let dead = self.relay.retry.dead_letter_broker;
        if self.relay.retry.dead_letter_topic.is_some() && !configured(dead) {
            problems.push(Problem::new(
                "relay.retry.dead_letter_broker",
                missing(dead),
            ));
        }
        problems
    }

    /// A SQLite lease must outlast a batch, which waits up to the broker's timeout.
    fn lease_problem(&self) -> Option<Problem> {
        self.database.driver().filter(|d| d.leases())?;
        let lease = self.database.lease.unwrap_or(DEFAULT_LEASE);
        let timeout = self.publish_timeout();
        (lease < timeout + LEASE_MARGIN).then(|| {
            Problem::new(
                "database.lease",
                format!(
                    "{} is too short: a lease must outlast a batch, i.e. the broker's timeout \
                     (the producer's message.timeout.ms, or the longest `timeout` of \
                     [nats]/[rabbitmq]/[redis]: {}) plus {} for the rest of the batch; otherwise \
                     another relay claims and publishes the rows again while this one still \
                     waits for the broker",
                    humantime::format_duration(lease),
                    humantime::format_duration(timeout),
                    humantime::format_duration(LEASE_MARGIN),
                ),
            )
        })
    }

    /// `[schema_registry]`, and each section's format keys (as its tenants inherit them):
    /// encoding needs a registry.
    fn format_problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Some(registry) = &self.schema_registry {
            problems.extend(registry.problems());
        }
        let default = self.plugins.default.as_ref();
        let sections = default
            .map(|d| ("plugins.default".to_owned(), d.formats.clone()))
            .into_iter()
            .chain(self.tenants.iter().map(|(name, t)| {
                (
                    format!("tenants.{name}"),
                    t.formats
                        .clone()
                        .or(&default.map(|d| d.formats.clone()).unwrap_or_default()),
                )
            }));
        for (key, formats) in sections {
            if let Err(found) = formats.resolve(&key) {
                problems.extend(found);
            } else if formats.encodes() && self.schema_registry.is_none() {
                let field = match formats.value_format {
                    Some(f) if f != Format::Raw => "value_format",
                    _ => "key_format",
                };
                problems.push(Problem::new(
                    format!("{key}.{field}"),
                    "encoding with a schema needs a [schema_registry] section with its url",
                ));
            }
        }
        problems
    }

    /// What is valid but may not do what its author expects, each with its key: `config
    /// check` lists these as warnings (they do not fail it, and `sluice run` starts).
    pub fn warnings(&self) -> Vec<Problem> {
        let default = self.plugins.default.as_ref();
        let mut warnings: Vec<Problem> = self
            .tenants
            .iter()
            .flat_map(|(name, tenant)| {
                tenant.inheritance_warnings(&format!("tenants.{name}"), default)
            })
            .collect();
        let telemetry = &self.telemetry;
        if telemetry.listen.is_none()
            && (telemetry.bearer_token.is_some() || telemetry.basic_auth_username.is_some())
        {
            warnings.push(Problem::new(
                "telemetry.listen",
                "not set, so nothing is served and the credentials protect nothing \
                 (set listen to serve /metrics and /status)",
            ));
        }
        self.name_tenant_files(&mut warnings);
        warnings
    }

    /// `relay.fair_share` takes turns between tenants: a table with a tenant column, and no
    /// more than a batch.
    fn fair_share_problem(&self) -> Option<Problem> {
        let share = self.relay.fair_share;
        if share == 0 {
            return None;
        }
        let problem = |message: String| Some(Problem::new("relay.fair_share", message));
        if let Ok(spec) = self.database.table_spec()
            && spec.columns.tenant == TenantColumn::None
        {
            return problem(
                "shares are per tenant, and database.columns.tenant is \"\" (no tenant \
                 column): set it to 0, or name the tenant column"
                    .to_owned(),
            );
        }
        if share > self.relay.batch_size {
            return problem(format!(
                "{share} is more than relay.batch_size ({}): a share is the part of a batch \
                 each tenant is offered first",
                self.relay.batch_size
            ));
        }
        None
    }

    /// How the store claims and marks rows: `relay.mark`, `relay.ordering`,
    /// `relay.ordering_after_dead`, `relay.fair_share` and `database.lease` (validated to be
    /// SQLite's only, and long enough). The one place these keys reach the store: every field
    /// is set here.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            mark: self.relay.mark,
            ordering: self.relay.ordering,
            after_dead: self.relay.ordering_after_dead,
            fair_share: NonZeroUsize::new(self.relay.fair_share),
            lease: self.database.lease.unwrap_or(DEFAULT_LEASE),
        }
    }

    /// The database URL (validated to be present by [`Config::load`]).
    pub fn database_url(&self) -> &str {
        self.database
            .url
            .as_ref()
            .map_or("", secret::SecretUrl::expose)
    }
}

/// Resolves a relative path from `base`; `oci://…` plugin paths are references, not files.
fn resolve_path(p: &mut PathBuf, base: &Path) {
    let reference = p
        .to_str()
        .is_some_and(|s| s.starts_with(crate::plugin::supply::oci::OCI_SCHEME));
    if p.is_relative() && !reference {
        *p = base.join(&*p);
    }
}

/// A TOML error on one line with its place: `message (at line L, column C)`. Never the
/// source line itself, which toml's own rendering quotes: it may hold a secret written out.
fn one_line(mut error: toml::de::Error, text: &str) -> String {
    // Without its input, the error renders its message and the key (`in `relay.x``).
    error.set_input(None);
    let message = error.to_string().trim_end().replace('\n', " ");
    let Some(span) = error.span() else {
        return message;
    };
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    format!("{message} (at line {line}, column {column})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintenance::pruner::DEFAULT_RETENTION;
    use crate::plugin::PluginSource;
    use crate::store::{ColumnMap, ColumnName, TenantColumn};

    #[test]
    fn tenant_files_join_the_tenants_and_their_problems_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("tenants.d")).unwrap();
        std::fs::write(
            d.join("sluice.toml"),
            "[database]\nurl = \"postgres://u@h/db\"\n[plugins]\ntenants_dir = \"tenants.d\"\n\
             [tenants.both]\nbuiltin = \"route-by-aggregate\"\n",
        )
        .unwrap();
        let file =
            |name: &str, text: &str| std::fs::write(d.join("tenants.d").join(name), text).unwrap();
        file("acme.toml", "path = \"plugins/acme.wasm\"\nmemory_mb = 0\n");
        file("both.toml", "builtin = \"route-by-aggregate\"\n");
        file("broken.toml", "path = \n");
        let config = Config::load_unchecked(&d.join("sluice.toml")).unwrap();
        assert_eq!(
            config.tenants["acme"].path.as_deref(),
            Some(d.join("tenants.d/plugins/acme.wasm").as_path()),
            "relative to the tenant file"
        );
        let problems: Vec<String> = config.problems().iter().map(ToString::to_string).collect();
        let has = |text: &str| problems.iter().any(|p| p.starts_with(text));
        assert!(has("tenants.d/acme.toml: memory_mb: "), "{problems:#?}");
        assert!(has("tenants.d/broken.toml: "), "{problems:#?}");
        assert!(
            has("tenants.both: defined both here and by tenants.d/both.toml"),
            "{problems:#?}"
        );
        let acme = config
            .problems()
            .into_iter()
            .find(|p| p.key.contains("acme"))
            .unwrap();
        assert_eq!(config.tenant_of_problem(&acme).as_deref(), Some("acme"));
        let broken = config
            .problems()
            .into_iter()
            .find(|p| p.key.contains("broken"))
            .unwrap();
        assert_eq!(config.tenant_of_problem(&broken).as_deref(), Some("broken"));
        // `sluice run` starts the others; the files' tenants wait (the duplicate, a problem
        // of sluice.toml itself, still refuses the start).
        let (runnable, refused) = config.runnable_tenants();
        assert_eq!(refused.keys().collect::<Vec<_>>(), ["acme", "broken"]);
        assert_eq!(runnable.keys().collect::<Vec<_>>(), ["both"]);
        let err = Config::load(&d.join("sluice.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tenants.both: defined both") && !err.contains("acme"),
            "{err}"
        );
        std::fs::remove_file(d.join("tenants.d/both.toml")).unwrap();
        // Loaded (checked) for a start: the same tenants wait, as that check found them.
        let loaded = Config::load(&d.join("sluice.toml")).unwrap();
        let (runnable, refused) = loaded.runnable_tenants();
        assert_eq!(refused.keys().collect::<Vec<_>>(), ["acme", "broken"]);
        assert!(refused["acme"].contains("memory_mb"), "{refused:?}");
        assert_eq!(runnable.keys().collect::<Vec<_>>(), ["both"]);
        let strict = std::fs::read_to_string(d.join("sluice.toml"))
            .unwrap()
            .replace("[plugins]\n", "[plugins]\nstrict_startup = true\n");
        std::fs::write(d.join("sluice.toml"), strict).unwrap();
        let err = Config::load(&d.join("sluice.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("tenants.d/acme.toml: memory_mb"), "{err}");
    }

    #[test]
    fn a_registry_ca_location_is_relative_to_the_config_file_and_checked_unused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("certs")).unwrap();
        // No plugin pulls from this registry yet: the file is checked all the same.
        let text = "[database]\nurl = \"postgres://u@h/db\"\n\
                    [plugins.registries.\"registry.example.com\"]\nca_location = \"certs/ca.pem\"\n";
        std::fs::write(d.join("sluice.toml"), text).unwrap();
        let load = || Config::load_unchecked(&d.join("sluice.toml")).unwrap();
        let config = load();
        assert_eq!(
            config.plugins.registries["registry.example.com"]
                .ca_location
                .as_deref(),
            Some(d.join("certs/ca.pem").as_path()),
            "from the config file's directory, not the working directory"
        );
        let problems =
            |c: &Config| -> Vec<String> { c.problems().iter().map(ToString::to_string).collect() };
        let key = "plugins.registries.\"registry.example.com\".ca_location";
        let p = problems(&config);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with(&format!(
                "{key}: cannot read {}",
                d.join("certs/ca.pem").display()
            )),
            "{p:?}"
        );
        std::fs::write(d.join("certs/ca.pem"), "not a certificate\n").unwrap();
        let p = problems(&load());
        assert!(
            p.len() == 1 && p[0].contains("is not a PEM certificate"),
            "{p:?}"
        );
        let ca = sluice_testkit::secure_broker::TestCa::new(&d.join("certs"), "ca").unwrap();
        assert_eq!(ca.pem, d.join("certs/ca.pem"));
        assert!(problems(&load()).is_empty());
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let mut config = Config::parse(text, Path::new("t.toml"))?;
        config.validate(Path::new("t.toml"))?;
        Ok(config)
    }

    #[test]
    fn encoding_needs_a_registry_and_its_settings_are_checked() {
        let base = "[database]\nurl = \"x\"\n[plugins.default]\nbuiltin = \"route-by-aggregate\"\n";
        let keys = |c: &Config| c.problems().into_iter().map(|p| p.key).collect::<Vec<_>>();
        // What `config check` lists: parsed, not yet refused.
        let unchecked = |text: &str| Config::parse(text, Path::new("t.toml"));
        let c = unchecked(&format!("{base}key_format = \"avro\"\n[tenants.a]\n")).unwrap();
        assert_eq!(
            keys(&c),
            ["plugins.default.key_format", "tenants.a.key_format"],
            "every section that encodes, inherited ones included"
        );
        let c = unchecked(&format!(
            "{base}value_format = \"protobuf\"\nvalue_schema = \"s/order.proto\"\n\
             [schema_registry]\nurl = \"ftp://r\"\nusername = \"u\"\n"
        ))
        .unwrap();
        assert_eq!(
            keys(&c),
            [
                "schema_registry.url",
                "schema_registry.username",
                "plugins.default.value_schema"
            ]
        );
        let default = c.plugins.default.as_ref().unwrap();
        assert_eq!(
            default.formats.value_schema.as_deref(),
            Some(Path::new("s/order.proto")),
            "relative to the config file (here: t.toml in the working directory)"
        );
        let problems = c.problems();
        assert!(
            problems[2].message.contains("cannot read s/order.proto"),
            "{problems:?}"
        );
        let c = unchecked(&format!(
            "{base}value_format = \"json-schema\"\n[schema_registry]\nurl = \"https://r\"\n"
        ))
        .unwrap();
        assert!(c.problems().is_empty(), "{:?}", c.problems());
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
    fn an_unresolved_reference_is_the_only_problem_of_its_key() {
        let err = parse("[database]\nurl = \"${env:SLUICE_UNIT_TEST_NEVER_SET}\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "database.url: environment variable SLUICE_UNIT_TEST_NEVER_SET is not set"
            ),
            "{err}"
        );
        assert!(!err.contains("is empty"), "not reported twice: {err}");
        // A resolved value is checked like a written one.
        let err =
            parse("[database]\nurl = \"x\"\n[relay]\nbatch_size = 0\nnotify_channel = \"$${x}\"\n")
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("relay.notify_channel"),
            "`${{x}}` is checked: {err}"
        );
    }

    #[test]
    fn a_syntax_error_names_its_place_but_never_quotes_the_line() {
        let text = "[database]\nurl = \"x\"\n[kafka]\n\"sasl.password\" = \"Literal-Pw-1\" ,\n";
        let Err(ConfigError::Parse { message, .. }) = parse(text) else {
            panic!("parsed");
        };
        assert!(message.contains("(at line 4, column"), "{message}");
        assert!(
            !message.contains("Literal-Pw-1") && !message.contains('\n'),
            "{message}"
        );
        let Err(ConfigError::Parse { message, .. }) =
            parse("[database]\nurl = \"x\"\n[relay]\nbatch_sise = 10\n")
        else {
            panic!("parsed");
        };
        assert!(
            message.starts_with("unknown field `batch_sise`"),
            "{message}"
        );
        assert!(message.ends_with("(at line 4, column 1)"), "{message}");
    }

    #[test]
    fn a_kafka_file_that_cannot_be_read_is_named() {
        let err = parse(
            "[database]\nurl = \"x\"\n[kafka]\n\"ssl.ca.location\" = \"/nonexistent/ca.pem\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("kafka.\"ssl.ca.location\": cannot read /nonexistent/ca.pem"),
            "{err}"
        );
        parse("[database]\nurl = \"x\"\n[kafka]\n\"ssl.ca.location\" = \"probe\"\n").unwrap();
    }

    #[test]
    fn telemetry_credentials_without_a_listener_are_a_warning() {
        let c =
            parse("[database]\nurl = \"x\"\n[telemetry]\nbearer_token = \"abcdefgh\"\n").unwrap();
        let warnings = c.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].key, "telemetry.listen");
        let c = parse(
            "[database]\nurl = \"x\"\n[telemetry]\nlisten = \"127.0.0.1:9464\"\nbearer_token = \"abcdefgh\"\n",
        )
        .unwrap();
        assert!(c.warnings().is_empty());
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
    fn column_mapping_defaults_to_sluice_names_and_takes_debezium_names() {
        let c = parse("[database]\nurl = \"x\"\n").unwrap();
        let spec = c.database.table_spec().unwrap();
        assert_eq!(spec.columns, ColumnMap::default());

        let c = parse(
            "[database]\nurl = \"x\"\ntable = \"outboxevent\"\n[database.columns]\n\
             aggregate_type = \"aggregatetype\"\naggregate_id = \"aggregateid\"\n\
             event_type = \"type\"\ntenant = \"\"\norder = \"seq\"\n",
        )
        .unwrap();
        let spec = c.database.table_spec().unwrap();
        assert_eq!(spec.name.to_string(), "\"outboxevent\"");
        assert_eq!(spec.columns.aggregate_type.as_str(), "aggregatetype");
        assert_eq!(spec.columns.event_type.as_str(), "type");
        assert_eq!(spec.columns.tenant, TenantColumn::None);
        assert_eq!(
            spec.columns.order.as_ref().map(ColumnName::as_str),
            Some("seq")
        );
        assert_eq!(spec.columns.id.as_str(), "id");
    }

    #[test]
    fn bad_column_mappings_name_their_key() {
        for (bad, key) in [
            ("payload = \"pay load\"", "database.columns.payload"),
            ("tenant = \"x;y\"", "database.columns.tenant"),
            (
                "event_type = \"aggregate_type\"",
                "database.columns.event_type",
            ),
            ("headers = \"last_error\"", "database.columns.headers"),
            ("typ = \"type\"", "typ"),
        ] {
            let text = format!("[database]\nurl = \"x\"\n[database.columns]\n{bad}\n");
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn tenant_without_path_needs_a_default_plugin() {
        let err = parse("[database]\nurl = \"x\"\n[tenants.acme]\nconfig = {}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("tenants.acme.path"), "{err}");
    }

    #[test]
    fn surprising_tenant_inheritance_is_a_warning_not_a_problem() {
        let c = parse(
            "[database]\nurl = \"x\"\n[plugins.default]\nbuiltin = \"route-by-aggregate\"\n\
             config = { topic_prefix = \"d.\" }\nallowed_topics = [\"d.*\"]\n\
             [tenants.acme]\npath = \"acme.wasm\"\n[tenants.plain]\nmemory_mb = 8\n",
        )
        .unwrap();
        let keys: Vec<String> = c.warnings().into_iter().map(|w| w.key).collect();
        assert_eq!(
            keys,
            ["tenants.acme.config", "tenants.acme.allowed_topics"],
            "only the tenant with its own plugin"
        );
        let plain = parse("[database]\nurl = \"x\"\n").unwrap();
        assert!(plain.warnings().is_empty());
    }

    #[test]
    fn kafka_values_of_any_scalar_type_pass_through() {
        let c = parse(
            "[database]\nurl = \"x\"\n[kafka]\n\"linger.ms\" = 5\n\"enable.idempotence\" = false\n",
        )
        .unwrap();
        let props = c.kafka.properties();
        assert_eq!(props["linger.ms"], "5");
        assert_eq!(props["enable.idempotence"], "false");
    }

    #[test]
    fn retry_policy_has_defaults_and_is_validated() {
        let c = parse("[database]\nurl = \"x\"\n").unwrap();
        assert_eq!(c.relay.retry.max_attempts, 10);
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
    fn a_fair_share_needs_a_tenant_column_and_fits_a_batch() {
        let pg = "[database]\nurl = \"postgres://h/db\"\n";
        let c = parse(pg).unwrap();
        assert_eq!(c.store_options().fair_share, None);
        let c = parse(&format!("{pg}[relay]\nfair_share = 0\n")).unwrap();
        assert_eq!(c.store_options().fair_share, None);
        for url in ["postgres://h/db", "mysql://h/db", "sqlite://app.db"] {
            let c = parse(&format!(
                "[database]\nurl = \"{url}\"\n[relay]\nfair_share = 20\n"
            ));
            assert_eq!(c.unwrap().store_options().fair_share, NonZeroUsize::new(20));
        }

        for (text, says) in [
            (
                &format!("{pg}[database.columns]\ntenant = \"\"\n[relay]\nfair_share = 5\n"),
                "relay.fair_share: shares are per tenant",
            ),
            (
                &format!("{pg}[relay]\nbatch_size = 100\nfair_share = 101\n"),
                "relay.fair_share: 101 is more than relay.batch_size (100)",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn the_lease_is_sqlite_only_and_must_outlast_the_message_timeout() {
        let c = parse("[database]\nurl = \"sqlite:///var/app.db\"\n").unwrap();
        assert_eq!(c.store_options().lease, DEFAULT_LEASE);
        let c = parse("[database]\nurl = \"sqlite://app.db\"\nlease = \"5m\"\n").unwrap();
        assert_eq!(c.store_options().lease, Duration::from_secs(300));

        let short = "[database]\nurl = \"sqlite://app.db\"\nlease = \"45s\"\n";
        let err = parse(short).unwrap_err().to_string();
        assert!(
            err.contains("database.lease") && err.contains("[redis]: 30s)"),
            "{err}"
        );
        // A longer producer timeout needs a longer lease; a shorter one allows it.
        let slow = format!("{short}[kafka]\n\"message.timeout.ms\" = 10000\n");
        parse(&slow).unwrap();
        let err = parse(
            "[database]\nurl = \"sqlite://app.db\"\n[kafka]\n\"message.timeout.ms\" = 300000\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("database.lease: 2m is too short"), "{err}");

        let err = parse("[database]\nurl = \"mysql://h/db\"\nlease = \"5m\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("database.lease: only SQLite") && err.contains("MySQL/MariaDB"),
            "{err}"
        );
    }

    #[test]
    fn notify_channel_is_refused_where_the_database_cannot_notify() {
        for url in ["mysql://h/db", "mariadb://h/db", "sqlite:///a.db"] {
            let text = format!("[database]\nurl = \"{url}\"\n[relay]\nnotify_channel = \"c\"\n");
            let err = parse(&text).unwrap_err().to_string();
            assert!(
                err.contains("relay.notify_channel") && err.contains("no LISTEN/NOTIFY"),
                "{url}: {err}"
            );
        }
        parse("[database]\nurl = \"postgres://h/db\"\n[relay]\nnotify_channel = \"c\"\n").unwrap();
    }

    #[test]
    fn acks_weaker_than_all_are_refused_unless_allowed() {
        for strong in ["\"all\"", "\"ALL\"", "-1", "\"-1\""] {
            for key in ["acks", "request.required.acks"] {
                let text = format!("[database]\nurl = \"x\"\n[kafka]\n\"{key}\" = {strong}\n");
                assert!(parse(&text).is_ok(), "{key} = {strong}");
            }
        }
        for weak in ["1", "0", "\"1\"", "2"] {
            for key in ["acks", "request.required.acks"] {
                let text = format!("[database]\nurl = \"x\"\n[kafka]\n\"{key}\" = {weak}\n");
                let err = parse(&text).unwrap_err().to_string();
                assert!(
                    err.contains(&format!("kafka.\"{key}\"")) && err.contains("allow_weak_acks"),
                    "{key} = {weak}: {err}"
                );
                let allowed = format!(
                    "[database]\nurl = \"x\"\n[relay]\nallow_weak_acks = true\n[kafka]\n\"{key}\" = {weak}\n"
                );
                let c = parse(&allowed).unwrap();
                assert_eq!(c.kafka.weak_acks().map(|(k, _)| k), Some(key));
            }
        }
        let c = parse("[database]\nurl = \"x\"\n").unwrap();
        assert_eq!(c.kafka.weak_acks(), None, "Sluice's default is acks=all");
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
    fn recycle_memory_percent_and_cache_max_mb_are_read_and_checked() {
        let c = parse(
            "[database]\nurl = \"x\"\n[plugins]\ncache_max_mb = 64\n\
             [plugins.default]\nbuiltin = \"route-by-aggregate\"\nrecycle_memory_percent = 90\n\
             [tenants.acme]\nmemory_mb = 32\n",
        )
        .unwrap();
        assert_eq!(c.plugins.cache_max_mb, 64);
        let default = c.plugins.default.as_ref().unwrap().limits.clone();
        let acme = c.tenants["acme"].limits.clone().or(&default);
        assert_eq!(acme.recycle_memory_percent, Some(90), "inherited");
        let defaults = parse("[database]\nurl = \"x\"\n").unwrap();
        assert_eq!(defaults.plugins.cache_max_mb, 1024);
        for bad in ["0", "101"] {
            let err = parse(&format!(
                "[database]\nurl = \"x\"\n[tenants.acme]\nbuiltin = \"route-by-aggregate\"\n\
                 recycle_memory_percent = {bad}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains("recycle_memory_percent"), "{bad}: {err}");
        }
        // `plugin test --batch-size` is not a config key.
        let err = parse(
            "[database]\nurl = \"x\"\n[plugins.default]\nbuiltin = \"route-by-aggregate\"\ncall_batch_rows = 8\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("call_batch_rows"), "{err}");
    }

    #[test]
    fn sandbox_keys_have_defaults_and_are_validated() {
        let c = parse("[database]\nurl = \"x\"\n").unwrap();
        assert!(!c.plugins.strict_startup);
        assert_eq!(c.plugins.max_unconfigured_instances, 1024);
        let c = parse(
            "[database]\nurl = \"x\"\n[plugins]\nstrict_startup = true\nmax_unconfigured_instances = 3\n\
             [plugins.default]\nbuiltin = \"route-by-aggregate\"\nmax_headers_per_message = 7\n\
             [tenants.acme]\nmax_batch_output_bytes = 1000\n",
        )
        .unwrap();
        assert!(c.plugins.strict_startup);
        assert_eq!(c.plugins.max_unconfigured_instances, 3);
        let default = c.plugins.default.as_ref().unwrap().limits.clone();
        let acme = c.tenants["acme"].limits.clone().or(&default);
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
