//! NATS JetStream from the harness: a stream capturing the subjects a test publishes to, a
//! stream's messages read from the start the way a consumer sees them (subject, headers,
//! payload) or only counted, and a `nats-server` of the caller's own that a test may stop and
//! start again.
//!
//! Messages are read by stream sequence (`STREAM.MSG.GET`), not through a consumer: a read
//! leaves nothing behind on the server and may be repeated, so a test can wait for messages
//! and then look again for extras. The stored header block is parsed here, not by the client:
//! async-nats 0.52's `Stream::get_raw_message` keeps only the last value of a repeated header
//! name (its `parse_headers` inserts), which would hide what a publisher sent twice.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream::{self, stream};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

/// How long the harness's own requests to the server may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a fresh `nats-server` may take to listen, and to exit after SIGTERM.
const PROCESS_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two reads of a stream that has not got everything yet.
const POLL: Duration = Duration::from_millis(100);

/// One message of a stream, as stored.
#[derive(Debug, Clone)]
pub struct NatsMessage {
    /// The subject it was published to.
    pub subject: String,
    /// Its sequence number in the stream.
    pub sequence: u64,
    /// Its headers (JetStream's own, such as `Nats-Msg-Id`, included) in the order stored,
    /// a repeated name once per value. (A publisher using async-nats sends them from a map:
    /// the order between names is not the one it was given.)
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body (empty for a tombstone).
    pub payload: Vec<u8>,
}

impl NatsMessage {
    /// The first value of header `name`, as text (lossy UTF-8).
    pub fn header(&self, name: &str) -> Option<String> {
        self.header_values(name).into_iter().next()
    }

    /// Every value of header `name`, in order, as text (lossy UTF-8).
    pub fn header_values(&self, name: &str) -> Vec<String> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    /// The body as JSON (`Null` if it is empty or not JSON).
    pub fn payload_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).unwrap_or(serde_json::Value::Null)
    }
}

/// A connection to a NATS server with JetStream, for making, reading and removing streams.
pub struct NatsStreams {
    jetstream: jetstream::Context,
}

impl NatsStreams {
    /// Connects to `url` (`nats://host:port`); fails at once if nothing answers there.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(REQUEST_TIMEOUT)
            .request_timeout(Some(REQUEST_TIMEOUT))
            .connect(url)
            .await
            .with_context(|| format!("cannot connect to NATS at {url}"))?;
        Ok(Self::new(jetstream::new(client)))
    }

    /// Streams administered through `jetstream`, a context its maker configured (the
    /// benchmark's has the sink's timeouts and publishes on the same connection).
    pub fn new(jetstream: jetstream::Context) -> Self {
        Self { jetstream }
    }

    /// Creates stream `name` (file storage) capturing exactly `subjects`; a stream of that name
    /// with the same subjects is fine.
    pub async fn create_stream(&self, name: &str, subjects: &[String]) -> anyhow::Result<()> {
        self.jetstream
            .get_or_create_stream(stream::Config {
                name: name.to_owned(),
                subjects: subjects.to_vec(),
                ..stream::Config::default()
            })
            .await
            .with_context(|| format!("cannot create stream {name} for {subjects:?}"))?;
        Ok(())
    }

    /// Deletes stream `name` with its messages.
    pub async fn delete_stream(&self, name: &str) -> anyhow::Result<()> {
        self.jetstream
            .delete_stream(name)
            .await
            .with_context(|| format!("cannot delete stream {name}"))?;
        Ok(())
    }

    /// How many messages stream `name` holds now (counted by the server, none read).
    pub async fn message_count(&self, name: &str) -> anyhow::Result<u64> {
        Ok(self.state(name).await?.messages)
    }

    /// Stream `name`'s state: its message count and sequence range.
    async fn state(&self, name: &str) -> anyhow::Result<stream::State> {
        let mut stream = self
            .jetstream
            .get_stream(name)
            .await
            .with_context(|| format!("no stream {name}"))?;
        Ok(stream
            .info()
            .await
            .with_context(|| format!("cannot read the state of stream {name}"))?
            .state
            .clone())
    }

    /// Every message stream `name` holds now, in sequence order.
    pub async fn messages(&self, name: &str) -> anyhow::Result<Vec<NatsMessage>> {
        let state = self.state(name).await?;
        let mut out = Vec::new();
        if state.messages == 0 {
            return Ok(out);
        }
        for sequence in state.first_sequence..=state.last_sequence {
            if let Some(message) = self.message(name, sequence).await? {
                out.push(message);
            }
        }
        Ok(out)
    }

    /// Message `sequence` of stream `name`; `None` for a gap (deleted, or trimmed meanwhile).
    async fn message(&self, name: &str, sequence: u64) -> anyhow::Result<Option<NatsMessage>> {
        let reply: serde_json::Value = self
            .jetstream
            .request(
                format!("STREAM.MSG.GET.{name}"),
                &serde_json::json!({ "seq": sequence }),
            )
            .await
            .with_context(|| format!("cannot read {name} #{sequence}"))?;
        if let Some(error) = reply.get("error") {
            // JetStream's "no message found".
            if error["err_code"] == 10037 {
                return Ok(None);
            }
            bail!("cannot read {name} #{sequence}: {error}");
        }
        let stored = &reply["message"];
        let text = |key: &str| stored[key].as_str().unwrap_or_default();
        let decode = |key: &str| {
            BASE64
                .decode(text(key))
                .with_context(|| format!("{name} #{sequence}: {key} is not base64"))
        };
        Ok(Some(NatsMessage {
            subject: text("subject").to_owned(),
            sequence,
            headers: parse_headers(&decode("hdrs")?)
                .with_context(|| format!("{name} #{sequence}: malformed headers"))?,
            payload: decode("data")?,
        }))
    }

    /// Reads stream `name` until it holds at least `expected` messages, then once more after
    /// `settle` (so extras show), or until `timeout` passed: what it holds then.
    pub async fn read_stream(
        &self,
        name: &str,
        expected: usize,
        timeout: Duration,
        settle: Duration,
    ) -> anyhow::Result<Vec<NatsMessage>> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.messages(name).await?;
            if got.len() >= expected {
                tokio::time::sleep(settle).await;
                return self.messages(name).await;
            }
            if Instant::now() > deadline {
                return Ok(got);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// A NATS header block (`NATS/1.0\r\nName: value\r\n…\r\n\r\n`; empty: no headers) as
/// (name, value) pairs in order, repeats kept.
fn parse_headers(block: &[u8]) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let text = std::str::from_utf8(block).context("not UTF-8")?;
    let mut lines = text.split("\r\n");
    match lines.next() {
        None | Some("") => return Ok(Vec::new()),
        Some(version) if version.starts_with("NATS/1.0") => {}
        Some(other) => bail!("no NATS/1.0 line: {other:?}"),
    }
    lines
        .filter(|l| !l.is_empty())
        .map(|line| {
            let (name, value) = line
                .split_once(':')
                .with_context(|| format!("not a header line: {line:?}"))?;
            Ok((name.to_owned(), value.trim().as_bytes().to_vec()))
        })
        .collect()
}

/// A `nats-server -js` of the caller's own on 127.0.0.1, its JetStream store in a directory the
/// caller keeps (so streams outlive a restart). Dropping it kills the process.
pub struct OwnNats {
    child: Child,
    port: u16,
}

impl OwnNats {
    /// Starts `nats-server -js -p port -sd store` (`$NATS_SERVER_BIN`, else `nats-server` on
    /// the `PATH`, else `/usr/sbin/nats-server`) and waits until it listens.
    pub fn start(port: u16, store: &Path) -> anyhow::Result<Self> {
        let bin = std::env::var_os("NATS_SERVER_BIN")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                let sbin = Path::new("/usr/sbin/nats-server");
                sbin.is_file().then(|| sbin.to_path_buf())
            })
            .unwrap_or_else(|| "nats-server".into());
        let child = Command::new(&bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let mut server = Self { child, port };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = server
                .child
                .try_wait()
                .context("cannot check on nats-server")?
            {
                bail!("nats-server exited at start-up ({status})");
            }
            if started.elapsed() > PROCESS_TIMEOUT {
                bail!("nats-server did not listen on port {port} within {PROCESS_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server with SIGTERM (it writes its store out) and waits for it to exit.
    pub fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .context("cannot run kill")?;
        if !status.success() {
            bail!("kill -TERM {pid} failed ({status})");
        }
        let started = Instant::now();
        while self
            .child
            .try_wait()
            .context("cannot wait for nats-server")?
            .is_none()
        {
            if started.elapsed() > PROCESS_TIMEOUT {
                bail!("nats-server {pid} did not exit within {PROCESS_TIMEOUT:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for OwnNats {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use async_nats::HeaderMap;

    use super::*;
    use crate::env::{nats_url, unique};

    /// Against the tests' NATS server: what is published to a captured subject is read back
    /// with its subject, every header value (a repeated name too) and payload, and a read
    /// leaves it there.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_stream_reads_back_what_was_published() {
        let streams = NatsStreams::connect(&nats_url()).await.expect("NATS");
        let name = unique("kit_nats");
        let subjects = vec![format!("{name}.a"), format!("{name}.b")];
        streams.create_stream(&name, &subjects).await.unwrap();
        let client = async_nats::connect(nats_url()).await.unwrap();
        let jetstream = jetstream::new(client);
        for (i, subject) in subjects.iter().enumerate() {
            let mut headers = HeaderMap::new();
            headers.append("h", "one");
            headers.append("h", "two");
            headers.insert("Nats-Msg-Id", format!("m{i}").as_str());
            jetstream
                .publish_with_headers(subject.clone(), headers, format!("{{\"i\":{i}}}").into())
                .await
                .unwrap()
                .await
                .expect("acknowledged");
        }
        let got = streams
            .read_stream(&name, 2, Duration::from_secs(10), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].subject, subjects[0]);
        assert_eq!(got[1].subject, subjects[1]);
        assert_eq!(got[0].header_values("h"), ["one", "two"]);
        assert_eq!(got[1].header("Nats-Msg-Id").as_deref(), Some("m1"));
        assert_eq!(got[1].payload_json()["i"], 1);
        assert_eq!(streams.messages(&name).await.unwrap().len(), 2);
        assert_eq!(streams.message_count(&name).await.unwrap(), 2);
        streams.delete_stream(&name).await.unwrap();
    }

    #[test]
    fn a_header_block_keeps_order_and_repeats() {
        let block = b"NATS/1.0\r\nb: 1\r\na: x y\r\nb: 2\r\n\r\n";
        let headers = parse_headers(block).unwrap();
        let pairs: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .collect();
        assert_eq!(pairs, [("b", &b"1"[..]), ("a", b"x y"), ("b", b"2")]);
        assert!(parse_headers(b"").unwrap().is_empty());
        assert!(parse_headers(b"HTTP/1.1 200\r\n\r\n").is_err());
    }

    #[test]
    fn an_own_server_starts_listens_and_stops() {
        let store = tempfile::tempdir().unwrap();
        let port = crate::broker::free_port();
        let server = OwnNats::start(port, store.path()).expect("start nats-server");
        assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
        server.stop().expect("stop");
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    }
}
