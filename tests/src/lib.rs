//! Helpers for the end-to-end tests: the real `sluice` binary, a real PostgreSQL and a real
//! Kafka-protocol broker (Tansu) over TCP. Every test uses its own table and topics, so tests
//! run in parallel against the same services.
//!
//! Environment: `SLUICE_TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! `SLUICE_TEST_KAFKA` (default `127.0.0.1:9092`), `SLUICE_BIN` (default: the `sluice` binary
//! next to the test executable's target directory).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sqlx::{AssertSqlSafe, PgPool};

pub fn database_url() -> String {
    std::env::var("SLUICE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub fn kafka_bootstrap() -> String {
    std::env::var("SLUICE_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The `sluice` binary under test (built by `cargo build` in `scripts/test`).
pub fn sluice_bin() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<test-exe> → target/<profile>/sluice
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."));
    profile_dir.join("sluice")
}

/// Path of the reference plugin, built by `scripts/test`.
pub fn reference_plugin() -> PathBuf {
    repo_root().join("plugins/target/wasm32-wasip2/release/route_by_aggregate.wasm")
}

/// Path of a test plugin (`tests/plugins/<name>`), e.g. `test_fanout`.
pub fn test_plugin(name: &str) -> PathBuf {
    repo_root().join(format!(
        "tests/plugins/target/wasm32-wasip2/release/{name}.wasm"
    ))
}

/// A name unique to this test run, usable as a table name and topic prefix.
pub fn unique(stem: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() % 100_000_000)
        .unwrap_or(0);
    format!("{stem}_{}_{t}_{n}", std::process::id())
}

/// Runs `sluice` with `args` to completion.
pub fn sluice(args: &[&str]) -> Output {
    sluice_with_env(args, &[])
}

/// Runs `sluice` with `args` and extra environment variables to completion.
pub fn sluice_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(sluice_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", sluice_bin().display()))
}

pub async fn pool() -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&database_url())
        .await
        .expect("PostgreSQL must be reachable at SLUICE_TEST_DATABASE_URL")
}

/// A fresh outbox table created by `sluice migrate`, dropped on [`OutboxTable::drop_table`].
pub struct OutboxTable {
    pub name: String,
    pub pool: PgPool,
}

impl OutboxTable {
    pub async fn create(stem: &str) -> Self {
        let name = unique(stem);
        let out = sluice(&[
            "migrate",
            "--database-url",
            &database_url(),
            "--table",
            &name,
        ]);
        assert!(
            out.status.success(),
            "sluice migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            name,
            pool: pool().await,
        }
    }

    /// Inserts `n` rows alternating between aggregate types `order` and `customer`, with
    /// aggregate ids `agg-<i % 50>`, payload `{"n": i}` and a `trace` header; `tenant` may be
    /// NULL.
    pub async fn insert_rows(&self, n: i64, tenant: Option<&str>) {
        let sql = format!(
            "INSERT INTO \"{}\" (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
             SELECT $2,
                    CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END,
                    'agg-' || (g % 50),
                    CASE WHEN g % 2 = 0 THEN 'OrderCreated' ELSE 'CustomerUpdated' END,
                    jsonb_build_object('n', g),
                    jsonb_build_object('trace', 'trace-' || g)
               FROM generate_series(1, $1) AS g",
            self.name
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(n)
            .bind(tenant)
            .execute(&self.pool)
            .await
            .expect("insert rows");
    }

    pub async fn scalar_i64(&self, sql_with_table: &str) -> i64 {
        let sql = sql_with_table.replace("{t}", &format!("\"{}\"", self.name));
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.clone()))
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub async fn count(&self) -> i64 {
        self.scalar_i64("SELECT count(*) FROM {t}").await
    }

    pub async fn unsent(&self) -> i64 {
        self.scalar_i64("SELECT count(*) FROM {t} WHERE published_at IS NULL")
            .await
    }

    /// `(tenant, attempts, last_error)` of every row still unsent.
    pub async fn unsent_rows(&self) -> Vec<(Option<String>, i32, Option<String>)> {
        let sql = format!(
            "SELECT tenant, attempts, last_error FROM \"{}\" WHERE published_at IS NULL ORDER BY id",
            self.name
        );
        sqlx::query_as(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .expect("select unsent")
    }

    pub async fn drop_table(self) {
        let _ = sqlx::query(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS \"{}\"",
            self.name
        )))
        .execute(&self.pool)
        .await;
    }
}

/// Creates topics (3 partitions each) through the Kafka admin API; existing topics are fine.
pub async fn create_topics(bootstrap: &str, topics: &[String]) -> anyhow::Result<()> {
    create_topics_with(
        ClientConfig::new().set("bootstrap.servers", bootstrap),
        topics,
    )
    .await
}

/// [`create_topics`] with a client made from `config` (e.g. with SASL and TLS properties).
pub async fn create_topics_with(config: &ClientConfig, topics: &[String]) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = config.create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, 3, TopicReplication::Fixed(1)))
        .collect();
    let results = admin
        .create_topics(
            &new,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?;
    for r in results {
        if let Err((topic, code)) = r
            && code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists
        {
            bail!("cannot create topic {topic}: {code:?}");
        }
    }
    Ok(())
}

/// A consumed message.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(self.key.as_deref().unwrap_or_default()).into_owned()
    }

    pub fn payload_json(&self) -> serde_json::Value {
        serde_json::from_slice(self.payload.as_deref().unwrap_or_default())
            .unwrap_or(serde_json::Value::Null)
    }
}

/// Reads every partition of `topics` from the beginning until `expected` messages arrived
/// (then keeps reading for `settle` to catch extras) or `timeout` passed.
pub fn consume(
    bootstrap: &str,
    topics: &[String],
    expected: usize,
    timeout: Duration,
    settle: Duration,
) -> anyhow::Result<Vec<Received>> {
    consume_until(bootstrap, topics, timeout, settle, |got| {
        got.len() >= expected
    })
}

/// Reads every partition of `topics` from the beginning until `done(messages so far)` holds
/// (then keeps reading for `settle`) or `timeout` passed.
pub fn consume_until(
    bootstrap: &str,
    topics: &[String],
    timeout: Duration,
    settle: Duration,
    done: impl FnMut(&[Received]) -> bool,
) -> anyhow::Result<Vec<Received>> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    consume_until_with(config, topics, timeout, settle, done)
}

/// [`consume_until`] with a consumer made from `config` (e.g. with SASL and TLS properties).
pub fn consume_until_with(
    mut config: ClientConfig,
    topics: &[String],
    timeout: Duration,
    settle: Duration,
    mut done: impl FnMut(&[Received]) -> bool,
) -> anyhow::Result<Vec<Received>> {
    let consumer: BaseConsumer = config
        .set("group.id", unique("test-consumer"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let partitions = metadata
            .topics()
            .first()
            .map(|t| t.partitions().len())
            .unwrap_or(0);
        if partitions == 0 {
            bail!("topic {topic} has no partitions");
        }
        for p in 0..partitions as i32 {
            assignment.add_partition_offset(topic, p, Offset::Beginning)?;
        }
    }
    consumer.assign(&assignment)?;
    let start = Instant::now();
    let mut settle_until: Option<Instant> = None;
    let mut out = Vec::new();
    loop {
        let now = Instant::now();
        if now - start > timeout || settle_until.is_some_and(|t| now > t) {
            break;
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Received {
                    topic: m.topic().to_owned(),
                    partition: m.partition(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec),
                    headers,
                });
                if settle_until.is_none() && done(&out) {
                    settle_until = Some(Instant::now() + settle);
                }
            }
            Some(Err(e)) => bail!("consume: {e}"),
            None => {}
        }
    }
    Ok(out)
}

/// Counts messages per `id` header.
pub fn count_by_id(messages: &[Received]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for m in messages {
        *counts
            .entry(m.header("id").unwrap_or_default())
            .or_insert(0) += 1;
    }
    counts
}

/// A `sluice run` process with its config file.
pub struct RelayProcess {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    stderr_path: PathBuf,
}

/// Finished relay: exit status and what it logged.
pub struct RelayExit {
    pub success: bool,
    pub code: Option<i32>,
    pub log: String,
}

impl RelayExit {
    /// The `rows_sent=N` of the final "relay stopped" line.
    pub fn rows_sent(&self) -> Option<u64> {
        let line = self
            .log
            .lines()
            .rev()
            .find(|l| l.contains("relay stopped"))?;
        let rest = line.split("rows_sent=").nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    }
}

impl RelayProcess {
    /// Starts `sluice run` with `config` (TOML text) written to a temporary file.
    pub fn start(config: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sluice.toml");
        std::fs::write(&path, config)?;
        let stderr_path = dir.path().join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path)?;
        let child = Command::new(sluice_bin())
            .arg("run")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "info,sluice=debug")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("spawn {}", sluice_bin().display()))?;
        Ok(Self {
            child,
            _dir: dir,
            stderr_path,
        })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Sends SIGHUP: the relay re-reads its config's secrets (and reloads plugins).
    pub fn hangup(&self) {
        let _ = Command::new("kill")
            .arg("-HUP")
            .arg(self.child.id().to_string())
            .status();
    }

    /// The process id (for `/proc` or signals a test sends itself).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident memory of the process so far (`VmHWM` of `/proc/<pid>/status`), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the process with SIGKILL (a crash: no shutdown, no flush) and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits (up to 60 s) for the process to exit.
    pub fn stop(mut self) -> RelayExit {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = self.child.kill();
                    break self.child.wait().ok();
                }
            }
        };
        RelayExit {
            success: status.is_some_and(|s| s.success()),
            code: status.and_then(|s| s.code()),
            log: self.log(),
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` every 100 ms until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A relay config for `table` with the reference plugin as default; `relay_extra` goes into
/// `[relay]`, `extra` (more sections) at the end.
pub fn relay_config(
    table: &str,
    bootstrap: &str,
    topic_prefix: &str,
    relay_extra: &str,
    extra: &str,
) -> String {
    format!(
        r#"
[database]
url = "{db}"
table = "{table}"

[relay]
poll_interval = "100ms"
{relay_extra}

[kafka]
"bootstrap.servers" = "{bootstrap}"

[plugins.default]
path = "{plugin}"
config = {{ topic_prefix = "{topic_prefix}" }}

{extra}
"#,
        db = database_url(),
        plugin = reference_plugin().display(),
    )
}

/// `config` (made by [`relay_config`]) connecting to `url` instead of the tests' database URL.
pub fn with_database_url(config: &str, url: &str) -> String {
    let line = format!("url = \"{}\"", database_url());
    assert!(config.contains(&line), "not a relay_config:\n{config}");
    config.replacen(&line, &format!("url = \"{url}\""), 1)
}

/// The usual shape of an end-to-end test: a fresh outbox table, topics
/// `<table>.<suffix>` on the shared broker, and a relay configured for them.
pub struct Scenario {
    pub table: OutboxTable,
    pub prefix: String,
    pub topics: Vec<String>,
}

/// How long a scenario waits for the relay or the broker.
pub const SCENARIO_WAIT: Duration = Duration::from_secs(120);

impl Scenario {
    /// Creates the table (with `sluice migrate`) and the topics `<table>.<suffix>`.
    pub async fn new(stem: &str, topic_suffixes: &[&str]) -> Self {
        let table = OutboxTable::create(stem).await;
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
        let started = wait_until(SCENARIO_WAIT, || async {
            relay.log().contains("relay started")
        })
        .await;
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

    pub async fn finish(self) {
        self.table.drop_table().await;
    }
}

/// Runs `sluice` with `args` followed by `--config FILE`, where FILE holds `config`.
pub fn sluice_with_config(args: &[&str], config: &str) -> Output {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config).expect("write config");
    let path = path.display().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--config", path.as_str()]);
    sluice(&all)
}

impl OutboxTable {
    /// A table the application created itself, with plain SQL (`{t}` in `create_sql` stands for
    /// the quoted table name), not by `sluice migrate`.
    pub async fn create_with_sql(stem: &str, create_sql: &str) -> Self {
        let name = unique(stem);
        let pool = pool().await;
        let sql = create_sql.replace("{t}", &format!("\"{name}\""));
        sqlx::query(AssertSqlSafe(sql.clone()))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        Self { name, pool }
    }

    /// Runs `sql` (`{t}` stands for the quoted table name) in one transaction.
    pub async fn execute(&self, sql: &str) {
        let sql = sql.replace("{t}", &format!("\"{}\"", self.name));
        sqlx::raw_sql(AssertSqlSafe(sql.clone()))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Rows of a query returning text columns (`{t}` stands for the quoted table name).
    pub async fn text_rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        use sqlx::Row;
        let sql = sql.replace("{t}", &format!("\"{}\"", self.name));
        let rows = sqlx::query(AssertSqlSafe(sql.clone()))
            .fetch_all(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| row.try_get::<Option<String>, _>(i).expect("text column"))
                    .collect()
            })
            .collect()
    }
}

impl Scenario {
    /// A scenario over a table the test created (e.g. [`OutboxTable::create_with_sql`]), with
    /// topics `<table>.<suffix>`.
    pub async fn with_table(table: OutboxTable, topic_suffixes: &[&str]) -> Self {
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
}

pub mod databases;
pub mod secure_broker;
pub mod stall;

/// A plain HTTP/1.0 GET of `path` on `127.0.0.1:port`: the status code and the body, or
/// `None` when nothing answers (the relay is not listening yet).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// The samples of a Prometheus text exposition: `name{labels}` → value.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of every sample of metric `name` whose labels include each of `labels`
/// (`key="value"` strings).
pub fn metric_sum(samples: &HashMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            metric == name && labels.iter().all(|l| rest.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}
