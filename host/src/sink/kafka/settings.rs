//! `[kafka]`: librdkafka properties, passed through unchanged over Sluice's producer defaults,
//! and what is wrong with them on their own.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use serde::{Deserialize, Deserializer};

use crate::problem::Problem;
use crate::secret::{Secret, is_secret_key};
use crate::text::toml_scalar;

/// Sluice's producer defaults; any `[kafka]` property overrides them.
/// - idempotence + acks=all: no duplicates from producer retries, no loss on leader change.
/// - message.timeout.ms: the batch's transaction stays open while we wait for reports, so give
///   up after 30 s (librdkafka's default is 5 min) and reschedule the rows instead.
/// - linger.ms: Sluice enqueues a whole batch at once and then waits, so librdkafka's 5 ms
///   default only adds latency; 1 ms still lets a batch's messages share produce requests.
pub(crate) const DEFAULT_PROPERTIES: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("message.timeout.ms", "30000"),
    ("linger.ms", "1"),
];

/// The client configuration Sluice uses: defaults, then the user's properties.
pub(crate) fn kafka_client_config(properties: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in DEFAULT_PROPERTIES {
        config.set(*k, *v);
    }
    for (k, v) in properties {
        config.set(k, v);
    }
    config
}

/// The acknowledgement setting among `properties` — `acks`, or its alias
/// `request.required.acks` — when it is weaker than `all` (`-1`): key and value. Sluice marks a
/// row sent on the acknowledgement, so anything weaker can lose messages of rows already
/// marked.
fn weak_acks(properties: &BTreeMap<String, String>) -> Option<(&'static str, String)> {
    ["acks", "request.required.acks"]
        .into_iter()
        .find_map(|key| {
            let value = properties.get(key)?;
            let strong = value.trim().eq_ignore_ascii_case("all") || value.trim() == "-1";
            (!strong).then(|| (key, value.clone()))
        })
}

/// The producer's `message.timeout.ms` unless `[kafka]` sets it (see [`DEFAULT_PROPERTIES`]).
const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// `[kafka]`: librdkafka properties, passed through unchanged (values may be strings, numbers
/// or booleans) over [`DEFAULT_PROPERTIES`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KafkaSettings(BTreeMap<String, Property>);

/// One property's value as written; a credential's (`sasl.password`, `ssl.key.password`, any
/// secret-like key: [`is_secret_key`]) is a [`Secret`], shown by nothing but the client
/// configuration.
#[derive(Debug, Clone, PartialEq)]
enum Property {
    Value(toml::Value),
    Secret(Secret),
}

impl<'de> Deserialize<'de> for KafkaSettings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let written = BTreeMap::<String, toml::Value>::deserialize(deserializer)?;
        let properties = written.into_iter().map(|(key, value)| {
            let value = match value {
                toml::Value::String(s) if is_secret_key(&key) => Property::Secret(Secret::read(s)),
                other => Property::Value(other),
            };
            (key, value)
        });
        Ok(Self(properties.collect()))
    }
}

impl KafkaSettings {
    /// The properties as strings, credentials exposed: for the client configuration only
    /// (values that are not scalars left out: [`Self::problems`] names them).
    pub fn properties(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .filter_map(|(k, v)| property_value(v).ok().map(|v| (k.clone(), v)))
            .collect()
    }

    /// How long the producer tries to deliver a message (`message.timeout.ms`, or its alias
    /// `delivery.timeout.ms`; Sluice's default otherwise).
    pub fn message_timeout(&self) -> Duration {
        let properties = self.properties();
        ["message.timeout.ms", "delivery.timeout.ms"]
            .iter()
            .find_map(|key| properties.get(*key))
            .and_then(|ms| ms.trim().parse::<u64>().ok())
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_MESSAGE_TIMEOUT)
    }

    /// The acknowledgement setting when it is weaker than `all`: key and value (Sluice marks
    /// a row sent on the acknowledgement, so anything weaker can lose messages of rows
    /// already marked).
    pub fn weak_acks(&self) -> Option<(&'static str, String)> {
        weak_acks(&self.properties())
    }

    /// What is wrong with the properties on their own, each at `kafka."<property>"`: values
    /// that are not scalars, and `*.location` files that cannot be read.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        for (key, value) in &self.0 {
            if let Err(message) = property_value(value) {
                problems.push(Problem::new(format!("kafka.\"{key}\""), message));
            }
        }
        // librdkafka names neither the path nor the reason when it cannot read one of these.
        for (key, path) in self.properties() {
            if key.ends_with(".location")
                && path != "probe"
                && let Err(e) = std::fs::File::open(&path)
            {
                problems.push(Problem::caused(
                    format!("kafka.\"{key}\""),
                    format!("cannot read {path}"),
                    e,
                ));
            }
        }
        problems
    }
}

fn property_value(value: &Property) -> Result<String, &'static str> {
    match value {
        Property::Secret(secret) => Ok(secret.expose().to_owned()),
        Property::Value(value) => {
            toml_scalar(value).ok_or("librdkafka properties must be strings, numbers or booleans")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_never_shown_but_reach_the_client_configuration() {
        let settings: KafkaSettings = toml::from_str(
            "\"sasl.password\" = \"Kafka-Pw-7391\"\n\"bootstrap.servers\" = \"b:9092\"\n\
             \"linger.ms\" = 5\n",
        )
        .unwrap();
        let shown = format!("{settings:?}");
        assert!(
            !shown.contains("Kafka-Pw-7391") && shown.contains("b:9092"),
            "{shown}"
        );
        let properties = settings.properties();
        assert_eq!(properties["sasl.password"], "Kafka-Pw-7391");
        assert_eq!(properties["linger.ms"], "5");
        assert_eq!(
            crate::secret::scrub("auth Kafka-Pw-7391 failed"),
            "auth [redacted] failed",
            "read from the configuration, so registered"
        );
    }
}
