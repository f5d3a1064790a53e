//! Sluice: a polling publisher for the Transactional Outbox pattern.
//!
//! Rows are claimed from a PostgreSQL outbox table (`FOR UPDATE SKIP LOCKED`), transformed
//! and routed by per-tenant WebAssembly plugins, published to Kafka, and marked sent in the
//! same transaction that claimed them. Delivery is at-least-once; a plugin failure never
//! publishes an untransformed row.
//!
//! The seams are traits: [`outbox::OutboxStore`] (where rows come from),
//! [`plugin::RowTransformer`] (what turns rows into messages) and [`sink::Sink`] (where
//! messages go); [`relay::Relay`] is the loop that joins them.

pub mod config;
pub mod message;
pub mod outbox;
pub mod plugin;
pub mod progress;
pub mod relay;
pub mod retry;
pub mod shutdown;
pub mod sink;
pub mod text;

pub use config::Config;
pub use relay::{Relay, RelaySettings, RelayStats};
