//! Where the builtin router puts a row's extra columns (`[database.columns] extra`): the
//! `additional_placement` config key, with the semantics of Debezium's
//! `table.fields.additional.placement` — a comma-separated list of `column:header[:alias]`
//! (a header named `alias`, default the column's name) and `column:partition` (the message's
//! partition). The SDKs (Rust, Python, JavaScript) parse and apply the same list the same way,
//! so a tenant moving from the builtin to its own plugin publishes the same messages.

use crate::model::{ColumnValue, ExtraColumns, Headers};
use crate::plugin::wasm::bindings::types::{ErrorDetail, TransformError};

/// One `column:placement[:alias]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The extra column's name, as the table has it.
    pub column: String,
    /// What the value becomes.
    pub target: Target,
}

/// What an extra column's value becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A header of this name; its value is the column value's text
    /// ([`ColumnValue::header_value`]); none for NULL.
    Header(String),
    /// The message's partition: the column must hold an integer (NULL: the producer picks).
    Partition,
}

/// A parsed `additional_placement` list, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placements(Vec<Placement>);

impl Placements {
    /// Parses `column:header[:alias],column:partition,…` (spaces around entries ignored; empty:
    /// none). `envelope` is refused: the builtin router publishes the payload unchanged, so
    /// there is no envelope to add a field to.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut placements = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
            let target = match parts.as_slice() {
                [column, "header"] => Target::Header((*column).to_owned()),
                [_, "header", alias] if !alias.is_empty() => Target::Header((*alias).to_owned()),
                [_, "partition"] => Target::Partition,
                [_, "envelope", ..] => {
                    return Err(format!(
                        "additional_placement {entry:?}: envelope is not supported (the payload \
                         is published unchanged); use header or partition"
                    ));
                }
                _ => {
                    return Err(format!(
                        "additional_placement {entry:?}: expected column:header[:alias] or \
                         column:partition"
                    ));
                }
            };
            if parts[0].is_empty() {
                return Err(format!(
                    "additional_placement {entry:?}: the column is empty"
                ));
            }
            placements.push(Placement {
                column: parts[0].to_owned(),
                target,
            });
        }
        Ok(Self(placements))
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds the placed values of `extra` to `headers` (after those already there, in list
    /// order) and sets `partition`. A column the row does not carry, or a partition that is
    /// not an integer of 0..=2^31-1, is a permanent error naming the column.
    pub fn apply(
        &self,
        extra: &ExtraColumns,
        headers: &mut Headers,
        partition: &mut Option<i32>,
    ) -> Result<(), TransformError> {
        for placement in &self.0 {
            let column = placement.column.as_str();
            let Some((_, value)) = extra.iter().find(|(name, _)| &**name == column) else {
                return Err(permanent(
                    "missing-extra-column",
                    format!(
                        "additional_placement names column {column}, which the row does not \
                         carry (list it in [database.columns] extra)"
                    ),
                ));
            };
            match &placement.target {
                Target::Header(name) => {
                    if let Some(bytes) = value.header_value() {
                        headers.push((name.clone(), bytes));
                    }
                }
                Target::Partition => match value {
                    ColumnValue::Null => {}
                    ColumnValue::Integer(n) if (0..=i64::from(i32::MAX)).contains(n) => {
                        *partition = i32::try_from(*n).ok();
                    }
                    _ => {
                        return Err(permanent(
                            "invalid-partition",
                            format!(
                                "column {column} is placed as the partition but does not hold \
                                 an integer from 0 to 2147483647"
                            ),
                        ));
                    }
                },
            }
        }
        Ok(())
    }
}

fn permanent(code: &str, message: String) -> TransformError {
    TransformError::Permanent(ErrorDetail {
        code: code.to_owned(),
        message,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn extra() -> ExtraColumns {
        let at = chrono::DateTime::from_timestamp_millis(1_767_323_045_123).unwrap();
        vec![
            (Arc::from("region"), ColumnValue::Text("eu-west".into())),
            (Arc::from("shard"), ColumnValue::Integer(2)),
            (Arc::from("vip"), ColumnValue::Boolean(true)),
            (Arc::from("score"), ColumnValue::Float(19.5)),
            (Arc::from("seen_at"), ColumnValue::Timestamp(at)),
            (Arc::from("meta"), ColumnValue::Json(r#"{"a":1}"#.into())),
            (Arc::from("gone"), ColumnValue::Null),
        ]
    }

    fn placed(spec: &str) -> Result<(Headers, Option<i32>), TransformError> {
        let mut headers = vec![("first".to_owned(), b"1".to_vec())];
        let mut partition = None;
        Placements::parse(spec)
            .unwrap()
            .apply(&extra(), &mut headers, &mut partition)?;
        Ok((headers, partition))
    }

    fn text(headers: &Headers) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect()
    }

    #[test]
    fn headers_take_the_column_or_its_alias_in_list_order_and_null_adds_none() {
        let (headers, partition) = placed(
            "region:header, vip:header:x-vip,score:header,seen_at:header:at,meta:header,\
             shard:header,gone:header",
        )
        .unwrap();
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            text(&headers),
            pairs(&[
                ("first", "1"),
                ("region", "eu-west"),
                ("x-vip", "true"),
                ("score", "19.5"),
                ("at", "1767323045123"),
                ("meta", r#"{"a":1}"#),
                ("shard", "2"),
            ])
        );
        assert_eq!(partition, None);
    }

    #[test]
    fn an_integer_column_sets_the_partition_and_anything_else_is_refused() {
        assert_eq!(placed("shard:partition").unwrap().1, Some(2));
        assert_eq!(
            placed("gone:partition").unwrap().1,
            None,
            "NULL: no partition"
        );
        let Err(TransformError::Permanent(e)) = placed("region:partition") else {
            panic!("text accepted as a partition");
        };
        assert_eq!(e.code, "invalid-partition");
        assert!(e.message.contains("region"), "{}", e.message);
    }

    #[test]
    fn a_partition_outside_0_to_2_pow_31_minus_1_or_not_an_integer_is_refused() {
        let one = |value: ColumnValue| {
            let extra = vec![(Arc::from("p"), value)];
            let (mut headers, mut partition) = (Vec::new(), None);
            Placements::parse("p:partition")
                .unwrap()
                .apply(&extra, &mut headers, &mut partition)
                .map(|()| partition)
        };
        assert_eq!(one(ColumnValue::Integer(0)).unwrap(), Some(0));
        assert_eq!(
            one(ColumnValue::Integer(i64::from(i32::MAX))).unwrap(),
            Some(i32::MAX)
        );
        for bad in [
            ColumnValue::Integer(-1),
            ColumnValue::Integer(i64::from(i32::MAX) + 1),
            ColumnValue::Integer(i64::MIN),
            ColumnValue::Float(2.0),
            ColumnValue::Boolean(true),
            ColumnValue::Text("2".into()),
            ColumnValue::Bytes(vec![2]),
        ] {
            let Err(TransformError::Permanent(e)) = one(bad.clone()) else {
                panic!("{bad:?} accepted as a partition");
            };
            assert_eq!(e.code, "invalid-partition", "{bad:?}");
        }
    }

    #[test]
    fn a_column_the_row_lacks_is_a_permanent_error_naming_it() {
        let Err(TransformError::Permanent(e)) = placed("tier:header") else {
            panic!("missing column accepted");
        };
        assert_eq!(e.code, "missing-extra-column");
        assert!(e.message.contains("tier"), "{}", e.message);
    }

    #[test]
    fn malformed_lists_and_envelope_are_refused() {
        for bad in [
            "region",
            "region:body",
            ":header",
            "region:header:",
            "a:envelope",
        ] {
            assert!(Placements::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(
            Placements::parse("a:envelope:b")
                .unwrap_err()
                .contains("envelope is not supported")
        );
        assert!(Placements::parse(" , ").unwrap().is_empty());
    }
}
