//! Credential rotation: when the configuration is read again (see [`super::reload`]:
//! SIGHUP, `POST /reload`, a changed config file), `${env:…}` and `${file:…}` references
//! included, a changed `[kafka]`, `[nats]`, `[rabbitmq]`, `[redis]` or `database.url` takes
//! effect without a restart: a new producer or broker connection for the next batches (batches in flight finish on the old one), new database
//! connections with the new URL (open transactions keep theirs), new `[telemetry]`
//! credentials for the next requests to `/metrics`, `/status` and `/reload`, and new
//! `[schema_registry]` credentials for its next requests. So no row in flight is lost or
//! published twice by a rotation. A reference that no longer resolves (a secret file that
//! became unreadable) keeps the old value of its section, and the log says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::assemble::AppRelay;
use crate::config::{Config, Problem};
use crate::encoding::RegistryClient;
use crate::model::Broker;
use crate::sink::BrokerSettings;
use crate::store::Store;
use crate::telemetry::auth::SharedAccess;

/// What the relay runs with now, as last applied.
pub(super) struct Applied {
    pub kafka: BTreeMap<String, String>,
    /// What the files `[kafka]` names by path (`ssl.ca.location`, …) held when its producer
    /// was made: a CA or key renewed at the same path also needs a new producer.
    pub kafka_files: KafkaFiles,
    pub database_url: String,
    /// `[nats]`, `[rabbitmq]`, `[redis]` as their sinks were last given them.
    pub brokers: Vec<BrokerSettings>,
    /// The telemetry endpoints' credentials, when they are served.
    pub telemetry: Option<Arc<SharedAccess>>,
    /// The configuration as last read.
    pub config: Config,
    /// The schema registry's client, whose credentials a SIGHUP replaces.
    pub registry: Option<Arc<RegistryClient>>,
}

impl Applied {
    pub(super) fn of(config: &Config) -> Self {
        let kafka = config.kafka.properties();
        Self {
            kafka_files: KafkaFiles::of(&kafka),
            kafka,
            database_url: config.database_url().to_owned(),
            brokers: other_brokers(config),
            telemetry: None,
            config: config.clone(),
            registry: None,
        }
    }

    /// With the schema registry client whose credentials SIGHUP rotates.
    pub(super) fn with_registry(self, registry: Option<Arc<RegistryClient>>) -> Self {
        Self { registry, ..self }
    }

    /// With the credentials the telemetry server checks (`None`: no server).
    pub(super) fn with_telemetry(self, access: Option<Arc<SharedAccess>>) -> Self {
        Self {
            telemetry: access,
            ..self
        }
    }
}

/// Applies `fresh`'s changed credentials, section by section; a section with one of
/// `problems` keeps its current ones.
pub(super) async fn credentials(
    fresh: &Config,
    problems: &[Problem],
    applied: &mut Applied,
    relay: &Arc<AppRelay>,
    store: &Store,
) {
    if !held_back(problems, "kafka") {
        rotate_kafka(fresh, applied, relay).await;
    }
    for broker in [Broker::Nats, Broker::Rabbitmq, Broker::Redis] {
        if !held_back(problems, broker.as_str()) {
            rotate_broker(fresh, broker, applied, relay).await;
        }
    }
    if !held_back(problems, "database") {
        rotate_database(fresh, applied, store).await;
    }
    if !held_back(problems, "telemetry") {
        rotate_telemetry(fresh, applied);
    }
    if !held_back(problems, "schema_registry") {
        rotate_registry(fresh, applied);
    }
}

/// Changed `[schema_registry]` credentials: used from the next request on.
fn rotate_registry(fresh: &Config, applied: &Applied) {
    let (Some(client), Some(settings)) = (&applied.registry, &fresh.schema_registry) else {
        return;
    };
    if client.rotate(settings) {
        tracing::info!("config reload: the schema registry's credentials were replaced");
    }
}

/// A changed `[kafka]`, or a changed file it names: a new producer for the next batches.
async fn rotate_kafka(fresh: &Config, applied: &mut Applied, relay: &Arc<AppRelay>) {
    let kafka = fresh.kafka.properties();
    let files = KafkaFiles::of(&kafka);
    if kafka == applied.kafka && files == applied.kafka_files {
        tracing::debug!("config reload: [kafka] and the files it names unchanged");
        return;
    }
    let (relay, properties) = (Arc::clone(relay), kafka.clone());
    // Creating a producer and dropping the old one block.
    let settings = BrokerSettings::Kafka(properties);
    match tokio::task::spawn_blocking(move || relay.sink().reconfigure(&settings)).await {
        Ok(Ok(())) => {
            tracing::info!(
                "config reload: new kafka producer from the re-read [kafka]; batches in flight finish on the old one"
            );
            applied.kafka = kafka;
            applied.kafka_files = files;
        }
        Ok(Err(e)) => tracing::error!(error = %e,
            "config reload: the re-read [kafka] settings do not make a producer; keeping the current one"),
        Err(e) => tracing::error!(error = %e, "config reload: replacing the kafka producer failed"),
    }
}

/// The configured brokers other than Kafka, with their settings.
fn other_brokers(config: &Config) -> Vec<BrokerSettings> {
    config
        .broker_settings()
        .into_iter()
        .filter(|b| b.broker() != Broker::Kafka)
        .collect()
}

/// A changed `[nats]`, `[rabbitmq]` or `[redis]` (rotated credentials): a new connection for
/// the next batches, batches in flight finish on the old one. A section added since the start
/// is not connected (read at start only), nor is a removed one dropped.
async fn rotate_broker(
    fresh: &Config,
    broker: Broker,
    applied: &mut Applied,
    relay: &Arc<AppRelay>,
) {
    let find = |list: &[BrokerSettings]| list.iter().find(|b| b.broker() == broker).cloned();
    let (Some(wanted), Some(current)) = (find(&other_brokers(fresh)), find(&applied.brokers))
    else {
        return;
    };
    if wanted == current {
        tracing::debug!(%broker, "config reload: broker settings unchanged");
        return;
    }
    let (relay, settings) = (Arc::clone(relay), wanted.clone());
    match tokio::task::spawn_blocking(move || relay.sink().reconfigure(&settings)).await {
        Ok(Ok(())) => {
            tracing::info!(%broker,
                "config reload: new broker connection from the re-read settings; batches in flight finish on the old one");
            applied.brokers.retain(|b| b.broker() != broker);
            applied.brokers.push(wanted);
        }
        Ok(Err(e)) => tracing::error!(%broker, error = %e,
            "config reload: the re-read broker settings do not connect; keeping the current connection"),
        Err(e) => {
            tracing::error!(%broker, error = %e, "config reload: replacing the broker connection failed")
        }
    }
}

/// A digest of each file (or directory of files) a `*.location` property names; `None` where
/// it cannot be read (librdkafka will say why when it makes the producer).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct KafkaFiles(BTreeMap<String, Option<[u8; 32]>>);

impl KafkaFiles {
    pub(super) fn of(properties: &BTreeMap<String, String>) -> Self {
        Self(
            properties
                .iter()
                .filter(|(key, _)| key.ends_with(".location"))
                .map(|(key, path)| (key.clone(), digest(Path::new(path))))
                .collect(),
        )
    }
}

/// SHA-256 of a file, or of a directory's files (names and contents, in name order:
/// `ssl.ca.location` may name a directory of CA certificates).
fn digest(path: &Path) -> Option<[u8; 32]> {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .ok()?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for file in files {
            hash.update(file.as_os_str().as_encoded_bytes());
            hash.update(std::fs::read(&file).ok()?);
        }
    } else {
        hash.update(std::fs::read(path).ok()?);
    }
    Some(hash.finalize().into())
}

/// A changed `database.url`: new connections use it (unless a file it names is unreadable).
async fn rotate_database(fresh: &Config, applied: &mut Applied, store: &Store) {
    let url = fresh.database_url();
    if url == applied.database_url {
        tracing::debug!("config reload: database.url unchanged");
        return;
    }
    if let Err(e) = crate::store::check_url(url) {
        tracing::warn!(error = %e, "config reload: keeping the current database.url");
        return;
    }
    match store.use_url(url).await {
        Ok(()) => {
            tracing::info!("config reload: new database connections use the re-read database.url")
        }
        Err(e) => tracing::warn!(error = %e,
            "config reload: new database connections use the re-read database.url, but a trial connection with it failed"),
    }
    applied.database_url = url.to_owned();
}

/// Changed `[telemetry]` credentials: the next requests to `/metrics` and `/status` need them.
fn rotate_telemetry(fresh: &Config, applied: &Applied) {
    let Some(access) = &applied.telemetry else {
        return;
    };
    let wanted = fresh.telemetry.access();
    if wanted != access.current() {
        tracing::info!(
            access = wanted.describe(),
            "config reload: /metrics and /status take the re-read [telemetry] credentials"
        );
        access.set(wanted);
    } else {
        tracing::debug!("config reload: [telemetry] credentials unchanged");
    }
}

/// Keys checked against a section's values that live elsewhere: the SQLite lease must outlast
/// `[kafka]`'s `message.timeout.ms`, so a lease problem keeps the current `[kafka]` too.
const BOUND_ACROSS: &[(&str, &str)] = &[
    ("kafka", "database.lease"),
    ("nats", "database.lease"),
    ("rabbitmq", "database.lease"),
    ("redis", "database.lease"),
];

/// Whether the re-read `section` has a problem, which keeps its current values in use: a
/// secret file that became unreadable must not replace working credentials with nothing.
fn held_back(problems: &[Problem], section: &str) -> bool {
    let mut held = false;
    let bound = |key: &str| {
        in_section(key, section)
            || BOUND_ACROSS
                .iter()
                .any(|(s, other)| *s == section && in_section(key, other))
    };
    for p in problems.iter().filter(|p| bound(&p.key)) {
        tracing::warn!(key = %p.key, problem = %p.reason(),
            "config reload: keeping the current [{section}] settings");
        held = true;
    }
    held
}

pub(super) fn in_section(key: &str, section: &str) -> bool {
    key == section
        || key
            .strip_prefix(section)
            .is_some_and(|rest| rest.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_renewed_at_the_same_path_counts_as_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "old CA").unwrap();
        let properties = BTreeMap::from([
            ("ssl.ca.location".to_owned(), ca.display().to_string()),
            ("bootstrap.servers".to_owned(), "b:9093".to_owned()),
        ]);
        let before = KafkaFiles::of(&properties);
        assert_eq!(before, KafkaFiles::of(&properties));
        std::fs::write(&ca, "renewed CA").unwrap();
        assert_ne!(before, KafkaFiles::of(&properties));
        // A directory of certificates: a file added to it counts too.
        let properties = BTreeMap::from([(
            "ssl.ca.location".to_owned(),
            dir.path().display().to_string(),
        )]);
        let before = KafkaFiles::of(&properties);
        std::fs::write(dir.path().join("second.pem"), "another CA").unwrap();
        assert_ne!(before, KafkaFiles::of(&properties));
    }

    #[test]
    fn a_problem_holds_back_only_its_own_section() {
        let problems = vec![Problem::new(
            r#"kafka."sasl.password""#,
            "cannot read file /run/secrets/pw",
        )];
        assert!(held_back(&problems, "kafka"));
        assert!(!held_back(&problems, "database"));
        // A longer message timeout than the SQLite lease allows keeps the current producer.
        let lease = vec![Problem::new("database.lease", "2m is too short")];
        assert!(held_back(&lease, "kafka"));
        assert!(held_back(&lease, "database"));
        assert!(!held_back(&lease, "telemetry"));
        assert!(in_section("database.url", "database"));
        assert!(!in_section("databases.url", "database"));
    }
}
