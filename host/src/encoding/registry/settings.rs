//! `[schema_registry]`: where `value_format`/`key_format` schemas come from, and how to reach it.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::problem::Problem;
use crate::secret::Secret;

/// How long a subject's latest version is trusted before it is asked for again.
pub const DEFAULT_LATEST_TTL: Duration = Duration::from_secs(60);
/// Budget of one registry request (connect + answer).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// `[schema_registry]`: a Confluent-compatible Schema Registry (Confluent, Karapace, Apicurio's
/// `ccompat` API, Redpanda). (`Debug` shows no credential: they are [`Secret`]s.)
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// Base URL, e.g. `http://registry:8081` (a path prefix is kept: Apicurio serves the
    /// Confluent API under `/apis/ccompat/v7`).
    pub url: String,
    /// Basic authentication (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    /// Basic authentication (with `username`); `${file:…}` keeps it out of the file.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Bearer authentication instead of basic.
    #[serde(default)]
    pub bearer_token: Option<Secret>,
    /// Budget of one request, e.g. `"5s"`.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// PEM file of the CA that signed the registry's certificate (`https://` URLs), trusted in
    /// addition to the system's.
    #[serde(default)]
    pub ca_location: Option<PathBuf>,
    /// How long a subject's latest version is used before the registry is asked again: a
    /// newly registered version is picked up within it.
    #[serde(default = "default_latest_ttl", with = "humantime_serde")]
    pub latest_ttl: Duration,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

fn default_latest_ttl() -> Duration {
    DEFAULT_LATEST_TTL
}

impl RegistrySettings {
    /// Values that cannot work, each with its key.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        match reqwest::Url::parse(&self.url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            Ok(url) => problems.push(Problem::new(
                "schema_registry.url",
                format!("scheme {:?} is not http or https", url.scheme()),
            )),
            Err(e) => problems.push(Problem::new(
                "schema_registry.url",
                format!("not a URL ({e})"),
            )),
        }
        if self.username.is_some() != self.password.is_some() {
            problems.push(Problem::new(
                "schema_registry.username",
                "basic authentication needs both username and password",
            ));
        }
        if self.bearer_token.is_some() && self.username.is_some() {
            problems.push(Problem::new(
                "schema_registry.bearer_token",
                "set either bearer_token or username/password, not both",
            ));
        }
        if self.timeout.is_zero() {
            problems.push(Problem::new("schema_registry.timeout", "must be above 0"));
        }
        problems
    }
}
