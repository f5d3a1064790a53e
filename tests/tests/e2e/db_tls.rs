//! TLS to the database as a user meets it: the URL's `sslmode`/`sslrootcert` (PostgreSQL) and
//! `ssl-mode` (MySQL/MariaDB) through the real `sluice` binary (`migrate`, `config check
//! --connect`, `run`). Every refusal must come within a few seconds — never a hang until the
//! connect timeout — and say it is about TLS or the certificate.
//!
//! Against the machine's PostgreSQL (Debian: `ssl = on` with its self-signed "snakeoil"
//! certificate): `require` and `verify-ca` with that certificate work, `verify-full` to
//! `127.0.0.1` fails (the certificate names a host, not the address). Against a server
//! certificate of the test's own, signed by a CA the test makes ([`PgTlsProxy`]: answers
//! PostgreSQL's SSLRequest, terminates TLS, passes the plain protocol to the real server):
//! `verify-full` works with that CA as `sslrootcert`, and fails with another CA or none. The
//! machine's MariaDB serves no TLS: `ssl-mode=REQUIRED` is refused clearly.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant};

use openssl::pkey::{PKey, Private};
use openssl::ssl::{Ssl, SslAcceptor, SslMethod};
use openssl::x509::X509;
use sluice_testkit::mysql_url;
use sluice_testkit::secure_broker::TestCa;
use sluice_testkit::*;
use sqlx::Row;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A refusal must come well before the database connect timeout (10 s): a TLS failure is
/// final, and is reported at once.
const PROMPTLY: Duration = Duration::from_secs(8);

/// PostgreSQL's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// The machine's PostgreSQL `host:port` and the rest of the test URL (`user@`, `/db`).
fn pg_parts() -> (String, String, String) {
    let url = database_url();
    let (scheme_user, rest) = url.split_once('@').expect("postgres://user@host:port/db");
    let (host, db) = rest.split_once('/').expect("postgres://user@host:port/db");
    (scheme_user.to_owned(), host.to_owned(), db.to_owned())
}

/// The test database's URL with `host` (`host:port`) and the query `params`.
fn pg_url(host: &str, params: &str) -> String {
    let (scheme_user, _, db) = pg_parts();
    let db = db.split('?').next().unwrap_or_default();
    format!("{scheme_user}@{host}/{db}?{params}")
}

/// What `sluice migrate` did with `url`: whether it succeeded, its standard error, how long.
fn migrate(url: &str) -> (bool, String, Duration, String) {
    let table = unique("tls");
    let started = Instant::now();
    let out = sluice(&["migrate", "--database-url", url, "--table", &table]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
        table,
    )
}

/// `sluice migrate` with `url` works (and the table it made is dropped again).
async fn migrate_works(url: &str) {
    let (ok, stderr, _, table) = migrate(url);
    assert!(ok, "{url}: {stderr}");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE \"{table}\"")))
        .execute(&pool().await)
        .await
        .expect("drop table");
}

/// `sluice migrate` with `url` fails promptly, its error containing each of `says` (case
/// ignored); the error is returned.
fn migrate_fails(url: &str, says: &[&str]) -> String {
    let (ok, stderr, took, _) = migrate(url);
    assert!(!ok, "{url} was accepted");
    assert!(
        took < PROMPTLY,
        "{url}: refused only after {took:?}: {stderr}"
    );
    let lower = stderr.to_lowercase();
    for word in says {
        assert!(
            lower.contains(&word.to_lowercase()),
            "{url}: the error does not say {word:?}: {stderr}"
        );
    }
    stderr
}

/// The certificate file the machine's PostgreSQL serves, which must have TLS on.
async fn server_certificate() -> PathBuf {
    let pool = pool().await;
    let ssl: String = sqlx::query("SHOW ssl")
        .fetch_one(&pool)
        .await
        .expect("SHOW ssl")
        .get(0);
    assert_eq!(
        ssl, "on",
        "these tests need PostgreSQL with ssl = on (Debian's default, with the snakeoil certificate)"
    );
    let file: String = sqlx::query("SHOW ssl_cert_file")
        .fetch_one(&pool)
        .await
        .expect("SHOW ssl_cert_file")
        .get(0);
    let path = PathBuf::from(file);
    assert!(
        std::fs::read(&path).is_ok(),
        "the server certificate {} must be readable for verify-ca",
        path.display()
    );
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_sslmode_require_and_verify_ca_work_against_the_server() {
    let (_, host, _) = pg_parts();
    let cert = server_certificate().await;
    migrate_works(&pg_url(&host, "sslmode=require")).await;
    let verify_ca = format!("sslmode=verify-ca&sslrootcert={}", cert.display());
    migrate_works(&pg_url(&host, &verify_ca)).await;

    // A relay's connections are encrypted: the server says so in pg_stat_ssl.
    let table = DbTable::create(Database::Postgres, "tls_relay").await;
    let application = unique("sluice_tls");
    let url = pg_url(
        &host,
        &format!("{verify_ca}&application_name={application}"),
    );
    let config = with_database_url(
        &relay_config(&table.name, &kafka_bootstrap(), "tls.", "", ""),
        &url,
    );
    assert!(config.contains(&application), "{config}");
    let relay = RelayProcess::start(&config).expect("start relay");
    let started = relay.wait_started(Duration::from_secs(60)).await;
    assert!(started, "{}", relay.log());
    let connections: Vec<(bool,)> = sqlx::query_as(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = $1",
    )
    .bind(&application)
    .fetch_all(table.pg_pool())
    .await
    .expect("pg_stat_ssl");
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(!connections.is_empty(), "no connection of the relay seen");
    assert!(
        connections.iter().all(|(ssl,)| *ssl),
        "a connection without TLS: {connections:?}"
    );
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_verify_full_to_an_address_the_certificate_does_not_name_fails_clearly() {
    let cert = server_certificate().await;
    let (_, host, _) = pg_parts();
    let port = host.rsplit_once(':').map_or("5432", |(_, p)| p);
    let url = pg_url(
        &format!("127.0.0.1:{port}"),
        &format!("sslmode=verify-full&sslrootcert={}", cert.display()),
    );
    migrate_fails(&url, &["tls", "certificate", "mismatch"]);
}

/// A PostgreSQL server with a certificate of the test's own: the proxy answers the client's
/// SSLRequest, terminates TLS with `cert`, and passes the plain protocol on to the machine's
/// server (which takes it like any connection without TLS); a client that does not ask for TLS
/// is turned away, so whatever connects used TLS. Without an identity it answers "no TLS
/// here", as a server with `ssl = off` does. On a runtime of its own; stops on drop.
struct PgTlsProxy {
    port: u16,
    runtime: Option<tokio::runtime::Runtime>,
}

impl PgTlsProxy {
    fn start(identity: Option<(&X509, &PKey<Private>)>) -> Self {
        let acceptor = identity.map(|(cert, key)| {
            let mut a =
                SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).expect("acceptor");
            a.set_private_key(key).expect("key");
            a.set_certificate(cert).expect("certificate");
            a.build()
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let (_, target, _) = pg_parts();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.spawn(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            while let Ok((mut client, _)) = listener.accept().await {
                let (acceptor, target) = (acceptor.clone(), target.clone());
                tokio::spawn(async move {
                    let mut first = [0u8; 8];
                    if client.read_exact(&mut first).await.is_err() {
                        return;
                    }
                    let Ok(mut server) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    if first != SSL_REQUEST {
                        // No TLS asked for. A server with a certificate refuses that (so a
                        // connection that works went through TLS); one without passes it on.
                        if acceptor.is_some() {
                            return;
                        }
                        if server.write_all(&first).await.is_ok() {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                        return;
                    }
                    let Some(acceptor) = acceptor else {
                        // "N": this server has no TLS; the client goes on in plain text.
                        if client.write_all(b"N").await.is_ok() {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                        return;
                    };
                    if client.write_all(b"S").await.is_err() {
                        return;
                    }
                    let Ok(ssl) = Ssl::new(acceptor.context()) else {
                        return;
                    };
                    let Ok(mut tls) = tokio_openssl::SslStream::new(ssl, client) else {
                        return;
                    };
                    // A client that does not trust the certificate ends here.
                    if Pin::new(&mut tls).accept().await.is_ok() {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
                    }
                });
            }
        });
        Self {
            port,
            runtime: Some(runtime),
        }
    }
}

impl Drop for PgTlsProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A CA of the test's own, a server certificate it signed (for `localhost` and `127.0.0.1`)
/// served by a [`PgTlsProxy`], and a second CA that signed nothing the server has.
struct OwnCertificates {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    other_ca: PathBuf,
    proxy: PgTlsProxy,
}

fn own_certificates() -> OwnCertificates {
    let dir = tempfile::tempdir().expect("temporary directory");
    let ca = TestCa::new(dir.path(), "sluice-test-db-ca").expect("CA");
    let other = TestCa::new(dir.path(), "sluice-test-other-ca").expect("other CA");
    let (cert, key) = ca.issue_server().expect("server certificate");
    OwnCertificates {
        ca: ca.pem.clone(),
        other_ca: other.pem.clone(),
        proxy: PgTlsProxy::start(Some((&cert, &key))),
        _dir: dir,
    }
}

fn root(path: &Path) -> String {
    format!("sslrootcert={}", path.display())
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_verify_full_works_with_the_ca_that_signed_the_server_certificate() {
    let own = own_certificates();
    for host in ["localhost", "127.0.0.1"] {
        let url = pg_url(
            &format!("{host}:{}", own.proxy.port),
            &format!("sslmode=verify-full&{}", root(&own.ca)),
        );
        migrate_works(&url).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_certificate_another_ca_signed_fails_clearly() {
    let own = own_certificates();
    let at = format!("localhost:{}", own.proxy.port);
    for mode in ["verify-full", "verify-ca"] {
        // The CA given is not the one that signed the server's certificate.
        let url = pg_url(&at, &format!("sslmode={mode}&{}", root(&own.other_ca)));
        migrate_fails(&url, &["tls", "certificate verify failed"]);
        // No CA given: the system's roots do not know the test's CA either.
        migrate_fails(
            &pg_url(&at, &format!("sslmode={mode}")),
            &["tls", "certificate"],
        );
    }
    // `require` encrypts without checking the certificate: it connects.
    migrate_works(&pg_url(&at, "sslmode=require")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_sslmode_require_refuses_a_server_without_tls() {
    let plain = PgTlsProxy::start(None);
    let at = format!("127.0.0.1:{}", plain.port);
    migrate_fails(
        &pg_url(&at, "sslmode=require"),
        &["server does not support TLS"],
    );
    // `prefer` (the default) goes on without TLS.
    migrate_works(&pg_url(&at, "sslmode=prefer")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_missing_root_certificate_file_is_named() {
    let (_, host, _) = pg_parts();
    let missing = "/nonexistent/sluice-test/root.pem";
    let url = pg_url(&host, &format!("sslmode=verify-full&sslrootcert={missing}"));
    // The URL (shown in the message) names the file too: the message must say what is wrong.
    let stderr = migrate_fails(&url, &["cannot read the file"]);
    assert!(
        stderr.contains(&format!("sslrootcert={missing}: cannot read the file")),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn config_check_and_run_report_a_certificate_that_does_not_verify() {
    let own = own_certificates();
    let url = pg_url(
        &format!("localhost:{}", own.proxy.port),
        &format!("sslmode=verify-full&{}", root(&own.other_ca)),
    );
    let table = DbTable::create(Database::Postgres, "tls_run").await;
    let config = with_database_url(
        &relay_config(&table.name, &kafka_bootstrap(), "tls.", "", ""),
        &url,
    );
    assert!(config.contains("verify-full"), "{config}");

    let started = Instant::now();
    let out = sluice_with_config(&["config", "check", "--connect"], &config);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.contains(": database: "))
        .unwrap_or_else(|| panic!("no database problem: {stdout}"));
    assert!(line.contains("certificate verify failed"), "{line}");
    assert!(started.elapsed() < PROMPTLY * 2, "{:?}", started.elapsed());

    let started = Instant::now();
    let mut relay = RelayProcess::start(&config).expect("start relay");
    let exited = wait_until(PROMPTLY * 2, || {
        let running = relay.running();
        async move { !running }
    })
    .await;
    assert!(
        exited,
        "still running {:?} after start: {}",
        started.elapsed(),
        relay.log()
    );
    let exit = relay.stop();
    assert!(!exit.success);
    assert!(
        exit.log.contains("certificate verify failed"),
        "{}",
        exit.log
    );
    table.drop_table().await;
}

async fn mariadb_pool() -> sqlx::MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&mysql_url())
        .await
        .expect("MariaDB must be reachable at SLUICE_TEST_MYSQL_URL")
}

/// `sluice migrate` with the MariaDB `url` works (and the table it made is dropped again).
async fn mariadb_migrate_works(url: &str) {
    let (ok, stderr, _, table) = migrate(url);
    assert!(ok, "{url}: {stderr}");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE `{table}`")))
        .execute(&mariadb_pool().await)
        .await
        .expect("drop table");
}

fn with_query(url: &str, params: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{params}")
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_ssl_mode_required_against_a_server_without_tls_fails_clearly() {
    // `have_ssl`: YES with TLS configured, DISABLED without (Debian's default).
    let have_ssl: String = sqlx::query("SELECT @@have_ssl")
        .fetch_one(&mariadb_pool().await)
        .await
        .expect("@@have_ssl")
        .get(0);
    let required = with_query(&mysql_url(), "ssl-mode=REQUIRED");
    if have_ssl == "YES" {
        mariadb_migrate_works(&required).await;
        return;
    }
    migrate_fails(&required, &["tls", "server does not support TLS"]);
    // PREFERRED (the default) goes on without TLS.
    mariadb_migrate_works(&with_query(&mysql_url(), "ssl-mode=PREFERRED")).await;
}
