//! `[nats]`: where the NATS servers are, how Sluice authenticates (URL user and password, a
//! token, or a `.creds` file), TLS, how long a batch waits for JetStream's acknowledgements, and
//! the prefix of the `Nats-Msg-Id` that lets a stream drop duplicates. What is wrong with the
//! section on its own is [`NatsSettings::problems`].

use std::path::PathBuf;
use std::time::Duration;

use async_nats::ServerAddr;
use serde::Deserialize;

use crate::problem::Problem;
use crate::secret::{Secret, SecretUrl};
use crate::sink::tls_files::TlsFiles;

/// How long a batch waits for JetStream to acknowledge its messages before the unacknowledged
/// ones fail as unavailable (the rows are retried): Kafka's `message.timeout.ms` default in
/// Sluice, so both brokers hold a batch the same time.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// `[nats]`: a NATS server (or several of one cluster) with JetStream. (`Debug` shows no
/// credential: the URL's password is redacted and the token is a [`Secret`].)
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsSettings {
    /// `nats://host:4222` or `tls://host:4222`; several servers of one cluster separated by
    /// commas. `nats://user:password@host` authenticates with a user and password,
    /// `nats://token@host` with a token.
    pub url: SecretUrl,
    /// Token authentication (instead of credentials in the URL).
    #[serde(default)]
    pub token: Option<Secret>,
    /// A `.creds` file (a user JWT and its NKey seed, as `nsc` writes it): decentralised
    /// authentication.
    #[serde(default)]
    pub credentials_location: Option<PathBuf>,
    /// PEM file of the CA that signed the servers' certificates; set, only it is trusted
    /// (otherwise the system's roots are). Any TLS key makes the connection TLS.
    #[serde(default)]
    pub ca_location: Option<PathBuf>,
    /// PEM client certificate, for servers that verify clients (with `key_location`).
    #[serde(default)]
    pub certificate_location: Option<PathBuf>,
    /// PEM private key of `certificate_location`.
    #[serde(default)]
    pub key_location: Option<PathBuf>,
    /// How long a batch waits for JetStream's acknowledgements, e.g. `"30s"`.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Put before `{row}-{index}` in each message's `Nats-Msg-Id`, so ids of different outbox
    /// tables publishing to one stream do not collide.
    #[serde(default)]
    pub message_id_prefix: String,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

/// How a connection authenticates, read from the URL and the section's keys. (`Debug` shows
/// no password or token.)
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Credentials {
    None,
    UserPassword { user: String, password: String },
    Token(String),
    File(PathBuf),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &crate::secret::REDACTED)
                .finish(),
            Self::Token(_) => f
                .debug_tuple("Token")
                .field(&crate::secret::REDACTED)
                .finish(),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

impl NatsSettings {
    /// How long a batch waits for its acknowledgements.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Values that cannot work, each with its key (`nats.url`, `nats.ca_location`, …).
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Err(why) = self.servers() {
            problems.push(Problem::new("nats.url", why));
        }
        if let Err(problem) = self.credentials() {
            problems.push(problem);
        }
        if let Some(path) = &self.credentials_location
            && let Err(e) = std::fs::File::open(path)
        {
            problems.push(Problem::caused(
                "nats.credentials_location",
                format!("cannot read {}", path.display()),
                e,
            ));
        }
        // Any TLS file turns TLS on (`tls_required`), so none is out of place on a nats:// URL.
        problems.extend(self.tls_files().problems(None));
        if self.timeout.is_zero() {
            problems.push(Problem::new("nats.timeout", "must be above 0"));
        }
        if self.message_id_prefix.contains(['\r', '\n']) {
            problems.push(Problem::new(
                "nats.message_id_prefix",
                "a header value cannot hold a line break",
            ));
        }
        problems
    }

    /// The servers of `url`, credentials left out (they go in the CONNECT message: the client
    /// does not read them from the URL). Errors name what is wrong, never the password.
    pub(super) fn servers(&self) -> Result<Vec<ServerAddr>, String> {
        let written = self.url.expose();
        if written.trim().is_empty() {
            return Err("is empty".to_owned());
        }
        let mut servers = Vec::new();
        let mut first_userinfo: Option<(String, Option<String>)> = None;
        for (i, part) in written.split(',').map(str::trim).enumerate() {
            let place = i + 1;
            let addr: ServerAddr = part
                .parse()
                .map_err(|e| format!("server {place} of the list: {e}"))?;
            if addr.is_websocket() {
                return Err(format!(
                    "server {place} of the list: websocket URLs (ws://, wss://) are not \
                     supported; use nats:// or tls://"
                ));
            }
            let mut url = addr.into_inner();
            if url.host_str().is_none_or(str::is_empty) {
                return Err(format!("server {place} of the list names no host"));
            }
            let userinfo = (
                decode(url.username()),
                url.password().map(decode).filter(|p| !p.is_empty()),
            );
            let carries = !userinfo.0.is_empty();
            match &first_userinfo {
                None => first_userinfo = Some(userinfo),
                Some(first) if carries && *first != userinfo => {
                    return Err(
                        "every server of the list must carry the same credentials (or none \
                         but the first)"
                            .to_owned(),
                    );
                }
                Some(_) => {}
            }
            // Cannot fail for a URL with a host.
            let _ = url.set_username("");
            let _ = url.set_password(None);
            servers.push(ServerAddr::from_url(url).map_err(|e| e.to_string())?);
        }
        Ok(servers)
    }

    /// How to authenticate: at most one of the URL's userinfo, `token` and
    /// `credentials_location`.
    pub(super) fn credentials(&self) -> Result<Credentials, Problem> {
        let from_url = match self.servers() {
            Ok(_) => url_credentials(self.url.expose()),
            // Reported as `nats.url` already.
            Err(_) => Credentials::None,
        };
        let token = self
            .token
            .as_ref()
            .map(|t| Credentials::Token(t.expose().to_owned()));
        let file = self.credentials_location.clone().map(Credentials::File);
        let given: Vec<Credentials> = [
            Some(from_url).filter(|c| *c != Credentials::None),
            token,
            file,
        ]
        .into_iter()
        .flatten()
        .collect();
        match given.len() {
            0 => Ok(Credentials::None),
            1 => Ok(given.into_iter().next().unwrap_or(Credentials::None)),
            _ => Err(Problem::new(
                "nats.token",
                "give one way to authenticate: credentials in nats.url, nats.token or \
                 nats.credentials_location",
            )),
        }
    }

    /// Whether the connection must use TLS: a `tls://` URL or any TLS file.
    pub(super) fn tls_required(&self) -> bool {
        self.tls_files().any() || self.url.expose().trim_start().starts_with("tls://")
    }

    /// The section's TLS files (`nats.ca_location`, …).
    pub(super) fn tls_files(&self) -> TlsFiles<'_> {
        TlsFiles::new(
            "nats",
            &self.ca_location,
            &self.certificate_location,
            &self.key_location,
        )
    }
}

/// The credentials in the first server's URL: user and password, or a lone user name, which
/// NATS reads as a token (`nats://token@host`).
fn url_credentials(url: &str) -> Credentials {
    let Some(Ok(addr)) = url
        .split(',')
        .next()
        .map(|u| u.trim().parse::<ServerAddr>())
    else {
        return Credentials::None;
    };
    let user = addr.username().map(decode).unwrap_or_default();
    let password = addr.password().map(decode).unwrap_or_default();
    match (user.is_empty(), password.is_empty()) {
        (true, _) => Credentials::None,
        (false, true) => Credentials::Token(user),
        (false, false) => Credentials::UserPassword { user, password },
    }
}

/// A percent-encoded URL component, decoded (a password with `@` or `:` must be encoded).
fn decode(component: &str) -> String {
    percent_encoding::percent_decode_str(component)
        .decode_utf8_lossy()
        .into_owned()
}

/// The problem with a file the client must read, if it cannot be read.
#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> NatsSettings {
        toml::from_str(toml).unwrap_or_else(|e| panic!("{e}"))
    }

    fn keys(settings: &NatsSettings) -> Vec<String> {
        settings.problems().into_iter().map(|p| p.key).collect()
    }

    #[test]
    fn a_url_alone_is_enough_and_the_rest_has_defaults() {
        let s = parse(r#"url = "nats://127.0.0.1:4222""#);
        assert_eq!(s.timeout(), DEFAULT_TIMEOUT);
        assert_eq!(s.message_id_prefix, "");
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        assert_eq!(s.credentials().ok(), Some(Credentials::None));
        assert!(!s.tls_required());
        let s = parse("url = \"tls://a:4222, tls://b:4222\"\ntimeout = \"5s\"");
        assert_eq!(s.timeout(), Duration::from_secs(5));
        assert_eq!(s.servers().map(|v| v.len()), Ok(2));
        assert!(s.tls_required());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<NatsSettings>("url = \"nats://h\"\nsubject = \"x\"")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("subject"), "{err}");
    }

    #[test]
    fn credentials_come_from_the_url_the_token_or_a_file_and_only_one() {
        let s = parse(r#"url = "nats://app:S3cr%40t@h:4222""#);
        assert_eq!(
            s.credentials().ok(),
            Some(Credentials::UserPassword {
                user: "app".into(),
                password: "S3cr@t".into()
            })
        );
        let servers = s.servers().unwrap();
        assert_eq!(
            servers[0].username(),
            None,
            "credentials are not left in the URL"
        );
        assert_eq!(
            parse(r#"url = "nats://tok3n@h""#).credentials().ok(),
            Some(Credentials::Token("tok3n".into()))
        );
        assert_eq!(
            parse("url = \"nats://h\"\ntoken = \"t\"")
                .credentials()
                .ok(),
            Some(Credentials::Token("t".into()))
        );
        let both = parse("url = \"nats://u:p@h\"\ntoken = \"t\"");
        assert_eq!(keys(&both), ["nats.token"]);
        let mixed = parse(r#"url = "nats://u:p@a,nats://u:q@b""#);
        assert_eq!(keys(&mixed), ["nats.url"]);
        // Credentials on the first server only are the list's.
        assert!(
            parse(r#"url = "nats://u:p@a,nats://b""#)
                .problems()
                .is_empty()
        );
        assert_eq!(
            keys(&parse(r#"url = "nats://a,nats://u:p@b""#)),
            ["nats.url"]
        );
    }

    #[test]
    fn wrong_schemes_files_and_values_are_named_by_key() {
        let s = parse(
            r#"
            url = "http://h:4222"
            credentials_location = "/nonexistent/app.creds"
            ca_location = "/nonexistent/ca.pem"
            certificate_location = "/nonexistent/cert.pem"
            timeout = "0s"
            message_id_prefix = "a\nb"
            "#,
        );
        let mut found = keys(&s);
        found.sort();
        assert_eq!(
            found,
            [
                "nats.ca_location",
                "nats.certificate_location",
                "nats.credentials_location",
                "nats.key_location",
                "nats.message_id_prefix",
                "nats.timeout",
                "nats.url",
            ]
        );
        let url = s.problems().into_iter().find(|p| p.key == "nats.url");
        assert!(url.is_some_and(|p| p.message.contains("http")));
        assert_eq!(keys(&parse(r#"url = "  ""#)), ["nats.url"]);
        assert_eq!(keys(&parse(r#"url = "ws://h:80""#)), ["nats.url"]);
    }

    #[test]
    fn debug_never_shows_a_password_or_token() {
        let s = parse("url = \"nats://app:Nats-Pw-7741@h:4222\"\ntoken = \"Nats-Token-7742\"");
        let shown = format!("{s:?}");
        assert!(!shown.contains("Nats-Pw-7741"), "{shown}");
        assert!(!shown.contains("Nats-Token-7742"), "{shown}");
        assert!(shown.contains("h:4222"), "{shown}");
        let problems = format!("{:?}", s.problems());
        assert!(!problems.contains("Nats-Pw-7741") && !problems.contains("Nats-Token-7742"));
    }
}
