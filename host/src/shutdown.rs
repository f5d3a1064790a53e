//! Graceful stop as an object passed down explicitly: the relay checks it between batches and
//! while idle, never in the middle of a batch.

use tokio::sync::watch;

/// Listens for the stop request.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// Requests the stop.
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

/// A connected trigger/listener pair.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        // Fails only when every listener is gone, and then nobody needs telling.
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    pub fn is_shutdown(&self) -> bool {
        *self.rx.borrow()
    }

    /// Completes once the stop was requested (or the trigger was dropped).
    pub async fn recv(&mut self) {
        let _ = self.rx.wait_for(|stop| *stop).await;
    }
}

/// Waits for SIGINT or SIGTERM.
pub async fn signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
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
