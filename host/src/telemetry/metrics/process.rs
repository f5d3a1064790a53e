//! What the process is and what it uses: `sluice_build_info`, and `process_cpu_seconds_total`,
//! `process_resident_memory_bytes` and `process_start_time_seconds`, read from `/proc/self`
//! at scrape time (the names every Prometheus client library uses). On systems without
//! `/proc` the latter are left out.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::{Registry, Unit};

/// Linux's `USER_HZ` (clock ticks per second in `/proc/<pid>/stat`): 100 on every Linux ABI.
const TICKS_PER_SECOND: f64 = 100.0;
/// `/proc/self/statm` counts pages; 4 KiB on the platforms Sluice is built for.
const PAGE_SIZE: u64 = 4096;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    wasmtime: &'static str,
    librdkafka: String,
}

/// Registers `build_info` (into the `sluice` registry), with `librdkafka`'s version.
pub(super) fn register_build_info(r: &mut Registry, librdkafka: &str) {
    let build: Family<BuildLabels, Gauge> = Family::default();
    build
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
            wasmtime: "48",
            librdkafka: librdkafka.to_owned(),
        })
        .set(1);
    r.register(
        "build_info",
        "Sluice build: version, wasmtime and librdkafka",
        build,
    );
}

/// Registers the `process_*` families (into the unprefixed registry).
pub(super) fn register(r: &mut Registry) {
    r.register_collector(Box::new(ProcessCollector::default()));
}

/// Reads the `process_*` families at each scrape.
#[derive(Debug)]
struct ProcessCollector {
    started: f64,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_secs_f64();
        Self { started }
    }
}

/// User plus system CPU time of this process, from `/proc/self/stat`.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may contain spaces; fields after it are plain numbers.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime), numbered from 1; `fields[0]` is field 3.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_SECOND)
}

/// Resident set size, from `/proc/self/statm`.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * PAGE_SIZE)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(cpu) = cpu_seconds() {
            let counter = ConstCounter::new(cpu);
            let m = encoder.encode_descriptor(
                "process_cpu",
                "User and system CPU time spent",
                Some(&Unit::Seconds),
                counter.metric_type(),
            )?;
            counter.encode(m)?;
        }
        if let Some(rss) = resident_bytes() {
            let gauge = ConstGauge::new(i64::try_from(rss).unwrap_or(i64::MAX));
            let m = encoder.encode_descriptor(
                "process_resident_memory",
                "Resident memory size",
                Some(&Unit::Bytes),
                gauge.metric_type(),
            )?;
            gauge.encode(m)?;
        }
        let gauge = ConstGauge::new(self.started);
        let m = encoder.encode_descriptor(
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Some(&Unit::Seconds),
            gauge.metric_type(),
        )?;
        gauge.encode(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_cpu_and_memory() {
        assert!(cpu_seconds().is_some_and(|s| s >= 0.0));
        assert!(resident_bytes().is_some_and(|b| b > 0));
    }
}
