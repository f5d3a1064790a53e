//! A Tansu broker of the test's own that demands SASL, TLS or both, for the tests of
//! authenticated and encrypted connections (see docs/security.md, "Testing against Tansu").
//!
//! - SASL: `tansu broker --authentication` checks SCRAM-SHA-256/512 against credentials in
//!   its storage engine, which only the SQLite (`libsql` feature) and PostgreSQL engines keep:
//!   the in-memory engine accepts and drops them. Its PLAIN is not built in (rsasl without
//!   the `plain` feature: "NoSharedMechanism"), and no client (`tansu user create` included)
//!   can make users on a broker that demands authentication before having one. So a SASL
//!   broker starts twice on a SQLite file in its own temporary directory: first without
//!   authentication, to make its users through the Kafka admin API
//!   (AlterUserScramCredentials), then with `--authentication`.
//! - TLS: Tansu 0.6 takes `--cert`/`--key` but does not use them (it serves plain TCP), so a
//!   TLS-terminating proxy ([`TlsProxy`]) stands in front of it, with a server certificate
//!   signed by a CA the test makes ([`TestCa`]). Tansu advertises the proxy's address, so
//!   clients reconnect through it. Keys live in memory and temporary files only.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use anyhow::{Context, bail};
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{Ssl, SslAcceptor, SslMethod};
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509, X509Builder, X509NameBuilder, X509NameRef};
use rdkafka::ClientConfig;
use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;

use crate::broker::{OwnTansu, TansuLaunch, free_port};
use crate::{Received, consume_until_with, create_topics_with, wait_until};

/// A certificate authority of the test's own; its certificate is in a PEM file for
/// `ssl.ca.location`.
pub struct TestCa {
    cert: X509,
    key: PKey<Private>,
    /// The CA certificate (PEM).
    pub pem: PathBuf,
}

fn new_key() -> anyhow::Result<PKey<Private>> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    Ok(PKey::from_ec_key(EcKey::generate(&group)?)?)
}

/// An X.509 v3 certificate for `CN=<common_name>` and `key`, with a random serial number,
/// valid from now to two days on, issued by `issuer` (`None`: itself); extensions and the
/// signature are the caller's.
fn certificate(
    common_name: &str,
    issuer: Option<&X509NameRef>,
    key: &PKey<Private>,
) -> anyhow::Result<X509Builder> {
    let mut subject = X509NameBuilder::new()?;
    subject.append_entry_by_text("CN", common_name)?;
    let subject = subject.build();
    let mut serial = BigNum::new()?;
    serial.rand(120, MsbOption::MAYBE_ZERO, false)?;
    let serial = serial.to_asn1_integer()?;
    let (not_before, not_after) = (Asn1Time::days_from_now(0)?, Asn1Time::days_from_now(2)?);
    let mut b = X509::builder()?;
    b.set_version(2)?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(&subject)?;
    b.set_issuer_name(issuer.unwrap_or(&subject))?;
    b.set_pubkey(key)?;
    b.set_not_before(&not_before)?;
    b.set_not_after(&not_after)?;
    Ok(b)
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `dir/<name>.pem`.
    pub fn new(dir: &Path, name: &str) -> anyhow::Result<Self> {
        let key = new_key()?;
        let mut b = certificate(name, None, &key)?;
        b.append_extension(BasicConstraints::new().critical().ca().build()?)?;
        b.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()?,
        )?;
        b.sign(&key, MessageDigest::sha256())?;
        let cert = b.build();
        let pem = dir.join(format!("{name}.pem"));
        std::fs::write(&pem, cert.to_pem()?)?;
        Ok(Self { cert, key, pem })
    }

    /// A server certificate for `127.0.0.1` and `localhost` (librdkafka checks the host name
    /// by default) and its key.
    pub fn issue_server(&self) -> anyhow::Result<(X509, PKey<Private>)> {
        let key = new_key()?;
        let mut b = certificate("localhost", Some(self.cert.subject_name()), &key)?;
        b.append_extension(BasicConstraints::new().build()?)?;
        b.append_extension(
            KeyUsage::new()
                .critical()
                .digital_signature()
                .key_encipherment()
                .build()?,
        )?;
        b.append_extension(ExtendedKeyUsage::new().server_auth().build()?)?;
        let san = SubjectAlternativeName::new()
            .dns("localhost")
            .ip("127.0.0.1")
            .build(&b.x509v3_context(Some(&self.cert), None))?;
        b.append_extension(san)?;
        b.sign(&self.key, MessageDigest::sha256())?;
        Ok((b.build(), key))
    }
}

/// Terminates TLS on a local port and passes the plain bytes to `target`, on a runtime of its
/// own (so it serves whatever the test's threads are doing). Stops on drop.
pub struct TlsProxy {
    port: u16,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TlsProxy {
    /// Listens on `listener` (bound by the caller, so its port is known before the broker
    /// behind it starts) with `cert` and `key`, forwarding to `target` (`host:port`).
    pub fn start(
        listener: std::net::TcpListener,
        cert: &X509,
        key: &PKey<Private>,
        target: String,
    ) -> anyhow::Result<Self> {
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
        acceptor.set_private_key(key)?;
        acceptor.set_certificate(cert)?;
        acceptor.check_private_key()?;
        let acceptor = acceptor.build();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        runtime.spawn(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            while let Ok((client, _)) = listener.accept().await {
                let (ssl, target) = (Ssl::new(acceptor.context()), target.clone());
                tokio::spawn(async move {
                    let Ok(ssl) = ssl else { return };
                    let Ok(mut tls) = tokio_openssl::SslStream::new(ssl, client) else {
                        return;
                    };
                    // A client that does not trust the certificate ends here.
                    if Pin::new(&mut tls).accept().await.is_err() {
                        return;
                    }
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
                    }
                });
            }
        });
        Ok(Self {
            port,
            runtime: Some(runtime),
        })
    }

    /// The local port it accepts TLS connections on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        // Not a blocking shutdown: tests drop it inside their own runtime.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A SCRAM mechanism, as librdkafka's `sasl.mechanism` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scram {
    /// `SCRAM-SHA-256`.
    Sha256,
    /// `SCRAM-SHA-512`.
    Sha512,
}

impl Scram {
    /// As `sasl.mechanism` spells it.
    pub fn mechanism(self) -> &'static str {
        match self {
            Self::Sha256 => "SCRAM-SHA-256",
            Self::Sha512 => "SCRAM-SHA-512",
        }
    }

    fn native(self) -> rd::rd_kafka_ScramMechanism_t {
        match self {
            Self::Sha256 => rd::rd_kafka_ScramMechanism_t::RD_KAFKA_SCRAM_MECHANISM_SHA_256,
            Self::Sha512 => rd::rd_kafka_ScramMechanism_t::RD_KAFKA_SCRAM_MECHANISM_SHA_512,
        }
    }
}

/// What a broker demands of its clients.
#[derive(Debug, Clone, Copy, Default)]
pub struct Security {
    /// SASL (SCRAM) logins.
    pub sasl: bool,
    /// TLS connections.
    pub tls: bool,
}

/// How a client logs in: `sasl.mechanism`, `sasl.username`, `sasl.password`.
#[derive(Debug, Clone)]
pub struct Login {
    /// `sasl.mechanism`.
    pub mechanism: String,
    /// `sasl.username`.
    pub username: String,
    /// `sasl.password`.
    pub password: String,
}

impl Login {
    /// A login with `mechanism` (`SCRAM-SHA-512`, …), `username` and `password`.
    pub fn new(mechanism: &str, username: &str, password: &str) -> Self {
        Self {
            mechanism: mechanism.to_owned(),
            username: username.to_owned(),
            password: password.to_owned(),
        }
    }

    /// The administrator every SASL [`SecureBroker`] has (it makes topics and reads them).
    pub fn admin() -> Self {
        Self::new(Scram::Sha512.mechanism(), ADMIN, ADMIN_PASSWORD)
    }
}

const ADMIN: &str = "admin";
const ADMIN_PASSWORD: &str = "admin-secret";

/// A SCRAM user a SASL [`SecureBroker`] is started with.
#[derive(Debug, Clone, Copy)]
pub struct ScramUser<'a> {
    /// The user name.
    pub name: &'a str,
    /// The user's password.
    pub password: &'a str,
    /// The mechanism its credentials are stored for.
    pub mechanism: Scram,
}

/// A Tansu broker that demands [`Security`], killed (and its files removed) on drop.
pub struct SecureBroker {
    // Drop order: the proxy, then the broker, then its directory.
    proxy: Option<TlsProxy>,
    _tansu: OwnTansu,
    dir: tempfile::TempDir,
    security: Security,
    /// What clients connect to: the TLS proxy with TLS, else Tansu itself.
    pub bootstrap: String,
    /// The CA that signed the server certificate (with TLS).
    pub ca: Option<TestCa>,
}

impl SecureBroker {
    /// Starts the broker (and the proxy) with `users` (and [`Login::admin`]; with SASL) and
    /// waits until it answers the admin.
    pub async fn start(security: Security, users: &[ScramUser<'_>]) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = free_port();
        let (proxy, ca) = if security.tls {
            let ca = TestCa::new(dir.path(), "broker-ca").expect("test CA");
            let (cert, key) = ca.issue_server().expect("server certificate");
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy port");
            let proxy = TlsProxy::start(listener, &cert, &key, format!("127.0.0.1:{port}"))
                .expect("TLS proxy");
            (Some(proxy), Some(ca))
        } else {
            (None, None)
        };
        let advertised_port = proxy.as_ref().map(TlsProxy::port);
        // SCRAM credentials need a storage engine that keeps them (see the module docs).
        let storage = if security.sasl {
            "sqlite://tansu.db"
        } else {
            "memory://tansu/"
        };
        let extra_args: &[&str] = if security.sasl {
            make_users(port, dir.path(), users).await;
            &["--authentication"]
        } else {
            &[]
        };
        let tansu = OwnTansu::launch(&TansuLaunch {
            port,
            advertised_port,
            storage,
            extra_args,
            dir: Some(dir.path()),
        });
        let bootstrap = format!("127.0.0.1:{}", advertised_port.unwrap_or(port));
        let broker = Self {
            proxy,
            _tansu: tansu,
            dir,
            security,
            bootstrap,
            ca,
        };
        let up = wait_until(Duration::from_secs(60), || async {
            broker.metadata().is_ok()
        })
        .await;
        assert!(
            up,
            "secure broker ({security:?}) did not start: {:?}\ntansu log:\n{}",
            broker.metadata().err(),
            broker.tansu_log()
        );
        broker
    }

    /// What Tansu logged.
    pub fn tansu_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tansu.log")).unwrap_or_default()
    }

    /// The proxy's port, with TLS.
    pub fn proxy_port(&self) -> Option<u16> {
        self.proxy.as_ref().map(TlsProxy::port)
    }

    /// `security.protocol` for this broker.
    pub fn protocol(&self) -> &'static str {
        match (self.security.sasl, self.security.tls) {
            (false, false) => "PLAINTEXT",
            (true, false) => "SASL_PLAINTEXT",
            (false, true) => "SSL",
            (true, true) => "SASL_SSL",
        }
    }

    /// The librdkafka properties a client of this broker needs, logging in with `login` (with
    /// SASL) and trusting the test CA (with TLS).
    pub fn properties(&self, login: &Login) -> Vec<(&'static str, String)> {
        let mut props = vec![
            ("bootstrap.servers", self.bootstrap.clone()),
            ("security.protocol", self.protocol().to_owned()),
        ];
        if self.security.sasl {
            props.push(("sasl.mechanism", login.mechanism.clone()));
            props.push(("sasl.username", login.username.clone()));
            props.push(("sasl.password", login.password.clone()));
        }
        if let Some(ca) = &self.ca {
            props.push(("ssl.ca.location", ca.pem.display().to_string()));
        }
        props
    }

    /// A client configuration for this broker with `login`.
    pub fn client_config(&self, login: &Login) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (k, v) in self.properties(login) {
            config.set(k, v);
        }
        config
    }

    /// Creates topics as the admin.
    pub async fn create_topics(&self, topics: &[String]) -> anyhow::Result<()> {
        create_topics_with(&self.client_config(&Login::admin()), topics).await
    }

    /// A metadata request as an admin: whether the broker answers.
    fn metadata(&self) -> anyhow::Result<()> {
        let admin: AdminClient<DefaultClientContext> =
            self.client_config(&Login::admin()).create()?;
        admin
            .inner()
            .fetch_metadata(None, Duration::from_secs(5))
            .map(|_| ())
            .context("metadata")
    }

    /// Reads `topics` from the beginning as `login` until `expected` messages arrived (then
    /// `settle` more) or 60 s passed.
    pub fn consume(
        &self,
        login: &Login,
        topics: &[String],
        expected: usize,
        settle: Duration,
    ) -> anyhow::Result<Vec<Received>> {
        let mut config = self.client_config(login);
        config
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest");
        consume_until_with(config, topics, Duration::from_secs(60), settle, |got| {
            got.len() >= expected
        })
    }
}

/// Makes `users` and the admin in a broker's SQLite file in `dir`: starts it on `port`
/// without authentication, makes them through the admin API, and stops it.
async fn make_users(port: u16, dir: &Path, users: &[ScramUser<'_>]) {
    let tansu = OwnTansu::launch(&TansuLaunch {
        port,
        storage: "sqlite://tansu.db",
        dir: Some(dir),
        ..TansuLaunch::default()
    });
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", format!("127.0.0.1:{port}"));
    let admin = ScramUser {
        name: ADMIN,
        password: ADMIN_PASSWORD,
        mechanism: Scram::Sha512,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for user in users.iter().chain([&admin]) {
        // The first request also waits for the broker to listen.
        loop {
            let made = config
                .create::<AdminClient<DefaultClientContext>>()
                .map_err(anyhow::Error::from)
                .and_then(|client| {
                    tokio::task::block_in_place(|| {
                        alter_user_scram_credentials(
                            &client,
                            user.name,
                            user.password,
                            user.mechanism,
                        )
                    })
                });
            let log = std::fs::read_to_string(dir.join("tansu.log")).unwrap_or_default();
            match made {
                Ok(()) => break,
                Err(e) if std::time::Instant::now() > deadline || log.contains("Error") => {
                    panic!(
                        "cannot make SCRAM user {}: {e:#}\ntansu log:\n{log}\n(SASL brokers \
                         keep their users in SQLite: Tansu must be built with its `libsql` \
                         feature, as scripts/services.sh installs it)",
                        user.name
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    // SIGKILL: what the broker wrote is in SQLite's write-ahead log, read at the next start.
    drop(tansu);
}

/// The admin request AlterUserScramCredentials (an upsertion), which rust-rdkafka does not
/// wrap but librdkafka has: sent through `admin`'s librdkafka handle, its result awaited on a
/// queue of our own (up to 30 s).
fn alter_user_scram_credentials(
    admin: &AdminClient<DefaultClientContext>,
    username: &str,
    password: &str,
    mechanism: Scram,
) -> anyhow::Result<()> {
    /// Kafka's minimum (and librdkafka's check); the broker stores what the client derived.
    const ITERATIONS: i32 = 4096;
    const TIMEOUT_MS: i32 = 30_000;
    let user = CString::new(username)?;
    let rk = admin.inner().native_ptr();
    // SAFETY: `rk` is a live client handle for as long as `admin` is borrowed; every object
    // made here is destroyed here, after its last use; librdkafka copies the user name and
    // password into the alteration (no salt given: it makes a random one).
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        let options = rd::rd_kafka_AdminOptions_new(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_ALTERUSERSCRAMCREDENTIALS,
        );
        let mut alteration = rd::rd_kafka_UserScramCredentialUpsertion_new(
            user.as_ptr(),
            mechanism.native(),
            ITERATIONS,
            password.as_ptr(),
            password.len(),
            std::ptr::null(),
            0,
        );
        rd::rd_kafka_AlterUserScramCredentials(rk, &mut alteration, 1, options, queue);
        let event = rd::rd_kafka_queue_poll(queue, TIMEOUT_MS);
        let outcome = scram_result(event, username);
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_UserScramCredentialAlteration_destroy(alteration);
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_queue_destroy(queue);
        outcome
    }
}

/// The outcome an AlterUserScramCredentials result `event` reports for `username`.
///
/// # Safety
/// `event` is null or a live event from the request's queue.
unsafe fn scram_result(event: *mut rd::rd_kafka_event_t, username: &str) -> anyhow::Result<()> {
    let text = |p: *const std::os::raw::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: librdkafka's strings are NUL-terminated and live as long as the event.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    if event.is_null() {
        bail!("AlterUserScramCredentials for {username}: no answer in time");
    }
    // SAFETY: `event` is live (caller); the accessors only read it.
    unsafe {
        if rd::rd_kafka_event_error(event) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            bail!(
                "AlterUserScramCredentials for {username}: {}",
                text(rd::rd_kafka_event_error_string(event))
            );
        }
        let result = rd::rd_kafka_event_AlterUserScramCredentials_result(event);
        if result.is_null() {
            bail!("AlterUserScramCredentials for {username}: not its result event");
        }
        let mut count = 0usize;
        let responses = rd::rd_kafka_AlterUserScramCredentials_result_responses(result, &mut count);
        if count == 0 {
            bail!("AlterUserScramCredentials for {username}: no response");
        }
        for i in 0..count {
            let response = *responses.add(i);
            let error = rd::rd_kafka_AlterUserScramCredentials_result_response_error(response);
            if !error.is_null()
                && rd::rd_kafka_error_code(error)
                    != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                bail!(
                    "AlterUserScramCredentials for {}: {}",
                    text(rd::rd_kafka_AlterUserScramCredentials_result_response_user(
                        response
                    )),
                    text(rd::rd_kafka_error_string(error))
                );
            }
        }
    }
    Ok(())
}
