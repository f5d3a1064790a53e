//! `[telemetry]`: where the HTTP endpoints listen, and how often and how far the backlog is
//! sampled.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

/// How often the sampler reads the backlog gauges and checks the database and the broker:
/// a fraction of a statement per second, and fresh enough for alerts that wait minutes.
pub const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(15);
/// Rows one sample reads at most (unsent, then dead): the gauges saturate there, so the
/// sample stays cheap however large the backlog grows.
pub const DEFAULT_SAMPLE_LIMIT: i64 = 10_000;
/// How long one batch may be in a worker's hands before `/healthz` calls the worker stuck. A
/// batch's steps are each bounded far below it (the producer gives up after
/// `message.timeout.ms`, 30 s by default); a worker past it is wedged and a restart helps.
pub const DEFAULT_STALLED_AFTER: Duration = Duration::from_secs(300);
/// How long a readiness check waits for the broker.
pub const BROKER_PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a readiness check waits for the database (the backlog sample): a database that
/// accepts connections but does not answer is as good as down.
pub const DATABASE_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// `[telemetry]`; unset keys take their defaults. Without `listen`, no endpoint is served and
/// nothing is sampled.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySettings {
    /// Address of `/metrics`, `/healthz`, `/readyz` and `/status` (e.g. `127.0.0.1:9464`).
    pub listen: Option<SocketAddr>,
    #[serde(with = "humantime_serde")]
    pub sample_interval: Duration,
    pub sample_limit: i64,
    /// A worker whose batch has been in hand longer than this fails `/healthz`.
    #[serde(with = "humantime_serde")]
    pub stalled_after: Duration,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            listen: None,
            sample_interval: DEFAULT_SAMPLE_INTERVAL,
            sample_limit: DEFAULT_SAMPLE_LIMIT,
            stalled_after: DEFAULT_STALLED_AFTER,
        }
    }
}

impl TelemetrySettings {
    /// Values that cannot work: key (under `telemetry.`) and why.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.sample_interval < Duration::from_secs(1) {
            problems.push(("sample_interval", "must be at least 1s".to_owned()));
        }
        if self.stalled_after < Duration::from_secs(1) {
            problems.push(("stalled_after", "must be at least 1s".to_owned()));
        }
        if self.sample_limit < 1 {
            problems.push(("sample_limit", "must be at least 1".to_owned()));
        }
        problems
    }
}
