//! The usual shape of an end-to-end test: a fresh outbox table in the tests' PostgreSQL
//! database, topics `<table>.<suffix>` on the shared broker, and a relay configured for them.

use std::time::Duration;

use sqlx::PgPool;

use crate::config::relay_config;
use crate::env::{database_url, kafka_bootstrap, test_plugin};
use crate::kafka::{Received, consume, create_topics};
use crate::relay::{RelayExit, RelayProcess};
use crate::table::{Database, DbTable};
use crate::wait::wait_until;

/// How long a scenario waits for the relay or the broker.
pub const SCENARIO_WAIT: Duration = Duration::from_secs(120);

/// A pool on the tests' PostgreSQL database.
pub async fn pool() -> PgPool {
    crate::db::pool(&database_url())
        .await
        .expect("PostgreSQL must be reachable at SLUICE_TEST_DATABASE_URL")
}

/// A table, its topics and the prefix the reference plugin writes them with.
pub struct Scenario {
    /// The outbox table.
    pub table: DbTable,
    /// What the reference plugin puts before a topic name (`<table>.`).
    pub prefix: String,
    /// The topics it routes to, created on the tests' broker.
    pub topics: Vec<String>,
}

impl Scenario {
    /// Creates the table (with `sluice migrate`) and the topics `<table>.<suffix>`.
    pub async fn new(stem: &str, topic_suffixes: &[&str]) -> Self {
        Self::with_table(
            DbTable::create(Database::Postgres, stem).await,
            topic_suffixes,
        )
        .await
    }

    /// A scenario over a table the test created (e.g. [`DbTable::create_with_sql`]), with
    /// topics `<table>.<suffix>`.
    pub async fn with_table(table: DbTable, topic_suffixes: &[&str]) -> Self {
        let prefix = format!("{}.", table.name);
        let topics: Vec<String> = topic_suffixes
            .iter()
            .map(|s| format!("{prefix}{s}"))
            .collect();
        create_topics(&kafka_bootstrap(), &topics)
            .await
            .expect("create topics");
        Self {
            table,
            prefix,
            topics,
        }
    }

    /// The relay config (reference plugin as default, prefix = this scenario's).
    pub fn config(&self, relay_extra: &str, extra: &str) -> String {
        relay_config(
            &self.table.name,
            &kafka_bootstrap(),
            &self.prefix,
            relay_extra,
            extra,
        )
    }

    /// `[tenants.<tenant>]` running test plugin `plugin` with `config` (inline TOML table body).
    pub fn tenant(&self, tenant: &str, plugin: &str, config: &str) -> String {
        format!(
            "[tenants.{tenant}]\npath = \"{}\"\nconfig = {{ {config} }}\n",
            test_plugin(plugin).display()
        )
    }

    /// Runs one relay with `config` until `done` holds, stops it, and checks it exited 0.
    pub async fn relay_until<F, Fut>(&self, config: &str, done: F) -> RelayExit
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let relay = RelayProcess::start(config).expect("start relay");
        // Stopping it before it is up would kill it before its signal handler is installed.
        let started = relay.wait_started(SCENARIO_WAIT).await;
        assert!(started, "relay did not start: {}", relay.log());
        let finished = wait_until(SCENARIO_WAIT, done).await;
        assert!(finished, "relay did not get there: {}", relay.log());
        let exit = relay.stop();
        assert!(exit.success, "relay did not exit 0: {}", exit.log);
        exit
    }

    /// Reads the scenario's topics until `expected` messages arrived, then `settle` more.
    pub fn consume(&self, expected: usize, settle: Duration) -> Vec<Received> {
        consume(
            &kafka_bootstrap(),
            &self.topics,
            expected,
            SCENARIO_WAIT,
            settle,
        )
        .expect("consume")
    }

    /// Drops the table.
    pub async fn finish(self) {
        self.table.drop_table().await;
    }
}
