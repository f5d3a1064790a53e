//! Whose fault a failed `XADD` is, from Redis' error reply: the server's (retry later,
//! nobody's fault), the tenant's (a key that is not a stream, a stream it may not write), or
//! the message's; and what kind of connection trouble a client error is.

use ::redis::{ErrorKind, RedisError, ServerError};

use crate::sink::PublishFault;
use crate::sink::connection::ConnectionProblem;

/// Error codes of a server that cannot take writes now (out of memory, loading its data set,
/// busy with a script, a replica, failing to persist, a cluster node that is not the key's):
/// the row waits, the tenant is not to blame.
const UNAVAILABLE: &[&str] = &[
    "OOM",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "READONLY",
    "MISCONF",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
    "NOAUTH",
    "WRONGPASS",
];

/// Error codes that say the client is not (or no longer) authenticated.
const AUTHENTICATION: &[&str] = &["NOAUTH", "WRONGPASS"];

/// Whose fault an error reply to one `XADD` is, and what to tell the row.
pub(super) fn entry_error(error: &ServerError) -> (PublishFault, String) {
    let code = error.code();
    let said = match error.details() {
        Some(details) => format!("{code} {details}"),
        None => code.to_owned(),
    };
    match code {
        "WRONGTYPE" => (
            PublishFault::Refused,
            format!("the key holds another type, not a stream ({said})"),
        ),
        "NOPERM" => (
            PublishFault::Refused,
            format!("the Redis user may not write this stream ({said})"),
        ),
        "MOVED" | "ASK" => (
            PublishFault::Unavailable,
            format!(
                "the server redirects to another cluster node ({said}); the sink speaks to \
                 one Redis server, not Redis Cluster"
            ),
        ),
        _ if is_authentication(error) => (
            PublishFault::Unavailable,
            format!("the connection is not authenticated ({said})"),
        ),
        // Redis closes the connection after a protocol error: nothing about this entry.
        "ERR"
            if error
                .details()
                .is_some_and(|d| d.starts_with("Protocol error")) =>
        {
            (
                PublishFault::Unavailable,
                format!("Redis dropped the connection ({said})"),
            )
        }
        _ if UNAVAILABLE.contains(&code) => (
            PublishFault::Unavailable,
            format!("Redis cannot take writes now ({said})"),
        ),
        _ => (
            PublishFault::Failed,
            format!("Redis refused the entry ({said})"),
        ),
    }
}

/// Whether an error reply says the connection is not authenticated: `NOAUTH`, or the protocol
/// error Redis answers a long command of an unauthenticated client with (before it closes the
/// connection).
pub(super) fn is_authentication(error: &ServerError) -> bool {
    AUTHENTICATION.contains(&error.code())
        || error
            .details()
            .is_some_and(|d| d.starts_with("Protocol error: unauthenticated"))
}

/// The kind of connection trouble `error` is, on a connection that is TLS (`tls`) or not.
pub(super) fn connection_problem(error: &RedisError, tls: bool) -> ConnectionProblem {
    match error.kind() {
        ErrorKind::AuthenticationFailed => ConnectionProblem::Authentication,
        _ if error.code().is_some_and(|c| AUTHENTICATION.contains(&c)) => {
            ConnectionProblem::Authentication
        }
        // redis-rs files a failed TLS handshake (native-tls' error) as a client error; an alert
        // the server sends after it (no client certificate) comes as a read error naming SSL.
        ErrorKind::Client if tls => ConnectionProblem::Tls,
        _ if tls && error.to_string().contains("SSL routines") => ConnectionProblem::Tls,
        _ => ConnectionProblem::Unreachable,
    }
}

/// Whether the connection `error` came from can be used no more: the next batch must open a
/// new one. (An error reply leaves the connection as good as it was.)
pub(super) fn connection_is_broken(error: &RedisError) -> bool {
    error.is_io_error() || error.is_connection_dropped() || error.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error reply Redis would send with `line` (`-CODE details`).
    fn reply(line: &str) -> ServerError {
        match ::redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(::redis::Value::ServerError(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn replies_are_the_tenants_the_servers_or_the_messages() {
        use PublishFault::*;
        let fault = |line: &str| entry_error(&reply(line)).0;
        assert_eq!(
            fault("WRONGTYPE Operation against a key holding the wrong kind of value"),
            Refused
        );
        assert_eq!(
            fault("NOPERM User app has no permissions to access the 'x' key"),
            Refused
        );
        assert_eq!(
            fault("OOM command not allowed when used memory > 'maxmemory'."),
            Unavailable
        );
        assert_eq!(
            fault("LOADING Redis is loading the dataset in memory"),
            Unavailable
        );
        assert_eq!(
            fault("READONLY You can't write against a read only replica."),
            Unavailable
        );
        assert_eq!(fault("MOVED 3999 127.0.0.1:6381"), Unavailable);
        assert_eq!(fault("NOAUTH Authentication required."), Unavailable);
        assert_eq!(fault("ERR something else"), Failed);
        assert_eq!(
            fault("ERR Protocol error: unauthenticated multibulk length"),
            Unavailable
        );
        assert!(is_authentication(&reply(
            "ERR Protocol error: unauthenticated multibulk length"
        )));
        let (_, said) = entry_error(&reply("WRONGTYPE Operation against a key"));
        assert!(
            said.contains("not a stream") && said.contains("WRONGTYPE"),
            "{said}"
        );
        assert!(is_authentication(&reply("NOAUTH Authentication required.")));
        assert!(!is_authentication(&reply("NOPERM no")));
    }

    #[test]
    fn client_errors_are_authentication_tls_or_unreachable() {
        let auth = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(
            connection_problem(&auth, false),
            ConnectionProblem::Authentication
        );
        let client = RedisError::from((ErrorKind::Client, "handshake"));
        assert_eq!(connection_problem(&client, true), ConnectionProblem::Tls);
        assert_eq!(
            connection_problem(&client, false),
            ConnectionProblem::Unreachable
        );
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            connection_problem(&io, true),
            ConnectionProblem::Unreachable
        );
        assert!(connection_is_broken(&io));
    }
}
