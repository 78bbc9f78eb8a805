//! The worker's `/healthz` (its loops beat) and `/readyz` (its backends
//! answer and both lanes consume).

use std::time::Duration;

use notify_testkit::faults::route_through_proxies;
use notify_testkit::{eventually, http_get, spawn_app_with, test_settings};

#[tokio::test]
async fn the_worker_is_ready_only_while_it_consumes_and_live_while_its_loops_turn() {
    let mut settings = test_settings();
    let proxies = route_through_proxies(&mut settings).await;
    settings.health.check_interval_ms = 100;
    let app = spawn_app_with(settings, true).await;
    let worker = app.worker.as_ref().expect("worker runs").metrics_addr;
    let ready = || async move { http_get(worker, "/readyz").await };
    eventually("the worker ready", Duration::from_secs(30), || async {
        (ready().await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(http_get(worker, "/healthz").await, (200, "ok\n".to_owned()));

    proxies.rabbitmq.down().await;
    let (_, reason) =
        eventually("the worker unready without its broker", Duration::from_secs(30), || async {
            let (code, body) = ready().await;
            (code == 503 && body.contains("rabbitmq down")).then_some((code, body))
        })
        .await;
    assert!(reason.starts_with("mysql up"), "{reason}");
    assert_eq!(http_get(worker, "/healthz").await.0, 200, "an outage is no reason to restart");
    proxies.rabbitmq.up().await;
    eventually("the worker consuming again", Duration::from_secs(60), || async {
        (ready().await.0 == 200).then_some(())
    })
    .await;
    // It delivers again once ready.
    let id = app.send(vec![1, 2, 3]).await;
    app.wait_for_status(id, notify_proto::v1::MessageStatus::Completed).await;
    app.cleanup().await;
}
