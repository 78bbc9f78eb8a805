//! The server around the RPCs: health, reflection, metrics, shutdown, config errors.

use std::process::Stdio;
use std::time::Duration;

use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_testkit::child::ApiChild;
use notify_testkit::metrics::MetricsPage;
use notify_testkit::{spawn_app, spawn_app_with, test_settings};
use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

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

/// The services a reflection client of protocol `$version` (`v1`, as grpcurl
/// and newer clients ask, or `v1alpha`, as grpcio-reflection and other older
/// clients ask) lists.
macro_rules! list_services {
    ($version:ident, $channel:expr) => {{
        use tonic_reflection::pb::$version::ServerReflectionRequest;
        use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut responses = ServerReflectionClient::new($channel)
            .server_reflection_info(tokio_stream::iter(vec![request]))
            .await
            .unwrap()
            .into_inner();
        let response = responses.next().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
            panic!("unexpected reflection answer");
        };
        list.service.into_iter().map(|s| s.name).collect::<Vec<String>>()
    }};
}

#[tokio::test]
async fn reflection_v1_and_v1alpha_list_the_services() {
    let app = spawn_app().await;
    let listed = [
        ("v1", list_services!(v1, app.channel())),
        ("v1alpha", list_services!(v1alpha, app.channel())),
    ];
    for (version, names) in &listed {
        for expected in
            ["notify.v1.MessageService", "notify.v1.InboxService", "notify.v1.GroupService"]
        {
            assert!(
                names.iter().any(|n| n == expected),
                "{version}: {expected} missing from {names:?}"
            );
        }
    }
    app.cleanup().await;
}

#[tokio::test]
async fn metrics_endpoint_counts_rpcs() {
    let app = spawn_app().await;
    crate::helpers::send(&app, vec![1, 2]).await;
    let (status, body) = notify_testkit::http_get(app.metrics_addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("notify_grpc_requests_total{method=\"/notify.v1.MessageService/SendMessage\",code=\"0\"}"),
        "{body}"
    );
    // Durations are histograms with fixed buckets (addable across pods; a
    // summary's sketch grew with the spread of values), never summaries.
    let send_duration = "notify_grpc_request_duration_seconds_bucket{method=\"/notify.v1.MessageService/SendMessage\",code=\"0\"";
    assert!(body.contains(&format!("{send_duration},le=\"0.0001\"}}")), "{body}");
    assert!(body.contains(&format!("{send_duration},le=\"+Inf\"}}")), "{body}");
    assert!(!body.contains("quantile=\""), "{body}");
    app.cleanup().await;
}

/// The page says which build serves: a test build (debug assertions on,
/// as this test's own) or an optimized one; the bench refuses the first.
#[tokio::test]
async fn metrics_say_which_build_serves() {
    let app = spawn_app().await;
    let page = MetricsPage::parse(&notify_testkit::http_get(app.metrics_addr, "/metrics").await.1);
    let this_build = if cfg!(debug_assertions) { "true" } else { "false" };
    let other = if cfg!(debug_assertions) { "false" } else { "true" };
    let series = |debug: &str| {
        let labels = [("version", env!("CARGO_PKG_VERSION")), ("debug_assertions", debug)];
        page.sum("notify_build_info", &labels)
    };
    assert_eq!((series(this_build), series(other)), (1.0, 0.0), "{}", page.text());
    app.cleanup().await;
}

#[tokio::test]
async fn metrics_count_a_stream_by_the_status_in_its_trailers() {
    let app = spawn_app_with(test_settings(), false).await;
    let status = crate::helpers::subscribe_then_fail(app.channel()).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    // Counted when the trailers went out, before the client read them.
    let page = MetricsPage::parse(&notify_testkit::http_get(app.metrics_addr, "/metrics").await.1);
    let failed = [("method", "/notify.v1.EventService/Subscribe"), ("code", "3")];
    assert!(page.sum("notify_grpc_requests_total", &failed) >= 1.0, "{page:?}");
    let buckets = page.buckets("notify_grpc_request_duration_seconds", &failed);
    assert!(buckets.last().is_some_and(|(_, count)| *count >= 1.0), "{buckets:?}");
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
    let first = notify_store::db::migrate_all(&settings).await.unwrap();
    assert!(first.iter().all(|r| r.created_database && !r.applied.is_empty()));
    let second = notify_store::db::migrate_all(&settings).await.unwrap();
    assert_eq!(second.len(), 4);
    assert!(second.iter().all(|r| !r.created_database && r.applied.is_empty()), "{second:?}");
    notify_store::db::drop_all(&settings).await.unwrap();
}

/// A shard a development build migrated before the schema was one file is
/// refused with a line that says what to do, and nothing is applied to it.
#[tokio::test]
async fn a_shard_migrated_by_a_build_before_the_one_file_schema_is_refused_plainly() {
    let settings = test_settings();
    notify_store::db::migrate_all(&settings).await.unwrap();
    let shard = &settings.database.shards[1];
    let url = format!("{}/{}", settings.shard_server_url(shard), shard.database);
    let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (20261122000001, 'init', TRUE, X'00', 1)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let refused = notify_store::db::migrate_all(&settings).await.unwrap_err().to_string();
    assert!(refused.contains(&shard.database), "{refused}");
    assert!(
        refused.contains("20261122000001") && refused.contains("drop that database"),
        "{refused}"
    );
    notify_store::db::drop_all(&settings).await.unwrap();
}

/// Whether `idx_contract_test` is on each shard of `settings`.
async fn test_index_on_each_shard(settings: &notify_domain::Settings) -> Vec<bool> {
    let mut found = Vec::new();
    for shard in &settings.database.shards {
        let url = format!("{}/{}", settings.shard_server_url(shard), shard.database);
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(&url).await.unwrap();
        let count: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = 'message_items' AND INDEX_NAME = 'idx_contract_test'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        found.push(count > 0);
    }
    found
}

/// The contract step runs a contract migration only once no live replica
/// of an older build reports (one of a build before replicas reported a
/// schema version counts as older than any), waits for it up to its
/// patience, defers it past that, and applies it once, on every shard.
/// The migration is the test's own (an index an expand step "left for the
/// old build", dropped by its contract), as a release's would be.
#[tokio::test]
async fn the_contract_step_waits_for_replicas_of_older_builds() {
    use notify_store::db::contract::{contract_with, schema_version};
    let mut settings = test_settings();
    // Gone after 2 s of silence.
    settings.database.replica_lease_secs = 1;
    notify_store::db::migrate_all(&settings).await.unwrap();
    for shard in &settings.database.shards {
        let url = format!("{}/{}", settings.shard_server_url(shard), shard.database);
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(&url).await.unwrap();
        sqlx::raw_sql("ALTER TABLE message_items ADD INDEX idx_contract_test (user_id, recalled)")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let dir = std::env::temp_dir().join(format!("notify-contract-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let version = schema_version();
    std::fs::write(
        dir.join(format!("{version}_drop_contract_test_index.sql")),
        "ALTER TABLE message_items DROP INDEX IF EXISTS idx_contract_test",
    )
    .unwrap();
    let contract = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    let directory = &settings.database.shards[0];
    let url = format!("{}/{}", settings.shard_server_url(directory), directory.database);
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    // A replica of this build and a live one of the build before.
    sqlx::query(
        "INSERT INTO shard_map_replicas (replica, role, version, refused, schema_version, seen_at) \
         VALUES ('api new:1:a', 'api', 1, 0, ?, UTC_TIMESTAMP(3) + INTERVAL 1 HOUR), \
         ('worker old:2:b', 'worker', 1, 0, 0, UTC_TIMESTAMP(3) + INTERVAL 1 HOUR)",
    )
    .bind(version)
    .execute(&pool)
    .await
    .unwrap();

    let held = contract_with(&settings, &contract, Duration::ZERO).await.unwrap();
    let deferred: Vec<i64> = held.deferred.iter().map(|(version, _)| *version).collect();
    assert_eq!(deferred, [version]);
    let holding: Vec<_> =
        held.holding.iter().map(|h| (h.replica.as_str(), h.schema_version)).collect();
    assert_eq!(holding, [("worker old:2:b", 0)]);
    assert!(held.applied.iter().all(|(_, applied)| applied.is_empty()), "{:?}", held.applied);
    assert_eq!(test_index_on_each_shard(&settings).await, [true; 4]);

    // The old replica stops reporting; the step waits it out.
    sqlx::query(
        "UPDATE shard_map_replicas SET seen_at = UTC_TIMESTAMP(3) WHERE replica = 'worker old:2:b'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let done = contract_with(&settings, &contract, Duration::from_secs(60)).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1), "it waited: {:?}", started.elapsed());
    assert!(done.deferred.is_empty() && done.holding.is_empty(), "{done:?}");
    assert_eq!(done.applied.len(), 4);
    assert!(done.applied.iter().all(|(_, applied)| *applied == [version]), "{:?}", done.applied);
    assert_eq!(test_index_on_each_shard(&settings).await, [false; 4]);

    // Once: nothing again, whoever reports.
    let again = contract_with(&settings, &contract, Duration::ZERO).await.unwrap();
    assert!(again.applied.iter().all(|(_, applied)| applied.is_empty()), "{:?}", again.applied);
    assert!(again.deferred.is_empty());
    pool.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
    notify_store::db::drop_all(&settings).await.unwrap();
}

/// Picks a free loopback port for a child process to bind.
fn free_addr() -> String {
    notify_testkit::child::free_port().to_string()
}

#[tokio::test]
async fn the_binary_serves_on_one_thread_or_a_pool_and_stops_on_sigterm() {
    let app = spawn_app_with(test_settings(), false).await;
    let config = app.write_config_file();
    for threads in ["1", "2", "0"] {
        let binary = notify_testkit::bin(env!("CARGO_BIN_EXE_notify-api"));
        let ApiChild { child: mut api, channel, .. } = ApiChild::start(&binary, |command| {
            command.env("NOTIFY_CONFIG", &config).env("NOTIFY_API__WORKER_THREADS", threads);
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

/// The next status a health watch reports (30 s at most).
async fn next(stream: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>) -> i32 {
    let item = tokio::time::timeout(Duration::from_secs(30), stream.next()).await;
    item.expect("a health change in 30 s").expect("stream open").unwrap().status
}

#[tokio::test]
async fn connections_past_their_max_age_reconnect_and_no_call_fails_at_the_switch() {
    let mut settings = test_settings();
    settings.api.max_connection_age_secs = 1;
    settings.api.max_connection_age_grace_secs = 1;
    let app = spawn_app_with(settings, false).await;
    let connections = || async {
        notify_testkit::metric_sum(
            &notify_testkit::http_get(app.metrics_addr, "/metrics").await.1,
            "notify_grpc_connections_total",
        )
    };
    let before = connections().await;
    let started = std::time::Instant::now();
    let callers = (0..8).map(|caller| {
        let mut inbox = InboxServiceClient::new(app.channel());
        async move {
            let (mut calls, mut resent) = (0u32, 0u32);
            while started.elapsed() < Duration::from_millis(3500) {
                let user_id = 1 + caller;
                match inbox.get_unread_count(v1::GetUnreadCountRequest { user_id }).await {
                    Ok(_) => calls += 1,
                    // Queued on the old connection as it closed, never sent:
                    // what a gRPC client retries transparently.
                    Err(status) if notify_testkit::never_sent(&status) => resent += 1,
                    Err(e) => panic!("call {calls} of caller {caller} failed: {e:?}"),
                }
            }
            (calls, resent)
        }
    });
    let (calls, resent) = futures::future::join_all(callers)
        .await
        .into_iter()
        .fold((0, 0), |(calls, resent), (c, r)| (calls + c, resent + r));
    let reconnects = connections().await - before;
    assert!(reconnects >= 2.0, "{reconnects} new connections in 3.5 s with a 1 s max age");
    assert!(calls > 100, "{calls} calls");
    // At most one queued call per caller per switch can race the close.
    assert!(resent <= 8 * reconnects as u32, "{resent} calls lost to {reconnects} switches");

    // A stream that never ends cannot hold its connection past age + grace.
    let id = app.send(vec![1]).await;
    let own = tonic::transport::Channel::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watch = v1::message_service_client::MessageServiceClient::new(own)
        .watch_message(v1::WatchMessageRequest { message_id: id, interval_ms: 60_000 })
        .await
        .unwrap()
        .into_inner();
    let opened = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = watch.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived the connection's age and grace");
    assert!(opened.elapsed() >= Duration::from_millis(1500), "{:?}", opened.elapsed());
    app.cleanup().await;
}

#[tokio::test]
async fn readiness_follows_mysql_and_rabbitmq_while_redis_only_degrades() {
    use notify_testkit::faults::route_through_proxies;
    let mut settings = test_settings();
    let proxies = route_through_proxies(&mut settings).await;
    settings.health.check_interval_ms = 100;
    let app = spawn_app_with(settings, false).await;
    let mut health = HealthClient::new(app.channel());
    let mut overall =
        health.watch(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    let mut redis = health
        .watch(HealthCheckRequest { service: "notify.backend.redis".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next(&mut overall).await, ServingStatus::Serving as i32);
    assert_eq!(next(&mut redis).await, ServingStatus::Serving as i32);
    let probe = |path: &'static str| notify_testkit::http_get(app.metrics_addr, path);

    proxies.shards[2].down().await;
    assert_eq!(next(&mut overall).await, ServingStatus::NotServing as i32);
    let (code, body) = probe("/readyz").await;
    assert_eq!((code, body.trim()), (503, "mysql down, redis up, rabbitmq up"));
    assert_eq!(probe("/healthz").await.0, 200, "a backend outage is no reason to restart");
    proxies.shards[2].up().await;
    assert_eq!(next(&mut overall).await, ServingStatus::Serving as i32);
    assert_eq!(probe("/readyz").await, (200, "ok\n".to_owned()));

    // Redis is a cache: its outage is reported, but the api stays ready.
    proxies.redis.down().await;
    assert_eq!(next(&mut redis).await, ServingStatus::NotServing as i32);
    let badge = InboxServiceClient::new(app.channel())
        .get_unread_count(v1::GetUnreadCountRequest { user_id: 5 })
        .await
        .expect("badges are answered from MySQL without Redis");
    assert_eq!(badge.into_inner().unread, 0);
    proxies.redis.up().await;
    assert_eq!(next(&mut redis).await, ServingStatus::Serving as i32);

    proxies.rabbitmq.down().await;
    assert_eq!(next(&mut overall).await, ServingStatus::NotServing as i32);
    proxies.rabbitmq.up().await;
    assert_eq!(next(&mut overall).await, ServingStatus::Serving as i32);
    assert_eq!(probe("/readyz").await.0, 200);
    app.cleanup().await;
}

/// The process's exits before it serves: 2 for settings it cannot use, 1 for
/// a dependency out of reach, each with a line on stderr naming the cause.
#[tokio::test]
async fn the_binary_exits_2_on_bad_settings_and_1_when_a_shard_is_out_of_reach() {
    let run = |env: &[(&str, &str)]| {
        let mut command =
            std::process::Command::new(notify_testkit::bin(env!("CARGO_BIN_EXE_notify-api")));
        command.env_remove("NOTIFY_CONFIG").stdout(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        command.output().expect("api binary runs")
    };
    let bad = run(&[("NOTIFY_API__WORKER_THREADS", "many")]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("notify-api: ") && stderr.contains("api.worker_threads"),
        "{stderr}"
    );

    // Port 1 on loopback refuses at once; the pool gives up after 1 s.
    let unreachable = run(&[
        ("NOTIFY_DATABASE__URL", "mysql://root@127.0.0.1:1"),
        ("NOTIFY_DATABASE__CONNECT_TIMEOUT_SECS", "1"),
        ("NOTIFY_API__LISTEN", &free_addr()),
        ("NOTIFY_API__METRICS_LISTEN", &free_addr()),
        ("NOTIFY_CONSOLE__LISTEN", &free_addr()),
    ]);
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert_eq!(unreachable.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("notify-api: ") && stderr.contains("cannot connect"), "{stderr}");
}

/// Past `api.max_recipient_calls`, a call carrying recipients waits for a
/// slot before it is decoded: with one slot, an append held up in its
/// handler (its draft's control row locked here) keeps a second append, to
/// another draft, from storing anything until it is let go; then both land.
#[tokio::test]
async fn recipient_calls_past_the_limit_wait_undecoded_for_a_slot() {
    const WAIT: Duration = Duration::from_secs(30);
    let mut settings = test_settings();
    settings.api.max_recipient_calls = 1;
    let app = spawn_app_with(settings, false).await;
    let held = crate::helpers::create_draft(&app, "held").await;
    let queued = crate::helpers::create_draft(&app, "queued").await;
    let home = app.ctx.pools.for_message(held);
    let mut locker = home.value().begin().await.unwrap();
    sqlx::query("SELECT status FROM messages WHERE message_id = ? FOR UPDATE")
        .bind(held)
        .fetch_one(&mut *locker)
        .await
        .unwrap();
    let append = |message_id: u64| {
        let mut client = app.messages();
        let batch = v1::AppendRecipientsRequest {
            message_id,
            batch_number: 1,
            user_ids: (1..=1_000).collect(),
            ..Default::default()
        };
        tokio::spawn(async move { client.append_recipients(batch).await })
    };
    let first = append(held);
    notify_testkit::eventually("the first append waits for the lock", WAIT, || async {
        // Not this connection's own query, whose text holds the pattern.
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE DB = DATABASE() AND ID <> CONNECTION_ID() \
             AND INFO LIKE '%FROM messages%LOCK IN SHARE MODE%'",
        )
        .fetch_one(home.value())
        .await
        .unwrap();
        (waiting == 1).then_some(())
    })
    .await;
    let second = append(queued);
    notify_testkit::eventually("the second append waits for a slot", WAIT, || async {
        let page =
            MetricsPage::parse(&notify_testkit::http_get(app.metrics_addr, "/metrics").await.1);
        (page.sum("notify_recipient_calls_waiting", &[]) >= 1.0).then_some(())
    })
    .await;
    assert!(!second.is_finished());
    let stored = app.get_message(queued).await.progress.map_or(0, |p| p.total);
    assert_eq!(stored, 0, "the waiting append stored nothing");
    locker.rollback().await.unwrap();
    for (message_id, append) in [(held, first), (queued, second)] {
        assert_eq!(append.await.unwrap().unwrap().into_inner().accepted, 1_000);
        assert_eq!(app.get_message(message_id).await.progress.unwrap().total, 1_000);
    }
    drop(home);
    app.cleanup().await;
}
