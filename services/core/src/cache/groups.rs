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
use tracing::instrument;

use redis::Script;

use super::{Cache, CachedCounts, DIRTY_MS, LEASE_MS};
use crate::error::{Error, Result};

/// Users per invalidation script call (a script blocks Redis while it runs).
const USERS_PER_CALL: usize = 1000;

/// Everything the badges of some users show, in one round trip. ARGV:
/// prefix, users... Returns the announcement epoch, then per user: the cached
/// badge or '', '1' when the user's cursors are cached (else '0'), the number
/// of groups n, then n `group, ack, seq or ''` triples.
const USER_STATES: &str = r"
local epoch = redis.call('GET', ARGV[1] .. 'ann:epoch') or '0'
local out = { epoch }
for u = 2, #ARGV do
  local badge = redis.call('GET', ARGV[1] .. 'unread:' .. epoch .. ':' .. ARGV[u]) or ''
  local entries = redis.call('HGETALL', ARGV[1] .. 'gmem:' .. ARGV[u])
  local groups = {}
  for i = 1, #entries, 2 do
    if entries[i] ~= '_' then
      groups[#groups + 1] = entries[i]
      groups[#groups + 1] = entries[i + 1]
      groups[#groups + 1] = redis.call('GET', ARGV[1] .. 'gseq:' .. entries[i]) or ''
    end
  end
  out[#out + 1] = badge
  out[#out + 1] = #entries > 0 and '1' or '0'
  out[#out + 1] = tostring(#groups / 3)
  for i = 1, #groups do
    out[#out + 1] = groups[i]
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
    pub(super) user_states: Script,
    store_memberships: Script,
    change_memberships: Script,
    raise_seqs: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            user_states: Script::new(USER_STATES),
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
    /// Reads a user's cached badge, cursors and their groups' max seqs. Reads
    /// of many users waiting at the same moment share one round trip (see
    /// [`super::coalesce`]).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_user_state(&self, user_id: u64) -> Result<CachedUserState> {
        self.user_state_reads.read(user_id).await
    }

    /// Returns how many [`Self::cached_user_state`] reads were served so far,
    /// and with how many Redis script calls.
    pub fn user_state_read_stats(&self) -> (u64, u64) {
        self.user_state_reads.stats()
    }

    /// Takes a lease to rebuild a user's cached memberships; returns the token.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
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
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
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
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn begin_membership_change(&self, user_ids: &[u64]) -> Result<()> {
        self.change_memberships(user_ids, 1).await
    }

    /// After the change committed (or failed): counts the writer out and
    /// invalidates again.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
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
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
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
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_group_seq(&self, group_id: u64) -> Result<Option<u64>> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("GET")
            .arg(format!("{}gseq:{group_id}", self.prefix))
            .query_async(&mut conn)
            .await?)
    }
}

/// Reads the cached state of `user_ids` with ONE script call, in input order.
pub(super) async fn read_user_states(
    conn: &mut redis::aio::ConnectionManager,
    script: &Script,
    prefix: &str,
    user_ids: &[u64],
) -> Result<Vec<CachedUserState>> {
    let mut invocation = script.arg(prefix);
    for user_id in user_ids {
        invocation.arg(*user_id);
    }
    let flat: Vec<String> = invocation.invoke_async(conn).await?;
    parse_user_states(&flat, user_ids.len())
}

/// Splits the flat reply of [`USER_STATES`] into one state per user.
fn parse_user_states(flat: &[String], users: usize) -> Result<Vec<CachedUserState>> {
    let malformed = || Error::Internal("malformed reply of the user state script".to_owned());
    let mut fields = flat.iter().map(String::as_str);
    let epoch = fields.next().ok_or_else(malformed)?.parse().unwrap_or(0);
    let mut states = Vec::with_capacity(users);
    for _ in 0..users {
        let badge = fields.next().ok_or_else(malformed)?.parse().ok();
        let cursors_cached = fields.next().ok_or_else(malformed)? == "1";
        let count: usize = fields.next().ok_or_else(malformed)?.parse().map_err(|_| malformed())?;
        let mut groups = Vec::with_capacity(count);
        for _ in 0..count {
            let (group, ack, seq) = (fields.next(), fields.next(), fields.next());
            let (Some(group), Some(ack), Some(seq)) = (group, ack, seq) else {
                return Err(malformed());
            };
            if let (Ok(group_id), Ok(last_ack_seq)) = (group.parse(), ack.parse()) {
                groups.push(CachedGroup { group_id, last_ack_seq, max_seq: seq.parse().ok() });
            }
        }
        states.push(CachedUserState {
            badge: CachedCounts { epoch, counts: vec![badge] },
            groups: cursors_cached.then_some(groups),
        });
    }
    Ok(states)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(fields: &[&str]) -> Vec<String> {
        fields.iter().map(|f| (*f).to_owned()).collect()
    }

    #[test]
    fn user_states_split_per_user_in_order() {
        let flat = strings(&["7", "3", "1", "2", "10", "4", "9", "11", "5", "", "", "0", "0"]);
        let states = parse_user_states(&flat, 2).unwrap();
        assert_eq!(states.len(), 2);
        assert_eq!(states[0].badge.epoch, 7);
        assert_eq!(states[0].badge.counts, vec![Some(3)]);
        assert_eq!(
            states[0].groups,
            Some(vec![
                CachedGroup { group_id: 10, last_ack_seq: 4, max_seq: Some(9) },
                CachedGroup { group_id: 11, last_ack_seq: 5, max_seq: None },
            ])
        );
        assert_eq!(states[1].badge.counts, vec![None]);
        assert_eq!(states[1].groups, None);
    }

    #[test]
    fn truncated_user_states_are_an_error() {
        let flat = strings(&["0", "1", "1", "2", "10", "4"]);
        assert!(parse_user_states(&flat, 1).is_err());
        assert!(parse_user_states(&strings(&["0"]), 1).is_err());
    }
}
