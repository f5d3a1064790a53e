//! The test kit of Sluice: the harness shared by the end-to-end tests (`tests/tests/e2e`), the
//! store conformance suite (`host/src/store/conformance/`) and the benchmark (`bench/`).
//! It drives the real `sluice` binary, real databases and real brokers (Tansu for Kafka, NATS
//! JetStream, RabbitMQ, Redis Streams) over TCP, and never links the `sluice` crate (so
//! `sluice`'s own tests can use it). Every test uses its own table and topics (streams,
//! queues), so tests run in parallel against the same services.
//!
//! The items tests use most are re-exported here (`use sluice_testkit::*`).

pub mod broker;
pub mod config;
pub mod db;
pub mod env;
pub mod kafka;
pub mod minisign;
pub mod nats;
pub mod oci_registry;
pub mod rabbitmq;
pub mod redis;
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
pub use nats::{NatsMessage, NatsStreams, OwnNats};
pub use oci_registry::OciRegistry;
pub use rabbitmq::{AmqpHeader, AmqpMessage, RabbitMq};
// `self::`: the extern crate `redis` has the same name.
pub use self::redis::{RedisStreams, StreamEntry};
pub use relay::{
    RelayExit, RelayLaunch, RelayProcess, sluice, sluice_with_config, sluice_with_env,
};
pub use scenario::*;
pub use scrape::{http_get, metric_sum, parse_metrics};
pub use table::{Database, DbTable, Servers};
pub use wait::wait_until;
