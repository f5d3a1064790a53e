//! The Redis sink against real servers: the local Redis (`SLUICE_TEST_REDIS`, default
//! `127.0.0.1:6379`) and `redis-server` processes of the tests' own, on free ports, for what
//! the local one must not be made to do (require a password, check ACLs, speak TLS, be down).

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::model::{Headers, OutboxId};
use crate::secret::SecretUrl;

fn local_address() -> String {
    std::env::var("SLUICE_TEST_REDIS").unwrap_or_else(|_| "127.0.0.1:6379".to_owned())
}

fn settings(url: &str) -> RedisSettings {
    let mut settings = RedisSettings::new(SecretUrl::read(url.to_owned()));
    settings.timeout = Duration::from_secs(3);
    settings
}

fn local_settings() -> RedisSettings {
    settings(&format!("redis://{}", local_address()))
}

/// A stream key no other test or run uses; it expires within the hour.
fn unique_key(kind: &str) -> String {
    format!(
        "sluice-test:{kind}:{}:{:016x}",
        std::process::id(),
        fastrand::u64(..)
    )
}

fn message(topic: &str, row: i64) -> OutboundMessage {
    let headers: Headers = vec![
        ("sluice-tenant".to_owned(), b"acme".to_vec()),
        ("sluice-outbox-id".to_owned(), row.to_string().into_bytes()),
    ];
    OutboundMessage {
        row: OutboxId::Int(row),
        broker: Broker::Redis,
        topic: topic.to_owned(),
        key: Some(format!("k{row}").into_bytes()),
        payload: Some(format!(r#"{{"n":{row}}}"#).into_bytes()),
        headers,
        partition: None,
        encoding: None,
        value_record: None,
        key_record: None,
        timestamp_ms: None,
    }
}

/// A connection of the test's own to the Redis at `address`.
async fn redis_at(address: &str) -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(format!("redis://{address}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis at {address}: {e}"))
}

/// One stream entry's fields, name and value, in order.
type Fields = Vec<(String, Vec<u8>)>;

/// Every entry of `stream`, as its fields (name, value), in order.
async fn entries(conn: &mut ::redis::aio::MultiplexedConnection, stream: &str) -> Vec<Fields> {
    let read: Vec<(String, Fields)> = ::redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .unwrap();
    read.into_iter().map(|(_, fields)| fields).collect()
}

async fn expire(conn: &mut ::redis::aio::MultiplexedConnection, key: &str) {
    let _: () = ::redis::cmd("EXPIRE")
        .arg(key)
        .arg(3600)
        .query_async(conn)
        .await
        .unwrap();
}

fn fault(result: &Result<Delivered, SinkError>) -> Option<PublishFault> {
    result.as_ref().err().and_then(SinkError::fault)
}

/// `sink.probe(timeout)` off the reactor, as `/readyz` calls it.
async fn probe(sink: &Arc<RedisSink>, timeout: Duration) -> Result<(), SinkError> {
    let sink = Arc::clone(sink);
    tokio::task::spawn_blocking(move || sink.probe(timeout))
        .await
        .unwrap()
}

/// A `redis-server` of the test's own on a free port, killed when dropped. Keeps nothing on
/// disk.
struct OwnRedis {
    child: Child,
    port: u16,
}

impl OwnRedis {
    /// On a free port, with `args` after the defaults.
    fn start(args: &[&str]) -> Self {
        Self::start_on(free_port(), args)
    }

    /// On `port`, with `args` after the defaults; returns once it accepts connections.
    fn start_on(port: u16, args: &[&str]) -> Self {
        Self::launch(port, &[&["--port", &port.to_string()], args].concat())
    }

    /// TLS only, on `port`, with `args` after the defaults.
    fn start_tls(port: u16, args: &[&str]) -> Self {
        let tls = ["--port", "0", "--tls-port", &port.to_string()];
        Self::launch(port, &[&tls[..], args].concat())
    }

    fn launch(port: u16, args: &[&str]) -> Self {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package)");
        let server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Publishes `batch` until every message went through or `within` passed; the last results.
async fn publish_until_ok(
    sink: &RedisSink,
    batch: &[OutboundMessage],
    within: Duration,
) -> Vec<Result<Delivered, SinkError>> {
    let deadline = Instant::now() + within;
    loop {
        let results = sink.publish(batch).await;
        if results.iter().all(Result::is_ok) || Instant::now() > deadline {
            return results;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_hold_value_key_headers_and_a_message_id_per_fan_out_index() {
    let mut conn = redis_at(&local_address()).await;
    let stream = unique_key("layout");
    let mut settings = local_settings();
    settings.message_id_prefix = "orders-".to_owned();
    let sink = RedisSink::connect(&settings).await.unwrap();
    // Row 5 fans out to two messages around row 6's one.
    let mut first = message(&stream, 5);
    first.headers.push(("trace".to_owned(), b"a".to_vec()));
    first.headers.push(("trace".to_owned(), b"b".to_vec()));
    let mut tombstone = message(&stream, 6);
    tombstone.payload = None;
    tombstone.key = None;
    let second = message(&stream, 5);
    let results = sink.publish(&[first, tombstone, second]).await;
    expire(&mut conn, &stream).await;
    assert_eq!(
        results,
        vec![
            Ok(Delivered::default()),
            Ok(Delivered::default()),
            Ok(Delivered::default())
        ]
    );
    let field = |name: &str, value: &str| (name.to_owned(), value.as_bytes().to_vec());
    assert_eq!(
        entries(&mut conn, &stream).await,
        vec![
            vec![
                field("value", r#"{"n":5}"#),
                field("sluice-key", "k5"),
                field("sluice-tenant", "acme"),
                field("sluice-outbox-id", "5"),
                field("trace", "a"),
                field("trace", "b"),
                field("sluice-message-id", "orders-5-0"),
            ],
            vec![
                field("sluice-tenant", "acme"),
                field("sluice-outbox-id", "6"),
                field("sluice-message-id", "orders-6-0"),
            ],
            vec![
                field("value", r#"{"n":5}"#),
                field("sluice-key", "k5"),
                field("sluice-tenant", "acme"),
                field("sluice-outbox-id", "5"),
                field("sluice-message-id", "orders-5-1"),
            ],
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxlen_trims_each_stream_to_about_that_length() {
    let mut conn = redis_at(&local_address()).await;
    let stream = unique_key("maxlen");
    let mut settings = local_settings();
    settings.maxlen = Some(10);
    let sink = RedisSink::connect(&settings).await.unwrap();
    let batch: Vec<OutboundMessage> = (1..=500).map(|row| message(&stream, row)).collect();
    let results = sink.publish(&batch).await;
    expire(&mut conn, &stream).await;
    assert!(results.iter().all(Result::is_ok), "{:?}", results[0]);
    let len: usize = ::redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    // `~`: Redis trims whole nodes of (by default) 100 entries.
    assert!((10..=110).contains(&len), "{len} entries left of 500");
    let newest = entries(&mut conn, &stream).await.pop().unwrap();
    assert!(newest.contains(&("sluice-outbox-id".to_owned(), b"500".to_vec())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_create_streams_a_missing_stream_is_refused_and_not_made() {
    let mut conn = redis_at(&local_address()).await;
    let (present, missing) = (unique_key("present"), unique_key("missing"));
    let mut settings = local_settings();
    settings.create_streams = false;
    let sink = RedisSink::connect(&settings).await.unwrap();
    let _: () = ::redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&present)
        .arg("g")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();
    expire(&mut conn, &present).await;
    let results = sink
        .publish(&[
            message(&present, 1),
            message(&missing, 2),
            message(&present, 3),
        ])
        .await;
    assert_eq!(
        (&results[0], &results[2]),
        (&Ok(Delivered::default()), &Ok(Delivered::default()))
    );
    assert_eq!(fault(&results[1]), Some(PublishFault::Refused));
    let text = results[1].as_ref().unwrap_err().to_string();
    assert!(
        text.contains(&missing) && text.contains("stream does not exist"),
        "{text}"
    );
    let exists: bool = ::redis::cmd("EXISTS")
        .arg(&missing)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists, "NOMKSTREAM made no stream");

    // By default a message makes its stream.
    let sink = RedisSink::connect(&local_settings()).await.unwrap();
    assert_eq!(
        sink.publish(&[message(&missing, 2)]).await,
        vec![Ok(Delivered::default())]
    );
    expire(&mut conn, &missing).await;
    assert_eq!(entries(&mut conn, &missing).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_a_stream_or_a_reserved_header_is_refused_alone() {
    let mut conn = redis_at(&local_address()).await;
    let (stream, string) = (unique_key("stream"), unique_key("string"));
    let _: () = ::redis::cmd("SET")
        .arg(&string)
        .arg("x")
        .arg("EX")
        .arg(3600)
        .query_async(&mut conn)
        .await
        .unwrap();
    let sink = RedisSink::connect(&local_settings()).await.unwrap();
    let mut reserved = message(&stream, 3);
    reserved
        .headers
        .push(("sluice-key".to_owned(), b"x".to_vec()));
    let results = sink
        .publish(&[
            message(&stream, 1),
            message(&string, 2),
            reserved,
            message(&stream, 4),
        ])
        .await;
    expire(&mut conn, &stream).await;
    assert_eq!(
        (&results[0], &results[3]),
        (&Ok(Delivered::default()), &Ok(Delivered::default()))
    );
    let wrongtype = results[1].as_ref().unwrap_err();
    assert_eq!(wrongtype.fault(), Some(PublishFault::Refused));
    let text = wrongtype.to_string();
    assert!(
        text.contains(&string) && text.contains("WRONGTYPE"),
        "{text}"
    );
    let header = results[2].as_ref().unwrap_err();
    assert_eq!(header.fault(), Some(PublishFault::Refused));
    assert!(header.to_string().contains("\"sluice-key\""), "{header}");
    assert_eq!(entries(&mut conn, &stream).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_without_replicas_fails_the_batch_as_unavailable_within_the_timeout() {
    let mut conn = redis_at(&local_address()).await;
    let stream = unique_key("wait");
    let mut settings = local_settings();
    settings.wait_replicas = Some(1);
    settings.timeout = Duration::from_secs(1);
    let sink = RedisSink::connect(&settings).await.unwrap();
    let started = Instant::now();
    let results = sink
        .publish(&[message(&stream, 1), message(&stream, 2)])
        .await;
    let took = started.elapsed();
    expire(&mut conn, &stream).await;
    assert!(took < Duration::from_millis(1500), "{took:?}");
    for r in &results {
        assert_eq!(fault(r), Some(PublishFault::Unavailable), "{r:?}");
        let text = r.as_ref().unwrap_err().to_string();
        assert!(text.contains("only 0 of 1 replicas"), "{text}");
    }
    // On the primary all the same: what WAIT cannot undo (a retry duplicates it).
    assert_eq!(entries(&mut conn, &stream).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_fail_the_probe_as_authentication_until_reconfigured() {
    let server = OwnRedis::start(&["--requirepass", "Right-Pw-2207"]);
    let stream = unique_key("auth");
    for url in [
        format!("redis://:Wrong-Pw-1@{}", server.address()),
        format!("redis://{}", server.address()),
    ] {
        let sink = Arc::new(RedisSink::connect(&settings(&url)).await.unwrap());
        let probed = probe(&sink, Duration::from_secs(2)).await;
        assert!(
            matches!(probed, Err(SinkError::Authentication(_))),
            "{url}: {probed:?}"
        );
        assert!(!probed.unwrap_err().to_string().contains("Wrong-Pw-1"));
        let results = sink.publish(&[message(&stream, 1)]).await;
        assert_eq!(
            fault(&results[0]),
            Some(PublishFault::Unavailable),
            "{results:?}"
        );
        assert_eq!(
            sink.watch.problem().map(|(p, _)| p),
            Some(ConnectionProblem::Authentication)
        );

        // Rotated credentials: settings that cannot work leave the sink as it was, the
        // right password makes the next batch go through.
        let mut broken = settings(&format!("redis://:Right-Pw-2207@{}", server.address()));
        broken.ca_location = Some("/nonexistent/ca.pem".into());
        let err = sink.reconfigure(&broken).await.unwrap_err();
        assert!(err.to_string().contains("redis.ca_location"), "{err}");
        let right = settings(&format!("redis://:Right-Pw-2207@{}", server.address()));
        sink.reconfigure(&right).await.unwrap();
        assert_eq!(
            sink.publish(&[message(&stream, 2)]).await,
            vec![Ok(Delivered::default())]
        );
        assert_eq!(probe(&sink, Duration::from_secs(2)).await, Ok(()));
        assert_eq!(sink.watch.problem(), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_after_connect_gets_the_messages() {
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let stream = unique_key("late");
    let sink = Arc::new(
        RedisSink::connect(&settings(&format!("redis://{address}")))
            .await
            .expect("connect does not need the server"),
    );
    let results = sink.publish(&[message(&stream, 1)]).await;
    assert_eq!(
        fault(&results[0]),
        Some(PublishFault::Unavailable),
        "{results:?}"
    );
    assert!(
        results[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains(&address),
        "{results:?}"
    );
    let probed = probe(&sink, Duration::from_secs(1)).await;
    assert!(
        matches!(probed, Err(SinkError::Unreachable { .. })),
        "{probed:?}"
    );

    let _server = OwnRedis::start_on(port, &[]);
    let results = publish_until_ok(&sink, &[message(&stream, 1)], Duration::from_secs(10)).await;
    assert_eq!(results, vec![Ok(Delivered::default())]);
    let mut conn = redis_at(&address).await;
    assert_eq!(entries(&mut conn, &stream).await.len(), 1);
    assert_eq!(sink.watch.problem(), None, "the watch saw it work again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_reconnected_to() {
    let server = OwnRedis::start(&[]);
    let (port, address) = (server.port, server.address());
    let stream = unique_key("restart");
    let sink = RedisSink::connect(&settings(&format!("redis://{address}")))
        .await
        .unwrap();
    assert_eq!(
        sink.publish(&[message(&stream, 1)]).await,
        vec![Ok(Delivered::default())]
    );
    drop(server);
    let results = sink.publish(&[message(&stream, 2)]).await;
    assert_eq!(
        fault(&results[0]),
        Some(PublishFault::Unavailable),
        "{results:?}"
    );
    assert_eq!(
        sink.watch.problem().map(|(p, _)| p),
        Some(ConnectionProblem::Unreachable)
    );
    let _server = OwnRedis::start_on(port, &[]);
    let results = publish_until_ok(&sink, &[message(&stream, 2)], Duration::from_secs(10)).await;
    assert_eq!(results, vec![Ok(Delivered::default())]);
    // The restarted server kept nothing (`--save ""`): only what was sent after.
    let mut conn = redis_at(&address).await;
    assert_eq!(entries(&mut conn, &stream).await.len(), 1);
}

/// A batch Redis does not answer in time fails as unavailable within the timeout; the
/// connection is kept, so once Redis answers, the late batch's entries land before the retry's
/// (duplicates, in order) rather than after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_batch_is_unavailable_in_time_and_its_retry_lands_after_it() {
    let proxy = sluice_testkit::stall::StallingProxy::start(&local_address()).unwrap();
    let mut conn = redis_at(&local_address()).await;
    let stream = unique_key("stall");
    let mut settings = settings(&format!("redis://127.0.0.1:{}", proxy.port()));
    settings.timeout = Duration::from_secs(1);
    let sink = RedisSink::connect(&settings).await.unwrap();
    assert_eq!(
        sink.publish(&[message(&stream, 1)]).await,
        vec![Ok(Delivered::default())]
    );
    expire(&mut conn, &stream).await;
    proxy.freeze();
    let batch = [message(&stream, 2), message(&stream, 3)];
    let started = Instant::now();
    let results = sink.publish(&batch).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "{took:?}");
    for r in &results {
        assert_eq!(fault(r), Some(PublishFault::Unavailable), "{r:?}");
        assert!(
            r.as_ref().unwrap_err().to_string().contains("no reply"),
            "{r:?}"
        );
    }
    proxy.thaw();
    assert_eq!(
        sink.publish(&batch).await,
        vec![Ok(Delivered::default()), Ok(Delivered::default())]
    );
    let rows: Vec<Vec<u8>> = entries(&mut conn, &stream)
        .await
        .into_iter()
        .filter_map(|fields| {
            fields
                .into_iter()
                .find(|(name, _)| name == "sluice-outbox-id")
                .map(|(_, v)| v)
        })
        .collect();
    assert_eq!(rows, [b"1", b"2", b"3", b"2", b"3"].map(|r| r.to_vec()));
    assert_eq!(proxy.connections(), 1, "one connection throughout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_acl_denies_is_refused_as_the_tenants_fault() {
    let server = OwnRedis::start(&[
        "--user",
        "default",
        "off",
        "--user",
        "app",
        "on",
        ">App-Pw-3301",
        "~allowed:*",
        "+@all",
    ]);
    let sink = RedisSink::connect(&settings(&format!(
        "redis://app:App-Pw-3301@{}",
        server.address()
    )))
    .await
    .unwrap();
    let results = sink
        .publish(&[message("allowed:s", 1), message("denied:s", 2)])
        .await;
    assert_eq!(results[0], Ok(Delivered::default()));
    assert_eq!(
        fault(&results[1]),
        Some(PublishFault::Refused),
        "{results:?}"
    );
    let text = results[1].as_ref().unwrap_err().to_string();
    assert!(
        text.contains("denied:s") && text.contains("NOPERM"),
        "{text}"
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate (PKCS#8 key), made with
/// the `openssl` command in `dir`.
fn make_certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("the openssl command");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for ca in ["ca", "other-ca"] {
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={ca}"),
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
        ]);
    }
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    for (name, ext) in [("server", true), ("client", false)] {
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ]);
        let mut sign = vec![
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        if ext {
            sign.extend(["-extfile".to_owned(), "san.ext".to_owned()]);
        }
        run(&sign.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_the_server_with_ca_location_and_presents_the_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path());
    let file = |name: &str| dir.path().join(name).display().to_string();
    let port = free_port();
    // Clients must present a certificate the CA signed.
    let _server = OwnRedis::start_tls(
        port,
        &[
            "--tls-cert-file",
            &file("server.pem"),
            "--tls-key-file",
            &file("server.key"),
            "--tls-ca-cert-file",
            &file("ca.pem"),
            "--tls-auth-clients",
            "yes",
        ],
    );
    let url = format!("rediss://127.0.0.1:{port}");
    let stream = unique_key("tls");
    let with = |ca: &str, client: bool| {
        let mut s = settings(&url);
        s.ca_location = Some(file(ca).into());
        if client {
            s.certificate_location = Some(file("client.pem").into());
            s.key_location = Some(file("client.key").into());
        }
        s
    };

    let sink = Arc::new(RedisSink::connect(&with("ca.pem", true)).await.unwrap());
    assert_eq!(probe(&sink, Duration::from_secs(3)).await, Ok(()));
    assert_eq!(
        sink.publish(&[message(&stream, 1)]).await,
        vec![Ok(Delivered::default())]
    );

    let untrusted = Arc::new(
        RedisSink::connect(&with("other-ca.pem", true))
            .await
            .unwrap(),
    );
    let probed = probe(&untrusted, Duration::from_secs(3)).await;
    assert!(matches!(probed, Err(SinkError::Tls(_))), "{probed:?}");
    let results = untrusted.publish(&[message(&stream, 2)]).await;
    assert_eq!(
        fault(&results[0]),
        Some(PublishFault::Unavailable),
        "{results:?}"
    );

    let anonymous = Arc::new(RedisSink::connect(&with("ca.pem", false)).await.unwrap());
    let probed = probe(&anonymous, Duration::from_secs(3)).await;
    // TLS 1.3 checks the client after the handshake: its alert ("certificate required")
    // usually arrives, but the reset that follows it sometimes arrives first.
    assert!(
        matches!(
            probed,
            Err(SinkError::Tls(_) | SinkError::Unreachable { .. })
        ),
        "{probed:?}"
    );
}
