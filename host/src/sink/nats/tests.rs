//! The NATS sink against real servers: the local one (`SLUICE_TEST_NATS`, default
//! `127.0.0.1:4222`) and `nats-server` processes each test starts on a free port (with
//! credentials, permissions, or only after the sink connected). What every broker must show is
//! the conformance suite's (`sink::conformance::nats`); this is what only NATS has: the
//! duplicate window, its credentials and permissions.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;

use super::*;
use crate::model::OutboxId;
use crate::secret::SecretUrl;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// The local server with JetStream.
fn local() -> String {
    std::env::var("SLUICE_TEST_NATS").unwrap_or_else(|_| "127.0.0.1:4222".to_owned())
}

fn settings(url: &str, timeout: Duration) -> NatsSettings {
    NatsSettings {
        url: SecretUrl::read(url.to_owned()),
        token: None,
        credentials_location: None,
        ca_location: None,
        certificate_location: None,
        key_location: None,
        timeout,
        message_id_prefix: "test:".to_owned(),
    }
}

fn message(subject: &str, row: i64) -> OutboundMessage {
    OutboundMessage {
        row: OutboxId::Int(row),
        broker: Broker::Nats,
        topic: subject.to_owned(),
        key: Some(format!("k{row}").into_bytes()),
        payload: Some(format!(r#"{{"n":{row}}}"#).into_bytes()),
        headers: vec![("sluice-outbox-id".to_owned(), row.to_string().into_bytes())],
        partition: None,
        encoding: None,
        value_record: None,
        key_record: None,
        timestamp_ms: None,
    }
}

/// A subject of a new memory stream on the server `jetstream` talks to (default duplicate
/// window: two minutes).
async fn stream_for(jetstream: &jetstream::Context) -> String {
    let id = format!(
        "{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let subject = format!("sluice.sinktest.{id}");
    jetstream
        .create_stream(jetstream::stream::Config {
            name: format!("sluice_sinktest_{id}"),
            subjects: vec![subject.clone()],
            storage: jetstream::stream::StorageType::Memory,
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("create a stream for {subject}: {e}"));
    subject
}

/// Messages stored in the stream of `subject`.
async fn stored(jetstream: &jetstream::Context, subject: &str) -> u64 {
    let mut stream = jetstream
        .get_stream(subject.replace('.', "_"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    stream
        .info()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .state
        .messages
}

fn assert_all_ok(results: &[Result<Delivered, SinkError>]) {
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    assert!(failed.is_empty(), "failed: {failed:?}");
}

/// A `nats-server` process of the test's own, killed when dropped.
struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    /// A free local port (nothing listens there once this returns).
    fn free_port() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        listener.local_addr().expect("local address").port()
    }

    /// `nats-server` with JetStream on `port`, with `authorization` (a config block) if given.
    fn start(port: u16, authorization: Option<&str>) -> Self {
        Self::start_in(
            tempfile::tempdir().expect("temporary directory"),
            port,
            authorization,
        )
    }

    /// [`Server::start`] with its files in `dir` (where a test may have put certificates).
    fn start_in(dir: tempfile::TempDir, port: u16, authorization: Option<&str>) -> Self {
        let config = format!(
            "listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: {:?} }}\n{}\n",
            dir.path().join("js"),
            authorization.unwrap_or_default()
        );
        let config_path = dir.path().join("server.conf");
        std::fs::write(&config_path, config).expect("write the server's config");
        let child = Command::new(server_binary())
            .arg("-c")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        for _ in 0..250 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("nats-server did not listen on {port} within 5 s");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `nats-server` on the PATH, or where Debian installs it.
fn server_binary() -> &'static str {
    if Path::new("/usr/sbin/nats-server").exists() {
        "/usr/sbin/nats-server"
    } else {
        "nats-server"
    }
}

/// Users `u`/`p`, who may publish anywhere but `forbidden.>`.
const USERS: &str = r#"authorization {
  users = [
    { user: "u", password: "p", permissions: { publish: { deny: ["forbidden.>"] } } }
  ]
}"#;

/// `probe` on a blocking thread, as `/readyz` calls it.
async fn probe(sink: &Arc<NatsSink>) -> Result<(), SinkError> {
    let sink = Arc::clone(sink);
    tokio::task::spawn_blocking(move || sink.probe(Duration::from_secs(3)))
        .await
        .expect("probe thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_twice_is_stored_once_and_a_rows_two_messages_twice() {
    let client = async_nats::connect(local()).await.expect("local NATS");
    let jetstream = jetstream::new(client);
    let subject = stream_for(&jetstream).await;
    let sink = NatsSink::connect(&settings(
        &format!("nats://{}", local()),
        Duration::from_secs(10),
    ))
    .await
    .expect("connect");
    // Row 2 fans out into two messages to the same subject: ids test:2-0 and test:2-1.
    let batch = vec![
        message(&subject, 1),
        message(&subject, 2),
        message(&subject, 2),
    ];
    assert_all_ok(&sink.publish(&batch).await);
    assert_eq!(stored(&jetstream, &subject).await, 3);
    // The relay publishes a batch again when it could not mark its rows: JetStream drops
    // every message of it as a duplicate (same Nats-Msg-Id within the duplicate window), and
    // acknowledges them all the same.
    assert_all_ok(&sink.publish(&batch).await);
    assert_eq!(stored(&jetstream, &subject).await, 3);
    // Another prefix (another outbox table) is another message.
    let mut other = settings(&format!("nats://{}", local()), Duration::from_secs(10));
    other.message_id_prefix = "other:".to_owned();
    let other = NatsSink::connect(&other).await.expect("connect");
    assert_all_ok(&other.publish(&batch[..1]).await);
    assert_eq!(stored(&jetstream, &subject).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_nats_cannot_carry_is_refused_alone_naming_why() {
    let client = async_nats::connect(local()).await.expect("local NATS");
    let jetstream = jetstream::new(client);
    let subject = stream_for(&jetstream).await;
    let sink = NatsSink::connect(&settings(
        &format!("nats://{}", local()),
        Duration::from_secs(10),
    ))
    .await
    .expect("connect");
    let mut binary = message(&subject, 2);
    binary
        .headers
        .push(("checksum".to_owned(), vec![0xde, 0xad, 0xbe, 0xef]));
    let wildcard = message(&format!("{subject}.*"), 3);
    let batch = vec![message(&subject, 1), binary, wildcard, message(&subject, 4)];
    let results = sink.publish(&batch).await;
    assert!(results[0].is_ok() && results[3].is_ok(), "{results:?}");
    for (i, names) in [(1, "\"checksum\""), (2, "wildcard")] {
        let e = results[i].as_ref().expect_err("refused");
        assert_eq!(e.fault(), Some(PublishFault::Refused), "{e}");
        assert!(e.to_string().contains(names), "{e}");
    }
    assert_eq!(stored(&jetstream, &subject).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_make_the_probe_say_authentication_and_reconfiguring_fixes_them() {
    let server = Server::start(Server::free_port(), Some(USERS));
    let url =
        |user: &str, password: &str| format!("nats://{user}:{password}@127.0.0.1:{}", server.port);
    let sink = Arc::new(
        NatsSink::connect(&settings(&url("u", "wrong"), Duration::from_secs(2)))
            .await
            .expect("connect is Ok whatever the server thinks of the credentials"),
    );
    let err = probe(&sink).await.expect_err("wrong password");
    assert!(matches!(err, SinkError::Authentication(_)), "{err}");
    assert!(err.to_string().contains("authorization violation"), "{err}");
    assert!(!err.to_string().contains("wrong"), "no password in {err}");

    // SIGHUP with the right password: later batches use it.
    let client = async_nats::ConnectOptions::with_user_and_password("u".into(), "p".into())
        .connect(format!("127.0.0.1:{}", server.port))
        .await
        .expect("connect as u");
    let subject = stream_for(&jetstream::new(client)).await;
    sink.reconfigure(&settings(&url("u", "p"), Duration::from_secs(5)))
        .await
        .expect("reconfigure");
    assert_eq!(probe(&sink).await, Ok(()));
    assert_all_ok(&sink.publish(&[message(&subject, 1)]).await);
    // Settings that cannot work leave the connection as it is.
    let broken = sink
        .reconfigure(&settings("http://127.0.0.1:1", Duration::from_secs(5)))
        .await
        .expect_err("not a NATS URL");
    assert!(broken.to_string().contains("nats.url"), "{broken}");
    assert_all_ok(&sink.publish(&[message(&subject, 2)]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_the_credentials_may_not_publish_to_is_refused_at_once() {
    let server = Server::start(Server::free_port(), Some(USERS));
    let url = format!("nats://u:p@127.0.0.1:{}", server.port);
    let client = async_nats::ConnectOptions::with_user_and_password("u".into(), "p".into())
        .connect(format!("127.0.0.1:{}", server.port))
        .await
        .expect("connect as u");
    let subject = stream_for(&jetstream::new(client)).await;
    let timeout = Duration::from_secs(20);
    let sink = NatsSink::connect(&settings(&url, timeout))
        .await
        .expect("connect");
    let started = Instant::now();
    let results = sink
        .publish(&[
            message(&subject, 1),
            message("forbidden.orders", 2),
            message(&subject, 3),
        ])
        .await;
    assert!(
        started.elapsed() < timeout / 2,
        "waited {:?}",
        started.elapsed()
    );
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    let e = results[1].as_ref().expect_err("denied");
    assert_eq!(e.fault(), Some(PublishFault::Refused), "{e}");
    assert!(
        e.to_string().contains("forbidden.orders") && e.to_string().contains("permission"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_after_connect_gets_the_rows_that_waited() {
    let port = Server::free_port();
    let sink = NatsSink::connect(&settings(
        &format!("nats://127.0.0.1:{port}"),
        Duration::from_secs(1),
    ))
    .await
    .expect("connect is Ok while nothing listens");
    let waited = sink.publish(&[message("sluice.later", 1)]).await;
    let e = waited[0].as_ref().expect_err("nothing listens");
    assert_eq!(e.fault(), Some(PublishFault::Unavailable), "{e}");
    assert!(e.to_string().contains("not connected"), "{e}");

    let server = Server::start(port, None);
    let client = async_nats::connect(format!("127.0.0.1:{}", server.port))
        .await
        .expect("connect to the new server");
    let subject = stream_for(&jetstream::new(client.clone())).await;
    let batch = [message(&subject, 1), message(&subject, 2)];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut results = sink.publish(&batch).await;
    while results.iter().any(Result::is_err) && Instant::now() < deadline {
        results = sink.publish(&batch).await;
    }
    assert_all_ok(&results);
    assert_eq!(stored(&jetstream::new(client), &subject).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_cannot_work_fail_connect_naming_the_key() {
    let mut bad = settings("nats://127.0.0.1:4222", Duration::from_secs(1));
    bad.credentials_location = Some("/nonexistent/app.creds".into());
    let e = NatsSink::connect(&bad)
        .await
        .err()
        .expect("unreadable creds");
    assert!(e.to_string().contains("nats.credentials_location"), "{e}");
    let dir = tempfile::tempdir().expect("temporary directory");
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "not a certificate").expect("write");
    let mut bad = settings("tls://127.0.0.1:4222", Duration::from_secs(1));
    bad.ca_location = Some(not_pem);
    let e = NatsSink::connect(&bad).await.err().expect("no certificate");
    assert!(e.to_string().contains("nats.ca_location"), "{e}");
}

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`ca.pem`) and a certificate for 127.0.0.1 it signed (`server.pem`, `server.key`).
fn certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509", "-days", "1", "-subj", "/CN=sluice test CA"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl(dir, &ca);
    let mut request = vec!["req", "-subj", "/CN=127.0.0.1"];
    request.extend(ec);
    request.extend(["-keyout", "server.key", "-out", "server.csr"]);
    openssl(dir, &request);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write the extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "1",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_works_with_the_servers_ca_and_the_probe_names_tls_without_it() {
    let dir = tempfile::tempdir().expect("temporary directory");
    certificates(dir.path());
    let ca = dir.path().join("ca.pem");
    let tls = format!(
        "tls {{ cert_file: {:?}, key_file: {:?} }}",
        dir.path().join("server.pem"),
        dir.path().join("server.key")
    );
    let server = Server::start_in(dir, Server::free_port(), Some(&tls));
    let url = format!("tls://127.0.0.1:{}", server.port);

    let mut trusted = settings(&url, Duration::from_secs(5));
    trusted.ca_location = Some(ca.clone());
    let sink = Arc::new(NatsSink::connect(&trusted).await.expect("connect"));
    assert_eq!(probe(&sink).await, Ok(()));
    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(ca)
        .require_tls(true)
        .connect(&url)
        .await
        .expect("connect with the CA");
    let jetstream = jetstream::new(client);
    let subject = stream_for(&jetstream).await;
    assert_all_ok(&sink.publish(&[message(&subject, 1)]).await);
    assert_eq!(stored(&jetstream, &subject).await, 1);

    // The system's roots do not know the test CA.
    let untrusted = Arc::new(
        NatsSink::connect(&settings(&url, Duration::from_secs(1)))
            .await
            .expect("connect is Ok: the handshake fails in the background"),
    );
    let err = probe(&untrusted).await.expect_err("unknown CA");
    assert!(matches!(err, SinkError::Tls(_)), "{err}");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    let failed = untrusted.publish(&[message(&subject, 2)]).await;
    let e = failed[0].as_ref().expect_err("not connected");
    assert_eq!(e.fault(), Some(PublishFault::Unavailable), "{e}");
}
