//! Redis: the message-status cache, send heartbeats, (in [`badge`]) the
//! unread counters that never drift, and (in [`groups`]) group seqs and
//! member cursors. Redis is only ever a cache: losing all of it loses no
//! data and leaves no count wrong.

mod badge;
mod coalesce;
mod groups;
pub mod quota;

pub use badge::{CachedCounts, RebuiltCount};
pub use groups::{CachedGroup, CachedUserState};

use std::time::Duration;
use tracing::instrument;

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use secrecy::ExposeSecret;

use crate::error::{Error, Result};
use crate::settings::RedisSettings;

/// How long a rebuild may take before its lease lapses.
const LEASE_MS: u64 = 5_000;
/// How long a writer's dirty marker stops caching, if the writer dies. Longer
/// than InnoDB's default lock wait (50 s), so a slow transaction is covered.
const DIRTY_MS: u64 = 90_000;

/// Stores `version:status` unless the cache already holds an equal or newer
/// version. KEYS: status key. ARGV: version, status, ttl secs.
const WRITE_STATUS_IF_NEWER: &str = r"
local current = redis.call('GET', KEYS[1])
if current then
  local version = tonumber(string.match(current, '^(%d+):'))
  if version and version >= tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], 'EX', ARGV[3])
return 1
";

/// Builds a client for `redis.url`; a `rediss://` url verifies the server
/// against `redis.tls_ca_file` when set (else the system roots).
pub fn client(settings: &RedisSettings) -> Result<redis::Client> {
    let url = settings.url.expose_secret();
    if settings.tls_ca_file.is_empty() {
        return redis::Client::open(url).map_err(|e| Error::Internal(format!("redis.url: {e}")));
    }
    let root_cert = std::fs::read(&settings.tls_ca_file).map_err(|e| {
        Error::Internal(format!("redis.tls_ca_file: cannot read {}: {e}", settings.tls_ca_file))
    })?;
    let certificates = redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) };
    redis::Client::build_with_tls(url, certificates)
        .map_err(|e| Error::Internal(format!("redis.url: {e}")))
}

/// The Redis cache, with its key prefix.
#[derive(Clone)]
pub struct Cache {
    conn: ConnectionManager,
    prefix: String,
    write_status_if_newer: Script,
    badge: badge::Scripts,
    groups: groups::Scripts,
    quota: Script,
    user_state_reads: coalesce::UserStateReads,
}

impl Cache {
    /// Connects, naming the setting when Redis is unreachable.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn connect(settings: &RedisSettings) -> Result<Self> {
        let client = client(settings)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(Duration::from_secs(3)))
            .set_number_of_retries(2);
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| Error::Unavailable(format!("redis.url: cannot connect: {e}")))?;
        let groups = groups::Scripts::new();
        let user_state_reads = coalesce::UserStateReads::start(
            conn.clone(),
            groups.user_states.clone(),
            settings.key_prefix.clone(),
        );
        Ok(Self {
            conn,
            prefix: settings.key_prefix.clone(),
            write_status_if_newer: Script::new(WRITE_STATUS_IF_NEWER),
            badge: badge::Scripts::new(),
            groups,
            quota: quota::script(),
            user_state_reads,
        })
    }

    /// Returns a connection handle (cheap clone).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    fn status_key(&self, message_id: u64) -> String {
        format!("{}msg:{message_id}:status", self.prefix)
    }

    /// Records that a send just made progress (a chunk was applied).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn heartbeat(&self, message_id: u64, ttl_secs: u64) -> Result<()> {
        let mut conn = self.conn.clone();
        conn.set_ex::<_, _, ()>(
            format!("{}msg:{message_id}:beat", self.prefix),
            1,
            ttl_secs.max(1),
        )
        .await?;
        Ok(())
    }

    /// Returns true if a send made progress within the heartbeat's TTL.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn has_heartbeat(&self, message_id: u64) -> Result<bool> {
        let mut conn = self.conn.clone();
        Ok(conn.exists(format!("{}msg:{message_id}:beat", self.prefix)).await?)
    }

    /// Returns a cached message status.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_status(&self, message_id: u64) -> Result<Option<u8>> {
        let mut conn = self.conn.clone();
        let value: Option<String> = conn.get(self.status_key(message_id)).await?;
        Ok(value.and_then(|v| v.split_once(':').and_then(|(_, status)| status.parse().ok())))
    }

    /// Caches a status read from MySQL with its version. Versions only move
    /// forward: a late write of an older status is ignored.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn write_status(
        &self,
        message_id: u64,
        version: u64,
        status: u8,
        ttl_secs: u64,
    ) -> Result<()> {
        let mut conn = self.conn.clone();
        self.write_status_if_newer
            .key(self.status_key(message_id))
            .arg(version)
            .arg(status)
            .arg(ttl_secs.max(1))
            .invoke_async::<i64>(&mut conn)
            .await?;
        Ok(())
    }
}
