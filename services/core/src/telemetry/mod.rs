//! Tracing subscriber (logs, and OpenTelemetry traces when configured), the
//! Prometheus recorder, whose page `health::serve_metrics` serves, and the
//! frame of a service's process around them ([`run_process`]: settings,
//! runtime, signals, exit codes).

pub mod trace;

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use notify_domain::Settings;
use notify_domain::settings::{LogSettings, TraceSettings};

pub use trace::TraceExport;

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
            let recorder = PrometheusBuilder::new()
                .set_buckets(SECONDS_BUCKETS)
                .and_then(|builder| {
                    builder.set_buckets_for_metric(Matcher::Suffix("_size".into()), SIZE_BUCKETS)
                })
                .expect("the bucket lists are not empty")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (a test harness); the
            // handle then renders an empty page, which is harmless.
            if metrics::set_global_recorder(recorder).is_ok() {
                spawn_upkeep(handle.clone());
                record_build_info();
            }
            handle
        })
        .clone()
}

/// `notify_build_info{version, debug_assertions}` = 1: which build serves.
/// `debug_assertions="true"` is a test build (`scripts/test` builds the
/// workspace's binaries unoptimized, with debug assertions, into
/// `target/release`), not one to measure or to run in production; the
/// bench refuses to start on one.
fn record_build_info() {
    metrics::gauge!(
        "notify_build_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "debug_assertions" => if cfg!(debug_assertions) { "true" } else { "false" },
    )
    .set(1.0);
}

/// Upper bounds of the buckets of every `*_seconds` histogram: 100 µs (a
/// badge call) to 30 s (a stuck apply). Histograms, not the exporter's
/// default summaries: a summary keeps a sketch of up to 32,768 bins (256
/// KB) per rolling bucket and label set, grown as the values it sees
/// spread, which was most of a worker's RSS rise from a 1M to a 10M send;
/// and Prometheus can add histograms up across pods, never summaries.
const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// Upper bounds of the buckets of every `*_size` histogram (chunks in a
/// group, users in a coalesced badge read).
const SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

/// How often histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Folds histogram samples into their buckets every few seconds, as the
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

/// The runtime of `worker_threads` (a service's setting): one thread (1), a
/// work-stealing pool of N threads (N > 1) or of one thread per core (0).
pub fn runtime(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match worker_threads {
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

/// A service's process, all of it (`notify-api`, `notify-worker`,
/// `notify-edge`): loads the settings (exit 2 when they are bad), starts the
/// [`runtime`] of the `worker_threads` they name and tracing as `service`,
/// builds the service (exit 1 when a dependency is out of reach), runs it
/// until SIGTERM or Ctrl-C ([`cancel_on_signal`]) and sends the last spans.
pub fn run_process<S, Built, Ran>(
    service: &'static str,
    worker_threads: impl FnOnce(&Settings) -> usize,
    build: impl FnOnce(Settings) -> Built,
    run: impl FnOnce(S, CancellationToken) -> Ran,
) -> anyhow::Result<()>
where
    Built: Future<Output = anyhow::Result<S>>,
    Ran: Future<Output = anyhow::Result<()>>,
{
    let settings = match Settings::load() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("{service}: {e}");
            std::process::exit(2);
        }
    };
    runtime(worker_threads(&settings))?.block_on(async {
        let traces = init_tracing(&settings.log, &settings.trace, service)?;
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signal(shutdown.clone()));
        let built = match build(settings).await {
            Ok(built) => built,
            Err(e) => {
                eprintln!("{service}: {e}");
                std::process::exit(1);
            }
        };
        let stopped = run(built, shutdown).await;
        if let Some(traces) = traces {
            traces.shutdown().await;
        }
        stopped
    })
}
