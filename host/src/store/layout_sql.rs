//! The SQL view of a checked [`Layout`] in one [`Driver`]'s dialect: the quoted names and the
//! expressions that read its columns whatever their types (ids as integers or text, strings as
//! text, payloads as bytes, `created_at` as a time), the claim order, and the key-order
//! filter. Every driver's statements are built from it.

use super::dialect::{Cast, Driver};
use super::schema::{KeyKind, Layout, PayloadKind, TimeKind, ValueKind};
use super::statement::{Param, Statement};
use super::{AfterDead, ColumnName, Ordering};
use crate::model::OutboxId;

/// A checked [`Layout`] as one [`Driver`]'s SQL: quoted names and column expressions.
#[derive(Debug, Clone)]
pub(crate) struct LayoutSql {
    pub(crate) layout: Layout,
    pub(crate) dialect: Driver,
    /// The quoted table name (`schema.table` when qualified).
    pub(crate) table: String,
    pub(crate) id: String,
    pub(crate) tenant: Option<String>,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) payload: String,
    pub(crate) headers: String,
    pub(crate) created_at: String,
    pub(crate) order: String,
    pub(crate) trace_context: Option<String>,
}

impl LayoutSql {
    pub(crate) fn new(layout: Layout, dialect: Driver) -> Self {
        let quote = dialect.quote();
        let q = |c: &ColumnName| c.quoted_with(quote);
        Self {
            table: layout.table.quoted_with(quote),
            id: q(&layout.id),
            tenant: layout.tenant.as_ref().map(q),
            aggregate_type: q(&layout.aggregate_type),
            aggregate_id: q(&layout.aggregate_id),
            event_type: q(&layout.event_type),
            payload: q(&layout.payload),
            headers: q(&layout.headers),
            created_at: q(&layout.created_at),
            order: q(&layout.order),
            trace_context: layout.trace_context.as_ref().map(q),
            layout,
            dialect,
        }
    }

    /// Row `o` is neither sent nor dead: what a relay may still deliver.
    pub(crate) const PENDING: &'static str = "o.published_at IS NULL AND o.dead_at IS NULL";

    /// Row `o` is pending and due by `now` (no retry waiting): claimable but for row locks,
    /// leases, paused tenants and key order. What "due" means, for every statement that asks.
    pub(crate) fn due(now: &str) -> String {
        format!(
            "{} AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= {now})",
            Self::PENDING
        )
    }

    /// `alias.column`, or the bare column when `alias` is empty (statements without an alias,
    /// such as SQLite's `RETURNING`).
    pub(crate) fn column(alias: &str, column: &str) -> String {
        if alias.is_empty() {
            column.to_owned()
        } else {
            format!("{alias}.{column}")
        }
    }

    /// The type ids are read as: a 64-bit integer or text.
    pub(crate) fn id_cast(&self) -> Cast {
        match self.layout.key {
            KeyKind::Int => Cast::Int,
            KeyKind::Text { .. } => Cast::Text,
        }
    }

    /// The id as a 64-bit integer or as text, as the layout carries it.
    pub(crate) fn id_expr(&self, alias: &str) -> String {
        self.dialect
            .cast(&Self::column(alias, &self.id), self.id_cast())
    }

    /// A string column (`column` quoted) as text.
    pub(crate) fn text_expr(&self, alias: &str, column: &str) -> String {
        self.dialect.cast(&Self::column(alias, column), Cast::Text)
    }

    /// The tenant as text, NULL for the default tenant.
    pub(crate) fn tenant_expr(&self, alias: &str) -> String {
        match &self.tenant {
            Some(t) => self.text_expr(alias, t),
            None => self.dialect.cast("NULL", Cast::Text),
        }
    }

    /// The tenant name as plugins see it (`default` for NULL), for filters.
    pub(crate) fn tenant_name_expr(&self, alias: &str) -> String {
        match &self.tenant {
            Some(_) => format!("COALESCE({}, 'default')", self.tenant_expr(alias)),
            None => self.dialect.cast("'default'", Cast::Text),
        }
    }

    /// The payload as bytes (PostgreSQL, SQLite) or, for text and JSON on MySQL, as utf8mb4
    /// text (read as bytes in Rust).
    pub(crate) fn payload_expr(&self, alias: &str) -> String {
        let p = Self::column(alias, &self.payload);
        match (self.dialect, self.layout.payload_kind) {
            (Driver::Sqlite, _) => format!("CAST({p} AS BLOB)"),
            (_, PayloadKind::Bytes) => p,
            (Driver::Postgres, PayloadKind::Json | PayloadKind::Text) => {
                format!("convert_to({p}::text, 'UTF8')")
            }
            (Driver::Mysql, PayloadKind::Json | PayloadKind::Text) => {
                format!("CAST({p} AS CHAR CHARACTER SET utf8mb4)")
            }
        }
    }

    /// The headers as text, `{}` when NULL.
    pub(crate) fn headers_expr(&self, alias: &str) -> String {
        let h = Self::column(alias, &self.headers);
        let text = match self.dialect {
            Driver::Mysql => format!("CAST({h} AS CHAR CHARACTER SET utf8mb4)"),
            Driver::Postgres | Driver::Sqlite => self.dialect.cast(&h, Cast::Text),
        };
        format!("COALESCE({text}, '{{}}')")
    }

    /// `created_at` as a UTC time, NULL read as now (PostgreSQL: `timestamptz`, a timestamp
    /// without zone read as UTC; MySQL: a `DATETIME`, or a `TIMESTAMP` through the
    /// connection's `+00:00` time zone). SQLite: milliseconds since the epoch, NULL when the
    /// value is not a time (read as now in Rust).
    pub(crate) fn created_at_expr(&self, alias: &str) -> String {
        let c = Self::column(alias, &self.created_at);
        match (self.dialect, self.layout.created_at_kind) {
            (Driver::Postgres, TimeKind::WithZone) => format!("COALESCE({c}, now())"),
            (Driver::Postgres, TimeKind::WithoutZone) => {
                format!("COALESCE({c} AT TIME ZONE 'UTC', now())")
            }
            (Driver::Mysql, _) => format!("COALESCE({c}, UTC_TIMESTAMP(6))"),
            (Driver::Sqlite, _) => {
                format!("CAST(round((julianday({c}) - 2440587.5) * 86400000.0) AS INTEGER)")
            }
        }
    }

    /// A time column as a UTC time (SQLite: milliseconds since the epoch, NULL when the value
    /// is not a time); NULL stays NULL.
    fn time_expr(&self, alias: &str, column: &str, kind: TimeKind) -> String {
        let c = Self::column(alias, column);
        match (self.dialect, kind) {
            (Driver::Postgres, TimeKind::WithZone) | (Driver::Mysql, _) => c,
            (Driver::Postgres, TimeKind::WithoutZone) => format!("({c} AT TIME ZONE 'UTC')"),
            (Driver::Sqlite, _) => {
                format!("CAST(round((julianday({c}) - 2440587.5) * 86400000.0) AS INTEGER)")
            }
        }
    }

    /// Text of any type, in UTF-8 (MySQL: whatever the column's character set).
    fn utf8_expr(&self, alias: &str, column: &str) -> String {
        let c = Self::column(alias, column);
        match self.dialect {
            Driver::Mysql => format!("CAST({c} AS CHAR CHARACTER SET utf8mb4)"),
            Driver::Postgres | Driver::Sqlite => self.dialect.cast(&c, Cast::Text),
        }
    }

    /// An extra column read as its [`ValueKind`] is decoded (`rows::decode_extra`): integers
    /// and booleans as 64-bit integers, times as times, bytes as bytes, everything else
    /// (floats included, parsed in Rust) as UTF-8 text.
    fn extra_expr(&self, alias: &str, column: &ColumnName, kind: ValueKind) -> String {
        let quoted = column.quoted_with(self.dialect.quote());
        let c = Self::column(alias, &quoted);
        if self.dialect == Driver::Sqlite {
            return Self::sqlite_extra_expr(&c, kind);
        }
        match kind {
            ValueKind::Integer => self.dialect.cast(&c, Cast::Int),
            ValueKind::Boolean => self.dialect.cast(
                &format!("(CASE WHEN {c} THEN 1 WHEN NOT {c} THEN 0 END)"),
                Cast::Int,
            ),
            ValueKind::Time(kind) => self.time_expr(alias, &quoted, kind),
            ValueKind::Bytes => c,
            // `+ 0`: a `bit` value as its number, not its bytes.
            ValueKind::Unsigned => format!("CAST({c} + 0 AS CHAR CHARACTER SET utf8mb4)"),
            ValueKind::Text | ValueKind::Float | ValueKind::Json => self.utf8_expr(alias, &quoted),
        }
    }

    /// SQLite's values keep their own storage class whatever the column's declared type (an
    /// `INTEGER` column may hold `'abc'`, a `DATETIME` one Unix seconds), and a cast would
    /// coerce them without a word (`'abc'` to 0, `'true'` to false, seconds to NULL). So a
    /// value is read as the declared kind only when its class fits (integers for integers and
    /// booleans, ISO-8601 text for times); any other value as its text, or a blob as its bytes
    /// (`rows::decode_extra` takes them as `text` and `bytes`).
    fn sqlite_extra_expr(c: &str, kind: ValueKind) -> String {
        let as_stored = format!("WHEN 'blob' THEN {c} ELSE CAST({c} AS TEXT)");
        match kind {
            ValueKind::Integer | ValueKind::Unsigned | ValueKind::Boolean => {
                format!("CASE typeof({c}) WHEN 'integer' THEN {c} {as_stored} END")
            }
            ValueKind::Time(_) => format!(
                "CASE WHEN typeof({c}) = 'text' AND julianday({c}) IS NOT NULL
                      THEN CAST(round((julianday({c}) - 2440587.5) * 86400000.0) AS INTEGER)
                      ELSE CASE typeof({c}) {as_stored} END END"
            ),
            ValueKind::Bytes => format!("CAST({c} AS BLOB)"),
            ValueKind::Text | ValueKind::Float | ValueKind::Json => {
                format!("CASE typeof({c}) {as_stored} END")
            }
        }
    }

    /// The claim's columns, in the order [`super::rows::column`] reads them, with its aliases;
    /// the extra columns last, as `x0`, `x1`, … (their names may clash with the aliases).
    pub(crate) fn claimed_columns(&self, alias: &str) -> String {
        let mut columns = self.mapped_columns(alias);
        for (i, (column, kind)) in self.layout.extra.iter().enumerate() {
            columns.push_str(&format!(
                ", {} AS x{i}",
                self.extra_expr(alias, column, *kind)
            ));
        }
        columns
    }

    fn mapped_columns(&self, alias: &str) -> String {
        format!(
            "{id} AS id, {tenant} AS tenant, {at} AS aggregate_type, {ai} AS aggregate_id,
             {et} AS event_type, {payload} AS payload, {headers} AS headers,
             {created_at} AS created_at, {attempts} AS attempts, {trace} AS trace_context,
             {replay} AS replay_id",
            id = self.id_expr(alias),
            tenant = self.tenant_expr(alias),
            at = self.text_expr(alias, &self.aggregate_type),
            ai = self.text_expr(alias, &self.aggregate_id),
            et = self.text_expr(alias, &self.event_type),
            payload = self.payload_expr(alias),
            headers = self.headers_expr(alias),
            created_at = self.created_at_expr(alias),
            attempts = Self::column(alias, "attempts"),
            trace = match &self.trace_context {
                Some(t) => self.text_expr(alias, t),
                None => self.dialect.cast("NULL", Cast::Text),
            },
            replay = self.replay_expr(alias),
        )
    }

    /// The replay marker as text: NULL for rows no replay made due, and on tables without the
    /// column.
    pub(crate) fn replay_expr(&self, alias: &str) -> String {
        match self.layout.replay {
            true => self.text_expr(alias, &self.replay_column()),
            false => self.dialect.cast("NULL", Cast::Text),
        }
    }

    /// The replay marker column, quoted.
    pub(crate) fn replay_column(&self) -> String {
        ColumnName::known(super::columns::REPLAY.0).quoted_with(self.dialect.quote())
    }

    /// What a statement marking rows sent adds to its `SET` list: the replay marker cleared
    /// (`prefix`: the table's alias and a dot, or empty), or nothing on tables without it.
    pub(crate) fn replay_cleared(&self, prefix: &str) -> String {
        match self.layout.replay {
            true => format!(", {prefix}{} = NULL", self.replay_column()),
            false => String::new(),
        }
    }

    /// The SQL type a text id is cast to for comparison with the id column (PostgreSQL, where
    /// ids travel as text).
    pub(crate) fn key_cast(&self) -> &str {
        match &self.layout.key {
            KeyKind::Int => "int8",
            KeyKind::Text { cast } => cast,
        }
    }

    /// Binds `id` next in `statement`; returns it as SQL compared with the id column:
    /// PostgreSQL binds ids as text and casts them to the column's type (so its index serves),
    /// the others bind the id's own type.
    pub(crate) fn bind_id(&self, statement: &mut Statement, id: &OutboxId) -> String {
        match self.dialect {
            Driver::Postgres => {
                let param = statement.param(Param::Text(id.to_string()));
                format!("{param}::text::{}", self.key_cast())
            }
            Driver::Mysql | Driver::Sqlite => statement.param(match id {
                OutboxId::Int(n) => Param::Int(*n),
                OutboxId::Text(text) => Param::Text(text.to_string()),
            }),
        }
    }

    /// Binds `ids` next in `statement`; returns them as a list for `IN (…)`.
    pub(crate) fn bind_ids<'a>(
        &self,
        statement: &mut Statement,
        ids: impl IntoIterator<Item = &'a OutboxId>,
    ) -> String {
        let ids: Vec<String> = ids
            .into_iter()
            .map(|id| self.bind_id(statement, id))
            .collect();
        ids.join(", ")
    }

    /// The alias a [`LayoutSql::delete_first`] filter names the table by: MySQL's
    /// single-table `DELETE` (the only kind with `ORDER BY` and `LIMIT`) takes no alias before
    /// 8.0.16, so there the table's own name.
    pub(crate) fn delete_alias(&self) -> &str {
        match self.dialect {
            Driver::Mysql => &self.table,
            Driver::Postgres | Driver::Sqlite => "o",
        }
    }

    /// Deletes the first `limit` rows in claim order (`by_id`: in id order) matching `filter`
    /// (written against [`LayoutSql::delete_alias`]): one chunk of a chunked delete.
    pub(crate) fn delete_first(&self, filter: &str, limit: &str, by_id: bool) -> String {
        let table = &self.table;
        let order_by = |alias: &str| match by_id {
            true => Self::column(alias, &self.id),
            false => self.order_by(alias),
        };
        match self.dialect {
            Driver::Mysql => format!(
                "DELETE FROM {table} WHERE {filter} ORDER BY {order_by} LIMIT {limit}",
                order_by = order_by(table),
            ),
            Driver::Postgres | Driver::Sqlite => format!(
                "DELETE FROM {table}
                  WHERE {id} IN (SELECT o.{id} FROM {table} AS o
                                  WHERE {filter}
                                  ORDER BY {order_by} LIMIT {limit})",
                id = self.id,
                order_by = order_by("o"),
            ),
        }
    }

    /// `ORDER BY` list: the order column, then the id as a tie-break when they differ.
    pub(crate) fn order_by(&self, alias: &str) -> String {
        if self.layout.ordered_by_id() {
            Self::column(alias, &self.id)
        } else {
            format!(
                "{}, {}",
                Self::column(alias, &self.order),
                Self::column(alias, &self.id)
            )
        }
    }

    /// Whether row `a` comes before row `b` in claim order (a total order).
    pub(crate) fn before(&self, a: &str, b: &str) -> String {
        if self.layout.ordered_by_id() {
            format!("{a}.{id} < {b}.{id}", id = self.id)
        } else {
            format!(
                "({a}.{o}, {a}.{id}) < ({b}.{o}, {b}.{id})",
                o = self.order,
                id = self.id
            )
        }
    }

    /// In key order, a row `o` is claimable only when no earlier row of its key is still
    /// unsent: not in another relay's open batch (PostgreSQL, MySQL: its lock keeps it unsent
    /// until that commit; SQLite: its lease), not waiting for a retry, and — unless dead rows
    /// are skipped — not dead. So at most one row per key is ever in flight, and a failing row
    /// holds back its own key only. "Earlier" is the claim order ([`LayoutSql::before`]): a
    /// total order, so of two unsent rows of a key exactly one is first. The subquery is a
    /// plain (non-locking) read, so a row locked by another claim counts as unsent rather than
    /// being skipped. Empty without key order.
    pub(crate) fn key_order_filter(&self, ordering: Ordering, after_dead: AfterDead) -> String {
        match ordering {
            Ordering::None => String::new(),
            Ordering::Key => {
                let dead = match after_dead {
                    AfterDead::Skip => "AND p.dead_at IS NULL",
                    AfterDead::Block => "",
                };
                let tenant = match &self.tenant {
                    Some(t) => format!(
                        "AND {}",
                        self.dialect
                            .null_safe_eq(&format!("p.{t}"), &format!("o.{t}"))
                    ),
                    None => String::new(),
                };
                format!(
                    "AND NOT EXISTS (
                    SELECT 1 FROM {table} AS p
                     WHERE p.{at} = o.{at}
                       AND p.{ai} = o.{ai}
                       {tenant}
                       AND {before}
                       AND p.published_at IS NULL {dead})",
                    table = self.table,
                    at = self.aggregate_type,
                    ai = self.aggregate_id,
                    before = self.before("p", "o"),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TableName;
    use crate::store::test_layouts::{col, sluice_layout};

    /// Sluice's own table in schema `app`; `order`: the claim order column.
    fn layout(key: KeyKind, tenant: bool, order: &str) -> Layout {
        Layout {
            table: TableName::parse("app.outbox").unwrap(),
            key,
            tenant: tenant.then(|| col("tenant")),
            order: col(order),
            ..sluice_layout()
        }
    }

    #[test]
    fn names_are_quoted_the_dialects_way() {
        let my = LayoutSql::new(layout(KeyKind::Int, true, "id"), Driver::Mysql);
        assert_eq!(my.table, "`app`.`outbox`");
        assert_eq!(my.id_expr("o"), "CAST(o.`id` AS SIGNED)");
        let pg = LayoutSql::new(layout(KeyKind::Int, true, "id"), Driver::Postgres);
        assert_eq!(pg.table, "\"app\".\"outbox\"");
        assert_eq!(pg.id_expr("o"), "o.\"id\"::int8");
        let lite = LayoutSql::new(layout(KeyKind::Int, true, "id"), Driver::Sqlite);
        assert_eq!(lite.id_expr(""), "CAST(\"id\" AS INTEGER)");
    }

    #[test]
    fn claim_order_is_the_order_column_then_the_id() {
        let text = KeyKind::Text {
            cast: "uuid".into(),
        };
        let pg = LayoutSql::new(layout(text, false, "sluice_seq"), Driver::Postgres);
        assert_eq!(pg.order_by("o"), "o.\"sluice_seq\", o.\"id\"");
        assert_eq!(
            pg.before("p", "o"),
            "(p.\"sluice_seq\", p.\"id\") < (o.\"sluice_seq\", o.\"id\")"
        );
        let my = LayoutSql::new(layout(KeyKind::Int, true, "id"), Driver::Mysql);
        assert_eq!(my.order_by("o"), "o.`id`");
        assert_eq!(my.before("p", "o"), "p.`id` < o.`id`");
    }

    #[test]
    fn the_default_tenant_is_null_and_named_default() {
        let pg = LayoutSql::new(layout(KeyKind::Int, false, "id"), Driver::Postgres);
        assert_eq!(pg.tenant_expr("o"), "NULL::text");
        assert_eq!(pg.tenant_name_expr("o"), "'default'::text");
        let my = LayoutSql::new(layout(KeyKind::Int, true, "id"), Driver::Mysql);
        assert_eq!(
            my.tenant_name_expr("o"),
            "COALESCE(CAST(o.`tenant` AS CHAR), 'default')"
        );
    }

    #[test]
    fn key_order_compares_tenants_null_safely_in_each_dialect() {
        for (dialect, eq) in [
            (
                Driver::Postgres,
                "AND p.\"tenant\" IS NOT DISTINCT FROM o.\"tenant\"",
            ),
            (Driver::Mysql, "AND p.`tenant` <=> o.`tenant`"),
            (Driver::Sqlite, "AND p.\"tenant\" IS o.\"tenant\""),
        ] {
            let sql = LayoutSql::new(layout(KeyKind::Int, true, "id"), dialect);
            let filter = sql.key_order_filter(Ordering::Key, AfterDead::Skip);
            assert!(filter.contains(eq), "{filter}");
            assert!(filter.contains("AND p.dead_at IS NULL"), "{filter}");
            assert!(
                sql.key_order_filter(Ordering::None, AfterDead::Skip)
                    .is_empty()
            );
        }
    }

    #[test]
    fn payloads_become_bytes() {
        let mut bytes = layout(KeyKind::Int, true, "id");
        bytes.payload_kind = PayloadKind::Bytes;
        assert_eq!(
            LayoutSql::new(bytes.clone(), Driver::Mysql).payload_expr("o"),
            "o.`payload`"
        );
        assert_eq!(
            LayoutSql::new(bytes, Driver::Postgres).payload_expr("o"),
            "o.\"payload\""
        );
        let json = layout(KeyKind::Int, true, "id");
        assert_eq!(
            LayoutSql::new(json.clone(), Driver::Mysql).payload_expr("o"),
            "CAST(o.`payload` AS CHAR CHARACTER SET utf8mb4)"
        );
        assert_eq!(
            LayoutSql::new(json, Driver::Postgres).payload_expr("o"),
            "convert_to(o.\"payload\"::text, 'UTF8')"
        );
    }
}
