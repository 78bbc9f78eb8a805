//! `notify-api`: the gRPC front service. [`Application::build`] connects and
//! binds; [`Application::run_until_stopped`] serves until the shutdown token
//! is cancelled, then reports NOT_SERVING and drains.

pub mod convert;
pub mod grpc;
pub mod metrics_layer;
pub mod status;

use std::net::SocketAddr;
use std::time::Duration;

use notify_core::settings::ApiSettings;
use notify_core::{Context, Settings};
use notify_proto::v1::group_service_server::GroupServiceServer;
use notify_proto::v1::inbox_service_server::InboxServiceServer;
use notify_proto::v1::message_service_server::MessageServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tracing::info;

use crate::grpc::group::GroupApi;
use crate::grpc::inbox::InboxApi;
use crate::grpc::message::MessageApi;
use crate::metrics_layer::GrpcMetricsLayer;

/// Builds the runtime `api.worker_threads` asks for: one thread (1), a
/// work-stealing pool of N threads (N > 1) or of one thread per core (0).
pub fn runtime(settings: &ApiSettings) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match settings.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        threads => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if threads > 1 {
                builder.worker_threads(threads);
            }
            builder
        }
    };
    builder.enable_all().build()
}

/// A built, bound, not yet serving api.
pub struct Application {
    ctx: Context,
    listener: TcpListener,
    metrics_listener: TcpListener,
}

impl Application {
    /// Connects to every dependency and binds the gRPC and metrics listeners
    /// (port 0 picks a free port, as tests do).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        // Install the metrics recorder before anything resolves a metric
        // handle (the cache's badge reader does so when it starts).
        notify_core::telemetry::metrics_handle();
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
        let ctx = Context::connect(settings).await?;
        Ok(Self { ctx, listener, metrics_listener })
    }

    /// Returns the bound gRPC address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Returns the bound metrics address.
    pub fn metrics_addr(&self) -> std::io::Result<SocketAddr> {
        self.metrics_listener.local_addr()
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
        health.set_serving::<MessageServiceServer<MessageApi>>().await;
        health.set_serving::<InboxServiceServer<InboxApi>>().await;
        health.set_serving::<GroupServiceServer<GroupApi>>().await;
        health.set_service_status("", tonic_health::ServingStatus::Serving).await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(notify_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;

        let addr = self.listener.local_addr()?;
        let metrics = tokio::spawn(notify_core::telemetry::serve_metrics(
            self.metrics_listener,
            shutdown.clone(),
        ));
        let draining = {
            let shutdown = shutdown.clone();
            let health = health.clone();
            async move {
                shutdown.cancelled().await;
                health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
                health.set_not_serving::<MessageServiceServer<MessageApi>>().await;
                health.set_not_serving::<InboxServiceServer<InboxApi>>().await;
                health.set_not_serving::<GroupServiceServer<GroupApi>>().await;
                info!("api draining");
            }
        };
        info!(%addr, "notify-api serving");
        let grace = Duration::from_secs(self.ctx.settings.api.shutdown_grace_secs);
        let server = tonic::transport::Server::builder()
            .layer(GrpcMetricsLayer)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(MessageServiceServer::new(MessageApi::new(
                self.ctx.clone(),
                shutdown.clone(),
            )))
            .add_service(InboxServiceServer::new(InboxApi::new(self.ctx.clone())))
            .add_service(GroupServiceServer::new(GroupApi::new(self.ctx.clone())))
            // No Nagle: a response's trailer must not wait for the client's
            // delayed ACK (that costs ~40 ms per unary call).
            .serve_with_incoming_shutdown(
                TcpIncoming::from(self.listener).with_nodelay(Some(true)),
                draining,
            );
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
        info!("notify-api stopped");
        Ok(())
    }
}
