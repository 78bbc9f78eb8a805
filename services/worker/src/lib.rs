//! `notify-worker`: consumes chunk tasks from both lanes, runs the
//! scheduler and the sweeper, calls clients' webhooks, relays those their
//! processes did not queue and queues the reads `item.read` reports. [`Worker::build`] connects;
//! [`Worker::run_until_stopped`] works until the shutdown token is cancelled,
//! then stops consuming, finishes and acks in-flight chunks, and joins.

pub mod background;
pub mod consumer;
pub mod webhooks;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use notify_core::health::{self, Heartbeats, Probes};
use notify_core::inbox::read_feed::ReadRelay;
use notify_core::shard_map::{self, Replica};
use notify_core::telemetry;
use notify_core::{Context, send};
use notify_domain::Settings;
use notify_domain::domain::Lane;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::consumer::LaneHealth;

/// How often the settler looks for chunks applied while Redis was away: the
/// longest a badge cached before an outage can be served after it.
const SETTLE_INTERVAL: Duration = Duration::from_millis(500);

/// Control operations one worker drives at once when their first driver
/// died or failed (each holds a connection to the shard it pages through).
const CONTROL_DRIVES: usize = 4;

/// The `notify-worker` process, all of it ([`telemetry::run_process`] on a
/// multi-threaded runtime): works until SIGTERM or Ctrl-C.
///
/// It is here, not in `main.rs`: a release build shares no generic code
/// between crates, so the binary's own crate compiled again every future it
/// awaited. Measured on the 2-core machine: this crate 50 s and the binary
/// 149 s before, 103 s and 2 s after.
pub fn main() -> anyhow::Result<()> {
    telemetry::run_process(
        "notify-worker",
        // One thread per core.
        |_| 0,
        Worker::build,
        Worker::run_until_stopped,
    )
}

/// A built, connected, not yet running worker.
pub struct Worker {
    ctx: Context,
    metrics_listener: TcpListener,
    replica: Replica,
}

impl Worker {
    /// Connects to every dependency and binds the metrics listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let metrics_listener =
            TcpListener::bind(&settings.worker.metrics_listen).await.map_err(|e| {
                anyhow::anyhow!(
                    "worker.metrics_listen: cannot bind {}: {e}",
                    settings.worker.metrics_listen
                )
            })?;
        let ctx = Context::connect(settings).await?;
        // Reported before any consumer runs (see shard_map::join).
        let replica = Replica::new("worker");
        shard_map::join(&ctx, &replica).await?;
        Ok(Self { ctx, metrics_listener, replica })
    }

    /// Returns the bound metrics address.
    pub fn metrics_addr(&self) -> std::io::Result<SocketAddr> {
        self.metrics_listener.local_addr()
    }

    /// Returns the shared context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Runs consumers, scheduler, sweeper and `/metrics` until `shutdown`.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let ctx = self.ctx;
        let replica = self.replica;
        let worker_settings = ctx.settings.worker.clone();
        let heartbeats = Heartbeats::default();
        let mut tasks = JoinSet::new();
        let mut lanes = Vec::new();
        let circuits = consumer::ShardCircuits::default();
        let broker = consumer::SharedConnection::new(ctx.settings.rabbitmq.clone());
        let shards: Vec<u32> = ctx.settings.database.shards.iter().map(|s| s.id.0).collect();
        for lane in [Lane::High, Lane::Bulk] {
            for shard in &shards {
                let health = LaneHealth {
                    beat: consumer::beat_name(lane, *shard),
                    heartbeats: heartbeats.clone(),
                    consuming: Arc::new(AtomicBool::new(false)),
                    circuits: circuits.clone(),
                };
                lanes.push((format!("{} s{shard}", lane.name()), health.consuming.clone()));
                let run = consumer::run_lane(
                    ctx.clone(),
                    broker.clone(),
                    lane,
                    *shard,
                    health,
                    shutdown.clone(),
                );
                tasks.spawn(run);
            }
        }
        // Each client's webhooks on a consumer of their own (see `webhooks`).
        let hooks = notify_core::webhooks::WebhookTopology::new(&ctx.settings);
        if !hooks.clients().is_empty() {
            let timeout = Duration::from_millis(ctx.settings.webhooks.timeout_ms);
            let http = webhooks::http_client(timeout)?;
            for client in hooks.clients() {
                tasks.spawn(webhooks::run_client(
                    ctx.clone(),
                    broker.clone(),
                    http.clone(),
                    client.clone(),
                    shutdown.clone(),
                ));
            }
        }
        let backends = health::watch_backends(ctx.clone(), heartbeats.clone(), shutdown.clone());
        let probes = Probes::new(backends, heartbeats.clone(), &ctx.settings.health)
            .with_ready_check(move || {
                let idle: Vec<&str> = lanes
                    .iter()
                    .filter(|(_, consuming)| !consuming.load(Ordering::Relaxed))
                    .map(|(lane, _)| lane.as_str())
                    .collect();
                if idle.is_empty() {
                    Ok(())
                } else {
                    Err(format!("not consuming lane {}", idle.join(", ")))
                }
            });
        {
            let ctx = ctx.clone();
            tasks.spawn(background::every(
                "scheduler",
                Duration::from_millis(worker_settings.scheduler_interval_ms),
                heartbeats.clone(),
                shutdown.clone(),
                move || {
                    let ctx = ctx.clone();
                    async move { background::schedule_once(&ctx).await }
                },
            ));
        }
        {
            let ctx = ctx.clone();
            tasks.spawn(background::every(
                "sweeper",
                Duration::from_secs(worker_settings.sweep_interval_secs),
                heartbeats.clone(),
                shutdown.clone(),
                move || {
                    let ctx = ctx.clone();
                    async move { background::sweep_once(&ctx).await.map(|_| ()) }
                },
            ));
        }
        {
            // Control operations (cancel, recall, edit) whose driver died or
            // failed: at most CONTROL_DRIVES driven at once by this worker.
            let ctx = ctx.clone();
            let drives = Arc::new(tokio::sync::Semaphore::new(CONTROL_DRIVES));
            tasks.spawn(background::every(
                "control operations",
                Duration::from_secs(worker_settings.sweep_interval_secs),
                heartbeats.clone(),
                shutdown.clone(),
                move || {
                    let (ctx, drives) = (ctx.clone(), drives.clone());
                    async move { background::control_once(&ctx, &drives).await }
                },
            ));
        }
        {
            // Gateway events their api did not publish (the event outbox).
            let ctx = ctx.clone();
            tasks.spawn(background::every(
                "event relay",
                Duration::from_millis(ctx.settings.events.outbox_retry_ms),
                heartbeats.clone(),
                shutdown.clone(),
                move || {
                    let ctx = ctx.clone();
                    async move { notify_core::events::relay_once(&ctx).await.map(|_| ()) }
                },
            ));
        }
        {
            // A send's webhook events its own process did not queue.
            let ctx = ctx.clone();
            tasks.spawn(background::every(
                "webhook relay",
                Duration::from_millis(ctx.settings.webhooks.outbox_retry_ms),
                heartbeats.clone(),
                shutdown.clone(),
                move || {
                    let ctx = ctx.clone();
                    async move { send::relay_webhooks(&ctx).await.map(|_| ()) }
                },
            ));
        }
        {
            // Reads waiting for item.read webhooks (none are recorded while
            // no endpoint wants them; a run then asks each shard once).
            let ctx = ctx.clone();
            let relay = Arc::new(ReadRelay::new());
            tasks.spawn(background::every(
                "read feed relay",
                Duration::from_millis(ctx.settings.webhooks.read_flush_ms),
                heartbeats.clone(),
                shutdown.clone(),
                move || {
                    let (ctx, relay) = (ctx.clone(), relay.clone());
                    async move { relay.run_once(&ctx).await.map(|_| ()) }
                },
            ));
        }
        {
            let ctx = ctx.clone();
            tasks.spawn(background::every(
                "settler",
                SETTLE_INTERVAL,
                heartbeats.clone(),
                shutdown.clone(),
                move || {
                    let ctx = ctx.clone();
                    async move { background::settle_once(&ctx).await }
                },
            ));
        }
        // Followed (and reported) until every consumer has stopped: a
        // replica that stops reporting counts as gone for a bucket move.
        // (Also when this returns early with an error.)
        let drained = CancellationToken::new();
        let shard_map = tokio::spawn(shard_map::follow(ctx.clone(), replica, drained.clone()));
        let drained = drained.drop_guard();
        if ctx.settings.retention.interval_secs > 0 {
            // Not a heartbeat loop: a run may take long (a month's drop, or
            // the first split after an upgrade), and that is no stall.
            tasks.spawn(background::retention(ctx.clone(), shutdown.clone()));
        }
        let metrics_listener = self.metrics_listener;
        let metrics_shutdown = shutdown.clone();
        tasks.spawn(async move {
            if let Err(e) = health::serve_metrics(metrics_listener, probes, metrics_shutdown).await
            {
                tracing::warn!(error = %e, "metrics endpoint failed");
            }
        });
        info!("notify-worker running");
        while let Some(joined) = tasks.join_next().await {
            joined?;
        }
        broker.close().await;
        drop(drained);
        shard_map.await?;
        info!("notify-worker stopped");
        Ok(())
    }
}
