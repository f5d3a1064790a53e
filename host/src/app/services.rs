//! Background services of a running relay (pruner, LISTEN wake-ups, plugin watcher): each is
//! started with a shutdown handle of its own and joined at exit, so nothing keeps running
//! detached after the relay stopped, and a service that panicked is reported.

use std::future::Future;

use tokio::task::JoinSet;

use crate::shutdown::{self, Shutdown, ShutdownTrigger};

/// The background services of one relay process.
pub struct Services {
    stop: ShutdownTrigger,
    stopping: Shutdown,
    tasks: JoinSet<&'static str>,
}

impl Default for Services {
    fn default() -> Self {
        let (stop, stopping) = shutdown::channel();
        Self {
            stop,
            stopping,
            tasks: JoinSet::new(),
        }
    }
}

impl Services {
    /// Starts `service`, which must return once the [`Shutdown`] it is given fires.
    pub fn start<F, Fut>(&mut self, name: &'static str, service: F)
    where
        F: FnOnce(Shutdown) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let run = service(self.stopping.clone());
        self.tasks.spawn(async move {
            run.await;
            name
        });
        tracing::debug!(service = name, "background service started");
    }

    /// Stops every service and waits for all of them to end.
    pub async fn stop_and_join(mut self) {
        self.stop.trigger();
        while let Some(ended) = self.tasks.join_next().await {
            match ended {
                Ok(name) => tracing::debug!(service = name, "background service stopped"),
                Err(e) => tracing::error!(error = %e, "background service failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn every_service_sees_the_stop_and_is_joined() {
        let stopped = Arc::new(AtomicUsize::new(0));
        let mut services = Services::default();
        for name in ["a", "b", "c"] {
            let stopped = Arc::clone(&stopped);
            services.start(name, move |mut shutdown| async move {
                shutdown.recv().await;
                stopped.fetch_add(1, Ordering::SeqCst);
            });
        }
        services.stop_and_join().await;
        assert_eq!(stopped.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_panicking_service_does_not_keep_the_others_from_stopping() {
        let mut services = Services::default();
        services.start("panics", |_| async { panic!("boom") });
        services.start("waits", |mut shutdown| async move { shutdown.recv().await });
        tokio::time::timeout(std::time::Duration::from_secs(5), services.stop_and_join())
            .await
            .expect("joined");
    }
}
