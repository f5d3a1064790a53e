//! One thing wrong with a configuration value: the key it is at, what is wrong, and the error
//! underneath when there is one. Every settings section reports its problems in this one
//! shape, so `Config::problems` and `config check` list them without converting.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// The key path as config errors write it (`relay.batch_size`, `kafka."sasl.password"`,
/// `tenants.acme.config.api_key`) and what is wrong with its value. Shown as `key: message`,
/// followed by `: cause` when an underlying error (an unreadable file, an invalid name) says
/// why. The cause is also the error's [`source`](Error::source) (the binary's error chain
/// leaves out a cause the text already says).
#[derive(Debug, Clone)]
pub struct Problem {
    /// Where the value is, as a dotted key path (`relay.batch_size`, `kafka."sasl.password"`).
    pub key: String,
    /// What is wrong; with a `cause`, what could not be done (`cannot read file /run/pw`), or
    /// empty when the cause says it all.
    pub message: String,
    /// The error underneath (shared: a configuration and its problems are cloned).
    pub cause: Option<Arc<dyn Error + Send + Sync>>,
}

impl Problem {
    /// `key`'s value is wrong as `message` says.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
            cause: None,
        }
    }

    /// `message` could not be done for `key` because of `cause`.
    pub fn caused(
        key: impl Into<String>,
        message: impl Into<String>,
        cause: impl Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
            cause: Some(Arc::new(cause)),
        }
    }

    /// `key`'s value is wrong as `cause` (a parse error) says.
    pub fn invalid(key: impl Into<String>, cause: impl Error + Send + Sync + 'static) -> Self {
        Self::caused(key, String::new(), cause)
    }

    /// What follows the key: the message and the cause.
    pub fn reason(&self) -> String {
        Reason(self).to_string()
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, Reason(self))
    }
}

impl Error for Problem {
    /// The cause itself (not the `Arc` around it), so it can be downcast.
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.cause.as_deref().map(|c| c as &(dyn Error + 'static))
    }
}

/// Writes a problem's message and cause without allocating for each.
struct Reason<'a>(&'a Problem);

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Problem { message, cause, .. } = self.0;
        match cause {
            None => f.write_str(message),
            Some(cause) if message.is_empty() => write!(f, "{cause}"),
            Some(cause) => write!(f, "{message}: {cause}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_follows_the_message_and_is_the_source() {
        assert_eq!(
            Problem::new("relay.workers", "must be at least 1").to_string(),
            "relay.workers: must be at least 1"
        );
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let p = Problem::caused("kafka.\"ssl.ca.location\"", "cannot read /ca.pem", io);
        assert_eq!(
            p.to_string(),
            "kafka.\"ssl.ca.location\": cannot read /ca.pem: no such file"
        );
        assert_eq!(p.reason(), "cannot read /ca.pem: no such file");
        let source = p.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotFound)
        );
        let bare = Problem::invalid("database.table", std::io::Error::other("bad name"));
        assert_eq!(bare.to_string(), "database.table: bad name");
    }
}
