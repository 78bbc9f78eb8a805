//! [`Shards`]: one value per shard (a connection pool, in the services),
//! routed by the map last installed (a map is versioned data that can change
//! while a process runs), with the freezes and leases of bucket moves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::buckets::BucketSet;
use crate::hash::{BUCKETS, bucket_of, bucket_of_key};
use crate::map::ShardMap;
use crate::shard::{ShardId, ShardMapError};

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

/// A map, its version, its frozen buckets, the buckets an earlier version
/// routed elsewhere, and each bucket's position in `members`.
#[derive(Debug, Clone)]
struct Routing {
    version: u64,
    map: Arc<ShardMap>,
    frozen: BucketSet,
    moved: BucketSet,
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
        Ok(Self { version, map: Arc::new(map), frozen, moved: BucketSet::EMPTY, member })
    }

    /// This routing as the successor of `before`: the buckets moved since
    /// (a version 0 is the configuration's map, not a stored version, and
    /// moved nothing) join those moved before and `history`.
    fn after(&self, before: &Routing, history: BucketSet) -> Self {
        let since =
            if before.version == 0 { BucketSet::EMPTY } else { self.map.moved_from(&before.map) };
        Self { moved: before.moved.union(since).union(history), ..self.clone() }
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

    /// The buckets some earlier version routed to another shard than this
    /// one does (as installed in this process, and the history it was
    /// given, see [`Shards::install_with_history`]): rows of theirs that
    /// stay where they were written (a send's chunks) may be on any shard.
    /// Every other bucket's rows are on the shard this version routes it to.
    pub fn moved(&self) -> BucketSet {
        self.routing.moved
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

    /// Every shard and its value, in configuration order, whether or not
    /// this version gives it buckets.
    pub fn iter(&self) -> impl Iterator<Item = (ShardId, &'a T)> + use<'a, T> {
        self.members.iter().map(|(shard, value)| (*shard, value))
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
    /// changes nothing. The buckets it routes elsewhere than the version it
    /// replaces join [`Snapshot::moved`].
    pub fn install(
        &self,
        map: ShardMap,
        frozen: BucketSet,
        version: u64,
    ) -> Result<bool, ShardMapError> {
        self.install_with_history(map, frozen, version, BucketSet::EMPTY)
    }

    /// Like [`Self::install`], with the buckets that versions this process
    /// never installed moved (`history`: those stored before it started,
    /// or skipped between two of its looks), which join [`Snapshot::moved`].
    pub fn install_with_history(
        &self,
        map: ShardMap,
        frozen: BucketSet,
        version: u64,
        history: BucketSet,
    ) -> Result<bool, ShardMapError> {
        if version <= self.version() {
            return Ok(false);
        }
        let routing = Routing::new(&self.members, map, frozen, version)?;
        let previous = self.routing.rcu(|current| {
            if current.version < version {
                Arc::new(routing.after(current, history))
            } else {
                current.clone()
            }
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
