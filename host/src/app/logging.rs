//! Where the logs go and in which form: human-readable lines (the default), or one JSON
//! object per line for log collectors (`--log-format json`, or `SLUICE_LOG_FORMAT=json`).
//! `RUST_LOG` filters both (default `info`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::secret::ScrubbingWriter;

/// The form of log lines on standard error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, coloured only at a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (the message and
    /// every structured field), and the spans.
    Json,
}

/// The log filter without `RUST_LOG`. lapin logs every message RabbitMQ returns at WARN with
/// its payload (a tenant's data, in the relay's log) and every lost connection at ERROR; the
/// RabbitMQ sink reports both itself, once, without payloads. async-nats logs every client event
/// at INFO and each failed reconnect at ERROR; the NATS sink logs each change of state once.
pub const DEFAULT_FILTER: &str = "info,lapin=off,async_nats=off";

/// Installs the global subscriber. Call once, first thing. Every line is scrubbed of the
/// configuration's secrets ([`crate::secret`]), whoever logged it: Sluice, librdkafka's log
/// and error callbacks (which echo parts of its configuration), a plugin's `log`.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| ScrubbingWriter(std::io::stderr()));
    match format {
        // Colour codes only for a person at a terminal, not for log files and collectors.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}
