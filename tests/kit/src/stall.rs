//! A TCP proxy a test can freeze: while frozen it keeps every connection open and accepts new
//! ones but passes no byte either way, the way a hung server or a silent network partition
//! looks to a client (no reset, no error, just no answer). Plain threads, so it runs beside
//! any async runtime.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

/// How often a frozen copier looks whether it may go on.
const FROZEN_POLL: Duration = Duration::from_millis(20);

/// The proxy (see the module documentation); forwards until the process ends.
pub struct StallingProxy {
    port: u16,
    frozen: Arc<AtomicBool>,
}

impl StallingProxy {
    /// Listens on a free local port and forwards every connection to `target` (`host:port`).
    pub fn start(target: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let frozen = Arc::new(AtomicBool::new(false));
        let target = target.to_owned();
        let accepting = Arc::clone(&frozen);
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                forward(&client, &server, &accepting);
            }
        });
        Ok(Self { port, frozen })
    }

    /// The local port it accepts connections on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops passing bytes (connections stay open).
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Passes bytes again, including what arrived meanwhile.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }
}

/// Copies both ways between `client` and `server` on two threads.
fn forward(client: &TcpStream, server: &TcpStream, frozen: &Arc<AtomicBool>) {
    for (from, to) in [(client, server), (server, client)] {
        let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
            return;
        };
        let frozen = Arc::clone(frozen);
        thread::spawn(move || copy(from, to, &frozen));
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        // Frozen: read nothing (the sender's socket buffers fill) and pass nothing on.
        while frozen.load(Ordering::SeqCst) {
            thread::sleep(FROZEN_POLL);
        }
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            thread::sleep(FROZEN_POLL);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
