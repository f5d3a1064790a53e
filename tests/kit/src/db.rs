//! PostgreSQL helpers of the harness's own connections (relays connect on their own) and URLs.

use anyhow::{Context, bail};
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor};

/// A small pool for setup, cleanup and occasional queries.
pub async fn pool(url: &str) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {}", redact(url)))
}

/// One dedicated connection, for loops whose timing must not wait for a pool.
pub async fn connection(url: &str) -> anyhow::Result<PgConnection> {
    PgConnection::connect(url)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {}", redact(url)))
}

/// Runs one statement that returns nothing, naming it in the error.
pub async fn execute<'c, E>(executor: E, sql: String) -> anyhow::Result<()>
where
    E: Executor<'c, Database = sqlx::Postgres>,
{
    executor
        .execute(AssertSqlSafe(sql.as_str()))
        .await
        .with_context(|| format!("SQL failed: {sql}"))?;
    Ok(())
}

/// `name` as a quoted SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `url` with its database (path) replaced by `database`; query parameters are kept.
pub fn with_database(url: &str, database: &str) -> anyhow::Result<String> {
    let Some(scheme_end) = url.find("://") else {
        bail!("{} is not a postgres:// URL", redact(url));
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let after_authority = &rest[authority_end..];
    let query = after_authority
        .find('?')
        .map(|q| &after_authority[q..])
        .unwrap_or("");
    Ok(format!(
        "{}{}/{database}{query}",
        &url[..rest_start],
        &rest[..authority_end]
    ))
}

/// `url` without its password, for error messages.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => match authority[..at].find(':') {
            Some(colon) => format!(
                "{}{}:***{}",
                &url[..scheme_end + 3],
                &authority[..colon],
                &url[scheme_end + 3 + at..]
            ),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_is_replaced_and_query_kept() {
        let cases = [
            (
                "postgres://root@127.0.0.1:5432/test",
                "postgres://root@127.0.0.1:5432/other",
            ),
            ("postgres://127.0.0.1", "postgres://127.0.0.1/other"),
            (
                "postgresql://u:p@h/db?sslmode=disable",
                "postgresql://u:p@h/other?sslmode=disable",
            ),
            (
                "postgres://h?sslmode=disable",
                "postgres://h/other?sslmode=disable",
            ),
        ];
        for (url, expected) in cases {
            assert_eq!(with_database(url, "other").ok().as_deref(), Some(expected));
        }
        assert!(with_database("not a url", "x").is_err());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://h/db"), "postgres://h/db");
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("outbox"), "\"outbox\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
