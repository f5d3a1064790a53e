//! Who may read `/metrics` and `/status`: anyone, the holder of a bearer token, or the holder
//! of a user name and password (HTTP basic auth). `/healthz` and `/readyz` stay open for
//! kubelet probes, which send no credentials. The server checks an `Authorization` header with
//! [`Access::allows`]; `sluice status` sends [`Access::authorization`].

use std::sync::RwLock;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::secret::{Secret, constant_time_eq};

/// The realm the `WWW-Authenticate` challenge names.
const REALM: &str = "sluice";

/// What `/metrics` and `/status` require.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Access {
    /// No credentials (the default): protect the port by network policy instead.
    #[default]
    Open,
    /// `Authorization: Bearer <token>`.
    Bearer(Secret),
    /// `Authorization: Basic <base64(username:password)>`.
    Basic { username: String, password: Secret },
}

impl Access {
    /// Whether a request with this `Authorization` header value may read a protected endpoint.
    /// Credentials are compared in constant time.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        let given = authorization.and_then(|h| std::str::from_utf8(h).ok());
        match self {
            Self::Open => true,
            Self::Bearer(token) => given
                .and_then(|h| credentials(h, "Bearer"))
                .is_some_and(|t| token.matches(t.as_bytes())),
            Self::Basic { username, password } => {
                let Some(decoded) = given
                    .and_then(|h| credentials(h, "Basic"))
                    .and_then(|c| BASE64.decode(c).ok())
                else {
                    return false;
                };
                // RFC 7617: the user-id cannot contain a colon; the password may.
                let (user, pass) = match decoded.iter().position(|&b| b == b':') {
                    Some(at) => (&decoded[..at], &decoded[at + 1..]),
                    None => return false,
                };
                // Both compared, whichever differs: the time says nothing about which.
                let user_ok = constant_time_eq(user, username.as_bytes());
                let pass_ok = password.matches(pass);
                user_ok & pass_ok
            }
        }
    }

    /// The `WWW-Authenticate` challenge of a 401, `None` when nothing is required.
    pub fn challenge(&self) -> Option<String> {
        match self {
            Self::Open => None,
            Self::Bearer(_) => Some(format!("Bearer realm=\"{REALM}\"")),
            Self::Basic { .. } => Some(format!("Basic realm=\"{REALM}\"")),
        }
    }

    /// The `Authorization` header value a client sends, `None` when nothing is required.
    pub fn authorization(&self) -> Option<Secret> {
        match self {
            Self::Open => None,
            Self::Bearer(token) => Some(Secret::new(format!("Bearer {}", token.expose()))),
            Self::Basic { username, password } => Some(Secret::new(format!(
                "Basic {}",
                BASE64.encode(format!("{username}:{}", password.expose()))
            ))),
        }
    }

    /// How access is controlled, for the start-up log (never the credentials).
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Bearer(_) => "bearer token",
            Self::Basic { .. } => "basic auth",
        }
    }
}

/// The [`Access`] in force, shared by the server and SIGHUP's re-read of the config, so rotated
/// credentials take effect without a restart.
#[derive(Debug, Default)]
pub(crate) struct SharedAccess(RwLock<Access>);

impl SharedAccess {
    pub(crate) fn new(access: Access) -> Self {
        Self(RwLock::new(access))
    }

    /// The access in force now.
    pub(crate) fn current(&self) -> Access {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the access for the requests that follow.
    pub(crate) fn set(&self, access: Access) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = access;
    }
}

/// The credentials of an `Authorization` header value of `scheme` (matched without regard to
/// case, as RFC 9110 says).
fn credentials<'h>(header: &'h str, scheme: &str) -> Option<&'h str> {
    let (given, rest) = header.trim().split_once(' ')?;
    given
        .eq_ignore_ascii_case(scheme)
        .then(|| rest.trim())
        .filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer() -> Access {
        Access::Bearer(Secret::new("s3cret-token"))
    }

    fn basic() -> Access {
        Access::Basic {
            username: "prometheus".into(),
            password: Secret::new("pa:ss word"),
        }
    }

    fn basic_header(user_pass: &str) -> String {
        format!("Basic {}", BASE64.encode(user_pass))
    }

    #[test]
    fn open_access_needs_nothing() {
        assert!(Access::Open.allows(None));
        assert_eq!(Access::Open.challenge(), None);
        assert_eq!(Access::Open.authorization(), None);
    }

    #[test]
    fn a_bearer_token_must_match_exactly() {
        let access = bearer();
        assert!(access.allows(Some(b"Bearer s3cret-token")));
        assert!(access.allows(Some(b"bearer s3cret-token")), "scheme case");
        assert!(!access.allows(None));
        assert!(!access.allows(Some(b"Bearer s3cret-toke")));
        assert!(!access.allows(Some(b"Bearer s3cret-token2")));
        assert!(!access.allows(Some(b"Bearer ")));
        assert!(!access.allows(Some(b"s3cret-token")));
        assert!(!access.allows(Some(basic_header("x:s3cret-token").as_bytes())));
        assert_eq!(
            access.challenge().as_deref(),
            Some("Bearer realm=\"sluice\"")
        );
    }

    #[test]
    fn basic_auth_needs_both_the_user_and_the_password() {
        let access = basic();
        assert!(access.allows(Some(basic_header("prometheus:pa:ss word").as_bytes())));
        assert!(!access.allows(Some(basic_header("prometheus:pa:ss").as_bytes())));
        assert!(!access.allows(Some(basic_header("grafana:pa:ss word").as_bytes())));
        assert!(!access.allows(Some(basic_header("prometheus").as_bytes())));
        assert!(!access.allows(Some(b"Basic not-base64!")));
        assert!(!access.allows(Some(b"Bearer pa:ss word")));
        assert!(!access.allows(None));
        assert_eq!(
            access.challenge().as_deref(),
            Some("Basic realm=\"sluice\"")
        );
    }

    #[test]
    fn what_a_client_sends_is_what_the_server_allows() {
        for access in [bearer(), basic()] {
            let header = access.authorization().expect("credentials");
            assert!(
                access.allows(Some(header.expose().as_bytes())),
                "{access:?}"
            );
        }
    }

    #[test]
    fn debug_never_shows_a_credential() {
        for access in [bearer(), basic()] {
            let shown = format!("{access:?} {:?}", access.authorization());
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(!shown.contains("pa:ss"), "{shown}");
            assert!(
                !shown.contains("cHJvbWV0aGV1cz"),
                "base64 of the user: {shown}"
            );
            assert!(shown.contains("[redacted]"), "{shown}");
        }
    }
}
