//! Sandbox limits of one tenant instance, resolved from config; the wasmtime resource limiter
//! that enforces the memory cap across every memory, table and instance of a `wasmtime::Store`; and
//! the topic allow-list.

use std::time::Duration;

use wasmtime::ResourceLimiter;

use crate::plugin::settings::{
    DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_FAILURES, DEFAULT_CALL_TIMEOUT,
    DEFAULT_MAX_BATCH_OUTPUT_BYTES, DEFAULT_MAX_HEADERS_PER_MESSAGE, DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_OUTPUTS_PER_ROW, DEFAULT_MEMORY_MB, DEFAULT_RECYCLE_MEMORY_PERCENT, LimitsSpec,
};

/// Core module instances one `wasmtime::Store` may create. A Rust component has a handful; a
/// componentize-py one a few dozen (one per linked library plus shims).
pub const MAX_INSTANCES: usize = 200;
/// Linear memories one `wasmtime::Store` may create (components share one memory between their
/// modules; adapters may add one or two).
pub const MAX_MEMORIES: usize = 20;
/// Tables one `wasmtime::Store` may create.
pub const MAX_TABLES: usize = 200;
/// Table elements, summed over every table of a `wasmtime::Store`: each costs the host a pointer or
/// two, outside the linear-memory cap. CPython's function table has some tens of thousands.
pub const MAX_TABLE_ELEMENTS: usize = 1_000_000;

/// Limits applied to one tenant's `wasmtime::Store` and to what its plugin may emit.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Linear memory of the whole `wasmtime::Store` (every memory of every instance together).
    pub memory_bytes: usize,
    /// Wall-clock budget of one call or instantiation (`call_timeout`, default 500 ms).
    pub call_timeout: Duration,
    /// Share of `memory_bytes` past which the instance is replaced between calls (100: never).
    pub recycle_memory_percent: u8,
    /// `None` = any topic.
    pub allowed_topics: Option<Vec<TopicPattern>>,
    /// Most messages one row may produce (`max_outputs_per_row`, default 100).
    pub max_outputs_per_row: usize,
    /// Largest message, key + payload + headers, in bytes (`max_message_bytes`, default 1 MiB).
    pub max_message_bytes: usize,
    /// Most plugin-set headers per message (`max_headers_per_message`, default 100).
    pub max_headers_per_message: usize,
    /// Bytes of accepted messages per tenant and batch; also bounds what one call may make
    /// the host copy out of the guest (see [`Limits::copy_budget`]).
    pub max_batch_output_bytes: usize,
    /// Consecutive failures that open the circuit breaker (`circuit_breaker_failures`, default 5).
    pub breaker_failures: u32,
    /// How long an open breaker pauses the tenant (`circuit_breaker_cooldown`, default 30 s).
    pub breaker_cooldown: Duration,
    /// How the tenant's rows are grouped into plugin calls.
    pub batching: CallBatching,
}

/// Successful single-row calls after which an instance's rows go to `transform-batch`: a
/// plugin proves itself row by row first, so a broken one (a spinning plugin, say) fails on
/// one row and one `call_timeout`, not on a whole chunk first.
pub const BATCH_CALLS_AFTER: u32 = 64;
/// Most rows handed to one `transform-batch` call in the relay.
pub const MAX_BATCH_ROWS: usize = 64;

/// How a tenant's rows are grouped into plugin calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallBatching {
    /// Successful single-row calls before rows go to `transform-batch` (0: from the start).
    pub probation: u32,
    /// Most rows per `transform-batch` call; 1: `transform` only.
    pub max_rows: usize,
}

impl CallBatching {
    /// What `sluice run` does: row by row for [`BATCH_CALLS_AFTER`] rows, then chunks of up
    /// to [`MAX_BATCH_ROWS`].
    pub const RELAY: Self = Self {
        probation: BATCH_CALLS_AFTER,
        max_rows: MAX_BATCH_ROWS,
    };

    /// `rows` rows per call from the first row on (`sluice plugin test --batch-size`).
    pub fn fixed(rows: usize) -> Self {
        Self {
            probation: 0,
            max_rows: rows.max(1),
        }
    }
}

impl Limits {
    /// Resolves a (validated) spec, filling unset fields with Sluice's defaults.
    pub fn resolve(spec: &LimitsSpec) -> Result<Self, String> {
        let memory_mb = spec.memory_mb.unwrap_or(DEFAULT_MEMORY_MB);
        let memory_bytes = usize::try_from(memory_mb.saturating_mul(1024 * 1024))
            .map_err(|_| format!("memory_mb {memory_mb} is too large"))?;
        let allowed_topics = spec
            .allowed_topics
            .as_ref()
            .map(|patterns| patterns.iter().map(|p| TopicPattern::parse(p)).collect())
            .transpose()?;
        Ok(Self {
            memory_bytes,
            call_timeout: spec.call_timeout.unwrap_or(DEFAULT_CALL_TIMEOUT),
            recycle_memory_percent: spec
                .recycle_memory_percent
                .unwrap_or(DEFAULT_RECYCLE_MEMORY_PERCENT),
            allowed_topics,
            max_outputs_per_row: spec
                .max_outputs_per_row
                .unwrap_or(DEFAULT_MAX_OUTPUTS_PER_ROW),
            max_message_bytes: spec.max_message_bytes.unwrap_or(DEFAULT_MAX_MESSAGE_BYTES),
            max_headers_per_message: spec
                .max_headers_per_message
                .unwrap_or(DEFAULT_MAX_HEADERS_PER_MESSAGE),
            max_batch_output_bytes: spec
                .max_batch_output_bytes
                .unwrap_or(DEFAULT_MAX_BATCH_OUTPUT_BYTES),
            breaker_failures: spec
                .circuit_breaker_failures
                .unwrap_or(DEFAULT_BREAKER_FAILURES),
            breaker_cooldown: spec
                .circuit_breaker_cooldown
                .unwrap_or(DEFAULT_BREAKER_COOLDOWN),
            batching: spec
                .call_batch_rows
                .map_or(CallBatching::RELAY, CallBatching::fixed),
        })
    }

    /// Memory past which an instance is replaced between calls; at or above the cap when
    /// replacement is off (the cap traps first).
    pub fn recycle_memory_bytes(&self) -> usize {
        match self.recycle_memory_percent {
            p if p >= 100 => usize::MAX,
            p => self.memory_bytes / 100 * usize::from(p),
        }
    }

    /// A fresh resource limiter for a new `wasmtime::Store`.
    pub fn limiter(&self) -> TenantLimiter {
        TenantLimiter::new(self.memory_bytes)
    }

    /// Bytes the host may copy out of the guest in one call (its results, or the arguments of
    /// one `log`/`counter-add`): wasmtime's "hostcall fuel". Twice the batch output budget, so
    /// a row that fits the budget always lifts (the fuel also counts the host's per-element
    /// overhead); a guest that returns one buffer a thousand times over fails the call before
    /// the host allocates the copies.
    pub fn copy_budget(&self) -> usize {
        self.max_batch_output_bytes
            .saturating_mul(2)
            .max(MIN_COPY_BUDGET)
    }

    /// Whether `allowed_topics` lets the plugin route to `topic`.
    pub fn topic_allowed(&self, topic: &str) -> bool {
        match &self.allowed_topics {
            None => true,
            Some(patterns) => patterns.iter().any(|p| p.matches(topic)),
        }
    }
}

/// Floor of [`Limits::copy_budget`]: error messages, log lines and `info()` must always fit.
const MIN_COPY_BUDGET: usize = 1024 * 1024;

impl Default for Limits {
    fn default() -> Self {
        // The default spec always resolves.
        Self::resolve(&LimitsSpec::default()).unwrap_or(Self {
            memory_bytes: 0,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            recycle_memory_percent: DEFAULT_RECYCLE_MEMORY_PERCENT,
            allowed_topics: None,
            max_outputs_per_row: DEFAULT_MAX_OUTPUTS_PER_ROW,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_headers_per_message: DEFAULT_MAX_HEADERS_PER_MESSAGE,
            max_batch_output_bytes: DEFAULT_MAX_BATCH_OUTPUT_BYTES,
            breaker_failures: DEFAULT_BREAKER_FAILURES,
            breaker_cooldown: DEFAULT_BREAKER_COOLDOWN,
            batching: CallBatching::RELAY,
        })
    }
}

/// Why the limiter refused to grow something; the call traps with this as its reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    /// Linear memory would pass the cap, given in bytes.
    #[error("plugin exceeded its memory limit of {} MiB (all its linear memories together)", .0 / (1024 * 1024))]
    Memory(usize),
    /// Table elements would pass [`MAX_TABLE_ELEMENTS`].
    #[error("plugin exceeded the limit of {MAX_TABLE_ELEMENTS} table elements")]
    TableElements,
}

/// wasmtime's `StoreLimits` bound each linear memory on its own; a component may declare many
/// memories, tables and instances. This limiter caps the `wasmtime::Store`'s total, and a refused
/// growth traps (instead of `memory.grow` returning -1) so a runaway guest stops with a clear
/// reason.
#[derive(Debug)]
pub struct TenantLimiter {
    memory_cap: usize,
    memory_used: usize,
    table_elements_used: usize,
    /// Growth allowed by the last `*_growing` call, taken back if the growth then failed.
    pending_memory: usize,
    pending_elements: usize,
}

impl TenantLimiter {
    /// A limiter allowing `memory_cap` bytes of linear memory in total.
    pub fn new(memory_cap: usize) -> Self {
        Self {
            memory_cap,
            memory_used: 0,
            table_elements_used: 0,
            pending_memory: 0,
            pending_elements: 0,
        }
    }

    /// Linear memory bytes of the `wasmtime::Store` so far.
    pub fn memory_used(&self) -> usize {
        self.memory_used
    }
}

impl ResourceLimiter for TenantLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current);
        let total = self.memory_used.saturating_add(growth);
        if total > self.memory_cap {
            return Err(wasmtime::Error::new(LimitExceeded::Memory(self.memory_cap)));
        }
        if maximum.is_some_and(|max| desired > max) {
            // The module's own maximum: an ordinary failed `memory.grow` (-1).
            return Ok(false);
        }
        self.memory_used = total;
        self.pending_memory = growth;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        // Allowed by us, refused by the system: undo the accounting and trap with its reason.
        self.memory_used = self.memory_used.saturating_sub(self.pending_memory);
        self.pending_memory = 0;
        Err(error.context("growing the plugin's memory failed"))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current);
        let total = self.table_elements_used.saturating_add(growth);
        if total > MAX_TABLE_ELEMENTS {
            return Err(wasmtime::Error::new(LimitExceeded::TableElements));
        }
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        self.table_elements_used = total;
        self.pending_elements = growth;
        Ok(true)
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.table_elements_used = self
            .table_elements_used
            .saturating_sub(self.pending_elements);
        self.pending_elements = 0;
        Ok(())
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

/// An exact topic name, or `prefix*` (conventionally `prefix.*`) matching every topic that
/// starts with `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicPattern {
    /// Matches this topic only.
    Exact(String),
    /// Matches topics starting with this (the pattern without its `*`).
    Prefix(String),
}

impl TopicPattern {
    /// Parses an `allowed_topics` entry; refuses empty patterns, inner `*` and non-topic characters.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let invalid = |why: &str| format!("invalid topic pattern {pattern:?}: {why}");
        if pattern.is_empty() {
            return Err(invalid("empty"));
        }
        let (body, prefix) = match pattern.strip_suffix('*') {
            Some(body) => (body, true),
            None => (pattern, false),
        };
        if body.contains('*') {
            return Err(invalid("'*' is only allowed at the end"));
        }
        if !body
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(invalid(
                "topics use only ASCII letters, digits, '.', '_' and '-'",
            ));
        }
        Ok(if prefix {
            Self::Prefix(body.to_owned())
        } else {
            Self::Exact(body.to_owned())
        })
    }

    /// Whether `topic` matches.
    pub fn matches(&self, topic: &str) -> bool {
        match self {
            Self::Exact(t) => t == topic,
            Self::Prefix(p) => topic.starts_with(p.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::Engine;
    use wasmtime::component::{Component, Linker};

    /// Instantiates an inline WAT component in a `wasmtime::Store` limited to `memory_cap` bytes.
    fn instantiate(wat: &str, memory_cap: usize) -> wasmtime::Result<()> {
        let engine = Engine::default();
        let component = Component::new(&engine, wat)?;
        let mut wasm_store = wasmtime::Store::new(&engine, TenantLimiter::new(memory_cap));
        wasm_store.limiter(|limiter| limiter);
        Linker::new(&engine).instantiate(&mut wasm_store, &component)?;
        Ok(())
    }

    const MIB: usize = 1024 * 1024;
    /// One core module with a 10 MiB memory (160 pages of 64 KiB).
    const TEN_MIB_MODULE: &str = "(core module $m (memory 160))";

    #[test]
    fn the_memory_cap_counts_every_memory_of_the_store() {
        let one = format!("(component {TEN_MIB_MODULE} (core instance (instantiate $m)))");
        instantiate(&one, 16 * MIB).unwrap();
        // Two memories of 10 MiB each: each under the cap, together over it.
        let two = format!(
            "(component {TEN_MIB_MODULE} (core instance (instantiate $m)) (core instance (instantiate $m)))"
        );
        let err = instantiate(&two, 16 * MIB).unwrap_err();
        assert!(
            format!("{err:#}").contains("memory limit of 16 MiB"),
            "{err:#}"
        );
        instantiate(&two, 32 * MIB).unwrap();
    }

    #[test]
    fn instances_memories_and_tables_are_counted() {
        let many = |module: &str, n: usize| {
            let instances = "(core instance (instantiate $m))".repeat(n);
            format!("(component (core module $m {module}) {instances})")
        };
        instantiate(&many("", MAX_INSTANCES), MIB).unwrap();
        assert!(instantiate(&many("", MAX_INSTANCES + 1), MIB).is_err());
        let small_memory = "(memory 0)";
        instantiate(&many(small_memory, MAX_MEMORIES), MIB).unwrap();
        assert!(instantiate(&many(small_memory, MAX_MEMORIES + 1), MIB).is_err());
        let table = "(table 1 funcref)";
        instantiate(&many(table, MAX_TABLES), MIB).unwrap();
        assert!(instantiate(&many(table, MAX_TABLES + 1), MIB).is_err());
    }

    #[test]
    fn table_elements_are_capped_across_tables() {
        let half = MAX_TABLE_ELEMENTS / 2 + 1;
        let wat = format!(
            "(component (core module $m (table {half} funcref)) \
             (core instance (instantiate $m)) (core instance (instantiate $m)))"
        );
        let err = instantiate(&wat, MIB).unwrap_err();
        assert!(format!("{err:#}").contains("table elements"), "{err:#}");
    }

    #[test]
    fn exact_and_prefix_patterns_match_as_documented() {
        let p = TopicPattern::parse("acme.*").unwrap();
        assert!(p.matches("acme.orders"));
        assert!(!p.matches("acmeorders"));
        assert!(!p.matches("other.acme.x"));
        let e = TopicPattern::parse("audit").unwrap();
        assert!(e.matches("audit"));
        assert!(!e.matches("audit2"));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        for bad in ["", "a*b", "**", "a b", "a/b"] {
            assert!(TopicPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unset_allow_list_allows_everything_and_defaults_apply() {
        let limits = Limits::resolve(&LimitsSpec::default()).unwrap();
        assert!(limits.topic_allowed("anything"));
        assert_eq!(limits.call_timeout, DEFAULT_CALL_TIMEOUT);
        assert_eq!(limits.memory_bytes as u64, DEFAULT_MEMORY_MB * 1024 * 1024);
    }

    #[test]
    fn the_recycle_threshold_is_a_share_of_the_memory_cap() {
        let limits = Limits::resolve(&LimitsSpec {
            memory_mb: Some(100),
            ..LimitsSpec::default()
        })
        .unwrap();
        assert_eq!(limits.recycle_memory_bytes(), 75 * 1024 * 1024);
        let off = Limits {
            recycle_memory_percent: 100,
            ..limits
        };
        assert_eq!(off.recycle_memory_bytes(), usize::MAX);
    }

    #[test]
    fn allow_list_restricts_topics() {
        let spec = LimitsSpec {
            allowed_topics: Some(vec!["acme.*".into(), "audit".into()]),
            ..LimitsSpec::default()
        };
        let limits = Limits::resolve(&spec).unwrap();
        assert!(limits.topic_allowed("acme.x"));
        assert!(limits.topic_allowed("audit"));
        assert!(!limits.topic_allowed("outbox.event.x"));
    }
}
