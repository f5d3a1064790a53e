//! Turning a [`Config`](crate::Config) into running services, and the commands an operator
//! runs against a table. The `sluice` binary only parses arguments, calls in here and prints.
//!
//! - [`run`]: `sluice run` and `sluice drain` — plugins, store, sink and relay wired together,
//!   background services started, everything joined at exit
//! - [`admin`]: `sluice migrate` and `sluice dead …`
//! - [`check`]: `sluice config check`
//! - [`replay`]: `sluice replay` (sent rows published again)
//! - `assemble`: one relay wired from the config (plugins, store, sink, loop, metrics)
//! - `endpoints`: what `/metrics`, `/healthz`, `/readyz` and `/status` answer, and starting
//!   them with `[telemetry] listen`
//! - `sampler`: the backlog sampler and broker readiness probe behind the endpoints
//! - [`logging`]: text or JSON log lines
//! - `reload`: live configuration — watches the config file, the tenant files and the plugin
//!   files, and applies changes (also on SIGHUP and `POST /reload`)
//! - `rotate`: re-read credentials replace the producer and the database connections'
//! - [`services`]: the start/stop shape every background service shares
//! - [`status`]: the per-tenant picture of `/status` and `sluice status`

pub mod admin;
mod assemble;
pub mod check;
mod endpoints;
pub mod logging;
mod reload;
pub mod replay;
mod rotate;
mod run;
mod sampler;
pub mod services;
pub mod status;

pub use run::{DrainReport, drain, run};
