//! The contract versions a component may be built against, and the conversions between an
//! older version's types and the current ones, both ways: the host's calls into a component and
//! its answers, and the component's calls to the host API (answered by [`super::host_api`] in
//! the current types). The rest of the host sees only the current types
//! ([`super::bindings::types`]). What an older version cannot say takes the value the host
//! assumed before it existed (0.1.0 messages name no record: the section's is used; 0.1.0 and
//! 0.2.0 messages carry no timestamp), and what it cannot hear is left out (the rows of 0.1.0
//! and 0.2.0 components have no extra columns).

use wasmtime::component::InstancePre;

use super::bindings::sluice::plugin::host;
use super::bindings::{self, types as wit, v0_1, v0_2};
use super::host_api::HostState;

/// The export every contract version's components have, `<package>/transformer@<version>`.
pub(crate) const CURRENT_EXPORT: &str = "sluice:plugin/transformer@0.3.0";
/// The exports of older versions the host still runs.
const V0_1_EXPORT: &str = "sluice:plugin/transformer@0.1.0";
const V0_2_EXPORT: &str = "sluice:plugin/transformer@0.2.0";

/// A linked component of one contract version, ready to instantiate.
pub(crate) enum Pre {
    Current(bindings::PluginPre<HostState>),
    V0_1(v0_1::PluginPre<HostState>),
    V0_2(v0_2::PluginPre<HostState>),
}

/// An instance's exports, of its contract version.
pub(crate) enum Exports {
    Current(bindings::Plugin),
    V0_1(v0_1::Plugin),
    V0_2(v0_2::Plugin),
}

impl Pre {
    /// Links `instance_pre` against the version whose transformer `export` names; `Err` says
    /// what was expected.
    pub(crate) fn new(
        instance_pre: InstancePre<HostState>,
        export: &str,
    ) -> Result<Self, (String, wasmtime::Error)> {
        let expected = || {
            format!(
                "does not export {CURRENT_EXPORT} (or {V0_2_EXPORT}, {V0_1_EXPORT}) as the world \
                 requires"
            )
        };
        match export {
            V0_1_EXPORT => v0_1::PluginPre::new(instance_pre).map(Pre::V0_1),
            V0_2_EXPORT => v0_2::PluginPre::new(instance_pre).map(Pre::V0_2),
            _ => bindings::PluginPre::new(instance_pre).map(Pre::Current),
        }
        .map_err(|e| (expected(), e))
    }

    /// Instantiates in `store`.
    pub(crate) fn instantiate(
        &self,
        store: &mut wasmtime::Store<HostState>,
    ) -> wasmtime::Result<Exports> {
        Ok(match self {
            Pre::Current(pre) => Exports::Current(pre.instantiate(store)?),
            Pre::V0_1(pre) => Exports::V0_1(pre.instantiate(store)?),
            Pre::V0_2(pre) => Exports::V0_2(pre.instantiate(store)?),
        })
    }
}

impl Exports {
    pub(crate) fn info(
        &self,
        store: &mut wasmtime::Store<HostState>,
    ) -> wasmtime::Result<wit::PluginInfo> {
        Ok(match self {
            Exports::Current(p) => p.sluice_plugin_transformer().call_info(store)?,
            Exports::V0_1(p) => info_v0_1(p.sluice_plugin_transformer().call_info(store)?),
            Exports::V0_2(p) => info_v0_2(p.sluice_plugin_transformer().call_info(store)?),
        })
    }

    pub(crate) fn configure(
        &self,
        store: &mut wasmtime::Store<HostState>,
        config: &[(&str, &str)],
    ) -> wasmtime::Result<Result<(), String>> {
        match self {
            Exports::Current(p) => p.sluice_plugin_transformer().call_configure(store, config),
            Exports::V0_1(p) => p.sluice_plugin_transformer().call_configure(store, config),
            Exports::V0_2(p) => p.sluice_plugin_transformer().call_configure(store, config),
        }
    }

    pub(crate) fn transform(
        &self,
        store: &mut wasmtime::Store<HostState>,
        row: wit::OutboxRow<'_>,
    ) -> wasmtime::Result<Answer> {
        Ok(match self {
            Exports::Current(p) => p.sluice_plugin_transformer().call_transform(store, row)?,
            Exports::V0_1(p) => answer_v0_1(
                p.sluice_plugin_transformer()
                    .call_transform(store, row_v0_1(&row))?,
            ),
            Exports::V0_2(p) => answer_v0_2(
                p.sluice_plugin_transformer()
                    .call_transform(store, row_v0_2(&row))?,
            ),
        })
    }

    pub(crate) fn transform_batch(
        &self,
        store: &mut wasmtime::Store<HostState>,
        rows: &[wit::OutboxRow<'_>],
    ) -> wasmtime::Result<Vec<Answer>> {
        Ok(match self {
            Exports::Current(p) => p
                .sluice_plugin_transformer()
                .call_transform_batch(store, rows)?,
            Exports::V0_1(p) => {
                let rows: Vec<v0_1::types::OutboxRow<'_>> = rows.iter().map(row_v0_1).collect();
                p.sluice_plugin_transformer()
                    .call_transform_batch(store, &rows)?
                    .into_iter()
                    .map(answer_v0_1)
                    .collect()
            }
            Exports::V0_2(p) => {
                let rows: Vec<v0_2::types::OutboxRow<'_>> = rows.iter().map(row_v0_2).collect();
                p.sluice_plugin_transformer()
                    .call_transform_batch(store, &rows)?
                    .into_iter()
                    .map(answer_v0_2)
                    .collect()
            }
        })
    }
}

/// The plugin's own answer for one row, in the current types.
pub(crate) type Answer = Result<Vec<wit::OutputMessage>, wit::TransformError>;

/// The row of an older contract: the current one without what that contract cannot carry
/// (the extra columns). One macro for both, as their row types are distinct but alike.
macro_rules! old_row {
    ($name:ident, $version:ident) => {
        fn $name<'a>(row: &wit::OutboxRow<'a>) -> $version::types::OutboxRow<'a> {
            $version::types::OutboxRow {
                id: row.id,
                tenant: row.tenant,
                aggregate_type: row.aggregate_type,
                aggregate_id: row.aggregate_id,
                event_type: row.event_type,
                payload: row.payload,
                headers: row.headers,
                created_at_ms: row.created_at_ms,
                attempt: row.attempt,
            }
        }
    };
}

old_row!(row_v0_1, v0_1);
old_row!(row_v0_2, v0_2);

/// An older contract's answer in the current types, given how one of its messages converts.
macro_rules! old_answer {
    ($name:ident, $version:ident, |$m:ident| $message:expr) => {
        fn $name(
            answer: Result<Vec<$version::types::OutputMessage>, $version::types::TransformError>,
        ) -> Answer {
            use $version::types::TransformError as Old;
            let detail = |d: $version::types::ErrorDetail| wit::ErrorDetail {
                code: d.code,
                message: d.message,
            };
            match answer {
                Ok(messages) => Ok(messages.into_iter().map(|$m| $message).collect()),
                Err(Old::Retryable(d)) => Err(wit::TransformError::Retryable(detail(d))),
                Err(Old::Permanent(d)) => Err(wit::TransformError::Permanent(detail(d))),
            }
        }
    };
}

old_answer!(answer_v0_1, v0_1, |m| wit::OutputMessage {
    topic: m.topic,
    key: m.key,
    payload: m.payload,
    headers: m.headers,
    partition: m.partition,
    value_record: None,
    key_record: None,
    timestamp_ms: None,
});

old_answer!(answer_v0_2, v0_2, |m| wit::OutputMessage {
    topic: m.topic,
    key: m.key,
    payload: m.payload,
    headers: m.headers,
    partition: m.partition,
    value_record: m.value_record,
    key_record: m.key_record,
    timestamp_ms: None,
});

fn info_v0_1(i: v0_1::types::PluginInfo) -> wit::PluginInfo {
    wit::PluginInfo {
        name: i.name,
        version: i.version,
        config_schema: i.config_schema,
        schemas: Vec::new(),
    }
}

fn info_v0_2(i: v0_2::types::PluginInfo) -> wit::PluginInfo {
    use v0_2::types::SchemaFormat as Old;
    wit::PluginInfo {
        name: i.name,
        version: i.version,
        config_schema: i.config_schema,
        schemas: i
            .schemas
            .into_iter()
            .map(|s| wit::RecordSchema {
                record_name: s.record_name,
                format: match s.format {
                    Old::Avro => wit::SchemaFormat::Avro,
                    Old::Protobuf => wit::SchemaFormat::Protobuf,
                    Old::JsonSchema => wit::SchemaFormat::JsonSchema,
                },
                schema: s.schema,
            })
            .collect(),
    }
}

/// Older components call the same host functions; their log levels are the current ones.
macro_rules! old_host {
    ($version:ident) => {
        impl $version::types::Host for HostState {}

        impl $version::sluice::plugin::host::Host for HostState {
            fn log(&mut self, level: $version::types::LogLevel, message: String) {
                use $version::types::LogLevel as Old;
                let level = match level {
                    Old::Trace => wit::LogLevel::Trace,
                    Old::Debug => wit::LogLevel::Debug,
                    Old::Info => wit::LogLevel::Info,
                    Old::Warn => wit::LogLevel::Warn,
                    Old::Error => wit::LogLevel::Error,
                };
                host::Host::log(self, level, message);
            }

            fn counter_add(&mut self, name: String, delta: u64) {
                host::Host::counter_add(self, name, delta);
            }
        }
    };
}

old_host!(v0_1);
old_host!(v0_2);
