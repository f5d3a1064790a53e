//! The databases Sluice relays from ([`Driver`], picked by URL scheme) and how each spells the
//! same SQL: identifier quoting, casts, null-safe equality and time arithmetic (placeholders
//! and the current time: [`super::statement::Statement`]). Everything else is built once from
//! a checked layout and its driver ([`super::layout_sql`]).

use std::time::Duration;

use super::StoreError;
use crate::secret::redact_url;

/// The databases Sluice relays from, by URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// `postgres://`, `postgresql://`
    Postgres,
    /// `mysql://`, `mariadb://` (MariaDB ≥ 10.6, MySQL ≥ 8.0)
    Mysql,
    /// `sqlite://` followed by a file path (`sqlite:///abs/app.db`, `sqlite://rel/app.db`)
    Sqlite,
}

impl Driver {
    /// The driver for `url`, or an error naming the schemes Sluice knows.
    pub fn of(url: &str) -> Result<Self, StoreError> {
        let scheme = url.split_once("://").map(|(scheme, _)| scheme);
        match scheme {
            Some("postgres" | "postgresql") => Ok(Self::Postgres),
            Some("mysql" | "mariadb") => Ok(Self::Mysql),
            Some("sqlite") => Ok(Self::Sqlite),
            _ => Err(StoreError::Url {
                url: redact_url(url),
                message: "unsupported database; use postgres://…, mysql://… (or mariadb://…) \
                          or sqlite://PATH"
                    .into(),
            }),
        }
    }

    /// The database's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "PostgreSQL",
            Self::Mysql => "MySQL/MariaDB",
            Self::Sqlite => "SQLite",
        }
    }

    /// Whether the database can wake a relay on insert (LISTEN/NOTIFY); the others poll.
    pub fn notifies(self) -> bool {
        self == Self::Postgres
    }

    /// Whether claims are committed leases (`database.lease`) rather than row locks held in
    /// an open transaction.
    pub fn leases(self) -> bool {
        self == Self::Sqlite
    }
}

/// The two types values are cast to before Rust reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cast {
    /// A 64-bit integer.
    Int,
    /// Text in the connection's character set.
    Text,
}

impl Driver {
    /// The identifier quote (names are validated identifiers: they need no escaping).
    pub(crate) fn quote(self) -> char {
        match self {
            Self::Mysql => '`',
            Self::Postgres | Self::Sqlite => '"',
        }
    }

    /// `expr` cast to `to`.
    pub(crate) fn cast(self, expr: &str, to: Cast) -> String {
        match (self, to) {
            (Self::Postgres, Cast::Int) => format!("{expr}::int8"),
            (Self::Postgres, Cast::Text) => format!("{expr}::text"),
            (Self::Mysql, Cast::Int) => format!("CAST({expr} AS SIGNED)"),
            (Self::Mysql, Cast::Text) => format!("CAST({expr} AS CHAR)"),
            (Self::Sqlite, Cast::Int) => format!("CAST({expr} AS INTEGER)"),
            (Self::Sqlite, Cast::Text) => format!("CAST({expr} AS TEXT)"),
        }
    }

    /// `a` equals `b`, NULL equalling NULL.
    pub(crate) fn null_safe_eq(self, a: &str, b: &str) -> String {
        match self {
            Self::Postgres => format!("{a} IS NOT DISTINCT FROM {b}"),
            Self::Mysql => format!("{a} <=> {b}"),
            Self::Sqlite => format!("{a} IS {b}"),
        }
    }

    /// The time `age` ago, as a time column compares with it, given parameter `param` bound
    /// to [`Driver::ago_param`].
    pub(crate) fn ago(self, param: &str) -> String {
        match self {
            Self::Postgres => format!("now() - {param} * interval '1 millisecond'"),
            Self::Mysql => format!("UTC_TIMESTAMP(6) - INTERVAL {param} MICROSECOND"),
            Self::Sqlite => param.to_owned(),
        }
    }

    /// What [`Driver::ago`]'s parameter binds for `age`: milliseconds (PostgreSQL),
    /// microseconds (MySQL), or the time itself in milliseconds since the epoch (SQLite).
    pub(crate) fn ago_param(self, age: Duration) -> i64 {
        match self {
            Self::Postgres => millis(age),
            Self::Mysql => i64::try_from(age.as_micros()).unwrap_or(i64::MAX),
            Self::Sqlite => chrono::Utc::now()
                .timestamp_millis()
                .saturating_sub(millis(age)),
        }
    }
}

/// `d` in whole milliseconds, saturating: how a delay or an age is bound.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_database_spells_casts_and_null_safe_equality_its_way() {
        assert_eq!(Driver::Postgres.cast("o.x", Cast::Int), "o.x::int8");
        assert_eq!(Driver::Mysql.cast("o.x", Cast::Text), "CAST(o.x AS CHAR)");
        assert_eq!(
            Driver::Sqlite.cast("o.x", Cast::Int),
            "CAST(o.x AS INTEGER)"
        );
        assert_eq!(
            Driver::Postgres.null_safe_eq("a", "b"),
            "a IS NOT DISTINCT FROM b"
        );
        assert_eq!(Driver::Mysql.null_safe_eq("a", "b"), "a <=> b");
        assert_eq!(Driver::Sqlite.null_safe_eq("a", "b"), "a IS b");
    }
}
