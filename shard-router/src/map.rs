//! The shard map: bucket ranges assigned to physical shards, validated once,
//! and [`Shards`], which routes to one value per shard by the map it was last
//! given (a map is versioned data that can change while a process runs).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

use arc_swap::ArcSwap;
use serde::Deserialize;
use tokio::sync::watch;

use crate::buckets::BucketSet;
use crate::hash::{BUCKETS, bucket_of, bucket_of_key};

/// Identifies a physical shard, as named in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(transparent)]
pub struct ShardId(pub u32);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An inclusive range of buckets served by one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct BucketRange {
    /// Shard that owns the range.
    pub shard: ShardId,
    /// First bucket of the range.
    pub from: u32,
    /// Last bucket of the range, inclusive.
    pub to: u32,
}

/// Why a shard map was rejected. Each message names the offending setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShardMapError {
    /// No shard is defined.
    #[error("database.shards: at least one shard is required")]
    NoShards,
    /// Two shards share an id.
    #[error("database.shards[{index}]: shard id {shard} is defined twice")]
    DuplicateShard {
        /// Position of the second definition.
        index: usize,
        /// The repeated id.
        shard: ShardId,
    },
    /// A range names a shard that is not defined.
    #[error("database.bucket_ranges[{index}]: shard {shard} is not defined in database.shards")]
    UnknownShard {
        /// Position of the range.
        index: usize,
        /// The unknown id.
        shard: ShardId,
    },
    /// A range is empty or reaches past the last bucket.
    #[error(
        "database.bucket_ranges[{index}]: range {from}..={to} must satisfy from <= to < {BUCKETS}"
    )]
    BadRange {
        /// Position of the range.
        index: usize,
        /// First bucket.
        from: u32,
        /// Last bucket.
        to: u32,
    },
    /// Two ranges claim the same bucket.
    #[error(
        "database.bucket_ranges[{index}]: bucket {bucket} is already assigned to shard {owner}"
    )]
    Overlap {
        /// Position of the later range.
        index: usize,
        /// First bucket claimed twice.
        bucket: u32,
        /// Shard of the earlier range.
        owner: ShardId,
    },
    /// Some bucket has no shard.
    #[error("database.bucket_ranges: bucket {bucket} is not assigned to any shard")]
    Uncovered {
        /// First unassigned bucket.
        bucket: u32,
    },
    /// A map names a shard this process has no connection settings for.
    #[error("shard {shard} is in the shard map but not in this process's database.shards")]
    NotConfigured {
        /// The shard.
        shard: ShardId,
    },
    /// The text form of a map does not parse.
    #[error("shard map {text:?}: {reason}")]
    Malformed {
        /// The text, or the part of it that failed.
        text: String,
        /// What is wrong.
        reason: &'static str,
    },
}

/// A validated assignment of every bucket to exactly one shard.
#[derive(Debug, Clone)]
pub struct ShardMap {
    shards: Vec<ShardId>,
    /// Position in `shards` of each bucket's owner; indexed by bucket.
    owner: Vec<u16>,
}

impl ShardMap {
    /// Validates `ranges` against `shards` and builds the lookup table.
    pub fn new(shards: &[ShardId], ranges: &[BucketRange]) -> Result<Self, ShardMapError> {
        if shards.is_empty() {
            return Err(ShardMapError::NoShards);
        }
        let mut position = HashMap::new();
        for (index, shard) in shards.iter().enumerate() {
            if position.insert(*shard, index as u16).is_some() {
                return Err(ShardMapError::DuplicateShard { index, shard: *shard });
            }
        }
        let mut owner: Vec<Option<u16>> = vec![None; BUCKETS as usize];
        for (index, range) in ranges.iter().enumerate() {
            let Some(&slot) = position.get(&range.shard) else {
                return Err(ShardMapError::UnknownShard { index, shard: range.shard });
            };
            if range.from > range.to || range.to >= BUCKETS {
                return Err(ShardMapError::BadRange { index, from: range.from, to: range.to });
            }
            for bucket in range.from..=range.to {
                if let Some(existing) = owner[bucket as usize] {
                    let owner = shards[existing as usize];
                    return Err(ShardMapError::Overlap { index, bucket, owner });
                }
                owner[bucket as usize] = Some(slot);
            }
        }
        let owner = owner
            .into_iter()
            .enumerate()
            .map(|(bucket, slot)| slot.ok_or(ShardMapError::Uncovered { bucket: bucket as u32 }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { shards: shards.to_vec(), owner })
    }

    /// Splits the buckets evenly over `shards`, in order.
    pub fn even(shards: &[ShardId]) -> Result<Self, ShardMapError> {
        Self::new(shards, &Self::even_ranges(shards))
    }

    /// Returns the ranges that split the buckets evenly over `shards`, in order.
    pub fn even_ranges(shards: &[ShardId]) -> Vec<BucketRange> {
        let count = shards.len() as u32;
        shards
            .iter()
            .enumerate()
            .map(|(i, shard)| {
                let i = i as u32;
                BucketRange {
                    shard: *shard,
                    from: i * BUCKETS / count,
                    to: (i + 1) * BUCKETS / count - 1,
                }
            })
            .collect()
    }

    /// Returns the shards in configuration order.
    pub fn shards(&self) -> &[ShardId] {
        &self.shards
    }

    /// Returns the map as ranges: each run of consecutive buckets with one
    /// owner, in bucket order. `ShardMap::new(map.shards(), &map.ranges())`
    /// rebuilds the same map.
    pub fn ranges(&self) -> Vec<BucketRange> {
        let mut ranges: Vec<BucketRange> = Vec::new();
        for (bucket, slot) in self.owner.iter().enumerate() {
            let (bucket, shard) = (bucket as u32, self.shards[*slot as usize]);
            match ranges.last_mut() {
                Some(last) if last.shard == shard && last.to + 1 == bucket => last.to = bucket,
                _ => ranges.push(BucketRange { shard, from: bucket, to: bucket }),
            }
        }
        ranges
    }

    /// Returns the map with `shard` added, owning no bucket yet.
    pub fn with_shard(&self, shard: ShardId) -> Result<Self, ShardMapError> {
        let mut shards = self.shards.clone();
        shards.push(shard);
        Self::new(&shards, &self.ranges())
    }

    /// Returns the map with every bucket of `from..=to` given to `shard`,
    /// which must be in the map.
    pub fn with_range(&self, shard: ShardId, from: u32, to: u32) -> Result<Self, ShardMapError> {
        let mut ranges: Vec<BucketRange> = self
            .ranges()
            .into_iter()
            .flat_map(|r| {
                let before = (r.from < from).then(|| BucketRange { to: r.to.min(from - 1), ..r });
                let after = (r.to > to).then(|| BucketRange { from: r.from.max(to + 1), ..r });
                before.into_iter().chain(after)
            })
            .collect();
        ranges.push(BucketRange { shard, from, to });
        ranges.sort_by_key(|r| r.from);
        Self::new(&self.shards, &ranges)
    }

    /// Returns the shard that owns a bucket.
    pub fn shard_of_bucket(&self, bucket: u32) -> ShardId {
        self.shards[self.slot_of_bucket(bucket)]
    }

    /// Returns the shard that stores everything about a user.
    pub fn shard_for_user(&self, user_id: u64) -> ShardId {
        self.shard_of_bucket(bucket_of(user_id))
    }

    /// Returns the home shard of a message's control record.
    pub fn home_shard_for_message(&self, message_id: u64) -> ShardId {
        self.shard_of_bucket(bucket_of(message_id))
    }

    /// Returns the shard that owns a string key (an idempotency key, say).
    pub fn shard_for_key(&self, key: &str) -> ShardId {
        self.shard_of_bucket(bucket_of_key(key))
    }

    /// Returns the position of a shard in [`Self::shards`].
    pub fn slot_of(&self, shard: ShardId) -> Option<usize> {
        self.shards.iter().position(|s| *s == shard)
    }

    fn slot_of_bucket(&self, bucket: u32) -> usize {
        self.owner[(bucket % BUCKETS) as usize] as usize
    }

    /// Groups user ids by their shard, keeping each group's input order.
    pub fn partition_users(&self, user_ids: &[u64]) -> Vec<(ShardId, Vec<u64>)> {
        let mut groups: Vec<Vec<u64>> = vec![Vec::new(); self.shards.len()];
        for &user_id in user_ids {
            groups[self.slot_of_bucket(bucket_of(user_id))].push(user_id);
        }
        self.shards.iter().copied().zip(groups).filter(|(_, users)| !users.is_empty()).collect()
    }

    /// Groups group ids by their home shard, like [`Self::partition_users`]
    /// (a group id hashes exactly like a user id).
    pub fn partition_groups(&self, group_ids: &[u64]) -> Vec<(ShardId, Vec<u64>)> {
        self.partition_users(group_ids)
    }
}

/// The text form a map is stored in: each shard in order, `=`, and its
/// ranges, shards separated by `;` (`0=0-511;1=512-1023;2=` has shard 2
/// owning nothing yet).
impl fmt::Display for ShardMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ranges = self.ranges();
        for (index, shard) in self.shards.iter().enumerate() {
            if index > 0 {
                f.write_str(";")?;
            }
            write!(f, "{shard}=")?;
            let mut first = true;
            for range in ranges.iter().filter(|r| r.shard == *shard) {
                if !first {
                    f.write_str(",")?;
                }
                first = false;
                write!(f, "{}-{}", range.from, range.to)?;
            }
        }
        Ok(())
    }
}

impl FromStr for ShardMap {
    type Err = ShardMapError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let malformed = |part: &str, reason| ShardMapError::Malformed { text: part.into(), reason };
        let number = |part: &str| part.trim().parse::<u32>();
        let mut shards = Vec::new();
        let mut ranges = Vec::new();
        for entry in text.split(';') {
            let (shard, list) =
                entry.split_once('=').ok_or_else(|| malformed(entry, "expected shard=ranges"))?;
            let shard = ShardId(number(shard).map_err(|_| malformed(entry, "bad shard id"))?);
            shards.push(shard);
            for range in list.split(',').filter(|r| !r.trim().is_empty()) {
                let (from, to) =
                    range.split_once('-').ok_or_else(|| malformed(range, "expected from-to"))?;
                let (Ok(from), Ok(to)) = (number(from), number(to)) else {
                    return Err(malformed(range, "bad bucket number"));
                };
                ranges.push(BucketRange { shard, from, to });
            }
        }
        Self::new(&shards, &ranges)
    }
}

/// One value per shard (a connection pool, say), routed by the [`ShardMap`]
/// last installed. Clones share the map: installing a new version on one is
/// seen by all of them.
///
/// A version may also freeze buckets for writes (while a move copies their
/// last changes): [`Self::writable`] waits until a version that does not
/// freeze the bucket is installed. Every route holds the version it was
/// taken under until it is dropped, and [`Self::oldest_in_use`] says which
/// version the oldest route still held was taken under: a replica reports a
/// version as the one it routes by only once no older route is in flight,
/// which is what makes a freeze (or a flip) a point after which nothing
/// writes by the older map.
///
/// A process that reports its version (see [`Self::renew_lease`]) may also
/// write only while its last report is recent: one that cannot report any
/// more may be running a map a move has left behind without anyone waiting
/// for it, so its writers wait, as for a freeze, until it reports again.
#[derive(Debug, Clone)]
pub struct Shards<T> {
    /// Every shard a value was built for, in configuration order. A map may
    /// use any subset of them.
    members: Arc<[(ShardId, T)]>,
    routing: Arc<ArcSwap<Routing>>,
    /// Versions replaced while routes taken under them may still be held.
    retired: Arc<Mutex<Vec<Weak<Routing>>>>,
    /// The version installed last, for writers waiting out a freeze (also
    /// signalled when the lease is renewed).
    installed: Arc<watch::Sender<u64>>,
    lease: Arc<Lease>,
}

/// Until when writes may go on, as milliseconds since `born` plus one: 0
/// when no lease is kept (a process that does not report, like a
/// command-line tool).
#[derive(Debug)]
struct Lease {
    born: Instant,
    until_ms_plus_one: AtomicU64,
}

impl Lease {
    /// True when a lease is kept and had run out by `ms` after `born`.
    fn lapsed_at(until_ms_plus_one: u64, ms: u64) -> bool {
        until_ms_plus_one != 0 && ms >= until_ms_plus_one - 1
    }

    fn elapsed_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    fn lapsed(&self) -> bool {
        Self::lapsed_at(self.until_ms_plus_one.load(Ordering::Acquire), self.elapsed_ms())
    }
}

/// A map, its version, its frozen buckets, and each bucket's position in
/// `members`.
#[derive(Debug)]
struct Routing {
    version: u64,
    map: Arc<ShardMap>,
    frozen: BucketSet,
    member: Box<[u16]>,
}

impl Routing {
    fn new<T>(
        members: &[(ShardId, T)],
        map: ShardMap,
        frozen: BucketSet,
        version: u64,
    ) -> Result<Self, ShardMapError> {
        let mut position = Vec::with_capacity(map.shards.len());
        for shard in &map.shards {
            let index = members
                .iter()
                .position(|(id, _)| id == shard)
                .ok_or(ShardMapError::NotConfigured { shard: *shard })?;
            position.push(index as u16);
        }
        let member = map.owner.iter().map(|slot| position[*slot as usize]).collect();
        Ok(Self { version, map: Arc::new(map), frozen, member })
    }
}

/// What routes to a shard: a user, a message or group home, a string key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key<'a> {
    /// The shard that stores a user's rows.
    User(u64),
    /// A message's home shard.
    Message(u64),
    /// A group's home shard.
    Group(u64),
    /// The shard that owns a string key (an idempotency key, say).
    Str(&'a str),
}

impl Key<'_> {
    /// The key's bucket.
    pub fn bucket(&self) -> u32 {
        match *self {
            Self::User(id) | Self::Message(id) | Self::Group(id) => bucket_of(id),
            Self::Str(key) => bucket_of_key(key),
        }
    }
}

/// A shard's value, routed by one version of the map, which it holds until
/// dropped (see [`Shards::oldest_in_use`]). Derefs to the value.
#[derive(Debug)]
pub struct Routed<'a, T> {
    shard: ShardId,
    value: &'a T,
    routing: Arc<Routing>,
}

impl<'a, T> Routed<'a, T> {
    /// The shard routed to.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// The value (outliving the route: keep the route while writing).
    pub fn value(&self) -> &'a T {
        self.value
    }

    /// The version of the map this route was taken under.
    pub fn version(&self) -> u64 {
        self.routing.version
    }
}

impl<T> std::ops::Deref for Routed<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.value
    }
}

/// One version of the map, held: routes taken from it all agree, and it
/// counts as in use (see [`Shards::oldest_in_use`]) until dropped.
#[derive(Debug)]
pub struct Snapshot<'a, T> {
    members: &'a [(ShardId, T)],
    routing: Arc<Routing>,
}

impl<'a, T> Snapshot<'a, T> {
    /// The version.
    pub fn version(&self) -> u64 {
        self.routing.version
    }

    /// The map.
    pub fn map(&self) -> &ShardMap {
        &self.routing.map
    }

    /// Returns true when this version freezes `bucket` for writes.
    pub fn is_frozen(&self, bucket: u32) -> bool {
        self.routing.frozen.contains(bucket)
    }

    /// The buckets this version freezes for writes.
    pub fn frozen(&self) -> BucketSet {
        self.routing.frozen
    }

    /// The shard that owns `bucket` and its value.
    pub fn of_bucket(&self, bucket: u32) -> (ShardId, &'a T) {
        let index = self.routing.member[(bucket % BUCKETS) as usize];
        let (shard, value) = &self.members[index as usize];
        (*shard, value)
    }

    /// The shard of `key` and its value.
    pub fn of(&self, key: Key<'_>) -> (ShardId, &'a T) {
        self.of_bucket(key.bucket())
    }

    /// A route to `key`'s shard holding this version.
    pub fn route(&self, key: Key<'_>) -> Routed<'a, T> {
        let (shard, value) = self.of(key);
        Routed { shard, value, routing: self.routing.clone() }
    }

    /// Groups user ids by their shard in this version, keeping each
    /// group's input order (see [`ShardMap::partition_users`]).
    pub fn partition_users(&self, user_ids: &[u64]) -> Vec<(ShardId, Vec<u64>)> {
        self.routing.map.partition_users(user_ids)
    }

    /// Returns the value of a shard, if the shard exists.
    pub fn get(&self, shard: ShardId) -> Option<&'a T> {
        self.members.iter().find(|(id, _)| *id == shard).map(|(_, value)| value)
    }
}

impl<T> Shards<T> {
    /// Pairs each shard of `map` with the value `make` builds for it; the
    /// map is version 0.
    pub fn build<E>(map: ShardMap, make: impl FnMut(ShardId) -> Result<T, E>) -> Result<Self, E> {
        let ids = map.shards().to_vec();
        let values = ids.iter().copied().map(make).collect::<Result<Vec<T>, E>>()?;
        let members: Vec<(ShardId, T)> = ids.into_iter().zip(values).collect();
        Ok(Self::with_members(members, map, 0).expect("every shard of the map has a value"))
    }

    /// Routes `members` (every shard a value exists for) by `map`, which may
    /// leave some of them without buckets.
    pub fn with_members(
        members: Vec<(ShardId, T)>,
        map: ShardMap,
        version: u64,
    ) -> Result<Self, ShardMapError> {
        let routing = Routing::new(&members, map, BucketSet::EMPTY, version)?;
        Ok(Self {
            members: members.into(),
            routing: Arc::new(ArcSwap::from_pointee(routing)),
            retired: Arc::default(),
            installed: Arc::new(watch::channel(version).0),
            lease: Arc::new(Lease { born: Instant::now(), until_ms_plus_one: AtomicU64::new(0) }),
        })
    }

    /// Routes by `map`, with `frozen` buckets frozen for writes, from now
    /// on, if `version` is newer than the current one; returns whether it
    /// was installed. A map naming a shard without a member is refused and
    /// changes nothing.
    pub fn install(
        &self,
        map: ShardMap,
        frozen: BucketSet,
        version: u64,
    ) -> Result<bool, ShardMapError> {
        if version <= self.version() {
            return Ok(false);
        }
        let routing = Arc::new(Routing::new(&self.members, map, frozen, version)?);
        let previous = self.routing.rcu(|current| {
            if current.version < version { routing.clone() } else { current.clone() }
        });
        if previous.version >= version {
            return Ok(false);
        }
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        retired.retain(|old| old.strong_count() > 0);
        retired.push(Arc::downgrade(&previous));
        drop(retired);
        drop(previous);
        self.installed.send_replace(version);
        Ok(true)
    }

    /// Lets writes go on until `until` (or a later time given before): a
    /// process calls it each time its version is reported, from the time
    /// it sent the report. Wakes writers waiting for it.
    pub fn renew_lease(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.lease.born).as_millis() as u64;
        let before = self.lease.until_ms_plus_one.fetch_max(ms + 1, Ordering::AcqRel);
        if before == 0 || Lease::lapsed_at(before, self.lease.elapsed_ms()) {
            // It had lapsed (or was never kept): writers may be waiting.
            self.installed.send_modify(|_| {});
        }
    }

    /// True when a lease is kept and has run out: writes wait.
    pub fn lease_lapsed(&self) -> bool {
        self.lease.lapsed()
    }

    /// Returns the version of the map in use.
    pub fn version(&self) -> u64 {
        self.routing.load().version
    }

    /// Returns the oldest version a route still held was taken under (the
    /// version in use when none is older): the version this process can say
    /// it routes by, because nothing it does still goes by an older one.
    pub fn oldest_in_use(&self) -> u64 {
        let current = self.version();
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        retired.retain(|old| old.strong_count() > 0);
        retired.iter().filter_map(Weak::upgrade).map(|old| old.version).fold(current, u64::min)
    }

    /// Returns the map in use.
    pub fn map(&self) -> Arc<ShardMap> {
        self.routing.load().map.clone()
    }

    /// Holds the version in use, to route several keys by one map.
    pub fn snapshot(&self) -> Snapshot<'_, T> {
        Snapshot { members: &self.members, routing: self.routing.load_full() }
    }

    /// Returns the value of a shard, if the shard exists.
    pub fn get(&self, shard: ShardId) -> Option<&T> {
        self.members.iter().find(|(id, _)| *id == shard).map(|(_, value)| value)
    }

    /// Routes `key` by the map in use, frozen or not: for reads, which go on
    /// at the source of a move until it flips.
    pub fn route(&self, key: Key<'_>) -> Routed<'_, T> {
        self.snapshot().route(key)
    }

    /// Routes a write to `key` by the map in use, unless it freezes the
    /// key's bucket.
    pub fn try_writable(&self, key: Key<'_>) -> Option<Routed<'_, T>> {
        self.try_writable_snapshot(&[key.bucket()]).map(|snapshot| snapshot.route(key))
    }

    /// Routes a write to `key`: by the map in use, once it does not freeze
    /// the key's bucket (waiting for the version that ends the freeze).
    pub async fn writable(&self, key: Key<'_>) -> Routed<'_, T> {
        self.writable_snapshot(&[key.bucket()]).await.route(key)
    }

    /// Holds the map in use for writes to several buckets, unless it
    /// freezes one of them or the lease has lapsed.
    pub fn try_writable_snapshot(&self, buckets: &[u32]) -> Option<Snapshot<'_, T>> {
        if self.lease.lapsed() {
            return None;
        }
        let snapshot = self.snapshot();
        (!buckets.iter().any(|bucket| snapshot.is_frozen(*bucket))).then_some(snapshot)
    }

    /// Holds the map in use for writes to several buckets, once it freezes
    /// none of them (waiting for the version that ends the freeze) and the
    /// lease is not lapsed (waiting for its renewal).
    pub async fn writable_snapshot(&self, buckets: &[u32]) -> Snapshot<'_, T> {
        let mut installed = self.installed.subscribe();
        loop {
            // Subscribed before looking: a version installed meanwhile wakes us.
            if let Some(snapshot) = self.try_writable_snapshot(buckets) {
                return snapshot;
            }
            // The sender lives as long as `self`.
            let _ = installed.changed().await;
        }
    }

    /// Returns the value of the shard that stores a user.
    pub fn for_user(&self, user_id: u64) -> Routed<'_, T> {
        self.route(Key::User(user_id))
    }

    /// Returns the value of a message's home shard.
    pub fn for_message(&self, message_id: u64) -> Routed<'_, T> {
        self.route(Key::Message(message_id))
    }

    /// Returns the value of a group's home shard.
    pub fn for_group(&self, group_id: u64) -> Routed<'_, T> {
        self.route(Key::Group(group_id))
    }

    /// Returns the value of the shard that owns a string key.
    pub fn for_key(&self, key: &str) -> Routed<'_, T> {
        self.route(Key::Str(key))
    }

    /// Groups user ids by their shard in the map in use, keeping each
    /// group's input order (see [`ShardMap::partition_users`]).
    pub fn partition_users(&self, user_ids: &[u64]) -> Vec<(ShardId, Vec<u64>)> {
        self.routing.load().map.partition_users(user_ids)
    }

    /// Iterates over every shard and its value, in configuration order,
    /// whether or not the map gives it buckets.
    pub fn iter(&self) -> impl Iterator<Item = (ShardId, &T)> {
        self.members.iter().map(|(shard, value)| (*shard, value))
    }

    /// Returns the number of shards.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Returns true when there is no shard (never, for a validated map).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Vec<ShardId> {
        (0..n).map(ShardId).collect()
    }

    #[test]
    fn even_map_covers_every_bucket_in_order() {
        let map = ShardMap::even(&ids(4)).unwrap();
        assert_eq!(map.shard_of_bucket(0), ShardId(0));
        assert_eq!(map.shard_of_bucket(255), ShardId(0));
        assert_eq!(map.shard_of_bucket(256), ShardId(1));
        assert_eq!(map.shard_of_bucket(1023), ShardId(3));
    }

    #[test]
    fn known_users_land_on_known_shards() {
        let map = ShardMap::even(&ids(4)).unwrap();
        // bucket 812 -> shard 3, bucket 460 -> shard 1, bucket 999 -> shard 3.
        assert_eq!(map.shard_for_user(1), ShardId(3));
        assert_eq!(map.shard_for_user(42), ShardId(1));
        assert_eq!(map.shard_for_user(2), ShardId(3));
    }

    #[test]
    fn unknown_shard_in_range_is_rejected_with_its_setting() {
        let ranges = [BucketRange { shard: ShardId(9), from: 0, to: 1023 }];
        let err = ShardMap::new(&ids(2), &ranges).unwrap_err();
        assert_eq!(err, ShardMapError::UnknownShard { index: 0, shard: ShardId(9) });
        assert!(err.to_string().starts_with("database.bucket_ranges[0]: shard 9"));
    }

    #[test]
    fn overlapping_ranges_are_rejected() {
        let ranges = [
            BucketRange { shard: ShardId(0), from: 0, to: 600 },
            BucketRange { shard: ShardId(1), from: 500, to: 1023 },
        ];
        let err = ShardMap::new(&ids(2), &ranges).unwrap_err();
        assert_eq!(err, ShardMapError::Overlap { index: 1, bucket: 500, owner: ShardId(0) });
    }

    #[test]
    fn gaps_and_bad_ranges_are_rejected() {
        let gap = [
            BucketRange { shard: ShardId(0), from: 0, to: 100 },
            BucketRange { shard: ShardId(1), from: 102, to: 1023 },
        ];
        assert_eq!(
            ShardMap::new(&ids(2), &gap).unwrap_err(),
            ShardMapError::Uncovered { bucket: 101 }
        );
        let past_end = [BucketRange { shard: ShardId(0), from: 0, to: 1024 }];
        assert!(matches!(
            ShardMap::new(&ids(1), &past_end),
            Err(ShardMapError::BadRange { index: 0, .. })
        ));
        assert_eq!(ShardMap::new(&[], &[]).unwrap_err(), ShardMapError::NoShards);
        assert!(matches!(
            ShardMap::even(&[ShardId(1), ShardId(1)]),
            Err(ShardMapError::DuplicateShard { index: 1, .. })
        ));
    }

    #[test]
    fn moving_a_range_to_a_new_shard_moves_only_its_buckets() {
        let before = ShardMap::even(&ids(2)).unwrap();
        let after = ShardMap::new(
            &ids(3),
            &[
                BucketRange { shard: ShardId(0), from: 0, to: 511 },
                BucketRange { shard: ShardId(1), from: 512, to: 767 },
                BucketRange { shard: ShardId(2), from: 768, to: 1023 },
            ],
        )
        .unwrap();
        for user_id in 1..10_000u64 {
            let (old, new) = (before.shard_for_user(user_id), after.shard_for_user(user_id));
            if bucket_of(user_id) < 768 {
                assert_eq!(old, new, "user {user_id} moved although its bucket did not");
            } else {
                assert_eq!(new, ShardId(2));
            }
        }
    }

    #[test]
    fn partition_keeps_every_id_once() {
        let map = ShardMap::even(&ids(4)).unwrap();
        let users: Vec<u64> = (1..=5000).collect();
        let groups = map.partition_users(&users);
        let mut all: Vec<u64> = groups.iter().flat_map(|(_, u)| u.iter().copied()).collect();
        all.sort_unstable();
        assert_eq!(all, users);
        for (shard, users) in groups {
            assert!(users.iter().all(|u| map.shard_for_user(*u) == shard));
        }
    }

    #[test]
    fn shards_route_to_their_member() {
        let shards =
            Shards::build(ShardMap::even(&ids(4)).unwrap(), |id| Ok::<_, ()>(format!("pool-{id}")))
                .unwrap();
        assert_eq!(shards.len(), 4);
        let routed = shards.for_user(42);
        assert_eq!(*routed, format!("pool-{}", routed.shard()));
        assert_eq!(shards.get(ShardId(3)).map(String::as_str), Some("pool-3"));
        assert!(shards.get(ShardId(7)).is_none());
    }

    #[test]
    fn text_form_round_trips_and_lists_shards_without_buckets() {
        let map = ShardMap::even(&ids(2)).unwrap().with_shard(ShardId(7)).unwrap();
        assert_eq!(map.to_string(), "0=0-511;1=512-1023;7=");
        let moved = map.with_range(ShardId(7), 100, 199).unwrap();
        assert_eq!(moved.to_string(), "0=0-99,200-511;1=512-1023;7=100-199");
        let parsed: ShardMap = moved.to_string().parse().unwrap();
        assert_eq!(parsed.shards(), moved.shards());
        assert_eq!(parsed.ranges(), moved.ranges());
        assert_eq!(
            ShardMap::new(moved.shards(), &moved.ranges()).unwrap().to_string(),
            moved.to_string()
        );
    }

    #[test]
    fn malformed_text_and_duplicate_shards_are_refused() {
        for text in ["", "0", "0=0-1023;x=", "0=0-1023;1=5", "0=0-10"] {
            assert!(text.parse::<ShardMap>().is_err(), "{text:?} parsed");
        }
        let map = ShardMap::even(&ids(2)).unwrap();
        assert!(matches!(map.with_shard(ShardId(1)), Err(ShardMapError::DuplicateShard { .. })));
        assert!(matches!(
            map.with_range(ShardId(9), 0, 10),
            Err(ShardMapError::UnknownShard { .. })
        ));
    }

    #[test]
    fn installed_maps_route_every_clone_and_only_newer_versions_win() {
        let members: Vec<(ShardId, String)> =
            ids(3).into_iter().map(|id| (id, format!("pool-{id}"))).collect();
        let start = ShardMap::even(&ids(2)).unwrap();
        let shards = Shards::with_members(members, start.clone(), 1).unwrap();
        let clone = shards.clone();
        let user = (1..).find(|u| bucket_of(*u) < 100).unwrap();
        assert_eq!(shards.for_user(user).shard(), ShardId(0));
        let moved = start.with_shard(ShardId(2)).unwrap().with_range(ShardId(2), 0, 99).unwrap();
        assert!(shards.install(moved.clone(), BucketSet::EMPTY, 2).unwrap());
        assert_eq!(clone.for_user(user).shard(), ShardId(2));
        assert_eq!(*clone.for_user(user), "pool-2");
        assert_eq!(clone.version(), 2);
        assert!(!shards.install(start.clone(), BucketSet::EMPTY, 2).unwrap(), "same version");
        assert!(!shards.install(start, BucketSet::EMPTY, 1).unwrap(), "older version");
        assert_eq!(shards.for_user(user).shard(), ShardId(2));
        let unknown = moved.with_shard(ShardId(5)).unwrap().with_range(ShardId(5), 0, 0).unwrap();
        assert_eq!(
            shards.install(unknown, BucketSet::EMPTY, 3).unwrap_err(),
            ShardMapError::NotConfigured { shard: ShardId(5) }
        );
        assert_eq!(shards.version(), 2);
        assert_eq!(shards.iter().count(), 3, "every member, bucketed or not");
    }

    fn three_members() -> (Shards<String>, ShardMap) {
        let members: Vec<(ShardId, String)> =
            ids(3).into_iter().map(|id| (id, format!("pool-{id}"))).collect();
        let start = ShardMap::even(&ids(2)).unwrap().with_shard(ShardId(2)).unwrap();
        (Shards::with_members(members, start.clone(), 1).unwrap(), start)
    }

    #[test]
    fn a_replica_routes_by_a_version_only_once_no_older_route_is_held() {
        let (shards, start) = three_members();
        let held = shards.for_user(1);
        let snapshot = shards.snapshot();
        assert_eq!(shards.oldest_in_use(), 1);
        assert!(shards.install(start.clone(), BucketSet::EMPTY, 2).unwrap());
        assert!(shards.install(start.clone(), BucketSet::EMPTY, 3).unwrap());
        assert_eq!(shards.version(), 3);
        assert_eq!(shards.oldest_in_use(), 1, "a route taken under version 1 is still held");
        drop(held);
        assert_eq!(shards.oldest_in_use(), 1, "so is a snapshot of version 1");
        drop(snapshot);
        assert_eq!(shards.oldest_in_use(), 3);
        let under_three = shards.for_key("k");
        assert!(shards.install(start, BucketSet::EMPTY, 4).unwrap());
        assert_eq!((under_three.version(), shards.oldest_in_use()), (3, 3));
        drop(under_three);
        assert_eq!(shards.oldest_in_use(), 4);
    }

    #[tokio::test]
    async fn writes_to_a_frozen_bucket_wait_for_the_version_that_ends_the_freeze() {
        let (shards, start) = three_members();
        let user = (1..).find(|u| bucket_of(*u) == 600).unwrap();
        let other = (1..).find(|u| bucket_of(*u) == 100).unwrap();
        let frozen = BucketSet::range(512, 767);
        assert!(shards.install(start.clone(), frozen, 2).unwrap());
        let snapshot = shards.snapshot();
        assert!(snapshot.is_frozen(600) && !snapshot.is_frozen(100));
        assert_eq!(snapshot.frozen(), frozen);
        drop(snapshot);
        // Reads and writes elsewhere go on; the frozen bucket's write waits.
        assert_eq!(shards.route(Key::User(user)).shard(), ShardId(1));
        assert_eq!(shards.writable(Key::User(other)).await.shard(), ShardId(0));
        let waiter = {
            let shards = shards.clone();
            tokio::spawn(async move {
                let routed = shards.writable(Key::User(user)).await;
                (routed.shard(), routed.version())
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a write to a frozen bucket went ahead");
        // A newer version that still freezes it keeps the writer waiting.
        assert!(shards.install(start.clone(), frozen, 3).unwrap());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        let flipped = start.with_range(ShardId(2), 512, 767).unwrap();
        assert!(shards.install(flipped, BucketSet::EMPTY, 4).unwrap());
        assert_eq!(waiter.await.unwrap(), (ShardId(2), 4));
    }

    #[tokio::test]
    async fn writes_wait_while_the_lease_is_lapsed_and_go_on_once_it_is_renewed() {
        let (shards, _) = three_members();
        let user = 42;
        // No lease kept: writes go on (a tool that never reports).
        assert!(!shards.lease_lapsed());
        assert!(shards.try_writable(Key::User(user)).is_some());
        // A lease that ran out holds writes back, not reads.
        shards.renew_lease(Instant::now());
        assert!(shards.lease_lapsed());
        assert!(shards.try_writable(Key::User(user)).is_none());
        assert_eq!(shards.route(Key::User(user)).shard(), shards.map().shard_for_user(user));
        let waiter = {
            let shards = shards.clone();
            tokio::spawn(async move { shards.writable(Key::User(user)).await.shard() })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a write went ahead on a lapsed lease");
        // Renewed: the waiting writer goes on, and so do new ones.
        shards.renew_lease(Instant::now() + std::time::Duration::from_secs(60));
        assert_eq!(waiter.await.unwrap(), shards.map().shard_for_user(user));
        assert!(!shards.lease_lapsed());
        assert!(shards.try_writable(Key::User(user)).is_some());
        // An earlier time given later does not shorten it.
        shards.renew_lease(Instant::now());
        assert!(!shards.lease_lapsed());
    }
}
