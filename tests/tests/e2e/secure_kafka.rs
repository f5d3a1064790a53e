//! Authenticated and encrypted connections to Kafka, end to end: the real relay against a
//! Tansu of the test's own that demands SASL (SCRAM-SHA-256, SCRAM-SHA-512), TLS (through a
//! TLS-terminating proxy: see `sluice_testkit::secure_broker`) or both. Rows are delivered and
//! read back by an authenticated consumer. A wrong password, an unknown user, a mechanism the
//! broker does not offer, a certificate the relay does not trust and a broker that is not
//! there: `/readyz` is unready and says which, the log says which once (not once per retry),
//! and no row is marked sent. A wrong password fixed in its `${file:}` secret takes effect on
//! SIGHUP. (SASL PLAIN cannot be tested against Tansu 0.6, which does not offer it: see
//! docs/security.md.)

use std::time::Duration;

use sluice_testkit::free_port;
use sluice_testkit::secure_broker::{Login, Scram, ScramUser, SecureBroker, Security, TestCa};
use sluice_testkit::*;

const ROWS: i64 = 20;
/// How long a failing relay is watched for repeated log lines: longer than the 30 s for
/// which librdkafka itself holds back an identical error, so a line per retry would show.
const WATCH: Duration = Duration::from_secs(35);
/// The sink's own line when the connection state changes (host/src/sink/connection.rs).
const SINK_LINE: &str = "kafka: ";

/// A relay config for `table` publishing to `prefix`* with `kafka` as its `[kafka]` properties
/// (bootstrap.servers among them) and telemetry on `port`; `extra` goes at the end.
fn config(table: &str, prefix: &str, kafka: &[(&str, String)], port: u16, extra: &str) -> String {
    let bootstrap = kafka
        .iter()
        .find(|(k, _)| *k == "bootstrap.servers")
        .map(|(_, v)| v.clone())
        .expect("bootstrap.servers");
    let telemetry =
        format!("[telemetry]\nlisten = \"127.0.0.1:{port}\"\nsample_interval = \"1s\"\n{extra}");
    let base = relay_config(table, &bootstrap, prefix, "", &telemetry);
    let line = format!("\"bootstrap.servers\" = \"{bootstrap}\"\n");
    let more: String = kafka
        .iter()
        .filter(|(k, _)| *k != "bootstrap.servers")
        .map(|(k, v)| format!("\"{k}\" = \"{v}\"\n"))
        .collect();
    assert!(base.contains(&line), "relay_config changed shape:\n{base}");
    base.replacen(&line, &format!("{line}{more}"), 1)
}

/// A fresh outbox table with `ROWS` rows, and the reference router's two topics on `broker`.
async fn table_with_rows(broker: &SecureBroker, stem: &str) -> (DbTable, String, Vec<String>) {
    let table = DbTable::create(Database::Postgres, stem).await;
    let prefix = format!("{}.", table.name);
    let topics = vec![format!("{prefix}order"), format!("{prefix}customer")];
    broker.create_topics(&topics).await.expect("create topics");
    table.insert_rows(ROWS, None).await;
    (table, prefix, topics)
}

/// A SASL broker (with TLS if `tls`) with SCRAM user `relay` for `mechanism` and `password`,
/// and the login that matches it.
async fn broker_with_relay_user(
    tls: bool,
    mechanism: Scram,
    password: &str,
) -> (SecureBroker, Login) {
    let user = ScramUser {
        name: "relay",
        password,
        mechanism,
    };
    let broker = SecureBroker::start(Security { sasl: true, tls }, &[user]).await;
    (broker, Login::new(mechanism.mechanism(), "relay", password))
}

async fn readyz_becomes(port: u16, want: u16) -> bool {
    wait_until(SCENARIO_WAIT, || async move {
        http_get(port, "/readyz").is_some_and(|(code, _)| code == want)
    })
    .await
}

/// Runs the relay with `login` against `broker` until every row is sent, then reads them
/// back as the same user.
async fn rows_are_delivered(broker: &SecureBroker, login: &Login, stem: &str) {
    let (table, prefix, topics) = table_with_rows(broker, stem).await;
    let port = free_port();
    let relay = RelayProcess::start(&config(
        &table.name,
        &prefix,
        &broker.properties(login),
        port,
        "",
    ))
    .expect("start relay");
    let sent = wait_until(SCENARIO_WAIT, || async { table.unsent().await == 0 }).await;
    assert!(
        sent,
        "rows not sent ({} left): {}\ntansu:\n{}",
        table.unsent().await,
        relay.log(),
        broker.tansu_log()
    );
    assert!(readyz_becomes(port, 200).await, "{}", relay.log());
    let received = tokio::task::block_in_place(|| {
        broker.consume(login, &topics, ROWS as usize, Duration::from_secs(1))
    })
    .expect("consume");
    assert_eq!(received.len(), ROWS as usize);
    let ids = count_by_id(&received);
    assert_eq!(ids.len(), ROWS as usize, "every row once: {ids:?}");
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_scram_sha_256_delivers() {
    let (broker, login) = broker_with_relay_user(false, Scram::Sha256, "s3cret-256").await;
    rows_are_delivered(&broker, &login, "scram256").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_scram_sha_512_delivers() {
    let (broker, login) = broker_with_relay_user(false, Scram::Sha512, "s3cret-512").await;
    rows_are_delivered(&broker, &login, "scram512").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_with_a_ca_file_delivers() {
    let tls = Security {
        sasl: false,
        tls: true,
    };
    let broker = SecureBroker::start(tls, &[]).await;
    rows_are_delivered(&broker, &Login::admin(), "tls_ca").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl_ssl_scram_sha_512_delivers() {
    let (broker, login) = broker_with_relay_user(true, Scram::Sha512, "s3cret-ssl").await;
    rows_are_delivered(&broker, &login, "sasl_ssl").await;
}

/// What the failure tests expect the relay to say.
struct Says {
    /// In `/readyz`'s `kafka_error` and in the log.
    cause: &'static str,
    /// Causes it must not claim.
    not: &'static [&'static str],
}

const AUTHENTICATION: &str = "authentication with the broker failed";
const TLS: &str = "TLS with the broker failed";
const UNREACHABLE: &str = "broker not reachable";

/// Runs the relay with `kafka` properties that cannot work, and checks that it turns unready
/// naming the cause, logs the cause once in [`WATCH`], and sends nothing.
async fn refused(table: &DbTable, prefix: &str, kafka: &[(&str, String)], says: Says) {
    let port = free_port();
    // Batches give up after 5 s and are retried, so the watch sees several rounds of them.
    let mut kafka = kafka.to_vec();
    kafka.push(("message.timeout.ms", "5000".to_owned()));
    let relay =
        RelayProcess::start(&config(&table.name, prefix, &kafka, port, "")).expect("start relay");
    let named = wait_until(SCENARIO_WAIT, || async {
        http_get(port, "/readyz")
            .is_some_and(|(code, body)| code == 503 && body.contains(says.cause))
    })
    .await;
    assert!(
        named,
        "/readyz never named {:?}: {:?}\n{}",
        says.cause,
        http_get(port, "/readyz"),
        relay.log()
    );
    tokio::time::sleep(WATCH).await;

    let (code, body) = http_get(port, "/readyz").expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("\"kafka\":false"), "{body}");
    assert!(body.contains(says.cause), "{body}");
    let log = relay.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(says.cause)).collect();
    let from_sink = lines.iter().filter(|l| l.contains(SINK_LINE)).count();
    // Once from the sink when the state changed, once from the readiness check when its
    // answer changed; not once per retry.
    assert_eq!(from_sink, 1, "{lines:#?}\n{log}");
    assert!(lines.len() <= 2, "{lines:#?}");
    for other in says.not {
        assert!(!log.contains(other), "claims {other:?}:\n{log}");
    }
    assert_eq!(table.unsent().await, ROWS, "rows marked sent:\n{log}");
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
}

/// A SASL broker with SCRAM-SHA-256 user `relay` (password `right`), a table with rows and
/// its topics.
async fn scram_broker(stem: &str) -> (SecureBroker, DbTable, String) {
    let (broker, _) = broker_with_relay_user(false, Scram::Sha256, "right").await;
    let (table, prefix, _) = table_with_rows(&broker, stem).await;
    (broker, table, prefix)
}

/// A login the SCRAM broker refuses: an authentication failure, never called TLS.
async fn login_refused(stem: &str, mechanism: &str, user: &str, password: &str) {
    let (broker, table, prefix) = scram_broker(stem).await;
    let login = Login::new(mechanism, user, password);
    let says = Says {
        cause: AUTHENTICATION,
        not: &[TLS],
    };
    refused(&table, &prefix, &broker.properties(&login), says).await;
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_is_an_authentication_failure() {
    login_refused("wrong_pw", Scram::Sha256.mechanism(), "relay", "wrong").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_user_is_an_authentication_failure() {
    login_refused("unknown_user", Scram::Sha256.mechanism(), "nobody", "right").await;
}

/// Tansu 0.6 offers SCRAM only: PLAIN (or any mechanism the broker lacks) fails in the SASL
/// handshake, an authentication failure like a wrong password.
#[tokio::test(flavor = "multi_thread")]
async fn a_mechanism_the_broker_does_not_offer_is_an_authentication_failure() {
    login_refused("plain_refused", "PLAIN", "relay", "right").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_certificate_is_a_tls_failure() {
    let tls = Security {
        sasl: false,
        tls: true,
    };
    let broker = SecureBroker::start(tls, &[]).await;
    let (table, prefix, _) = table_with_rows(&broker, "untrusted").await;
    // A CA that did not sign the broker's certificate.
    let dir = tempfile::tempdir().expect("temporary directory");
    let stranger = TestCa::new(dir.path(), "stranger-ca").expect("CA");
    let mut kafka = broker.properties(&Login::admin());
    for (k, v) in &mut kafka {
        if *k == "ssl.ca.location" {
            *v = stranger.pem.display().to_string();
        }
    }
    let says = Says {
        cause: TLS,
        not: &[AUTHENTICATION],
    };
    refused(&table, &prefix, &kafka, says).await;
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_is_not_there_is_unreachable() {
    let table = DbTable::create(Database::Postgres, "no_broker").await;
    table.insert_rows(ROWS, None).await;
    let prefix = format!("{}.", table.name);
    // Nothing listens there.
    let kafka = [("bootstrap.servers", format!("127.0.0.1:{}", free_port()))];
    let says = Says {
        cause: UNREACHABLE,
        not: &[AUTHENTICATION, TLS],
    };
    refused(&table, &prefix, &kafka, says).await;
    table.drop_table().await;
}

/// A wrong password in the `${file:}` secret: unready, nothing sent. The right password
/// written to the file and SIGHUP: the rows flow and the relay is ready.
#[tokio::test(flavor = "multi_thread")]
async fn rows_flow_once_the_password_file_is_fixed_and_sighup_sent() {
    let (broker, _) = broker_with_relay_user(false, Scram::Sha512, "right-512").await;
    let (table, prefix, topics) = table_with_rows(&broker, "rotate_pw").await;
    let secrets = tempfile::tempdir().expect("temporary directory");
    let password_file = secrets.path().join("kafka-password");
    std::fs::write(&password_file, "wrong-512\n").expect("write password");
    let login = Login::new(
        Scram::Sha512.mechanism(),
        "relay",
        &format!("${{file:{}}}", password_file.display()),
    );
    let mut kafka = broker.properties(&login);
    kafka.push(("message.timeout.ms", "5000".to_owned()));
    let port = free_port();
    let retry = "[relay.retry]\ninitial = \"500ms\"\nmax = \"1s\"\n";
    let relay = RelayProcess::start(&config(&table.name, &prefix, &kafka, port, retry))
        .expect("start relay");
    let named = wait_until(SCENARIO_WAIT, || async {
        http_get(port, "/readyz")
            .is_some_and(|(code, body)| code == 503 && body.contains(AUTHENTICATION))
    })
    .await;
    assert!(named, "{:?}\n{}", http_get(port, "/readyz"), relay.log());
    // A batch or two fail meanwhile (5 s each): none is marked sent.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(table.unsent().await, ROWS, "{}", relay.log());

    std::fs::write(&password_file, "right-512\n").expect("write password");
    relay.hangup();
    let sent = wait_until(SCENARIO_WAIT, || async { table.unsent().await == 0 }).await;
    assert!(
        sent,
        "rows not sent after SIGHUP ({} left):\n{}",
        table.unsent().await,
        relay.log()
    );
    assert!(readyz_becomes(port, 200).await, "{}", relay.log());
    let right = Login::new(Scram::Sha512.mechanism(), "relay", "right-512");
    let received = tokio::task::block_in_place(|| {
        broker.consume(&right, &topics, ROWS as usize, Duration::from_secs(1))
    })
    .expect("consume");
    assert_eq!(count_by_id(&received).len(), ROWS as usize);
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(
        exit.log
            .contains("the connection to the broker works again"),
        "{}",
        exit.log
    );
    // The password is a secret: neither value is in the log.
    assert!(!exit.log.contains("wrong-512"), "{}", exit.log);
    assert!(!exit.log.contains("right-512"), "{}", exit.log);
    table.drop_table().await;
}

/// A CA file that does not verify the broker: unready, nothing sent. The right CA written to
/// the same path and SIGHUP: a new producer reads it, the rows flow.
#[tokio::test(flavor = "multi_thread")]
async fn rows_flow_once_the_ca_file_is_renewed_in_place_and_sighup_sent() {
    let tls = Security {
        sasl: false,
        tls: true,
    };
    let broker = SecureBroker::start(tls, &[]).await;
    let (table, prefix, topics) = table_with_rows(&broker, "renew_ca").await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let stranger = TestCa::new(dir.path(), "stranger-ca").expect("CA");
    let ca_file = dir.path().join("kafka-ca.pem");
    std::fs::copy(&stranger.pem, &ca_file).expect("copy CA");
    let mut kafka = broker.properties(&Login::admin());
    let mut right_ca = None;
    for (k, v) in &mut kafka {
        if *k == "ssl.ca.location" {
            right_ca = Some(std::mem::replace(v, ca_file.display().to_string()));
        }
    }
    let right_ca = right_ca.expect("the TLS broker's properties name its CA");
    kafka.push(("message.timeout.ms", "5000".to_owned()));
    let port = free_port();
    let retry = "[relay.retry]\ninitial = \"500ms\"\nmax = \"1s\"\n";
    let relay = RelayProcess::start(&config(&table.name, &prefix, &kafka, port, retry))
        .expect("start relay");
    let named = wait_until(SCENARIO_WAIT, || async {
        http_get(port, "/readyz").is_some_and(|(code, body)| code == 503 && body.contains(TLS))
    })
    .await;
    assert!(named, "{:?}\n{}", http_get(port, "/readyz"), relay.log());
    assert_eq!(table.unsent().await, ROWS, "{}", relay.log());

    // The same path, the config unchanged: only the file's contents tell.
    std::fs::copy(&right_ca, &ca_file).expect("renew CA");
    relay.hangup();
    let sent = wait_until(SCENARIO_WAIT, || async { table.unsent().await == 0 }).await;
    assert!(
        sent,
        "rows not sent after SIGHUP ({} left):\n{}",
        table.unsent().await,
        relay.log()
    );
    assert!(readyz_becomes(port, 200).await, "{}", relay.log());
    let received = tokio::task::block_in_place(|| {
        broker.consume(
            &Login::admin(),
            &topics,
            ROWS as usize,
            Duration::from_secs(1),
        )
    })
    .expect("consume");
    assert_eq!(count_by_id(&received).len(), ROWS as usize);
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(
        exit.log.contains("config reload: new kafka producer"),
        "{}",
        exit.log
    );
    table.drop_table().await;
}
