//! `[redis]`: which Redis server the Redis Streams sink publishes to, how long a batch waits,
//! and how entries are written (streams created or not, trimmed or not, replicated or not).
// Public for `Config`, which is to hold a `RedisSettings` (issue #41); until it does, nothing
// outside the crate can reach them.

use std::path::PathBuf;
use std::time::Duration;

use ::redis::{ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use serde::Deserialize;

use crate::problem::Problem;
use crate::secret::SecretUrl;
use crate::sink::tls_files::TlsFiles;

/// How long a batch waits for its replies before the messages not yet confirmed fail as
/// unavailable: long enough for a large pipeline (and a `WAIT`) on a busy server, short enough
/// that an unanswering server does not hold the relay's batch for minutes.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest entry (its field names and values together) the sink sends: Redis itself takes
/// values up to 512 MB (`proto-max-bulk-len`), far more than a stream consumer expects, and a
/// few huge entries would stall every batch behind them on the one connection.
pub(crate) const DEFAULT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// `[redis]`: the Redis server the `broker = "redis"` tenants publish to, one stream entry per
/// message (`XADD`), the message's topic being the stream key. (`Debug` shows the URL without
/// its password: [`SecretUrl`].)
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://[user][:password]@host[:port][/db]`, or `rediss://…` for TLS (a `#insecure`
    /// fragment turns certificate checks off). Credentials may come through `${file:…}` or
    /// `${env:…}`.
    pub url: SecretUrl,
    /// How long a batch waits for Redis to confirm its entries; the ones not confirmed by then
    /// fail as unavailable (the rows wait and are published again). Also the longest a
    /// connection attempt may take.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// PEM file of the CA certificates that sign the server's certificate (`rediss://`). It
    /// replaces the system's trust store for this connection, it does not add to it.
    #[serde(default)]
    pub ca_location: Option<PathBuf>,
    /// PEM file of the client certificate, for servers that check clients
    /// (`tls-auth-clients yes`); with `key_location`.
    #[serde(default)]
    pub certificate_location: Option<PathBuf>,
    /// PEM file of the client certificate's private key, in PKCS#8 form (`BEGIN PRIVATE
    /// KEY`); with `certificate_location`.
    #[serde(default)]
    pub key_location: Option<PathBuf>,
    /// Largest entry sent, field names and values together; a larger message fails as the
    /// tenant's fault without being sent.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Whether a message to a stream that does not exist creates it (`XADD`). With `false`
    /// (`XADD NOMKSTREAM`) such a message fails as the tenant's fault, as a missing Kafka
    /// topic does: streams are then made by their consumers (`XGROUP CREATE … MKSTREAM`).
    #[serde(default = "default_create_streams")]
    pub create_streams: bool,
    /// Keep each stream to about this many entries (`XADD … MAXLEN ~ n`): older entries are
    /// trimmed as new ones arrive, whether or not a consumer read them. Unset: never trimmed.
    #[serde(default)]
    pub maxlen: Option<u64>,
    /// After each batch, wait until this many replicas have the batch's entries (`WAIT n`);
    /// fewer within `timeout` fails the batch as unavailable (its entries are on the primary
    /// already, so publishing again duplicates them). Unset: confirmed once the primary has
    /// them, which a failover right after can lose.
    #[serde(default)]
    pub wait_replicas: Option<u32>,
    /// Put before `{row}-{index}` in each entry's `sluice-message-id` field, the id a consumer
    /// de-duplicates by (Redis keeps no ids of its own to absorb a duplicate).
    #[serde(default)]
    pub message_id_prefix: String,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

fn default_max_message_bytes() -> usize {
    DEFAULT_MAX_MESSAGE_BYTES
}

fn default_create_streams() -> bool {
    true
}

/// The URL schemes the sink speaks: plain TCP and TLS. (redis-rs also reads `unix://`,
/// `valkey://`, …; the documented two are the ones the sink is tested with.)
const SCHEMES: [&str; 2] = ["redis", "rediss"];

impl RedisSettings {
    /// Settings for `url` with every other key at its default.
    pub fn new(url: SecretUrl) -> Self {
        Self {
            url,
            timeout: DEFAULT_TIMEOUT,
            ca_location: None,
            certificate_location: None,
            key_location: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            create_streams: true,
            maxlen: None,
            wait_replicas: None,
            message_id_prefix: String::new(),
        }
    }

    /// How long a batch waits for its confirmations.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Values that cannot work, each at its key (`redis.url`, `redis.ca_location`, …).
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let tls = match connection_info(&self.url) {
            Ok(info) => Some(matches!(info.addr(), ConnectionAddr::TcpTls { .. })),
            Err(why) => {
                problems.push(Problem::new("redis.url", why));
                None
            }
        };
        problems.extend(
            self.tls_files().problems(
                (tls == Some(false))
                    .then_some("TLS files need a rediss:// URL (redis:// connects without TLS)"),
            ),
        );
        if self.timeout.is_zero() {
            problems.push(Problem::new("redis.timeout", "must be above 0"));
        }
        if self.max_message_bytes == 0 {
            problems.push(Problem::new("redis.max_message_bytes", "must be above 0"));
        }
        if self.maxlen == Some(0) {
            problems.push(Problem::new(
                "redis.maxlen",
                "must be above 0 (0 would trim every entry away); leave it out not to trim",
            ));
        }
        if self.wait_replicas == Some(0) {
            problems.push(Problem::new(
                "redis.wait_replicas",
                "must be above 0; leave it out not to wait for replicas",
            ));
        }
        problems
    }

    /// The section's TLS files (`redis.ca_location`, …).
    fn tls_files(&self) -> TlsFiles<'_> {
        TlsFiles::new(
            "redis",
            &self.ca_location,
            &self.certificate_location,
            &self.key_location,
        )
    }

    /// The redis-rs client for these settings (no connection yet): the URL, the TLS files,
    /// the socket options. Errors say what is wrong, naming the key.
    pub(super) fn client(&self) -> Result<::redis::Client, String> {
        let info = connection_info(&self.url)?.set_tcp_settings(tcp_settings(self.timeout));
        let pem = self.tls_files().read()?;
        let root_cert = pem.ca;
        let client_tls = pem.client.map(|(client_cert, client_key)| ClientTlsConfig {
            client_cert,
            client_key,
        });
        if root_cert.is_none() && client_tls.is_none() {
            return ::redis::Client::open(info).map_err(|e| format!("redis.url: {e}"));
        }
        if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
            return Err("redis.url: TLS files need a rediss:// URL".to_owned());
        }
        ::redis::Client::build_with_tls(
            info,
            ::redis::TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        .map_err(|e| {
            format!("redis TLS files (ca_location, certificate_location, key_location): {e}")
        })
    }
}

/// The URL read by redis-rs, after checking its scheme. Errors never quote the URL (it may
/// hold a password).
fn connection_info(url: &SecretUrl) -> Result<ConnectionInfo, String> {
    let text = url.expose();
    let scheme = text.split_once("://").map(|(scheme, _)| scheme);
    match scheme {
        Some(scheme) if SCHEMES.contains(&scheme) => {}
        Some(scheme) => {
            return Err(format!(
                "scheme {scheme:?} is not redis or rediss (redis://host:port/db)"
            ));
        }
        None => return Err("not a URL: redis://host:port/db or rediss://… expected".to_owned()),
    }
    text.into_connection_info()
        .map_err(|e| format!("not a Redis URL: {e}"))
}

/// Socket options: no Nagle delay (a batch is one write, its reply awaited at once), and a
/// connection whose sent bytes go unacknowledged for a whole `timeout` (a peer gone without a
/// reset) or that stays silent through keepalive probes is dropped, so the next batch
/// reconnects instead of waiting on a dead socket.
fn tcp_settings(timeout: Duration) -> ::redis::io::tcp::TcpSettings {
    use ::redis::io::tcp::socket2::TcpKeepalive;
    let keepalive = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL);
    let settings = ::redis::io::tcp::TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive);
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(timeout.max(MIN_USER_TIMEOUT));
    #[cfg(not(target_os = "linux"))]
    let _ = timeout;
    settings
}

/// Idle time before the first keepalive probe, and between probes.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
#[cfg(target_os = "linux")]
/// A floor for `TCP_USER_TIMEOUT`: a short `timeout` in a test must not make a briefly slow
/// network drop connections.
const MIN_USER_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> RedisSettings {
        toml::from_str(text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn keys(settings: &RedisSettings) -> Vec<String> {
        settings.problems().into_iter().map(|p| p.key).collect()
    }

    #[test]
    fn a_url_alone_takes_every_default() {
        let s = parse("url = \"redis://127.0.0.1:6379/2\"");
        assert_eq!(
            s,
            RedisSettings::new(SecretUrl::read("redis://127.0.0.1:6379/2".into()))
        );
        assert_eq!(s.timeout(), DEFAULT_TIMEOUT);
        assert_eq!(s.max_message_bytes, 1024 * 1024);
        assert!(s.create_streams);
        assert_eq!((s.maxlen, s.wait_replicas), (None, None));
        assert_eq!(s.message_id_prefix, "");
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        let info = connection_info(&s.url).unwrap();
        assert_eq!(info.redis_settings().db(), 2, "the db number is the path");
    }

    #[test]
    fn every_key_is_read() {
        let s = parse(
            "url = \"rediss://app:pw@cache:6380/0\"\ntimeout = \"5s\"\n\
             max_message_bytes = 4096\ncreate_streams = false\nmaxlen = 1000\n\
             wait_replicas = 1\nmessage_id_prefix = \"orders-\"\n",
        );
        assert_eq!(s.timeout(), Duration::from_secs(5));
        assert_eq!(s.max_message_bytes, 4096);
        assert!(!s.create_streams);
        assert_eq!((s.maxlen, s.wait_replicas), (Some(1000), Some(1)));
        assert_eq!(s.message_id_prefix, "orders-");
        assert!(s.problems().is_empty(), "{:?}", s.problems());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<RedisSettings>("url = \"redis://h\"\nmax_len = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_len"), "{err}");
    }

    #[test]
    fn debug_never_shows_the_password() {
        let s = parse("url = \"redis://app:Redis-Pw-6612@cache:6379/1\"");
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("Redis-Pw-6612") && shown.contains("cache:6379/1"),
            "{shown}"
        );
        assert_eq!(s.url.expose(), "redis://app:Redis-Pw-6612@cache:6379/1");
    }

    #[test]
    fn a_wrong_scheme_or_a_bad_url_is_named_without_its_password() {
        for (url, says) in [
            (
                "http://u:Never-Shown-1@h:6379",
                "\"http\" is not redis or rediss",
            ),
            ("cache:6379", "not a URL"),
            (
                "redis://u:Never-Shown-1@h:6379/notadb",
                "Invalid database number",
            ),
        ] {
            let s = parse(&format!("url = \"{url}\""));
            let problems = s.problems();
            assert_eq!(problems.len(), 1, "{url}: {problems:?}");
            let text = problems[0].to_string();
            assert!(
                text.starts_with("redis.url: ") && text.contains(says),
                "{text}"
            );
            assert!(!text.contains("Never-Shown-1"), "{text}");
            let err = s.client().unwrap_err();
            assert!(!err.contains("Never-Shown-1"), "{err}");
        }
    }

    #[test]
    fn zero_values_are_problems_at_their_keys() {
        let s = parse(
            "url = \"redis://h\"\ntimeout = \"0s\"\nmax_message_bytes = 0\nmaxlen = 0\n\
             wait_replicas = 0\n",
        );
        assert_eq!(
            keys(&s),
            [
                "redis.timeout",
                "redis.max_message_bytes",
                "redis.maxlen",
                "redis.wait_replicas"
            ]
        );
    }

    #[test]
    fn tls_files_must_be_readable_paired_and_used_with_rediss() {
        let s = parse(
            "url = \"rediss://h\"\nca_location = \"/nonexistent/ca.pem\"\n\
             certificate_location = \"/nonexistent/client.pem\"\n",
        );
        let problems = s.problems();
        assert_eq!(
            keys(&s),
            [
                "redis.ca_location",
                "redis.certificate_location",
                "redis.key_location"
            ]
        );
        assert!(
            problems[0]
                .to_string()
                .contains("cannot read /nonexistent/ca.pem"),
            "{}",
            problems[0]
        );
        assert!(s.client().unwrap_err().contains("redis.ca_location"));

        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let plain = parse(&format!(
            "url = \"redis://h\"\nca_location = \"{}\"\n",
            ca.display()
        ));
        assert_eq!(keys(&plain), ["redis.ca_location"]);
        assert!(plain.problems()[0].to_string().contains("rediss://"));
        let tls = parse(&format!(
            "url = \"rediss://h\"\nca_location = \"{}\"\n",
            ca.display()
        ));
        assert!(tls.problems().is_empty());
        // A PEM block that is no certificate: the client cannot be built, and says which files.
        let err = tls.client().unwrap_err();
        assert!(err.contains("ca_location"), "{err}");
        // Not PEM at all: named before any connection.
        std::fs::write(&ca, "not a certificate").unwrap();
        let problems = tls.problems();
        assert_eq!(keys(&tls), ["redis.ca_location"]);
        assert!(problems[0].to_string().contains("holds no PEM certificate"));
    }
}
