//! Test plugin written against the canonical ABI directly (no SDK), for attacks the SDK cannot
//! express:
//!
//! - `transform` (and `transform-batch`) return 100,000 messages that all point at the *same*
//!   1 MiB payload buffer in linear memory: 5 MiB of guest memory that a naive host would copy
//!   into 100 GiB ("lift amplification");
//! - `info` sleeps for an hour (through WASI, so inside a host call), which hangs
//!   `sluice plugin check` unless the host bounds the call in wall-clock time.
//!
//! - `configure` sleeps for an hour when its config has a `topic_prefix` key — so this file,
//!   dropped in for a plugin configured with one, hangs a hot reload in `configure` — and
//!   accepts any other config.
//!
//! wit-bindgen is used only for the component type (the
//! world's description that turns this module into a component) and `cabi_realloc`; the four
//! `sluice:plugin/transformer` exports are hand-written below. Canonical ABI layouts used
//! (32-bit): `output-message` is 48 bytes (topic 0..8, key option 8..20, payload option
//! 20..32, headers 32..40, partition option 40..48); `result<list<output-message>,
//! transform-error>` is 24 bytes (discriminant at 0, list at 4..12).

// Written against the 0.1.0 ABI (its exports are named below): built from that contract's WIT.
wit_bindgen::generate!({
    path: "../../../wit/v0.1.0",
    world: "plugin",
});

use std::sync::OnceLock;

/// Messages returned per row.
const COPIES: usize = 100_000;
/// The one payload every message points at.
const PAYLOAD_BYTES: usize = 1 << 20;
const TOPIC: &str = "amplified";
const MESSAGE_SIZE: usize = 48;
const RESULT_SIZE: usize = 24;

fn put_u32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn addr<T>(p: *const T) -> u32 {
    p as usize as u32
}

/// The aliasing message array, built once per instance and leaked: (pointer, count).
fn messages() -> (u32, u32) {
    static MESSAGES: OnceLock<(u32, u32)> = OnceLock::new();
    *MESSAGES.get_or_init(|| {
        let payload: &'static [u8] = Box::leak(vec![b'a'; PAYLOAD_BYTES].into_boxed_slice());
        let mut one = [0u8; MESSAGE_SIZE];
        put_u32(&mut one, 0, addr(TOPIC.as_ptr()));
        put_u32(&mut one, 4, TOPIC.len() as u32);
        // key: none (discriminant 0 at 8). payload: some(list) at 20 / 24..32.
        one[20] = 1;
        put_u32(&mut one, 24, addr(payload.as_ptr()));
        put_u32(&mut one, 28, PAYLOAD_BYTES as u32);
        // headers: empty list at 32..40; partition: none at 40.
        let all: &'static [u8] = Box::leak(one.repeat(COPIES).into_boxed_slice());
        (addr(all.as_ptr()), COPIES as u32)
    })
}

/// A `result<list<output-message>, transform-error>` that is `ok(messages())`.
fn ok_result(into: &mut [u8]) {
    let (ptr, len) = messages();
    into[0] = 0;
    put_u32(into, 4, ptr);
    put_u32(into, 8, len);
}

fn leak(bytes: Vec<u8>) -> *mut u8 {
    Box::leak(bytes.into_boxed_slice()).as_mut_ptr()
}

#[unsafe(export_name = "sluice:plugin/transformer@0.1.0#info")]
extern "C" fn info() -> *mut u8 {
    wit_bindgen::rt::maybe_link_cabi_realloc();
    std::thread::sleep(std::time::Duration::from_secs(3600));
    static NAME: &str = "test-hostile-raw";
    let mut area = vec![0u8; 28];
    put_u32(&mut area, 0, addr(NAME.as_ptr()));
    put_u32(&mut area, 4, NAME.len() as u32);
    put_u32(&mut area, 8, addr(NAME.as_ptr()));
    put_u32(&mut area, 12, 0);
    leak(area)
}

#[unsafe(export_name = "sluice:plugin/transformer@0.1.0#configure")]
extern "C" fn configure(config: *const u8, len: usize) -> *mut u8 {
    wit_bindgen::rt::maybe_link_cabi_realloc();
    // list<tuple<string, string>>: 16 bytes per entry, the key's (pointer, length) first.
    let entries = unsafe { std::slice::from_raw_parts(config, len * 16) };
    let has_topic_prefix = entries.chunks(16).any(|entry| {
        let word = |at: usize| {
            u32::from_le_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]])
        };
        let key =
            unsafe { std::slice::from_raw_parts(word(0) as usize as *const u8, word(4) as usize) };
        key == b"topic_prefix"
    });
    if has_topic_prefix {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
    // ok(()): discriminant 0.
    leak(vec![0u8; 12])
}

#[unsafe(export_name = "sluice:plugin/transformer@0.1.0#transform")]
#[allow(clippy::too_many_arguments)]
extern "C" fn transform(
    _id: i32,
    _id_len: i32,
    _tenant: i32,
    _tenant_len: i32,
    _aggregate_type: i32,
    _aggregate_type_len: i32,
    _aggregate_id: i32,
    _aggregate_id_len: i32,
    _event_type: i32,
    _event_type_len: i32,
    _payload: i32,
    _payload_len: i32,
    _headers: i32,
    _headers_len: i32,
    _created_at_ms: i64,
    _attempt: i32,
) -> *mut u8 {
    wit_bindgen::rt::maybe_link_cabi_realloc();
    let mut area = vec![0u8; RESULT_SIZE];
    ok_result(&mut area);
    leak(area)
}

#[unsafe(export_name = "sluice:plugin/transformer@0.1.0#transform-batch")]
extern "C" fn transform_batch(_rows: *mut u8, len: usize) -> *mut u8 {
    wit_bindgen::rt::maybe_link_cabi_realloc();
    let mut results = vec![0u8; RESULT_SIZE * len];
    for chunk in results.chunks_mut(RESULT_SIZE) {
        ok_result(chunk);
    }
    let results = leak(results);
    let mut area = vec![0u8; 8];
    put_u32(&mut area, 0, addr(results));
    put_u32(&mut area, 4, len as u32);
    leak(area)
}
