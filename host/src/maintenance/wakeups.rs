//! LISTEN/NOTIFY wake-ups: listens on `relay.notify_channel` and wakes the relay's pacer on
//! every notification. Polling stays the mechanism; a lost connection only means rows wait for
//! the next poll, so failures are logged and retried with back-off, never fatal.

use std::time::Duration;

use crate::shutdown::Shutdown;
use crate::store::OutboxStore;

/// First pause before listening again after a failure; doubled up to [`RETRY_MAX`].
const RETRY: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// Listens on `channel` until `shutdown`, calling `wake` on every notification (and after
/// every reconnection, since notifications sent meanwhile were missed).
pub(crate) async fn run<S: OutboxStore>(
    store: &S,
    channel: &str,
    wake: &(dyn Fn() + Send + Sync),
    mut shutdown: Shutdown,
) {
    let mut retry = RETRY;
    loop {
        let result = tokio::select! {
            r = store.listen(channel, wake) => r,
            _ = shutdown.recv() => return,
        };
        let Err(e) = result;
        tracing::warn!(channel, error = %e, retry_in = ?retry,
            "LISTEN failed; relying on polling until it works again");
        wake();
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = shutdown.recv() => return,
        }
        retry = (retry * 2).min(RETRY_MAX);
    }
}
