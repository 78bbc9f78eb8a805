//! The near cache: the api's own copy of the Redis keys badges are read
//! from, kept coherent by Redis itself (server-assisted client-side caching:
//! `CLIENT TRACKING` on a RESP3 connection), so a badge read that hits it
//! costs no round trip at all.
//!
//! # What it holds
//!
//! A copy of single keys, each exactly as Redis had it: the announcement
//! epoch, each user's cached badge (`{u:ID}:unread`) and group cursors
//! (`{u:ID}:gmem`), each group's max seq (`{g:ID}:seq`), absent keys
//! included. Nothing is derived: a badge answered from here is computed by
//! the same code, from the same values, as one read from Redis.
//!
//! # Why a copy is never stale for longer than an invalidation takes
//!
//! Keys are read on one connection of their own with tracking on; from then
//! on Redis sends that connection an `invalidate` push whenever one of them
//! changes, expires or is evicted, and a null one on `FLUSHALL`. Pushes are
//! applied synchronously by the connection's reader, in the order frames
//! arrive ([`redis::aio::AsyncPushSender`]), so a reply is handed to its
//! caller only after every push that preceded it was applied. A read marks
//! each key it will fill *pending* with its own token before it is sent and
//! stores what came back only where its token is still there: an
//! invalidation in between (a write after the read) removed the token, so a
//! value it made stale is never stored. Keys change in Redis only after the
//! MySQL commit they copy (see [`super::badge`]), so this copy is never
//! ahead of Redis and trails it by the push's flight.
//!
//! What bounds that flight:
//! - A write by this process evicts the keys it touched as soon as Redis
//!   acknowledged it, so this process reads its own writes.
//! - A heartbeat (`PING`) goes every quarter of `redis.near_cache_max_lag_ms`;
//!   a key is served from here only while the last acknowledged one was sent
//!   within that lag. A connection that stops answering (a partition, a
//!   black hole) therefore stops serving within the lag, never later.
//! - [`Near::sync`] waits for a `PING` sent after the call, which orders every
//!   push for writes made before it: callers that learned of a write through
//!   another channel (the event bus) read after it.
//! - A lost connection clears everything, and nothing is served until a new
//!   one has tracking on (a key read before that is read through Redis).
//! - Each copy also lapses at the key's own TTL (`PTTL`, read with it), in
//!   case Redis's expiry of an idle key is late.
//!
//! Used on a single node; a cluster (`redis.cluster = true`) reads Redis.

mod tables;
mod tracking;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{ProtocolVersion, Value};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::warn;

pub(super) use self::tables::Held;
use self::tables::{Slot, Tables};
use self::tracking::{Inner, maintain};
use super::values::{CachedCounts, CachedGroup, CachedUserState, count_at, parse_cursor};
use super::{Keys, cache_error};
use notify_domain::domain::GroupSeq;
use notify_domain::error::{Error, Result};
use notify_domain::settings::RedisSettings;

/// A handle on the near cache (cheap clone). The connection is opened by
/// the first read, so a process that never reads badges opens none.
#[derive(Clone)]
pub(super) struct Near {
    inner: Arc<Inner>,
    /// Cancels the maintenance task when the last owning handle goes.
    _owner: Option<Arc<DropGuard>>,
    stop: CancellationToken,
}

impl Near {
    /// A near cache per `redis.near_cache_users` (none when 0, or on a
    /// cluster).
    pub(super) fn new(settings: &RedisSettings, keys: Keys) -> Result<Option<Self>> {
        if settings.near_cache_users == 0 || settings.cluster {
            return Ok(None);
        }
        let client = super::client(settings, Some(ProtocolVersion::RESP3))?;
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            client,
            keys,
            capacity: settings.near_cache_users,
            max_lag: Duration::from_millis(settings.near_cache_max_lag_ms),
            born: Instant::now(),
            tables: Mutex::default(),
            conn: Mutex::default(),
            synced_ms: AtomicU64::new(0),
            started: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            lost: Mutex::new(CancellationToken::new()),
        });
        Ok(Some(Self { inner, _owner: Some(Arc::new(stop.clone().drop_guard())), stop }))
    }

    /// A handle that does not keep the cache's task alive (for tasks that
    /// themselves live as long as the cache's owners).
    pub(super) fn unowned(&self) -> Self {
        Self { _owner: None, ..self.clone() }
    }

    fn start(&self) {
        if !self.inner.started.load(Ordering::Acquire)
            && !self.inner.started.swap(true, Ordering::AcqRel)
        {
            tokio::spawn(maintain(self.inner.clone(), self.stop.clone()));
        }
    }

    /// A user's state from the copy, if every key of it is held, fresh and
    /// in sync (else the caller reads through [`Self::read_user_states`]).
    pub(super) fn user_state(&self, user_id: u64) -> Option<CachedUserState> {
        self.start();
        if !self.inner.in_sync() {
            return None;
        }
        self.inner.tables().user_state(user_id, Instant::now())
    }

    /// Users' counts from the copy, if the epoch and every user's count
    /// are held, fresh and in sync (else read [`Self::read_counts`]).
    pub(super) fn counts(&self, user_ids: &[u64]) -> Option<CachedCounts> {
        self.start();
        if !self.inner.in_sync() {
            return None;
        }
        let now = Instant::now();
        let tables = self.inner.tables();
        let epoch = *tables.epoch.as_ref()?.fresh(now)?;
        let counts = user_ids
            .iter()
            .map(|user| {
                let unread = tables.users.get(user)?.unread.as_ref()?.fresh(now)?;
                Some(count_at(unread.as_deref(), epoch))
            })
            .collect::<Option<_>>()?;
        Some(CachedCounts { epoch, counts })
    }

    /// Reads users' states on the tracking connection (their keys, then
    /// the seqs of their groups not held), keeping a copy of every key read
    /// that no invalidation overtook. `None` while there is no tracking
    /// connection: read Redis as usual.
    pub(super) async fn read_user_states(
        &self,
        user_ids: &[u64],
    ) -> Result<Option<Vec<CachedUserState>>> {
        self.start();
        let Some((mut conn, generation)) = self.inner.connection() else { return Ok(None) };
        let keys = &self.inner.keys;
        let token = self.claim(generation, |tables, token, now| {
            Slot::claim(&mut tables.epoch, token, now);
            for user in user_ids {
                let slots = tables.users.entry(*user).or_default();
                Slot::claim(&mut slots.unread, token, now);
                Slot::claim(&mut slots.cursors, token, now);
            }
        });
        let mut pipe = redis::pipe();
        pipe.get(keys.epoch());
        for user in user_ids {
            pipe.get(keys.unread(*user)).pttl(keys.unread(*user));
            pipe.hgetall(keys.memberships(*user)).pttl(keys.memberships(*user));
        }
        let sent = Instant::now();
        let replies: Vec<Value> = pipe.query_async(&mut conn).await.map_err(cache_error)?;
        let read = parse_reads(&replies, user_ids.len())?;

        // The seqs of every group found, from the copy where held.
        let mut wanted: Vec<u64> =
            read.users.iter().flat_map(|user| user.cursors.iter().flatten().map(|c| c.0)).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut seqs: HashMap<u64, Option<GroupSeq>> = HashMap::with_capacity(wanted.len());
        if let Some(mut tables) = self.tables_for(generation) {
            let now = Instant::now();
            wanted.retain(|group| {
                let held = tables.seqs.entry(*group).or_default();
                if let Some(seq) = held.as_ref().and_then(|slot| slot.fresh(now)) {
                    seqs.insert(*group, seq.clone());
                    return false;
                }
                Slot::claim(held, token, now);
                true
            });
        }
        let mut seq_expiry = Vec::with_capacity(wanted.len());
        if !wanted.is_empty() {
            let mut pipe = redis::pipe();
            for group in &wanted {
                pipe.get(keys.group_seq(*group)).pttl(keys.group_seq(*group));
            }
            let sent = Instant::now();
            let replies: Vec<Value> = pipe.query_async(&mut conn).await.map_err(cache_error)?;
            if replies.len() != 2 * wanted.len() {
                return Err(Error::Internal("malformed reply of a near cache read".to_owned()));
            }
            for (group, reply) in wanted.iter().zip(replies.chunks(2)) {
                let seq: Option<String> = from_value(reply[0].clone())?;
                let seq = seq.as_deref().and_then(GroupSeq::parse);
                let pttl: i64 = from_value(reply[1].clone())?;
                seqs.insert(*group, seq.clone());
                seq_expiry.push((*group, seq, expiry(sent, pttl)));
            }
        }

        if let Some(mut tables) = self.tables_for(generation) {
            Slot::fill(&mut tables.epoch, token, read.epoch, None);
            for (user, state) in user_ids.iter().zip(&read.users) {
                if let Some(slots) = tables.users.get_mut(user) {
                    let until = expiry(sent, state.unread_pttl);
                    Slot::fill(&mut slots.unread, token, state.unread.clone(), until);
                    let until = expiry(sent, state.cursors_pttl);
                    Slot::fill(&mut slots.cursors, token, state.cursors.clone(), until);
                }
            }
            for (group, seq, until) in seq_expiry {
                if let Some(held) = tables.seqs.get_mut(&group) {
                    Slot::fill(held, token, seq, until);
                }
            }
            Tables::trim(&mut tables.users, self.inner.capacity);
            Tables::trim(&mut tables.seqs, self.inner.capacity);
        }

        let states = read
            .users
            .into_iter()
            .map(|user| {
                let groups = user.cursors.map(|cursors| {
                    cursors
                        .into_iter()
                        .map(|(group_id, last_ack_seq, muted)| CachedGroup {
                            group_id,
                            last_ack_seq,
                            seq: seqs.get(&group_id).cloned().flatten(),
                            muted,
                        })
                        .collect()
                });
                let badge = CachedCounts {
                    epoch: read.epoch,
                    counts: vec![count_at(user.unread.as_deref(), read.epoch)],
                };
                CachedUserState { badge, groups }
            })
            .collect();
        Ok(Some(states))
    }

    /// Reads users' counts on the tracking connection, keeping a copy like
    /// [`Self::read_user_states`]; `None` while there is no tracking
    /// connection.
    pub(super) async fn read_counts(&self, user_ids: &[u64]) -> Result<Option<CachedCounts>> {
        self.start();
        let Some((mut conn, generation)) = self.inner.connection() else { return Ok(None) };
        let keys = &self.inner.keys;
        let token = self.claim(generation, |tables, token, now| {
            Slot::claim(&mut tables.epoch, token, now);
            for user in user_ids {
                Slot::claim(&mut tables.users.entry(*user).or_default().unread, token, now);
            }
        });
        let mut pipe = redis::pipe();
        pipe.get(keys.epoch());
        for user in user_ids {
            pipe.get(keys.unread(*user)).pttl(keys.unread(*user));
        }
        let sent = Instant::now();
        let replies: Vec<Value> = pipe.query_async(&mut conn).await.map_err(cache_error)?;
        let malformed = || Error::Internal("malformed reply of a near cache read".to_owned());
        let mut values = replies.into_iter();
        let epoch: Option<u64> = from_value(values.next().ok_or_else(malformed)?)?;
        let epoch = epoch.unwrap_or(0);
        let mut read = Vec::with_capacity(user_ids.len());
        for _ in user_ids {
            let unread: Option<String> = from_value(values.next().ok_or_else(malformed)?)?;
            let pttl: i64 = from_value(values.next().ok_or_else(malformed)?)?;
            read.push((unread, expiry(sent, pttl)));
        }
        let counts = read.iter().map(|(unread, _)| count_at(unread.as_deref(), epoch)).collect();
        if let Some(mut tables) = self.tables_for(generation) {
            Slot::fill(&mut tables.epoch, token, epoch, None);
            for (user, (unread, until)) in user_ids.iter().zip(read) {
                if let Some(slots) = tables.users.get_mut(user) {
                    Slot::fill(&mut slots.unread, token, unread, until);
                }
            }
            Tables::trim(&mut tables.users, self.inner.capacity);
        }
        Ok(Some(CachedCounts { epoch, counts }))
    }

    /// The announcement epoch and that epoch's cached active list, from
    /// the copy (`None` when not held, or out of sync).
    pub(super) fn announcements(&self) -> Option<(u64, Option<String>)> {
        self.start();
        if !self.inner.in_sync() {
            return None;
        }
        self.inner.tables().announcements(Instant::now())
    }

    /// Reads the epoch, then its active list, on the tracking connection,
    /// keeping a copy like [`Self::read_user_states`]; `None` while there
    /// is no tracking connection.
    pub(super) async fn read_announcements(&self) -> Result<Option<(u64, Option<String>)>> {
        self.start();
        let Some((mut conn, generation)) = self.inner.connection() else { return Ok(None) };
        let keys = &self.inner.keys;
        let token =
            self.claim(generation, |tables, token, now| Slot::claim(&mut tables.epoch, token, now));
        let epoch: Option<u64> = redis::cmd("GET")
            .arg(keys.epoch())
            .query_async(&mut conn)
            .await
            .map_err(cache_error)?;
        let epoch = epoch.unwrap_or(0);
        if let Some(mut tables) = self.tables_for(generation) {
            Slot::fill(&mut tables.epoch, token, epoch, None);
            Slot::claim(tables.active_slot(epoch), token, Instant::now());
        }
        let sent = Instant::now();
        let (list, pttl): (Option<String>, i64) = redis::pipe()
            .get(keys.active_list(epoch))
            .pttl(keys.active_list(epoch))
            .query_async(&mut conn)
            .await
            .map_err(cache_error)?;
        if let Some(mut tables) = self.tables_for(generation) {
            Slot::fill(tables.active_slot(epoch), token, list.clone(), expiry(sent, pttl));
        }
        Ok(Some((epoch, list)))
    }

    /// The tables, if they still belong to the tracking connection
    /// `generation` a read runs on (after a reconnect, Redis tracks that
    /// read's keys for the old connection only, so it must store nothing).
    fn tables_for(&self, generation: u64) -> Option<MutexGuard<'_, Tables>> {
        let tables = self.inner.tables();
        (tables.generation == generation).then_some(tables)
    }

    /// Takes a token and marks, under it, the slots `mark` names; token 0
    /// (which fills nothing) when the tables belong to another connection.
    fn claim(&self, generation: u64, mark: impl FnOnce(&mut Tables, u64, Instant)) -> u64 {
        self.inner.tables().claim(generation, mark)
    }

    /// Returns once every invalidation Redis sent for writes made before
    /// the call is applied (a `PING` on the tracking connection). If that
    /// fails, the copy is not served until a heartbeat confirms it again.
    pub(super) async fn sync(&self) {
        let Some((mut conn, _)) = self.inner.connection() else { return };
        if let Err(e) = redis::cmd("PING").query_async::<()>(&mut conn).await {
            self.inner.unsynced();
            warn!(error = %e, "near cache sync failed; badges read redis until it answers");
        }
    }

    /// Forgets keys this process has just changed in Redis, so it reads
    /// its own writes (their invalidation pushes come too, a moment later).
    pub(super) fn forget(&self, keys: impl IntoIterator<Item = Held>) {
        let mut tables = self.inner.tables();
        for held in keys {
            tables::forget(&mut tables, held);
        }
    }

    /// How many users and groups the copy holds keys of.
    pub(super) fn held(&self) -> (usize, usize) {
        let tables = self.inner.tables();
        (tables.users.len(), tables.seqs.len())
    }
}

/// What one read of users' keys returned.
struct Reads {
    epoch: u64,
    users: Vec<UserRead>,
}

struct UserRead {
    unread: Option<String>,
    unread_pttl: i64,
    cursors: Option<Vec<(u64, u64, bool)>>,
    cursors_pttl: i64,
}

/// When a copy read at `sent` lapses: at the key's own expiry (`PTTL` ms
/// after the read was sent; none for -1, and -2 is an absent key).
fn expiry(sent: Instant, pttl: i64) -> Option<Instant> {
    u64::try_from(pttl).ok().and_then(|ms| sent.checked_add(Duration::from_millis(ms)))
}

fn from_value<T: redis::FromRedisValue>(value: Value) -> Result<T> {
    redis::FromRedisValue::from_redis_value(value)
        .map_err(|e| Error::Internal(format!("malformed reply of a near cache read: {e}")))
}

/// Splits the replies of a users' read: the epoch, then per user the
/// badge, its PTTL, the cursors hash (a `_` field marks a user cached
/// without groups) and its PTTL.
fn parse_reads(replies: &[Value], users: usize) -> Result<Reads> {
    let malformed = || Error::Internal("malformed reply of a near cache read".to_owned());
    if replies.len() != 1 + 4 * users {
        return Err(malformed());
    }
    let epoch: Option<u64> = from_value(replies[0].clone())?;
    let users = replies[1..]
        .chunks(4)
        .map(|reply| {
            let unread: Option<String> = from_value(reply[0].clone())?;
            let unread_pttl: i64 = from_value(reply[1].clone())?;
            let hash: Vec<(String, String)> = from_value(reply[2].clone())?;
            let cursors_pttl: i64 = from_value(reply[3].clone())?;
            let cursors = (!hash.is_empty()).then(|| {
                hash.iter().filter_map(|(group, value)| parse_cursor(group, value)).collect()
            });
            Ok(UserRead { unread, unread_pttl, cursors, cursors_pttl })
        })
        .collect::<Result<_>>()?;
    Ok(Reads { epoch: epoch.unwrap_or(0), users })
}
