//! Graceful stop as an object passed down explicitly: the relay checks it between batches and
//! while idle, never in the middle of a batch.

use tokio::sync::watch;

/// Listens for the stop request.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// Requests the stop. Clones trigger the same stop.
#[derive(Debug, Clone)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

/// A connected trigger/listener pair.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    /// Requests the stop; every listener sees it.
    pub fn trigger(&self) {
        // Fails only when every listener is gone, and then nobody needs telling.
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    /// Whether the stop was requested.
    pub fn is_shutdown(&self) -> bool {
        *self.rx.borrow()
    }

    /// Completes once the stop was requested (or the trigger was dropped).
    pub async fn recv(&mut self) {
        let _ = self.rx.wait_for(|stop| *stop).await;
    }
}

/// SIGINT and SIGTERM, listened for from the moment [`Signals::install`] returns: from then
/// on they no longer end the process by their default action, so a stop requested during
/// start-up is seen and handled like any other.
#[derive(Debug)]
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (must be called inside the tokio runtime).
    pub fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for the next SIGTERM or SIGINT; returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn listeners_see_the_trigger() {
        let (trigger, mut shutdown) = channel();
        let other = shutdown.clone();
        assert!(!shutdown.is_shutdown());
        trigger.trigger();
        shutdown.recv().await;
        assert!(other.is_shutdown());
    }
}
