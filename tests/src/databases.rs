//! Helpers for the end-to-end tests on MySQL/MariaDB and SQLite: an outbox table created by
//! `sluice migrate` on either, filled and inspected with plain SQL, a relay config for it, and
//! a Tansu broker of the test's own (which the test may stop without disturbing others).
//!
//! Environment: `SLUICE_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::{reference_plugin, sluice, unique};

pub fn mysql_url() -> String {
    std::env::var("SLUICE_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// Which database a [`DbTable`] lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Mariadb,
    Sqlite,
}

enum Pool {
    My(MySqlPool),
    Lite(SqlitePool),
}

/// An outbox table created by `sluice migrate` in MariaDB (database `test`) or in a SQLite
/// file of its own (in a temporary directory, removed on drop).
pub struct DbTable {
    pub kind: Kind,
    pub name: String,
    pub url: String,
    pool: Pool,
    _dir: Option<tempfile::TempDir>,
}

impl DbTable {
    pub async fn create(kind: Kind, stem: &str) -> Self {
        let name = unique(stem);
        let (url, dir) = match kind {
            Kind::Mariadb => (mysql_url(), None),
            Kind::Sqlite => {
                let dir = tempfile::tempdir().expect("temporary directory");
                let url = format!("sqlite://{}", dir.path().join("app.db").display());
                (url, Some(dir))
            }
        };
        let out = sluice(&["migrate", "--database-url", &url, "--table", &name]);
        assert!(
            out.status.success(),
            "sluice migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pool = match kind {
            Kind::Mariadb => Pool::My(
                MySqlPoolOptions::new()
                    .max_connections(4)
                    .connect(&url)
                    .await
                    .expect("MariaDB must be reachable at SLUICE_TEST_MYSQL_URL"),
            ),
            Kind::Sqlite => {
                let path = dir
                    .as_ref()
                    .map(|d| d.path().join("app.db"))
                    .unwrap_or_default();
                Pool::Lite(
                    SqlitePoolOptions::new()
                        .max_connections(2)
                        .connect_with(
                            SqliteConnectOptions::new()
                                .filename(path)
                                // As a WAL application usually runs.
                                .journal_mode(SqliteJournalMode::Wal)
                                .synchronous(SqliteSynchronous::Normal)
                                .busy_timeout(std::time::Duration::from_secs(30)),
                        )
                        .await
                        .expect("open the SQLite file"),
                )
            }
        };
        Self {
            kind,
            name,
            url,
            pool,
            _dir: dir,
        }
    }

    fn sql(&self, sql: &str) -> String {
        let quoted = match self.kind {
            Kind::Mariadb => format!("`{}`", self.name),
            Kind::Sqlite => format!("\"{}\"", self.name),
        };
        sql.replace("{t}", &quoted)
    }

    /// Inserts `n` rows in one statement, as [`crate::OutboxTable::insert_rows`] does:
    /// aggregate types `order` and `customer` alternating, ids `agg-<i % 50>`, payload
    /// `{"n": i}`, a `trace` header.
    pub async fn insert_rows(&self, n: i64) {
        match &self.pool {
            Pool::My(pool) => {
                // MariaDB stops recursive CTEs at max_recursive_iterations (1000 here).
                let sql = self.sql(
                    "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers)
                     WITH RECURSIVE g(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM g WHERE i < ?)
                     SELECT CASE WHEN i % 2 = 0 THEN 'order' ELSE 'customer' END,
                            CONCAT('agg-', i % 50),
                            CASE WHEN i % 2 = 0 THEN 'OrderCreated' ELSE 'CustomerUpdated' END,
                            JSON_OBJECT('n', i), JSON_OBJECT('trace', CONCAT('trace-', i))
                       FROM g",
                );
                let mut from = 1;
                while from <= n {
                    let to = (from + 999).min(n);
                    sqlx::query(AssertSqlSafe(sql.clone()))
                        .bind(from)
                        .bind(to)
                        .execute(pool)
                        .await
                        .expect("insert rows");
                    from = to + 1;
                }
            }
            Pool::Lite(pool) => {
                let sql = self.sql(
                    "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?)
                     INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers)
                     SELECT CASE WHEN i % 2 = 0 THEN 'order' ELSE 'customer' END,
                            'agg-' || (i % 50),
                            CASE WHEN i % 2 = 0 THEN 'OrderCreated' ELSE 'CustomerUpdated' END,
                            json_object('n', i), json_object('trace', 'trace-' || i)
                       FROM g",
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(n)
                    .execute(pool)
                    .await
                    .expect("insert rows");
            }
        }
    }

    /// Runs a query returning one integer (`{t}` stands for the quoted table).
    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        let sql = self.sql(sql);
        match &self.pool {
            Pool::My(pool) => {
                sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .fetch_one(pool)
                    .await
            }
            Pool::Lite(pool) => {
                sqlx::query_scalar(AssertSqlSafe(sql.clone()))
                    .fetch_one(pool)
                    .await
            }
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Every row's id.
    pub async fn ids(&self) -> Vec<i64> {
        let sql = self.sql("SELECT id FROM {t} ORDER BY id");
        match &self.pool {
            Pool::My(pool) => sqlx::query_scalar(AssertSqlSafe(sql)).fetch_all(pool).await,
            Pool::Lite(pool) => sqlx::query_scalar(AssertSqlSafe(sql)).fetch_all(pool).await,
        }
        .expect("select ids")
    }

    pub async fn count(&self) -> i64 {
        self.scalar_i64("SELECT COUNT(*) FROM {t}").await
    }

    /// The MariaDB pool (panics for SQLite).
    pub fn mysql_pool(&self) -> &MySqlPool {
        match &self.pool {
            Pool::My(pool) => pool,
            Pool::Lite(_) => panic!("{} is a SQLite table", self.name),
        }
    }

    /// A relay config for this table with the reference plugin; `database_extra` goes into
    /// `[database]`, `relay_extra` into `[relay]`, `kafka_extra` into `[kafka]`.
    pub fn config(
        &self,
        bootstrap: &str,
        topic_prefix: &str,
        database_extra: &str,
        relay_extra: &str,
        kafka_extra: &str,
    ) -> String {
        format!(
            r#"
[database]
url = "{url}"
table = "{table}"
{database_extra}

[relay]
poll_interval = "100ms"
{relay_extra}

[kafka]
"bootstrap.servers" = "{bootstrap}"
{kafka_extra}

[plugins.default]
path = "{plugin}"
config = {{ topic_prefix = "{topic_prefix}" }}
"#,
            url = self.url,
            table = self.name,
            plugin = reference_plugin().display(),
        )
    }

    pub async fn drop_table(self) {
        if let Pool::My(pool) = &self.pool {
            let _ = sqlx::query(AssertSqlSafe(self.sql("DROP TABLE IF EXISTS {t}")))
                .execute(pool)
                .await;
        }
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn tansu_bin() -> PathBuf {
    if let Ok(p) = std::env::var("TANSU_BIN") {
        return PathBuf::from(p);
    }
    // Where scripts/services.sh installs it (and exports TANSU_BIN).
    let home = std::env::var("HOME").unwrap_or_default();
    let installed =
        PathBuf::from(home).join(".local/share/sluice/tansu-0.6.0-dynostore-libsql/bin/tansu");
    if installed.exists() {
        installed
    } else {
        PathBuf::from("tansu")
    }
}

/// A Tansu broker of the test's own on `port` (in-memory storage), killed on drop.
pub struct OwnTansu(Child);

/// How [`OwnTansu::launch`] starts a broker.
pub struct TansuLaunch<'a> {
    /// Where it listens (127.0.0.1).
    pub port: u16,
    /// The port it tells clients to connect to (127.0.0.1), when something (a TLS proxy)
    /// stands in front of it; default: `port`.
    pub advertised_port: Option<u16>,
    /// `--storage-engine`; `sqlite://NAME` is a file NAME in `dir`.
    pub storage: &'a str,
    /// More arguments, e.g. `--authentication`.
    pub extra_args: &'a [&'a str],
    /// Its working directory, where it also writes its log (`tansu.log`); default: none, log
    /// discarded.
    pub dir: Option<&'a std::path::Path>,
}

impl Default for TansuLaunch<'_> {
    fn default() -> Self {
        Self {
            port: 0,
            advertised_port: None,
            storage: "memory://tansu/",
            extra_args: &[],
            dir: None,
        }
    }
}

impl OwnTansu {
    pub fn start(port: u16) -> Self {
        Self::launch(&TansuLaunch {
            port,
            ..TansuLaunch::default()
        })
    }

    /// Starts a broker as `launch` says (see [`TansuLaunch`]).
    pub fn launch(launch: &TansuLaunch<'_>) -> Self {
        let url = format!("tcp://127.0.0.1:{}", launch.port);
        let advertised = format!(
            "tcp://127.0.0.1:{}",
            launch.advertised_port.unwrap_or(launch.port)
        );
        let mut command = Command::new(tansu_bin());
        command
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
            ])
            .args(["--storage-engine", launch.storage])
            .args(launch.extra_args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(dir) = launch.dir {
            command.current_dir(dir);
            if let Ok(log) = std::fs::File::create(dir.join("tansu.log")) {
                command.stderr(log);
            }
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", tansu_bin().display()));
        Self(child)
    }

    /// Sends `signal` (`STOP`, `CONT`) to the broker: SIGSTOP stalls it like an outage
    /// while keeping what it stored.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.0.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

impl Drop for OwnTansu {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
