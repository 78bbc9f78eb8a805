//! Tracing subscriber (logs, and OpenTelemetry traces when configured), the
//! Prometheus recorder and the `/metrics` endpoint.

pub mod trace;

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::health::Probes;
use crate::settings::{LogSettings, TraceSettings};

pub use trace::TraceExport;

/// A label-less counter resolved once per call site, for paths every call
/// takes: `metrics::counter!` looks its name up in the registry each time
/// (hashing and comparing the key), which a badge read paid twice per call.
/// Resolve only after the recorder is installed (a handle taken before it
/// counts nowhere); the services install it before serving.
#[macro_export]
macro_rules! hot_counter {
    ($name:literal) => {{
        static COUNTER: std::sync::OnceLock<metrics::Counter> = std::sync::OnceLock::new();
        COUNTER.get_or_init(|| metrics::counter!($name))
    }};
}

/// Installs the global tracing subscriber: log lines filtered by
/// `log.filter` (or `RUST_LOG`), and spans exported over OTLP when
/// `trace.otlp_endpoint` is set, as `service`. Call it inside the Tokio
/// runtime. Once per process: later calls are no-ops (which lets tests start
/// several apps in one process) and return no exporter.
///
/// Keep the returned exporter and call [`TraceExport::shutdown`] at exit so
/// the last spans are sent.
pub fn init_tracing(
    log: &LogSettings,
    trace: &TraceSettings,
    service: &'static str,
) -> Result<Option<TraceExport>, opentelemetry_otlp::ExporterBuildError> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(log.filter.as_str()));
    let lines = tracing_subscriber::fmt::layer().with_target(false);
    let lines = if log.format == "json" {
        lines.json().flatten_event(true).with_filter(filter).boxed()
    } else {
        lines.with_filter(filter).boxed()
    };
    let export = TraceExport::build(trace, service)?;
    let spans = export.as_ref().map(|export| export.layer(service));
    let installed = tracing_subscriber::registry().with(lines).with(spans).try_init().is_ok();
    match export {
        Some(export) if installed => {
            export.activate();
            Ok(Some(export))
        }
        _ => Ok(None),
    }
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
            if metrics::set_global_recorder(recorder).is_ok() {
                spawn_upkeep(handle.clone());
            }
            handle
        })
        .clone()
}

/// How often histogram samples are folded into their summaries.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Folds histogram samples into their summaries every few seconds, as the
/// exporter's own `install` does: a recorder built by hand keeps every
/// sample until a scrape or an upkeep, so an api nobody scrapes (no
/// ServiceMonitor, a bench) grew by a sample of every call it served.
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || {
        loop {
            std::thread::sleep(UPKEEP_INTERVAL);
            handle.run_upkeep();
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the metrics upkeep thread");
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
