//! `naive`: an honest seed-style relay, for scale. One loop: BEGIN; claim 500 rows with
//! Sluice's query; for each row in order build the message the reference plugin would
//! (topic `<prefix><aggregate_type>`, key aggregate_id, the payload, the row's headers plus
//! `id` and `event-type`), send it and await its acknowledgement, then `UPDATE … SET
//! published_at = now()` for that row; COMMIT. An empty claim sleeps 1 s.

use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Postgres};

use super::rate_figures;
use crate::claim::{BATCH_SIZE, ClaimedRow, claim_sql};
use crate::cli::Settings;
use crate::outbox::OutboxTable;
use crate::report::Figure;
use crate::{db, kafka, names};

pub const NAME: &str = "naive";

/// How long `send` may wait for room in the producer's queue (as Sluice's sink).
const QUEUE_TIMEOUT: Duration = Duration::from_secs(10);
/// The naive relay's wait after an empty claim.
const EMPTY_SLEEP: Duration = Duration::from_secs(1);
/// Empty claims in a row after which rows still missing count as lost.
const MAX_EMPTY_CLAIMS: u32 = 3;

pub async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let pool = db::pool(&settings.database_url).await?;
    let table = OutboxTable::create(settings, &pool, "naive", None).await?;
    let measured = measure(settings, &table).await;
    table.drop_table().await;
    let (rows, elapsed) = measured?;
    Ok(rate_figures(NAME, rows, elapsed))
}

/// Fills the table and relays it; returns rows published and the time from the first claim
/// to the last commit.
async fn measure(settings: &Settings, table: &OutboxTable) -> anyhow::Result<(u64, Duration)> {
    let prefix = names::topic_prefix("naive");
    kafka::create_topics(&settings.kafka, &kafka::topics(&prefix)).await?;
    table.fill(settings.naive_rows, None).await?;
    let producer = kafka::producer(&settings.kafka)?;
    let mut conn = db::connection(&settings.database_url).await?;
    let relay = NaiveRelay {
        claim: claim_sql(table.quoted()),
        mark: format!(
            "UPDATE {} SET published_at = now() WHERE id = $1",
            table.quoted()
        ),
        prefix,
        producer,
    };

    let start = Instant::now();
    let mut last_commit = start;
    let mut sent = 0u64;
    let mut empty_claims = 0;
    while sent < settings.naive_rows {
        let batch = relay.one_batch(&mut conn).await?;
        if batch == 0 {
            empty_claims += 1;
            if empty_claims >= MAX_EMPTY_CLAIMS {
                bail!(
                    "only {sent} of {} rows could be claimed",
                    settings.naive_rows
                );
            }
            tokio::time::sleep(EMPTY_SLEEP).await;
            continue;
        }
        empty_claims = 0;
        sent += batch;
        last_commit = Instant::now();
    }
    Ok((sent, last_commit - start))
}

struct NaiveRelay {
    claim: String,
    mark: String,
    prefix: String,
    producer: FutureProducer,
}

impl NaiveRelay {
    /// One transaction: claim, publish and mark row by row, commit. Returns the rows sent.
    async fn one_batch(&self, conn: &mut PgConnection) -> anyhow::Result<u64> {
        let mut tx = conn.begin().await.context("BEGIN failed")?;
        let rows = sqlx::query::<Postgres>(AssertSqlSafe(self.claim.as_str()))
            .bind(BATCH_SIZE)
            .fetch_all(&mut *tx)
            .await
            .context("claim failed")?;
        for row in &rows {
            let row = ClaimedRow::decode(row)?;
            self.publish(&row).await?;
            sqlx::query::<Postgres>(AssertSqlSafe(self.mark.as_str()))
                .bind(row.id)
                .execute(&mut *tx)
                .await
                .with_context(|| format!("cannot mark row {} sent", row.id))?;
        }
        tx.commit().await.context("COMMIT failed")?;
        Ok(rows.len() as u64)
    }

    /// Sends the reference plugin's message for `row` and waits for the acknowledgement.
    async fn publish(&self, row: &ClaimedRow) -> anyhow::Result<()> {
        let topic = format!("{}{}", self.prefix, row.aggregate_type);
        let id = row.id.to_string();
        let mut headers = OwnedHeaders::new();
        for (key, value) in row_headers(&row.headers) {
            headers = headers.insert(Header {
                key: &key,
                value: Some(&value),
            });
        }
        let headers = headers
            .insert(Header {
                key: "id",
                value: Some(&id),
            })
            .insert(Header {
                key: "event-type",
                value: Some(&row.event_type),
            });
        let record = FutureRecord::to(&topic)
            .key(&row.aggregate_id)
            .payload(&row.payload)
            .headers(headers);
        self.producer
            .send(record, QUEUE_TIMEOUT)
            .await
            .map_err(|(e, _)| anyhow!("cannot publish row {id} to {topic}: {e}"))?;
        Ok(())
    }
}

/// The row's `headers` JSON object as (name, value) pairs; string values as they are, others
/// as JSON text. Anything but an object yields none.
fn row_headers(json: &str) -> Vec<(String, String)> {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        _ => Vec::new(),
    }
}
