//! Unread counters that never drift, and the cached list of active
//! announcements.
//!
//! # Counter protocol
//!
//! MySQL is the truth: a badge is two numbers, the user's unread and unseen
//! inbox items (unexpired, unrevoked, not archived, not deleted
//! `message_items` rows), each plus the active announcements the user has
//! not materialized yet and does not mute. Redis only ever holds a copy of that number, never a
//! value built from increments, so it cannot drift or go negative.
//!
//! Keys (under `redis.key_prefix`, see [`super::Keys`]):
//! - `{ann}:epoch`: bumped whenever an announcement starts or is cancelled,
//!   and after retention drops a month of items (which changes inbox pages).
//!   Cached counts carry the epoch they were counted under, so one bump
//!   retires every cached badge at once (each badge includes the
//!   announcements): a count of another epoch reads as a miss. A bump
//!   never goes back, not even after the epoch itself is lost (an
//!   `allkeys-*` eviction, or a `DEL`): it takes the larger of the epoch
//!   plus one and the Redis server's clock in microseconds, so a lost epoch
//!   cannot count up again to one that counts cached before the loss carry.
//! - `{u:ID}:unread`: the cached counts as `epoch:unread:unseen`, with a TTL of at
//!   most `inbox.counter_ttl_secs` and never past the earliest expiry among
//!   what it counts (the count changes then).
//! - `{u:ID}:unread:lease`: a random token held by a reader rebuilding.
//! - `{u:ID}:unread:dirty`: how many writers are between "before commit"
//!   and "after commit" for the user; expires by itself if a writer dies.
//!
//! Reader (badge): reads the epoch and the counts in one round trip (a count
//! of another epoch is a miss). On a miss: take a lease (`SET lease token PX
//! 5000`), count in MySQL, then a script stores `epoch:unread:unseen` only if the
//! lease still holds the token and the user is not dirty. Any invalidation
//! between the lease and the store deletes the lease, so a count read before
//! a concurrent commit is never cached. The epoch and the counts are not
//! read atomically (they live in different slots): a reader that raced an
//! epoch bump answers as of just before it, or misses and rebuilds; a count
//! it then stores under the older epoch reads as a miss to everyone after.
//!
//! Writer (mark-read, materializing announcements): before commit, invalidate
//! (delete count and lease, and the user's cached inbox pages with their
//! leases, see [`super::pages`]) and increment the dirty marker; after commit,
//! decrement it and invalidate again. An api that dies in between leaves the
//! marker, which stops caching until it expires.
//!
//! Writer (delivery): after commit, invalidate; then ack. A worker that dies
//! in between leaves the task unacked; its redelivery finds the chunk done and
//! invalidates again (also when the send has been paused since). The commit
//! leaves the chunk *unsettled* in MySQL, which holds back the send's
//! completion, and only a confirmed invalidation settles it. When Redis does
//! not answer, delivery goes on and every worker's settler invalidates the
//! recipients of chunks left unsettled within half a second of Redis
//! answering again (counts cached before the outage are then gone).
//!
//! A FLUSHALL or a lost Redis only causes rebuilds; with Redis down, badges
//! are answered from MySQL. Each script touches one user's keys (one slot).

use futures::future::try_join_all;
use redis::{AsyncCommands, Script};
use tracing::instrument;

use super::near::Held;
use super::values::{CachedCounts, Counts, count_at};
use super::{Cache, DIRTY_MS, cache_error, waves};
use notify_domain::error::Result;

/// Most users per invalidation command (a command blocks Redis while it runs).
const USERS_PER_CALL: usize = 1000;

/// Stores a rebuilt count only if the lease is still ours and no writer is
/// mid-transaction. KEYS: count, lease, dirty. ARGV: token, `epoch:unread:unseen`,
/// ttl ms.
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

/// Moves a user's dirty marker by ARGV[1] (+1 or -1) and invalidates.
/// KEYS: dirty, count, lease, inbox pages. ARGV: delta, dirty ttl ms.
const CHANGE: &str = r"
if tonumber(ARGV[1]) > 0 then
  redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif redis.call('DECR', KEYS[1]) <= 0 then
  redis.call('DEL', KEYS[1])
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
return 1
";

/// Moves the epoch past its current value and past every epoch it ever
/// held: the server's clock in microseconds (below 2^53 for centuries, so
/// exact in Lua's numbers) is larger than any epoch bumped before it, unless
/// bumps came faster than one a microsecond, which `+ 1` covers.
/// KEYS: the epoch. Returns the new epoch.
const BUMP_EPOCH: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local next = math.max(tonumber(redis.call('GET', KEYS[1]) or '0') + 1, now)
redis.call('SET', KEYS[1], string.format('%.0f', next))
return next
";

/// KEYS: the epoch. ARGV: what active-list keys start with. Returns the
/// epoch and that epoch's cached active list or nil (same `{ann}` slot).
const ACTIVE_LIST: &str = r"
local epoch = redis.call('GET', KEYS[1]) or '0'
return { epoch, redis.call('GET', ARGV[1] .. epoch) or false }
";

/// The badge scripts, loaded once per connection.
#[derive(Clone)]
pub(super) struct Scripts {
    store_if_leased: Script,
    change: Script,
    active_list: Script,
    bump_epoch: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            store_if_leased: Script::new(STORE_IF_LEASED),
            change: Script::new(CHANGE),
            active_list: Script::new(ACTIVE_LIST),
            bump_epoch: Script::new(BUMP_EPOCH),
        }
    }
}

/// Rebuilt counts to store: user, lease token, counts, TTL in ms.
#[derive(Debug, Clone, Copy)]
pub struct RebuiltCount {
    /// The user.
    pub user_id: u64,
    /// The lease token taken before counting.
    pub token: u64,
    /// The counts read from MySQL.
    pub counts: Counts,
    /// How long it may be cached.
    pub ttl_ms: u64,
}

impl Cache {
    /// Reads the epoch and users' cached counts in one round trip (on a
    /// cluster, one per node, concurrently).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_counts(&self, user_ids: &[u64]) -> Result<CachedCounts> {
        if let Some(near) = &self.near {
            if let Some(counts) = near.counts(user_ids) {
                notify_domain::hot_counter!("notify_near_cache_hits_total").increment(1);
                return Ok(counts);
            }
            match near.read_counts(user_ids).await {
                Ok(Some(counts)) => {
                    notify_domain::hot_counter!("notify_near_cache_misses_total").increment(1);
                    return Ok(counts);
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "near cache read failed, reading redis"),
            }
        }
        let (mut epoch_conn, mut conn) = (self.conn.clone(), self.conn.clone());
        let epoch = epoch_conn.get::<_, Option<u64>>(self.keys.epoch());
        if user_ids.is_empty() {
            return Ok(CachedCounts {
                epoch: epoch.await.map_err(cache_error)?.unwrap_or(0),
                counts: Vec::new(),
            });
        }
        let keys: Vec<String> = user_ids.iter().map(|user_id| self.keys.unread(*user_id)).collect();
        let values = conn.mget::<_, Vec<Option<String>>>(keys);
        let (epoch, values) = futures::try_join!(epoch, values).map_err(cache_error)?;
        let epoch = epoch.unwrap_or(0);
        let counts = values.iter().map(|value| count_at(value.as_deref(), epoch)).collect();
        Ok(CachedCounts { epoch, counts })
    }

    /// Takes rebuild leases for users; returns the tokens. (The epoch the
    /// rebuild counts under goes with the count, in [`Self::store_counts`].)
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn take_leases(&self, user_ids: &[u64]) -> Result<Vec<u64>> {
        let keys = user_ids.iter().map(|user_id| self.keys.unread_lease(*user_id)).collect();
        self.take_lease_keys(keys, USERS_PER_CALL).await
    }

    /// Stores rebuilt counts, under `epoch`, where the leases still hold.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn store_counts(&self, epoch: u64, entries: &[RebuiltCount]) -> Result<()> {
        let stores = entries.iter().map(|entry| {
            let mut invocation = self.badge.store_if_leased.prepare_invoke();
            invocation
                .key(self.keys.unread(entry.user_id))
                .key(self.keys.unread_lease(entry.user_id))
                .key(self.keys.unread_dirty(entry.user_id))
                .arg(entry.token)
                .arg(entry.counts.stored_at(epoch))
                .arg(entry.ttl_ms.max(1));
            let mut conn = self.conn.clone();
            async move { invocation.invoke_async::<i64>(&mut conn).await }
        });
        try_join_all(stores).await.map_err(cache_error)?;
        self.forget_near(entries.iter().map(|entry| Held::Unread(entry.user_id)));
        Ok(())
    }

    /// Deletes users' cached counts, leases and inbox pages (after their
    /// items changed).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn invalidate_counts(&self, user_ids: &[u64]) -> Result<()> {
        let groups = self.by_slot(user_ids.iter().copied(), USERS_PER_CALL, |user_id| {
            self.keys.unread(*user_id)
        });
        // At most USERS_PER_CALL users' keys in flight at once: on one node
        // (a group per 1,000 users) one DEL after another, on a cluster (a
        // group per slot) many small ones together. Redis runs them one by
        // one either way, so this costs a round trip per 1,000 users; what it
        // bounds is the command bytes a caller holds (~90 KB per 1,000
        // users), which a worker applying several chunk groups at once
        // otherwise held by the megabyte, in short bursts.
        for wave in waves(groups, USERS_PER_CALL) {
            try_join_all(wave.iter().map(|group| self.delete_counts(group))).await?;
        }
        self.forget_near(user_ids.iter().map(|user_id| Held::Unread(*user_id)));
        Ok(())
    }

    /// One DEL of the count, lease and inbox page keys of `user_ids` (one
    /// slot's).
    async fn delete_counts(&self, user_ids: &[u64]) -> Result<()> {
        // Written into one buffer sized up front (about the longest key,
        // three times per user), not into a string per key and then a
        // buffer doubled to its size: this runs on every chunk group a
        // worker applies.
        let key_len = self.keys.unread_lease(user_ids.iter().copied().max().unwrap_or(0)).len();
        let mut del = redis::Cmd::with_capacity(
            1 + 3 * user_ids.len(),
            "DEL".len() + 3 * key_len * user_ids.len(),
        );
        del.arg("DEL");
        for user_id in user_ids {
            del.arg(self.keys.unread(*user_id))
                .arg(self.keys.unread_lease(*user_id))
                .arg(self.keys.inbox_pages(*user_id));
        }
        let mut conn = self.conn.clone();
        del.query_async::<()>(&mut conn).await.map_err(cache_error)?;
        Ok(())
    }

    /// Before a writer's commit: invalidates and counts one more writer in
    /// the user's dirty marker (a counter, so concurrent writers do not clear
    /// each other's marker).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn begin_count_change(&self, user_id: u64) -> Result<()> {
        self.change(user_id, 1).await
    }

    /// After a writer's commit: counts the writer out and invalidates again.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn end_count_change(&self, user_id: u64) -> Result<()> {
        self.change(user_id, -1).await
    }

    async fn change(&self, user_id: u64, delta: i64) -> Result<()> {
        let mut conn = self.conn.clone();
        self.badge
            .change
            .key(self.keys.unread_dirty(user_id))
            .key(self.keys.unread(user_id))
            .key(self.keys.unread_lease(user_id))
            .key(self.keys.inbox_pages(user_id))
            .arg(delta)
            .arg(DIRTY_MS)
            .invoke_async::<i64>(&mut conn)
            .await
            .map_err(cache_error)?;
        self.forget_near([Held::Unread(user_id)]);
        Ok(())
    }

    /// Retires every cached badge (an announcement started or was cancelled).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn bump_announcement_epoch(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        let epoch = self
            .badge
            .bump_epoch
            .key(self.keys.epoch())
            .invoke_async(&mut conn)
            .await
            .map_err(cache_error)?;
        self.forget_near([Held::Epoch]);
        Ok(epoch)
    }

    /// Reads the announcement epoch and that epoch's cached active list
    /// (if any) in one round trip: every inbox read asks.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_announcements(&self) -> Result<(u64, Option<String>)> {
        if let Some(near) = &self.near {
            if let Some(held) = near.announcements() {
                return Ok(held);
            }
            match near.read_announcements().await {
                Ok(Some(read)) => return Ok(read),
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "near cache read failed, reading redis"),
            }
        }
        let mut conn = self.conn.clone();
        let (epoch, list): (u64, Option<String>) = self
            .badge
            .active_list
            .key(self.keys.epoch())
            .arg(self.keys.active_list_prefix())
            .invoke_async(&mut conn)
            .await
            .map_err(cache_error)?;
        Ok((epoch, list))
    }

    /// Caches the active-announcement list of an epoch.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn store_announcements(&self, epoch: u64, json: &str, ttl_secs: u64) -> Result<()> {
        let mut conn = self.conn.clone();
        conn.set_ex::<_, _, ()>(self.keys.active_list(epoch), json, ttl_secs.max(1))
            .await
            .map_err(cache_error)?;
        self.forget_near([Held::Active(epoch)]);
        Ok(())
    }
}
