//! `[rabbitmq]`: where the RabbitMQ broker is (an `amqp://` or `amqps://` URL with the
//! credentials and the vhost), which exchange messages are published to, TLS files, and the
//! limits a batch keeps to; what is wrong with it on its own.

use std::path::PathBuf;
use std::time::Duration;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use serde::Deserialize;

use crate::problem::Problem;
use crate::secret::SecretUrl;
use crate::sink::tls_files::TlsFiles;

/// How long a batch waits for the broker's confirmations before its unconfirmed messages fail
/// as unavailable (the rows are retried): as long as Kafka's `message.timeout.ms` default.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest message body Sluice sends: RabbitMQ 4's own default `max_message_size`
/// (16 MiB). A larger body fails as the tenant's fault before it is sent; a broker that
/// refuses it itself would close the channel, failing the whole batch.
pub(crate) const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The longest name AMQP 0-9-1 allows for an exchange, a routing key, a header or a message
/// id (a `shortstr`).
pub(crate) const MAX_SHORT_STRING: usize = 255;

/// `[rabbitmq]`: one broker (one vhost), one exchange every tenant routed to RabbitMQ
/// publishes to; a message's `topic` is its routing key. (`Debug` shows the URL without its
/// password: it is a [`SecretUrl`].)
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RabbitmqSettings {
    /// `amqp://user:password@host:5672/vhost` (`amqps://` for TLS; the vhost percent-encoded,
    /// `%2f` for `/`, the default when the path is empty). `${file:…}`/`${env:…}` keep the
    /// password out of the file.
    pub url: SecretUrl,
    /// The exchange messages are published to. Empty (the default) is the default exchange,
    /// where a routing key is a queue's name.
    #[serde(default)]
    pub exchange: String,
    /// How long a batch waits for the broker to confirm its messages (and a connection to be
    /// made) before the unconfirmed ones fail as unavailable, e.g. `"30s"`.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// PEM file of the CA that signed the broker's certificate (`amqps://`), trusted in
    /// addition to the system's.
    #[serde(default)]
    pub ca_location: Option<PathBuf>,
    /// PEM file of the client certificate (`amqps://`, with `key_location`).
    #[serde(default)]
    pub certificate_location: Option<PathBuf>,
    /// PEM file of the client certificate's private key, PKCS#8 and unencrypted (with
    /// `certificate_location`).
    #[serde(default)]
    pub key_location: Option<PathBuf>,
    /// The largest message body sent; a larger one fails as the tenant's fault. Keep it at or
    /// below the broker's `max_message_size`.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Put before `{row}-{index}` in every message's `message_id` (consumers de-duplicate on
    /// it).
    #[serde(default)]
    pub message_id_prefix: String,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

fn default_max_message_bytes() -> usize {
    DEFAULT_MAX_MESSAGE_BYTES
}

/// What a connection is made from, read and checked from [`RabbitmqSettings`]: the parsed
/// URL and the TLS files' contents.
#[derive(Clone)]
pub(super) struct Endpoint {
    pub uri: AMQPUri,
    pub tls: OwnedTLSConfig,
}

impl RabbitmqSettings {
    /// How long a batch waits for confirmations.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Values that cannot work, each with its key.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let uri = match parse_url(self.url.expose()) {
            Ok(uri) => Some(uri),
            Err(why) => {
                problems.push(Problem::new("rabbitmq.url", why));
                None
            }
        };
        if self.exchange.len() > MAX_SHORT_STRING {
            problems.push(Problem::new(
                "rabbitmq.exchange",
                format!("longer than {MAX_SHORT_STRING} bytes"),
            ));
        }
        if self.timeout.is_zero() {
            problems.push(Problem::new("rabbitmq.timeout", "must be above 0"));
        }
        if self.max_message_bytes == 0 {
            problems.push(Problem::new(
                "rabbitmq.max_message_bytes",
                "must be above 0",
            ));
        }
        // The prefix, a row id and an index must fit a message id.
        if self.message_id_prefix.len() > MAX_SHORT_STRING / 2 {
            problems.push(Problem::new(
                "rabbitmq.message_id_prefix",
                format!(
                    "longer than {} bytes (a message id is at most {MAX_SHORT_STRING})",
                    MAX_SHORT_STRING / 2
                ),
            ));
        }
        problems.extend(self.tls_problems(uri.as_ref()));
        problems
    }

    /// TLS files that cannot be read, or that are given without `amqps://` or without their
    /// other half.
    fn tls_problems(&self, uri: Option<&AMQPUri>) -> Vec<Problem> {
        let plain = uri.is_some_and(|uri| uri.scheme != AMQPScheme::AMQPS);
        self.tls_files()
            .problems(plain.then_some("is only used with TLS: make the url amqps://"))
    }

    /// The section's TLS files (`rabbitmq.ca_location`, …).
    fn tls_files(&self) -> TlsFiles<'_> {
        TlsFiles::new(
            "rabbitmq",
            &self.ca_location,
            &self.certificate_location,
            &self.key_location,
        )
    }

    /// The URL parsed and the TLS files read; `Err` says which key is wrong and why.
    pub(super) fn endpoint(&self) -> Result<Endpoint, String> {
        if let Some(problem) = self.problems().into_iter().next() {
            return Err(problem.to_string());
        }
        let uri = parse_url(self.url.expose()).map_err(|why| format!("rabbitmq.url: {why}"))?;
        let pem = self.tls_files().read()?;
        let ca = pem
            .ca
            .map(|ca| String::from_utf8(ca).map_err(|_| "rabbitmq.ca_location: not UTF-8 text"))
            .transpose()?;
        Ok(Endpoint {
            uri,
            tls: OwnedTLSConfig {
                identity: pem
                    .client
                    .map(|(pem, key)| OwnedIdentity::PKCS8 { pem, key }),
                cert_chain: ca,
            },
        })
    }
}

/// An `amqp://` or `amqps://` URL, parsed as lapin's [`AMQPUri`] (vhost, `heartbeat`,
/// `frame_max`, `channel_max`, `connection_timeout`, `auth_mechanism` query parameters).
/// Errors never quote the URL (it may hold a password).
pub(super) fn parse_url(url: &str) -> Result<AMQPUri, String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "amqp" | "amqps") {
        return Err(format!("scheme {:?} is not amqp or amqps", parsed.scheme()));
    }
    let host = match parsed.host() {
        Some(url::Host::Domain(name)) => percent_encoding::percent_decode_str(name)
            .decode_utf8()
            .map_err(|_| "the host is not UTF-8 once percent-decoded".to_owned())?
            .into_owned(),
        // Without brackets: the host is resolved together with the port.
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return Err("names no host".to_owned()),
    };
    let mut uri: AMQPUri = url
        .parse()
        .map_err(|e: String| format!("not an AMQP URL ({})", crate::secret::redact_url(&e)))?;
    // amq-protocol-uri takes the host from `Url::domain`, which is empty for an IP address,
    // and then falls back to "localhost": `amqp://10.0.0.5` would connect to this machine.
    uri.authority.host = host;
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> RabbitmqSettings {
        toml::from_str(toml).unwrap()
    }

    fn keys(settings: &RabbitmqSettings) -> Vec<String> {
        settings.problems().into_iter().map(|p| p.key).collect()
    }

    #[test]
    fn only_the_url_is_required_and_defaults_are_documented_values() {
        let s = parse("url = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n");
        assert_eq!(s.exchange, "");
        assert_eq!(s.timeout(), Duration::from_secs(30));
        assert_eq!(s.max_message_bytes, 16 * 1024 * 1024);
        assert_eq!(s.message_id_prefix, "");
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        let e = s.endpoint().unwrap();
        assert_eq!(e.uri.vhost, "/");
        assert_eq!(e.uri.authority.host, "127.0.0.1");
        assert_eq!(e.uri.authority.port, 5672);
        assert_eq!(e.tls, OwnedTLSConfig::default());
    }

    #[test]
    fn every_key_parses() {
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("ca.pem");
        std::fs::write(
            &pem,
            "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let key = dir.path().join("client.key");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let s = parse(&format!(
            "url = \"amqps://app:pw@mq.example:5671/orders?heartbeat=10\"\n\
             exchange = \"outbox\"\ntimeout = \"5s\"\nca_location = {pem:?}\n\
             certificate_location = {pem:?}\nkey_location = {key:?}\n\
             max_message_bytes = 1024\nmessage_id_prefix = \"shop-\"\n"
        ));
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        assert_eq!(s.timeout(), Duration::from_secs(5));
        let e = s.endpoint().unwrap();
        assert_eq!(e.uri.vhost, "orders");
        assert_eq!(e.uri.query.heartbeat, Some(10));
        assert!(e.tls.cert_chain.is_some() && e.tls.identity.is_some());
        assert!(
            toml::from_str::<RabbitmqSettings>("url = \"amqp://h\"\nexchnage = \"x\"").is_err()
        );
    }

    /// amq-protocol-uri alone would connect to "localhost" for any IP address.
    #[test]
    fn an_ip_address_is_the_host_connected_to() {
        assert_eq!(
            parse_url("amqp://u:p@10.1.2.3:5673/v")
                .unwrap()
                .authority
                .host,
            "10.1.2.3"
        );
        assert_eq!(
            parse_url("amqp://[::1]:5673/v").unwrap().authority.host,
            "::1"
        );
        assert_eq!(
            parse_url("amqps://mq.example").unwrap().authority.port,
            5671
        );
    }

    #[test]
    fn problems_name_their_key() {
        let s = parse(
            "url = \"http://guest:guest@h/\"\nexchange = \"\"\ntimeout = \"0s\"\n\
             max_message_bytes = 0\n",
        );
        assert_eq!(
            keys(&s),
            [
                "rabbitmq.url",
                "rabbitmq.timeout",
                "rabbitmq.max_message_bytes"
            ]
        );
        assert!(
            s.problems()[0].message.contains("\"http\""),
            "{:?}",
            s.problems()
        );
        let s = parse(&format!(
            "url = \"amqp://h\"\nexchange = \"{}\"\nmessage_id_prefix = \"{}\"\n",
            "x".repeat(256),
            "p".repeat(200)
        ));
        assert_eq!(
            keys(&s),
            ["rabbitmq.exchange", "rabbitmq.message_id_prefix"]
        );
        assert!(parse("url = \"not a url\"").endpoint().is_err());
    }

    #[test]
    fn tls_files_must_be_readable_pem_and_used_with_amqps() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("plain.txt");
        std::fs::write(&text, "hello").unwrap();
        let s = parse(&format!(
            "url = \"amqp://h\"\nca_location = \"/no/such/ca.pem\"\n\
             certificate_location = {text:?}\n"
        ));
        let problems = s.problems();
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            keys(&s),
            [
                "rabbitmq.ca_location",
                "rabbitmq.ca_location",
                "rabbitmq.certificate_location",
                "rabbitmq.certificate_location",
                "rabbitmq.key_location",
            ],
            "{shown:#?}"
        );
        assert!(
            shown[0].contains("cannot read /no/such/ca.pem"),
            "{shown:?}"
        );
        assert!(shown[1].contains("amqps://"), "{shown:?}");
        assert!(shown[2].contains("holds no PEM certificate"), "{shown:?}");
        assert!(shown[4].contains("needs the private key"), "{shown:?}");
        let err = s.endpoint().err().unwrap();
        assert!(err.starts_with("rabbitmq.ca_location"), "{err}");
    }

    #[test]
    fn debug_and_problems_never_show_the_password() {
        let s = parse("url = \"amqp://app:Rabbit-Pw-8812@mq:5672/%2f\"\ntimeout = \"0s\"\n");
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("Rabbit-Pw-8812") && shown.contains("mq:5672"),
            "{shown}"
        );
        let bad = parse("url = \"amqpx://app:Rabbit-Pw-8812@mq:5672/%2f\"\n");
        for text in bad.problems().iter().map(ToString::to_string) {
            assert!(!text.contains("Rabbit-Pw-8812"), "{text}");
        }
        assert!(!bad.endpoint().err().unwrap().contains("Rabbit-Pw-8812"));
    }
}
