//! Running a statement built once for every database ([`Statement`]) on any driver's
//! connections ([`Execute`]), and reading its rows by position whatever the driver
//! ([`ReadRow`]). The shared statements (dead rows, the backlog, settling, MySQL's and
//! SQLite's marking) go through here; PostgreSQL's hot path (claim, mark) binds arrays.

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use super::dialect::{Cast, Driver};

/// A value bound to a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Param {
    Int(i64),
    Text(String),
    /// NULL, bound as a value of the type it stands for.
    Null(Cast),
}

/// A statement's text and its parameters in binding order, built with [`Statement::param`]
/// so the placeholders are spelled as the dialect spells them.
#[derive(Debug, Clone)]
pub(crate) struct Statement {
    dialect: Driver,
    pub(crate) sql: String,
    pub(crate) params: Vec<Param>,
}

impl Statement {
    pub(crate) fn new(dialect: Driver) -> Self {
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
            Driver::Postgres => format!("${n}"),
            Driver::Sqlite => format!("?{n}"),
            Driver::Mysql => "?".to_owned(),
        }
    }

    /// The current time as the bookkeeping columns hold it: the server's clock, or on SQLite
    /// (whose columns hold milliseconds since the epoch, bound from Rust so every process
    /// compares with the same clock) a parameter bound to it now.
    pub(crate) fn now(&mut self) -> String {
        match self.dialect {
            Driver::Postgres => "now()".to_owned(),
            Driver::Mysql => "UTC_TIMESTAMP(6)".to_owned(),
            Driver::Sqlite => self.param(Param::Int(Utc::now().timestamp_millis())),
        }
    }

    /// `placeholder` (returned by [`Statement::param`] for `value`) once more: the same
    /// placeholder where the database numbers them, `value` bound again where it does not.
    pub(crate) fn again(&mut self, placeholder: &str, value: Param) -> String {
        match self.dialect {
            Driver::Mysql => self.param(value),
            Driver::Postgres | Driver::Sqlite => placeholder.to_owned(),
        }
    }

    /// The statement with its text.
    pub(crate) fn with_sql(mut self, sql: String) -> Self {
        self.sql = sql;
        self
    }
}

/// `items`, then the first again up to the next power of two: lists bound one placeholder each
/// (MySQL) come in a few lengths, so a connection prepares a handful of statement texts. For
/// `IN`/`NOT IN` lists, where a repeated value changes nothing (a NULL would: `NOT IN` with a
/// NULL matches no row).
pub(crate) fn padded<T>(items: &[T]) -> impl Iterator<Item = &T> {
    let pad = items.len().next_power_of_two() - items.len();
    let again = items
        .first()
        .into_iter()
        .flat_map(move |first| std::iter::repeat_n(first, pad));
    items.iter().chain(again)
}

/// A database whose connections run [`Statement`]s (boxed futures: shared code holding them
/// stays `Send` whatever the driver).
pub(crate) trait Execute: sqlx::Database<Row: ReadRow + Send> {
    /// Runs `statement` on `conn`; returns the rows it changed.
    fn execute<'c>(
        conn: &'c mut Self::Connection,
        statement: &'c Statement,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>>;

    /// Runs `statement` on `conn`; returns its rows.
    fn fetch_all<'c>(
        conn: &'c mut Self::Connection,
        statement: &'c Statement,
    ) -> BoxFuture<'c, Result<Vec<Self::Row>, sqlx::Error>>;
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

/// Implements [`Execute`] for a driver's database `$db` and [`ReadRow`] for its `$row`, whose
/// time columns are read as `$time` and turned into a time by `$to_time`.
macro_rules! impl_execute {
    ($db:ty, $row:ty, $time:ty, $to_time:expr) => {
        fn bound(
            statement: &$crate::store::statement::Statement,
        ) -> sqlx::query::Query<'_, $db, <$db as sqlx::Database>::Arguments> {
            use $crate::store::dialect::Cast;
            use $crate::store::statement::Param;
            let mut query = sqlx::query(sqlx::AssertSqlSafe(statement.sql.as_str()));
            for param in &statement.params {
                query = match param {
                    Param::Int(n) => query.bind(*n),
                    Param::Text(text) => query.bind(text.as_str()),
                    Param::Null(Cast::Int) => query.bind(None::<i64>),
                    Param::Null(Cast::Text) => query.bind(None::<String>),
                };
            }
            query
        }

        impl $crate::store::statement::Execute for $db {
            fn execute<'c>(
                conn: &'c mut <$db as sqlx::Database>::Connection,
                statement: &'c $crate::store::statement::Statement,
            ) -> futures::future::BoxFuture<'c, Result<u64, sqlx::Error>> {
                Box::pin(async move { Ok(bound(statement).execute(conn).await?.rows_affected()) })
            }

            fn fetch_all<'c>(
                conn: &'c mut <$db as sqlx::Database>::Connection,
                statement: &'c $crate::store::statement::Statement,
            ) -> futures::future::BoxFuture<
                'c,
                Result<Vec<<$db as sqlx::Database>::Row>, sqlx::Error>,
            > {
                Box::pin(bound(statement).fetch_all(conn))
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

pub(crate) use impl_execute;
