//! `sluice run` (relay until stopped) and `sluice drain` (relay what is due, then exit).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use super::assemble::{AppRelay, Parts, assemble};
use super::endpoints;
use super::reload::{self, ConfigStamp, ReloadRequest, Reloader, RestartOnly};
use super::rotate;
use super::services::Services;
use crate::config::Config;
use crate::encoding::RegistryClient;
use crate::maintenance::{pruner, wakeups};
use crate::plugin::PluginRouter;
use crate::relay::{Counters, RelayStats};
use crate::shutdown::{self, Shutdown};
use crate::sink::Sink;
use crate::store::{Backlog, MarkMode, OutboxStore, Store};
use crate::telemetry::Metrics;
use crate::telemetry::auth::SharedAccess;

/// Longest the producer may take to deliver what is still queued at shutdown (capped by
/// `relay.shutdown_timeout`).
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(10);

/// Relays until `stop` fires, with the background services the config asks for (plugin
/// watcher; LISTEN wake-ups with `relay.notify_channel`; the pruner in `published_at` mode).
/// A stop during start-up ends it without relaying. An error means the relay stopped without
/// being asked to: a supervisor should restart it.
pub async fn run(config: Config, mut stop: Shutdown) -> anyhow::Result<()> {
    tracing::info!(table = %config.database.table,
        "starting up: loading plugins, connecting to the database and the broker");
    let Some(started) = Started::start(&config, &mut stop).await? else {
        tracing::info!("stop requested during start-up; exiting without relaying");
        return Ok(());
    };
    let Started {
        router,
        store,
        relay,
        mut services,
        access,
        registry,
        reloads,
        metrics,
    } = started;
    let pruner_metrics = metrics.clone();
    // Before any service starts: a table `retention_mode = "drop-partitions"` cannot serve.
    if config.relay.retention_mode == pruner::RetentionMode::DropPartitions {
        store.check_drop_partitions().await?;
    }
    // SIGHUP is listened for from here on, not from when the service's task first runs: a
    // signal sent once the relay says it started must reach it.
    let hangup = signal(SignalKind::hangup());
    let reloader = Reloader {
        stamp: config
            .origin
            .as_deref()
            .map_or_else(ConfigStamp::default, |path| {
                ConfigStamp::of(path, config.tenants_dir().as_deref())
            }),
        path: config.origin.clone(),
        applied: rotate::Applied::of(&config)
            .with_telemetry(access)
            .with_registry(registry),
        router,
        relay: Arc::clone(&relay),
        store: Arc::clone(&store),
        started: RestartOnly::of(&config),
        metrics,
    };
    services.start("live configuration", move |stop| {
        reload::run(reloader, hangup, reloads, stop)
    });
    if let Some(channel) = config.relay.notify_channel.clone() {
        let store = Arc::clone(&store);
        let pacer = relay.pacer();
        services.start("wake-ups", move |stop| async move {
            wakeups::run(&*store, &channel, &move || pacer.wake(), stop).await
        });
    }
    start_pruners(&mut services, &config, &store, pruner_metrics.as_ref()).await?;
    tracing::info!(
        table = %config.database.table,
        batch_size = config.relay.batch_size,
        workers = config.relay.workers,
        notify_channel = config.relay.notify_channel.as_deref().unwrap_or("(none)"),
        "relay started"
    );
    let ran = relay.run(stop).await;
    stop_and_flush(services, relay, &config, "relay stopped").await;
    ran.context("the relay stopped without being asked to")?;
    Ok(())
}

/// The retention pruner (`mark = "published_at"`, `relay.retention_mode = "delete"`) and, for a
/// partitioned table, partition maintenance: partitions made ahead when `sluice migrate
/// --partitioned` set the table up, old ones dropped with `retention_mode =
/// "drop-partitions"` (the table checked by [`run`] before).
async fn start_pruners(
    services: &mut Services,
    config: &Config,
    store: &Arc<Store>,
    metrics: Option<&Arc<Metrics>>,
) -> anyhow::Result<()> {
    let relay = &config.relay;
    let interval = relay.prune_interval;
    let retention = match (relay.mark, relay.retention) {
        (MarkMode::PublishedAt, pruner::Retention::Keep(retention)) => Some(retention),
        _ => None,
    };
    let drops = relay.retention_mode == pruner::RetentionMode::DropPartitions;
    if let (Some(retention), false) = (retention, drops) {
        let store = Arc::clone(store);
        services.start("pruner", move |stop| async move {
            pruner::run(&*store, retention, interval, stop).await
        });
    }
    let made_ahead = matches!(store.partitioning().await?, Some(p) if p.interval.is_some());
    if drops || made_ahead {
        let store = Arc::clone(store);
        let drop_after = retention.filter(|_| drops);
        let metrics = metrics.cloned();
        services.start("partitions", move |stop| async move {
            let dropped = move |n| {
                if let Some(m) = &metrics {
                    m.relay.partitions_dropped(n);
                }
            };
            pruner::run_partitions(&store, drop_after, interval, stop, &dropped).await
        });
    }
    Ok(())
}

/// A relay `run` and `drain` started: its parts, and the background services beside it (the
/// endpoints and the backlog sampler with `[telemetry] listen`).
struct Started {
    router: Arc<PluginRouter>,
    store: Arc<Store>,
    relay: Arc<AppRelay>,
    services: Services,
    /// The endpoints' credentials, for SIGHUP to replace.
    access: Option<Arc<SharedAccess>>,
    /// The schema registry's client, whose credentials SIGHUP replaces.
    registry: Option<Arc<RegistryClient>>,
    /// `POST /reload`s, for the live-configuration service.
    reloads: mpsc::Receiver<ReloadRequest>,
    /// With `[telemetry] listen`: what the relay records into.
    metrics: Option<Arc<Metrics>>,
}

impl Started {
    /// Assembles the relay and starts its endpoints. `None`: `stop` fired during start-up.
    async fn start(config: &Config, stop: &mut Shutdown) -> anyhow::Result<Option<Self>> {
        let Some(parts) = assemble(config, stop).await? else {
            return Ok(None);
        };
        let Parts {
            router,
            store,
            relay,
            metrics,
            registry,
            trace_export,
        } = parts;
        let mut services = Services::default();
        if let Some(export) = trace_export {
            services.start("span export", move |stop| export.run(stop));
        }
        // Lazily loaded plugins are compiled by this service, for `run` and `drain` alike.
        let loader = Arc::clone(&router);
        services.start("plugin loader", move |stop| plugin_loader(loader, stop));
        let (reload_requests, reloads) = mpsc::channel(4);
        let access = match metrics.clone() {
            Some(metrics) => {
                let served = endpoints::Served {
                    store: &store,
                    relay: &relay,
                    router: &router,
                    registry: registry.clone(),
                };
                endpoints::start(&mut services, config, served, metrics, reload_requests).await?
            }
            None => None,
        };
        Ok(Some(Self {
            router,
            store,
            relay,
            services,
            access,
            registry,
            reloads,
            metrics,
        }))
    }
}

/// Plugins compiled at once for rows that ask for them: a tenant whose plugin compiles in a
/// second does not wait behind another's Python component (seconds to minutes), and two
/// compiles leave the relay's own work room on a small machine.
const PLUGIN_LOADERS: usize = 2;

/// Compiles the plugins rows ask for (`[plugins] load = "lazy"`), until shutdown: each wake
/// takes the tenants queued by then, up to [`PLUGIN_LOADERS`] such loads at a time.
async fn plugin_loader(router: Arc<PluginRouter>, mut stop: Shutdown) {
    let loaders = Arc::new(tokio::sync::Semaphore::new(PLUGIN_LOADERS));
    loop {
        tokio::select! {
            () = router.loads_wanted() => {}
            _ = stop.recv() => return,
        }
        let permit = tokio::select! {
            permit = Arc::clone(&loaders).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            _ = stop.recv() => return,
        };
        let router = Arc::clone(&router);
        // Compiling and `configure` are blocking work.
        tokio::task::spawn_blocking(move || {
            router.load_wanted();
            drop(permit);
        });
    }
}

/// The end of `run` and `drain` once the relay stopped: stops the background services,
/// flushes the producer and logs what the relay did (`what`), which it returns.
async fn stop_and_flush(
    services: Services,
    relay: Arc<AppRelay>,
    config: &Config,
    what: &str,
) -> RelayStats {
    services.stop_and_join().await;
    let stats = relay.counters().snapshot();
    flush(relay, config).await;
    log_stats(&stats, what);
    stats
}

/// What `sluice drain` did, and what it left.
#[derive(Debug, Clone)]
pub struct DrainReport {
    /// What the relay did during the drain.
    pub stats: RelayStats,
    /// The backlog when the drain started.
    pub before: Backlog,
    /// The backlog left once it stopped.
    pub after: Backlog,
}

impl DrainReport {
    /// Whether every row that was due got delivered (none failed, none left unrecorded).
    pub fn all_delivered(&self) -> bool {
        self.stats.rows_failed == 0 && self.stats.rows_unsettled == 0
    }
}

/// Relays every row that is due now, then returns; runs `report_progress` (given the live
/// counters, the rows due at the start and a stop that fires when the drain ends) meanwhile.
/// A stop (during start-up or while draining) is an error: the rows left are still due.
pub async fn drain<P, F>(
    config: Config,
    mut stop: Shutdown,
    report_progress: P,
) -> anyhow::Result<DrainReport>
where
    P: FnOnce(Arc<Counters>, u64, Shutdown) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let Some(Started {
        store,
        relay,
        services,
        ..
    }) = Started::start(&config, &mut stop).await?
    else {
        bail!("drain interrupted during start-up; nothing was relayed");
    };
    let before = store.backlog().await?;
    tracing::info!(table = %config.database.table, due = before.due, "draining");
    let (progress_done, progress_stop) = shutdown::channel();
    let progress = tokio::spawn(report_progress(
        relay.counters(),
        u64::try_from(before.due).unwrap_or(0),
        progress_stop,
    ));
    let drained = relay.drain(stop.clone()).await;
    progress_done.trigger();
    let _ = progress.await;
    let stats = stop_and_flush(services, relay, &config, "drain finished").await;
    let after = store.backlog().await?;
    drained.context("the drain stopped on a failure")?;
    if stop.is_shutdown() {
        bail!("drain interrupted; {} rows are still due", after.due);
    }
    Ok(DrainReport {
        stats,
        before,
        after,
    })
}

/// Flushes the producer at exit. Everything queued belongs to a batch that was either
/// recorded (and so acknowledged) or given up unrecorded (and will be published again): a
/// failed flush loses nothing. Flushing blocks, and so does dropping the producer (the last
/// handle of `relay`): both happen on a blocking thread.
async fn flush(relay: Arc<AppRelay>, config: &Config) {
    let flush_for = SHUTDOWN_FLUSH.min(config.relay.shutdown_timeout);
    let flushed = tokio::task::spawn_blocking(move || {
        let flushed = relay.sink().flush(flush_for);
        drop(relay);
        flushed
    })
    .await;
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e,
            "producer still had undelivered messages at exit; their rows stay unsent"),
        Err(e) => tracing::warn!(error = %e, "flushing the producer failed"),
    }
}

fn log_stats(stats: &RelayStats, what: &str) {
    tracing::info!(
        batches = stats.batches,
        rows_sent = stats.rows_sent,
        rows_failed = stats.rows_failed,
        rows_dead = stats.rows_dead,
        rows_unsettled = stats.rows_unsettled,
        messages = stats.messages,
        "{what}"
    );
}
