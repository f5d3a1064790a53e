//! A batch whose commit fails after every message was published. The relay records the
//! batch's outcome in a fresh transaction, row by row if need be, so the batch is not claimed
//! and published again as a whole; a row the database keeps refusing is held back with a
//! growing pause instead of being re-published in a loop.

use std::time::Duration;

use sluice_testkit::*;
use sqlx::AssertSqlSafe;

/// Makes the database refuse to delete outbox row `row` the first `times` times (a sequence
/// counts the attempts: it survives the rollbacks of the refused transactions).
async fn refuse_deleting(table: &DbTable, row: i64, times: i64) {
    let t = &table.name;
    for sql in [
        format!("CREATE SEQUENCE \"{t}_refusals\""),
        format!(
            "CREATE FUNCTION \"{t}_refuse\"() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF nextval('\"{t}_refusals\"') <= {times} THEN
                 RAISE EXCEPTION 'refusing to delete outbox row %', OLD.id;
               END IF;
               RETURN OLD;
             END $$"
        ),
        format!(
            "CREATE TRIGGER \"{t}_refuse\" BEFORE DELETE ON \"{t}\"
             FOR EACH ROW WHEN (OLD.id = {row}) EXECUTE FUNCTION \"{t}_refuse\"()"
        ),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(table.pg_pool())
            .await
            .expect("install refusing trigger");
    }
}

async fn refusals(table: &DbTable) -> i64 {
    table
        .scalar_i64(&format!(
            "SELECT last_value FROM \"{}_refusals\"",
            table.name
        ))
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_that_fails_after_publishing_does_not_publish_the_batch_again() {
    let s = Scenario::new("commitfail", &["order", "customer"]).await;
    s.table.insert_rows(100, None).await;
    refuse_deleting(&s.table, 5, 3).await;

    let exit = s
        .relay_until(&s.config("", ""), || async { s.table.count().await == 0 })
        .await;

    assert!(
        exit.log
            .contains("its outcome was recorded in a fresh transaction"),
        "{}",
        exit.log
    );
    assert!(refusals(&s.table).await >= 3, "the trigger did refuse");
    let got = s.consume(100, Duration::from_secs(2));
    let counts = count_by_id(&got);
    assert_eq!(counts.len(), 100, "every row delivered");
    let duplicated: Vec<_> = counts
        .iter()
        .filter(|(id, n)| **n > 1 && *id != "5")
        .collect();
    assert!(
        duplicated.is_empty(),
        "rows published again: {duplicated:?}"
    );
    assert!(
        counts["5"] <= 4,
        "the refused row is published at most once per refusal and once more: {}",
        counts["5"]
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_the_database_keeps_refusing_is_held_back_not_published_in_a_storm() {
    let s = Scenario::new("commitstorm", &["order", "customer"]).await;
    s.table.insert_rows(100, None).await;
    refuse_deleting(&s.table, 5, i64::MAX).await;

    let relay = RelayProcess::start(&s.config("", "")).expect("start relay");
    let others_done = wait_until(SCENARIO_WAIT, || async { s.table.count().await == 1 }).await;
    assert!(others_done, "{}", relay.log());
    // Keep the relay running with the refused row around for a while.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    assert!(
        exit.log.contains("refused to record this row's outcome"),
        "{}",
        exit.log
    );

    let got = s.consume(100, Duration::from_secs(2));
    let counts = count_by_id(&got);
    assert_eq!(counts.len(), 100, "every row delivered");
    assert!(
        counts.iter().all(|(id, n)| *n == 1 || id == "5"),
        "only the refused row is published again: {:?}\n{}",
        counts.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>(),
        exit.log
    );
    println!(
        "refused row published {} times in ~10 s, {} refusals",
        counts["5"],
        refusals(&s.table).await
    );
    // Holds of 1 s, 2 s, 4 s, …: a handful of publications in ~10 s, not one per poll.
    assert!(
        counts["5"] <= 6,
        "refused row published {} times; refusals: {}",
        counts["5"],
        refusals(&s.table).await
    );
    let unsent = s.table.unsent_rows().await;
    assert_eq!(
        unsent.len(),
        1,
        "the refused row stays unsent, nothing lost"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_commit_on_a_uuid_keyed_table_is_settled_by_its_uuids() {
    let table = DbTable::create_with_sql(
        Database::Postgres,
        "commituuid",
        "CREATE TABLE {t} (
             id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
             tenant text, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
             event_type text NOT NULL, payload jsonb)",
    )
    .await;
    let s = Scenario::with_table(table, &["order", "customer"]).await;
    let out = sluice(&[
        "migrate",
        "--database-url",
        &database_url(),
        "--table",
        &s.table.name,
    ]);
    assert!(out.status.success(), "{out:?}");
    s.table.insert_rows(60, None).await;
    let refused: String = s
        .table
        .text_rows("SELECT id::text FROM {t} ORDER BY sluice_seq LIMIT 1 OFFSET 4")
        .await[0][0]
        .clone()
        .expect("an id");
    let t = &s.table.name;
    s.table
        .execute(&format!(
            "CREATE SEQUENCE \"{t}_refusals\";
             CREATE FUNCTION \"{t}_refuse\"() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF nextval('\"{t}_refusals\"') <= 2 THEN
                 RAISE EXCEPTION 'refusing to delete outbox row %', OLD.id;
               END IF;
               RETURN OLD;
             END $$;
             CREATE TRIGGER \"{t}_refuse\" BEFORE DELETE ON {{t}}
             FOR EACH ROW WHEN (OLD.id = '{refused}') EXECUTE FUNCTION \"{t}_refuse\"();"
        ))
        .await;

    let exit = s
        .relay_until(&s.config("", ""), || async { s.table.count().await == 0 })
        .await;
    assert!(
        exit.log
            .contains("its outcome was recorded in a fresh transaction"),
        "{}",
        exit.log
    );
    let got = s.consume(60, Duration::from_secs(2));
    let counts = count_by_id(&got);
    assert_eq!(counts.len(), 60, "every row delivered");
    assert!(
        counts.iter().all(|(id, n)| *n == 1 || *id == refused),
        "rows other than the refused one published again: {:?}",
        counts.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    s.finish().await;
}
