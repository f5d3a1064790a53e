//! Running a statement built once for every database ([`Statement`]) on any driver's pool
//! ([`Run`]), and reading its rows by position whatever the driver ([`ReadRow`]). The shared
//! statements (dead rows, the backlog sample) go through here; the relay's hot path (claim,
//! mark) binds its own parameters per driver.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::dialect::Dialect;

/// A value bound to a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Param {
    Int(i64),
    Text(String),
}

/// A statement's text and its parameters in binding order, built with [`Statement::param`]
/// so the placeholders are spelled as the dialect spells them.
#[derive(Debug, Clone)]
pub(crate) struct Statement {
    dialect: Dialect,
    pub(crate) sql: String,
    pub(crate) params: Vec<Param>,
}

impl Statement {
    pub(crate) fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            sql: String::new(),
            params: Vec::new(),
        }
    }

    /// Binds `value` next; returns its placeholder (`$n` on PostgreSQL, `?n` on SQLite, `?`
    /// on MySQL).
    pub(crate) fn param(&mut self, value: Param) -> String {
        self.params.push(value);
        let n = self.params.len();
        match self.dialect {
            Dialect::Postgres => format!("${n}"),
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Mysql => "?".to_owned(),
        }
    }

    /// The current time as the bookkeeping columns hold it: the server's clock, or on SQLite
    /// (whose columns hold milliseconds since the epoch, bound from Rust so every process
    /// compares with the same clock) a parameter bound to it now.
    pub(crate) fn now(&mut self) -> String {
        match self.dialect {
            Dialect::Postgres => "now()".to_owned(),
            Dialect::Mysql => "UTC_TIMESTAMP(6)".to_owned(),
            Dialect::Sqlite => self.param(Param::Int(Utc::now().timestamp_millis())),
        }
    }

    /// `placeholder` (returned by [`Statement::param`] for `value`) once more: the same
    /// placeholder where the database numbers them, `value` bound again where it does not.
    pub(crate) fn again(&mut self, placeholder: &str, value: Param) -> String {
        match self.dialect {
            Dialect::Mysql => self.param(value),
            Dialect::Postgres | Dialect::Sqlite => placeholder.to_owned(),
        }
    }

    /// The statement with its text.
    pub(crate) fn with_sql(mut self, sql: String) -> Self {
        self.sql = sql;
        self
    }
}

/// A pool that runs [`Statement`]s.
pub(crate) trait Run: Sync {
    type Row: ReadRow + Send;

    /// Runs `statement`; returns the rows it changed.
    fn execute(
        &self,
        statement: &Statement,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    fn fetch_all(
        &self,
        statement: &Statement,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send;
}

/// A result row read by column position.
pub(crate) trait ReadRow {
    fn int(&self, index: usize) -> Result<Option<i64>, sqlx::Error>;
    fn int32(&self, index: usize) -> Result<i32, sqlx::Error>;
    fn text(&self, index: usize) -> Result<Option<String>, sqlx::Error>;
    fn bytes(&self, index: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
    /// A time column as Sluice's columns hold it (SQLite: milliseconds since the epoch).
    fn time(&self, index: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error>;
}

/// Implements [`Run`] for a driver's `$pool` and [`ReadRow`] for its `$row`, whose time
/// columns are read as `$time` and turned into a time by `$to_time`.
macro_rules! impl_run {
    ($pool:ty, $row:ty, $time:ty, $to_time:expr) => {
        fn bound<'q>(
            statement: &'q $crate::store::statement::Statement,
        ) -> sqlx::query::Query<
            'q,
            <$row as sqlx::Row>::Database,
            <<$row as sqlx::Row>::Database as sqlx::Database>::Arguments,
        > {
            use $crate::store::statement::Param;
            let mut query = sqlx::query(sqlx::AssertSqlSafe(statement.sql.as_str()));
            for param in &statement.params {
                query = match param {
                    Param::Int(n) => query.bind(*n),
                    Param::Text(text) => query.bind(text.as_str()),
                };
            }
            query
        }

        impl $crate::store::statement::Run for $pool {
            type Row = $row;

            async fn execute(
                &self,
                statement: &$crate::store::statement::Statement,
            ) -> Result<u64, sqlx::Error> {
                Ok(bound(statement).execute(self).await?.rows_affected())
            }

            async fn fetch_all(
                &self,
                statement: &$crate::store::statement::Statement,
            ) -> Result<Vec<$row>, sqlx::Error> {
                bound(statement).fetch_all(self).await
            }
        }

        impl $crate::store::statement::ReadRow for $row {
            fn int(&self, index: usize) -> Result<Option<i64>, sqlx::Error> {
                sqlx::Row::try_get(self, index)
            }

            fn int32(&self, index: usize) -> Result<i32, sqlx::Error> {
                sqlx::Row::try_get(self, index)
            }

            fn text(&self, index: usize) -> Result<Option<String>, sqlx::Error> {
                sqlx::Row::try_get(self, index)
            }

            fn bytes(&self, index: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
                sqlx::Row::try_get(self, index)
            }

            fn time(
                &self,
                index: usize,
            ) -> Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
                let value: Option<$time> = sqlx::Row::try_get(self, index)?;
                Ok(value.map($to_time))
            }
        }
    };
}

pub(crate) use impl_run;
