//! Tracing subscriber, the Prometheus recorder and the `/metrics` endpoint.

use std::sync::OnceLock;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use crate::health::Probes;
use crate::settings::LogSettings;

/// Installs the global tracing subscriber (once per process; later calls are
/// no-ops, which lets tests start several apps in one process).
pub fn init_tracing(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(settings.filter.as_str()));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let _ = if settings.format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// Returns the process-wide Prometheus recorder handle, installing it once.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (a test harness); the
            // handle then renders an empty page, which is harmless.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
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

/// Resolves when SIGTERM or Ctrl-C arrives, then cancels `token`.
pub async fn cancel_on_signal(token: CancellationToken) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("ctrl-c received, shutting down"),
        () = terminate => tracing::info!("sigterm received, shutting down"),
        () = token.cancelled() => {}
    }
    token.cancel();
}
