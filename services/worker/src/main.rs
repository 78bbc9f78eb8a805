//! `notify-worker` binary: telemetry, config, build, run.

use notify_core::telemetry;
use notify_domain::Settings;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = match Settings::load() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("notify-worker: {e}");
            std::process::exit(2);
        }
    };
    let traces = telemetry::init_tracing(&settings.log, &settings.trace, "notify-worker")?;
    let shutdown = CancellationToken::new();
    tokio::spawn(telemetry::cancel_on_signal(shutdown.clone()));
    let worker = match notify_worker::Worker::build(settings).await {
        Ok(worker) => worker,
        Err(e) => {
            eprintln!("notify-worker: {e}");
            std::process::exit(1);
        }
    };
    let stopped = worker.run_until_stopped(shutdown).await;
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    stopped
}
