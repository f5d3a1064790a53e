//! The brokers besides Kafka — NATS JetStream, RabbitMQ, Redis Streams — end to end through
//! the `sluice` binary (issue #41). One relay publishes to all four at once, each tenant to the
//! broker its section names, through the same plugin (the reference plugin):
//! - rows inserted on PostgreSQL, MariaDB and SQLite each reach their tenant's broker once,
//!   with the host's headers and the plugin's, the key where that broker carries it, and reach
//!   no other broker; the rows are gone from the table after;
//! - a destination nothing takes (a NATS subject no stream captures, a routing key no queue is
//!   bound to) is the tenant's fault: its rows stay unsent naming the destination and its
//!   circuit breaker pauses it, while another tenant on the same broker keeps flowing;
//! - a broker down at start holds its rows back without using up their attempts, `/readyz`
//!   names it, and the rows go once it is up;
//! - `/readyz`, `/metrics`, `/status` and `sluice config check` speak of each broker by name.
//!
//! What arrived is read with the test kit's own consumers (`sluice_testkit::{nats, rabbitmq,
//! redis}`), never through Sluice.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use sluice_testkit::*;

/// Rows each tenant gets.
const ROWS: i64 = 10;
/// Far above a delivery's time, far below a stuck relay's.
const ON_TIME: Duration = Duration::from_secs(10);
/// How long a read waits for extras after the expected messages arrived.
const SETTLE: Duration = Duration::from_secs(1);

/// The tenants of the four-broker relays: (tenant, broker its section names).
const TENANTS: [(&str, &str); 4] = [
    ("to-kafka", "kafka"),
    ("to-nats", "nats"),
    ("to-rabbitmq", "rabbitmq"),
    ("to-redis", "redis"),
];

/// One test's destinations on every broker, named after its table: `<table>.order` and
/// `<table>.customer` (where the reference plugin sends the rows `insert_rows` makes) as Kafka
/// topics, as the subjects of NATS stream `<table>`, as routing keys binding queue `<table>` to
/// exchange `<table>`, and as Redis stream keys.
struct Brokers {
    /// The reference plugin's `topic_prefix`: `<table>.`.
    prefix: String,
    /// `<table>.order`, `<table>.customer`.
    names: Vec<String>,
    /// The NATS stream, the RabbitMQ exchange and queue.
    own: String,
    nats: NatsStreams,
    rabbitmq: RabbitMq,
    redis: RedisStreams,
}

impl Brokers {
    async fn create(table: &str) -> Self {
        let prefix = format!("{table}.");
        let names = vec![format!("{prefix}order"), format!("{prefix}customer")];
        create_topics(&kafka_bootstrap(), &names)
            .await
            .expect("create Kafka topics");
        let nats = NatsStreams::connect(&nats_url()).await.expect("NATS");
        nats.create_stream(table, &names)
            .await
            .expect("create a NATS stream");
        let rabbitmq = RabbitMq::connect(&rabbitmq_url()).await.expect("RabbitMQ");
        rabbitmq
            .declare_exchange(table)
            .await
            .expect("declare an exchange");
        rabbitmq
            .declare_queue(table, table, &names)
            .await
            .expect("declare a bound queue");
        let redis = RedisStreams::connect(&redis_url()).await.expect("Redis");
        Self {
            prefix,
            names,
            own: table.to_owned(),
            nats,
            rabbitmq,
            redis,
        }
    }

    /// `[nats]`, `[rabbitmq]` (with this test's exchange) and `[redis]` sections for the
    /// tests' brokers.
    fn sections(&self) -> String {
        format!(
            "[nats]\nurl = \"{}\"\n\n[rabbitmq]\nurl = \"{}\"\nexchange = \"{}\"\n\n\
             [redis]\nurl = \"{}\"\n\n",
            nats_url(),
            rabbitmq_url(),
            self.own,
            redis_url()
        )
    }

    /// What reached `broker` (`kafka`, `nats`, `rabbitmq`, `redis`): waits until `expected`
    /// messages have, then [`SETTLE`] for extras.
    async fn arrived_at(&self, broker: &str, expected: usize) -> Vec<Arrived> {
        match broker {
            "kafka" => {
                let (bootstrap, topics) = (kafka_bootstrap(), self.names.clone());
                tokio::task::spawn_blocking(move || {
                    consume(&bootstrap, &topics, expected, ON_TIME, SETTLE)
                })
                .await
                .expect("Kafka consumer")
                .expect("read Kafka")
                .iter()
                .map(from_kafka)
                .collect()
            }
            "nats" => self
                .nats
                .read_stream(&self.own, expected, ON_TIME, SETTLE)
                .await
                .expect("read NATS")
                .iter()
                .map(from_nats)
                .collect(),
            "rabbitmq" => self
                .rabbitmq
                .read_queue(&self.own, expected, ON_TIME, SETTLE)
                .await
                .expect("read RabbitMQ")
                .iter()
                .map(|m| from_rabbitmq(m, &self.own))
                .collect(),
            "redis" => self
                .redis
                .read_streams(&self.names, expected, ON_TIME, SETTLE)
                .await
                .expect("read Redis")
                .iter()
                .map(from_redis)
                .collect(),
            other => panic!("no broker {other}"),
        }
    }

    /// [`Brokers::arrived_at`] of every broker at once, by broker.
    async fn arrivals(&self, expected: usize) -> BTreeMap<&'static str, Vec<Arrived>> {
        let (kafka, nats, rabbitmq, redis) = tokio::join!(
            self.arrived_at("kafka", expected),
            self.arrived_at("nats", expected),
            self.arrived_at("rabbitmq", expected),
            self.arrived_at("redis", expected),
        );
        BTreeMap::from([
            ("kafka", kafka),
            ("nats", nats),
            ("rabbitmq", rabbitmq),
            ("redis", redis),
        ])
    }

    /// Removes what [`Brokers::create`] made on NATS, RabbitMQ and Redis (Kafka topics stay,
    /// as in every test); a failure is only reported.
    async fn remove(self) {
        let results = [
            self.nats.delete_stream(&self.own).await,
            self.rabbitmq.delete_queue(&self.own).await,
            self.rabbitmq.delete_exchange(&self.own).await,
            self.redis.delete(&self.names).await,
        ];
        for e in results.into_iter().filter_map(Result::err) {
            eprintln!("warning: cleaning up after {}: {e:#}", self.own);
        }
        self.rabbitmq.close().await;
    }
}

/// `[tenants.<name>]` sections sending to `broker`, inheriting the default plugin.
fn tenant(name: &str, broker: &str) -> String {
    format!("[tenants.{name}]\nbroker = \"{broker}\"\n\n")
}

/// The four tenants of [`TENANTS`].
fn four_tenants() -> String {
    TENANTS.iter().map(|(t, b)| tenant(t, b)).collect()
}

/// `[telemetry]` on `port`, sampling every second.
fn telemetry(port: u16) -> String {
    format!("[telemetry]\nlisten = \"127.0.0.1:{port}\"\nsample_interval = \"1s\"\n\n")
}

/// A relay config for `table` with the reference plugin writing to `brokers`' names, every
/// broker's section, and `extra` at the end.
fn config(table: &DbTable, brokers: &Brokers, relay_extra: &str, extra: &str) -> String {
    table.config(&kafka_bootstrap(), &brokers.prefix, "", relay_extra, "")
        + &brokers.sections()
        + extra
}

/// Inserts [`ROWS`] rows of `tenant`: `insert_rows`' rows `n` = 1…ROWS-1, and row `n` = 0,
/// whose own `event-type` header the plugin's repeats (`Replayed`, then `OrderCreated`).
/// Returns the ids they got (the table held `known` before; it holds these too after).
async fn insert_for(table: &DbTable, tenant: &str, known: &mut BTreeSet<i64>) -> BTreeSet<String> {
    table.insert_rows(ROWS - 1, Some(tenant)).await;
    // Plain JSON text: each database takes it for its JSON (or text) columns.
    table
        .execute(&format!(
            "INSERT INTO {{t}} (tenant, aggregate_type, aggregate_id, event_type, payload, headers)
             VALUES ('{tenant}', 'order', 'agg-0', 'OrderCreated', '{{\"n\": 0}}',
                     '{{\"trace\": \"trace-0\", \"event-type\": \"Replayed\"}}')"
        ))
        .await;
    let all: BTreeSet<i64> = table.ids().await.into_iter().collect();
    let new: BTreeSet<String> = all.difference(known).map(i64::to_string).collect();
    assert_eq!(new.len(), ROWS as usize, "ids of {tenant}'s rows");
    *known = all;
    new
}

async fn start(config: &str) -> RelayProcess {
    let relay = RelayProcess::start(config).expect("start relay");
    let started = relay.wait_started(SCENARIO_WAIT).await;
    assert!(started, "relay did not start: {}", relay.log());
    relay
}

/// A message as the tests check it, whichever broker carried it.
#[derive(Debug)]
struct Arrived {
    /// Topic, subject, routing key or stream key.
    destination: String,
    /// The message key, from where this broker carries it.
    key: Option<String>,
    payload: serde_json::Value,
    /// Every other header (stream field), name → values in order.
    headers: BTreeMap<String, Vec<String>>,
    /// Every header name in the order carried; `None` where the broker does not keep the
    /// order across names (an AMQP headers table is a map; NATS clients hold headers in one).
    order: Option<Vec<String>>,
    /// `Nats-Msg-Id`, AMQP `message_id`, field `sluice-message-id`; none on Kafka.
    message_id: Option<String>,
    /// How the message breaks the broker's own layout (kind of problem, why), found while
    /// reading it.
    problems: Vec<(&'static str, String)>,
}

impl Arrived {
    /// The values of header `name` (none: empty).
    fn values(&self, name: &str) -> &[String] {
        self.headers
            .get(name)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The single value of header `name`: `None` when it is missing or repeated.
    fn one(&self, name: &str) -> Option<&str> {
        match self.values(name) {
            [one] => Some(one),
            _ => None,
        }
    }
}

/// What the tests found broken, by kind (`<broker>: <promise>`): how often, and the first
/// example. Checks go on after a failure, so one run shows every broken promise.
#[derive(Default)]
struct Findings(BTreeMap<String, (usize, String)>);

impl Findings {
    /// Notes `kind` (with `example`) unless `ok`.
    fn expect(&mut self, ok: bool, kind: impl Into<String>, example: impl FnOnce() -> String) {
        if !ok {
            let entry = self.0.entry(kind.into()).or_insert_with(|| (0, example()));
            entry.0 += 1;
        }
    }

    /// Panics listing every finding, if there is one.
    fn assert_none(self) {
        let list: Vec<String> = self
            .0
            .iter()
            .map(|(kind, (n, example))| format!("- {kind} ({n}×), e.g.: {example}"))
            .collect();
        assert!(list.is_empty(), "broken promises:\n{}", list.join("\n"));
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn grouped(pairs: impl Iterator<Item = (String, String)>) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in pairs {
        out.entry(name).or_default().push(value);
    }
    out
}

/// Removes header `name` and returns its value; notes a problem if it repeats.
fn take(
    headers: &mut BTreeMap<String, Vec<String>>,
    name: &str,
    problems: &mut Vec<(&'static str, String)>,
) -> Option<String> {
    let mut values = headers.remove(name)?;
    if values.len() > 1 {
        problems.push(("a broker header is repeated", format!("{name}: {values:?}")));
    }
    values.pop()
}

fn from_kafka(m: &Received) -> Arrived {
    let mut problems = Vec::new();
    if m.header("sluice-key").is_some() {
        problems.push((
            "the key is a header besides the record key",
            format!("{m:?}"),
        ));
    }
    Arrived {
        destination: m.topic.clone(),
        key: m.key.as_deref().map(lossy),
        payload: m.payload_json(),
        headers: grouped(m.headers.iter().map(|(n, v)| (n.clone(), lossy(v)))),
        order: Some(m.headers.iter().map(|(n, _)| n.clone()).collect()),
        message_id: None,
        problems,
    }
}

fn from_nats(m: &NatsMessage) -> Arrived {
    let mut problems = Vec::new();
    let mut headers = grouped(m.headers.iter().map(|(n, v)| (n.clone(), lossy(v))));
    if headers.contains_key("sluice-tombstone") {
        problems.push((
            "a message with a payload is marked a tombstone",
            format!("{m:?}"),
        ));
    }
    Arrived {
        destination: m.subject.clone(),
        key: take(&mut headers, "sluice-key", &mut problems),
        message_id: take(&mut headers, "Nats-Msg-Id", &mut problems),
        payload: m.payload_json(),
        headers,
        // "NATS clients hold headers as a map: consumers see the values of one name in order,
        // but not the order across names" (docs/brokers.md): only the former is promised.
        order: None,
        problems,
    }
}

fn from_rabbitmq(m: &AmqpMessage, exchange: &str) -> Arrived {
    let mut problems = Vec::new();
    if m.exchange != exchange {
        problems.push(("not published to [rabbitmq] exchange", format!("{m:?}")));
    }
    // A header is a string, or an array when its name was repeated: never else.
    for (name, value) in &m.headers {
        let fits = match value {
            AmqpHeader::Bytes(_) => true,
            AmqpHeader::Array(items) => {
                items.len() > 1 && items.iter().all(|i| matches!(i, AmqpHeader::Bytes(_)))
            }
            AmqpHeader::Other(_) => false,
        };
        if !fits {
            problems.push((
                "a header is neither a string nor an array of a repeated name's strings",
                format!("{name} = {value:?}"),
            ));
        }
    }
    let mut headers = grouped(
        m.headers
            .iter()
            .flat_map(|(n, v)| v.texts().into_iter().map(move |t| (n.clone(), t))),
    );
    if headers.contains_key("sluice-tombstone") {
        problems.push((
            "a message with a payload is marked a tombstone",
            format!("{m:?}"),
        ));
    }
    Arrived {
        destination: m.routing_key.clone(),
        key: take(&mut headers, "sluice-key", &mut problems),
        message_id: m.message_id.clone(),
        payload: m.body_json(),
        headers,
        order: None,
        problems,
    }
}

fn from_redis(e: &StreamEntry) -> Arrived {
    let mut problems = Vec::new();
    // The promised layout: value, sluice-key, the headers, sluice-message-id.
    let names = e.names();
    let laid_out = names.len() >= 3
        && names[0] == "value"
        && names[1] == "sluice-key"
        && names[names.len() - 1] == "sluice-message-id";
    if !laid_out {
        problems.push((
            "fields are not value, sluice-key, headers…, sluice-message-id",
            format!("{names:?}"),
        ));
    }
    let inner: Vec<&(String, Vec<u8>)> = e
        .fields
        .iter()
        .filter(|(n, _)| !["value", "sluice-key", "sluice-message-id"].contains(&n.as_str()))
        .collect();
    Arrived {
        destination: e.stream.clone(),
        key: e.field("sluice-key"),
        payload: e.value_json(),
        headers: grouped(inner.iter().map(|(n, v)| (n.clone(), lossy(v)))),
        order: Some(inner.iter().map(|(n, _)| n.clone()).collect()),
        message_id: e.field("sluice-message-id"),
        problems,
    }
}

/// The headers of a row's message, in the order the plugin and the host set them: the row's
/// (`trace`), the reference plugin's (`id`, `event-type`), the host's.
const HEADER_ORDER: [&str; 5] = [
    "trace",
    "id",
    "event-type",
    "sluice-tenant",
    "sluice-outbox-id",
];

/// What [`check_tenant_rows`] checks besides the rows: the full layout of "what travels
/// where" (docs/brokers.md), or only that the rows arrived as messages of their tenant.
#[derive(Clone, Copy, PartialEq)]
enum Check {
    /// Also the order of headers (where the broker keeps one).
    Layout,
    /// Rows, tenant, key, headers and message ids; not the headers' order (the layout is the
    /// four-broker tests' subject, not the failure tests').
    Rows,
}

/// Checks that what reached `broker` is exactly `ids` (tenant `tenant`'s rows, made by
/// [`insert_for`]), each once, routed and keyed as the reference plugin says, with the host's
/// and the plugin's headers (in order where the broker keeps an order, with
/// [`Check::Layout`]), and with the message id `<table>:<outbox id>-0` (the default
/// `message_id_prefix` is the table's name and `:`). Notes what is not so in `findings`.
fn check_tenant_rows(
    findings: &mut Findings,
    check: Check,
    broker: &str,
    tenant: &str,
    table: &str,
    arrived: &[Arrived],
    ids: &BTreeSet<String>,
) {
    let prefix = format!("{table}.");
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for a in arrived {
        for (kind, why) in &a.problems {
            findings.expect(false, format!("{broker}: {kind}"), || why.clone());
        }
        let example = || format!("{a:?}");
        let id = a.one("sluice-outbox-id").unwrap_or_default().to_owned();
        findings.expect(
            !id.is_empty(),
            format!("{broker}: one sluice-outbox-id header"),
            example,
        );
        findings.expect(
            a.one("sluice-tenant") == Some(tenant),
            format!("{broker}: only tenant {tenant}'s messages, with sluice-tenant"),
            example,
        );
        findings.expect(
            a.one("id") == Some(id.as_str()),
            format!("{broker}: the plugin's id header is the outbox id"),
            example,
        );
        let Some(n) = a.payload["n"].as_i64() else {
            findings.expect(false, format!("{broker}: payload as written"), example);
            continue;
        };
        let (suffix, event) = if n % 2 == 0 {
            ("order", "OrderCreated")
        } else {
            ("customer", "CustomerUpdated")
        };
        findings.expect(
            a.destination == format!("{prefix}{suffix}"),
            format!("{broker}: the destination is the plugin's topic"),
            example,
        );
        findings.expect(
            a.key == Some(format!("agg-{}", n % 50)),
            format!("{broker}: the key where the broker carries it"),
            example,
        );
        findings.expect(
            a.one("trace") == Some(format!("trace-{n}").as_str()),
            format!("{broker}: the row's own header"),
            example,
        );
        // Row 0's own event-type first, then the plugin's: a repeated name keeps both.
        let events: &[&str] = if n == 0 {
            &["Replayed", event]
        } else {
            &[event]
        };
        findings.expect(
            a.values("event-type") == events,
            format!("{broker}: a repeated header keeps every value, in order"),
            example,
        );
        if let Some(order) = a.order.as_ref().filter(|_| check == Check::Layout) {
            let mut placed: Vec<&str> = order
                .iter()
                .map(String::as_str)
                .filter(|name| HEADER_ORDER.contains(name))
                .collect();
            if n == 0 {
                // Where the row's own event-type sits among its headers is the database's
                // JSON order; only the plugin's is placed.
                if let Some(first) = placed.iter().position(|name| *name == "event-type") {
                    placed.remove(first);
                }
            }
            findings.expect(
                placed == HEADER_ORDER,
                format!("{broker}: headers in order"),
                || format!("{placed:?} in {a:?}"),
            );
        }
        if broker != "kafka" {
            findings.expect(
                a.message_id == Some(format!("{table}:{id}-0")),
                format!("{broker}: message id <table>:<outbox id>-0"),
                example,
            );
        }
        *seen.entry(id).or_default() += 1;
    }
    let delivered: BTreeSet<String> = seen.keys().cloned().collect();
    findings.expect(
        &delivered == ids,
        format!("{broker}: exactly tenant {tenant}'s rows"),
        || format!("expected {ids:?}, got {delivered:?}"),
    );
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    findings.expect(twice.is_empty(), format!("{broker}: each row once"), || {
        format!("{twice:?}")
    });
}

/// [`check_tenant_rows`] of [`Check::Rows`] alone: panics listing what it found.
fn assert_tenant_rows(
    broker: &str,
    tenant: &str,
    table: &str,
    arrived: &[Arrived],
    ids: &BTreeSet<String>,
) {
    let mut findings = Findings::default();
    check_tenant_rows(
        &mut findings,
        Check::Rows,
        broker,
        tenant,
        table,
        arrived,
        ids,
    );
    findings.assert_none();
}

/// The "done when": one relay on `database` with a tenant per broker; every row
/// reaches its tenant's broker, once, and no other.
async fn each_tenants_rows_reach_its_broker_and_no_other(database: Database) {
    let started = Instant::now();
    let table = DbTable::create(database, "brokers").await;
    let brokers = Brokers::create(&table.name).await;
    let mut known = BTreeSet::new();
    let mut ids = BTreeMap::new();
    for (tenant, _) in TENANTS {
        ids.insert(tenant, insert_for(&table, tenant, &mut known).await);
    }
    let relay = start(&config(&table, &brokers, "", &four_tenants())).await;
    let drained = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    assert!(
        drained,
        "{} rows left: {}",
        table.count().await,
        relay.log()
    );
    let exit = relay.stop();
    assert!(exit.success, "relay did not exit 0: {}", exit.log);
    assert_eq!(exit.rows_sent(), Some(4 * ROWS as u64), "{}", exit.log);

    let arrived = brokers.arrivals(ROWS as usize).await;
    // Every broker checked before any failure is reported.
    let mut findings = Findings::default();
    for (tenant, broker) in TENANTS {
        check_tenant_rows(
            &mut findings,
            Check::Layout,
            broker,
            tenant,
            &table.name,
            &arrived[broker],
            &ids[tenant],
        );
    }
    println!(
        "{}: {} rows to four brokers, checked in {:?}",
        database.label(),
        4 * ROWS,
        started.elapsed()
    );
    // Cleaned up first: a broken promise is no reason to leave streams and queues behind.
    brokers.remove().await;
    table.drop_table().await;
    findings.assert_none();
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_rows_reach_each_tenants_broker_and_no_other() {
    each_tenants_rows_reach_its_broker_and_no_other(Database::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_rows_reach_each_tenants_broker_and_no_other() {
    each_tenants_rows_reach_its_broker_and_no_other(Database::Mariadb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_rows_reach_each_tenants_broker_and_no_other() {
    each_tenants_rows_reach_its_broker_and_no_other(Database::Sqlite).await;
}

/// `(aggregate_type, attempts, last_error, dead_at)` of tenant `tenant`'s rows still in the
/// (PostgreSQL) table.
async fn rows_of(table: &DbTable, tenant: &str) -> Vec<Vec<Option<String>>> {
    table
        .text_rows(&format!(
            "SELECT aggregate_type, attempts::text, last_error, dead_at::text FROM {{t}}
              WHERE tenant = '{tenant}' ORDER BY id"
        ))
        .await
}

/// Tenant `lost` on `broker` routes to `<table>.lost.*`, which nothing on that broker takes;
/// tenant `good` on the same broker routes where a stream or queue takes it. `lost`'s rows stay
/// unsent naming their destination, its breaker pauses it, and `good`'s rows keep going.
async fn a_destination_nothing_takes_pauses_only_its_tenant(broker: &str) {
    let started = Instant::now();
    let table = DbTable::create(Database::Postgres, &format!("lost_{broker}")).await;
    let brokers = Brokers::create(&table.name).await;
    let port = free_port();
    let lost_prefix = format!("{}lost.", brokers.prefix);
    let extra = tenant("good", broker)
        + &tenant("lost", broker)
        + &format!(
            "config = {{ topic_prefix = \"{lost_prefix}\" }}\ncircuit_breaker_failures = 3\n\
             circuit_breaker_cooldown = \"1m\"\n\n"
        )
        + "[relay.retry]\ninitial = \"200ms\"\nmax = \"1s\"\nmax_attempts = 100\n\n"
        + &telemetry(port);
    let mut known = BTreeSet::new();
    insert_for(&table, "lost", &mut known).await;
    let mut good = insert_for(&table, "good", &mut known).await;
    let relay = start(&config(&table, &brokers, "mark = \"published_at\"", &extra)).await;

    let unsent_of = |tenant: &'static str| {
        let table = &table;
        async move {
            table
                .scalar_i64(&format!(
                    "SELECT count(*) FROM {{t}} WHERE tenant = '{tenant}' AND published_at IS NULL"
                ))
                .await
        }
    };
    let good_sent = wait_until(SCENARIO_WAIT, || async { unsent_of("good").await == 0 }).await;
    assert!(good_sent, "{broker}: good's rows not sent: {}", relay.log());
    let paused = wait_until(SCENARIO_WAIT, || async {
        relay
            .log()
            .lines()
            .any(|l| l.contains("circuit breaker opened") && l.contains("lost"))
    })
    .await;
    assert!(
        paused,
        "{broker}: tenant lost was not paused: {}",
        relay.log()
    );
    // /readyz lists it as paused (the broker itself is up: it answers its check).
    let listed = wait_until(SCENARIO_WAIT, || async {
        let (_, body) = readyz(port);
        body["paused_tenants"] == serde_json::json!(["lost"]) && body[broker] == true
    })
    .await;
    assert!(
        listed,
        "{broker}: /readyz {:?}\n{}",
        readyz(port),
        relay.log()
    );

    // While lost is paused, good's new rows go on time.
    let more = insert_for(&table, "good", &mut known).await;
    good.extend(more);
    let inserted = Instant::now();
    let on_time = wait_until(ON_TIME, || async { unsent_of("good").await == 0 }).await;
    assert!(on_time, "{broker}: good held up by lost: {}", relay.log());
    let good_latency = inserted.elapsed();

    let lost = rows_of(&table, "lost").await;
    assert_eq!(lost.len(), ROWS as usize);
    for row in &lost {
        let [aggregate, attempts, error, dead] = row.as_slice() else {
            panic!("{row:?}");
        };
        let destination = format!("{lost_prefix}{}", aggregate.as_deref().unwrap_or_default());
        let error = error.as_deref().unwrap_or_default();
        assert!(
            error.contains(&destination),
            "{broker}: last_error does not name {destination}: {row:?}"
        );
        assert!(
            attempts.as_deref().is_some_and(|a| a != "0"),
            "{broker}: the refusal is an attempt: {row:?}"
        );
        assert_eq!(
            dead, &None,
            "{broker}: not dead (100 attempts allowed): {row:?}"
        );
    }
    assert_eq!(
        unsent_of("lost").await,
        ROWS,
        "{broker}: lost's rows not marked sent"
    );
    println!("{broker}: lost's last_error: {:?}", lost[0][2]);
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);

    // The broker got good's rows, once each, and nothing of lost's.
    let arrived = brokers.arrived_at(broker, 2 * ROWS as usize).await;
    assert_tenant_rows(broker, "good", &table.name, &arrived, &good);
    println!(
        "{broker}: lost paused, good's next rows in {good_latency:?}; test took {:?}",
        started.elapsed()
    );
    brokers.remove().await;
    table.drop_table().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_a_subject_no_stream_captures_is_the_tenants_fault() {
    a_destination_nothing_takes_pauses_only_its_tenant("nats").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_a_routing_key_no_queue_is_bound_to_is_the_tenants_fault() {
    a_destination_nothing_takes_pauses_only_its_tenant("rabbitmq").await;
}

/// What `/readyz` on `port` answers, as JSON (`Null` when nothing answers).
fn readyz(port: u16) -> (u16, serde_json::Value) {
    http_get(port, "/readyz").map_or((0, serde_json::Value::Null), |(code, body)| {
        (code, serde_json::from_str(&body).unwrap_or_default())
    })
}

/// NATS is not there when the relay starts: the relay runs, NATS's rows wait without using up
/// their attempts while Kafka's go, `/readyz` says `nats: false`; once a server listens (with
/// the stream kept in its store) the rows go and the relay is ready.
#[tokio::test(flavor = "multi_thread")]
async fn nats_down_at_start_holds_its_rows_back_until_it_is_up() {
    let started = Instant::now();
    let table = DbTable::create(Database::Postgres, "nats_outage").await;
    let prefix = format!("{}.", table.name);
    let names = vec![format!("{prefix}order"), format!("{prefix}customer")];
    create_topics(&kafka_bootstrap(), &names)
        .await
        .expect("create Kafka topics");
    // The stream is made on the server's store beforehand, so it is there the moment the
    // server comes back: the relay cannot publish into a gap before the test could make it.
    let store = tempfile::tempdir().expect("store directory");
    let nats_port = free_port();
    let server = OwnNats::start(nats_port, store.path()).expect("start nats-server");
    let url = server.url();
    NatsStreams::connect(&url)
        .await
        .expect("own NATS")
        .create_stream(&table.name, &names)
        .await
        .expect("create the stream");
    server.stop().expect("stop nats-server");

    let port = free_port();
    let extra = format!("[nats]\nurl = \"{url}\"\ntimeout = \"5s\"\n\n")
        + &tenant("to-nats", "nats")
        + "[relay.retry]\ninitial = \"200ms\"\nmax = \"1s\"\nmax_attempts = 3\n\n"
        + &telemetry(port);
    let config = table.config(&kafka_bootstrap(), &prefix, "", "", "") + &extra;
    let mut known = BTreeSet::new();
    let held = insert_for(&table, "to-nats", &mut known).await;
    let kafkas = insert_for(&table, "to-kafka", &mut known).await;
    let mut relay = start(&config).await;

    let unready = wait_until(SCENARIO_WAIT, || async {
        let (code, body) = readyz(port);
        code == 503 && body["nats"] == false && body["kafka"] == true
    })
    .await;
    assert!(unready, "/readyz: {:?}\n{}", readyz(port), relay.log());
    let (_, body) = readyz(port);
    assert!(
        body["nats_error"].as_str().is_some_and(|e| !e.is_empty()),
        "/readyz says why: {body}"
    );
    let kafka_sent = wait_until(SCENARIO_WAIT, || async {
        table
            .scalar_i64("SELECT count(*) FROM {t} WHERE tenant = 'to-kafka'")
            .await
            == 0
    })
    .await;
    assert!(kafka_sent, "Kafka's rows held up by NATS: {}", relay.log());
    // Many retries' worth (200 ms to 1 s apart): were they attempts, 3 would be used up.
    relay
        .sleep(Duration::from_secs(8))
        .await
        .expect("relay runs");
    let waiting = table
        .text_rows(
            "SELECT attempts::text, dead_at::text, last_error FROM {t}
              WHERE tenant = 'to-nats' ORDER BY id",
        )
        .await;
    assert_eq!(
        waiting.len(),
        ROWS as usize,
        "NATS's rows wait: {}",
        relay.log()
    );
    for row in &waiting {
        assert_eq!(row[1], None, "not dead: {row:?}");
        let attempts: i64 = row[0].as_deref().unwrap_or("0").parse().expect("attempts");
        assert!(
            attempts < 3,
            "attempts used up while NATS was down: {row:?}"
        );
    }
    println!("while NATS was down: {:?}", waiting[0]);

    let server = OwnNats::start(nats_port, store.path()).expect("restart nats-server");
    let back_at = Instant::now();
    let sent = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    assert!(sent, "rows not sent once NATS was up: {}", relay.log());
    let delivered_after = back_at.elapsed();
    let ready = wait_until(SCENARIO_WAIT, || async {
        let (code, body) = readyz(port);
        code == 200 && body["nats"] == true
    })
    .await;
    assert!(ready, "/readyz: {:?}\n{}", readyz(port), relay.log());
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);

    let got = NatsStreams::connect(&server.url())
        .await
        .expect("own NATS")
        .read_stream(&table.name, ROWS as usize, ON_TIME, SETTLE)
        .await
        .expect("read the stream");
    let arrived: Vec<Arrived> = got.iter().map(from_nats).collect();
    assert_tenant_rows("nats", "to-nats", &table.name, &arrived, &held);
    let kafka =
        consume(&kafka_bootstrap(), &names, ROWS as usize, ON_TIME, SETTLE).expect("read Kafka");
    let kafka: Vec<Arrived> = kafka.iter().map(from_kafka).collect();
    assert_tenant_rows("kafka", "to-kafka", &table.name, &kafka, &kafkas);
    println!(
        "NATS outage: delivered {delivered_after:?} after the server came back; test took {:?}",
        started.elapsed()
    );
    drop(server);
    table.drop_table().await;
}

/// `/readyz`, `/metrics` and `/status` of a relay publishing to all four brokers name each.
#[tokio::test(flavor = "multi_thread")]
async fn readyz_metrics_and_status_name_every_broker() {
    let started = Instant::now();
    let table = DbTable::create(Database::Postgres, "brokers_seen").await;
    let brokers = Brokers::create(&table.name).await;
    let port = free_port();
    let mut known = BTreeSet::new();
    for (tenant, _) in TENANTS {
        insert_for(&table, tenant, &mut known).await;
    }
    let relay = start(&config(
        &table,
        &brokers,
        "",
        &(four_tenants() + &telemetry(port)),
    ))
    .await;
    let drained = wait_until(SCENARIO_WAIT, || async { table.count().await == 0 }).await;
    assert!(drained, "{}", relay.log());

    let mut last = String::new();
    let counted = wait_until(SCENARIO_WAIT, || {
        if let Some((200, text)) = http_get(port, "/metrics") {
            last = text;
        }
        let m = parse_metrics(&last);
        let ok = TENANTS.iter().all(|(tenant, broker)| {
            metric_sum(
                &m,
                "sluice_dependency_up",
                &[&format!("dependency=\"{broker}\"")],
            ) == 1.0
                && metric_sum(
                    &m,
                    "sluice_messages_produced_total",
                    &[
                        &format!("broker=\"{broker}\""),
                        &format!("tenant=\"{tenant}\""),
                    ],
                ) == ROWS as f64
        });
        async move { ok }
    })
    .await;
    assert!(counted, "/metrics never counted every broker:\n{last}");
    let m = parse_metrics(&last);
    for broker in ["kafka", "nats", "rabbitmq", "redis"] {
        // Each message once, under its broker only.
        assert_eq!(
            metric_sum(
                &m,
                "sluice_messages_produced_total",
                &[&format!("broker=\"{broker}\"")]
            ),
            ROWS as f64,
            "{broker}"
        );
    }
    assert!(
        last.contains("sluice_dependency_up{dependency=\"redis\"} 1"),
        "{last}"
    );
    let order = format!("topic=\"{}order\"", brokers.prefix);
    assert!(
        metric_sum(
            &m,
            "sluice_messages_produced_total",
            &["broker=\"redis\"", &order]
        ) > 0.0,
        "produced_total is labelled by stream key: {last}"
    );

    let ready = wait_until(SCENARIO_WAIT, || async { readyz(port).0 == 200 }).await;
    assert!(ready, "/readyz: {:?}\n{}", readyz(port), relay.log());
    let (_, ready) = readyz(port);
    for broker in ["kafka", "nats", "rabbitmq", "redis"] {
        assert_eq!(ready[broker], true, "{broker}: {ready}");
        assert_eq!(
            ready[format!("{broker}_error")],
            serde_json::Value::Null,
            "{broker}: {ready}"
        );
    }
    let (code, status) = http_get(port, "/status").expect("status");
    assert_eq!(code, 200, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    assert_eq!(
        status["brokers_up"],
        serde_json::json!({"kafka": true, "nats": true, "rabbitmq": true, "redis": true}),
        "{status}"
    );
    let exit = relay.stop();
    assert!(exit.success, "{}", exit.log);
    println!("observability of four brokers: {:?}", started.elapsed());
    brokers.remove().await;
    table.drop_table().await;
}

/// `sluice config check --config <file>` with `config` (and `--connect`).
fn check(config: &str, connect: bool) -> std::process::Output {
    let mut args = vec!["config", "check"];
    if connect {
        args.push("--connect");
    }
    sluice_with_config(&args, config)
}

/// The lines of stdout naming a problem at `key`.
fn problems_at(out: &std::process::Output, key: &str) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!(": {key}: ")))
        .map(str::to_owned)
        .collect()
}

fn outputs(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}stderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn config_check_names_the_broker_key_of_a_section_that_is_missing() {
    let good = relay_config("outbox", &kafka_bootstrap(), "checked.", "", "");
    let out = check(&(good.clone() + &tenant("acme", "nats")), false);
    assert_eq!(out.status.code(), Some(1), "{}", outputs(&out));
    let named = problems_at(&out, "tenants.acme.broker");
    assert!(
        named.iter().any(|l| l.contains("nats")),
        "no problem at tenants.acme.broker naming nats: {}",
        outputs(&out)
    );

    let default_to_redis = RelayConfig {
        default_plugin_extra: Some("broker = \"redis\"".to_owned()),
        ..RelayConfig::for_tests("outbox", &kafka_bootstrap(), "checked.")
    }
    .render();
    let out = check(&default_to_redis, false);
    assert_eq!(out.status.code(), Some(1), "{}", outputs(&out));
    assert!(
        problems_at(&out, "plugins.default.broker")
            .iter()
            .any(|l| l.contains("redis")),
        "{}",
        outputs(&out)
    );

    // With the sections there, the same tenants pass.
    let sections = format!(
        "[nats]\nurl = \"{}\"\n\n[redis]\nurl = \"{}\"\n\n",
        nats_url(),
        redis_url()
    );
    let out = check(&(good + &sections + &tenant("acme", "nats")), false);
    assert!(out.status.success(), "{}", outputs(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn config_check_connect_names_each_broker_that_does_not_answer() {
    let table = DbTable::create(Database::Postgres, "brokers_check").await;
    let brokers = Brokers::create(&table.name).await;
    let good = config(&table, &brokers, "", &four_tenants());
    let out = check(&good, true);
    assert!(out.status.success(), "{}", outputs(&out));

    // A wrong RabbitMQ password, and nothing listening where NATS and Redis should be.
    let secret = "not-the-guest-password";
    let nobody = |scheme: &str| format!("{scheme}://127.0.0.1:{}", free_port());
    let bad = good
        .replace(
            &rabbitmq_url(),
            &rabbitmq_url().replace("guest@", &format!("{secret}@")),
        )
        .replace(&nats_url(), &nobody("nats"))
        .replace(&redis_url(), &nobody("redis"));
    assert!(bad.contains(secret), "{bad}");
    let out = check(&bad, true);
    assert_eq!(out.status.code(), Some(1), "{}", outputs(&out));
    for key in ["rabbitmq", "nats", "redis"] {
        assert_eq!(
            problems_at(&out, key).len(),
            1,
            "one problem at {key}: {}",
            outputs(&out)
        );
    }
    assert!(
        problems_at(&out, "kafka").is_empty() && problems_at(&out, "database").is_empty(),
        "{}",
        outputs(&out)
    );
    assert!(
        !outputs(&out).contains(secret),
        "the password is printed: {}",
        outputs(&out)
    );
    // The clients' own complaints are not printed besides the problems.
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "3 problems\n",
        "{}",
        outputs(&out)
    );
    brokers.remove().await;
    table.drop_table().await;
}
