//! Sluice: a polling publisher for the Transactional Outbox pattern.
//!
//! Rows are claimed from an outbox table (`FOR UPDATE SKIP LOCKED`), transformed and routed
//! by per-tenant WebAssembly plugins, published to Kafka, and marked sent in the same
//! transaction that claimed them. Delivery is at-least-once; a plugin failure never publishes
//! an untransformed row.
//!
//! The seams are traits: [`store::OutboxStore`] (where rows come from, and every SQL
//! statement), [`plugin::RowTransformer`] (what turns rows into messages) and [`sink::Sink`]
//! (where messages go); [`relay::Relay`] is the loop that joins them, and [`app`] turns a
//! [`Config`] into running services. Read `docs/architecture.md` for the map.

pub mod app;
pub mod config;
pub mod encoding;
mod maintenance;
pub mod model;
pub mod plugin;
mod problem;
pub mod relay;
pub mod secret;
mod setting_group;
pub mod shutdown;
mod sink;
pub mod store;
mod telemetry;
pub mod text;
pub mod trace;

pub use config::Config;
pub use relay::{Relay, RelaySettings, RelayStats};
