//! Test harness: starts `notify-api` and `notify-worker` in-process on port 0
//! against the real local MariaDB, RabbitMQ and Redis, with fresh shard
//! databases, queue names and Redis key prefix per test, and removes them
//! afterwards. [`pki`] makes test certificates; [`servers`] starts private
//! Redis, MariaDB and RabbitMQ instances for tests that need their own.

pub mod browser;
pub mod child;
mod config_file;
pub mod console;
pub mod faults;
pub mod metrics;
pub mod otlp;
pub mod pki;
mod schema;
pub mod servers;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify_api::Application;
use notify_core::queue::{self, Topology};
use notify_core::{Context, telemetry};
use notify_domain::Settings;
use notify_domain::settings::ClientSettings;
use notify_proto::v1;
use notify_proto::v1::group_service_client::GroupServiceClient;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_worker::Worker;
use redis::AsyncCommands;
use shard_router::ShardId;
use sqlx::Connection;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub use metrics::metric_sum;

/// Settings for one test: unique names for everything, fast background loops.
pub fn test_settings() -> Settings {
    let mut settings = Settings::defaults().expect("built-in defaults load");
    let tag: String = format!("t{:08x}", rand::random::<u32>());
    for shard in &mut settings.database.shards {
        shard.database = format!("notify_{tag}_{}", shard.id);
    }
    settings.database.pool_max = 6;
    settings.api.listen = "127.0.0.1:0".into();
    settings.api.metrics_listen = "127.0.0.1:0".into();
    settings.console.listen = "127.0.0.1:0".into();
    settings.api.shutdown_grace_secs = 2;
    settings.worker.metrics_listen = "127.0.0.1:0".into();
    settings.worker.scheduler_interval_ms = 100;
    settings.worker.sweep_interval_secs = 1;
    settings.worker.sweep_timeout_secs = 3;
    settings.worker.retry_base_ms = 20;
    // Retention's DDL runs where a test asks for it (retention tests).
    settings.retention.interval_secs = 0;
    settings.rabbitmq.prefix = format!("notify_{tag}");
    settings.redis.key_prefix = format!("notify_{tag}:");
    // `scripts/test` runs the cache tests a second time on a Redis Cluster,
    // and the delivery tests on classic queues.
    if let Ok(seeds) = std::env::var("NOTIFY_TEST_REDIS_CLUSTER") {
        settings.redis.url = seeds.into();
        settings.redis.cluster = true;
    }
    if let Ok(queue_type) = std::env::var("NOTIFY_TEST_QUEUE_TYPE") {
        settings.rabbitmq.queue_type = queue_type;
    }
    settings.log.filter = std::env::var("TEST_LOG").unwrap_or_else(|_| "warn".into());
    settings
}

/// A worker running in this process.
pub struct WorkerHandle {
    /// Its `/metrics`, `/healthz` and `/readyz` address.
    pub metrics_addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl WorkerHandle {
    /// Stops the worker gracefully and waits for it (at most
    /// [`STOP_LIMIT`]: its in-flight chunks finish within their operation
    /// timeout).
    pub async fn stop(self) {
        self.shutdown.cancel();
        within(STOP_LIMIT, "the worker to stop", self.task)
            .await
            .expect("worker task joins")
            .expect("worker stops cleanly");
    }
}

/// A running api (and usually a worker) with its own databases and names.
pub struct TestApp {
    /// The settings the processes run with.
    pub settings: Settings,
    /// gRPC address of the api.
    pub addr: SocketAddr,
    /// Metrics address of the api.
    pub metrics_addr: SocketAddr,
    /// The web console's address, when it is on.
    pub console_addr: Option<SocketAddr>,
    /// The api's shared context, for inspecting state directly.
    pub ctx: Context,
    /// The api's TLS configuration, when TLS is on.
    pub tls: Option<std::sync::Arc<notify_api::tls::ServerTls>>,
    /// The in-process worker, if running.
    pub worker: Option<WorkerHandle>,
    api_shutdown: CancellationToken,
    api_task: JoinHandle<anyhow::Result<()>>,
    channel: Channel,
    /// Files of the test (config files for child processes), removed with it.
    files: tempfile::TempDir,
    /// Disarms the test's [`watchdog`] when the app goes.
    _watchdog: std::sync::mpsc::Sender<()>,
}

/// A second api process (in-process) over the same databases, queues and
/// keys as a [`TestApp`]: another replica behind the same Service.
pub struct ApiReplica {
    /// Its web console's address, when the console is on.
    pub console_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
    channel: Channel,
}

impl ApiReplica {
    /// The gRPC channel to this replica.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Stops the replica and waits for it (at most [`STOP_LIMIT`]).
    pub async fn stop(self) {
        self.shutdown.cancel();
        within(STOP_LIMIT, "the api replica to stop", self.task)
            .await
            .expect("replica task joins")
            .expect("replica stops cleanly");
    }

    /// Aborts the replica, like a crash: no graceful drain, nothing it
    /// would do on the way out is done (tasks it spawned on the test's
    /// runtime are not stopped).
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// A channel to the api; lazy when it speaks TLS (the test then builds its
/// own channels with its CA and certificates).
async fn connect(addr: SocketAddr, tls: bool) -> Channel {
    let endpoint = Channel::from_shared(format!("http://{addr}"))
        .expect("valid uri")
        .connect_timeout(Duration::from_secs(5))
        .timeout(CALL_LIMIT);
    if tls {
        return endpoint.connect_lazy();
    }
    endpoint.connect().await.expect("api accepts connections")
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(MetadataValue<Ascii>);

impl Bearer {
    /// A bearer token interceptor.
    pub fn new(token: &str) -> Self {
        Self(format!("Bearer {token}").parse().expect("token is ascii"))
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request.metadata_mut().insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// A channel that sends `token` with every call.
pub type AuthedChannel = InterceptedService<Channel, Bearer>;

/// Wraps `channel` so every call carries `token`.
pub fn authed(channel: Channel, token: &str) -> AuthedChannel {
    InterceptedService::new(channel, Bearer::new(token))
}

/// Turns authentication on in `settings` with one client per entry
/// (`name`, scopes, settings tweak); returns each client's token by name.
pub fn with_clients(
    settings: &mut Settings,
    clients: &[(&str, &[&str])],
) -> std::collections::HashMap<String, String> {
    settings.auth.enabled = true;
    let mut tokens = std::collections::HashMap::new();
    for (name, scopes) in clients {
        let token = notify_domain::auth::new_token();
        settings.auth.clients.push(ClientSettings {
            name: (*name).to_owned(),
            token_sha256: vec![notify_domain::auth::token_sha256_hex(&token)],
            cert_names: Vec::new(),
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            senders: Vec::new(),
            requests_per_second: 0,
            burst: 0,
            recipients_per_minute: 0,
            announcements_per_hour: 0,
            webhooks: Vec::new(),
        });
        tokens.insert((*name).to_owned(), token);
    }
    tokens
}

/// Creates fresh, migrated shard databases and starts api and worker.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(test_settings(), true).await
}

/// Creates the settings' databases, migrated (from a template: see
/// [`schema`]), and starts the api, plus a worker if asked.
pub async fn spawn_app_with(settings: Settings, with_worker: bool) -> TestApp {
    // Logs only: a test that checks traces runs the services as processes.
    let _ = telemetry::init_tracing(&settings.log, &settings.trace, "notify-test");
    static REAPED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    REAPED.get_or_init(|| reap_stale_leftovers(&settings)).await;
    schema::create_shards(&settings).await;
    let app = Application::build(settings.clone()).await.expect("api builds");
    let addr = app.local_addr().expect("api bound");
    let metrics_addr = app.metrics_addr().expect("metrics bound");
    let console_addr = app.console_addr();
    let ctx = app.context().clone();
    let tls = app.tls();
    let api_shutdown = CancellationToken::new();
    let api_task = tokio::spawn(app.run_until_stopped(api_shutdown.clone()));
    let channel = connect(addr, tls.is_some()).await;
    let mut app = TestApp {
        settings,
        addr,
        metrics_addr,
        console_addr,
        ctx,
        tls,
        worker: None,
        api_shutdown,
        api_task,
        channel,
        files: tempfile::Builder::new().prefix("notify-test-").tempdir().expect("test directory"),
        _watchdog: watchdog(),
    };
    if with_worker {
        app.start_worker().await;
    }
    app
}

impl TestApp {
    /// A client of `MessageService`.
    pub fn messages(&self) -> MessageServiceClient<Channel> {
        MessageServiceClient::new(self.channel.clone())
    }

    /// A client of `InboxService`.
    pub fn inbox(&self) -> InboxServiceClient<Channel> {
        InboxServiceClient::new(self.channel.clone())
    }

    /// Starts another api replica sharing this app's databases and names.
    pub async fn spawn_api_replica(&self) -> ApiReplica {
        self.spawn_api_replica_with(self.settings.clone()).await
    }

    /// Starts another api on the same databases, queues and Redis with
    /// settings of its own: the app's, say, with a client's scopes changed
    /// (a new release of the configuration).
    pub async fn spawn_api_replica_with(&self, settings: Settings) -> ApiReplica {
        let app = Application::build(settings).await.expect("replica builds");
        let addr = app.local_addr().expect("replica bound");
        let tls = app.tls().is_some();
        let console_addr = app.console_addr();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(app.run_until_stopped(shutdown.clone()));
        ApiReplica { console_addr, shutdown, task, channel: connect(addr, tls).await }
    }

    /// A client of `GroupService`.
    pub fn groups(&self) -> GroupServiceClient<Channel> {
        GroupServiceClient::new(self.channel.clone())
    }

    /// The gRPC channel to the api.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Starts an in-process worker (if none runs).
    pub async fn start_worker(&mut self) {
        self.start_worker_with(self.settings.clone()).await;
    }

    /// Starts an in-process worker with settings of its own (if none runs):
    /// the app's, say, routed through fault proxies that slow it down.
    pub async fn start_worker_with(&mut self, settings: Settings) {
        if self.worker.is_some() {
            return;
        }
        let worker = Worker::build(settings).await.expect("worker builds");
        let metrics_addr = worker.metrics_addr().expect("worker metrics bound");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(worker.run_until_stopped(shutdown.clone()));
        self.worker = Some(WorkerHandle { metrics_addr, shutdown, task });
    }

    /// Stops the in-process worker gracefully.
    pub async fn stop_worker(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.stop().await;
        }
    }

    /// Aborts the in-process worker mid-work, like a crash: in-flight
    /// transactions roll back and unacked tasks return to the queue.
    pub async fn kill_worker(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.task.abort();
            let _ = worker.task.await;
        }
    }

    /// Deletes every Redis key of this test, like a FLUSHALL seen by this
    /// test alone (other tests share the server).
    pub async fn flush_cache(&self) {
        let mut conn = self.ctx.cache.connection();
        let pattern = format!("{}*", self.settings.redis.key_prefix);
        let keys: Vec<String> = conn.keys(pattern).await.expect("list keys");
        if !keys.is_empty() {
            conn.del::<_, ()>(keys).await.expect("delete keys");
        }
    }

    /// Writes the settings as a config file for a service started as a
    /// child process (`NOTIFY_CONFIG=<path>`), in the test's directory.
    pub fn write_config_file(&self) -> PathBuf {
        let path = self.files.path().join("notify.toml");
        std::fs::write(&path, config_file::to_toml(&self.settings)).expect("config file written");
        path
    }

    /// Sends a default message from sender "tests" to `user_ids`; returns its id.
    pub async fn send(&self, user_ids: Vec<u64>) -> u64 {
        self.messages()
            .send_message(send_request(user_ids))
            .await
            .expect("send accepted")
            .into_inner()
            .message_id
    }

    /// Reads a send's current state.
    pub async fn get_message(&self, message_id: u64) -> v1::Message {
        self.messages()
            .get_message(v1::GetMessageRequest { message_id })
            .await
            .expect("get message")
            .into_inner()
    }

    /// Follows WatchMessage (an event stream, no polling here) until the send
    /// reaches `status`; returns that state. Panics after 90 s.
    pub async fn wait_for_status(&self, message_id: u64, status: v1::MessageStatus) -> v1::Message {
        let what = format!("{status:?}");
        self.watch_until(message_id, &what, |message| message.status == status as i32).await
    }

    /// Follows WatchMessage until no control operation (cancel, recall,
    /// edit) of the send is left on any shard; returns that state. Panics
    /// after 90 s.
    pub async fn wait_for_operations(&self, message_id: u64) -> v1::Message {
        let done = |message: &v1::Message| message.pending_operations.is_empty();
        self.watch_until(message_id, "its control operations done", done).await
    }

    /// Follows WatchMessage until `done` holds for the send (`what` names
    /// that state in the panic after 90 s).
    async fn watch_until(
        &self,
        message_id: u64,
        what: &str,
        done: impl Fn(&v1::Message) -> bool,
    ) -> v1::Message {
        let request = v1::WatchMessageRequest { message_id, interval_ms: 100 };
        let mut stream =
            self.messages().watch_message(request).await.expect("watch opens").into_inner();
        let watch = async {
            while let Some(message) = stream.next().await {
                let message = message.expect("watch item");
                if done(&message) {
                    return message;
                }
            }
            panic!("watch ended before message {message_id} was {what}");
        };
        tokio::time::timeout(Duration::from_secs(90), watch)
            .await
            .unwrap_or_else(|_| panic!("message {message_id} was not {what} in 90 s"))
    }

    /// Counts rows of `message_items` over every shard (test assertions only).
    pub async fn count_items(&self, message_id: u64) -> u64 {
        self.count_rows("SELECT COUNT(*) FROM message_items WHERE message_id = ?", message_id).await
    }

    /// Counts a send's items a recall took back (marked recalled, hidden
    /// until retention purges them) over every shard (test assertions only).
    pub async fn count_recalled_items(&self, message_id: u64) -> u64 {
        self.count_rows(
            "SELECT COUNT(*) FROM message_items WHERE message_id = ? AND recalled = 1",
            message_id,
        )
        .await
    }

    /// Counts a send's recorded reads over every shard (test assertions only).
    pub async fn count_reads(&self, message_id: u64) -> u64 {
        self.count_rows("SELECT COUNT(*) FROM message_reads WHERE message_id = ?", message_id).await
    }

    /// Waits until every read a filtered update left waiting is counted
    /// (`read_backlog` empty on every shard): the sends' read counts and
    /// readers then agree with the items.
    pub async fn reads_counted(&self) {
        eventually("every waiting read counted", Duration::from_secs(30), || async {
            for (_, pool) in self.ctx.pools.iter() {
                if notify_store::db::read_backlog::count(pool).await.ok()? > 0 {
                    return None;
                }
            }
            Some(())
        })
        .await
    }

    /// Counts a send's chunk rows over every shard (test assertions only).
    pub async fn count_chunks(&self, message_id: u64) -> u64 {
        self.count_rows("SELECT COUNT(*) FROM message_chunks WHERE message_id = ?", message_id)
            .await
    }

    /// Adds up `count` (a `COUNT(*)` taking the message id) over every shard.
    async fn count_rows(&self, count: &'static str, message_id: u64) -> u64 {
        let mut total = 0;
        for (_, pool) in self.ctx.pools.iter() {
            let n: i64 = sqlx::query_scalar(count)
                .bind(message_id)
                .fetch_one(pool)
                .await
                .unwrap_or_else(|e| panic!("{count}: {e}"));
            total += n as u64;
        }
        total
    }

    /// The users with an item of a message over every shard, sorted (a user
    /// twice had two items). Panics when an item's `bucket` is not its
    /// user's (`bucket_of`), which bucket moves read items by.
    pub async fn item_users(&self, message_id: u64) -> Vec<u64> {
        let mut users = Vec::new();
        for (_, pool) in self.ctx.pools.iter() {
            let rows: Vec<(u64, u16)> =
                sqlx::query_as("SELECT user_id, bucket FROM message_items WHERE message_id = ?")
                    .bind(message_id)
                    .fetch_all(pool)
                    .await
                    .expect("list items");
            for (user, bucket) in rows {
                let right = shard_router::bucket_of(user);
                assert_eq!(u32::from(bucket), right, "user {user}'s item of {message_id}");
                users.push(user);
            }
        }
        users.sort_unstable();
        users
    }

    /// Every user with an item of a message and the shards holding it (one,
    /// when delivery was exactly once), over every shard.
    pub async fn item_shards(&self, message_id: u64) -> BTreeMap<u64, Vec<ShardId>> {
        let mut places: BTreeMap<u64, Vec<ShardId>> = BTreeMap::new();
        for (shard, pool) in self.ctx.pools.iter() {
            let users: Vec<u64> =
                sqlx::query_scalar("SELECT user_id FROM message_items WHERE message_id = ?")
                    .bind(message_id)
                    .fetch_all(pool)
                    .await
                    .expect("list items");
            for user in users {
                places.entry(user).or_default().push(shard);
            }
        }
        places
    }

    /// Unread, unexpired items of a user, counted in MySQL (the truth), by
    /// a query of the kit's own, not the badge's: every item in the inbox
    /// joined to its content copy, which is not revoked.
    pub async fn unread_truth(&self, user_id: u64) -> u64 {
        let pool = self.ctx.pools.for_user(user_id).value();
        let unread: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM message_items i \
             JOIN message_contents c ON c.message_id = i.message_id \
             WHERE i.user_id = ? AND i.is_read = 0 AND i.is_archived = 0 \
             AND i.is_deleted = 0 AND c.revoked = 0 \
             AND (i.expire_at IS NULL OR i.expire_at > UTC_TIMESTAMP(3))",
        )
        .bind(user_id)
        .fetch_one(pool)
        .await
        .expect("count unread");
        unread as u64
    }

    /// Stops everything and removes the test's databases, queues and keys.
    /// Each step is bounded: one that hangs fails the test, naming itself,
    /// instead of holding the whole suite.
    pub async fn cleanup(mut self) {
        self.stop_worker().await;
        self.api_shutdown.cancel();
        let _ = within(STOP_LIMIT, "the api to stop", &mut self.api_task).await;
        for (shard, pool) in self.ctx.pools.iter() {
            // Waits for every connection to be given back.
            within(STOP_LIMIT, &format!("shard {shard}'s pool to close"), pool.close()).await;
        }
        within(
            STOP_LIMIT,
            "the test databases to be dropped",
            notify_store::db::drop_all(&self.settings),
        )
        .await
        .expect("drop test databases");
        let queues = delete_queues(&self.settings, "notify-test-cleanup");
        let _ = within(STOP_LIMIT, "the test queues to be deleted", queues).await;
        within(STOP_LIMIT, "the test keys to be deleted", delete_keys(&self.settings)).await;
    }
}

/// Removes what tests that panicked (and so never ran their async cleanup)
/// left behind more than an hour ago: databases, queues and Redis keys of
/// their tags. Recent leftovers may belong to a test running right now.
async fn reap_stale_leftovers(settings: &Settings) {
    let Some(shard) = settings.database.shards.first() else {
        return;
    };
    let url = settings.shard_server_url(shard);
    let Ok(mut conn) = sqlx::mysql::MySqlConnection::connect(&url).await else {
        return;
    };
    let stale: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT TABLE_SCHEMA FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA LIKE 'notify\\_t%' AND CREATE_TIME < NOW() - INTERVAL 1 HOUR",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap_or_default();
    let mut tags: Vec<String> = stale
        .iter()
        .filter_map(|db| db.strip_prefix("notify_").and_then(|rest| rest.rsplit_once('_')))
        .map(|(tag, _)| tag.to_owned())
        .collect();
    tags.sort();
    tags.dedup();
    for tag in tags {
        for db in stale.iter().filter(|db| db.starts_with(&format!("notify_{tag}_"))) {
            let drop = format!("DROP DATABASE IF EXISTS `{db}`");
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(drop)).execute(&mut conn).await;
        }
        let mut leftover = settings.clone();
        leftover.rabbitmq.prefix = format!("notify_{tag}");
        leftover.redis.key_prefix = format!("notify_{tag}:");
        let _ = within(
            STOP_LIMIT,
            "leftover queues to be deleted",
            delete_queues(&leftover, "notify-test-reaper"),
        )
        .await;
        delete_keys(&leftover).await;
    }
}

/// Deletes the queues and exchanges of `settings`' prefix; every broker
/// step bounded by the broker timeout.
async fn delete_queues(settings: &Settings, name: &str) -> notify_domain::Result<()> {
    let connection = queue::connect(&settings.rabbitmq, name).await?;
    let channel = queue::bounded("opening a channel", connection.create_channel()).await?;
    let deleted = Topology::new(settings).delete(&channel).await;
    queue::close_channel(&channel, "done").await;
    queue::close_connection(&connection, "done").await;
    deleted
}

async fn delete_keys(settings: &Settings) {
    // KEYS asks every master of a cluster; DEL goes to each key's slot.
    if let Ok(mut conn) = notify_cache::Connection::open(&settings.redis).await {
        let pattern = format!("{}*", settings.redis.key_prefix);
        let keys: Vec<String> = conn.keys(pattern).await.unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = conn.del(keys).await;
        }
    }
}

/// The binary a test starts: `built`, the path cargo gives as
/// `CARGO_BIN_EXE_<name>`, or its copy in `NOTIFY_TEST_BIN_DIR` when that is
/// set. `scripts/test` copies the test build's binaries there, so the
/// release build it runs beside the tests may replace those of
/// `target/release` while no test ever starts one half-replaced, or one
/// built otherwise.
pub fn bin(built: &str) -> PathBuf {
    let built = Path::new(built);
    match (std::env::var_os("NOTIFY_TEST_BIN_DIR"), built.file_name()) {
        (Some(dir), Some(name)) => Path::new(&dir).join(name),
        _ => built.to_path_buf(),
    }
}

/// A valid content.
pub fn content(title: &str) -> v1::Content {
    v1::Content {
        title: title.to_owned(),
        body: format!("body of {title}"),
        category: "system".to_owned(),
        data: [("link".to_owned(), "app://inbox".to_owned())].into_iter().collect(),
        ..Default::default()
    }
}

/// A valid SendMessage request from sender "tests" to `user_ids`.
pub fn send_request(user_ids: Vec<u64>) -> v1::SendMessageRequest {
    v1::SendMessageRequest {
        sender: "tests".to_owned(),
        idempotency_key: String::new(),
        content: Some(content("hello")),
        audience: Some(v1::send_message_request::Audience::Users(v1::UserAudience {
            user_ids,
            ..Default::default()
        })),
        send_at: None,
        expire_at: None,
        priority: 0,
        critical: false,
    }
}

/// GETs `path` from an HTTP/1.1 endpoint (metrics, probes); returns the
/// status code and the body. Panics when the endpoint does not answer.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    try_http_get(addr, path).await.unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e:#}"))
}

/// GETs `path` from an HTTP/1.1 endpoint with hyper's client; returns the
/// status code and the body.
pub async fn try_http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use http_body_util::BodyExt as _;
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(connection);
    let request = http::Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Longest a test's call to the api may take: past it the call fails with
/// `Cancelled` (tonic's own timeout), so a call that hangs fails its test
/// instead of holding the suite.
pub const CALL_LIMIT: Duration = Duration::from_secs(120);

/// Longest a test waits for a service it started to stop, or for a step of
/// its cleanup.
pub const STOP_LIMIT: Duration = Duration::from_secs(120);

/// Longest a test may run once it has started its app.
pub const TEST_LIMIT: Duration = Duration::from_secs(600);

/// Arms a watchdog for the test running on this thread (libtest names it
/// after the test): unless the returned sender is dropped within
/// [`TEST_LIMIT`], it prints the test's name and aborts the test binary. The
/// bounds on calls, stops and cleanup fail a test that hangs in them; this
/// ends the suite, naming the test, when one hangs anywhere else.
fn watchdog() -> std::sync::mpsc::Sender<()> {
    use std::io::Write as _;
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let (disarm, disarmed) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name(format!("watchdog of {test}"))
        .spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                disarmed.recv_timeout(TEST_LIMIT)
            {
                // Straight to the process's stderr: libtest captures the
                // test's own output (and its threads'), and never prints it
                // when the process aborts.
                let _ = writeln!(
                    std::io::stderr(),
                    "{test} has run for {} s since it started its app: aborting the test binary",
                    TEST_LIMIT.as_secs()
                );
                std::process::abort();
            }
        })
        .expect("watchdog thread starts");
    disarm
}

/// Awaits `future`, panicking when it takes longer than `limit`: a step that
/// hangs fails its test, naming what it waited for, instead of holding the
/// suite until CI's own limit.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(done) => done,
        Err(_) => panic!("waited {} s for {what}", limit.as_secs()),
    }
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after `within`.
/// For waiting on state that has no event to await (rows in another process).
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// True when a call failed before any byte of it left the client: hyper
/// cancels a request queued on a connection that closed under it (a server's
/// GOAWAY at `api.max_connection_age_secs` racing a new call). The server never
/// saw such a call, so it is safe to send again; grpc-go, grpc-java and gRPC
/// C++ do exactly that ("transparent retry", gRFC A6), tonic's `Channel` does not.
pub fn never_sent(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_canceled) {
            return true;
        }
        source = error.source();
    }
    false
}
