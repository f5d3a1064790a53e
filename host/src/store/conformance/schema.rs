//! What a table must look like, on the databases only (see the suite's opening comment):
//! `store::open` and `sluice migrate` on tables of other shapes.

use std::collections::HashSet;

use super::{DbFixture, ids, sent};
use crate::model::{OutboxId, TenantId};
use crate::store::{self, ClaimedBatch, OutboxStore, StoreOptions};

pub(super) async fn unusable_tables_are_refused_naming_every_problem<F: DbFixture>() {
    let f = F::new().await;
    let missing = store::open(&f.url(), &f.spec(), StoreOptions::default(), 1)
        .await
        .err()
        .expect("a missing table is refused")
        .to_string();
    assert!(missing.contains("does not exist"), "{missing}");
    f.create_unusable_table().await;
    for attempt in ["open", "migrate"] {
        let err = match attempt {
            "open" => store::open(&f.url(), &f.spec(), StoreOptions::default(), 1)
                .await
                .err()
                .map(|e| e.to_string()),
            _ => store::migrate(&f.url(), &f.spec(), &StoreOptions::default(), None)
                .await
                .err()
                .map(|e| e.to_string()),
        }
        .unwrap_or_else(|| panic!("{attempt} accepted an unusable table"));
        assert!(
            err.contains(&format!("\"{}\" cannot be used", f.table())),
            "{err}"
        );
        for needle in [
            "column \"id\" (database.columns.id) has type",
            "column \"aggregate_id\" (database.columns.aggregate_id) is missing",
            "column \"payload\" (database.columns.payload) has type",
        ] {
            assert!(err.contains(needle), "{attempt}: {needle:?} not in\n{err}");
        }
    }
    // `migrate` changed nothing on the refused table.
    let err = store::open(&f.url(), &f.spec(), StoreOptions::default(), 1)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("\"published_at\" (bookkeeping"), "{err}");
    f.cleanup().await;
}

pub(super) async fn an_application_table_is_relayed_through_the_column_mapping<F: DbFixture>() {
    let f = F::new().await;
    f.create_debezium_table().await;
    f.insert_debezium("order", "o-1", r#"{"total":1}"#).await;
    f.insert_debezium("customer", "c-1", r#"{"name":"x"}"#)
        .await;
    let spec = f.debezium_spec();
    let first = store::migrate(&f.url(), &spec, &StoreOptions::default(), None)
        .await
        .unwrap();
    let again = store::migrate(&f.url(), &spec, &StoreOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(first, again, "migrate is idempotent");
    assert!(
        first.contains("every row belongs to tenant \"default\""),
        "{first}"
    );
    let store = store::open(&f.url(), &spec, StoreOptions::default(), 2)
        .await
        .unwrap();
    f.insert_debezium("order", "o-2", r#"{"total":2}"#).await;
    let claim = store.claim(10, &[]).await.unwrap();
    let got: Vec<(&str, &str, &str)> = claim
        .rows
        .iter()
        .map(|r| {
            (
                r.aggregate_type.as_str(),
                r.aggregate_id.as_str(),
                r.event_type.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("order", "o-1", "Created"),
            ("customer", "c-1", "Created"),
            ("order", "o-2", "Created")
        ],
        "claimed in insertion order, also rows inserted before the migration"
    );
    assert!(
        claim
            .rows
            .iter()
            .all(|r| r.tenant.as_str() == TenantId::DEFAULT_NAME)
    );
    assert!(claim.rows.iter().all(|r| r.headers.is_empty()));
    let payload: serde_json::Value = serde_json::from_slice(&claim.rows[0].payload).unwrap();
    assert_eq!(payload, serde_json::json!({"total": 1}));
    let distinct: HashSet<&OutboxId> = claim.rows.iter().map(|r| &r.id).collect();
    assert_eq!(distinct.len(), 3);
    claim.batch.complete(sent(ids(&claim.rows))).await.unwrap();
    assert_eq!(f.count().await, 0);
    f.cleanup().await;
}
