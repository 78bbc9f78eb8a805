//! The server around the RPCs: health, reflection, metrics, shutdown, config errors.

use std::process::Stdio;
use std::time::Duration;

use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_testkit::{eventually, spawn_app, spawn_app_with, test_settings};
use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

#[tokio::test]
async fn health_reports_serving_for_every_service() {
    let app = spawn_app().await;
    let mut health = HealthClient::new(app.channel());
    for service in
        ["", "notify.v1.MessageService", "notify.v1.InboxService", "notify.v1.GroupService"]
    {
        let response = health
            .check(HealthCheckRequest { service: service.into() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.status, ServingStatus::Serving as i32, "service {service:?}");
    }
    app.cleanup().await;
}

#[tokio::test]
async fn reflection_lists_the_three_services() {
    let app = spawn_app().await;
    let mut reflection = ServerReflectionClient::new(app.channel());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["notify.v1.MessageService", "notify.v1.InboxService", "notify.v1.GroupService"]
    {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
    app.cleanup().await;
}

#[tokio::test]
async fn metrics_endpoint_counts_rpcs() {
    let app = spawn_app().await;
    crate::helpers::send(&app, vec![1, 2]).await;
    let mut stream = tokio::net::TcpStream::connect(app.metrics_addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(
        body.contains("notify_grpc_requests_total{method=\"/notify.v1.MessageService/SendMessage\",code=\"0\"}"),
        "{body}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn unreachable_mysql_fails_the_build_with_a_line_naming_the_setting() {
    let mut settings = test_settings();
    settings.database.url = secrecy::SecretString::from("mysql://notify:notify@127.0.0.1:1");
    settings.database.connect_timeout_secs = 1;
    let error = notify_api::Application::build(settings).await.err().expect("build must fail");
    let line = error.to_string();
    assert!(line.contains("database.shards[0] (shard 0, database notify_t"), "{line}");
    assert!(line.contains("cannot connect"), "{line}");
    assert!(!line.contains('\n'), "one line: {line}");
}

#[tokio::test]
async fn graceful_shutdown_reports_not_serving_then_stops() {
    let app = spawn_app().await;
    let mut health = HealthClient::new(app.channel());
    let mut watch =
        health.watch(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    let stopping = tokio::spawn(app.cleanup());
    // The health watch sees NOT_SERVING (or the stream closes) as the api drains.
    let update = watch.next().await.expect("an update before the stream ends").unwrap();
    assert_eq!(update.status, ServingStatus::NotServing as i32);
    // The open watch stream cannot hold the shutdown past the grace period.
    let stopped = tokio::time::timeout(Duration::from_secs(15), stopping).await;
    stopped.expect("api stopped within the grace period").unwrap();
}

#[tokio::test]
async fn migrate_twice_changes_nothing_the_second_time() {
    let settings = test_settings();
    let first = notify_core::db::migrate_all(&settings).await.unwrap();
    assert!(first.iter().all(|r| r.created_database && !r.applied.is_empty()));
    let second = notify_core::db::migrate_all(&settings).await.unwrap();
    assert_eq!(second.len(), 4);
    assert!(second.iter().all(|r| !r.created_database && r.applied.is_empty()), "{second:?}");
    notify_core::db::drop_all(&settings).await.unwrap();
}

/// Picks a free loopback port for a child process to bind.
fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

#[tokio::test]
async fn the_binary_serves_on_one_thread_or_a_pool_and_stops_on_sigterm() {
    let app = spawn_app_with(test_settings(), false).await;
    let config = app.write_config_file();
    for threads in ["1", "2", "0"] {
        let addr = free_addr();
        let mut api = tokio::process::Command::new(env!("CARGO_BIN_EXE_notify-api"))
            .env("NOTIFY_CONFIG", &config)
            .env("NOTIFY_API__LISTEN", &addr)
            .env("NOTIFY_API__METRICS_LISTEN", free_addr())
            .env("NOTIFY_API__WORKER_THREADS", threads)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("api binary starts");
        let channel = eventually("the api binary accepts calls", Duration::from_secs(30), || {
            let uri = format!("http://{addr}");
            async move { tonic::transport::Channel::from_shared(uri).unwrap().connect().await.ok() }
        })
        .await;
        let health = HealthClient::new(channel.clone())
            .check(HealthCheckRequest { service: String::new() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(health.status, ServingStatus::Serving as i32, "worker_threads {threads}");
        let badge = InboxServiceClient::new(channel)
            .get_unread_count(v1::GetUnreadCountRequest { user_id: 42 })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((badge.user_id, badge.unread), (42, 0), "worker_threads {threads}");

        let pid = api.id().expect("running").to_string();
        let killed = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        let exit = tokio::time::timeout(Duration::from_secs(20), api.wait()).await;
        let exit = exit.expect("stopped within 20 s of SIGTERM").unwrap();
        assert!(exit.success(), "worker_threads {threads}: {exit}");
    }
    app.cleanup().await;
}
