//! Webhooks against real HTTP servers started here (axum on 127.0.0.1:0),
//! with the real MariaDB, RabbitMQ and Redis: signatures checked with the
//! Standard Webhooks algorithm written out below (HMAC from SHA-256 by
//! hand, not the crate the dispatcher uses), retries after 500s and
//! timeouts, the dead-letter queue, only a client's own sends, `item.read`
//! batches and their feed (which outlives a killed api), and a dead
//! endpoint that holds up nobody else. Every wait is
//! on a request arriving (a channel, with a deadline), never a sleep.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures::StreamExt as _;
use lapin::options::BasicGetOptions;
use notify_core::deliver::{self, TaskOutcome};
use notify_core::queue;
use notify_core::webhooks::{Job, WebhookTopology};
use notify_domain::Settings;
use notify_domain::domain::MessageId;
use notify_domain::settings::WebhookEndpoint;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_store::db::webhook_outbox::{self, OutboxEvent, Record};
use notify_store::db::{messages, read_feed};
use notify_testkit::faults::FaultProxy;
use notify_testkit::{AuthedChannel, TestApp, authed, send_request, spawn_app_with, test_settings};
use secrecy::SecretString;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How an endpoint answers one request.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Ok,
    Status(u16),
    /// Never answers: the dispatcher's timeout ends the call.
    Hang,
}

/// One request an endpoint got.
#[derive(Debug)]
struct Hook {
    id: String,
    timestamp: String,
    signature: String,
    body: String,
    at: Instant,
}

impl Hook {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).expect("a JSON payload")
    }

    fn event(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }

    fn message_id(&self) -> u64 {
        self.json()["data"]["message_id"].as_str().and_then(|id| id.parse().ok()).unwrap_or(0)
    }
}

struct Endpoint {
    plan: Mutex<VecDeque<Answer>>,
    then: Answer,
    requests: mpsc::UnboundedSender<Hook>,
}

/// An HTTP endpoint on 127.0.0.1:0 that answers by a plan, then `then`.
struct Receiver {
    url: String,
    secret: String,
    requests: mpsc::UnboundedReceiver<Hook>,
}

impl Receiver {
    async fn start(plan: &[Answer], then: Answer) -> Self {
        let (sender, requests) = mpsc::unbounded_channel();
        let endpoint = Arc::new(Endpoint {
            plan: Mutex::new(plan.iter().copied().collect()),
            then,
            requests: sender,
        });
        let app = axum::Router::new().route("/hook", post(receive)).with_state(endpoint);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let key: [u8; 32] = rand::random();
        Self {
            url: format!("http://{addr}/hook"),
            secret: format!("whsec_{}", STANDARD.encode(key)),
            requests,
        }
    }

    /// The next request, within `within`.
    async fn next(&mut self, within: Duration) -> Hook {
        tokio::time::timeout(within, self.requests.recv())
            .await
            .expect("a webhook request in time")
            .expect("the endpoint runs")
    }

    /// Nothing more arrives within `quiet`.
    async fn assert_quiet(&mut self, quiet: Duration) {
        if let Ok(Some(hook)) = tokio::time::timeout(quiet, self.requests.recv()).await {
            panic!("unexpected webhook request: {}", hook.body);
        }
    }

    /// Checks the request's signature with the endpoint's secret.
    fn verify(&self, hook: &Hook) {
        let key = STANDARD.decode(self.secret.strip_prefix("whsec_").unwrap()).unwrap();
        let signed = format!("{}.{}.{}", hook.id, hook.timestamp, hook.body);
        let expected = format!("v1,{}", STANDARD.encode(hmac_sha256(&key, signed.as_bytes())));
        let valid = hook.signature.split(' ').any(|candidate| candidate == expected);
        assert!(valid, "signature {:?} is not {expected:?}", hook.signature);
        let sent: i64 = hook.timestamp.parse().expect("a unix timestamp");
        let now = chrono::Utc::now().timestamp();
        assert!((now - sent).abs() <= 300, "timestamp {sent} is not within 5 minutes of {now}");
        assert!(hook.id.starts_with("msg_"), "{}", hook.id);
    }

    fn endpoint(&self, events: &[&str]) -> WebhookEndpoint {
        WebhookEndpoint {
            url: self.url.clone(),
            secret: SecretString::from(self.secret.clone()),
            secret_file: String::new(),
            events: events.iter().map(|e| (*e).to_owned()).collect(),
        }
    }
}

async fn receive(
    State(endpoint): State<Arc<Endpoint>>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let header =
        |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let answer = endpoint.plan.lock().unwrap().pop_front().unwrap_or(endpoint.then);
    let _ = endpoint.requests.send(Hook {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body,
        at: Instant::now(),
    });
    match answer {
        Answer::Ok => StatusCode::NO_CONTENT,
        Answer::Status(code) => StatusCode::from_u16(code).unwrap(),
        Answer::Hang => std::future::pending().await,
    }
}

/// HMAC-SHA256 as RFC 2104 defines it, from SHA-256 alone.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner_pad: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
    let outer_pad: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new().chain_update(&inner_pad).chain_update(message).finalize();
    Sha256::new().chain_update(&outer_pad).chain_update(inner).finalize().into()
}

#[test]
fn the_hand_written_hmac_matches_rfc_4231() {
    // RFC 4231, test case 2.
    let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

/// Settings with clients `alpha` and `beta` (any sender, send, recall,
/// read and mark read), fast retries; returns them with the tokens.
fn two_clients() -> (Settings, HashMap<String, String>) {
    let mut settings = test_settings();
    let scopes: &[&str] = &["send", "sends.read", "sends.manage", "inbox.read", "inbox.write"];
    let tokens =
        notify_testkit::with_clients(&mut settings, &[("alpha", scopes), ("beta", scopes)]);
    for client in &mut settings.auth.clients {
        client.senders = vec!["*".to_owned()];
    }
    settings.webhooks.retry_delays_ms = vec![300, 600];
    settings.webhooks.timeout_ms = 1_000;
    (settings, tokens)
}

fn messages(app: &TestApp, token: &str) -> MessageServiceClient<AuthedChannel> {
    MessageServiceClient::new(authed(app.channel(), token))
}

async fn send(app: &TestApp, token: &str, user_ids: Vec<u64>) -> u64 {
    messages(app, token)
        .send_message(send_request(user_ids))
        .await
        .expect("send")
        .into_inner()
        .message_id
}

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn events_are_signed_retried_after_500s_and_timeouts_and_reach_only_their_client() {
    let mut alpha = Receiver::start(&[Answer::Status(500), Answer::Hang], Answer::Ok).await;
    let mut beta = Receiver::start(&[], Answer::Ok).await;
    let (mut settings, tokens) = two_clients();
    settings.auth.clients[0].webhooks =
        vec![alpha.endpoint(&["message.completed", "message.recalled"])];
    settings.auth.clients[1].webhooks = vec![beta.endpoint(&["message.completed"])];
    let app = spawn_app_with(settings, true).await;

    let beta_send = send(&app, &tokens["beta"], vec![4, 5]).await;
    let alpha_send = send(&app, &tokens["alpha"], vec![1, 2, 3]).await;

    // beta's endpoint gets beta's send, signed with beta's secret.
    let hook = beta.next(WAIT).await;
    beta.verify(&hook);
    assert_eq!((hook.event().as_str(), hook.message_id()), ("message.completed", beta_send));
    assert_eq!(hook.json()["data"]["progress"]["delivered"], 2);

    // alpha's: a 500, a timeout, then a 2xx: three attempts at one event,
    // under one id, each signed, the waits growing.
    let first = alpha.next(WAIT).await;
    let second = alpha.next(WAIT).await;
    let third = alpha.next(WAIT).await;
    for hook in [&first, &second, &third] {
        alpha.verify(hook);
        assert_eq!((hook.event().as_str(), hook.message_id()), ("message.completed", alpha_send));
        assert_eq!(hook.id, first.id, "one webhook-id on every attempt");
        assert_eq!(hook.body, first.body, "the same payload on every attempt");
    }
    assert_eq!(first.json()["data"]["status"], "completed");
    assert_eq!(first.json()["data"]["progress"]["delivered"], 3);
    assert!(second.at - first.at >= Duration::from_millis(300), "the first retry waits 300 ms");
    // The second waited out the 1 s timeout, then 600 ms.
    assert!(third.at - second.at >= Duration::from_millis(1_500), "the timeout, then 600 ms");

    // A recall reaches alpha.
    messages(&app, &tokens["alpha"])
        .recall_message(v1::RecallMessageRequest { message_id: alpha_send })
        .await
        .expect("recall");
    let recalled = alpha.next(WAIT).await;
    alpha.verify(&recalled);
    assert_eq!(
        (recalled.event().as_str(), recalled.message_id()),
        ("message.recalled", alpha_send)
    );
    assert_eq!(recalled.json()["data"]["status"], "recalled");
    assert_ne!(recalled.id, first.id);

    // Nothing of beta's reached alpha, nothing was sent twice after a 2xx.
    alpha.assert_quiet(Duration::from_millis(1_000)).await;
    beta.assert_quiet(Duration::from_millis(100)).await;
    let worker = app.worker.as_ref().expect("a worker").metrics_addr;
    let page = notify_testkit::http_get(worker, "/metrics").await.1;
    // In-process workers of parallel tests share one recorder: at least.
    assert!(notify_testkit::metric_sum(&page, "notify_webhooks_failed_total") >= 2.0);
    assert!(notify_testkit::metric_sum(&page, "notify_webhooks_sent_total") >= 3.0);
    app.cleanup().await;
}

#[tokio::test]
async fn an_event_failing_every_attempt_is_dead_lettered_after_the_last() {
    let mut alpha = Receiver::start(&[], Answer::Status(503)).await;
    let (mut settings, tokens) = two_clients();
    settings.webhooks.retry_delays_ms = vec![50, 100];
    settings.auth.clients[0].webhooks = vec![alpha.endpoint(&["message.completed"])];
    let app = spawn_app_with(settings, true).await;
    let message_id = send(&app, &tokens["alpha"], vec![7]).await;
    for _ in 0..3 {
        let hook = alpha.next(WAIT).await;
        alpha.verify(&hook);
        assert_eq!(hook.message_id(), message_id);
    }
    // Three attempts (1 + two delays), then the dead-letter queue.
    let connection = queue::connect(&app.settings.rabbitmq, "webhooks-test").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let dead = WebhookTopology::new(&app.settings).dead_queue();
    let job = notify_testkit::eventually("the job dead-lettered", WAIT, || async {
        let got = channel
            .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get");
        got.map(|message| Job::decode(&message.delivery.data).expect("a job"))
    })
    .await;
    assert_eq!((job.attempt, job.client.as_str()), (3, "alpha"));
    alpha.assert_quiet(Duration::from_millis(500)).await;
    let worker = app.worker.as_ref().expect("a worker").metrics_addr;
    let page = notify_testkit::http_get(worker, "/metrics").await.1;
    assert!(notify_testkit::metric_sum(&page, "notify_webhooks_dead_lettered_total") >= 1.0);
    let _ = connection.close(200, "done".into()).await;
    app.cleanup().await;
}

#[tokio::test]
async fn reads_are_reported_in_batches_of_at_most_500_users() {
    let mut alpha = Receiver::start(&[], Answer::Ok).await;
    let (mut settings, tokens) = two_clients();
    settings.webhooks.read_flush_ms = 1_000;
    settings.auth.clients[0].webhooks = vec![alpha.endpoint(&["message.completed", "item.read"])];
    let app = spawn_app_with(settings, true).await;
    let users: Vec<u64> = (1..=1_200).collect();
    let message_id = send(&app, &tokens["alpha"], users.clone()).await;
    let completed = alpha.next(WAIT).await;
    assert_eq!(completed.event(), "message.completed");
    // beta's send is read too: its reads reach nobody (beta has no endpoint).
    let other = send(&app, &tokens["beta"], vec![1, 2]).await;

    let inbox = InboxServiceClient::new(authed(app.channel(), &tokens["alpha"]));
    let marking = users.iter().map(|user_id| {
        let mut inbox = inbox.clone();
        let message_ids = if *user_id <= 2 { vec![message_id, other] } else { vec![message_id] };
        async move {
            inbox
                .mark_read(v1::MarkReadRequest { user_id: *user_id, message_ids })
                .await
                .expect("mark read")
        }
    });
    let started = Instant::now();
    futures::stream::iter(marking).buffer_unordered(16).collect::<Vec<_>>().await;
    let marking_took = started.elapsed();

    let mut seen = BTreeSet::new();
    let mut calls = 0;
    while seen.len() < users.len() {
        let hook = alpha.next(WAIT).await;
        alpha.verify(&hook);
        assert_eq!((hook.event().as_str(), hook.message_id()), ("item.read", message_id));
        let batch = hook.json()["data"]["user_ids"].as_array().unwrap().clone();
        assert!(!batch.is_empty() && batch.len() <= 500, "{} users in one call", batch.len());
        seen.extend(batch.iter().map(|id| id.as_str().unwrap().parse::<u64>().unwrap()));
        calls += 1;
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), users, "every reader, exactly these");
    // The workers queue what waits every second, at most 500 readers a
    // call: per run, one call per shard holding reads of the send (its
    // ~300 readers on each of 4 shards), never one per user, however slow
    // this machine marks them.
    let shards = app.ctx.pools.iter().count() as u128;
    let runs = marking_took.as_millis() / 1_000 + 2;
    assert!(calls <= shards * runs, "{calls} calls for 1,200 reads in {marking_took:?}");
    assert!(calls <= 60, "{calls} calls for 1,200 reads");
    alpha.assert_quiet(Duration::from_millis(800)).await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_dead_endpoint_of_one_client_does_not_delay_another_clients_webhooks() {
    let mut alpha = Receiver::start(&[], Answer::Hang).await;
    let mut beta = Receiver::start(&[], Answer::Ok).await;
    let (mut settings, tokens) = two_clients();
    settings.webhooks.timeout_ms = 8_000;
    settings.webhooks.concurrency_per_client = 2;
    settings.auth.clients[0].webhooks = vec![alpha.endpoint(&["message.completed"])];
    settings.auth.clients[1].webhooks = vec![beta.endpoint(&["message.completed"])];
    let app = spawn_app_with(settings, true).await;
    // alpha's endpoint holds every slot alpha has, and more wait behind them.
    for user in 1..=4 {
        send(&app, &tokens["alpha"], vec![user]).await;
    }
    alpha.next(WAIT).await;
    alpha.next(WAIT).await;

    let started = Instant::now();
    let message_id = send(&app, &tokens["beta"], vec![9]).await;
    let hook = beta.next(WAIT).await;
    assert_eq!(hook.message_id(), message_id);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "beta's webhook took {took:?} behind alpha's");
    // alpha's calls still hang (its third waits for a slot).
    alpha.assert_quiet(Duration::from_millis(200)).await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_chunk_failed_for_good_is_reported_then_the_completion_counts_it() {
    let mut alpha = Receiver::start(&[], Answer::Ok).await;
    let (mut settings, tokens) = two_clients();
    settings.auth.clients[0].webhooks =
        vec![alpha.endpoint(&["message.failed", "message.completed"])];
    let mut app = spawn_app_with(settings, false).await;
    let message_id = send(&app, &tokens["alpha"], (1..=600).collect()).await;
    // As if workers had died on one chunk poison_attempts times already.
    let (shard, pool) = app.ctx.pools.iter().next().map(|(s, p)| (s, p.clone())).unwrap();
    let (chunk_id, recipients): (u64, u16) = sqlx::query_as(
        "SELECT chunk_id, recipients FROM message_chunks WHERE message_id = ? ORDER BY chunk_id LIMIT 1",
    )
    .bind(message_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE message_chunks SET attempts = ? WHERE message_id = ? AND chunk_id = ?")
        .bind(app.settings.worker.poison_attempts)
        .bind(message_id)
        .bind(chunk_id)
        .execute(&pool)
        .await
        .unwrap();
    let send = MessageId::from_raw(message_id);
    let outcomes = deliver::apply_group(&app.ctx, shard, send, &[chunk_id], true).await.unwrap();
    assert_eq!(outcomes, [TaskOutcome::Failed]);
    app.start_worker().await;

    // Order is not promised: take both, then look.
    let mut hooks = vec![alpha.next(WAIT).await, alpha.next(WAIT).await];
    hooks.sort_by_key(Hook::event);
    for hook in &hooks {
        alpha.verify(hook);
        assert_eq!(hook.message_id(), message_id);
    }
    let (completed, failed) = (&hooks[0], &hooks[1]);
    assert_eq!(completed.event(), "message.completed");
    assert_eq!(failed.event(), "message.failed");
    assert_eq!(failed.json()["data"]["chunk_id"], chunk_id.to_string());
    assert_eq!(failed.json()["data"]["progress"]["failed"], u64::from(recipients));
    assert_eq!(completed.json()["data"]["progress"]["failed"], u64::from(recipients));
    assert_eq!(completed.json()["data"]["progress"]["delivered"], 600 - u64::from(recipients));
    alpha.assert_quiet(Duration::from_millis(500)).await;
    app.cleanup().await;
}

/// Reads are recorded with the change that makes them: once an api has
/// answered, a crash of it loses none (by ids: in the call's transaction;
/// by a filter: when its backlog row is counted, by the api or else by the
/// workers), and while no worker runs they wait. The worker that starts
/// queues them, each reader once, and the feed is empty after.
#[tokio::test]
async fn reads_outlive_the_api_that_recorded_them_and_wait_for_a_worker() {
    let mut alpha = Receiver::start(&[], Answer::Ok).await;
    let (mut settings, tokens) = two_clients();
    settings.webhooks.read_flush_ms = 100;
    settings.auth.clients[0].webhooks = vec![alpha.endpoint(&["message.completed", "item.read"])];
    let mut app = spawn_app_with(settings, true).await;
    let message_id = send(&app, &tokens["alpha"], (1..=10).collect()).await;
    assert_eq!(alpha.next(WAIT).await.event(), "message.completed");
    app.stop_worker().await;

    let replica = app.spawn_api_replica().await;
    let mut inbox = InboxServiceClient::new(authed(replica.channel(), &tokens["alpha"]));
    for user_id in 1..=5 {
        let request = v1::MarkReadRequest { user_id, message_ids: vec![message_id] };
        assert_eq!(inbox.mark_read(request).await.unwrap().into_inner().marked, 1);
    }
    for user_id in 6..=10 {
        let all = v1::MarkAllReadRequest { user_id, ..Default::default() };
        assert_eq!(inbox.mark_all_read(all).await.unwrap().into_inner().marked, 1);
    }
    replica.kill().await;
    // The reads by ids were written by their calls, before they answered.
    assert!(feed_len(&app).await >= 5, "the reads by ids are in the feed");
    // The filtered ones follow once their rows are counted (by the api's
    // own count, or else by the settler of the worker started below).
    app.start_worker().await;
    let mut seen = BTreeSet::new();
    while seen.len() < 10 {
        let hook = alpha.next(WAIT).await;
        alpha.verify(&hook);
        assert_eq!((hook.event().as_str(), hook.message_id()), ("item.read", message_id));
        for user in hook.json()["data"]["user_ids"].as_array().unwrap() {
            assert!(seen.insert(user.as_str().unwrap().parse::<u64>().unwrap()), "{user} twice");
        }
    }
    assert_eq!(seen, (1..=10).collect::<BTreeSet<u64>>());
    notify_testkit::eventually("the feed drained", WAIT, || async {
        (feed_len(&app).await == 0).then_some(())
    })
    .await;
    alpha.assert_quiet(Duration::from_millis(500)).await;
    let worker = app.worker.as_ref().expect("a worker").metrics_addr;
    let page = notify_testkit::http_get(worker, "/metrics").await.1;
    assert!(notify_testkit::metric_sum(&page, "notify_webhooks_read_batches_total") >= 1.0);
    app.cleanup().await;
}

/// The feed's takes: two relays at once take different reads (a take skips
/// what another holds), a take given back (a relay that died before it
/// forgot what it queued) leaves its reads for the next, and a take forgets
/// exactly the reads it is told to.
#[tokio::test]
async fn the_read_feed_is_taken_by_one_relay_at_a_time() {
    let (settings, _) = two_clients();
    let app = spawn_app_with(settings, false).await;
    let pool = app.ctx.pools.iter().next().map(|(_, pool)| pool.clone()).unwrap();
    assert!(!read_feed::any_waiting(&pool).await.unwrap(), "an empty feed");
    sqlx::query(
        "INSERT INTO read_feed (message_id, user_id, read_at) VALUES \
         (7, 1, UTC_TIMESTAMP(3)), (7, 2, UTC_TIMESTAMP(3)), (7, 3, UTC_TIMESTAMP(3)), \
         (8, 1, UTC_TIMESTAMP(3)), (9, 4, UTC_TIMESTAMP(3))",
    )
    .execute(&pool)
    .await
    .unwrap();
    let pairs = |reads: &[read_feed::FeedRead]| {
        reads.iter().map(|r| (r.message_id, r.user_id)).collect::<Vec<_>>()
    };
    let first = read_feed::take(&pool, 3).await.unwrap();
    assert_eq!(pairs(&first.reads), [(7, 1), (7, 2), (7, 3)]);
    let second = read_feed::take(&pool, 10).await.unwrap();
    assert_eq!(pairs(&second.reads), [(8, 1), (9, 4)], "what the first holds is skipped");
    drop(second);
    let reads = first.reads.clone();
    first.forget(&[&reads[0], &reads[2]]).await.unwrap();
    let rest = read_feed::take(&pool, 10).await.unwrap();
    assert_eq!(pairs(&rest.reads), [(7, 2), (8, 1), (9, 4)], "given back and not forgotten");
    rest.forget(&[]).await.unwrap();
    assert_eq!(read_feed::count(&pool).await.unwrap(), 3);
    assert!(read_feed::any_waiting(&pool).await.unwrap());
    app.cleanup().await;
}

#[tokio::test]
async fn reads_by_a_filter_are_reported_like_reads_by_id() {
    let mut alpha = Receiver::start(&[], Answer::Ok).await;
    let (mut settings, tokens) = two_clients();
    settings.webhooks.read_flush_ms = 200;
    settings.auth.clients[0].webhooks = vec![alpha.endpoint(&["message.completed", "item.read"])];
    let app = spawn_app_with(settings, true).await;
    let message_id = send(&app, &tokens["alpha"], vec![11, 12, 13]).await;
    assert_eq!(alpha.next(WAIT).await.event(), "message.completed");

    let mut inbox = InboxServiceClient::new(authed(app.channel(), &tokens["alpha"]));
    let all = v1::MarkAllReadRequest { user_id: 11, ..Default::default() };
    assert_eq!(inbox.mark_all_read(all).await.unwrap().into_inner().marked, 1);
    let filtered = v1::UpdateItemsRequest {
        user_id: 12,
        action: v1::ItemAction::MarkRead as i32,
        all: Some(v1::ItemFilter::default()),
        ..Default::default()
    };
    assert_eq!(inbox.update_items(filtered).await.unwrap().into_inner().changed, 1);
    // Reading again changes nothing and reports nothing.
    let again = v1::MarkAllReadRequest { user_id: 11, ..Default::default() };
    assert_eq!(inbox.mark_all_read(again).await.unwrap().into_inner().marked, 0);

    let mut seen = BTreeSet::new();
    while seen.len() < 2 {
        let hook = alpha.next(WAIT).await;
        alpha.verify(&hook);
        assert_eq!((hook.event().as_str(), hook.message_id()), ("item.read", message_id));
        for user in hook.json()["data"]["user_ids"].as_array().unwrap() {
            assert!(seen.insert(user.as_str().unwrap().parse::<u64>().unwrap()), "{user} twice");
        }
    }
    assert_eq!(seen, BTreeSet::from([11, 12]), "the two readers, not user 13");
    alpha.assert_quiet(Duration::from_millis(600)).await;
    app.cleanup().await;
}

/// Reads waiting for `item.read` on every shard of `app`.
async fn feed_len(app: &TestApp) -> u64 {
    let mut waiting = 0;
    for (_, pool) in app.ctx.pools.iter() {
        waiting += read_feed::count(pool).await.expect("the feed reads");
    }
    waiting
}

/// Events waiting in the outbox on every shard of `app`.
async fn outbox_len(app: &TestApp) -> u64 {
    let mut waiting = 0;
    for (_, pool) in app.ctx.pools.iter() {
        waiting += webhook_outbox::count(pool).await.expect("the outbox reads");
    }
    waiting
}

/// An api whose RabbitMQ goes away after it started recalls a send: the
/// recall commits, its `message.recalled` cannot be published, and the
/// worker's relay queues the event recorded with the change once it falls
/// due. It arrives once, signed, and the outbox is empty after; the event
/// its own process queued (`message.completed`, by the worker) is not
/// relayed again.
#[tokio::test]
async fn an_event_its_process_could_not_queue_is_queued_by_the_workers_relay() {
    let mut alpha = Receiver::start(&[], Answer::Ok).await;
    let (mut settings, tokens) = two_clients();
    settings.webhooks.outbox_retry_ms = 300;
    settings.auth.clients[0].webhooks =
        vec![alpha.endpoint(&["message.completed", "message.recalled"])];
    let app = spawn_app_with(settings.clone(), true).await;
    let message_id = send(&app, &tokens["alpha"], vec![1, 2, 3]).await;
    let completed = alpha.next(WAIT).await;
    alpha.verify(&completed);
    assert_eq!(
        (completed.event().as_str(), completed.message_id()),
        ("message.completed", message_id)
    );
    notify_testkit::eventually("the queued event's record deleted", WAIT, || async {
        (outbox_len(&app).await == 0).then_some(())
    })
    .await;

    let broker = FaultProxy::start("rabbitmq-of-one-api", "127.0.0.1:5672").await;
    let mut cut_off = settings.clone();
    cut_off.rabbitmq.url = SecretString::from(format!("amqp://guest:guest@{}/%2f", broker.addr()));
    let replica = app.spawn_api_replica_with(cut_off).await;
    broker.down().await;
    let mut client = MessageServiceClient::new(authed(replica.channel(), &tokens["alpha"]));
    let request = v1::RecallMessageRequest { message_id };
    // Whatever it answers (its own publishes fail), the recall committed.
    let _ = tokio::time::timeout(WAIT, client.recall_message(request)).await.expect("an answer");
    let status: u8 = sqlx::query_scalar("SELECT status FROM messages WHERE message_id = ?")
        .bind(message_id)
        .fetch_one(app.ctx.pools.for_message(message_id).value())
        .await
        .unwrap();
    assert_eq!(status, notify_domain::domain::SendStatus::Recalled as u8);

    let recalled = alpha.next(WAIT).await;
    alpha.verify(&recalled);
    assert_eq!(
        (recalled.event().as_str(), recalled.message_id()),
        ("message.recalled", message_id)
    );
    assert_eq!(recalled.json()["data"]["status"], "recalled");
    assert_ne!(recalled.id, completed.id);
    alpha.assert_quiet(Duration::from_millis(1_000)).await;
    assert_eq!(outbox_len(&app).await, 0);
    let worker = app.worker.as_ref().expect("a worker").metrics_addr;
    let page = notify_testkit::http_get(worker, "/metrics").await.1;
    assert!(notify_testkit::metric_sum(&page, "notify_webhooks_relayed_total") >= 1.0);
    replica.stop().await;
    app.cleanup().await;
}

/// The outbox's lease: an event a relay took is not taken again until the
/// lease ran out, then it is (counting the attempts); an event recorded
/// with a change that did not happen is not recorded at all.
#[tokio::test]
async fn a_relay_takes_an_event_once_per_lease() {
    let (settings, _) = two_clients();
    let app = spawn_app_with(settings, false).await;
    let pool = app.ctx.pools.iter().next().map(|(_, pool)| pool.clone()).unwrap();
    let event = OutboxEvent::new(7, "message.completed", None);
    let record = Record { event: &event, due_in_ms: 0 };
    // No such send: the change touches nothing, and nothing is recorded.
    let id = MessageId::from_raw(7);
    assert!(!messages::complete(&pool, id, 0, Some(record)).await.unwrap());
    assert_eq!(webhook_outbox::count(&pool).await.unwrap(), 0);

    let mut conn = pool.acquire().await.unwrap();
    record.write(&mut conn).await.unwrap();
    drop(conn);
    let lease = 400;
    let taken = webhook_outbox::claim_due(&pool, lease, 10).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].event_key.clone(), taken[0].attempts), (event.event_key.clone(), 0));
    assert!(webhook_outbox::claim_due(&pool, lease, 10).await.unwrap().is_empty(), "leased");
    let again = notify_testkit::eventually("the lease runs out", WAIT, || async {
        let taken = webhook_outbox::claim_due(&pool, lease, 10).await.unwrap();
        (!taken.is_empty()).then_some(taken)
    })
    .await;
    assert_eq!((again.len(), again[0].attempts), (1, 1));
    assert_eq!(again[0].created_at, event.created_at);
    webhook_outbox::remove(&pool, &event.event_key).await.unwrap();
    assert_eq!(webhook_outbox::count(&pool).await.unwrap(), 0);
    app.cleanup().await;
}
