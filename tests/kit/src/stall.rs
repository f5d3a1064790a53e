//! A TCP proxy a test can freeze or slow down. Frozen, it keeps every connection open and
//! accepts new ones but passes no byte either way, the way a hung server or a silent network
//! partition looks to a client (no reset, no error, just no answer). Slowed down, it passes
//! every byte after a delay, the way a slow but answering server looks. Plain threads, so it
//! runs beside any async runtime.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How often a frozen copier looks whether it may go on.
const FROZEN_POLL: Duration = Duration::from_millis(20);

/// The proxy (see the module documentation); forwards until the process ends.
pub struct StallingProxy {
    port: u16,
    state: Arc<State>,
}

/// What the copiers of every connection look at.
#[derive(Default)]
struct State {
    frozen: AtomicBool,
    /// How long each chunk is held before it is passed on, in milliseconds.
    delay_ms: AtomicU64,
    /// Connections accepted so far.
    accepted: AtomicUsize,
    /// Both ends of every connection still open, so [`StallingProxy::cut`] can close them.
    open: std::sync::Mutex<Vec<TcpStream>>,
}

impl StallingProxy {
    /// Listens on a free local port and forwards every connection to `target` (`host:port`).
    pub fn start(target: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(State::default());
        let target = target.to_owned();
        let accepting = Arc::clone(&state);
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                accepting.accepted.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    let mut open = accepting.open.lock().unwrap_or_else(|p| p.into_inner());
                    open.extend([c, s]);
                }
                forward(&client, &server, &accepting);
            }
        });
        Ok(Self { port, state })
    }

    /// The local port it accepts connections on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops passing bytes (connections stay open).
    pub fn freeze(&self) {
        self.state.frozen.store(true, Ordering::SeqCst);
    }

    /// Passes bytes again, including what arrived meanwhile.
    pub fn thaw(&self) {
        self.state.frozen.store(false, Ordering::SeqCst);
    }

    /// Holds every chunk `delay` before passing it on, either way (zero: none). Chunks keep
    /// their order and are not held up behind each other: the latency grows, not the time
    /// per byte.
    pub fn delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.state.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Closes every connection open now, both ways, the way a broker restart looks to its
    /// clients (new connections are accepted and forwarded as before).
    pub fn cut(&self) {
        let open = std::mem::take(&mut *self.state.open.lock().unwrap_or_else(|p| p.into_inner()));
        for stream in open {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }
}

/// Copies both ways between `client` and `server`, each way on a reading and a writing
/// thread.
fn forward(client: &TcpStream, server: &TcpStream, state: &Arc<State>) {
    for (from, to) in [(client, server), (server, client)] {
        let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
            return;
        };
        let (chunks, held) = mpsc::channel();
        let reading = Arc::clone(state);
        thread::spawn(move || read(from, &chunks, &reading));
        let writing = Arc::clone(state);
        thread::spawn(move || write(to, &held, &writing));
    }
}

/// Sleeps while the proxy is frozen.
fn wait_thawed(state: &State) {
    while state.frozen.load(Ordering::SeqCst) {
        thread::sleep(FROZEN_POLL);
    }
}

/// Reads chunks from `from` with the time they arrived; ends (closing `chunks`) with the
/// connection.
fn read(mut from: TcpStream, chunks: &mpsc::Sender<(Instant, Vec<u8>)>, state: &State) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        // Frozen: read nothing (the sender's socket buffers fill).
        wait_thawed(state);
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if chunks.send((Instant::now(), buf[..n].to_vec())).is_err() {
            break;
        }
    }
}

/// Writes each chunk to `to` once it is due and the proxy is not frozen; shuts the writing
/// side down when the reading side ended.
fn write(mut to: TcpStream, held: &mpsc::Receiver<(Instant, Vec<u8>)>, state: &State) {
    for (arrived, chunk) in held {
        let delay = Duration::from_millis(state.delay_ms.load(Ordering::SeqCst));
        let due = arrived + delay;
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
        // Frozen: pass nothing on.
        wait_thawed(state);
        if to.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
