//! Validated outbox table names. The name is interpolated into SQL, so only plain identifiers
//! (optionally `schema.table`) are accepted.

use std::fmt;

/// A table name that is safe to interpolate into SQL: one or two dot-separated identifiers of
/// ASCII letters, digits and `_`, not starting with a digit, at most 63 bytes each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    table: String,
}

/// A configured table name that is not `table` or `schema.table` of identifiers, and why.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid table name {name:?}: {reason}")]
pub struct TableNameError {
    name: String,
    reason: &'static str,
}

impl TableName {
    /// `name` (`table` or `schema.table`) if each part is a valid identifier, case kept.
    pub fn parse(name: &str) -> Result<Self, TableNameError> {
        let err = |reason| TableNameError {
            name: name.to_owned(),
            reason,
        };
        let (schema, table) = match name.split_once('.') {
            Some((schema, table)) => (Some(schema), table),
            None => (None, name),
        };
        if table.contains('.') {
            return Err(err("use `table` or `schema.table`"));
        }
        for part in schema.into_iter().chain([table]) {
            validate_identifier(part).map_err(err)?;
        }
        let (schema, table) = (schema.map(str::to_owned), table.to_owned());
        Ok(Self { schema, table })
    }

    /// The bare table name, used to derive index names.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The schema part (a MySQL database, an attached SQLite database), if qualified.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The name quoted with `quote` (`"` for PostgreSQL and SQLite, `` ` `` for MySQL); the
    /// identifiers are validated, so they need no escaping.
    pub fn quoted_with(&self, quote: char) -> String {
        match &self.schema {
            Some(s) => format!("{quote}{s}{quote}.{quote}{}{quote}", self.table),
            None => format!("{quote}{}{quote}", self.table),
        }
    }

    /// The `schema.` part (empty when unqualified), for objects that live beside the table.
    pub fn schema_prefix(&self) -> String {
        self.schema
            .as_ref()
            .map(|s| format!("\"{s}\"."))
            .unwrap_or_default()
    }
}

pub(super) fn validate_identifier(part: &str) -> Result<(), &'static str> {
    if part.is_empty() {
        return Err("identifier is empty");
    }
    if part.len() > 63 {
        return Err("identifier is longer than 63 bytes");
    }
    if part.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("identifier starts with a digit");
    }
    if !part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("only ASCII letters, digits and '_' are allowed");
    }
    Ok(())
}

impl fmt::Display for TableName {
    /// The quoted SQL form, e.g. `"app"."outbox"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted_with('"'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_qualified_names_are_accepted_and_quoted() {
        assert_eq!(
            TableName::parse("outbox").unwrap().to_string(),
            "\"outbox\""
        );
        assert_eq!(
            TableName::parse("app.outbox_v2").unwrap().to_string(),
            "\"app\".\"outbox_v2\""
        );
        assert_eq!(
            TableName::parse("app.outbox").unwrap().quoted_with('`'),
            "`app`.`outbox`"
        );
    }

    #[test]
    fn injection_and_odd_names_are_refused() {
        for bad in [
            "",
            "out box",
            "outbox;drop table x",
            "a.b.c",
            "1outbox",
            "o\"x",
            ".x",
            "x.",
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(TableName::parse(&"x".repeat(64)).is_err());
    }
}
