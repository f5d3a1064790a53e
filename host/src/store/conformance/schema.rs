//! What a table must look like, on the databases only (see the suite's opening comment):
//! `store::open` and `sluice migrate` on tables of other shapes.

use std::collections::HashSet;

use super::{DbFixture, ids, row, sent};
use crate::model::{ColumnValue, OutboxId, TenantId};
use crate::store::{
    self, BatchOutcome, ClaimedBatch, ColumnsSettings, Disposition, OutboxStore, RowFailure,
    StoreOptions, TableSpec,
};

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

/// The standard table with [`DbFixture::TYPED_COLUMNS`] added, two rows (the first with
/// [`DbFixture::TYPED_VALUES`], the second all NULL); returns their ids.
async fn typed_table<F: DbFixture>(f: &F) -> Vec<i64> {
    f.migrated(StoreOptions::default()).await;
    for column in F::TYPED_COLUMNS {
        f.execute(&format!("ALTER TABLE {{t}} ADD COLUMN {column}"))
            .await;
    }
    let ids = f.insert(&[row(None, "o-1", 1), row(None, "o-2", 2)]).await;
    f.execute(&format!(
        "UPDATE {{t}} SET {} WHERE id = {}",
        F::TYPED_VALUES,
        ids[0]
    ))
    .await;
    ids
}

/// `f`'s standard table with `extra = names`.
fn spec_with_extra<F: DbFixture>(f: &F, names: &[&str]) -> Result<TableSpec, String> {
    let columns = ColumnsSettings {
        extra: Some(names.iter().map(|n| (*n).to_owned()).collect()),
        ..Default::default()
    };
    TableSpec::from_settings(f.table(), &columns).map_err(|e| e.to_string())
}

/// Puts the claimed rows back, due at once, without counting an attempt.
async fn put_back(claim: store::Claim<store::StoreBatch>) {
    let failed = claim
        .rows
        .iter()
        .map(|r| RowFailure {
            id: r.id.clone(),
            error: "put back".into(),
            disposition: Disposition::Wait(std::time::Duration::ZERO),
        })
        .collect();
    claim
        .batch
        .complete(BatchOutcome {
            sent: Vec::new(),
            failed,
        })
        .await
        .unwrap();
}

pub(super) async fn extra_columns_reach_the_row_with_their_types<F: DbFixture>() {
    let f = F::new().await;
    typed_table(&f).await;
    let names = [
        "region", "n", "flag", "score", "seen_at", "meta", "raw", "note", "amount",
    ];
    let spec = spec_with_extra(&f, &names).unwrap();
    let store = store::open(&f.url(), &spec, StoreOptions::default(), 2)
        .await
        .unwrap();
    let claim = store.claim(10, &[]).await.unwrap();
    assert_eq!(claim.rows.len(), 2);
    let first = &claim.rows[0].extra;
    let got: Vec<&str> = first.iter().map(|(name, _)| &**name).collect();
    assert_eq!(got, names, "in the configured order");
    let value = |name: &str| {
        first
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let at = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05.123Z").unwrap();
    assert_eq!(value("region"), ColumnValue::Text("eu-west".into()));
    assert_eq!(value("n"), ColumnValue::Integer(42));
    assert_eq!(value("flag"), ColumnValue::Boolean(true));
    assert_eq!(value("score"), ColumnValue::Float(19.5));
    assert_eq!(value("seen_at"), ColumnValue::Timestamp(at.to_utc()));
    assert_eq!(value("raw"), ColumnValue::Bytes(vec![0x00, 0xff]));
    assert_eq!(value("note"), ColumnValue::Null);
    match value("meta") {
        ColumnValue::Json(text) => {
            assert_eq!(text, r#"{"a": [1, 2]}"#);
        }
        // MariaDB's JSON is LONGTEXT: read as text (docs/configuration.md, `extra`).
        ColumnValue::Text(text) if f.url().starts_with("mysql") => {
            assert_eq!(text, r#"{"a": [1, 2]}"#);
        }
        other => panic!("meta: {other:?}"),
    }
    // Decimals are read as text: exact, as the database prints them (SQLite stores a REAL).
    let ColumnValue::Text(amount) = value("amount") else {
        panic!("amount: {:?}", value("amount"));
    };
    assert_eq!(amount.parse::<f64>(), Ok(12.3), "{amount}");
    assert!(
        claim.rows[1]
            .extra
            .iter()
            .all(|(_, v)| *v == ColumnValue::Null),
        "{:?}",
        claim.rows[1].extra
    );
    put_back(claim).await;
    f.cleanup().await;
}

/// Extra columns of the types applications really use ([`DbFixture::odd_columns`]) arrive
/// typed or as their text, never coerced; a value no time can hold fails only its own row,
/// dead, naming the column ([`DbFixture::UNREADABLE`]).
pub(super) async fn odd_extra_values_arrive_typed_or_as_text_and_an_unreadable_one_fails_its_row<
    F: DbFixture,
>() {
    let f = F::new().await;
    f.migrated(StoreOptions::default()).await;
    for sql in F::ODD_SETUP {
        f.execute(sql).await;
    }
    let odd = F::odd_columns();
    for column in &odd {
        f.execute(&format!("ALTER TABLE {{t}} ADD COLUMN {}", column.declared))
            .await;
    }
    let mut rows = vec![row(None, "o-1", 1)];
    rows.extend((0..F::UNREADABLE.len()).map(|i| row(None, &format!("bad{i}"), 2)));
    let inserted = f.insert(&rows).await;
    let sets: Vec<&str> = odd
        .iter()
        .map(|c| c.set)
        .filter(|s| !s.is_empty())
        .collect();
    f.execute(&format!(
        "UPDATE {{t}} SET {} WHERE id = {}",
        sets.join(", "),
        inserted[0]
    ))
    .await;
    for ((set, _), id) in F::UNREADABLE.iter().zip(&inserted[1..]) {
        f.execute(&format!("UPDATE {{t}} SET {set} WHERE id = {id}"))
            .await;
    }
    let names: Vec<&str> = odd.iter().map(|c| c.name).collect();
    let spec = spec_with_extra(&f, &names).unwrap();
    let store = store::open(&f.url(), &spec, StoreOptions::default(), 2)
        .await
        .unwrap();
    // The sampler reads every pending row's `created_at`, these included.
    let sample = store.sample_backlog(100).await.unwrap();
    assert_eq!(
        sample.iter().map(|t| t.due).sum::<i64>(),
        1 + F::UNREADABLE.len() as i64
    );
    let claim = store.claim(10, &[]).await.unwrap();
    assert_eq!(
        ids(&claim.rows),
        [OutboxId::Int(inserted[0])],
        "{:?}",
        claim.rejected
    );
    for (column, (name, value)) in odd.iter().zip(&claim.rows[0].extra) {
        assert_eq!(&**name, column.name);
        assert_eq!(
            value, &column.expect,
            "column {} ({})",
            column.name, column.declared
        );
    }
    let mut rejected = claim.rejected.clone();
    rejected.sort_by_key(|r| r.id.to_string().parse::<i64>().unwrap_or_default());
    assert_eq!(rejected.len(), F::UNREADABLE.len(), "{rejected:?}");
    for ((set, column), failure) in F::UNREADABLE.iter().zip(&rejected) {
        assert_eq!(failure.disposition, Disposition::Dead, "{set}");
        assert!(
            failure
                .error
                .contains(&format!("cannot decode column {column}")),
            "{set}: {}",
            failure.error
        );
    }
    claim
        .batch
        .complete(BatchOutcome {
            sent: Vec::new(),
            failed: rejected,
        })
        .await
        .unwrap();
    for id in &inserted[1..] {
        assert!(f.state(*id).await.unwrap().dead, "row {id} is dead");
    }
    f.cleanup().await;
}

pub(super) async fn every_other_column_is_extra_with_a_star_and_a_missing_one_is_named<
    F: DbFixture,
>() {
    let f = F::new().await;
    typed_table(&f).await;
    let spec = spec_with_extra(&f, &["*"]).unwrap();
    let store = store::open(&f.url(), &spec, StoreOptions::default(), 2)
        .await
        .unwrap();
    let claim = store.claim(10, &[]).await.unwrap();
    let got: Vec<&str> = claim.rows[0].extra.iter().map(|(n, _)| &**n).collect();
    let added: Vec<&str> = F::TYPED_COLUMNS
        .iter()
        .map(|c| c.split(' ').next().unwrap_or_default())
        .collect();
    assert_eq!(
        got, added,
        "neither mapped nor bookkeeping columns, in table order"
    );
    put_back(claim).await;

    let spec = spec_with_extra(&f, &["region", "tier"]).unwrap();
    let err = store::open(&f.url(), &spec, StoreOptions::default(), 1)
        .await
        .err()
        .expect("a missing extra column is refused")
        .to_string();
    assert!(
        err.contains("column \"tier\" (database.columns.extra) is missing"),
        "{err}"
    );
    assert!(!err.contains("\"region\""), "{err}");
    for (names, says) in [
        (
            &["aggregate_type"][..],
            "already mapped as database.columns.aggregate_type",
        ),
        (&["attempts"][..], "bookkeeping"),
        (&["*", "region"][..], "stands alone"),
        (&["region", "region"][..], "listed twice"),
    ] {
        let err = spec_with_extra(&f, names).unwrap_err();
        assert!(
            err.contains("database.columns.extra") && err.contains(says),
            "{names:?}: {err}"
        );
    }
    f.cleanup().await;
}
