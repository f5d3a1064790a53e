//! `naive`: an honest seed-style relay, for scale. One loop: claim 500 rows through Sluice's
//! PostgreSQL store driver (a transaction held open); for each row in order build the message
//! the reference plugin would (topic `<prefix><aggregate_type>`, key aggregate_id, the payload,
//! the row's headers plus `id` and `event-type`), send it and await its acknowledgement; then
//! mark the batch sent and commit. An empty claim sleeps 1 s. (Before the store seam it marked
//! each row with an `UPDATE` of its own; awaiting each send one at a time is what makes it
//! slow, then as now.)

use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sluice::model::OutboxRow;
use sluice::store::{
    self, BatchOutcome, ClaimedBatch, MarkMode, OutboxStore, Store, StoreOptions, TableName,
    TableSpec,
};

use super::rate_figures;
use super::sql_ceiling::BATCH_SIZE;
use crate::cli::Settings;
use crate::outbox::{self, BenchTable};
use crate::report::Figure;
use crate::{kafka, names};
use sluice_testkit::DbTable;
use sluice_testkit::db;

pub(super) const NAME: &str = "naive";

/// How long `send` may wait for room in the producer's queue (as Sluice's sink).
const QUEUE_TIMEOUT: Duration = Duration::from_secs(10);
/// The naive relay's wait after an empty claim.
const EMPTY_SLEEP: Duration = Duration::from_secs(1);
/// Empty claims in a row after which rows still missing count as lost.
const MAX_EMPTY_CLAIMS: u32 = 3;

pub(super) async fn run(settings: &Settings) -> anyhow::Result<Vec<Figure>> {
    let table = outbox::create(settings, "naive", None).await?;
    let measured = measure(settings, &table).await;
    table.drop_table().await;
    let (rows, elapsed) = measured?;
    Ok(rate_figures(NAME, rows, elapsed))
}

/// Fills the table and relays it; returns rows published and the time from the first claim
/// to the last commit.
async fn measure(settings: &Settings, table: &DbTable) -> anyhow::Result<(u64, Duration)> {
    let prefix = names::topic_prefix("naive");
    kafka::create_topics(&settings.kafka, &kafka::topics(&prefix)).await?;
    table.fill(settings.naive_rows, None).await?;
    let producer = kafka::producer(&settings.kafka)?;
    let spec = TableSpec::new(TableName::parse(&table.name)?);
    let options = StoreOptions {
        mark: MarkMode::PublishedAt,
        ..StoreOptions::default()
    };
    let store = store::open(&settings.database_url, &spec, options, 1)
        .await
        .with_context(|| {
            format!(
                "cannot open {} at {}",
                &table.name,
                db::redact(&settings.database_url)
            )
        })?;
    let relay = NaiveRelay {
        store,
        prefix,
        producer,
    };

    let start = Instant::now();
    let mut last_commit = start;
    let mut sent = 0u64;
    let mut empty_claims = 0;
    while sent < settings.naive_rows {
        let batch = relay.one_batch().await?;
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
    store: Store,
    prefix: String,
    producer: FutureProducer,
}

impl NaiveRelay {
    /// One transaction: claim, publish row by row, mark, commit. Returns the rows sent.
    async fn one_batch(&self) -> anyhow::Result<u64> {
        let claim = self
            .store
            .claim(BATCH_SIZE, &[])
            .await
            .context("claim failed")?;
        let mut sent = Vec::with_capacity(claim.rows.len());
        for row in &claim.rows {
            self.publish(row).await?;
            sent.push(row.id.clone());
        }
        let count = sent.len() as u64;
        claim
            .batch
            .complete(BatchOutcome {
                sent,
                failed: Vec::new(),
            })
            .await
            .context("marking the batch failed")?;
        Ok(count)
    }

    /// Sends the reference plugin's message for `row` and waits for the acknowledgement.
    async fn publish(&self, row: &OutboxRow) -> anyhow::Result<()> {
        let topic = format!("{}{}", self.prefix, row.aggregate_type);
        let id = row.id.to_string();
        let mut headers = OwnedHeaders::new();
        for (key, value) in &row.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value),
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
