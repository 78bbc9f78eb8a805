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
//! - `unread:{user}:dirty`: set by a writer before its transaction commits.
//!
//! Reader (badge): `GET unread:{user}`; on a hit, done. On a miss: `SET lease
//! token PX 5000`, count in MySQL, then a script stores the count only if the
//! lease still holds the token and no dirty marker exists. Any invalidation
//! between the lease and the store deletes the lease, so a count read before
//! a concurrent commit is never cached.
//!
//! Writer (delivery, mark-read): before commit, invalidate (delete count and
//! lease) and, for mark-read, set the dirty marker with a short TTL; after
//! commit, invalidate again and clear the marker. A process that dies between
//! commit and the second step leaves either no cached count, or the dirty
//! marker, which stops caching until it expires; the worker is also healed by
//! redelivery, since a redelivered task of a done chunk invalidates again.
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
/// How long a writer's dirty marker stops caching, if the writer dies.
const DIRTY_MS: u64 = 30_000;

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

/// The Redis cache, with its key prefix.
#[derive(Clone)]
pub struct Cache {
    conn: ConnectionManager,
    prefix: String,
    store_if_leased: Script,
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

    /// Before a writer's commit: invalidates and marks the users dirty.
    pub async fn begin_count_change(&self, user_id: u64) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.del(&[self.count_key(user_id), self.lease_key(user_id)]).ignore();
        pipe.set_options(
            self.dirty_key(user_id),
            1,
            redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(DIRTY_MS)),
        )
        .ignore();
        let mut conn = self.conn.clone();
        pipe.query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// After a writer's commit: invalidates again and clears the dirty marker.
    pub async fn end_count_change(&self, user_id: u64) -> Result<()> {
        let mut conn = self.conn.clone();
        conn.del::<_, ()>(&[
            self.count_key(user_id),
            self.lease_key(user_id),
            self.dirty_key(user_id),
        ])
        .await?;
        Ok(())
    }

    /// Returns a cached message status.
    pub async fn cached_status(&self, message_id: u64) -> Result<Option<u8>> {
        let mut conn = self.conn.clone();
        Ok(conn.get(self.status_key(message_id)).await?)
    }

    /// Caches a status read from MySQL, unless a writer already cached a newer one.
    pub async fn fill_status(&self, message_id: u64, status: u8, ttl_secs: u64) -> Result<()> {
        let mut conn = self.conn.clone();
        conn.set_options::<_, _, ()>(
            self.status_key(message_id),
            status,
            redis::SetOptions::default()
                .conditional_set(redis::ExistenceCheck::NX)
                .with_expiration(redis::SetExpiry::EX(ttl_secs.max(1))),
        )
        .await?;
        Ok(())
    }

    /// Writes a status just changed in MySQL (overwrites the cache).
    pub async fn write_status(&self, message_id: u64, status: u8, ttl_secs: u64) -> Result<()> {
        let mut conn = self.conn.clone();
        conn.set_ex::<_, _, ()>(self.status_key(message_id), status, ttl_secs.max(1)).await?;
        Ok(())
    }
}
