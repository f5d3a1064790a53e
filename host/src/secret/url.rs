//! Passwords inside URLs (`scheme://user:password@host…`, `?password=…`): where they are, so
//! they can be registered as secrets ([`url_passwords`]) and hidden in messages
//! ([`redact_url`]); [`SecretUrl`], a URL that may hold one.

use std::fmt;

use serde::{Deserialize, Deserializer};

use super::key::is_secret_key;
use super::scrub;
use super::value::Secret;

/// A URL that may carry a password (`database.url`): a [`Secret`] whose `Debug` and `Display`
/// show the URL with its passwords redacted ([`redact_url`]), and whose passwords are
/// registered with the scrubber when it is read ([`SecretUrl::read`], deserialising).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(Secret);

impl SecretUrl {
    /// `url` read from the configuration or the environment: its passwords are registered
    /// with the scrubber.
    pub fn read(url: String) -> Self {
        scrub::register(url_passwords(&url));
        Self(Secret::new(url))
    }

    /// The whole URL, for the one place that connects with it.
    pub fn expose(&self) -> &str {
        self.0.expose()
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact_url(self.expose()))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(self.expose()))
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::read)
    }
}

/// Where the password of a `scheme://user:password@host…` URL is, as a byte range: from the
/// userinfo's first `:` to the URL's last `@`. A password written without percent-encoding may
/// hold `@`, `/`, `?` or `#`, which makes the URL ambiguous; this reading hides the most.
pub fn url_password_range(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find("://")? + 3;
    let at = url[start..].rfind('@')? + start;
    let colon = url[start..at].find(':')? + start;
    Some(colon + 1..at)
}

/// The passwords a URL may hold, as written in it: the userinfo's password read both the
/// widest way ([`url_password_range`]) and the strict way (up to the last `@` before the
/// path, query or fragment), and the values of secret-like query parameters
/// (`?password=…`, `sslpassword=…`).
pub fn url_passwords(url: &str) -> Vec<&str> {
    let mut found = Vec::new();
    if let Some(range) = url_password_range(url) {
        found.push(&url[range]);
    }
    if let Some(start) = url.find("://").map(|i| i + 3) {
        let end = url[start..]
            .find(['/', '?', '#'])
            .map_or(url.len(), |i| start + i);
        if let Some(at) = url[start..end].rfind('@').map(|i| start + i)
            && let Some(colon) = url[start..at].find(':').map(|i| start + i)
        {
            found.push(&url[colon + 1..at]);
        }
    }
    found.extend(url_query_secrets(url).into_iter().map(|r| &url[r]));
    found.retain(|p| !p.is_empty());
    found.dedup();
    found
}

/// Where the values of secret-like query parameters of a URL are.
fn url_query_secrets(url: &str) -> Vec<std::ops::Range<usize>> {
    let Some(query_start) = url.find('?').map(|i| i + 1) else {
        return Vec::new();
    };
    let query_end = url[query_start..]
        .find('#')
        .map_or(url.len(), |i| query_start + i);
    let mut ranges = Vec::new();
    let mut at = query_start;
    for pair in url[query_start..query_end].split('&') {
        if let Some((key, value)) = pair.split_once('=')
            && is_secret_key(key)
        {
            let value_start = at + key.len() + 1;
            ranges.push(value_start..value_start + value.len());
        }
        at += pair.len() + 1;
    }
    ranges
}

/// A URL with its password and secret-like query parameters shown as `***`, for messages.
pub fn redact_url(url: &str) -> String {
    let mut ranges = url_query_secrets(url);
    ranges.extend(url_password_range(url));
    ranges.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(url.len());
    let mut done = 0;
    for range in ranges {
        if range.start < done {
            // Inside the password already hidden (a query written into it, unencoded).
            continue;
        }
        out.push_str(&url[done..range.start]);
        out.push_str("***");
        done = range.end;
    }
    out.push_str(&url[done..]);
    out
}

/// The password of a URL, as written in it (the widest reading, see [`url_password_range`]).
pub fn url_password(url: &str) -> Option<&str> {
    url_password_range(url)
        .map(|r| &url[r])
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_url_shows_itself_without_its_password() {
        let url: SecretUrl = toml::Value::String("postgres://app:Db-Pw-5518@db:5432/shop".into())
            .try_into()
            .unwrap();
        assert_eq!(url.expose(), "postgres://app:Db-Pw-5518@db:5432/shop");
        for shown in [format!("{url}"), format!("{url:?}")] {
            assert!(
                !shown.contains("Db-Pw-5518") && shown.contains("db:5432/shop"),
                "{shown}"
            );
        }
        assert_eq!(
            crate::secret::scrub("Db-Pw-5518"),
            "[redacted]",
            "registered when read"
        );
    }

    #[test]
    fn url_passwords_are_found_however_they_are_written() {
        assert_eq!(
            url_passwords("postgres://app:s3cret@db:5432/app"),
            ["s3cret"]
        );
        // Not percent-encoded: '#', '?', '@', '/' in the password.
        for password in ["CANARY#frag", "CANARY?q=1", "CANARY@pw/x:y"] {
            let url = format!("postgres://root:{password}@127.0.0.1:5432/test");
            assert!(url_passwords(&url).contains(&password), "{url}");
            assert_eq!(redact_url(&url), "postgres://root:***@127.0.0.1:5432/test");
        }
        // An '@' in the query: both readings are kept, so the real password is among them.
        assert!(url_passwords("mysql://root:p@ss@h/db?x=a@b").contains(&"p@ss"));
        let url = "postgres://app@db/app?sslmode=require&password=Query-Pw-1&sslpassword=Key-Pw-2";
        assert_eq!(url_passwords(url), ["Query-Pw-1", "Key-Pw-2"]);
        assert_eq!(
            redact_url(url),
            "postgres://app@db/app?sslmode=require&password=***&sslpassword=***"
        );
        assert!(url_passwords("postgres://app@db/app").is_empty());
        assert!(url_passwords("sqlite:///var/app.db").is_empty());
        assert_eq!(url_password("sqlite:///var/app.db"), None);
    }
}
