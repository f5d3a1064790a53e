//! Where the harness finds things: the services (from the environment, with this machine's
//! defaults), the `sluice` binary, the plugins, and names unique to one run.
//!
//! Environment: `SLUICE_TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! `SLUICE_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`), `SLUICE_TEST_KAFKA`
//! (default `127.0.0.1:9092`), `SLUICE_TEST_NATS` (default `127.0.0.1:4222`, with JetStream),
//! `SLUICE_TEST_RABBITMQ` (default `127.0.0.1:5672`, user guest/guest), `SLUICE_TEST_REDIS`
//! (default `127.0.0.1:6379`), `SLUICE_BIN` (default: the `sluice` binary next to the test
//! executable's target directory).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The PostgreSQL database the tests use.
pub fn database_url() -> String {
    std::env::var("SLUICE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The MySQL/MariaDB database the tests use.
pub fn mysql_url() -> String {
    std::env::var("SLUICE_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// The shared broker the tests use.
pub fn kafka_bootstrap() -> String {
    std::env::var("SLUICE_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// The NATS server (with JetStream) the tests use, `host:port`.
pub fn nats_address() -> String {
    std::env::var("SLUICE_TEST_NATS").unwrap_or_else(|_| "127.0.0.1:4222".to_owned())
}

/// [`nats_address`] as a `[nats] url`.
pub fn nats_url() -> String {
    format!("nats://{}", nats_address())
}

/// The RabbitMQ broker the tests use, `host:port` (user guest, password guest).
pub fn rabbitmq_address() -> String {
    std::env::var("SLUICE_TEST_RABBITMQ").unwrap_or_else(|_| "127.0.0.1:5672".to_owned())
}

/// [`rabbitmq_address`] as a `[rabbitmq] url`, on the default vhost `/`.
pub fn rabbitmq_url() -> String {
    format!("amqp://guest:guest@{}/%2f", rabbitmq_address())
}

/// The Redis server the tests use, `host:port`.
pub fn redis_address() -> String {
    std::env::var("SLUICE_TEST_REDIS").unwrap_or_else(|_| "127.0.0.1:6379".to_owned())
}

/// [`redis_address`] as a `[redis] url`.
pub fn redis_url() -> String {
    format!("redis://{}", redis_address())
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    // This crate lives in tests/kit.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
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

/// A name unique to this process and call, usable as a table name and topic prefix.
pub fn unique(stem: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() % 100_000_000)
        .unwrap_or(0);
    format!("{stem}_{}_{t}_{n}", std::process::id())
}
