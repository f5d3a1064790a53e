//! One tenant's place in the plugin host.
//!
//! - [`slot`]: its template, live runner and how a batch's rows of it are run (batch calls,
//!   time and output budgets)
//! - [`breaker`], [`quarantine`]: why its rows wait
//! - [`status`]: what the router reports about it

pub mod breaker;
pub mod quarantine;
pub mod slot;
pub mod status;
