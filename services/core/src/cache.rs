//! Redis: unread counters that never drift, and the message-status cache.
//!
//! # Counter protocol
//!
//! MySQL is the truth: a badge is the number of the user's unread, unexpired
//! `message_items` rows. Redis only ever holds a copy of that number, never a
//! value derived by increments, so it cannot drift or go negative.
//!
//! Keys (under `redis.key_prefix`):
//! - `unread:{user}`: the cached count, with a TTL of at most
//!   `inbox.counter_ttl_secs` and never past the earliest expiry among the
//!   counted items (the count changes then).
//! - `unread:{user}:lease`: a random token held by a reader rebuilding the count.
//! - `unread:{user}:dirty`: the number of writers between "before commit" and
//!   "after commit" for the user (expires by itself if a writer dies).
//!
//! Reader (badge): `GET unread:{user}`; on a hit, done. On a miss: `SET lease
//! token PX 5000`, count in MySQL, then a script stores the count only if the
//! lease still holds the token and no dirty marker exists. Any invalidation
//! between the lease and the store deletes the lease, so a count read before
//! a concurrent commit is never cached.
//!
//! Writer (mark-read): before commit, invalidate (delete count and lease) and
//! increment the dirty marker; after commit, decrement it and invalidate
//! again. An api that dies in between leaves the marker, which stops caching
//! until it expires, so no pre-commit count is ever cached for good.
//!
//! Writer (delivery): after commit, invalidate; then ack. A worker that dies
//! in between leaves the task unacked, and its redelivery finds the chunk
//! done and invalidates again (also when the send has been paused since). A
//! Redis outage at that point requeues the task instead of dead-lettering it.
//! A FLUSHALL or a lost Redis only causes rebuilds. If Redis is down, badges
//! are answered from MySQL.

use std::time::Duration;

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

/// Stores a rebuilt count only if the lease is still ours and no writer is
/// mid-transaction. KEYS: count, lease, dirty. ARGV: token, count, ttl ms.
const STORE_IF_LEASED: &str = r"
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  if redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return 1
  end
end
return 0
";

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

/// Counts a writer out of the dirty marker and invalidates.
/// KEYS: dirty, count, lease.
const END_CHANGE: &str = r"
if redis.call('DECR', KEYS[1]) <= 0 then
  redis.call('DEL', KEYS[1])
end
redis.call('DEL', KEYS[2], KEYS[3])
return 1
";

/// The Redis cache, with its key prefix.
#[derive(Clone)]
pub struct Cache {
    conn: ConnectionManager,
    prefix: String,
    store_if_leased: Script,
    write_status_if_newer: Script,
    end_change: Script,
}

impl Cache {
    /// Connects, naming the setting when Redis is unreachable.
    pub async fn connect(settings: &RedisSettings) -> Result<Self> {
        let client = redis::Client::open(settings.url.expose_secret())
            .map_err(|e| Error::Internal(format!("redis.url: {e}")))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(Duration::from_secs(3)))
            .set_number_of_retries(2);
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| Error::Unavailable(format!("redis.url: cannot connect: {e}")))?;
        Ok(Self {
            conn,
            prefix: settings.key_prefix.clone(),
            store_if_leased: Script::new(STORE_IF_LEASED),
            write_status_if_newer: Script::new(WRITE_STATUS_IF_NEWER),
            end_change: Script::new(END_CHANGE),
        })
    }

    /// Returns the key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Returns a connection handle (cheap clone).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    fn count_key(&self, user_id: u64) -> String {
        format!("{}unread:{user_id}", self.prefix)
    }

    fn lease_key(&self, user_id: u64) -> String {
        format!("{}unread:{user_id}:lease", self.prefix)
    }

    fn dirty_key(&self, user_id: u64) -> String {
        format!("{}unread:{user_id}:dirty", self.prefix)
    }

    fn status_key(&self, message_id: u64) -> String {
        format!("{}msg:{message_id}:status", self.prefix)
    }

    /// Reads cached counts; `None` where the cache has none.
    pub async fn cached_counts(&self, user_ids: &[u64]) -> Result<Vec<Option<u64>>> {
        let keys: Vec<String> = user_ids.iter().map(|u| self.count_key(*u)).collect();
        let mut conn = self.conn.clone();
        if keys.len() == 1 {
            let value: Option<u64> = conn.get(&keys[0]).await?;
            return Ok(vec![value]);
        }
        Ok(conn.mget(&keys).await?)
    }

    /// Takes rebuild leases for users; returns the tokens.
    pub async fn take_leases(&self, user_ids: &[u64]) -> Result<Vec<u64>> {
        let tokens: Vec<u64> = user_ids.iter().map(|_| rand::random::<u64>() | 1).collect();
        let mut pipe = redis::pipe();
        for (user_id, token) in user_ids.iter().zip(&tokens) {
            pipe.set_options(
                self.lease_key(*user_id),
                *token,
                redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(LEASE_MS)),
            )
            .ignore();
        }
        let mut conn = self.conn.clone();
        pipe.query_async::<()>(&mut conn).await?;
        Ok(tokens)
    }

    /// Stores rebuilt counts where the leases still hold. `ttl_ms` per user.
    pub async fn store_counts(&self, entries: &[(u64, u64, u64, u64)]) -> Result<()> {
        let mut conn = self.conn.clone();
        for (user_id, token, count, ttl_ms) in entries {
            self.store_if_leased
                .key(self.count_key(*user_id))
                .key(self.lease_key(*user_id))
                .key(self.dirty_key(*user_id))
                .arg(*token)
                .arg(*count)
                .arg((*ttl_ms).max(1))
                .invoke_async::<i64>(&mut conn)
                .await?;
        }
        Ok(())
    }

    /// Deletes users' cached counts and leases (after their items changed).
    pub async fn invalidate_counts(&self, user_ids: &[u64]) -> Result<()> {
        if user_ids.is_empty() {
            return Ok(());
        }
        let mut keys = Vec::with_capacity(user_ids.len() * 2);
        for user_id in user_ids {
            keys.push(self.count_key(*user_id));
            keys.push(self.lease_key(*user_id));
        }
        let mut conn = self.conn.clone();
        conn.del::<_, ()>(keys).await?;
        Ok(())
    }

    /// Before a writer's commit: invalidates and counts one more writer in
    /// the user's dirty marker (a counter, so concurrent writers do not
    /// clear each other's marker).
    pub async fn begin_count_change(&self, user_id: u64) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.del(&[self.count_key(user_id), self.lease_key(user_id)]).ignore();
        pipe.incr(self.dirty_key(user_id), 1).ignore();
        pipe.pexpire(self.dirty_key(user_id), DIRTY_MS as i64).ignore();
        let mut conn = self.conn.clone();
        pipe.query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// After a writer's commit: counts the writer out and invalidates again.
    pub async fn end_count_change(&self, user_id: u64) -> Result<()> {
        let mut conn = self.conn.clone();
        self.end_change
            .key(self.dirty_key(user_id))
            .key(self.count_key(user_id))
            .key(self.lease_key(user_id))
            .invoke_async::<i64>(&mut conn)
            .await?;
        Ok(())
    }

    /// Records that a send just made progress (a chunk was applied).
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
    pub async fn has_heartbeat(&self, message_id: u64) -> Result<bool> {
        let mut conn = self.conn.clone();
        Ok(conn.exists(format!("{}msg:{message_id}:beat", self.prefix)).await?)
    }

    /// Returns a cached message status.
    pub async fn cached_status(&self, message_id: u64) -> Result<Option<u8>> {
        let mut conn = self.conn.clone();
        let value: Option<String> = conn.get(self.status_key(message_id)).await?;
        Ok(value.and_then(|v| v.split_once(':').and_then(|(_, status)| status.parse().ok())))
    }

    /// Caches a status read from MySQL with its version. Versions only move
    /// forward: a late write of an older status is ignored.
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
