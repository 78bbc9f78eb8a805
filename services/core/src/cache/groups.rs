//! Cached group seqs and member cursors, so that group unread counts are
//! answered from Redis without touching MySQL.
//!
//! # Protocol
//!
//! Keys (under `redis.key_prefix`):
//! - `gseq:{group}`: the group's max seq. Seqs only grow, so every writer
//!   merges with `max(cached, new)`: while the key exists, a late or stale
//!   write cannot lower it. A send raises it after commit; a miss is filled
//!   from MySQL. It can be low in two cases, both bounded by its TTL
//!   (`groups.seq_cache_ttl_secs`) or the group's next send: the raise after
//!   a commit failed, or the key vanished (flush, expiry) between a late
//!   writer's read and its write. Unread counts are then briefly low, never
//!   negative; pulls and acks never trust it (an ack above it re-reads
//!   MySQL).
//! - `gmem:{user}`: a hash of the user's groups, `group -> last_ack_seq`,
//!   plus a `_` field so a user without groups is cached too. It is a copy of
//!   the user's `group_members` rows, guarded exactly like badges (see
//!   [`super::badge`]): a reader that misses takes a lease
//!   (`gmem:{user}:lease`), reads MySQL, and stores only if the lease still
//!   holds and no writer is between begin and end; writers (ack, add,
//!   remove) invalidate and count themselves into `gmem:{user}:dirty` before
//!   their commit and out after it. Cursors can also move backwards (a member
//!   removed and added again with history), so acks are not merged, they
//!   invalidate like every other change.
//!
//! `GetUnreadCount` reads the inbox badge, the cursors and their groups' max
//! seqs in one script, so a badge with groups is still one Redis round trip.

use std::collections::HashMap;

use redis::Script;

use super::{Cache, CachedCounts, DIRTY_MS, LEASE_MS};
use crate::error::Result;

/// Users per invalidation script call (a script blocks Redis while it runs).
const USERS_PER_CALL: usize = 1000;

/// Everything a badge shows, in one round trip. ARGV: prefix, user. Returns
/// the announcement epoch, the cached badge or '', '1' when the user's
/// cursors are cached (else '0'), then `group, ack, seq or ''` triples.
const USER_STATE: &str = r"
local epoch = redis.call('GET', ARGV[1] .. 'ann:epoch') or '0'
local badge = redis.call('GET', ARGV[1] .. 'unread:' .. epoch .. ':' .. ARGV[2]) or ''
local entries = redis.call('HGETALL', ARGV[1] .. 'gmem:' .. ARGV[2])
local out = { epoch, badge, #entries > 0 and '1' or '0' }
for i = 1, #entries, 2 do
  if entries[i] ~= '_' then
    out[#out + 1] = entries[i]
    out[#out + 1] = entries[i + 1]
    out[#out + 1] = redis.call('GET', ARGV[1] .. 'gseq:' .. entries[i]) or ''
  end
end
return out
";

/// Stores a user's memberships if the lease still holds and no writer is
/// mid-change. ARGV: prefix, user, token, ttl ms, then `group, ack` pairs.
const STORE_MEMBERSHIPS: &str = r"
local key = ARGV[1] .. 'gmem:' .. ARGV[2]
local lease = key .. ':lease'
if redis.call('GET', lease) ~= ARGV[3] then
  return 0
end
redis.call('DEL', lease)
if redis.call('EXISTS', key .. ':dirty') == 1 then
  return 0
end
redis.call('DEL', key)
redis.call('HSET', key, '_', '1')
for i = 5, #ARGV, 2 do
  redis.call('HSET', key, ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', key, ARGV[4])
return 1
";

/// Moves users' dirty markers by ARGV[2] (+1 or -1) and invalidates their
/// memberships. ARGV: prefix, delta, dirty ttl ms, users...
const CHANGE_MEMBERSHIPS: &str = r"
for i = 4, #ARGV do
  local key = ARGV[1] .. 'gmem:' .. ARGV[i]
  local dirty = key .. ':dirty'
  if tonumber(ARGV[2]) > 0 then
    redis.call('INCR', dirty)
    redis.call('PEXPIRE', dirty, ARGV[3])
  elseif redis.call('DECR', dirty) <= 0 then
    redis.call('DEL', dirty)
  end
  redis.call('DEL', key, key .. ':lease')
end
return 1
";

/// Raises cached max seqs. ARGV: prefix, ttl secs, then `group, seq` pairs.
const RAISE_SEQS: &str = r"
for i = 3, #ARGV, 2 do
  local key = ARGV[1] .. 'gseq:' .. ARGV[i]
  local current = redis.call('GET', key)
  if not current or tonumber(ARGV[i + 1]) > tonumber(current) then
    redis.call('SET', key, ARGV[i + 1], 'EX', ARGV[2])
  end
end
return 1
";

/// The group scripts, loaded once per connection.
#[derive(Clone)]
pub(super) struct Scripts {
    user_state: Script,
    store_memberships: Script,
    change_memberships: Script,
    raise_seqs: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            user_state: Script::new(USER_STATE),
            store_memberships: Script::new(STORE_MEMBERSHIPS),
            change_memberships: Script::new(CHANGE_MEMBERSHIPS),
            raise_seqs: Script::new(RAISE_SEQS),
        }
    }
}

/// One of a user's groups as cached: the cursor, and the max seq if cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedGroup {
    /// The group.
    pub group_id: u64,
    /// The user's acknowledged seq.
    pub last_ack_seq: u64,
    /// The group's max seq, `None` on a miss.
    pub max_seq: Option<u64>,
}

/// A user's cached badge and group cursors.
#[derive(Debug, Clone)]
pub struct CachedUserState {
    /// The inbox badge (one entry) under the epoch it was read at.
    pub badge: CachedCounts,
    /// The user's groups, `None` when their cursors are not cached.
    pub groups: Option<Vec<CachedGroup>>,
}

impl Cache {
    /// Reads a user's cached badge, cursors and their groups' max seqs in
    /// one round trip.
    pub async fn cached_user_state(&self, user_id: u64) -> Result<CachedUserState> {
        let mut conn = self.conn.clone();
        let flat: Vec<String> =
            self.groups.user_state.arg(&self.prefix).arg(user_id).invoke_async(&mut conn).await?;
        let field = |i: usize| flat.get(i).map(String::as_str).unwrap_or_default();
        let groups = (field(2) == "1").then(|| {
            flat.get(3..)
                .unwrap_or_default()
                .chunks_exact(3)
                .filter_map(|entry| {
                    Some(CachedGroup {
                        group_id: entry[0].parse().ok()?,
                        last_ack_seq: entry[1].parse().ok()?,
                        max_seq: entry[2].parse().ok(),
                    })
                })
                .collect()
        });
        Ok(CachedUserState {
            badge: CachedCounts {
                epoch: field(0).parse().unwrap_or(0),
                counts: vec![field(1).parse().ok()],
            },
            groups,
        })
    }

    /// Takes a lease to rebuild a user's cached memberships; returns the token.
    pub async fn take_membership_lease(&self, user_id: u64) -> Result<u64> {
        let token = rand::random::<u64>() | 1;
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(format!("{}gmem:{user_id}:lease", self.prefix))
            .arg(token)
            .arg("PX")
            .arg(LEASE_MS)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(token)
    }

    /// Stores a user's memberships (`group -> last_ack_seq`) read from MySQL
    /// under the lease `token`; returns false when the lease was lost.
    pub async fn store_memberships(
        &self,
        user_id: u64,
        token: u64,
        memberships: &[(u64, u64)],
        ttl_secs: u64,
    ) -> Result<bool> {
        let mut conn = self.conn.clone();
        let mut invocation = self.groups.store_memberships.arg(&self.prefix);
        invocation.arg(user_id).arg(token).arg(ttl_secs.max(1) * 1000);
        for (group_id, ack) in memberships {
            invocation.arg(*group_id).arg(*ack);
        }
        let stored: i64 = invocation.invoke_async(&mut conn).await?;
        Ok(stored == 1)
    }

    /// Before a membership or cursor change commits: invalidates the users'
    /// cached memberships and counts one more writer in their dirty markers.
    pub async fn begin_membership_change(&self, user_ids: &[u64]) -> Result<()> {
        self.change_memberships(user_ids, 1).await
    }

    /// After the change committed (or failed): counts the writer out and
    /// invalidates again.
    pub async fn end_membership_change(&self, user_ids: &[u64]) -> Result<()> {
        self.change_memberships(user_ids, -1).await
    }

    async fn change_memberships(&self, user_ids: &[u64], delta: i64) -> Result<()> {
        let mut conn = self.conn.clone();
        for batch in user_ids.chunks(USERS_PER_CALL) {
            let mut invocation = self.groups.change_memberships.arg(&self.prefix);
            invocation.arg(delta).arg(DIRTY_MS);
            for user_id in batch {
                invocation.arg(*user_id);
            }
            invocation.invoke_async::<i64>(&mut conn).await?;
        }
        Ok(())
    }

    /// Raises cached group max seqs to at least the given values.
    pub async fn raise_group_seqs(&self, seqs: &HashMap<u64, u64>, ttl_secs: u64) -> Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let mut invocation = self.groups.raise_seqs.arg(&self.prefix);
        invocation.arg(ttl_secs.max(1));
        for (group_id, seq) in seqs {
            invocation.arg(*group_id).arg(*seq);
        }
        invocation.invoke_async::<i64>(&mut conn).await?;
        Ok(())
    }

    /// Reads one group's cached max seq.
    pub async fn cached_group_seq(&self, group_id: u64) -> Result<Option<u64>> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("GET")
            .arg(format!("{}gseq:{group_id}", self.prefix))
            .query_async(&mut conn)
            .await?)
    }
}
