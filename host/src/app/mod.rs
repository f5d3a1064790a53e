//! Turning a [`Config`](crate::Config) into running services, and the commands an operator
//! runs against a table. The `sluice` binary only parses arguments, calls in here and prints.
//!
//! - [`run`]: `sluice run` and `sluice drain` — plugins, store, sink and relay wired together,
//!   background services started, everything joined at exit
//! - [`admin`]: `sluice migrate` and `sluice dead …`
//! - [`services`]: the start/stop shape every background service shares
//! - [`progress`]: `sluice drain`'s progress bar or log lines

pub mod admin;
mod assemble;
mod plugin_watch;
pub mod progress;
mod run;
pub mod services;

pub use run::{DrainReport, drain, run};
