//! `notify-api` binary: telemetry, config, build, run.

use notify_core::{Settings, telemetry};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = match Settings::load() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("notify-api: {e}");
            std::process::exit(2);
        }
    };
    telemetry::init_tracing(&settings.log);
    let shutdown = CancellationToken::new();
    tokio::spawn(telemetry::cancel_on_signal(shutdown.clone()));
    let app = match notify_api::Application::build(settings).await {
        Ok(app) => app,
        Err(e) => {
            eprintln!("notify-api: {e}");
            std::process::exit(1);
        }
    };
    app.run_until_stopped(shutdown).await
}
