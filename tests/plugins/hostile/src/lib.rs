//! Test plugin that misbehaves on purpose, as chosen by config `mode`:
//!
//! - `loop`, `bomb`, `panic`, `forbidden`, `many`, `huge` attack the host's limits;
//! - `fs`, `env`, `socket`, `clock` try to reach outside the sandbox. If such an attempt
//!   *succeeds*, the plugin publishes what it found to `<topic_prefix>leak`, so a test sees
//!   the leak; if it fails, the row fails with a permanent error saying what was denied;
//! - `nul-error`, `huge-error` (4 MiB), `nul-topic`, `huge-topic` (1 MiB) put hostile text
//!   where the host stores and logs it;
//! - `sleep` sleeps an hour in `transform` (through WASI, so in a host call), and
//!   `sleep-configure` in `configure`; `fail-configure` rejects its config;
//! - `counters` adds to 100 counters with 1 MiB names per row, new names on every row; `fat` holds 8 MiB of
//!   touched memory from `configure` on; `large` emits one 512 KiB message per row;
//!   `log-flood` logs 200 lines of 1 MiB, then traps; `leak` never frees 256 KiB per row (as
//!   componentize-py guests never free what a call returns);
//! - `many-headers` (200,000 empty headers), `nul-header` (`sluice-tenant\0`),
//!   `case-header` (Unicode case variants of the host's header names, set to forged values)
//!   attack the host-stamped headers;
//! - `echo-secret` is careless with its `api_key`: logs it from `configure` and quotes it in
//!   every row's (permanent) error, where the host logs, stores and shows it;
//! - `missing-topic` routes to `<topic_prefix>missing`, inside its allow-list but absent from
//!   the broker; `short-batch` answers `transform-batch` with one result too few;
//! - `snoop` looks for other tenants' data in its linear memory: it reads every byte of it
//!   for markers (`SLUICE-SNOOP:<tenant>:`, 64 KiB of them back to back) that instances leave
//!   behind, publishes any of another tenant (with where it found it) to
//!   `<topic_prefix>leak`, then leaves 64 KiB of its own; its good message
//!   carries a header `seen-own` with how many of its own tenant it found (so a test sees
//!   that the scan finds what is there);
//! - `good` behaves: one message to `<topic_prefix>good` with the row's payload and an `id`
//!   header (as do `counters`, `fat`, `leak`, `case-header`, `short-batch` apart from their
//!   attack).

use std::time::Duration;

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError, counter_add, log};

struct Hostile {
    mode: String,
    prefix: String,
    /// `echo-secret`: the key it quotes.
    api_key: String,
    /// `fat`: memory held for the instance's lifetime.
    _ballast: Vec<u8>,
}

const HOUR: Duration = Duration::from_secs(3600);

impl Hostile {
    fn leak(&self, what: String) -> Result<Vec<Message>, TransformError> {
        Ok(vec![
            Message::to(format!("{}leak", self.prefix)).payload(what.into_bytes()),
        ])
    }

    fn good(&self, row: OutboxRow) -> Message {
        Message::to(format!("{}good", self.prefix))
            .key(row.aggregate_id.into_bytes())
            .payload(row.payload)
            .header("id", row.id.into_bytes())
    }
}

impl Plugin for Hostile {
    const NAME: &'static str = "test-hostile";
    const VERSION: &'static str = "0.1.0";

    fn configure(config: Config) -> Result<Self, String> {
        config.allow_only(&["mode", "topic_prefix", "api_key"])?;
        let mode = config.require("mode")?.to_owned();
        let mut ballast = Vec::new();
        match mode.as_str() {
            "sleep-configure" => std::thread::sleep(HOUR),
            "fail-configure" => return Err("hostile plugin rejects every config".into()),
            "echo-secret" => log::warn(&format!(
                "configured with api_key={}",
                config.get("api_key").unwrap_or_default()
            )),
            "fat" => {
                ballast = vec![1u8; 8 << 20];
                std::hint::black_box(&mut ballast);
            }
            _ => {}
        }
        Ok(Self {
            mode,
            prefix: config.require("topic_prefix")?.to_owned(),
            api_key: config.get("api_key").unwrap_or_default().to_owned(),
            _ballast: ballast,
        })
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        let denied = |code: &str, e: String| Err(TransformError::permanent(code, e));
        match self.mode.as_str() {
            "loop" => loop {
                std::hint::spin_loop();
            },
            "bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![7u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "panic" => panic!("hostile plugin panics on row {}", row.id),
            "forbidden" => Ok(vec![Message::to("forbidden.topic").payload(row.payload)]),
            "many" => Ok((0..5_000)
                .map(|i| Message::to(format!("{}good", self.prefix)).key(i.to_string()))
                .collect()),
            "huge" => Ok(vec![
                Message::to(format!("{}good", self.prefix)).payload(vec![b'x'; 2 << 20]),
            ]),
            "fs" => match std::fs::read_to_string("/etc/passwd") {
                Ok(text) => self.leak(text),
                Err(e) => denied("fs-denied", e.to_string()),
            },
            "env" => {
                let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
                if vars.is_empty() {
                    denied("env-denied", "no environment variables".into())
                } else {
                    self.leak(vars.join("\n"))
                }
            }
            "socket" => match std::net::TcpStream::connect("127.0.0.1:5432") {
                Ok(_) => self.leak("connected to 127.0.0.1:5432".into()),
                Err(e) => denied("socket-denied", e.to_string()),
            },
            "clock" => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                if secs > 1_000_000_000 {
                    self.leak(format!("the time is {secs}"))
                } else {
                    denied("clock-denied", format!("the clock reads {secs}"))
                }
            }
            "echo-secret" => denied(
                "upstream-refused",
                format!(
                    "upstream refused api key {} for row {}",
                    self.api_key, row.id
                ),
            ),
            "nul-error" => denied("nul\0code", format!("row {} has a NUL\0here", row.id)),
            "huge-error" => denied("huge-error", "e".repeat(4 << 20)),
            "nul-topic" => Ok(vec![
                Message::to(format!("{}good\0evil", self.prefix)).payload(row.payload),
            ]),
            "huge-topic" => Ok(vec![
                Message::to(format!("{}{}", self.prefix, "t".repeat(1 << 20))).payload(row.payload),
            ]),
            "sleep" => {
                std::thread::sleep(HOUR);
                Ok(vec![self.good(row)])
            }
            "counters" => {
                // 100 names per row, distinct across rows too (the row id is part of them).
                let mut name = format!("{}-", row.id).into_bytes();
                let stem = name.len();
                name.resize(1 << 20, b'c');
                for i in 0..100u8 {
                    name[stem] = b'a' + i % 26;
                    name[stem + 1] = b'a' + i / 26;
                    counter_add(std::str::from_utf8(&name).unwrap_or("c"), 1);
                }
                Ok(vec![self.good(row)])
            }
            "fat" | "good" => Ok(vec![self.good(row)]),
            "leak" => {
                let mut lost = vec![1u8; 256 << 10];
                std::hint::black_box(&mut lost);
                std::mem::forget(lost);
                Ok(vec![self.good(row)])
            }
            "large" => {
                let id = row.id.clone();
                Ok(vec![
                    Message::to(format!("{}good", self.prefix))
                        .payload(vec![b'l'; 512 << 10])
                        .header("id", id.into_bytes()),
                ])
            }
            "log-flood" => {
                let line = "f".repeat(1 << 20);
                for _ in 0..200 {
                    log::error(&line);
                }
                panic!("hostile plugin traps after flooding the log");
            }
            "many-headers" => {
                Ok(vec![self.good(row).headers(
                    (0..200_000).map(|_| (String::new(), Vec::new())),
                )])
            }
            "nul-header" => Ok(vec![self.good(row).header("sluice-tenant\0", "root")]),
            "case-header" => Ok(vec![
                self.good(row)
                    .header("\u{17f}luice-tenant", "root")
                    .header("SLU\u{130}CE-TENANT", "root")
                    .header("Sluice-Outbox-Id", "999"),
            ]),
            "missing-topic" => Ok(vec![
                Message::to(format!("{}missing", self.prefix))
                    .payload(row.payload)
                    .header("id", row.id.into_bytes()),
            ]),
            "short-batch" => Ok(vec![self.good(row)]),
            "snoop" => Ok(snoop(&self.prefix, row)),
            other => denied("bad-mode", format!("unknown mode {other}")),
        }
    }

    fn transform_batch(&self, rows: Vec<OutboxRow>) -> Vec<Result<Vec<Message>, TransformError>> {
        let mut results: Vec<_> = rows.into_iter().map(|row| self.transform(row)).collect();
        if self.mode == "short-batch" {
            results.pop();
        }
        results
    }
}

sluice_plugin_sdk::plugin!(Hostile);

/// `snoop`: see the module documentation.
fn snoop(prefix: &str, row: OutboxRow) -> Vec<Message> {
    // Built at run time, so the only whole markers in memory are the ones instances leave.
    let head = format!("{}{}", "SLUICE-", "SNOOP:");
    let own = row.tenant.clone();
    let mut found_own = 0usize;
    let mut others = Vec::new();
    let memory = memory_bytes();
    let mut at = 0;
    while let Some(pos) = find(&memory[at..], head.as_bytes()) {
        let start = at + pos + head.len();
        let name: Vec<u8> = memory[start..]
            .iter()
            .take(256)
            .take_while(|b| **b != b':')
            .copied()
            .collect();
        // A marker another instance left is one of a trail: `<head><name>:<head>…`. The
        // scan also meets this call's own `head` string, followed by whatever the allocator
        // put next (chunk headers, freed text): not a marker, so not a leak.
        let in_trail = memory.get(start + name.len()..).is_some_and(|rest| {
            rest.first() == Some(&b':') && rest[1..].starts_with(head.as_bytes())
        });
        if name == own.as_bytes() {
            found_own += 1;
        } else if !name.is_empty() && in_trail && !others.iter().any(|(n, _)| *n == name) {
            others.push((name, start));
        }
        at = start;
    }
    // Leave markers for whoever gets this memory next.
    let marker = format!("{head}{own}:");
    let mut trail = Vec::with_capacity(64 << 10);
    while trail.len() + marker.len() <= 64 << 10 {
        trail.extend_from_slice(marker.as_bytes());
    }
    std::mem::forget(trail);
    let mut out = Vec::new();
    if !others.is_empty() {
        let found: Vec<String> = others
            .iter()
            .map(|(name, at)| format!("{} at {at}", String::from_utf8_lossy(name)))
            .collect();
        out.push(Message::to(format!("{prefix}leak")).payload(found.join(",").into_bytes()));
    }
    out.push(
        Message::to(format!("{prefix}good"))
            .key(row.aggregate_id.into_bytes())
            .payload(row.payload)
            .header("id", row.id.into_bytes())
            .header("seen-own", found_own.to_string().into_bytes()),
    );
    out
}

/// The whole linear memory, as this instance can read it.
fn memory_bytes() -> Vec<u8> {
    #[cfg(target_arch = "wasm32")]
    {
        let size = core::arch::wasm32::memory_size(0) * 65536;
        // Address 0 is valid in wasm linear memory; read it without forming a null reference.
        let mut copy = vec![0u8; size];
        for (i, byte) in copy.iter_mut().enumerate() {
            // SAFETY: every address below memory_size is in bounds of linear memory.
            *byte = unsafe { core::ptr::read_volatile(i as *const u8) };
        }
        copy
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        Vec::new()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
