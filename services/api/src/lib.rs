//! `notify-api`: the gRPC front service. [`Application::build`] connects and
//! binds; [`Application::run_until_stopped`] serves until the shutdown token
//! is cancelled, then reports NOT_SERVING and drains.

pub mod auth;
pub mod call_end;
pub mod conn_age;
pub mod console;
pub mod convert;
pub mod events;
pub mod grpc;
pub mod metrics_layer;
pub mod recipient_calls;
pub mod status;
pub mod streams;
pub mod tls;
pub mod trace_layer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use notify_core::Context;
use notify_core::health::{self, BackendStatus, Heartbeats, Probes};
use notify_core::shard_map::{self, Replica};
use notify_core::telemetry;
use notify_domain::Settings;
use notify_domain::settings::ReflectionMode;
use notify_proto::v1::admin_service_server::AdminServiceServer;
use notify_proto::v1::event_service_server::EventServiceServer;
use notify_proto::v1::group_service_server::GroupServiceServer;
use notify_proto::v1::inbox_service_server::InboxServiceServer;
use notify_proto::v1::message_service_server::MessageServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tracing::info;

use crate::auth::{AuthLayer, Guard};
use crate::conn_age::AgedConnection;
use crate::grpc::admin::AdminApi;
use crate::grpc::events::EventApi;
use crate::grpc::group::GroupApi;
use crate::grpc::inbox::InboxApi;
use crate::grpc::message::MessageApi;
use crate::metrics_layer::GrpcMetricsLayer;
use crate::recipient_calls::RecipientCallsLayer;
use crate::tls::{ServerTls, TlsSource};
use crate::trace_layer::GrpcTraceLayer;

/// The `notify-api` process, all of it but the allocator
/// ([`telemetry::run_process`] with the runtime `api.worker_threads` asks
/// for): serves until SIGTERM or Ctrl-C.
///
/// It is here, not in `main.rs`: a release build shares no generic code
/// between crates, so the binary's own crate compiled again every future it
/// awaited (122 s of CPU on the 2-core machine; 2 s now that the binary calls
/// one function).
pub fn main() -> anyhow::Result<()> {
    telemetry::run_process(
        "notify-api",
        |settings| settings.api.worker_threads,
        Application::build,
        Application::run_until_stopped,
    )
}

/// A built, bound, not yet serving api.
pub struct Application {
    ctx: Context,
    listener: TcpListener,
    metrics_listener: TcpListener,
    console_listener: Option<TcpListener>,
    tls: Option<Arc<ServerTls>>,
    replica: Replica,
}

impl Application {
    /// Connects to every dependency and binds the gRPC and metrics listeners
    /// (port 0 picks a free port, as tests do).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        // Install the metrics recorder before anything resolves a metric
        // handle (the cache's badge reader does so when it starts).
        telemetry::metrics_handle();
        let listen = notify_domain::settings::parse_addr("api.listen", &settings.api.listen)?;
        settings.auth.check_listener(listen)?;
        let tls = if settings.api.tls.enabled() {
            Some(ServerTls::load(TlsSource::api(&settings.api.tls)).await?)
        } else {
            None
        };
        let listener = TcpListener::bind(&settings.api.listen)
            .await
            .map_err(|e| anyhow::anyhow!("api.listen: cannot bind {}: {e}", settings.api.listen))?;
        let metrics_listener =
            TcpListener::bind(&settings.api.metrics_listen).await.map_err(|e| {
                anyhow::anyhow!(
                    "api.metrics_listen: cannot bind {}: {e}",
                    settings.api.metrics_listen
                )
            })?;
        let console_listener = console::bind(&settings).await?;
        let ctx = Context::connect(settings).await?;
        // Reported before serving anything (see shard_map::join).
        let replica = Replica::new("api");
        shard_map::join(&ctx, &replica).await?;
        Ok(Self { ctx, listener, metrics_listener, console_listener, tls, replica })
    }

    /// Returns the listener's TLS configuration, when TLS is on.
    pub fn tls(&self) -> Option<Arc<ServerTls>> {
        self.tls.clone()
    }

    /// Returns the bound gRPC address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Returns the bound metrics address.
    pub fn metrics_addr(&self) -> std::io::Result<SocketAddr> {
        self.metrics_listener.local_addr()
    }

    /// Returns the bound console address, when the console is on.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.console_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Returns the shared context (tests use it to inspect state).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Serves gRPC (with health and reflection) and `/metrics` until
    /// `shutdown` is cancelled; then marks health NOT_SERVING, stops
    /// accepting and waits for in-flight calls.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let (health, health_service) = tonic_health::server::health_reporter();
        for service in SERVED {
            health.set_service_status(service, tonic_health::ServingStatus::Serving).await;
        }
        let updating = Arc::new(tokio::sync::Mutex::new(()));

        let addr = self.listener.local_addr()?;
        let heartbeats = Heartbeats::default();
        let backends =
            health::watch_backends(self.ctx.clone(), heartbeats.clone(), shutdown.clone());
        let probes = Probes::new(backends.clone(), heartbeats, &self.ctx.settings.health);
        tokio::spawn(follow_backends(health.clone(), backends, updating.clone(), shutdown.clone()));
        // Cached group seqs a failed Redis write left behind, raised again
        // as soon as Redis answers (group sends and recalls run here).
        tokio::spawn(notify_core::groups::repair_stale_seqs(self.ctx.clone(), shutdown.clone()));
        // Followed (and reported) until every call has drained: a replica
        // that stops reporting counts as gone for a bucket move.
        // (Also when this returns early with an error.)
        let drained = CancellationToken::new();
        let shard_map =
            tokio::spawn(shard_map::follow(self.ctx.clone(), self.replica, drained.clone()));
        let drained = drained.drop_guard();
        let metrics =
            tokio::spawn(health::serve_metrics(self.metrics_listener, probes, shutdown.clone()));
        // The console stops with the shutdown token: its open event
        // streams end then, so its drain never waits on them.
        let console = self.console_listener.map(|listener| {
            tokio::spawn(console::serve(listener, self.ctx.clone(), shutdown.clone()))
        });
        let draining = {
            let shutdown = shutdown.clone();
            let health = health.clone();
            let updating = updating.clone();
            async move {
                shutdown.cancelled().await;
                // After any backend update in progress, so none lands after.
                let _updating = updating.lock().await;
                for service in SERVED {
                    health
                        .set_service_status(service, tonic_health::ServingStatus::NotServing)
                        .await;
                }
                info!("api draining");
            }
        };
        let settings = &self.ctx.settings.api;
        let grace = Duration::from_secs(settings.shutdown_grace_secs);
        let guard = Guard::new(self.ctx.clone());
        let mut builder = tonic::transport::Server::builder()
            .timeout(Duration::from_secs(settings.max_deadline_secs))
            .max_concurrent_streams(settings.max_concurrent_streams)
            .http2_keepalive_interval(Some(Duration::from_secs(settings.keepalive_interval_secs)))
            .http2_keepalive_timeout(Some(Duration::from_secs(settings.keepalive_timeout_secs)));
        // tonic sends the GOAWAY at the age; the grace is kept by
        // AgedConnection (see conn_age for why not by tonic).
        let lifetime = (settings.max_connection_age_secs > 0).then(|| {
            Duration::from_secs(
                settings.max_connection_age_secs + settings.max_connection_age_grace_secs,
            )
        });
        if settings.max_connection_age_secs > 0 {
            builder =
                builder.max_connection_age(Duration::from_secs(settings.max_connection_age_secs));
        }
        let max_bytes = settings.max_request_bytes;
        let reflect = settings.reflection != ReflectionMode::Off;
        let reflection_v1 = reflect.then(|| reflection().build_v1()).transpose()?;
        let reflection_v1alpha = reflect.then(|| reflection().build_v1alpha()).transpose()?;
        let router = builder
            // Metrics outermost, so refused calls are counted too; the
            // call's span next, so refusals are traced as well.
            .layer(GrpcMetricsLayer)
            .layer(GrpcTraceLayer)
            .layer(AuthLayer::new(guard.clone()))
            // Innermost: a refused call never waits for a slot.
            .layer(RecipientCallsLayer::new(settings.max_recipient_calls))
            .add_service(health_service)
            .add_optional_service(reflection_v1)
            .add_optional_service(reflection_v1alpha)
            .add_service(
                MessageServiceServer::new(MessageApi::new(
                    self.ctx.clone(),
                    guard.clone(),
                    shutdown.clone(),
                ))
                .max_decoding_message_size(max_bytes),
            )
            .add_service(
                InboxServiceServer::new(InboxApi::new(self.ctx.clone()))
                    .max_decoding_message_size(max_bytes),
            )
            .add_service(
                GroupServiceServer::new(GroupApi::new(self.ctx.clone()))
                    .max_decoding_message_size(max_bytes),
            )
            .add_service(AdminServiceServer::new(AdminApi::new(self.ctx.clone())))
            .add_service(
                EventServiceServer::new(EventApi::new(
                    events::Hub::new(
                        self.ctx.clone(),
                        shutdown.clone(),
                        events::BusSource::Exclusive,
                    ),
                    shutdown.clone(),
                ))
                .max_decoding_message_size(max_bytes),
            );
        let tls_mode = if self.tls.is_some() { "tls" } else { "plaintext" };
        info!(%addr, transport = tls_mode, auth = self.ctx.settings.auth.enabled, "notify-api serving");
        let server = async {
            match self.tls {
                Some(tls) => {
                    tokio::spawn(tls.clone().watch_files(shutdown.clone()));
                    let incoming = tls
                        .incoming(self.listener, shutdown.clone())
                        .map(move |accepted| accepted.map(|c| AgedConnection::new(c, lifetime)));
                    router.serve_with_incoming_shutdown(incoming, draining).await
                }
                // No Nagle: a response's trailer must not wait for the client's
                // delayed ACK (that costs ~40 ms per unary call).
                None => {
                    let incoming = TcpIncoming::from(self.listener).with_nodelay(Some(true)).map(
                        move |accepted| {
                            metrics::counter!("notify_grpc_connections_total").increment(1);
                            accepted.map(|c| AgedConnection::new(c, lifetime))
                        },
                    );
                    router.serve_with_incoming_shutdown(incoming, draining).await
                }
            }
        };
        // Open streams (a health watch, say) would hold a graceful drain
        // forever: after the grace period the server stops regardless.
        let deadline = async {
            shutdown.cancelled().await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            served = server => served?,
            () = deadline => tracing::warn!(grace_secs = grace.as_secs(), "in-flight calls outlived the shutdown grace period"),
        }
        metrics.await??;
        if let Some(console) = console {
            console.await?;
        }
        drop(drained);
        shard_map.await?;
        info!("notify-api stopped");
        Ok(())
    }
}

/// gRPC health names of the api itself: `""` and every Notify service.
const SERVED: [&str; 6] = [
    "",
    "notify.v1.MessageService",
    "notify.v1.InboxService",
    "notify.v1.GroupService",
    "notify.v1.AdminService",
    "notify.v1.EventService",
];

/// gRPC health service names of the backends, reported beside `""`.
pub const BACKEND_HEALTH_SERVICES: [&str; 3] =
    ["notify.backend.mysql", "notify.backend.redis", "notify.backend.rabbitmq"];

/// Makes gRPC health follow the backends: `""` and every Notify service
/// are SERVING while the api can work (see `notify_core::health`), each
/// backend has its own entry, and draining wins over everything.
async fn follow_backends(
    health: tonic_health::server::HealthReporter,
    mut backends: tokio::sync::watch::Receiver<BackendStatus>,
    updating: Arc<tokio::sync::Mutex<()>>,
    shutdown: CancellationToken,
) {
    use tonic_health::ServingStatus::{NotServing, Serving};
    let serving = |up: bool| if up { Serving } else { NotServing };
    // Watchers see every update, so only changes are reported.
    let mut reported: Option<BackendStatus> = None;
    loop {
        let status = *backends.borrow_and_update();
        {
            let _updating = updating.lock().await;
            if shutdown.is_cancelled() {
                return;
            }
            if reported.is_none_or(|before| before.ready() != status.ready()) {
                for service in SERVED {
                    health.set_service_status(service, serving(status.ready())).await;
                }
            }
            let before = reported.map(|b| [b.mysql, b.redis, b.rabbitmq]);
            let now = [status.mysql, status.redis, status.rabbitmq];
            for (index, service) in BACKEND_HEALTH_SERVICES.into_iter().enumerate() {
                if before.is_none_or(|before| before[index] != now[index]) {
                    health.set_service_status(service, serving(now[index])).await;
                }
            }
            reported = Some(status);
        }
        tokio::select! {
            changed = backends.changed() => if changed.is_err() { return },
            () = shutdown.cancelled() => return,
        }
    }
}

/// A reflection builder over every descriptor the api serves. Both protocol
/// versions are served: v1, and v1alpha, which many clients still speak
/// (Python's grpcio-reflection, older grpcurl builds).
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(notify_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}
