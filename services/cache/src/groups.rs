//! Cached group seqs and member cursors, so that group unread counts are
//! answered from Redis without touching MySQL.
//!
//! # Protocol
//!
//! Keys (under `redis.key_prefix`, see [`super::Keys`]):
//! - `{g:ID}:seq`: the group's seq state, `max` or `max:r1,r2` with the
//!   seqs of its recalled messages ([`GroupSeq`]). Both parts only grow, so
//!   every writer merges (`max(cached, new)`, the union of the recalled
//!   seqs): while the key exists, a late or stale write cannot lower the max
//!   or bring a recalled message back. Only a miss creates the key: the
//!   reader takes a fill lease (`{g:ID}:seq:lease`) before it reads MySQL
//!   and stores the state only if the key is still missing and the lease
//!   still holds its token ([`Cache::fill_group_seqs`]). Every write after
//!   a commit (a send's raise of the max, a recall's whole state) merges
//!   into the key where it exists and, where it does not, ends the lease,
//!   so a fill that read before that commit is not cached and the next
//!   reader fills again. The key is behind MySQL only when the write after
//!   a commit failed: the api then merges the group's state from MySQL into
//!   the key once Redis answers ([`Cache::raise_group_seqs`]), so this lasts
//!   past the outage only if that api dies first, and then at most until
//!   the key's TTL (`groups.seq_cache_ttl_secs`) or the group's next send
//!   or recall. Unread counts are then off by those messages, never
//!   negative; pulls and acks never trust it (an ack above it re-reads
//!   MySQL).
//! - `{u:ID}:gmem`: a hash of the user's groups, `group -> last_ack_seq`,
//!   plus a `_` field so a user without groups is cached too. It is a copy of
//!   the user's `group_members` rows, guarded exactly like badges (see
//!   [`super::badge`]): a reader that misses takes a lease
//!   (`{u:ID}:gmem:lease`), reads MySQL, and stores only if the lease still
//!   holds and no writer is between begin and end; writers (ack, add,
//!   remove) invalidate and count themselves into `{u:ID}:gmem:dirty` before
//!   their commit and out after it. Cursors can also move backwards (a member
//!   removed and added again with history), so acks are not merged, they
//!   invalidate like every other change.
//!
//! `GetUnreadCount` reads the inbox badge, the cursors and their groups' max
//! seqs together. On one node that is one script call, so a badge with
//! groups is still one Redis round trip. On a cluster a user's badge and
//! cursors share the user's slot but the epoch and the seqs do not: the
//! script reads each slot's users, the epoch is read beside it, and the
//! seqs of the groups found follow in a second round trip.

use std::collections::HashMap;
use tracing::instrument;

use futures::future::try_join_all;
use redis::{AsyncCommands, Script};

use notify_domain::domain::{GroupCursor, GroupSeq};

use super::near::Held;
use super::values::{
    CachedCounts, CachedGroup, CachedUserState, count_at, cursor_value, parse_cursor,
};
use super::{Cache, DIRTY_MS, Keys, cache_error};
use notify_domain::error::{Error, Result};

/// Users per invalidation script call (a script blocks Redis while it runs).
const USERS_PER_CALL: usize = 1000;

/// Everything the badges of some users show. KEYS: each user's badge and
/// cursors (`{u:ID}:unread`, `{u:ID}:gmem`). ARGV: the epoch key, what group
/// seq keys start with and end with; all empty on a cluster (other slots:
/// the caller reads them). Returns the epoch (or ''), then per user: the
/// cached `epoch:count` or '', '1' when the user's cursors are cached (else
/// '0'), the number of groups n, then n `group, ack, seq or ''` triples.
const USER_STATES: &str = r"
local out = { '' }
if ARGV[1] ~= '' then
  out[1] = redis.call('GET', ARGV[1]) or '0'
end
for u = 1, #KEYS, 2 do
  local badge = redis.call('GET', KEYS[u]) or ''
  local entries = redis.call('HGETALL', KEYS[u + 1])
  local groups = {}
  for i = 1, #entries, 2 do
    if entries[i] ~= '_' then
      groups[#groups + 1] = entries[i]
      groups[#groups + 1] = entries[i + 1]
      local seq = ''
      if ARGV[2] ~= '' then
        seq = redis.call('GET', ARGV[2] .. entries[i] .. ARGV[3]) or ''
      end
      groups[#groups + 1] = seq
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
/// mid-change. KEYS: cursors, lease, dirty. ARGV: token, ttl ms, then
/// `group, ack` pairs.
const STORE_MEMBERSHIPS: &str = r"
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], '_', '1')
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// Moves users' dirty markers by ARGV[1] (+1 or -1) and invalidates their
/// memberships. KEYS: per user, cursors, dirty, lease. ARGV: delta, dirty
/// ttl ms.
const CHANGE_MEMBERSHIPS: &str = r"
for i = 1, #KEYS, 3 do
  local dirty = KEYS[i + 1]
  if tonumber(ARGV[1]) > 0 then
    redis.call('INCR', dirty)
    redis.call('PEXPIRE', dirty, ARGV[2])
  elseif redis.call('DECR', dirty) <= 0 then
    redis.call('DEL', dirty)
  end
  redis.call('DEL', KEYS[i], KEYS[i + 2])
end
return 1
";

/// Merges seq states into the cached ones (the larger max, the union of
/// the recalled seqs; numbers stay strings, so no seq passes through a
/// double's formatting). KEYS: per group its seq key, then its fill lease.
/// ARGV: ttl secs, what to do with a group not cached (`raise`: leave it
/// so, and end any fill's lease, since that fill read MySQL before this
/// write's commit; `fill`: cache the whole state only while the lease holds
/// the token), then per group its encoded state and token ('' but for a
/// fill).
const RAISE_SEQS: &str = r"
local function parse(value)
  local max, list = string.match(value, '^(%d+):?([%d,]*)$')
  local seqs = {}
  for seq in string.gmatch(list or '', '%d+') do
    seqs[#seqs + 1] = seq
  end
  return max, seqs
end
for i = 1, #KEYS / 2 do
  local key, lease = KEYS[2 * i - 1], KEYS[2 * i]
  local new, token = ARGV[2 * i + 1], ARGV[2 * i + 2]
  local current = redis.call('GET', key)
  local max, seqs
  if current then
    max, seqs = parse(current)
  end
  if not max then
    if ARGV[2] == 'fill' and redis.call('GET', lease) == token then
      redis.call('SET', key, new, 'EX', ARGV[1])
    elseif ARGV[2] == 'raise' then
      redis.call('DEL', lease)
    end
  else
    local new_max, new_seqs = parse(new)
    local changed = false
    if tonumber(new_max) > tonumber(max) then
      max = new_max
      changed = true
    end
    local held = {}
    for _, seq in ipairs(seqs) do
      held[seq] = true
    end
    for _, seq in ipairs(new_seqs) do
      if not held[seq] then
        held[seq] = true
        seqs[#seqs + 1] = seq
        changed = true
      end
    end
    if changed then
      table.sort(seqs, function(a, b) return tonumber(a) < tonumber(b) end)
      local value = max
      if #seqs > 0 then
        value = max .. ':' .. table.concat(seqs, ',')
      end
      redis.call('SET', key, value, 'EX', ARGV[1])
    end
  end
end
return 1
";

/// What [`RAISE_SEQS`] does with a group whose seq state is not cached.
#[derive(Debug, Clone, Copy)]
enum Uncached {
    /// Leaves it so, ending any fill's lease (a write after its commit:
    /// a send's, a recall's, a repair's).
    Raise,
    /// Caches the whole state read from MySQL while the fill's lease holds.
    Fill,
}

impl Uncached {
    fn arg(self) -> &'static str {
        match self {
            Uncached::Raise => "raise",
            Uncached::Fill => "fill",
        }
    }
}

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

impl Cache {
    /// Reads a user's cached badge, cursors and their groups' max seqs. Reads
    /// of many users waiting at the same moment share one round trip (see
    /// [`super::coalesce`]).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_user_state(&self, user_id: u64) -> Result<CachedUserState> {
        if let Some(state) = self.near.as_ref().and_then(|near| near.user_state(user_id)) {
            notify_domain::hot_counter!("notify_near_cache_hits_total").increment(1);
            return Ok(state);
        }
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
        let tokens = self.take_lease_keys(vec![self.keys.memberships_lease(user_id)], 1).await?;
        tokens.first().copied().ok_or_else(|| Error::Internal("no lease token".to_owned()))
    }

    /// Stores a user's memberships (`group -> last_ack_seq`) read from MySQL
    /// under the lease `token`; returns false when the lease was lost.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn store_memberships(
        &self,
        user_id: u64,
        token: u64,
        memberships: &[GroupCursor],
        ttl_secs: u64,
    ) -> Result<bool> {
        let mut conn = self.conn.clone();
        let mut invocation = self.groups.store_memberships.prepare_invoke();
        invocation
            .key(self.keys.memberships(user_id))
            .key(self.keys.memberships_lease(user_id))
            .key(self.keys.memberships_dirty(user_id))
            .arg(token)
            .arg(ttl_secs.max(1) * 1000);
        for membership in memberships {
            invocation
                .arg(membership.group_id)
                .arg(cursor_value(membership.last_ack_seq, membership.muted));
        }
        let stored: i64 = invocation.invoke_async(&mut conn).await.map_err(cache_error)?;
        self.forget_near([Held::Cursors(user_id)]);
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

    /// Deletes users' cached group cursors and their rebuild leases (a
    /// write Redis missed is repaired so: `notify_core::repair`).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn invalidate_memberships(&self, user_ids: &[u64]) -> Result<()> {
        let groups = self.by_slot(user_ids.iter().copied(), USERS_PER_CALL, |user_id| {
            self.keys.memberships(*user_id)
        });
        let calls = groups.into_iter().map(|group| {
            let mut del = redis::cmd("DEL");
            for user_id in group {
                del.arg(self.keys.memberships(user_id)).arg(self.keys.memberships_lease(user_id));
            }
            let mut conn = self.conn.clone();
            async move { del.query_async::<()>(&mut conn).await }
        });
        try_join_all(calls).await.map_err(cache_error)?;
        self.forget_near(user_ids.iter().map(|user_id| Held::Cursors(*user_id)));
        Ok(())
    }

    async fn change_memberships(&self, user_ids: &[u64], delta: i64) -> Result<()> {
        let groups = self.by_slot(user_ids.iter().copied(), USERS_PER_CALL, |user_id| {
            self.keys.memberships(*user_id)
        });
        let calls = groups.into_iter().map(|group| {
            let mut invocation = self.groups.change_memberships.prepare_invoke();
            for user_id in group {
                invocation
                    .key(self.keys.memberships(user_id))
                    .key(self.keys.memberships_dirty(user_id))
                    .key(self.keys.memberships_lease(user_id));
            }
            invocation.arg(delta).arg(DIRTY_MS);
            let mut conn = self.conn.clone();
            async move { invocation.invoke_async::<i64>(&mut conn).await }
        });
        try_join_all(calls).await.map_err(cache_error)?;
        self.forget_near(user_ids.iter().map(|user_id| Held::Cursors(*user_id)));
        Ok(())
    }

    /// Merges whole seq states as of a commit (a recall's, or read from
    /// MySQL by the repair after a failed write) into the cached ones only:
    /// a group not cached stays so (its next reader fills it from MySQL),
    /// and any fill of it under way, which read before the commit, is not
    /// cached.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn raise_group_seqs(
        &self,
        seqs: &HashMap<u64, GroupSeq>,
        ttl_secs: u64,
    ) -> Result<()> {
        let encoded = seqs.iter().map(|(id, seq)| (*id, seq.encode(), String::new())).collect();
        self.merge_group_seqs(encoded, ttl_secs, Uncached::Raise).await
    }

    /// Takes the fill leases of groups about to be read from MySQL (the
    /// token per group): a send's raise that finds a group uncached ends
    /// its lease, so a state read before that send's commit is not cached.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn take_seq_leases(&self, group_ids: &[u64]) -> Result<HashMap<u64, u64>> {
        let keys = group_ids.iter().map(|group_id| self.keys.group_seq_lease(*group_id)).collect();
        let tokens = self.take_lease_keys(keys, USERS_PER_CALL).await?;
        Ok(group_ids.iter().copied().zip(tokens).collect())
    }

    /// Caches whole seq states read from MySQL under the fill leases
    /// `tokens` ([`Self::take_seq_leases`]): merged where cached, stored
    /// where not only while the group's lease still holds its token.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn fill_group_seqs(
        &self,
        seqs: &HashMap<u64, GroupSeq>,
        tokens: &HashMap<u64, u64>,
        ttl_secs: u64,
    ) -> Result<()> {
        let encoded = seqs
            .iter()
            .filter_map(|(id, seq)| Some((*id, seq.encode(), tokens.get(id)?.to_string())))
            .collect();
        self.merge_group_seqs(encoded, ttl_secs, Uncached::Fill).await
    }

    /// Raises a group's cached max seq after a send; a group not cached
    /// stays uncached, and any fill of it under way is not cached (it read
    /// MySQL before this send).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn raise_cached_max_seq(
        &self,
        group_id: u64,
        max_seq: u64,
        ttl_secs: u64,
    ) -> Result<()> {
        let raised = vec![(group_id, max_seq.to_string(), String::new())];
        self.merge_group_seqs(raised, ttl_secs, Uncached::Raise).await
    }

    /// Runs [`RAISE_SEQS`] over `(group, encoded state, token)`s.
    async fn merge_group_seqs(
        &self,
        seqs: Vec<(u64, String, String)>,
        ttl_secs: u64,
        uncached: Uncached,
    ) -> Result<()> {
        let groups = self.by_slot(seqs.iter(), USERS_PER_CALL, |(group_id, _, _)| {
            self.keys.group_seq(*group_id)
        });
        let calls = groups.into_iter().map(|group| {
            let mut invocation = self.groups.raise_seqs.prepare_invoke();
            invocation.arg(ttl_secs.max(1)).arg(uncached.arg());
            for (group_id, seq, token) in group {
                invocation
                    .key(self.keys.group_seq(*group_id))
                    .key(self.keys.group_seq_lease(*group_id))
                    .arg(seq)
                    .arg(token);
            }
            let mut conn = self.conn.clone();
            async move { invocation.invoke_async::<i64>(&mut conn).await }
        });
        try_join_all(calls).await.map_err(cache_error)?;
        self.forget_near(seqs.iter().map(|(group_id, _, _)| Held::Seq(*group_id)));
        Ok(())
    }

    /// Reads one group's cached seq state.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_group_seq(&self, group_id: u64) -> Result<Option<GroupSeq>> {
        let mut conn = self.conn.clone();
        let value: Option<String> =
            conn.get(self.keys.group_seq(group_id)).await.map_err(cache_error)?;
        Ok(value.as_deref().and_then(GroupSeq::parse))
    }

    /// Reads the cached state of `user_ids`, in input order: one script call
    /// on a single node; on a cluster, one per slot beside the epoch, then
    /// the seqs of the groups found (each round concurrently).
    pub(super) async fn read_user_states(&self, user_ids: &[u64]) -> Result<Vec<CachedUserState>> {
        if let Some(near) = &self.near {
            match near.read_user_states(user_ids).await {
                Ok(Some(states)) => {
                    notify_domain::hot_counter!("notify_near_cache_misses_total")
                        .increment(user_ids.len() as u64);
                    return Ok(states);
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "near cache read failed, reading redis"),
            }
        }
        if !self.is_cluster() {
            let flat = self.user_states_call(user_ids, true).await?;
            return parse_user_states(&flat, user_ids.len(), None);
        }
        let slots = self.by_slot(user_ids.iter().copied(), user_ids.len(), |user_id| {
            self.keys.unread(*user_id)
        });
        let calls = slots.iter().map(|users| async move {
            let flat = self.user_states_call(users, false).await?;
            Ok::<_, Error>((users, flat))
        });
        let mut conn = self.conn.clone();
        let epoch =
            async { conn.get::<_, Option<u64>>(self.keys.epoch()).await.map_err(cache_error) };
        let (epoch, replies) = futures::try_join!(epoch, try_join_all(calls))?;
        let epoch = epoch.unwrap_or(0);
        let mut states: HashMap<u64, CachedUserState> = HashMap::with_capacity(user_ids.len());
        for (users, flat) in replies {
            let parsed = parse_user_states(&flat, users.len(), Some(epoch))?;
            states.extend(users.iter().copied().zip(parsed));
        }
        let mut groups: Vec<u64> = states
            .values()
            .flat_map(|state| state.groups.iter().flatten().map(|group| group.group_id))
            .collect();
        groups.sort_unstable();
        groups.dedup();
        if !groups.is_empty() {
            let keys: Vec<String> =
                groups.iter().map(|group| self.keys.group_seq(*group)).collect();
            let mut conn = self.conn.clone();
            let seqs: Vec<Option<String>> = conn.mget(keys).await.map_err(cache_error)?;
            let seqs: HashMap<u64, Option<GroupSeq>> = groups
                .into_iter()
                .zip(seqs)
                .map(|(group, seq)| (group, seq.as_deref().and_then(GroupSeq::parse)))
                .collect();
            for group in states.values_mut().flat_map(|state| state.groups.iter_mut().flatten()) {
                group.seq = seqs.get(&group.group_id).cloned().flatten();
            }
        }
        user_ids
            .iter()
            .map(|user_id| {
                let missing =
                    || Error::Internal(format!("no cached state read for user {user_id}"));
                states.get(user_id).cloned().ok_or_else(missing)
            })
            .collect()
    }

    /// One call of [`USER_STATES`]; `whole_node` lets it read the epoch and
    /// the group seqs too (keys of other slots: only on a single node).
    async fn user_states_call(&self, user_ids: &[u64], whole_node: bool) -> Result<Vec<String>> {
        let mut invocation = self.groups.user_states.prepare_invoke();
        for user_id in user_ids {
            invocation.key(self.keys.unread(*user_id)).key(self.keys.memberships(*user_id));
        }
        if whole_node {
            invocation
                .arg(self.keys.epoch())
                .arg(self.keys.group_seq_prefix())
                .arg(Keys::GROUP_SEQ_SUFFIX);
        } else {
            invocation.arg("").arg("").arg("");
        }
        let mut conn = self.conn.clone();
        invocation.invoke_async(&mut conn).await.map_err(cache_error)
    }
}

/// Splits the flat reply of [`USER_STATES`] into one state per user; the
/// badges count under `epoch`, or the epoch the reply starts with.
fn parse_user_states(
    flat: &[String],
    users: usize,
    epoch: Option<u64>,
) -> Result<Vec<CachedUserState>> {
    let malformed = || Error::Internal("malformed reply of the user state script".to_owned());
    let mut fields = flat.iter().map(String::as_str);
    let read_epoch = fields.next().ok_or_else(malformed)?.parse().unwrap_or(0);
    let epoch = epoch.unwrap_or(read_epoch);
    let mut states = Vec::with_capacity(users);
    for _ in 0..users {
        let badge = count_at(Some(fields.next().ok_or_else(malformed)?), epoch);
        let cursors_cached = fields.next().ok_or_else(malformed)? == "1";
        let count: usize = fields.next().ok_or_else(malformed)?.parse().map_err(|_| malformed())?;
        let mut groups = Vec::with_capacity(count);
        for _ in 0..count {
            let (group, ack, seq) = (fields.next(), fields.next(), fields.next());
            let (Some(group), Some(ack), Some(seq)) = (group, ack, seq) else {
                return Err(malformed());
            };
            if let Some((group_id, last_ack_seq, muted)) = parse_cursor(group, ack) {
                let seq = GroupSeq::parse(seq);
                groups.push(CachedGroup { group_id, last_ack_seq, seq, muted });
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
        let flat = strings(&[
            "7", "7:3:2", "1", "2", "10", "4", "9:3,5", "11", "5:m", "", "6:8:8", "0", "0",
        ]);
        let states = parse_user_states(&flat, 2, None).unwrap();
        assert_eq!(states.len(), 2);
        assert_eq!(states[0].badge.epoch, 7);
        assert_eq!(states[0].badge.counts, vec![Some(crate::Counts { unread: 3, unseen: 2 })]);
        assert_eq!(
            states[0].groups,
            Some(vec![
                CachedGroup {
                    group_id: 10,
                    last_ack_seq: 4,
                    seq: Some(GroupSeq { max_seq: 9, recalled: vec![3, 5] }),
                    muted: false
                },
                CachedGroup { group_id: 11, last_ack_seq: 5, seq: None, muted: true },
            ])
        );
        assert_eq!(states[1].badge.counts, vec![None]);
        assert_eq!(states[1].groups, None);
    }

    #[test]
    fn truncated_user_states_are_an_error() {
        let flat = strings(&["0", "1", "1", "2", "10", "4"]);
        assert!(parse_user_states(&flat, 1, None).is_err());
        assert!(parse_user_states(&strings(&["0"]), 1, None).is_err());
    }
}
