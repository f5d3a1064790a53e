//! Sandbox limits of one tenant instance, resolved from config; the wasmtime resource limiter
//! that enforces the memory cap across every memory, table and instance of a `wasmtime::Store`; and
//! the topic allow-list.

use std::time::Duration;

use wasmtime::ResourceLimiter;

use crate::setting_group::{Humantime, above_zero, at_least_one, setting_group};

setting_group! {
    /// A plugin section's sandbox limits as written (`[plugins.default]`, `[tenants.<name>]`);
    /// unset keys inherit from `[plugins.default]` (`allowed_topics` only for a tenant that
    /// runs the default plugin: [`PluginSpec::inherit`](crate::plugin::PluginSpec::inherit)),
    /// then take the defaults here. The defaults' reasons: `memory_mb` — Python/JS guests need
    /// tens of MiB at start-up; `recycle_memory_percent` — runtimes that leak (componentize-py
    /// 0.24/0.25 never frees what a call returns) are renewed before they reach the cap, trap
    /// and fail a row; `call_timeout` — a Rust `transform` takes microseconds, this only stops
    /// runaway guests; `max_outputs_per_row` — a runaway fan-out must not flood the broker;
    /// `max_message_bytes` — Kafka's own default `message.max.bytes` is 1 MiB;
    /// `max_headers_per_message` — each header costs the producer and every consumer an
    /// allocation; `max_batch_output_bytes` — a fan-out-heavy tenant cannot hold the relay's
    /// memory for everyone.
    pub struct LimitsSpec => LimitValues {
        /// Linear memory cap of each tenant instance, all of its memories together; growing past it traps.
        memory_mb: u64 = 128 => "`128`", check above_zero;
        /// Wall-clock budget of one plugin call (instantiation, `configure`, `transform`, … — time spent waiting in host calls such as sleeps included), and the tenant's time budget per batch: rows left when it is used up are put back for the next batch. A call that runs into it also pauses the tenant at once (circuit breaker).
        call_timeout: Duration as Humantime = Duration::from_millis(500) => "`\"500ms\"`", check above_zero;
        /// After a call, an instance whose memory has grown past this share of `memory_mb` is replaced by a fresh one (configured again) before the next row, so plugins whose runtime leaks (componentize-py) or only grows are renewed before they trap. Not for an instance that started above it. 1–100; `100` turns it off ([plugins.md](plugins.md#the-sandbox-and-its-limits)).
        recycle_memory_percent: u8 = 75 => "`75`", check percent;
        /// Topics the plugin may route to: exact names or `prefix*` patterns such as `"acme.*"` (`["*"]`: any topic). A message to another topic fails its row. Not taken by a tenant with its own plugin ([below](#tenantsname)).
        allowed_topics: Vec<String> => "any topic", check topic_patterns;
        /// Messages one row may produce; more fails the row.
        max_outputs_per_row: usize = 100 => "`100`";
        /// Largest message a plugin may produce, counting key + payload + each header's name and value + 32 bytes per header; larger fails the row.
        max_message_bytes: usize = 1024 * 1024 => "`1048576`", check above_zero;
        /// Headers one message may carry (the host's `sluice-tenant` and `sluice-outbox-id` come on top); more fails the row. At most 10000.
        max_headers_per_message: usize = 100 => "`100`", check at_most_max_headers;
        /// Bytes of messages the tenant's rows may produce in one batch; rows past it are put back untouched for the next batch (the first row always passes). Twice this is also the most the host copies out of the plugin for one call; a call returning more fails as a trap.
        max_batch_output_bytes: usize = 64 * 1024 * 1024 => "`67108864` (64 MiB)", check above_zero;
        /// Consecutive failures of the tenant's plugin instance (trap, memory cap, `retryable` error, failed instantiation) — or consecutive rows whose publish the broker refused (missing topic, too large) — after which the tenant is paused. A row's own `permanent` error or refused output does not count.
        circuit_breaker_failures: u32 = 5 => "`5`", check at_least_one;
        /// How long a paused tenant's rows are skipped before one row is tried again.
        circuit_breaker_cooldown: Duration as Humantime = Duration::from_secs(30) => "`\"30s\"`";
    }
}

/// Highest `max_headers_per_message` accepted: librdkafka-based consumers handle tens of
/// thousands, but every header is an allocation on each of them.
pub const MAX_HEADERS_PER_MESSAGE: usize = 10_000;

fn percent(value: &u8) -> Result<(), String> {
    match value {
        1..=100 => Ok(()),
        p => Err(format!("must be 1 to 100 (100: never replace), got {p}")),
    }
}

fn at_most_max_headers(value: &usize) -> Result<(), String> {
    match *value {
        n if n > MAX_HEADERS_PER_MESSAGE => Err(format!(
            "must be at most {MAX_HEADERS_PER_MESSAGE}, got {n}"
        )),
        _ => Ok(()),
    }
}

fn topic_patterns(patterns: &[String]) -> Result<(), String> {
    patterns
        .iter()
        .try_for_each(|p| TopicPattern::parse(p).map(drop))
}

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
    /// The broker the tenant's messages go to (its section's `broker`): which destination
    /// names are legal depends on it.
    pub broker: crate::model::Broker,
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
    /// Resolves (validated) limits, filling unset keys with Sluice's defaults; `call_batch_rows`:
    /// fixed rows per call (`plugin test --batch-size`), `None`: the relay's batching.
    pub fn resolve(spec: &LimitsSpec, call_batch_rows: Option<usize>) -> Result<Self, String> {
        let values = spec.values();
        let memory_mb = values.memory_mb;
        let memory_bytes = usize::try_from(memory_mb.saturating_mul(1024 * 1024))
            .map_err(|_| format!("memory_mb {memory_mb} is too large"))?;
        let allowed_topics = values
            .allowed_topics
            .as_ref()
            .map(|patterns| patterns.iter().map(|p| TopicPattern::parse(p)).collect())
            .transpose()?;
        let batching = call_batch_rows.map_or(CallBatching::RELAY, CallBatching::fixed);
        Ok(Self::with(values, memory_bytes, allowed_topics, batching))
    }

    fn with(
        values: LimitValues,
        memory_bytes: usize,
        allowed_topics: Option<Vec<TopicPattern>>,
        batching: CallBatching,
    ) -> Self {
        Self {
            memory_bytes,
            call_timeout: values.call_timeout,
            recycle_memory_percent: values.recycle_memory_percent,
            allowed_topics,
            max_outputs_per_row: values.max_outputs_per_row,
            max_message_bytes: values.max_message_bytes,
            max_headers_per_message: values.max_headers_per_message,
            max_batch_output_bytes: values.max_batch_output_bytes,
            breaker_failures: values.circuit_breaker_failures,
            breaker_cooldown: values.circuit_breaker_cooldown,
            broker: crate::model::Broker::default(),
            batching,
        }
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
        let values = LimitValues::default();
        let memory_bytes = usize::try_from(values.memory_mb.saturating_mul(1024 * 1024));
        Self::with(
            values,
            memory_bytes.unwrap_or(usize::MAX),
            None,
            CallBatching::RELAY,
        )
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
        if !body.chars().all(crate::sink::destination_char) {
            return Err(invalid(
                "topics use only ASCII letters, digits, '.', '_', '-' (and ':' and '/' for \
                 RabbitMQ routing keys and Redis stream keys)",
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
        for bad in ["", "a*b", "**", "a b", "a#b", "a>b", "é"] {
            assert!(TopicPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unset_allow_list_allows_everything_and_defaults_apply() {
        let limits = Limits::resolve(&LimitsSpec::default(), None).unwrap();
        assert!(limits.topic_allowed("anything"));
        assert_eq!(limits.call_timeout, Duration::from_millis(500));
        assert_eq!(limits.memory_bytes, 128 * 1024 * 1024);
    }

    #[test]
    fn the_recycle_threshold_is_a_share_of_the_memory_cap() {
        let limits = Limits::resolve(
            &LimitsSpec {
                memory_mb: Some(100),
                ..LimitsSpec::default()
            },
            None,
        )
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
        let limits = Limits::resolve(&spec, None).unwrap();
        assert!(limits.topic_allowed("acme.x"));
        assert!(limits.topic_allowed("audit"));
        assert!(!limits.topic_allowed("outbox.event.x"));
    }
}
