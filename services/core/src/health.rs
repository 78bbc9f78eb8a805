//! Health of a process: whether its backends answer (with hysteresis, so one
//! slow ping does not flap readiness), and whether its loops are alive
//! (heartbeats). Kubernetes probes read both through `/readyz` and `/healthz`
//! on the metrics port ([`serve_metrics`]); the api also reports the
//! backends through gRPC health.
//!
//! Readiness follows the backends a process cannot work without: every MySQL
//! shard and RabbitMQ. Redis is a cache, and every read falls back to MySQL
//! without it, so a Redis outage is reported (`notify_backend_up`) but keeps
//! the process ready: taking every replica out of service because a cache
//! is away would turn a slowdown into an outage.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::context::Context;
use crate::telemetry::metrics_handle;
use notify_domain::settings::HealthSettings;

/// Longest one check of one backend may take before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What the last checks found, after hysteresis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendStatus {
    /// Every MySQL shard answers.
    pub mysql: bool,
    /// Redis answers.
    pub redis: bool,
    /// The broker connection is up.
    pub rabbitmq: bool,
}

impl BackendStatus {
    /// Returns true when the process can do its work (see the module doc).
    pub fn ready(&self) -> bool {
        self.mysql && self.rabbitmq
    }

    /// One line for probes and logs: `mysql up, redis down, rabbitmq up`.
    pub fn describe(&self) -> String {
        let word = |up: bool| if up { "up" } else { "down" };
        format!(
            "mysql {}, redis {}, rabbitmq {}",
            word(self.mysql),
            word(self.redis),
            word(self.rabbitmq)
        )
    }
}

/// A flag that flips only after `threshold` consecutive opposite results.
#[derive(Debug, Clone, Copy)]
struct Hysteresis {
    up: bool,
    streak: u32,
}

impl Hysteresis {
    fn observe(&mut self, ok: bool, settings: &HealthSettings) -> bool {
        if ok == self.up {
            self.streak = 0;
            return self.up;
        }
        self.streak += 1;
        let needed = if self.up {
            settings.failures_before_unready
        } else {
            settings.successes_before_ready
        };
        if self.streak >= needed {
            self.up = ok;
            self.streak = 0;
        }
        self.up
    }
}

/// Checks the backends every `health.check_interval_ms` until `shutdown`,
/// publishing each new status. Starts from "all up": the process connected
/// to everything on its way up.
pub fn watch_backends(
    ctx: Context,
    heartbeats: Heartbeats,
    shutdown: CancellationToken,
) -> watch::Receiver<BackendStatus> {
    let all_up = BackendStatus { mysql: true, redis: true, rabbitmq: true };
    let (sender, receiver) = watch::channel(all_up);
    tokio::spawn(async move {
        let settings = ctx.settings.health.clone();
        let mut flags = [Hysteresis { up: true, streak: 0 }; 3];
        let mut ticker = tokio::time::interval(Duration::from_millis(settings.check_interval_ms));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let (mysql, redis, rabbitmq) =
                tokio::join!(mysql_answers(&ctx), redis_answers(&ctx), rabbitmq_answers(&ctx));
            heartbeats.beat("backend checks");
            let status = BackendStatus {
                mysql: flags[0].observe(mysql, &settings),
                redis: flags[1].observe(redis, &settings),
                rabbitmq: flags[2].observe(rabbitmq, &settings),
            };
            for (backend, up) in
                [("mysql", status.mysql), ("redis", status.redis), ("rabbitmq", status.rabbitmq)]
            {
                metrics::gauge!("notify_backend_up", "backend" => backend)
                    .set(f64::from(u8::from(up)));
            }
            sender.send_if_modified(|current| {
                if *current == status {
                    return false;
                }
                if status.ready() {
                    info!(backends = %status.describe(), "backends changed");
                } else {
                    warn!(backends = %status.describe(), "backends changed, not ready");
                }
                *current = status;
                true
            });
        }
    });
    receiver
}

async fn within_timeout<F: Future<Output = bool>>(check: F) -> bool {
    tokio::time::timeout(CHECK_TIMEOUT, check).await.unwrap_or(false)
}

async fn mysql_answers(ctx: &Context) -> bool {
    let pings = ctx.pools.iter().map(|(shard, pool)| async move {
        let answered = within_timeout(async {
            sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(pool).await.is_ok()
        })
        .await;
        if !answered {
            metrics::counter!("notify_shard_errors_total", "shard" => shard.to_string())
                .increment(1);
        }
        answered
    });
    futures::future::join_all(pings).await.into_iter().all(|up| up)
}

async fn redis_answers(ctx: &Context) -> bool {
    within_timeout(async {
        let mut conn = ctx.cache.connection();
        redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok()
    })
    .await
}

async fn rabbitmq_answers(ctx: &Context) -> bool {
    within_timeout(ctx.publisher.check()).await
}

/// Heartbeats of a process's long-running loops: each loop beats when it
/// makes progress (or, if idle, on its own timer); `/healthz` fails when one
/// has been silent longer than `health.loop_stall_secs`.
#[derive(Debug, Clone, Default)]
pub struct Heartbeats {
    beats: Arc<Mutex<HashMap<&'static str, Instant>>>,
}

impl Heartbeats {
    /// Records that `loop_name` is alive now.
    pub fn beat(&self, loop_name: &'static str) {
        let mut beats = self.beats.lock().unwrap_or_else(|e| e.into_inner());
        beats.insert(loop_name, Instant::now());
    }

    /// Names the loops silent for longer than `stall`, with their silence.
    pub fn stalled(&self, stall: Duration) -> Vec<(&'static str, Duration)> {
        let beats = self.beats.lock().unwrap_or_else(|e| e.into_inner());
        let mut stalled: Vec<_> = beats
            .iter()
            .map(|(name, at)| (*name, at.elapsed()))
            .filter(|(_, silent)| *silent > stall)
            .collect();
        stalled.sort_unstable();
        stalled
    }
}

/// What the `/healthz` and `/readyz` endpoints answer.
#[derive(Clone)]
pub struct Probes {
    backends: watch::Receiver<BackendStatus>,
    heartbeats: Heartbeats,
    stall: Duration,
    /// Extra readiness of the process (the worker's consumers, say).
    extra_ready: Arc<dyn Fn() -> Result<(), String> + Send + Sync>,
}

impl Probes {
    /// Probes over backend checks and loop heartbeats.
    pub fn new(
        backends: watch::Receiver<BackendStatus>,
        heartbeats: Heartbeats,
        settings: &HealthSettings,
    ) -> Self {
        Self {
            backends,
            heartbeats,
            stall: Duration::from_secs(settings.loop_stall_secs),
            extra_ready: Arc::new(|| Ok(())),
        }
    }

    /// Adds a readiness condition of the process's own.
    pub fn with_ready_check(
        mut self,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.extra_ready = Arc::new(check);
        self
    }

    /// Liveness: every loop beat recently. Err names the stalled ones.
    pub fn live(&self) -> Result<(), String> {
        let stalled = self.heartbeats.stalled(self.stall);
        if stalled.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = stalled
            .iter()
            .map(|(name, silent)| format!("{name} silent for {}s", silent.as_secs()))
            .collect();
        Err(names.join(", "))
    }

    /// Readiness: the backends the process needs answer, and its own check.
    pub fn ready(&self) -> Result<(), String> {
        let status = *self.backends.borrow();
        if !status.ready() {
            return Err(status.describe());
        }
        (self.extra_ready)()
    }
}

/// Serves `GET /metrics`, `GET /healthz` (liveness) and `GET /readyz`
/// (readiness) on `listener` until `shutdown` is cancelled. A failing probe
/// answers 503 with the reason.
pub async fn serve_metrics(
    listener: TcpListener,
    probes: Probes,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let handle = metrics_handle();
    let answer = |result: Result<(), String>| match result {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    };
    let live = probes.clone();
    let app = Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/healthz", get(move || std::future::ready(answer(live.live()))))
        .route("/readyz", get(move || std::future::ready(answer(probes.ready()))));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> HealthSettings {
        HealthSettings {
            check_interval_ms: 100,
            failures_before_unready: 3,
            successes_before_ready: 2,
            loop_stall_secs: 60,
        }
    }

    #[test]
    fn one_failed_check_does_not_flip_readiness_but_a_streak_does() {
        let settings = settings();
        let mut flag = Hysteresis { up: true, streak: 0 };
        let seen: Vec<bool> = [false, true, false, false, true, false, false, false, true, true]
            .into_iter()
            .map(|ok| flag.observe(ok, &settings))
            .collect();
        assert_eq!(seen, [true, true, true, true, true, true, true, false, false, true]);
    }

    #[test]
    fn a_silent_loop_is_named() {
        let beats = Heartbeats::default();
        beats.beat("sweeper");
        assert!(beats.stalled(Duration::from_secs(1)).is_empty());
        assert_eq!(beats.stalled(Duration::ZERO).first().map(|(n, _)| *n), Some("sweeper"));
    }
}
