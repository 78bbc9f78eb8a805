//! Unread counters that never drift, and the cached list of active
//! announcements.
//!
//! # Counter protocol
//!
//! MySQL is the truth: a badge is the number of the user's unread, unexpired,
//! unrevoked `message_items` rows, plus the active announcements the user has
//! not materialized yet. Redis only ever holds a copy of that number, never a
//! value built from increments, so it cannot drift or go negative.
//!
//! Keys (under `redis.key_prefix`):
//! - `ann:epoch`: bumped whenever an announcement starts or is cancelled. Count
//!   and lease keys carry the epoch, so one INCR retires every cached badge at
//!   once (each badge includes the announcements); old keys just expire.
//! - `unread:{epoch}:{user}`: the cached count, with a TTL of at most
//!   `inbox.counter_ttl_secs` and never past the earliest expiry among what
//!   it counts (the count changes then).
//! - `unread:{epoch}:{user}:lease`: a random token held by a reader rebuilding.
//! - `unread:{user}:dirty`: how many writers are between "before commit" and
//!   "after commit" for the user; expires by itself if a writer dies.
//!
//! Reader (badge): one script reads the epoch and the counts. On a miss: take
//! a lease (`SET lease token PX 5000`), count in MySQL, then a script stores
//! the count only if the lease still holds the token and the user is not
//! dirty. Any invalidation between the lease and the store deletes the lease,
//! so a count read before a concurrent commit is never cached.
//!
//! Writer (mark-read, materializing announcements): before commit, invalidate
//! (delete count and lease) and increment the dirty marker; after commit,
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
//! are answered from MySQL. The scripts build keys from the prefix, which is
//! fine on a standalone Redis or a replicated primary (not Redis Cluster).

use redis::{AsyncCommands, Script};
use tracing::instrument;

use super::{Cache, DIRTY_MS, LEASE_MS};
use crate::error::Result;

/// ARGV: prefix, users... Returns the epoch, then each user's count or nil.
const GET_COUNTS: &str = r"
local epoch = redis.call('GET', ARGV[1] .. 'ann:epoch') or '0'
local out = { epoch }
for i = 2, #ARGV do
  out[i] = redis.call('GET', ARGV[1] .. 'unread:' .. epoch .. ':' .. ARGV[i]) or false
end
return out
";

/// Stores a rebuilt count only if the lease is still ours and no writer is
/// mid-transaction. ARGV: prefix, epoch, user, token, count, ttl ms.
const STORE_IF_LEASED: &str = r"
local count_key = ARGV[1] .. 'unread:' .. ARGV[2] .. ':' .. ARGV[3]
local lease_key = count_key .. ':lease'
if redis.call('GET', lease_key) == ARGV[4] then
  redis.call('DEL', lease_key)
  if redis.call('EXISTS', ARGV[1] .. 'unread:' .. ARGV[3] .. ':dirty') == 0 then
    redis.call('SET', count_key, ARGV[5], 'PX', ARGV[6])
    return 1
  end
end
return 0
";

/// Deletes the current epoch's counts and leases. ARGV: prefix, users...
const INVALIDATE: &str = r"
local epoch = redis.call('GET', ARGV[1] .. 'ann:epoch') or '0'
for i = 2, #ARGV do
  local key = ARGV[1] .. 'unread:' .. epoch .. ':' .. ARGV[i]
  redis.call('DEL', key, key .. ':lease')
end
return 1
";

/// Moves a user's dirty marker by ARGV[3] (+1 or -1) and invalidates.
/// ARGV: prefix, user, delta, dirty ttl ms.
const CHANGE: &str = r"
local dirty = ARGV[1] .. 'unread:' .. ARGV[2] .. ':dirty'
if tonumber(ARGV[3]) > 0 then
  redis.call('INCR', dirty)
  redis.call('PEXPIRE', dirty, ARGV[4])
elseif redis.call('DECR', dirty) <= 0 then
  redis.call('DEL', dirty)
end
local epoch = redis.call('GET', ARGV[1] .. 'ann:epoch') or '0'
local key = ARGV[1] .. 'unread:' .. epoch .. ':' .. ARGV[2]
redis.call('DEL', key, key .. ':lease')
return 1
";

/// ARGV: prefix. Returns the epoch and that epoch's cached active list or nil.
const ACTIVE_LIST: &str = r"
local epoch = redis.call('GET', ARGV[1] .. 'ann:epoch') or '0'
return { epoch, redis.call('GET', ARGV[1] .. 'ann:active:' .. epoch) or false }
";

/// The badge scripts, loaded once per connection.
#[derive(Clone)]
pub(super) struct Scripts {
    get_counts: Script,
    store_if_leased: Script,
    invalidate: Script,
    change: Script,
    active_list: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            get_counts: Script::new(GET_COUNTS),
            store_if_leased: Script::new(STORE_IF_LEASED),
            invalidate: Script::new(INVALIDATE),
            change: Script::new(CHANGE),
            active_list: Script::new(ACTIVE_LIST),
        }
    }
}

/// Cached counts of some users under the epoch they were read at.
#[derive(Debug, Clone)]
pub struct CachedCounts {
    /// The announcement epoch.
    pub epoch: u64,
    /// Each user's cached count, `None` on a miss.
    pub counts: Vec<Option<u64>>,
}

/// A rebuilt count to store: user, lease token, count, TTL in ms.
#[derive(Debug, Clone, Copy)]
pub struct RebuiltCount {
    /// The user.
    pub user_id: u64,
    /// The lease token taken before counting.
    pub token: u64,
    /// The count read from MySQL.
    pub count: u64,
    /// How long it may be cached.
    pub ttl_ms: u64,
}

impl Cache {
    /// Reads the epoch and users' cached counts in one round trip.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_counts(&self, user_ids: &[u64]) -> Result<CachedCounts> {
        let mut conn = self.conn.clone();
        let mut invocation = self.badge.get_counts.arg(&self.prefix);
        for user_id in user_ids {
            invocation.arg(*user_id);
        }
        let (epoch, counts): (u64, Vec<Option<u64>>) = {
            let mut values: Vec<Option<u64>> = invocation.invoke_async(&mut conn).await?;
            let epoch = if values.is_empty() { 0 } else { values.remove(0).unwrap_or(0) };
            (epoch, values)
        };
        Ok(CachedCounts { epoch, counts })
    }

    /// Takes rebuild leases for users under `epoch`; returns the tokens.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn take_leases(&self, epoch: u64, user_ids: &[u64]) -> Result<Vec<u64>> {
        let tokens: Vec<u64> = user_ids.iter().map(|_| rand::random::<u64>() | 1).collect();
        let mut pipe = redis::pipe();
        for (user_id, token) in user_ids.iter().zip(&tokens) {
            pipe.set_options(
                format!("{}unread:{epoch}:{user_id}:lease", self.prefix),
                *token,
                redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(LEASE_MS)),
            )
            .ignore();
        }
        let mut conn = self.conn.clone();
        pipe.query_async::<()>(&mut conn).await?;
        Ok(tokens)
    }

    /// Stores rebuilt counts where the leases still hold.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn store_counts(&self, epoch: u64, entries: &[RebuiltCount]) -> Result<()> {
        let mut conn = self.conn.clone();
        for entry in entries {
            self.badge
                .store_if_leased
                .arg(&self.prefix)
                .arg(epoch)
                .arg(entry.user_id)
                .arg(entry.token)
                .arg(entry.count)
                .arg(entry.ttl_ms.max(1))
                .invoke_async::<i64>(&mut conn)
                .await?;
        }
        Ok(())
    }

    /// Deletes users' cached counts and leases (after their items changed).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn invalidate_counts(&self, user_ids: &[u64]) -> Result<()> {
        if user_ids.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let mut invocation = self.badge.invalidate.arg(&self.prefix);
        for user_id in user_ids {
            invocation.arg(*user_id);
        }
        invocation.invoke_async::<i64>(&mut conn).await?;
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
            .arg(&self.prefix)
            .arg(user_id)
            .arg(delta)
            .arg(DIRTY_MS)
            .invoke_async::<i64>(&mut conn)
            .await?;
        Ok(())
    }

    /// Retires every cached badge (an announcement started or was cancelled).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn bump_announcement_epoch(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        Ok(conn.incr(format!("{}ann:epoch", self.prefix), 1).await?)
    }

    /// Reads the announcement epoch and that epoch's cached active list
    /// (if any) in one round trip: every inbox read asks.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_announcements(&self) -> Result<(u64, Option<String>)> {
        let mut conn = self.conn.clone();
        let (epoch, list): (u64, Option<String>) =
            self.badge.active_list.arg(&self.prefix).invoke_async(&mut conn).await?;
        Ok((epoch, list))
    }

    /// Caches the active-announcement list of an epoch.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn store_announcements(&self, epoch: u64, json: &str, ttl_secs: u64) -> Result<()> {
        let mut conn = self.conn.clone();
        conn.set_ex::<_, _, ()>(
            format!("{}ann:active:{epoch}", self.prefix),
            json,
            ttl_secs.max(1),
        )
        .await?;
        Ok(())
    }
}
