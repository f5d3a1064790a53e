//! Names unique to one benchmark run, so scenarios never see rows or messages of an earlier
//! run (Tansu keeps topics for as long as it runs).

use std::time::{SystemTime, UNIX_EPOCH};

/// `<pid>_<seconds since epoch mod 10^7>`.
fn run_id() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() % 10_000_000)
        .unwrap_or(0);
    format!("{}_{secs}", std::process::id())
}

/// An outbox table name such as `sluice_bench_drain_wasm_4242_1234567`.
pub(crate) fn table(stem: &str) -> String {
    format!("sluice_bench_{stem}_{}", run_id())
}

/// A topic prefix such as `bench.drain_wasm.4242_1234567.`.
pub(crate) fn topic_prefix(stem: &str) -> String {
    format!("bench.{stem}.{}.", run_id())
}
