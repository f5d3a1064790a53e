//! The test kit of Sluice: the harness shared by the end-to-end tests (`tests/tests/e2e`), the
//! store conformance suite (`host/src/store/conformance/`) and the benchmark (`bench/`).
//! It drives the real `sluice` binary, real databases and real Kafka-protocol brokers (Tansu)
//! over TCP, and never links the `sluice` crate (so `sluice`'s own tests can use it). Every
//! test uses its own table and topics, so tests run in parallel against the same services.
//!
//! The items tests use most are re-exported here (`use sluice_testkit::*`).

pub mod broker;
pub mod config;
pub mod db;
pub mod env;
pub mod kafka;
pub mod minisign;
pub mod oci_registry;
pub mod registry;
pub mod relay;
pub mod scenario;
pub mod scrape;
pub mod secure_broker;
pub mod stall;
pub mod table;
pub mod wait;

pub use broker::{OwnTansu, TansuLaunch, free_port};
pub use config::{RelayConfig, relay_config, with_database_url};
pub use env::*;
pub use kafka::*;
pub use minisign::SigningKey;
pub use oci_registry::OciRegistry;
pub use relay::{
    RelayExit, RelayLaunch, RelayProcess, sluice, sluice_with_config, sluice_with_env,
};
pub use scenario::*;
pub use scrape::{http_get, metric_sum, parse_metrics};
pub use table::{Database, DbTable, Servers};
pub use wait::wait_until;
