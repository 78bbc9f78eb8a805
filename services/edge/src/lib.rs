//! `notify-edge`: the end users' own door to Notify. Browsers and apps call
//! it with a user token their backend signed (a JWT whose `sub` is the user
//! id, [`tokens`]) and reach that user's inbox, badge, preferences and
//! groups over REST and JSON ([`routes`]), and follow them live over
//! Server-Sent Events that resume without a gap ([`events`]).
//!
//! The calls are the api's own service implementations, in process, for
//! the token's user; the live stream is the api's event hub, fed from the
//! events stream in RabbitMQ whose offsets every replica shares. The edge
//! scales apart from the api (it holds the connections); internal services
//! keep calling the api over gRPC. [`Application::build`] connects and
//! binds; [`Application::run_until_stopped`] serves until the shutdown
//! token is cancelled.

pub mod dev;
pub mod error;
pub mod events;
pub mod http1;
pub mod json;
pub mod openapi;
pub mod routes;
pub mod sdk;
pub mod tokens;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::routing::{get, post};
use futures::StreamExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use notify_api::events::{BusSource, Hub};
use notify_api::grpc::group::GroupApi;
use notify_api::grpc::inbox::InboxApi;
use notify_api::tls::{ServerTls, TlsSource};
use notify_cache::quota::Quotas;
use notify_core::Context;
use notify_core::health::{self, Heartbeats, Probes};
use notify_core::telemetry;
use notify_domain::Settings;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tracing::{info, warn};

use crate::tokens::Tokens;

/// The `notify-edge` process ([`telemetry::run_process`] with the runtime
/// `edge.worker_threads` asks for): serves until SIGTERM or Ctrl-C.
pub fn main() -> anyhow::Result<()> {
    telemetry::run_process(
        "notify-edge",
        |settings| settings.edge.worker_threads,
        Application::build,
        Application::run_until_stopped,
    )
}

/// What every handler shares.
#[derive(Clone)]
pub struct Edge {
    /// The shared context.
    pub ctx: Context,
    /// The user token keys.
    pub tokens: Arc<Tokens>,
    /// The api's inbox service, called for the token's user.
    pub inbox: InboxApi,
    /// The api's group service, likewise.
    pub groups: GroupApi,
    /// The per-user rate limit.
    pub quotas: Arc<Quotas>,
    /// The event hub of the live streams.
    pub hub: Hub,
    /// Open streams per user, bounded by `edge.max_streams_per_user`.
    pub streams: events::StreamCounts,
    /// Whether the development example page is served ([`dev::enabled`]).
    pub dev_example: bool,
}

/// A built, bound, not yet serving edge.
pub struct Application {
    ctx: Context,
    tokens: Arc<Tokens>,
    listener: TcpListener,
    metrics_listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    replica: notify_core::shard_map::Replica,
}

impl Application {
    /// Loads the token keys, connects to every dependency and binds the
    /// listeners (port 0 picks a free port, as tests do).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        telemetry::metrics_handle();
        let edge = &settings.edge;
        let tokens = Tokens::load(&edge.tokens).await?;
        let tls = if edge.tls.enabled() {
            let source = TlsSource {
                settings: edge.tls.clone(),
                section: "edge.tls",
                alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            };
            Some(ServerTls::load(source).await?)
        } else {
            None
        };
        let listener = TcpListener::bind(&edge.listen)
            .await
            .map_err(|e| anyhow::anyhow!("edge.listen: cannot bind {}: {e}", edge.listen))?;
        let metrics_listener = TcpListener::bind(&edge.metrics_listen).await.map_err(|e| {
            anyhow::anyhow!("edge.metrics_listen: cannot bind {}: {e}", edge.metrics_listen)
        })?;
        let ctx = Context::connect(settings).await?;
        let replica = notify_core::shard_map::Replica::new("edge");
        notify_core::shard_map::join(&ctx, &replica).await?;
        Ok(Self { ctx, tokens, listener, metrics_listener, tls, replica })
    }

    /// Returns the bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Returns the bound metrics address.
    pub fn metrics_addr(&self) -> std::io::Result<SocketAddr> {
        self.metrics_listener.local_addr()
    }

    /// Returns the shared context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Serves until `shutdown`: then event streams end at once (clients
    /// resume elsewhere) and calls in flight get `edge.shutdown_grace_secs`.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let settings = &self.ctx.settings.edge;
        let heartbeats = Heartbeats::default();
        let backends =
            health::watch_backends(self.ctx.clone(), heartbeats.clone(), shutdown.clone());
        let probes = Probes::new(backends, heartbeats, &self.ctx.settings.health);
        let metrics =
            tokio::spawn(health::serve_metrics(self.metrics_listener, probes, shutdown.clone()));
        tokio::spawn(self.tokens.clone().watch_files(shutdown.clone()));
        let drained = CancellationToken::new();
        let shard_map = tokio::spawn(notify_core::shard_map::follow(
            self.ctx.clone(),
            self.replica,
            drained.clone(),
        ));
        let drained = drained.drop_guard();
        let history = BusSource::Stream {
            retention: Duration::from_secs(settings.history_secs),
            max_events: settings.history_max_events,
        };
        let hub = Hub::new(self.ctx.clone(), shutdown.clone(), history);
        // The history fills from the stream before the first resume.
        if let Err(e) = hub.start_bus().await {
            // The first stream opened starts it again; readiness says so.
            warn!(error = %e.message(), "the event bus does not start yet");
        }
        let edge = Edge {
            ctx: self.ctx.clone(),
            tokens: self.tokens.clone(),
            inbox: InboxApi::new(self.ctx.clone()),
            groups: GroupApi::new(self.ctx.clone()),
            quotas: Arc::new(Quotas::new(self.ctx.cache.clone())),
            hub,
            streams: events::StreamCounts::default(),
            dev_example: dev::enabled(&self.ctx.settings, self.listener.local_addr()?),
        };
        if edge.dev_example {
            info!("the development example page is served at /dev/ (authentication is off)");
        }
        let app = router(edge, shutdown.clone());
        let addr = self.listener.local_addr()?;
        let transport = if self.tls.is_some() { "tls" } else { "plaintext" };
        info!(%addr, transport, "notify-edge serving");
        let grace = Duration::from_secs(settings.shutdown_grace_secs);
        match self.tls {
            Some(tls) => {
                tokio::spawn(tls.clone().watch_files(shutdown.clone()));
                let incoming = tls.incoming(self.listener, shutdown.clone());
                serve(incoming, app, shutdown.clone(), grace).await;
            }
            None => {
                let incoming = plain(self.listener, shutdown.clone());
                serve(incoming, app, shutdown.clone(), grace).await;
            }
        }
        metrics.await??;
        drop(drained);
        shard_map.await?;
        info!("notify-edge stopped");
        Ok(())
    }
}

/// The routes, behind CORS.
pub fn router(edge: Edge, shutdown: CancellationToken) -> Router {
    let cors = cors(&edge.ctx.settings.edge.allowed_origins);
    let dev = if edge.dev_example { dev::routes() } else { Router::new() };
    Router::new()
        .route("/v1/inbox", get(routes::inbox))
        .route("/v1/badge", get(routes::badge))
        .route("/v1/items/update", post(routes::update_items))
        .route("/v1/preferences", get(routes::get_preferences).put(routes::set_preferences))
        .route("/v1/groups", get(routes::groups))
        .route("/v1/groups/{group_id}/messages", get(routes::group_messages))
        .route("/v1/groups/{group_id}/ack", post(routes::group_ack))
        .route("/v1/events", get(events::stream))
        .route("/v1/openapi.json", get(openapi::document))
        .route("/v1/sdk/notify-inbox.js", get(sdk::bundle))
        .merge(dev)
        .fallback(|| async {
            error::ApiError::from(notify_domain::Error::NotFound("route".into()))
        })
        .layer(axum::Extension(events::Draining(shutdown)))
        .layer(cors)
        .with_state(edge)
}

/// CORS from the allow-list: the user token travels in `Authorization`
/// (never a cookie), so no credentials are allowed.
fn cors(origins: &[String]) -> CorsLayer {
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list: Vec<HeaderValue> =
            origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
        AllowOrigin::list(list)
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::PUT])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("last-event-id"),
        ])
        .expose_headers([header::RETRY_AFTER])
        .max_age(Duration::from_secs(600))
}

/// Accepted TCP connections (no Nagle: an event goes out at once).
fn plain(
    listener: TcpListener,
    shutdown: CancellationToken,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold((listener, shutdown), |(listener, shutdown)| async move {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return None,
        };
        let stream = accepted.map(|(stream, _)| {
            let _ = stream.set_nodelay(true);
            stream
        });
        Some((stream, (listener, shutdown)))
    })
}

/// Serves HTTP/1.1 and HTTP/2 on each connection until `shutdown`; then
/// waits up to `grace` for calls in flight. A connection whose first
/// request is an event stream over HTTP/1.1 is answered by [`http1`]
/// without hyper's buffers; every other by hyper.
async fn serve<S, C>(incoming: S, app: Router, shutdown: CancellationToken, grace: Duration)
where
    S: futures::Stream<Item = std::io::Result<C>>,
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    let mut incoming = std::pin::pin!(incoming);
    loop {
        let connection = tokio::select! {
            next = incoming.next() => match next {
                Some(Ok(connection)) => connection,
                Some(Err(e)) => {
                    // Out of file descriptors and the like: back off a little.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                None => break,
            },
            () = shutdown.cancelled() => break,
        };
        metrics::counter!("notify_edge_connections_total").increment(1);
        let (app, builder, watcher) = (app.clone(), builder.clone(), graceful.watcher());
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let first = tokio::select! {
                first = http1::first_request(connection) => first,
                // Nothing asked yet: nothing to finish.
                () = shutdown.cancelled() => return,
            };
            let rewound = match first {
                http1::First::Events(connection, request) => {
                    // The stream ends when the edge drains, without a wait.
                    drop(watcher);
                    if let Err(e) = http1::answer(connection, request, app).await {
                        tracing::debug!(error = %e, "event stream connection ended with an error");
                    }
                    return;
                }
                http1::First::Other(rewound) => rewound,
                http1::First::Gone => return,
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let served = builder.serve_connection_with_upgrades(TokioIo::new(rewound), service);
            if let Err(e) = watcher.watch(served.into_owned()).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        warn!(grace_secs = grace.as_secs(), "calls in flight outlived the shutdown grace period");
    }
}
