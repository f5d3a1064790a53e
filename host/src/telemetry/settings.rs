//! `[telemetry]`: where the HTTP endpoints listen, who may read them, and how often and how
//! far the backlog is sampled.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;

use super::auth::Access;
use super::labels::{DEFAULT_TENANT_SERIES, LabelBudget, MAX_TENANT_SERIES, OTHER_TENANTS};
use super::laggards::{DEFAULT_LAGGARDS, MAX_LABEL_VALUE, MAX_LAGGARDS};
use super::listen::ListenAddr;
use crate::problem::Problem;
use crate::secret::Secret;

/// How often the sampler reads the backlog gauges and checks the database and the broker:
/// a fraction of a statement per second, and fresh enough for alerts that wait minutes.
pub(crate) const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(15);
/// Rows one sample reads at most (unsent, then dead): the gauges saturate there, so the
/// sample stays cheap however large the backlog grows.
pub(crate) const DEFAULT_SAMPLE_LIMIT: i64 = 10_000;
/// How long one batch may be in a worker's hands before `/healthz` calls the worker stuck. A
/// batch's steps are each bounded far below it (the producer gives up after
/// `message.timeout.ms`, 30 s by default); a worker past it is wedged and a restart helps.
pub(crate) const DEFAULT_STALLED_AFTER: Duration = Duration::from_secs(300);
/// How long a readiness check waits for the broker.
pub(crate) const BROKER_PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a readiness check waits for the database (the backlog sample): a database that
/// accepts connections but does not answer is as good as down.
pub(crate) const DATABASE_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// `[telemetry]`; unset keys take their defaults. Without `listen`, no endpoint is served and
/// nothing is sampled. (`Debug` shows no credential: they are [`Secret`]s.)
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// `host:port` of `/metrics`, `/healthz`, `/readyz` and `/status` (e.g. `127.0.0.1:9464`,
    /// `localhost:9464`); see [`TelemetrySettings::listen_addr`].
    pub listen: Option<String>,
    /// Required (`Authorization: Bearer …`) to read `/metrics` and `/status`.
    pub bearer_token: Option<Secret>,
    /// With `basic_auth_password`: required (HTTP basic auth) to read `/metrics` and `/status`.
    pub basic_auth_username: Option<String>,
    pub basic_auth_password: Option<Secret>,
    #[serde(with = "humantime_serde")]
    pub sample_interval: Duration,
    pub sample_limit: i64,
    /// How many of the tenants furthest behind `/status` lists and the backlog gauges label by
    /// name (0: none).
    pub laggards: usize,
    /// At most this many tenants have a `tenant` label value of their own; the others share
    /// `_default` (see [`LabelBudget`]).
    pub tenant_series: usize,
    /// Tenants always labelled by name (within `tenant_series`), configured or not.
    pub watched_tenants: Vec<String>,
    /// A worker whose batch has been in hand longer than this fails `/healthz`.
    #[serde(with = "humantime_serde")]
    pub stalled_after: Duration,
    /// Serve `POST /reload` (re-read the configuration and the plugins now, as SIGHUP does):
    /// only with credentials, which the request must carry.
    pub reload: bool,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            listen: None,
            bearer_token: None,
            basic_auth_username: None,
            basic_auth_password: None,
            sample_interval: DEFAULT_SAMPLE_INTERVAL,
            sample_limit: DEFAULT_SAMPLE_LIMIT,
            laggards: DEFAULT_LAGGARDS,
            tenant_series: DEFAULT_TENANT_SERIES,
            watched_tenants: Vec::new(),
            stalled_after: DEFAULT_STALLED_AFTER,
            reload: false,
        }
    }
}

impl TelemetrySettings {
    /// `listen` parsed (not resolved: see [`ListenAddr::resolve`]); `None` when unset.
    pub fn listen_addr(&self) -> Option<Result<ListenAddr, String>> {
        self.listen.as_deref().map(ListenAddr::parse)
    }

    /// What `/metrics` and `/status` require. The keys are checked by [`Self::problems`]; of
    /// a conflicting pair the token wins (a config with both never loads).
    pub fn access(&self) -> Access {
        match (
            &self.bearer_token,
            &self.basic_auth_username,
            &self.basic_auth_password,
        ) {
            (Some(token), _, _) => Access::Bearer(token.clone()),
            (None, Some(username), Some(password)) => Access::Basic {
                username: username.clone(),
                password: password.clone(),
            },
            _ => Access::Open,
        }
    }

    /// Who may have a `tenant` label value of their own.
    pub fn label_budget(&self) -> LabelBudget {
        LabelBudget {
            tenant_series: self.tenant_series,
            watched: self.watched_tenants.iter().cloned().collect(),
            laggards: self.laggards,
        }
    }

    /// Values that cannot work, at their `telemetry.` keys.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Some(Err(message)) = self.listen_addr() {
            problems.push(Problem::new("telemetry.listen", message));
        }
        problems.extend(self.auth_problems());
        if self.reload && self.access() == Access::Open {
            problems.push(Problem::new(
                "telemetry.reload",
                "POST /reload changes what the relay runs: it is served only to a caller with \
                 credentials; set bearer_token, or basic_auth_username and basic_auth_password",
            ));
        }
        if self.sample_interval < Duration::from_secs(1) {
            problems.push(Problem::new(
                "telemetry.sample_interval",
                "must be at least 1s",
            ));
        }
        if self.stalled_after < Duration::from_secs(1) {
            problems.push(Problem::new(
                "telemetry.stalled_after",
                "must be at least 1s",
            ));
        }
        if self.sample_limit < 1 {
            problems.push(Problem::new("telemetry.sample_limit", "must be at least 1"));
        }
        if self.laggards > MAX_LAGGARDS {
            problems.push(Problem::new(
                "telemetry.laggards",
                format!(
                    "must be between 0 (off) and {MAX_LAGGARDS}, got {}",
                    self.laggards
                ),
            ));
        }
        problems.extend(self.label_problems());
        problems
    }

    /// `tenant_series` and `watched_tenants`: the watched tenants and the laggards' places
    /// fit the budget, and every watched name can be a label value of its own.
    fn label_problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.tenant_series > MAX_TENANT_SERIES {
            problems.push(Problem::new(
                "telemetry.tenant_series",
                format!(
                    "must be between 0 and {MAX_TENANT_SERIES}, got {}",
                    self.tenant_series
                ),
            ));
        }
        let watched: BTreeSet<&str> = self.watched_tenants.iter().map(String::as_str).collect();
        if watched.len() + self.laggards.min(MAX_LAGGARDS) > self.tenant_series {
            problems.push(Problem::new(
                "telemetry.tenant_series",
                format!(
                    "{} is fewer than the {} watched_tenants plus the {} laggards it must \
                     hold; raise tenant_series or lower the others",
                    self.tenant_series,
                    watched.len(),
                    self.laggards
                ),
            ));
        }
        if watched.len() < self.watched_tenants.len() {
            problems.push(Problem::new(
                "telemetry.watched_tenants",
                "names a tenant twice",
            ));
        }
        for name in &self.watched_tenants {
            let unfit = if name.is_empty() {
                Some("an empty name (rows without a tenant count into _default)")
            } else if name == OTHER_TENANTS {
                Some("\"_default\", the label value of the tenants without their own")
            } else if name.len() > MAX_LABEL_VALUE || name.chars().any(char::is_control) {
                Some("a name longer than 128 bytes or with control characters")
            } else {
                None
            };
            if let Some(unfit) = unfit {
                problems.push(Problem::new(
                    "telemetry.watched_tenants",
                    format!("cannot watch {unfit}"),
                ));
            }
        }
        problems
    }

    /// The credential keys: one scheme at most, complete, and sendable in an HTTP header.
    /// Messages never quote a value.
    fn auth_problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let basic = self.basic_auth_username.is_some() || self.basic_auth_password.is_some();
        if self.bearer_token.is_some() && basic {
            problems.push(Problem::new(
                "telemetry.bearer_token",
                "set either bearer_token or basic_auth_username and basic_auth_password, \
                 not both",
            ));
        }
        if let Some(token) = &self.bearer_token {
            let token = token.expose();
            if token.is_empty() {
                problems.push(Problem::new(
                    "telemetry.bearer_token",
                    "is empty (an empty file or variable?); remove the key to leave the \
                     endpoints open",
                ));
            } else if !token.bytes().all(|b| b.is_ascii_graphic()) {
                problems.push(Problem::new(
                    "telemetry.bearer_token",
                    "contains spaces, line breaks or non-ASCII characters, which an \
                     Authorization header cannot carry (a file with an extra line?)",
                ));
            }
        }
        match (&self.basic_auth_username, &self.basic_auth_password) {
            (Some(_), None) => problems.push(Problem::new(
                "telemetry.basic_auth_password",
                "missing: basic_auth_username needs basic_auth_password",
            )),
            (None, Some(_)) => problems.push(Problem::new(
                "telemetry.basic_auth_username",
                "missing: basic_auth_password needs basic_auth_username",
            )),
            _ => {}
        }
        if let Some(username) = &self.basic_auth_username {
            if username.is_empty() {
                problems.push(Problem::new("telemetry.basic_auth_username", "is empty"));
            } else if username.contains(':') || username.chars().any(char::is_control) {
                problems.push(Problem::new(
                    "telemetry.basic_auth_username",
                    "must not contain a colon or control characters (basic auth separates \
                     the user name from the password with a colon)",
                ));
            }
        }
        if let Some(password) = &self.basic_auth_password {
            if password.expose().is_empty() {
                problems.push(Problem::new(
                    "telemetry.basic_auth_password",
                    "is empty (an empty file or variable?)",
                ));
            } else if password.expose().chars().any(char::is_control) {
                problems.push(Problem::new(
                    "telemetry.basic_auth_password",
                    "contains line breaks or other control characters (a file with an extra \
                     line?)",
                ));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml_text: &str) -> TelemetrySettings {
        toml::from_str(toml_text).unwrap_or_else(|e| panic!("{toml_text}: {e}"))
    }

    fn keys(s: &TelemetrySettings) -> Vec<String> {
        s.problems().into_iter().map(|p| p.key).collect()
    }

    #[test]
    fn listen_takes_a_host_name_and_names_a_missing_port() {
        let s = settings("listen = \"localhost:9464\"");
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        let s = settings("listen = \"localhost\"");
        let problems = s.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].key, "telemetry.listen");
        assert!(problems[0].message.contains("has no port"), "{problems:?}");
    }

    #[test]
    fn laggards_default_to_ten_and_are_bounded() {
        assert_eq!(settings("").laggards, DEFAULT_LAGGARDS);
        assert!(settings("laggards = 0").problems().is_empty());
        let s = settings("laggards = 101");
        assert_eq!(keys(&s), ["telemetry.laggards"]);
        assert!(
            s.problems()[0].message.contains("got 101"),
            "{:?}",
            s.problems()
        );
        assert!(toml::from_str::<TelemetrySettings>("laggards = -1").is_err());
    }

    #[test]
    fn the_tenant_series_budget_holds_the_watched_tenants_and_the_laggards() {
        let s = settings("");
        assert_eq!(s.tenant_series, DEFAULT_TENANT_SERIES);
        assert_eq!(s.label_budget(), LabelBudget::default());
        let s = settings("tenant_series = 3\nlaggards = 1\nwatched_tenants = [\"a\", \"b\"]");
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        let s = settings("tenant_series = 3\nlaggards = 2\nwatched_tenants = [\"a\", \"b\"]");
        assert_eq!(keys(&s), ["telemetry.tenant_series"]);
        assert!(
            s.problems()[0]
                .message
                .contains("2 watched_tenants plus the 2 laggards")
        );
        let s = settings("tenant_series = 1001");
        assert_eq!(keys(&s), ["telemetry.tenant_series"]);
        assert!(toml::from_str::<TelemetrySettings>("tenant_series = -1").is_err());
        assert!(
            settings("tenant_series = 0\nlaggards = 0")
                .problems()
                .is_empty()
        );
    }

    #[test]
    fn watched_tenants_must_be_names_a_label_can_carry() {
        let s = settings("watched_tenants = [\"a\", \"a\", \"\", \"_default\", \"x\\n\"]");
        let problems = s.problems();
        assert_eq!(keys(&s), ["telemetry.watched_tenants"; 4], "{problems:?}");
        assert!(problems[0].message.contains("twice"), "{problems:?}");
        assert!(problems[2].message.contains("_default"), "{problems:?}");
        let long = format!("watched_tenants = [\"{}\"]", "x".repeat(129));
        assert_eq!(keys(&settings(&long)), ["telemetry.watched_tenants"]);
    }

    #[test]
    fn no_credentials_leave_the_endpoints_open() {
        let s = settings("listen = \"127.0.0.1:9464\"");
        assert_eq!(s.access(), Access::Open);
        assert!(s.problems().is_empty());
    }

    #[test]
    fn a_bearer_token_or_a_user_and_password_protect_the_endpoints() {
        let s = settings("bearer_token = \"abc\"");
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        assert_eq!(s.access(), Access::Bearer(Secret::new("abc")));
        let s = settings("basic_auth_username = \"prom\"\nbasic_auth_password = \"pw\"");
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        assert!(matches!(s.access(), Access::Basic { username, .. } if username == "prom"));
    }

    #[test]
    fn token_and_basic_auth_exclude_each_other() {
        let s = settings(
            "bearer_token = \"abc\"\nbasic_auth_username = \"prom\"\nbasic_auth_password = \"pw\"",
        );
        let problems = s.problems();
        assert_eq!(keys(&s), ["telemetry.bearer_token"], "{problems:?}");
        assert!(
            problems[0].message.contains("basic_auth_username"),
            "{problems:?}"
        );
    }

    #[test]
    fn basic_auth_needs_both_keys() {
        let s = settings("basic_auth_username = \"prom\"");
        assert_eq!(keys(&s), ["telemetry.basic_auth_password"]);
        assert_eq!(s.access(), Access::Open);
        let s = settings("basic_auth_password = \"pw\"");
        assert_eq!(keys(&s), ["telemetry.basic_auth_username"]);
    }

    #[test]
    fn empty_or_unsendable_credentials_are_refused_without_showing_them() {
        let s = settings("bearer_token = \"\"");
        assert_eq!(keys(&s), ["telemetry.bearer_token"]);
        assert!(s.problems()[0].message.contains("is empty"));
        let s = settings("bearer_token = \"tok3n-x\\n\\n\"");
        assert_eq!(keys(&s), ["telemetry.bearer_token"]);
        let s = settings("basic_auth_username = \"a:b\"\nbasic_auth_password = \"tok3n-x\"");
        assert_eq!(keys(&s), ["telemetry.basic_auth_username"]);
        let s = settings("basic_auth_username = \"a\"\nbasic_auth_password = \"\"");
        assert_eq!(keys(&s), ["telemetry.basic_auth_password"]);
        for s in [
            settings("bearer_token = \"tok3n-x\\n\\n\""),
            settings("bearer_token = \"tok3n-x\"\nbasic_auth_username = \"u\""),
        ] {
            let shown = format!("{:?} {s:?}", s.problems());
            assert!(!shown.contains("tok3n-x"), "{shown}");
        }
    }
}
