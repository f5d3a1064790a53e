//! The end-to-end tests of the `sluice` binary, one module per area, in one test binary: each
//! binary links sqlx, rdkafka and openssl, which costs more than compiling the tests. Tests
//! share this process, so none may change process-wide state (environment variables, the
//! working directory, fixed ports or names): each passes what it needs to the processes it
//! starts and uses its own tables, topics, ports and brokers (see `sluice_testkit`).
//!
//! Run one area with a filter, e.g. `cargo test -p sluice-e2e --test e2e -- relay::`.

mod broker;
mod brokers;
mod cli;
mod commit_failure;
mod compression;
mod config_check;
mod databases;
mod db_roles;
mod db_tls;
mod extra_columns;
mod failures;
mod fairness;
mod injected_errors;
mod live_tenants;
mod missing_topic;
mod multi_relay;
mod ordering;
mod polling;
mod relay;
mod reload;
mod replay;
mod retention;
mod retry;
mod rotation;
mod sandbox;
mod sandbox_breaches;
mod schema_registry;
mod schemas;
mod secrets;
mod secure_kafka;
mod silence;
mod startup;
mod supply_chain;
mod telemetry;
mod traces;
