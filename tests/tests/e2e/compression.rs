//! Producer compression: every codec Sluice's librdkafka is built with (gzip, snappy, lz4,
//! zstd; see docs/configuration.md) works end to end. Rows relayed with `[kafka]
//! "compression.type" = …` to the broker are consumed back whole. A codec missing from the
//! build stops `sluice run` at start-up (librdkafka refuses the property), so these fail then.

use std::time::Duration;

use sluice_testkit::*;

const ROWS: usize = 120;

/// Relays `ROWS` compressible rows (2 KiB of repeated text each, so librdkafka's batches
/// really shrink) with `codec` and checks each arrives once with its payload and headers.
async fn relay_with(codec: &str) {
    let s = Scenario::new(&format!("compress_{codec}"), &["order", "customer"]).await;
    s.table
        .execute(&format!(
            "INSERT INTO {{t}} (aggregate_type, aggregate_id, event_type, payload, headers)
             SELECT CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END, 'agg-' || g,
                    'Compressed', jsonb_build_object('n', g, 'pad', repeat('abcd', 512)),
                    jsonb_build_object('trace', 'trace-' || g)
               FROM generate_series(1, {ROWS}) AS g"
        ))
        .await;
    let config = s.config("", "").replace(
        "[kafka]\n",
        &format!("[kafka]\n\"compression.type\" = \"{codec}\"\n"),
    );
    assert!(config.contains("compression.type"), "{config}");
    let exit = s
        .relay_until(&config, || async { s.table.count().await == 0 })
        .await;
    assert_eq!(exit.rows_sent(), Some(ROWS as u64), "{codec}: {}", exit.log);

    let got = s.consume(ROWS, Duration::from_secs(1));
    let counts = count_by_id(&got);
    assert_eq!(counts.len(), ROWS, "{codec}: every row arrived");
    assert!(counts.values().all(|c| *c == 1), "{codec}: {counts:?}");
    for m in &got {
        let id: i64 = m.header("sluice-outbox-id").unwrap().parse().unwrap();
        assert_eq!(
            m.payload_json(),
            serde_json::json!({ "n": id, "pad": "abcd".repeat(512) }),
            "{codec}: payload of row {id}"
        );
        assert_eq!(m.header("trace"), Some(format!("trace-{id}")), "{codec}");
        assert_eq!(m.key_str(), format!("agg-{id}"), "{codec}");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn zstd_compressed_rows_arrive_intact() {
    relay_with("zstd").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lz4_compressed_rows_arrive_intact() {
    relay_with("lz4").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn snappy_compressed_rows_arrive_intact() {
    relay_with("snappy").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gzip_compressed_rows_arrive_intact() {
    relay_with("gzip").await;
}
