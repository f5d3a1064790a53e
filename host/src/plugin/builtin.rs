//! Routing plugins compiled into the host (`builtin = "…"` instead of `path = "….wasm"`).
//!
//! For the common case — Debezium-style routing by aggregate type — no WebAssembly toolchain
//! is needed, and the relay skips the guest call. A builtin's output goes through the same
//! validation as a WASM plugin's (allowed topics, sizes, host-stamped headers), so the two
//! are interchangeable; the benchmark uses this to measure the sandbox's cost.

use crate::model::OutboxRow;
use crate::plugin::placement::Placements;
use crate::plugin::wasm::bindings::types::{ErrorDetail, OutputMessage, TransformError};

/// Topic prefix of `route-by-aggregate`, as in Debezium's Outbox Event Router.
const DEFAULT_TOPIC_PREFIX: &str = "outbox.event.";

/// A configured builtin plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Builtin {
    /// Same output as `plugins/route-by-aggregate`: topic `<topic_prefix><aggregate_type>`,
    /// key = aggregate id, payload unchanged, row headers plus `id` and `event-type` (then
    /// the placed extra columns), timestamp = the row's `created_at`.
    RouteByAggregate {
        /// `config` key `topic_prefix` (default `outbox.event.`).
        topic_prefix: String,
        /// `config` key `additional_placement` (default none; see [`Placements`]).
        placements: Placements,
    },
}

impl Builtin {
    /// Names accepted by `builtin = "…"`.
    pub const NAMES: &'static [&'static str] = &["route-by-aggregate"];

    /// Checks a `builtin` name from the config.
    pub fn check_name(name: &str) -> Result<(), String> {
        if Self::NAMES.contains(&name) {
            Ok(())
        } else {
            Err(format!(
                "unknown builtin plugin {name:?} (known: {})",
                Self::NAMES.join(", ")
            ))
        }
    }

    /// Builds the plugin from its `config` pairs; unknown keys are refused, as the WASM
    /// reference plugin does.
    pub fn configure(name: &str, config: &[(String, String)]) -> Result<Self, String> {
        Self::check_name(name)?;
        let mut topic_prefix = DEFAULT_TOPIC_PREFIX.to_owned();
        let mut placements = Placements::default();
        for (key, value) in config {
            match key.as_str() {
                "topic_prefix" => topic_prefix.clone_from(value),
                "additional_placement" => placements = Placements::parse(value)?,
                other => {
                    return Err(format!(
                        "unknown config key {other:?} (known keys: topic_prefix, \
                         additional_placement)"
                    ));
                }
            }
        }
        Ok(Self::RouteByAggregate {
            topic_prefix,
            placements,
        })
    }

    /// The builtin's messages for one row (validated by the caller like a guest's).
    pub fn transform(&self, row: &OutboxRow) -> Result<Vec<OutputMessage>, TransformError> {
        match self {
            Self::RouteByAggregate {
                topic_prefix,
                placements,
            } => {
                if row.aggregate_type.is_empty() {
                    return Err(TransformError::Permanent(ErrorDetail {
                        code: "empty-aggregate-type".into(),
                        message: "aggregate_type is empty, so there is no topic to route to".into(),
                    }));
                }
                let mut headers = Vec::with_capacity(row.headers.len() + 2);
                headers.extend(row.headers.iter().cloned());
                headers.push(("id".to_owned(), row.id.to_string().into_bytes()));
                headers.push(("event-type".to_owned(), row.event_type.as_bytes().to_vec()));
                let mut partition = None;
                placements.apply(&row.extra, &mut headers, &mut partition)?;
                // Kafka takes no timestamp before the epoch: such a row gets the producer's.
                let created_at_ms = row.created_at.timestamp_millis();
                Ok(vec![OutputMessage {
                    topic: format!("{topic_prefix}{}", row.aggregate_type),
                    key: Some(row.aggregate_id.as_bytes().to_vec()),
                    payload: Some(row.payload.clone()),
                    headers,
                    partition,
                    value_record: None,
                    key_record: None,
                    timestamp_ms: (created_at_ms >= 0).then_some(created_at_ms),
                }])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{ColumnValue, OutboxId, TenantId};

    fn header_pairs(headers: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
        headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect()
    }

    fn row() -> OutboxRow {
        OutboxRow {
            id: OutboxId::Int(7),
            tenant: TenantId::named("default"),
            aggregate_type: "order".into(),
            aggregate_id: "o-1".into(),
            event_type: "OrderCreated".into(),
            payload: br#"{"n":1}"#.to_vec(),
            headers: vec![("trace".into(), b"t1".to_vec())],
            created_at: chrono::Utc::now(),
            attempts: 0,
            extra: Vec::new(),
            replay: None,
        }
    }

    #[test]
    fn routes_like_the_reference_plugin() {
        let b = Builtin::configure(
            "route-by-aggregate",
            &[("topic_prefix".into(), "shop.".into())],
        )
        .unwrap();
        let out = b.transform(&row()).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].topic, "shop.order");
        assert_eq!(out[0].key.as_deref(), Some(&b"o-1"[..]));
        assert_eq!(out[0].payload.as_deref(), Some(&br#"{"n":1}"#[..]));
        let names: Vec<&str> = out[0].headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["trace", "id", "event-type"]);
        assert_eq!(
            out[0].timestamp_ms,
            Some(row().created_at.timestamp_millis()),
            "the row's created_at"
        );
    }

    /// A placement cannot forge the host's headers, whatever the alias's case: the output
    /// goes through the same stamping as a plugin's.
    #[test]
    fn a_placement_under_a_host_header_name_does_not_reach_consumers() {
        let b = Builtin::configure(
            "route-by-aggregate",
            &[(
                "additional_placement".into(),
                "region:header:sluice-outbox-id, region:header:SLUICE-TENANT, \
                 region:header:sluice-replay, region:header:x, region:header:x"
                    .into(),
            )],
        )
        .unwrap();
        let mut r = row();
        r.extra = vec![(Arc::from("region"), ColumnValue::Text("eu".into()))];
        let answer = b.transform(&r);
        let out = crate::plugin::output::accept(&Default::default(), &r, answer).unwrap();
        let headers = header_pairs(&out[0].headers);
        assert_eq!(
            headers,
            [
                ("trace", &b"t1"[..]),
                ("id", b"7"),
                ("event-type", b"OrderCreated"),
                ("x", b"eu"),
                ("x", b"eu"),
                ("sluice-tenant", b"default"),
                ("sluice-outbox-id", b"7"),
            ],
            "duplicates of the plugin's own kept, the host's replaced"
        );
    }

    #[test]
    fn extra_columns_are_placed_after_the_routing_headers() {
        let b = Builtin::configure(
            "route-by-aggregate",
            &[(
                "additional_placement".into(),
                "region:header,shard:partition,created_by:header:author".into(),
            )],
        )
        .unwrap();
        let mut r = row();
        r.extra = vec![
            (Arc::from("region"), ColumnValue::Text("eu".into())),
            (Arc::from("created_by"), ColumnValue::Text("ann".into())),
            (Arc::from("shard"), ColumnValue::Integer(1)),
        ];
        let out = b.transform(&r).unwrap();
        let headers = header_pairs(&out[0].headers);
        assert_eq!(
            headers[3..],
            [("region", &b"eu"[..]), ("author", &b"ann"[..])]
        );
        assert_eq!(out[0].partition, Some(1));
        r.extra.clear();
        assert!(matches!(b.transform(&r), Err(TransformError::Permanent(_))));
        let err = Builtin::configure(
            "route-by-aggregate",
            &[("additional_placement".into(), "region:envelope".into())],
        )
        .unwrap_err();
        assert!(err.contains("envelope"), "{err}");
    }

    #[test]
    fn unknown_names_and_keys_are_refused() {
        assert!(Builtin::check_name("route-by-nothing").is_err());
        let err =
            Builtin::configure("route-by-aggregate", &[("prefix".into(), "x".into())]).unwrap_err();
        assert!(err.contains("prefix"), "{err}");
    }

    #[test]
    fn default_prefix_and_empty_aggregate_type() {
        let b = Builtin::configure("route-by-aggregate", &[]).unwrap();
        assert_eq!(b.transform(&row()).unwrap()[0].topic, "outbox.event.order");
        let mut r = row();
        r.aggregate_type.clear();
        assert!(matches!(b.transform(&r), Err(TransformError::Permanent(_))));
    }
}
