//! A Confluent-API-compatible Schema Registry for the tests: no registry server can be
//! installed on these machines (Karapace is not on PyPI; Confluent's and Apicurio need Maven
//! or Docker). It serves the part of the REST API that producers and deserializers use, with
//! the registry's error codes:
//!
//! - `GET /subjects`, `GET /subjects/{s}/versions`, `GET /subjects/{s}/versions/{v|latest}`
//!   (and `…/schema`), `GET /schemas/ids/{id}` (and `…/schema`)
//! - `POST /subjects/{s}` (look a schema up), `POST /subjects/{s}/versions` (register: the
//!   existing id when the schema is already there, 409 when the subject's compatibility level
//!   refuses it, 422 when it is not a schema)
//! - `POST /compatibility/subjects/{s}/versions/{v|latest}`, `GET`/`PUT /config[/{s}]`
//! - `DELETE /subjects/{s}`
//! - HTTP basic or bearer authentication ([`TestRegistry::require_basic_auth`],
//!   [`TestRegistry::require_bearer`])
//! - errors 40101 (credentials), 40401 (subject), 40402 (version), 40403 (schema), 409,
//!   42201 (invalid schema), 42202 (invalid version), 50001 (while [`TestRegistry::fail`])
//!
//! Compatibility is checked for Avro only (apache-avro's `SchemaCompatibility`: BACKWARD,
//! FORWARD, FULL and their `_TRANSITIVE` forms, NONE); a new Protobuf or JSON schema is always
//! accepted (no test relies on their compatibility rules). Runs on its own thread and runtime,
//! so sync and async tests alike can use it. Counts every request, for the tests that check
//! the relay's cache.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// A running test registry; stops when dropped.
pub struct TestRegistry {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    requests: AtomicUsize,
    /// Answer 500 to everything.
    failing: AtomicBool,
    /// `user:password` required, when set.
    credentials: Mutex<Option<String>>,
    /// A bearer token required, when set.
    token: Mutex<Option<String>>,
}

#[derive(Default)]
struct State {
    /// Schemas by id (ids start at 1, shared across subjects like Confluent's).
    schemas: Vec<Stored>,
    /// Per subject, the ids of its versions (version n is `versions[n - 1]`).
    subjects: BTreeMap<String, Vec<u32>>,
    global_level: Option<String>,
    levels: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq)]
struct Stored {
    schema_type: String,
    schema: String,
}

type Answer = (StatusCode, Value);

impl TestRegistry {
    /// Starts a registry on a free loopback port.
    pub fn start() -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = Arc::clone(&shared);
        std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                tokio::select! {
                    () = serve(listener, served) => {}
                    _ = stopped => {}
                }
            });
        });
        Ok(Self {
            addr,
            shared,
            _stop: stop,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests served so far (all paths, failed ones included).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// The subjects registered so far.
    pub fn subjects(&self) -> Vec<String> {
        self.shared
            .state
            .lock()
            .unwrap()
            .subjects
            .keys()
            .cloned()
            .collect()
    }

    /// Requires HTTP basic authentication from now on.
    pub fn require_basic_auth(&self, user: &str, password: &str) {
        *self.shared.credentials.lock().unwrap() = Some(format!("{user}:{password}"));
    }

    /// Requires `Authorization: Bearer <token>` from now on.
    pub fn require_bearer(&self, token: &str) {
        *self.shared.token.lock().unwrap() = Some(token.to_owned());
    }

    /// While `true`, every request gets a 500.
    pub fn fail(&self, failing: bool) {
        self.shared.failing.store(failing, Ordering::SeqCst);
    }

    /// Registers `schema` under `subject` directly (as a schema-management pipeline would);
    /// returns its id.
    pub fn register(&self, subject: &str, schema_type: &str, schema: &str) -> u32 {
        let mut state = self.shared.state.lock().unwrap();
        match register(&mut state, subject, schema_type, schema) {
            (StatusCode::OK, answer) => answer["id"].as_u64().unwrap_or(0) as u32,
            (status, answer) => panic!("test registry refused {subject}: {status} {answer}"),
        }
    }
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(handle(&shared, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(shared: &Shared, request: Request<Incoming>) -> Response<Full<Bytes>> {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let (status, body) = if !authorized(shared, &request) {
        error(StatusCode::UNAUTHORIZED, 40101, "Unauthorized")
    } else if shared.failing.load(Ordering::SeqCst) {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            50001,
            "Error in the backend data store",
        )
    } else {
        let method = request.method().clone();
        // `?format=serialized`: Protobuf schemas as a base64 FileDescriptorProto, which is how
        // confluent-kafka's Python deserializer asks for them.
        let serialized = request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "format=serialized"));
        let path: Vec<String> = request
            .uri()
            .path()
            .split('/')
            .filter(|s| !s.is_empty())
            .map(decode)
            .collect();
        let body = request
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut state = shared.state.lock().unwrap();
        route(&mut state, &method, &path, &body, serialized)
    };
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/vnd.schemaregistry.v1+json"),
    );
    response
}

fn authorized(shared: &Shared, request: &Request<Incoming>) -> bool {
    if let Some(token) = shared.token.lock().unwrap().clone() {
        let given = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        return given == Some(token.as_str());
    }
    let Some(expected) = shared.credentials.lock().unwrap().clone() else {
        return true;
    };
    let given = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64_decode(b.trim()));
    given.as_deref() == Some(expected.as_bytes())
}

fn route(
    state: &mut State,
    method: &Method,
    path: &[String],
    body: &Value,
    serialized: bool,
) -> Answer {
    let parts: Vec<&str> = path.iter().map(String::as_str).collect();
    match (method, parts.as_slice()) {
        (&Method::GET, ["subjects"]) => (
            StatusCode::OK,
            json!(state.subjects.keys().collect::<Vec<_>>()),
        ),
        (&Method::GET, ["subjects", s, "versions"]) => match state.subjects.get(*s) {
            Some(ids) => (StatusCode::OK, json!((1..=ids.len()).collect::<Vec<_>>())),
            None => subject_not_found(s),
        },
        (&Method::GET, ["subjects", s, "versions", v]) => version(state, s, v, false),
        (&Method::GET, ["subjects", s, "versions", v, "schema"]) => version(state, s, v, true),
        (&Method::GET, ["schemas", "ids", id]) if serialized => by_id_serialized(state, id),
        (&Method::GET, ["schemas", "ids", id]) => by_id(state, id, false),
        (&Method::GET, ["schemas", "ids", id, "schema"]) => by_id(state, id, true),
        (&Method::POST, ["subjects", s]) => lookup(state, s, body),
        (&Method::POST, ["subjects", s, "versions"]) => match schema_of(body) {
            Some((t, schema)) => register(state, s, &t, &schema),
            None => error(StatusCode::UNPROCESSABLE_ENTITY, 42201, "Invalid schema"),
        },
        (&Method::POST, ["compatibility", "subjects", s, "versions", v]) => {
            let Some((t, schema)) = schema_of(body) else {
                return error(StatusCode::UNPROCESSABLE_ENTITY, 42201, "Invalid schema");
            };
            match state.subjects.get(*s).and_then(|ids| pick(ids, v)) {
                Some(id) => {
                    let old = state.schemas[(id - 1) as usize].clone();
                    let ok = compatible(
                        &level(state, s),
                        &[old],
                        &Stored {
                            schema_type: t,
                            schema,
                        },
                    );
                    (StatusCode::OK, json!({"is_compatible": ok.is_ok()}))
                }
                None => subject_not_found(s),
            }
        }
        (&Method::GET, ["config"]) => (
            StatusCode::OK,
            json!({"compatibilityLevel": state.global_level.clone().unwrap_or_else(|| "BACKWARD".into())}),
        ),
        (&Method::GET, ["config", s]) => (
            StatusCode::OK,
            json!({"compatibilityLevel": level(state, s)}),
        ),
        (&Method::PUT, ["config"]) | (&Method::PUT, ["config", _]) => {
            let Some(l) = body["compatibility"].as_str().map(str::to_owned) else {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    42203,
                    "Invalid compatibility level",
                );
            };
            match parts.get(1) {
                Some(s) => {
                    state.levels.insert((*s).to_owned(), l.clone());
                }
                None => state.global_level = Some(l.clone()),
            }
            (StatusCode::OK, json!({"compatibility": l}))
        }
        (&Method::DELETE, ["subjects", s]) => match state.subjects.remove(*s) {
            Some(ids) => (StatusCode::OK, json!((1..=ids.len()).collect::<Vec<_>>())),
            None => subject_not_found(s),
        },
        _ => error(StatusCode::NOT_FOUND, 404, "HTTP 404 Not Found"),
    }
}

fn error(status: StatusCode, code: i64, message: &str) -> Answer {
    (status, json!({"error_code": code, "message": message}))
}

fn subject_not_found(s: &str) -> Answer {
    error(
        StatusCode::NOT_FOUND,
        40401,
        &format!("Subject '{s}' not found."),
    )
}

fn level(state: &State, subject: &str) -> String {
    state
        .levels
        .get(subject)
        .or(state.global_level.as_ref())
        .cloned()
        .unwrap_or_else(|| "BACKWARD".into())
}

fn pick(ids: &[u32], v: &str) -> Option<u32> {
    match v {
        "latest" | "-1" => ids.last().copied(),
        n => n
            .parse::<usize>()
            .ok()
            .filter(|&n| n >= 1)
            .and_then(|n| ids.get(n - 1).copied()),
    }
}

fn described(state: &State, subject: &str, version: usize, id: u32) -> Value {
    let stored = &state.schemas[(id - 1) as usize];
    let mut answer =
        json!({"subject": subject, "version": version, "id": id, "schema": stored.schema});
    // Confluent leaves schemaType out for Avro.
    if stored.schema_type != "AVRO" {
        answer["schemaType"] = json!(stored.schema_type);
    }
    answer
}

fn version(state: &State, s: &str, v: &str, raw: bool) -> Answer {
    let Some(ids) = state.subjects.get(s) else {
        return subject_not_found(s);
    };
    if v != "latest" && v != "-1" && v.parse::<usize>().map_or(true, |n| n == 0) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            42202,
            "The specified version is not a valid version id",
        );
    }
    match pick(ids, v) {
        Some(id) => {
            let version = ids.iter().position(|&i| i == id).map_or(0, |p| p + 1);
            if raw {
                let schema: Value = serde_json::from_str(&state.schemas[(id - 1) as usize].schema)
                    .unwrap_or_else(|_| json!(state.schemas[(id - 1) as usize].schema));
                (StatusCode::OK, schema)
            } else {
                (StatusCode::OK, described(state, s, version, id))
            }
        }
        None => error(StatusCode::NOT_FOUND, 40402, "Version not found."),
    }
}

fn by_id(state: &State, id: &str, raw: bool) -> Answer {
    let stored = id
        .parse::<usize>()
        .ok()
        .filter(|&i| i >= 1)
        .and_then(|i| state.schemas.get(i - 1));
    match stored {
        Some(s) if raw => (
            StatusCode::OK,
            serde_json::from_str(&s.schema).unwrap_or_else(|_| json!(s.schema)),
        ),
        Some(s) => {
            let mut answer = json!({"schema": s.schema});
            if s.schema_type != "AVRO" {
                answer["schemaType"] = json!(s.schema_type);
            }
            (StatusCode::OK, answer)
        }
        None => error(StatusCode::NOT_FOUND, 40403, "Schema not found"),
    }
}

fn by_id_serialized(state: &State, id: &str) -> Answer {
    let answer = by_id(state, id, false);
    if answer.0 != StatusCode::OK || answer.1["schemaType"] != "PROTOBUF" {
        return answer;
    }
    let text = answer.1["schema"].as_str().unwrap_or_default();
    match descriptor(text) {
        Ok(bytes) => {
            use base64::Engine as _;
            let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
            (
                StatusCode::OK,
                json!({"schema": encoded, "schemaType": "PROTOBUF"}),
            )
        }
        Err(e) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            42201,
            &format!("Invalid schema: {e}"),
        ),
    }
}

/// A `.proto` text compiled to its FileDescriptorProto bytes (protox; well-known imports
/// resolve to its bundled copies).
fn descriptor(text: &str) -> Result<Vec<u8>, String> {
    use prost::Message as _;
    struct Source(String);
    impl protox::file::FileResolver for Source {
        fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
            if name == "schema.proto" {
                protox::file::File::from_source(name, &self.0)
            } else {
                Err(protox::Error::file_not_found(name))
            }
        }
    }
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(Source(text.to_owned()));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler
        .open_file("schema.proto")
        .map_err(|e| e.to_string())?;
    let set = compiler.file_descriptor_set();
    let file = set
        .file
        .into_iter()
        .find(|f| f.name() == "schema.proto")
        .ok_or("schema.proto did not compile")?;
    Ok(file.encode_to_vec())
}

fn schema_of(body: &Value) -> Option<(String, String)> {
    let schema = body["schema"].as_str()?.to_owned();
    let t = body["schemaType"].as_str().unwrap_or("AVRO").to_owned();
    Some((t, schema))
}

fn lookup(state: &State, s: &str, body: &Value) -> Answer {
    let Some((t, schema)) = schema_of(body) else {
        return error(StatusCode::UNPROCESSABLE_ENTITY, 42201, "Invalid schema");
    };
    let Some(ids) = state.subjects.get(s) else {
        return subject_not_found(s);
    };
    let wanted = Stored {
        schema_type: t,
        schema,
    };
    match ids
        .iter()
        .position(|&id| same(&state.schemas[(id - 1) as usize], &wanted))
    {
        Some(p) => (StatusCode::OK, described(state, s, p + 1, ids[p])),
        None => error(StatusCode::NOT_FOUND, 40403, "Schema not found"),
    }
}

fn register(state: &mut State, s: &str, t: &str, schema: &str) -> Answer {
    let wanted = Stored {
        schema_type: t.to_owned(),
        schema: schema.to_owned(),
    };
    if let Err(e) = valid(&wanted) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            42201,
            &format!("Invalid schema: {e}"),
        );
    }
    let existing: Vec<Stored> = state
        .subjects
        .get(s)
        .map(|ids| {
            ids.iter()
                .map(|&id| state.schemas[(id - 1) as usize].clone())
                .collect()
        })
        .unwrap_or_default();
    if let Some(p) = existing.iter().position(|e| same(e, &wanted)) {
        let id = state.subjects[s][p];
        return (StatusCode::OK, json!({"id": id}));
    }
    if let Err(e) = compatible(&level(state, s), &existing, &wanted) {
        return error(
            StatusCode::CONFLICT,
            409,
            &format!(
                "Schema being registered is incompatible with an earlier schema for subject \"{s}\": {e}"
            ),
        );
    }
    // The same schema under another subject keeps its id.
    let id = match state.schemas.iter().position(|e| same(e, &wanted)) {
        Some(p) => p as u32 + 1,
        None => {
            state.schemas.push(wanted);
            state.schemas.len() as u32
        }
    };
    state.subjects.entry(s.to_owned()).or_default().push(id);
    (StatusCode::OK, json!({"id": id}))
}

fn valid(s: &Stored) -> Result<(), String> {
    match s.schema_type.as_str() {
        "AVRO" => apache_avro::Schema::parse_str(&s.schema)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "JSON" => serde_json::from_str::<Value>(&s.schema)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "PROTOBUF" => descriptor(&s.schema).map(|_| ()),
        other => Err(format!("unknown schemaType {other}")),
    }
}

/// The same schema: Avro compared by canonical form, others by text.
fn same(a: &Stored, b: &Stored) -> bool {
    if a.schema_type != b.schema_type {
        return false;
    }
    if a.schema_type == "AVRO"
        && let (Ok(x), Ok(y)) = (
            apache_avro::Schema::parse_str(&a.schema),
            apache_avro::Schema::parse_str(&b.schema),
        )
    {
        return x.canonical_form() == y.canonical_form();
    }
    a.schema == b.schema
}

/// Whether `new` may follow `existing` (oldest first) under `level`.
fn compatible(level: &str, existing: &[Stored], new: &Stored) -> Result<(), String> {
    if new.schema_type != "AVRO" || level == "NONE" {
        return Ok(());
    }
    let transitive = level.ends_with("_TRANSITIVE");
    let against: &[Stored] = if transitive {
        existing
    } else {
        existing.last().map(std::slice::from_ref).unwrap_or(&[])
    };
    let reader = apache_avro::Schema::parse_str(&new.schema).map_err(|e| e.to_string())?;
    for old in against.iter().filter(|o| o.schema_type == "AVRO") {
        let writer = apache_avro::Schema::parse_str(&old.schema).map_err(|e| e.to_string())?;
        let check = |w: &apache_avro::Schema, r: &apache_avro::Schema| {
            apache_avro::schema_compatibility::SchemaCompatibility::can_read(w, r)
                .map_err(|e| e.to_string())
        };
        match level.trim_end_matches("_TRANSITIVE") {
            "BACKWARD" => check(&writer, &reader)?,
            "FORWARD" => check(&reader, &writer)?,
            _ => {
                check(&writer, &reader)?;
                check(&reader, &writer)?;
            }
        }
    }
    Ok(())
}

fn decode(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned()
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}
