//! The plugin watcher service: reloads replaced plugin files (checked every
//! [`WATCH_INTERVAL`]) and every plugin file on SIGHUP, until shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::Signal;

use crate::plugin::PluginRouter;
use crate::shutdown::Shutdown;

/// How often plugin files are checked for replacement.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

pub(super) async fn run(
    router: Arc<PluginRouter>,
    hangup: std::io::Result<Signal>,
    mut shutdown: Shutdown,
) {
    let mut hangup = match hangup {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; plugin files are still watched");
            None
        }
    };
    let mut tick = tokio::time::interval(WATCH_INTERVAL);
    loop {
        let force = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
            _ = shutdown.recv() => return,
        };
        if force {
            tracing::info!("SIGHUP: reloading plugins");
        }
        let router = Arc::clone(&router);
        let started = std::time::Instant::now();
        // Compiling and instantiating are blocking work.
        let loaded = tokio::task::spawn_blocking(move || router.reload(force)).await;
        if force {
            tracing::info!(
                files = loaded.unwrap_or(0),
                took_ms = started.elapsed().as_millis() as u64,
                "SIGHUP: plugins reloaded"
            );
        }
    }
}
