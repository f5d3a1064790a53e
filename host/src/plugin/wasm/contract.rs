//! The contract versions a component may be built against, and the conversions between an
//! older version's types and the current ones, both ways: the host's calls into a component and
//! its answers, and the component's calls to the host API (answered by [`super::host_api`] in
//! the current types). The rest of the host sees only the current types
//! ([`super::bindings::types`]). What an older version cannot say takes the value the host
//! assumed before it existed (0.1.0 messages name no record: the section's is used).

use wasmtime::component::InstancePre;

use super::bindings::sluice::plugin::host;
use super::bindings::{self, types as wit, v0_1};
use super::host_api::HostState;

/// The export every contract version's components have, `<package>/transformer@<version>`.
pub(crate) const CURRENT_EXPORT: &str = "sluice:plugin/transformer@0.2.0";
/// The exports of older versions the host still runs.
const V0_1_EXPORT: &str = "sluice:plugin/transformer@0.1.0";

/// A linked component of one contract version, ready to instantiate.
pub(crate) enum Pre {
    Current(bindings::PluginPre<HostState>),
    V0_1(v0_1::PluginPre<HostState>),
}

/// An instance's exports, of its contract version.
pub(crate) enum Exports {
    Current(bindings::Plugin),
    V0_1(v0_1::Plugin),
}

impl Pre {
    /// Links `instance_pre` against the version whose transformer `export` names; `Err` says
    /// what was expected.
    pub(crate) fn new(
        instance_pre: InstancePre<HostState>,
        export: &str,
    ) -> Result<Self, (String, wasmtime::Error)> {
        let expected =
            || format!("does not export {CURRENT_EXPORT} (or {V0_1_EXPORT}) as the world requires");
        if export == V0_1_EXPORT {
            v0_1::PluginPre::new(instance_pre)
                .map(Pre::V0_1)
                .map_err(|e| (expected(), e))
        } else {
            bindings::PluginPre::new(instance_pre)
                .map(Pre::Current)
                .map_err(|e| (expected(), e))
        }
    }

    /// Instantiates in `store`.
    pub(crate) fn instantiate(
        &self,
        store: &mut wasmtime::Store<HostState>,
    ) -> wasmtime::Result<Exports> {
        Ok(match self {
            Pre::Current(pre) => Exports::Current(pre.instantiate(store)?),
            Pre::V0_1(pre) => Exports::V0_1(pre.instantiate(store)?),
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
            Exports::V0_1(p) => info(p.sluice_plugin_transformer().call_info(store)?),
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
        }
    }

    pub(crate) fn transform(
        &self,
        store: &mut wasmtime::Store<HostState>,
        row: wit::OutboxRow<'_>,
    ) -> wasmtime::Result<Answer> {
        Ok(match self {
            Exports::Current(p) => p.sluice_plugin_transformer().call_transform(store, row)?,
            Exports::V0_1(p) => answer(
                p.sluice_plugin_transformer()
                    .call_transform(store, row_v0_1(&row))?,
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
                    .map(answer)
                    .collect()
            }
        })
    }
}

/// The plugin's own answer for one row, in the current types.
pub(crate) type Answer = Result<Vec<wit::OutputMessage>, wit::TransformError>;

fn row_v0_1<'a>(row: &wit::OutboxRow<'a>) -> v0_1::types::OutboxRow<'a> {
    v0_1::types::OutboxRow {
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

fn answer(answer: Result<Vec<v0_1::types::OutputMessage>, v0_1::types::TransformError>) -> Answer {
    match answer {
        Ok(messages) => Ok(messages
            .into_iter()
            .map(|m| wit::OutputMessage {
                topic: m.topic,
                key: m.key,
                payload: m.payload,
                headers: m.headers,
                partition: m.partition,
                value_record: None,
                key_record: None,
            })
            .collect()),
        Err(v0_1::types::TransformError::Retryable(d)) => {
            Err(wit::TransformError::Retryable(detail(d)))
        }
        Err(v0_1::types::TransformError::Permanent(d)) => {
            Err(wit::TransformError::Permanent(detail(d)))
        }
    }
}

fn detail(d: v0_1::types::ErrorDetail) -> wit::ErrorDetail {
    wit::ErrorDetail {
        code: d.code,
        message: d.message,
    }
}

fn info(i: v0_1::types::PluginInfo) -> wit::PluginInfo {
    wit::PluginInfo {
        name: i.name,
        version: i.version,
        config_schema: i.config_schema,
        schemas: Vec::new(),
    }
}

impl v0_1::types::Host for HostState {}

/// 0.1.0 components call the same host functions.
impl v0_1::sluice::plugin::host::Host for HostState {
    fn log(&mut self, level: v0_1::types::LogLevel, message: String) {
        host::Host::log(self, log_level(level), message);
    }

    fn counter_add(&mut self, name: String, delta: u64) {
        host::Host::counter_add(self, name, delta);
    }
}

/// 0.1.0's log levels as the current ones.
fn log_level(level: v0_1::types::LogLevel) -> wit::LogLevel {
    use v0_1::types::LogLevel as Old;
    match level {
        Old::Trace => wit::LogLevel::Trace,
        Old::Debug => wit::LogLevel::Debug,
        Old::Info => wit::LogLevel::Info,
        Old::Warn => wit::LogLevel::Warn,
        Old::Error => wit::LogLevel::Error,
    }
}
