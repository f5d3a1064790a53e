//! What the drivers share about rows: parsing the `headers` column, what a failure does to its
//! row as the reschedule statements take it, and how long id lists are cut for databases
//! without array parameters.

use std::time::Duration;

use super::Disposition;
use crate::model::Headers;

/// Rows per statement where ids travel as one placeholder each (MySQL, SQLite): far below
/// either database's parameter limit, whatever `relay.batch_size` is.
pub const IDS_PER_STATEMENT: usize = 1_000;

/// Parses the `headers` column: a JSON object whose values are strings.
pub fn parse_headers(text: &str) -> Result<Headers, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("headers column is not JSON: {e}"))?;
    let serde_json::Value::Object(map) = value else {
        return Err(format!(
            "headers column must be a JSON object of strings, got {text}"
        ));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s.into_bytes())),
            other => Err(format!(
                "headers column: value of {k:?} must be a string, got {other}"
            )),
        })
        .collect()
}

/// A [`Disposition`] as the reschedule statements take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reschedule {
    /// Due again this many milliseconds after the statement (0 for dead rows).
    pub delay_ms: i64,
    pub dead: bool,
    /// Whether the attempt counts (`Wait` does not).
    pub counted: bool,
}

impl From<Disposition> for Reschedule {
    fn from(disposition: Disposition) -> Self {
        let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        match disposition {
            Disposition::Retry(d) => Self {
                delay_ms: millis(d),
                dead: false,
                counted: true,
            },
            Disposition::Dead => Self {
                delay_ms: 0,
                dead: true,
                counted: true,
            },
            Disposition::Wait(d) => Self {
                delay_ms: millis(d),
                dead: false,
                counted: false,
            },
        }
    }
}

/// `n` comma-separated `?` placeholders.
pub fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_object_of_strings_becomes_ordered_pairs() {
        let h = parse_headers(r#"{"a":"1","b":"two"}"#).unwrap();
        assert_eq!(
            h,
            vec![("a".into(), b"1".to_vec()), ("b".into(), b"two".to_vec())]
        );
    }

    #[test]
    fn non_string_header_value_is_named() {
        let err = parse_headers(r#"{"trace":5}"#).unwrap_err();
        assert!(err.contains("\"trace\""), "{err}");
        assert!(parse_headers("[1]").is_err());
    }

    #[test]
    fn dispositions_become_delay_dead_and_counted() {
        let wait = Reschedule::from(Disposition::Wait(Duration::from_millis(1500)));
        assert_eq!(
            (wait.delay_ms, wait.dead, wait.counted),
            (1500, false, false)
        );
        let dead = Reschedule::from(Disposition::Dead);
        assert!(dead.dead && dead.counted);
        assert_eq!(placeholders(3), "?, ?, ?");
    }
}
