//! [`Secret`]: the type of the credential keys Sluice reads itself (`[telemetry]`'s token and
//! password, `[schema_registry]`'s, `[plugins.registries.*]`'s), so that none can be printed
//! by accident, and [`constant_time_eq`], how a credential is compared with one a client sent.

use std::fmt;

use serde::{Deserialize, Deserializer};
use sha2::{Digest, Sha256};

use super::scrub::{self, REDACTED};

/// A credential, usually given through `${file:…}`. `Debug` and `Display` show [`REDACTED`];
/// [`Secret::expose`] hands the value to the one place that sends it, [`Secret::matches`]
/// compares a value from outside in constant time.
///
/// Deserialising one (reading the configuration) [`scrub::register`]s the value, so it is
/// scrubbed from logs whatever its key is called and however it was written (values shorter
/// than [`scrub::MIN_SCRUBBED_LEN`] excepted, as for every secret). [`Secret::new`] does not:
/// a value built in code (an `Authorization` header) or a test's is not from the config.
#[derive(Clone, Default)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `value`, not registered with the scrubber.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// `value` read from the configuration: registered with the scrubber, as deserialising
    /// one is.
    pub fn read(value: String) -> Self {
        scrub::register([&value]);
        Self(value)
    }

    /// The value, for the one place that must check or send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `given` (from a client) is this secret, in time that says nothing about where
    /// they differ or how long either is (see [`constant_time_eq`]).
    pub fn matches(&self, given: &[u8]) -> bool {
        constant_time_eq(given, self.0.as_bytes())
    }
}

/// Equal values. In constant time too: comparing configs on SIGHUP needs only equality, but a
/// comparison that leaks timing must not be one `==` away from a client's value.
impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// From a plain string, as `#[serde(transparent)]` would; the value is registered with the
/// scrubber on the way in.
impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::read)
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

/// Whether `a` and `b` are equal, in time independent of where they differ and of their
/// lengths: both are hashed, and the digests compared without an early exit. For a value a
/// client sent against a credential (or a user name, which is half of one).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_unequal_bytes_compare_as_such() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn a_secret_matches_its_value_only_and_equals_an_equal_secret() {
        let secret = Secret::new("Match-Me-1");
        assert!(secret.matches(b"Match-Me-1"));
        assert!(!secret.matches(b"Match-Me-"));
        assert!(!secret.matches(b""));
        assert_eq!(secret, Secret::from("Match-Me-1"));
        assert_ne!(secret, Secret::from("Match-Me-2"));
    }

    #[test]
    fn debug_and_display_never_show_the_value() {
        let secret = Secret::new("Shown-Never-2");
        let shown = format!("{secret:?} {secret} {:?}", Some(&secret));
        assert_eq!(shown, "[redacted] [redacted] Some([redacted])");
        assert_eq!(secret.expose(), "Shown-Never-2");
    }

    #[test]
    fn a_secret_read_from_the_config_is_scrubbed_from_text() {
        #[derive(Deserialize)]
        struct Section {
            // A key no secret-like name gives away: the type alone registers it.
            login: Secret,
            short: Secret,
        }
        let built = Secret::new("Built-Not-Read-4");
        let section: Section = toml::from_str("login = \"Read-From-Config-3\"\nshort = \"ab\"")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(section.login.expose(), "Read-From-Config-3");
        assert_eq!(section.short.expose(), "ab");
        assert_eq!(
            scrub::scrub("login Read-From-Config-3, short ab, built Built-Not-Read-4"),
            format!("login [redacted], short ab, built {}", built.expose()),
            "short values are not scrubbed from free text; a secret built in code is not \
             registered"
        );
        assert!(toml::from_str::<Section>("login = 1\nshort = \"ab\"").is_err());
    }
}
