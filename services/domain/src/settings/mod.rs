//! Typed, layered configuration: built-in defaults, an optional file, then
//! `NOTIFY_SECTION__KEY` environment variables; validated once at start.
//! The settings of callers and TLS live in [`security`].

mod edge;
mod security;
mod webhooks;

pub use edge::{EDGE_ALGORITHMS, EdgeKeySettings, EdgeSettings, EdgeTokenSettings};
pub use security::{
    ApiTlsSettings, AuthSettings, ClientAuth, ClientSettings, MySqlTlsMode, ReflectionMode,
    valid_client_name,
};
pub use webhooks::{WebhookEndpoint, WebhookEvent, WebhookSettings, decode_secret};

use std::net::SocketAddr;

use config::{Config, Environment, File, FileFormat};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use shard_router::{BucketRange, ShardId, ShardMap};

/// The built-in defaults, documented setting by setting.
pub const DEFAULT_CONFIG: &str = include_str!("../../default.toml");

/// Every setting of a Notify process.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// The gRPC front service.
    pub api: ApiSettings,
    /// The delivery worker.
    pub worker: WorkerSettings,
    /// Who may call the api, and with which scopes and limits.
    pub auth: AuthSettings,
    /// The MySQL shards.
    pub database: DatabaseSettings,
    /// The RabbitMQ broker.
    pub rabbitmq: RabbitSettings,
    /// The Redis cache.
    pub redis: RedisSettings,
    /// Send limits and tuning.
    pub send: SendSettings,
    /// Control operations (cancel, recall, edit).
    pub control: ControlSettings,
    /// Inbox and badge tuning.
    pub inbox: InboxSettings,
    /// Group limits and caching.
    pub groups: GroupSettings,
    /// Backend checks and liveness.
    pub health: HealthSettings,
    /// The gateway event stream.
    pub events: EventSettings,
    /// The operators' web console, served by `notify-api`.
    pub console: ConsoleSettings,
    /// The end users' door: REST and an event stream (`notify-edge`).
    pub edge: EdgeSettings,
    /// Logging.
    pub log: LogSettings,
    /// OpenTelemetry traces.
    pub trace: TraceSettings,
    /// How long items, sends and audit rows are kept.
    pub retention: RetentionSettings,
    /// The webhook dispatcher (each client's endpoints are under `auth`).
    pub webhooks: WebhookSettings,
}

/// Settings of `notify-api`.
#[derive(Debug, Clone, Deserialize)]
pub struct ApiSettings {
    /// gRPC listen address.
    pub listen: String,
    /// Prometheus listen address.
    pub metrics_listen: String,
    /// Longest drain of in-flight calls at shutdown.
    pub shutdown_grace_secs: u64,
    /// Threads serving calls: 1 runs the api on one thread (the cheapest per
    /// call; scale out with replicas), N > 1 on a work-stealing pool of N
    /// threads, 0 on one thread per core.
    pub worker_threads: usize,
    /// Age after which a client connection is asked to reconnect; 0: never.
    pub max_connection_age_secs: u64,
    /// How long an aged connection may finish its calls.
    pub max_connection_age_grace_secs: u64,
    /// Who may use gRPC reflection.
    pub reflection: ReflectionMode,
    /// Largest request message, in bytes.
    pub max_request_bytes: usize,
    /// Longest a unary call may run (a shorter caller deadline wins).
    pub max_deadline_secs: u64,
    /// HTTP/2 streams one connection may have open.
    pub max_concurrent_streams: u32,
    /// Interval of HTTP/2 keepalive pings.
    pub keepalive_interval_secs: u64,
    /// How long a keepalive ping may go unanswered.
    pub keepalive_timeout_secs: u64,
    /// WatchMessage streams one client may hold on one replica.
    pub max_watch_streams_per_client: usize,
    /// Calls carrying recipient lists (SendMessage, AppendRecipients) one
    /// replica decodes and stores at once; more wait, undecoded.
    pub max_recipient_calls: usize,
    /// TLS on the gRPC listener.
    pub tls: ApiTlsSettings,
}

/// Settings of `notify-worker`.
#[derive(Debug, Clone, Deserialize)]
pub struct WorkerSettings {
    /// Prometheus listen address.
    pub metrics_listen: String,
    /// Transactions applying chunks at once, per lane and shard.
    pub concurrency: usize,
    /// Most chunks of one send applied in one transaction (1: each alone).
    pub chunks_per_transaction: usize,
    /// In-process attempts on transient errors before the task is requeued.
    pub max_attempts: u32,
    /// First retry delay; doubled on each attempt.
    pub retry_base_ms: u64,
    /// Attempts at a chunk that never commit before it is recorded as failed.
    pub poison_attempts: u32,
    /// Longest one attempt at a chunk, or a sweep of one shard, may take.
    pub operation_timeout_secs: u64,
    /// Scheduler poll interval.
    pub scheduler_interval_ms: u64,
    /// Sweeper poll interval.
    pub sweep_interval_secs: u64,
    /// Age after which a pending chunk of a sending message is re-published.
    pub sweep_timeout_secs: u64,
}

/// One physical shard.
#[derive(Debug, Clone, Deserialize)]
pub struct ShardSettings {
    /// Shard id used by bucket ranges.
    pub id: ShardId,
    /// Database (schema) name on the server.
    pub database: String,
    /// Server url; defaults to `database.url`.
    pub url: Option<SecretString>,
    /// A file holding the server url; wins over `url`.
    #[serde(default)]
    pub url_file: Option<String>,
}

/// The MySQL shards.
#[derive(Debug, Clone, Deserialize)]
pub struct DatabaseSettings {
    /// Default server url (without a database name).
    pub url: SecretString,
    /// A file holding the default url; wins over `url` when set.
    pub url_file: String,
    /// TLS to every shard.
    pub tls_mode: MySqlTlsMode,
    /// PEM CA of the servers' certificates; empty: the system roots.
    pub tls_ca_file: String,
    /// Connections per shard pool.
    pub pool_max: u32,
    /// Connections per shard kept apart from the pool for inbox pages
    /// (given back without sqlx's ping); 0: inbox pages use the pool.
    pub read_connections: usize,
    /// How long after its last call an idle read connection is kept open
    /// by background pings, so that a write on it needs none first (0:
    /// never pinged in the background).
    pub read_keep_warm_secs: u64,
    /// Connect timeout.
    pub connect_timeout_secs: u64,
    /// Server-side end of sessions idle inside a transaction (0: unset).
    pub idle_transaction_timeout_secs: u64,
    /// The physical shards.
    pub shards: Vec<ShardSettings>,
    /// Bucket ranges; empty means an even split. The initial value of the
    /// stored, versioned map (`notify_store::shard_map`).
    pub bucket_ranges: Vec<BucketRange>,
    /// How often a replica looks for a new version of the shard map.
    pub shard_map_refresh_ms: u64,
    /// How long a write waits out a bucket move's write freeze before it
    /// fails UNAVAILABLE (to be retried).
    pub freeze_wait_ms: u64,
    /// How long a bucket move waits for every live replica to take a new
    /// version of the map before it gives up (ending its freeze).
    pub shard_move_wait_secs: u64,
    /// How long after its last report to the directory shard a replica may
    /// still write; a bucket move counts a replica silent for twice this
    /// long as gone.
    pub replica_lease_secs: u64,
}

/// The RabbitMQ broker.
#[derive(Debug, Clone, Deserialize)]
pub struct RabbitSettings {
    /// AMQP url (`amqps://` for TLS).
    pub url: SecretString,
    /// A file holding the url; wins over `url` when set.
    pub url_file: String,
    /// PEM CA of the broker's certificate; empty: the system roots.
    pub tls_ca_file: String,
    /// Prefix of exchange and queue names.
    pub prefix: String,
    /// `quorum` or `classic`.
    pub queue_type: String,
    /// Most chunk tasks a publisher has awaiting the broker's confirm at a
    /// time; pending chunk ids are read four times as many per query when a
    /// send starts or is cancelled. What either holds does not grow with
    /// the send's size.
    pub publish_window: usize,
}

/// The Redis cache.
#[derive(Debug, Clone, Deserialize)]
pub struct RedisSettings {
    /// Redis url (`rediss://` for TLS).
    pub url: SecretString,
    /// A file holding the url; wins over `url` when set.
    pub url_file: String,
    /// PEM CA of the server's certificate; empty: the system roots.
    pub tls_ca_file: String,
    /// Prefix of every key (no `{` or `}`: hash tags come after it).
    pub key_prefix: String,
    /// Talk to a Redis Cluster: `url` names one or more seed nodes,
    /// separated by commas, and the client follows the cluster's slots.
    pub cluster: bool,
    /// Most users whose badge keys the api keeps a tracked copy of (the
    /// near cache, single node only); 0 turns it off.
    pub near_cache_users: usize,
    /// Longest a near-cache copy is served after the last heartbeat that
    /// confirmed its connection was receiving invalidations.
    pub near_cache_max_lag_ms: u64,
}

/// Send limits and tuning.
#[derive(Debug, Clone, Deserialize)]
pub struct SendSettings {
    /// Recipients per chunk (one task, one transaction).
    pub chunk_size: usize,
    /// Most ids in `SendMessage`.
    pub max_inline_recipients: usize,
    /// Most ids in one `AppendRecipients`.
    pub max_batch_recipients: usize,
    /// Sends up to this size take the high lane.
    pub small_send_threshold: u64,
    /// Tolerance for a `send_at` in the past.
    pub send_at_past_tolerance_secs: i64,
    /// TTL of a cached message status.
    pub status_cache_ttl_secs: u64,
}

/// Control operations (cancel, recall, edit): durable, driven to the end
/// on every shard.
#[derive(Debug, Clone, Deserialize)]
pub struct ControlSettings {
    /// Most recipients a recall or edit retires the cached badges and
    /// pages of one by one; beyond, every user's are retired at once.
    pub retire_recipients_max: u64,
    /// How long a drive holds an operation before another may take it.
    pub lease_secs: u64,
    /// First wait before a failed drive is tried again (doubling).
    pub retry_ms: u64,
    /// Pending chunks a cancel takes per transaction.
    pub cancel_page_chunks: u32,
    /// How long the call waits for its operation's visible part.
    pub answer_within_ms: u64,
}

/// Inbox and badge tuning.
#[derive(Debug, Clone, Deserialize)]
pub struct InboxSettings {
    /// Longest a cached unread counter lives.
    pub counter_ttl_secs: u64,
    /// Longest a cached inbox page is served (0 turns the page cache off).
    pub page_cache_ttl_secs: u64,
    /// Most pages (and rebuild leases) cached per user.
    pub page_cache_pages: u32,
}

/// Group limits and caching.
#[derive(Debug, Clone, Deserialize)]
pub struct GroupSettings {
    /// Most members a group may have.
    pub max_members: u64,
    /// Longest a cached group seq state lives (a backstop: sends raise it,
    /// recalls merge into it).
    pub seq_cache_ttl_secs: u64,
    /// Longest a user's cached memberships and cursors live (a backstop:
    /// every change invalidates them).
    pub membership_cache_ttl_secs: u64,
}

/// The gateway event stream (`notify.v1.EventService`).
#[derive(Debug, Clone, Deserialize)]
pub struct EventSettings {
    /// Events one stream may have queued before per-user events are
    /// coalesced into fresh snapshots.
    pub stream_buffer: usize,
    /// Most users one stream may follow.
    pub max_users_per_stream: usize,
    /// Most event streams one client may hold open on one replica.
    pub max_streams_per_client: usize,
    /// Interval of heartbeats on a stream.
    pub heartbeat_secs: u64,
    /// Snapshots read at once per replica (and badge refreshes at once).
    pub snapshot_concurrency: usize,
    /// How long after its change a recorded event the api did not publish
    /// is published by a worker's relay.
    pub outbox_retry_ms: u64,
}

/// The web console (`notify-api`, its own listener: browsers speak HTTP/1.1
/// with cookies, the gRPC port HTTP/2 with a token per call).
#[derive(Debug, Clone, Deserialize)]
pub struct ConsoleSettings {
    /// Serve it at all.
    pub enabled: bool,
    /// Listen address (`/console/` on it). Beyond loopback only with
    /// authentication on.
    pub listen: String,
    /// How long a login lasts without use.
    pub session_ttl_secs: u64,
    /// How often an open send page is refreshed (one read of each shard per
    /// interval for every page open on the send, on this replica).
    pub update_interval_ms: u64,
    /// Mark the session cookie `Secure` although the listener speaks plain
    /// HTTP (TLS ends at a proxy in front); it always is under `api.tls`.
    pub secure_cookie: bool,
}

/// Backend checks (readiness) and loop heartbeats (liveness).
#[derive(Debug, Clone, Deserialize)]
pub struct HealthSettings {
    /// Interval of backend checks.
    pub check_interval_ms: u64,
    /// Failed checks in a row before a backend counts as down.
    pub failures_before_unready: u32,
    /// Successful checks in a row before it counts as up again.
    pub successes_before_ready: u32,
    /// Silence after which a loop counts as stalled.
    pub loop_stall_secs: u64,
}

/// Logging.
#[derive(Debug, Clone, Deserialize)]
pub struct LogSettings {
    /// `pretty` or `json`.
    pub format: String,
    /// `tracing` filter directive, overridden by `RUST_LOG`.
    pub filter: String,
}

/// How long what grows with every send is kept (see `notify_core::retention`).
/// A `*_days` of 0 keeps those rows forever.
#[derive(Debug, Clone, Deserialize)]
pub struct RetentionSettings {
    /// How often the worker runs retention (and once at start); 0 leaves it
    /// to `notifyctl retention`.
    pub interval_secs: u64,
    /// Items are dropped by whole months once a month is older than this.
    pub items_days: u32,
    /// Monthly item partitions created ahead of time.
    pub months_ahead: u32,
    /// Items of cancelled sends and expired messages are purged this long
    /// after they were hidden.
    pub purge_hidden_after_secs: u64,
    /// Applied and cancelled chunks (the recipient lists) are kept this long.
    pub chunks_days: u32,
    /// Finished sends' control rows, stats, batches, contents and
    /// idempotency keys are kept this long.
    pub sends_days: u32,
    /// Audit rows are kept this long.
    pub audit_days: u32,
    /// Group messages are kept this long.
    pub group_messages_days: u32,
    /// Rows one statement of a cancelled announcement's purge deletes.
    pub purge_batch_rows: u64,
}

/// OpenTelemetry traces, exported over OTLP/gRPC.
#[derive(Debug, Clone, Deserialize)]
pub struct TraceSettings {
    /// The collector's OTLP/gRPC endpoint (`http://otel-collector:4317`);
    /// empty turns tracing off.
    pub otlp_endpoint: String,
    /// Share of the traces started here that are recorded (0.0 to 1.0); a
    /// caller's `traceparent` decision is followed either way.
    pub sample_ratio: f64,
}

impl RetentionSettings {
    fn validate(&self) -> Result<(), SettingsError> {
        if self.months_ahead == 0 {
            return Err(invalid(
                "retention.months_ahead",
                "must be at least 1 (next month's partition must exist before it starts)",
            ));
        }
        // An item's content row must outlive it: a month is dropped up to
        // 31 days after items_days, and contents go with their send.
        let forever = |days: u32| days == 0;
        if !forever(self.sends_days)
            && (forever(self.items_days) || self.sends_days < self.items_days + 31)
        {
            return Err(invalid(
                "retention.sends_days",
                "must be 0 or at least retention.items_days + 31 (sends hold their items' content)",
            ));
        }
        Ok(())
    }
}

impl TraceSettings {
    /// True when spans are exported.
    pub fn enabled(&self) -> bool {
        !self.otlp_endpoint.is_empty()
    }
}

/// A setting that is missing, malformed or inconsistent.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The layered sources could not be read or deserialized.
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    /// The shard map is inconsistent.
    #[error(transparent)]
    ShardMap(#[from] shard_router::ShardMapError),
    /// A file named by a setting cannot be read.
    #[error("{setting}: cannot read {path}: {reason}")]
    File {
        /// Dotted setting name.
        setting: String,
        /// The file.
        path: String,
        /// Why it cannot be read.
        reason: String,
    },
    /// A value is out of range.
    #[error("{setting}: {reason}")]
    Invalid {
        /// Dotted setting name.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl Settings {
    /// Loads defaults, then `$NOTIFY_CONFIG` if set, then `NOTIFY_*` variables,
    /// reads the url files and validates the result.
    pub fn load() -> Result<Self, SettingsError> {
        let mut builder =
            Config::builder().add_source(File::from_str(DEFAULT_CONFIG, FileFormat::Toml));
        if let Ok(path) = std::env::var("NOTIFY_CONFIG") {
            builder = builder.add_source(File::with_name(&path).required(true));
        }
        let mut settings: Settings = builder
            .add_source(
                Environment::with_prefix("NOTIFY")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()?
            .try_deserialize()?;
        settings.read_url_files()?;
        webhooks::read_secret_files(settings.auth.clients.iter_mut().map(|c| &mut c.webhooks))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Replaces every url that names a file (`*.url_file`) with the file's
    /// content, trimmed: Kubernetes mounts Secrets as files.
    pub fn read_url_files(&mut self) -> Result<(), SettingsError> {
        let read = |setting: String, path: &str| -> Result<SecretString, SettingsError> {
            let text = std::fs::read_to_string(path).map_err(|e| SettingsError::File {
                setting,
                path: path.to_owned(),
                reason: e.to_string(),
            })?;
            Ok(SecretString::from(text.trim().to_owned()))
        };
        if !self.database.url_file.is_empty() {
            self.database.url = read("database.url_file".into(), &self.database.url_file)?;
        }
        for (index, shard) in self.database.shards.iter_mut().enumerate() {
            if let Some(path) = shard.url_file.as_deref().filter(|p| !p.is_empty()) {
                shard.url = Some(read(format!("database.shards[{index}].url_file"), path)?);
            }
        }
        if !self.rabbitmq.url_file.is_empty() {
            self.rabbitmq.url = read("rabbitmq.url_file".into(), &self.rabbitmq.url_file)?;
        }
        if !self.redis.url_file.is_empty() {
            self.redis.url = read("redis.url_file".into(), &self.redis.url_file)?;
        }
        Ok(())
    }

    /// Returns the built-in defaults, without files or environment.
    pub fn defaults() -> Result<Self, SettingsError> {
        let settings: Settings = Config::builder()
            .add_source(File::from_str(DEFAULT_CONFIG, FileFormat::Toml))
            .build()?
            .try_deserialize()?;
        Ok(settings)
    }

    /// Checks cross-field rules that deserialization cannot.
    pub fn validate(&self) -> Result<(), SettingsError> {
        self.shard_map()?;
        parse_addr("api.listen", &self.api.listen)?;
        parse_addr("api.metrics_listen", &self.api.metrics_listen)?;
        parse_addr("worker.metrics_listen", &self.worker.metrics_listen)?;
        let positive = [
            ("send.chunk_size", self.send.chunk_size as u64),
            ("rabbitmq.publish_window", self.rabbitmq.publish_window as u64),
            ("worker.concurrency", self.worker.concurrency as u64),
            ("worker.chunks_per_transaction", self.worker.chunks_per_transaction as u64),
            ("worker.max_attempts", u64::from(self.worker.max_attempts)),
            ("worker.operation_timeout_secs", self.worker.operation_timeout_secs),
            ("database.pool_max", u64::from(self.database.pool_max)),
            ("database.shard_map_refresh_ms", self.database.shard_map_refresh_ms),
            ("console.session_ttl_secs", self.console.session_ttl_secs),
            ("console.update_interval_ms", self.console.update_interval_ms),
            ("database.freeze_wait_ms", self.database.freeze_wait_ms),
            ("database.shard_move_wait_secs", self.database.shard_move_wait_secs),
            ("control.lease_secs", self.control.lease_secs),
            ("events.outbox_retry_ms", self.events.outbox_retry_ms),
            ("control.retry_ms", self.control.retry_ms),
            ("control.cancel_page_chunks", u64::from(self.control.cancel_page_chunks)),
            ("database.replica_lease_secs", self.database.replica_lease_secs),
            ("redis.near_cache_max_lag_ms", self.redis.near_cache_max_lag_ms),
            ("groups.max_members", self.groups.max_members),
            ("groups.seq_cache_ttl_secs", self.groups.seq_cache_ttl_secs),
            ("groups.membership_cache_ttl_secs", self.groups.membership_cache_ttl_secs),
            ("health.check_interval_ms", self.health.check_interval_ms),
            ("health.failures_before_unready", u64::from(self.health.failures_before_unready)),
            ("health.successes_before_ready", u64::from(self.health.successes_before_ready)),
            ("health.loop_stall_secs", self.health.loop_stall_secs),
            ("events.stream_buffer", self.events.stream_buffer as u64),
            ("events.max_users_per_stream", self.events.max_users_per_stream as u64),
            ("events.max_streams_per_client", self.events.max_streams_per_client as u64),
            ("events.heartbeat_secs", self.events.heartbeat_secs),
            ("events.snapshot_concurrency", self.events.snapshot_concurrency as u64),
            ("retention.purge_batch_rows", self.retention.purge_batch_rows),
        ];
        for (setting, value) in positive {
            if value == 0 {
                return Err(invalid(setting, "must be at least 1"));
            }
        }
        if self.inbox.page_cache_ttl_secs > 0 && self.inbox.page_cache_pages < 2 {
            return Err(invalid(
                "inbox.page_cache_pages",
                "must be at least 2 while the page cache is on (a page and a rebuild's lease)",
            ));
        }
        if self.redis.near_cache_users > 0 && self.redis.near_cache_max_lag_ms < 100 {
            return Err(invalid(
                "redis.near_cache_max_lag_ms",
                "must be at least 100 (its heartbeat goes every quarter of it)",
            ));
        }
        if self.database.replica_lease_secs * 1000 < 3 * self.database.shard_map_refresh_ms {
            return Err(invalid(
                "database.replica_lease_secs",
                "must cover at least three database.shard_map_refresh_ms intervals",
            ));
        }
        if self.send.chunk_size > 5000 {
            return Err(invalid("send.chunk_size", "must be at most 5000"));
        }
        // One INSERT (and one transaction) carries a group's items: bound
        // it, so that a group holds its locks and its JSON argument briefly.
        if self.worker.chunks_per_transaction * self.send.chunk_size > 16_000 {
            return Err(invalid(
                "worker.chunks_per_transaction",
                "times send.chunk_size must be at most 16000 (rows of one INSERT)",
            ));
        }
        self.auth.validate(&self.api.tls)?;
        webhooks::validate_endpoints(self.auth.clients.iter().map(|c| &c.webhooks))?;
        self.webhooks.validate()?;
        self.api.tls.validate()?;
        self.edge.validate()?;
        if self.api.max_request_bytes < 1024 {
            return Err(invalid("api.max_request_bytes", "must be at least 1024"));
        }
        if self.api.max_recipient_calls == 0 {
            return Err(invalid("api.max_recipient_calls", "must be at least 1"));
        }
        if self.api.max_deadline_secs == 0 {
            return Err(invalid("api.max_deadline_secs", "must be at least 1"));
        }
        self.retention.validate()?;
        if self.redis.key_prefix.contains(['{', '}']) {
            return Err(invalid(
                "redis.key_prefix",
                "must not contain '{' or '}' (keys carry their own hash tags)",
            ));
        }
        if !(0.0..=1.0).contains(&self.trace.sample_ratio) {
            return Err(invalid("trace.sample_ratio", "must be between 0.0 and 1.0"));
        }
        if self.trace.enabled()
            && !["http://", "https://"].iter().any(|s| self.trace.otlp_endpoint.starts_with(s))
        {
            return Err(invalid("trace.otlp_endpoint", "must start with http:// or https://"));
        }
        if !matches!(self.rabbitmq.queue_type.as_str(), "quorum" | "classic") {
            return Err(invalid("rabbitmq.queue_type", "must be \"quorum\" or \"classic\""));
        }
        for (index, shard) in self.database.shards.iter().enumerate() {
            let valid = !shard.database.is_empty()
                && shard.database.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(SettingsError::Invalid {
                    setting: "database.shards",
                    reason: format!(
                        "shards[{index}].database {:?} must be non-empty [A-Za-z0-9_]",
                        shard.database
                    ),
                });
            }
        }
        Ok(())
    }

    /// Builds the validated shard map.
    pub fn shard_map(&self) -> Result<ShardMap, SettingsError> {
        let ids: Vec<ShardId> = self.database.shards.iter().map(|s| s.id).collect();
        let map = if self.database.bucket_ranges.is_empty() {
            ShardMap::even(&ids)?
        } else {
            ShardMap::new(&ids, &self.database.bucket_ranges)?
        };
        Ok(map)
    }

    /// Returns the server url of a shard (without the database name).
    pub fn shard_server_url(&self, shard: &ShardSettings) -> String {
        shard
            .url
            .as_ref()
            .unwrap_or(&self.database.url)
            .expose_secret()
            .trim_end_matches('/')
            .to_owned()
    }
}

pub(crate) fn invalid(setting: &'static str, reason: &str) -> SettingsError {
    SettingsError::Invalid { setting, reason: reason.to_owned() }
}

/// Parses a listen address, naming the setting on failure.
pub fn parse_addr(setting: &'static str, value: &str) -> Result<SocketAddr, SettingsError> {
    value.parse().map_err(|e| SettingsError::Invalid {
        setting,
        reason: format!("{value:?} is not an ip:port address ({e})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting's dotted name in the defaults: nested tables give
    /// `section.table.key`, lists of tables their own name.
    fn setting_names(prefix: &str, table: config::Map<String, config::Value>) -> Vec<String> {
        let mut names = Vec::new();
        for (key, value) in table {
            let name = if prefix.is_empty() { key } else { format!("{prefix}.{key}") };
            match value.kind {
                config::ValueKind::Table(inner) => names.extend(setting_names(&name, inner)),
                _ => names.push(name),
            }
        }
        names
    }

    /// The configuration reference is written by hand beside the defaults:
    /// a setting added to `default.toml` and not to `docs/configuration.md`
    /// fails here, naming it.
    #[test]
    fn every_default_setting_is_in_the_configuration_reference() {
        const REFERENCE: &str = include_str!("../../../../docs/configuration.md");
        let defaults = Config::builder()
            .add_source(File::from_str(DEFAULT_CONFIG, FileFormat::Toml))
            .build()
            .unwrap();
        let table: config::Map<String, config::Value> = defaults.try_deserialize().unwrap();
        let names = setting_names("", table);
        assert!(names.len() > 80, "read only {} settings", names.len());
        let missing: Vec<&String> =
            names.iter().filter(|name| !REFERENCE.contains(&format!("`{name}`"))).collect();
        assert!(missing.is_empty(), "docs/configuration.md lacks {missing:?}");
    }

    #[test]
    fn defaults_are_valid_and_split_four_shards_evenly() {
        let settings = Settings::defaults().unwrap();
        settings.validate().unwrap();
        let map = settings.shard_map().unwrap();
        assert_eq!(map.shards().len(), 4);
        assert_eq!(settings.send.chunk_size, 500);
    }

    #[test]
    fn unknown_shard_in_bucket_range_names_the_setting() {
        let mut settings = Settings::defaults().unwrap();
        settings.database.bucket_ranges =
            vec![BucketRange { shard: ShardId(7), from: 0, to: 1023 }];
        let err = settings.validate().unwrap_err().to_string();
        assert_eq!(err, "database.bucket_ranges[0]: shard 7 is not defined in database.shards");
    }

    #[test]
    fn a_write_lease_shorter_than_three_refreshes_is_refused() {
        let mut settings = Settings::defaults().unwrap();
        settings.database.shard_map_refresh_ms = 1_000;
        settings.database.replica_lease_secs = 2;
        let err = settings.validate().unwrap_err().to_string();
        assert_eq!(
            err,
            "database.replica_lease_secs: must cover at least three \
             database.shard_map_refresh_ms intervals"
        );
        settings.database.replica_lease_secs = 3;
        settings.validate().unwrap();
    }

    #[test]
    fn a_page_cache_too_small_for_a_page_and_its_lease_is_refused() {
        let mut settings = Settings::defaults().unwrap();
        assert!(settings.inbox.page_cache_ttl_secs > 0);
        settings.inbox.page_cache_pages = 1;
        let err = settings.validate().unwrap_err().to_string();
        assert_eq!(
            err,
            "inbox.page_cache_pages: must be at least 2 while the page cache is on \
             (a page and a rebuild's lease)"
        );
        // Off, the size does not matter.
        settings.inbox.page_cache_ttl_secs = 0;
        settings.validate().expect("a page cache that is off needs no size");
    }

    #[test]
    fn a_publish_window_of_zero_is_refused() {
        let mut settings = Settings::defaults().unwrap();
        assert_eq!(settings.rabbitmq.publish_window, 512);
        settings.rabbitmq.publish_window = 0;
        let err = settings.validate().unwrap_err().to_string();
        assert_eq!(err, "rabbitmq.publish_window: must be at least 1");
    }

    #[test]
    fn a_key_prefix_with_a_brace_is_refused() {
        let mut settings = Settings::defaults().unwrap();
        settings.redis.key_prefix = "notify:{eu}:".into();
        let err = settings.validate().unwrap_err().to_string();
        assert_eq!(
            err,
            "redis.key_prefix: must not contain '{' or '}' (keys carry their own hash tags)"
        );
    }

    #[test]
    fn urls_are_read_from_their_files_and_a_missing_file_names_the_setting() {
        let dir = std::env::temp_dir().join(format!("notify-url-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, url: &str| {
            let path = dir.join(name);
            std::fs::write(&path, format!("{url}\n")).unwrap();
            path.display().to_string()
        };
        let mut settings = Settings::defaults().unwrap();
        settings.database.url_file = file("db", "mysql://u:p@db:3306");
        settings.database.shards[1].url_file = Some(file("db1", "mysql://u:p@db1:3306"));
        settings.rabbitmq.url_file = file("mq", "amqps://u:p@mq:5671/%2f");
        settings.redis.url_file = file("redis", "rediss://redis:6380");
        settings.read_url_files().unwrap();
        assert_eq!(settings.database.url.expose_secret(), "mysql://u:p@db:3306");
        let shard1 = &settings.database.shards[1];
        assert_eq!(settings.shard_server_url(shard1), "mysql://u:p@db1:3306");
        assert_eq!(settings.rabbitmq.url.expose_secret(), "amqps://u:p@mq:5671/%2f");
        assert_eq!(settings.redis.url.expose_secret(), "rediss://redis:6380");
        settings.redis.url_file = dir.join("absent").display().to_string();
        let err = settings.read_url_files().unwrap_err().to_string();
        assert!(err.starts_with("redis.url_file: cannot read "), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_open_listener_without_auth_is_refused_unless_allowed() {
        let mut auth = Settings::defaults().unwrap().auth;
        assert!(auth.check_listener("127.0.0.1:50051".parse().unwrap()).is_ok());
        let err = auth.check_listener("0.0.0.0:50051".parse().unwrap()).unwrap_err();
        assert!(err.to_string().starts_with("auth.enabled: api.listen 0.0.0.0:50051"), "{err}");
        auth.insecure_allow_unauthenticated = true;
        assert!(auth.check_listener("0.0.0.0:50051".parse().unwrap()).is_ok());
    }

    #[test]
    fn bad_client_settings_name_the_client_and_field() {
        let mut settings = Settings::defaults().unwrap();
        settings.auth.enabled = true;
        let err = settings.validate().unwrap_err().to_string();
        assert_eq!(err, "auth.clients: must define a client when auth.enabled is true");
        settings.auth.clients.push(ClientSettings {
            name: "billing".into(),
            token_sha256: vec!["abc".into()],
            cert_names: Vec::new(),
            scopes: vec!["send".into()],
            senders: Vec::new(),
            requests_per_second: 0,
            burst: 0,
            recipients_per_minute: 0,
            announcements_per_hour: 0,
            webhooks: Vec::new(),
        });
        let err = settings.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("auth.clients: auth.clients[0].token_sha256: \"abc\" is not 64 hex"),
            "{err}"
        );
        settings.auth.clients[0].token_sha256 = vec!["a".repeat(64)];
        settings.auth.clients[0].scopes = vec!["sends.delete".into()];
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("auth.clients[0].scopes: unknown scope \"sends.delete\""), "{err}");
        settings.auth.clients[0].scopes = vec!["send".into()];
        settings.auth.clients[0].requests_per_second = 1_000_001;
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("requests_per_second: 1000001 is above 1000000"), "{err}");
        settings.auth.clients[0].requests_per_second = 1_000_000;
        settings.auth.clients[0].recipients_per_minute = 60_000_001;
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("recipients_per_minute: 60000001 is above 60000000"), "{err}");
        settings.auth.clients[0].recipients_per_minute = 60_000_000;
        settings.auth.clients[0].cert_names = vec!["billing.internal".into()];
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("cert_names: needs api.tls.client_auth"), "{err}");
    }

    #[test]
    fn bad_listen_address_names_the_setting() {
        let mut settings = Settings::defaults().unwrap();
        settings.api.listen = "localhost".into();
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.starts_with("api.listen: \"localhost\""), "{err}");
    }
}
