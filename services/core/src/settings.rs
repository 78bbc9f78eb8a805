//! Typed, layered configuration: built-in defaults, an optional file, then
//! `NOTIFY_SECTION__KEY` environment variables; validated once at start.

use std::net::SocketAddr;

use config::{Config, Environment, File, FileFormat};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use shard_router::{BucketRange, ShardId, ShardMap};

/// The built-in defaults, documented setting by setting.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Every setting of a Notify process.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// The gRPC front service.
    pub api: ApiSettings,
    /// The delivery worker.
    pub worker: WorkerSettings,
    /// The MySQL shards.
    pub database: DatabaseSettings,
    /// The RabbitMQ broker.
    pub rabbitmq: RabbitSettings,
    /// The Redis cache.
    pub redis: RedisSettings,
    /// Send limits and tuning.
    pub send: SendSettings,
    /// Inbox and badge tuning.
    pub inbox: InboxSettings,
    /// Group limits and caching.
    pub groups: GroupSettings,
    /// Logging.
    pub log: LogSettings,
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
}

/// Settings of `notify-worker`.
#[derive(Debug, Clone, Deserialize)]
pub struct WorkerSettings {
    /// Prometheus listen address.
    pub metrics_listen: String,
    /// Chunks applied at once, per lane.
    pub concurrency: usize,
    /// In-process attempts on transient errors before the task is requeued.
    pub max_attempts: u32,
    /// First retry delay; doubled on each attempt.
    pub retry_base_ms: u64,
    /// Attempts at a chunk that never commit before it is recorded as failed.
    pub poison_attempts: u32,
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
}

/// The MySQL shards.
#[derive(Debug, Clone, Deserialize)]
pub struct DatabaseSettings {
    /// Default server url (without a database name).
    pub url: SecretString,
    /// Connections per shard pool.
    pub pool_max: u32,
    /// Connect timeout.
    pub connect_timeout_secs: u64,
    /// The physical shards.
    pub shards: Vec<ShardSettings>,
    /// Bucket ranges; empty means an even split.
    pub bucket_ranges: Vec<BucketRange>,
}

/// The RabbitMQ broker.
#[derive(Debug, Clone, Deserialize)]
pub struct RabbitSettings {
    /// AMQP url.
    pub url: SecretString,
    /// Prefix of exchange and queue names.
    pub prefix: String,
    /// `quorum` or `classic`.
    pub queue_type: String,
}

/// The Redis cache.
#[derive(Debug, Clone, Deserialize)]
pub struct RedisSettings {
    /// Redis url.
    pub url: SecretString,
    /// Prefix of every key.
    pub key_prefix: String,
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

/// Inbox and badge tuning.
#[derive(Debug, Clone, Deserialize)]
pub struct InboxSettings {
    /// Longest a cached unread counter lives.
    pub counter_ttl_secs: u64,
}

/// Group limits and caching.
#[derive(Debug, Clone, Deserialize)]
pub struct GroupSettings {
    /// Most members a group may have.
    pub max_members: u64,
    /// Longest a cached group max seq lives (a backstop: sends raise it).
    pub seq_cache_ttl_secs: u64,
    /// Longest a user's cached memberships and cursors live (a backstop:
    /// every change invalidates them).
    pub membership_cache_ttl_secs: u64,
}

/// Logging.
#[derive(Debug, Clone, Deserialize)]
pub struct LogSettings {
    /// `pretty` or `json`.
    pub format: String,
    /// `tracing` filter directive, overridden by `RUST_LOG`.
    pub filter: String,
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
    /// Loads defaults, then `$NOTIFY_CONFIG` if set, then `NOTIFY_*` variables.
    pub fn load() -> Result<Self, SettingsError> {
        let mut builder =
            Config::builder().add_source(File::from_str(DEFAULT_CONFIG, FileFormat::Toml));
        if let Ok(path) = std::env::var("NOTIFY_CONFIG") {
            builder = builder.add_source(File::with_name(&path).required(true));
        }
        let settings: Settings = builder
            .add_source(
                Environment::with_prefix("NOTIFY")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()?
            .try_deserialize()?;
        settings.validate()?;
        Ok(settings)
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
            ("worker.concurrency", self.worker.concurrency as u64),
            ("worker.max_attempts", u64::from(self.worker.max_attempts)),
            ("database.pool_max", u64::from(self.database.pool_max)),
            ("groups.max_members", self.groups.max_members),
            ("groups.seq_cache_ttl_secs", self.groups.seq_cache_ttl_secs),
            ("groups.membership_cache_ttl_secs", self.groups.membership_cache_ttl_secs),
        ];
        for (setting, value) in positive {
            if value == 0 {
                return Err(invalid(setting, "must be at least 1"));
            }
        }
        if self.send.chunk_size > 5000 {
            return Err(invalid("send.chunk_size", "must be at most 5000"));
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

fn invalid(setting: &'static str, reason: &str) -> SettingsError {
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
    fn bad_listen_address_names_the_setting() {
        let mut settings = Settings::defaults().unwrap();
        settings.api.listen = "localhost".into();
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.starts_with("api.listen: \"localhost\""), "{err}");
    }
}
