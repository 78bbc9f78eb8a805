//! `notify-api` binary: config, runtime, telemetry, build, run.

use notify_core::telemetry;
use notify_domain::Settings;
use tokio_util::sync::CancellationToken;

// Small, short-lived allocations (HTTP/2 frames, requests, replies) are most
// of what a call allocates; mimalloc serves them with less work than glibc's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let settings = match Settings::load() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("notify-api: {e}");
            std::process::exit(2);
        }
    };
    let runtime = notify_api::runtime(&settings.api)?;
    runtime.block_on(async {
        let traces = telemetry::init_tracing(&settings.log, &settings.trace, "notify-api")?;
        let shutdown = CancellationToken::new();
        tokio::spawn(telemetry::cancel_on_signal(shutdown.clone()));
        let app = match notify_api::Application::build(settings).await {
            Ok(app) => app,
            Err(e) => {
                eprintln!("notify-api: {e}");
                std::process::exit(1);
            }
        };
        let stopped = app.run_until_stopped(shutdown).await;
        if let Some(traces) = traces {
            traces.shutdown().await;
        }
        stopped
    })
}
