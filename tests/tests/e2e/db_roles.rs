//! The database grants docs/databases.md#database-roles documents, tested with roles that
//! have exactly those rights: the table is migrated by its owner, the relay runs as a role
//! with only the documented privileges and delivers and marks every row; a role missing one
//! of them is refused at start-up with the privilege and the table named, before anything is
//! claimed or published, and every row stays in the table.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_testkit::mysql_url;
use sluice_testkit::*;
use sqlx::{AssertSqlSafe, Connection, Executor, MySqlConnection, PgConnection, PgPool};

/// `url` with its user (and password) replaced by `user`, no password: the test servers
/// trust local connections.
fn url_as(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}@{host}")
}

/// Statements run when dropped — also when the test panics — on a connection of its own (a
/// fresh runtime on a thread of its own: `Drop` cannot await), so no role, user, schema or
/// table outlives its test.
struct Cleanup {
    url: String,
    statements: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (url, statements) = (self.url.clone(), std::mem::take(&mut self.statements));
        let cleaned = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if url.starts_with("mysql") {
                    if let Ok(mut conn) = MySqlConnection::connect(&url).await {
                        for sql in statements {
                            let _ = conn.execute(AssertSqlSafe(sql)).await;
                        }
                    }
                } else if let Ok(mut conn) = PgConnection::connect(&url).await {
                    for sql in statements {
                        let _ = conn.execute(AssertSqlSafe(sql)).await;
                    }
                }
            });
        });
        let _ = cleaned.join();
    }
}

/// A schema of its own holding `outbox`, migrated (with the NOTIFY trigger) by an owner role
/// that has only `USAGE` and `CREATE` on the schema, and a relay login role with the grants
/// given; all dropped by [`PgRole::drop`]. `admin` is the test's superuser, standing in for
/// the application (inserts) and the DBA (roles, grants).
struct PgRole {
    admin: PgPool,
    schema: String,
    owner: String,
    role: String,
    _cleanup: Cleanup,
}

impl PgRole {
    async fn create(stem: &str, grants: &[&str]) -> Self {
        let admin = pool().await;
        let schema = unique(stem);
        let owner = format!("{schema}_owner");
        let role = format!("{schema}_relay");
        let cleanup = Cleanup {
            url: database_url(),
            statements: vec![
                format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"),
                // Revokes what was granted: DROP ROLE refuses a role that holds privileges.
                format!("DROP OWNED BY \"{role}\", \"{owner}\""),
                format!("DROP ROLE IF EXISTS \"{role}\""),
                format!("DROP ROLE IF EXISTS \"{owner}\""),
            ],
        };
        for sql in [
            format!("CREATE SCHEMA \"{schema}\""),
            format!("CREATE ROLE \"{owner}\" LOGIN"),
            format!("GRANT USAGE, CREATE ON SCHEMA \"{schema}\" TO \"{owner}\""),
            format!("CREATE ROLE \"{role}\" LOGIN"),
        ] {
            admin
                .execute(AssertSqlSafe(sql.clone()))
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let db = Self {
            admin,
            schema,
            owner,
            role,
            _cleanup: cleanup,
        };
        // Twice: the second run finds the table and checks, adds and indexes as on an upgrade.
        for extra in [&[][..], &["--notify-trigger"][..]] {
            let owner_url = url_as(&database_url(), &db.owner);
            let table = db.table();
            let mut args = vec!["migrate", "--database-url", &owner_url, "--table", &table];
            args.extend_from_slice(extra);
            let out = sluice(&args);
            assert!(
                out.status.success(),
                "sluice {args:?} as the table's owner: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for grant in grants {
            let sql = grant
                .replace("{schema}", &format!("\"{}\"", db.schema))
                .replace("{table}", &format!("\"{}\".outbox", db.schema))
                .replace("{role}", &format!("\"{}\"", db.role));
            db.admin
                .execute(AssertSqlSafe(sql.clone()))
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        db
    }

    fn url(&self) -> String {
        url_as(&database_url(), &self.role)
    }

    fn table(&self) -> String {
        format!("{}.outbox", self.schema)
    }

    /// `n` rows as the application writes them: aggregate types `order` and
    /// `customer`.
    async fn insert_rows(&self, n: i64) {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{}\".outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END, 'agg-' || g,
                    'Happened', jsonb_build_object('n', g)
               FROM generate_series(1, $1) AS g",
            self.schema
        )))
        .bind(n)
        .execute(&self.admin)
        .await
        .expect("insert rows");
    }

    async fn scalar(&self, sql: &str) -> i64 {
        let sql = sql.replace("{t}", &format!("\"{}\".outbox", self.schema));
        sqlx::query_scalar(AssertSqlSafe(sql.clone()))
            .fetch_one(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}

/// The reference plugin's topics for `prefix`, created on the shared broker.
async fn topics(prefix: &str) -> Vec<String> {
    let topics = vec![format!("{prefix}order"), format!("{prefix}customer")];
    create_topics(&kafka_bootstrap(), &topics)
        .await
        .expect("create topics");
    topics
}

fn config(url: &str, table: &str, prefix: &str, relay_extra: &str) -> String {
    with_database_url(
        &relay_config(table, &kafka_bootstrap(), prefix, relay_extra, ""),
        url,
    )
}

/// Runs `sluice run` with `config` and waits for it to exit by itself (up to 60 s; a relay
/// still running then is killed and fails the test): the exit and what it logged.
async fn run_expecting_refusal(config: &str) -> RelayExit {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config).expect("write config");
    let log_path = dir.path().join("stderr.log");
    let mut child = Command::new(sluice_bin())
        .arg("run")
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).expect("log file"))
        .spawn()
        .expect("start sluice run");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for sluice run") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the relay kept running instead of refusing to start: {}",
                log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    RelayExit {
        success: status.success(),
        code: status.code(),
        log: log(),
    }
}

/// Runs a relay with `config` until `done`, then stops it (exit 0 expected).
/// After a refused start: all `rows` rows are still unsent with no attempt, and nothing
/// reached `topics`.
async fn assert_untouched_and_unpublished(db: &PgRole, rows: i64, topics: &[String]) {
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE published_at IS NULL AND attempts = 0")
            .await,
        rows,
        "every row is still there, untouched"
    );
    let got = consume(
        &kafka_bootstrap(),
        topics,
        1,
        Duration::from_secs(3),
        Duration::ZERO,
    )
    .expect("consume");
    assert!(got.is_empty(), "nothing was published: {}", got.len());
}

async fn relay_until<F, Fut>(config: &str, done: F) -> RelayExit
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let relay = RelayProcess::start(config).expect("start relay");
    let finished = wait_until(SCENARIO_WAIT, done).await;
    assert!(finished, "the relay did not get there: {}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "relay did not exit 0: {}", exit.log);
    exit
}

const PG_RUN_GRANTS: &[&str] = &[
    "GRANT USAGE ON SCHEMA {schema} TO {role}",
    "GRANT SELECT, UPDATE, DELETE ON {table} TO {role}",
];

#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_role_with_the_documented_grants_relays_and_deletes() {
    let db = PgRole::create("roles_pg_delete", PG_RUN_GRANTS).await;
    let prefix = format!("{}.", db.schema);
    let topics = topics(&prefix).await;
    // LISTEN (for the trigger the owner installed) needs no grant either: the rows are
    // inserted once the relay listens.
    let config = config(
        &db.url(),
        &db.table(),
        &prefix,
        "notify_channel = \"sluice_outbox\"",
    );
    let relay = RelayProcess::start(&config).expect("start relay");
    let listening = wait_until(SCENARIO_WAIT, || async {
        relay.log().contains("listening for notifications")
    })
    .await;
    assert!(listening, "{}", relay.log());
    db.insert_rows(200).await;
    let drained = wait_until(SCENARIO_WAIT, || async {
        db.scalar("SELECT count(*) FROM {t}").await == 0
    })
    .await;
    assert!(
        drained,
        "the relay did not drain the table: {}",
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "relay did not exit 0: {}", exit.log);
    assert_eq!(exit.rows_sent(), Some(200), "{}", exit.log);
    let got = consume(
        &kafka_bootstrap(),
        &topics,
        200,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .expect("consume");
    assert_eq!(count_by_id(&got).len(), 200, "every row arrived");

    // `sluice migrate` is the owner's: this role may not change the table (the first thing
    // PostgreSQL checks is CREATE on the schema, for `CREATE TABLE IF NOT EXISTS`).
    let out = sluice(&[
        "migrate",
        "--database-url",
        &db.url(),
        "--table",
        &db.table(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "migrate as the relay's role: {stderr}"
    );
    assert!(
        stderr.contains(&format!("permission denied for schema {}", db.schema)),
        "{stderr}"
    );
    drop(db);
}

/// `published_at` mode keeping sent rows forever needs no DELETE; dead rows can be listed
/// and replayed with the same grants.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_published_at_mode_without_retention_needs_no_delete() {
    let db = PgRole::create(
        "roles_pg_keep",
        &[
            "GRANT USAGE ON SCHEMA {schema} TO {role}",
            "GRANT SELECT, UPDATE ON {table} TO {role}",
        ],
    )
    .await;
    let prefix = format!("{}.", db.schema);
    let topics = topics(&prefix).await;
    db.insert_rows(100).await;
    let config = config(
        &db.url(),
        &db.table(),
        &prefix,
        "mark = \"published_at\"\nretention = \"forever\"",
    );
    relay_until(&config, || async {
        db.scalar("SELECT count(*) FROM {t} WHERE published_at IS NULL")
            .await
            == 0
    })
    .await;
    assert_eq!(db.scalar("SELECT count(*) FROM {t}").await, 100, "kept");
    let got = consume(
        &kafka_bootstrap(),
        &topics,
        100,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .expect("consume");
    assert_eq!(count_by_id(&got).len(), 100, "every row arrived");

    // Dead rows: listed and replayed by the same role.
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{}\".outbox SET published_at = NULL, dead_at = now(), last_error = 'boom'
          WHERE id = (SELECT min(id) FROM \"{}\".outbox)",
        db.schema, db.schema
    )))
    .execute(&db.admin)
    .await
    .expect("kill a row");
    for args in [&["dead", "list"][..], &["dead", "replay", "--all"][..]] {
        let out = sluice_with_config(args, &config);
        assert!(
            out.status.success(),
            "sluice {args:?} as the relay's role: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL")
            .await,
        0,
        "replayed"
    );
    drop(db);
}

/// Without DELETE, `mark = "delete"` would publish every batch and then fail to mark it,
/// publishing it again and again; without UPDATE no claim would succeed. Either way the
/// relay refuses to start, names the privilege, the table and the GRANT, and publishes
/// nothing.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_missing_grant_is_refused_at_start_up_naming_it() {
    for (stem, grant, missing) in [
        (
            "roles_pg_nodelete",
            "GRANT SELECT, UPDATE ON {table} TO {role}",
            "DELETE",
        ),
        (
            "roles_pg_noupdate",
            "GRANT SELECT, DELETE ON {table} TO {role}",
            "UPDATE",
        ),
    ] {
        let db = PgRole::create(stem, &["GRANT USAGE ON SCHEMA {schema} TO {role}", grant]).await;
        let prefix = format!("{}.", db.schema);
        let topics = topics(&prefix).await;
        db.insert_rows(50).await;
        let config = config(&db.url(), &db.table(), &prefix, "");
        // `config check --connect` reports it too.
        let out = sluice_with_config(&["config", "check", "--connect"], &config);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{said}");
        assert!(
            said.contains(&format!("lacks the {missing} privilege")),
            "{said}"
        );
        let exit = run_expecting_refusal(&config).await;
        assert_eq!(exit.code, Some(1), "{}", exit.log);
        // The role's name is a plain lowercase identifier: quote_ident leaves it unquoted.
        let wanted = format!(
            "outbox table \"{schema}\".\"outbox\": the database user {role} lacks the {missing} privilege",
            schema = db.schema,
            role = db.role,
        );
        assert!(exit.log.contains(&wanted), "{wanted}\nin\n{}", exit.log);
        let grant = format!(
            "GRANT SELECT, UPDATE, DELETE ON \"{}\".\"outbox\" TO {}",
            db.schema, db.role
        );
        assert!(exit.log.contains(&grant), "{}", exit.log);
        assert!(!exit.log.contains("relay started"), "{}", exit.log);
        assert_untouched_and_unpublished(&db, 50, &topics).await;
        drop(db);
    }
}

/// The pruner (`published_at` mode with a retention) needs DELETE too.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_the_pruner_needs_delete() {
    let db = PgRole::create(
        "roles_pg_prune",
        &[
            "GRANT USAGE ON SCHEMA {schema} TO {role}",
            "GRANT SELECT, UPDATE ON {table} TO {role}",
        ],
    )
    .await;
    let prefix = format!("{}.", db.schema);
    let exit = run_expecting_refusal(&config(
        &db.url(),
        &db.table(),
        &prefix,
        "mark = \"published_at\"\nretention = \"7d\"",
    ))
    .await;
    assert_eq!(exit.code, Some(1), "{}", exit.log);
    assert!(
        exit.log
            .contains("lacks the DELETE privilege, needed for the pruner"),
        "{}",
        exit.log
    );
    drop(db);
}

/// Column-level grants of the bookkeeping columns without `replay_id` (the column `sluice
/// migrate` added for `sluice replay`): a relay in `published_at` mode clears it when it marks
/// a row sent, so it would publish every batch and fail to mark it, again and again. It is
/// refused at start-up naming the column, and `sluice replay` is refused before it asks.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_column_grants_without_the_replay_marker_are_refused_naming_it() {
    let db = PgRole::create(
        "roles_pg_cols",
        &[
            "GRANT USAGE ON SCHEMA {schema} TO {role}",
            "GRANT SELECT ON {table} TO {role}",
            "GRANT UPDATE (published_at, attempts, next_attempt_at, last_error, dead_at) \
             ON {table} TO {role}",
        ],
    )
    .await;
    let prefix = format!("{}.", db.schema);
    let topics = topics(&prefix).await;
    db.insert_rows(20).await;
    let config = config(
        &db.url(),
        &db.table(),
        &prefix,
        "mark = \"published_at\"\nretention = \"forever\"",
    );
    let exit = run_expecting_refusal(&config).await;
    assert_eq!(exit.code, Some(1), "{}", exit.log);
    assert!(
        exit.log.contains("lacks the UPDATE (replay_id) privilege"),
        "{}",
        exit.log
    );
    let grant = format!(
        "GRANT SELECT, UPDATE ON \"{}\".\"outbox\" TO {}",
        db.schema, db.role
    );
    assert!(exit.log.contains(&grant), "{}", exit.log);
    assert_untouched_and_unpublished(&db, 20, &topics).await;

    // `sluice replay` as that role: refused before it counts and asks.
    db.admin
        .execute(AssertSqlSafe(format!(
            "UPDATE \"{}\".outbox SET published_at = now() - interval '1 minute'",
            db.schema
        )))
        .await
        .expect("mark the rows sent");
    let out = sluice_with_config(&["replay", "--since", "1h", "--yes"], &config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("lacks the UPDATE (replay_id) privilege, needed to mark the rows"),
        "{stderr}"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM {t} WHERE replay_id IS NOT NULL")
            .await,
        0,
        "nothing replayed"
    );
    drop(db);
}

async fn my_count(root: &mut MySqlConnection, table: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM `{table}`")))
        .fetch_one(root)
        .await
        .expect("count")
}

/// MariaDB: a user with SELECT, UPDATE, DELETE on the table relays and deletes; one without
/// DELETE is refused at start-up with the privilege named and nothing published.
#[tokio::test(flavor = "multi_thread")]
async fn mariadb_a_user_with_the_documented_grants_relays_and_one_without_delete_is_refused() {
    let root_url = mysql_url();
    let mut root = MySqlConnection::connect(&root_url)
        .await
        .expect("MariaDB must be reachable at SLUICE_TEST_MYSQL_URL");
    let table = unique("roles_my");
    let user = format!("{table}_u");
    let out = sluice(&["migrate", "--database-url", &root_url, "--table", &table]);
    assert!(
        out.status.success(),
        "sluice migrate (as root) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _cleanup = Cleanup {
        url: root_url.clone(),
        statements: vec![
            format!("DROP USER IF EXISTS '{user}'@'%'"),
            format!("DROP USER IF EXISTS '{user}'@'localhost'"),
            format!("DROP TABLE IF EXISTS `{table}`"),
        ],
    };
    let database: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&mut root)
        .await
        .expect("current database");
    for sql in [
        format!("CREATE USER '{user}'@'%'"),
        format!("CREATE USER '{user}'@'localhost'"),
        format!("GRANT SELECT, UPDATE ON `{database}`.`{table}` TO '{user}'@'%'"),
        format!("GRANT SELECT, UPDATE ON `{database}`.`{table}` TO '{user}'@'localhost'"),
    ] {
        root.execute(AssertSqlSafe(sql.clone()))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let insert = format!(
        "INSERT INTO `{table}` (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'a', 'Happened', '{{}}'), ('customer', 'b', 'Happened', '{{}}'),
                ('order', 'c', 'Happened', '{{}}')"
    );
    root.execute(AssertSqlSafe(insert))
        .await
        .expect("insert rows");
    let prefix = format!("{table}.");
    let topics = topics(&prefix).await;
    let url = url_as(&root_url, &user);
    let relay_config = config(&url, &table, &prefix, "");

    let exit = run_expecting_refusal(&relay_config).await;
    assert_eq!(exit.code, Some(1), "{}", exit.log);
    assert!(
        exit.log.contains("lacks the DELETE privilege")
            && exit.log.contains(&format!(
                "GRANT SELECT, UPDATE, DELETE ON `{table}` TO '{user}'@"
            )),
        "{}",
        exit.log
    );
    assert_eq!(my_count(&mut root, &table).await, 3, "no row lost");

    for host in ["%", "localhost"] {
        let sql = format!("GRANT DELETE ON `{database}`.`{table}` TO '{user}'@'{host}'");
        root.execute(AssertSqlSafe(sql)).await.expect("grant");
    }
    let relay = RelayProcess::start(&relay_config).expect("start relay");
    let mut drained = false;
    let deadline = Instant::now() + SCENARIO_WAIT;
    while Instant::now() < deadline {
        if my_count(&mut root, &table).await == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(drained, "the relay did not drain {table}: {}", relay.log());
    let exit = relay.stop();
    assert!(exit.success, "relay did not exit 0: {}", exit.log);
    let got = consume(
        &kafka_bootstrap(),
        &topics,
        3,
        SCENARIO_WAIT,
        Duration::from_secs(1),
    )
    .expect("consume");
    assert_eq!(count_by_id(&got).len(), 3, "every row arrived");
}
