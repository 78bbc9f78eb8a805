//! Connections for the api's hot calls, kept apart from sqlx's pool: inbox
//! pages (one statement), item updates (one multi-statement script,
//! [`super::item_updates`]) and the reads of recipients' pages and status
//! calls (a few statements per shard, [`read`]).
//!
//! sqlx's pool pings every connection it gets back before it lends it again
//! (`PoolConnection` drop: a `COM_PING` round trip per call), which on an
//! inbox page costs the api about as much CPU as decoding the page, and
//! MariaDB a wake-up per call; and its idle queue is first in, first out,
//! so calls one at a time rotate through its idle connections. A call that
//! ran to its end leaves nothing on its connection, so these connections go
//! back to their set without a ping, and the one given back last is lent
//! first (a steady caller keeps one warm connection); one whose call failed
//! or was cancelled half-way (its future dropped, replies maybe still on
//! the wire, a transaction maybe open) is closed instead, and the server
//! rolls back what it had not committed.
//!
//! A connection that sat idle may have been closed by the server meanwhile
//! (a restart, a network cut). A read on one is run again on a new one when
//! it fails ([`read`]: these statements only read, so running one twice is
//! harmless); a write is never run twice, so one not known to be open for
//! `IDLE_PING_AFTER` (a second) is pinged before a write
//! ([`DirectConnections::acquire_for_write`]) and replaced when that fails.
//! So that a write after a pause costs no such ping, a keepalive
//! ([`ShardConnections::spawn_keepalive`]) pings the connections idle for
//! half a second in the background, every quarter of a second, as long as
//! their last call was within `database.read_keep_warm_secs`, and drops
//! those that do not answer: a write finds one checked within the second.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use shard_router::ShardId;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool};
use sqlx::{ConnectOptions, Connection as _};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::error::Result;
use notify_domain::Error;

/// How often the keepalive looks over the idle connections.
const KEEPALIVE_EVERY: Duration = Duration::from_millis(250);
/// The keepalive pings an idle connection last known open this long ago.
const KEEPALIVE_AFTER: Duration = Duration::from_millis(500);
/// A keepalive ping unanswered this long: the connection is dropped.
const KEEPALIVE_PING_TIMEOUT: Duration = Duration::from_secs(2);
// A connection the keepalive tends is never a second unchecked when a write
// takes it (unless the api is too busy to run the keepalive on time: then
// the write pings it).
const _: () = assert!(
    KEEPALIVE_AFTER.as_millis() + KEEPALIVE_EVERY.as_millis() < super::IDLE_PING_AFTER.as_millis()
);

/// At most `max` direct connections to one shard.
pub struct DirectConnections {
    shard: ShardId,
    options: MySqlConnectOptions,
    /// Idle connections, the last given back at the end.
    idle: Mutex<Vec<Idle>>,
    permits: Semaphore,
    acquire_timeout: Duration,
    /// The keepalive tends connections whose last call was this recent.
    keep_warm: Duration,
    stats: Counters,
}

/// A connection idle in its set.
struct Idle {
    conn: MySqlConnection,
    /// When its last call gave it back.
    used: Instant,
    /// When it was last known open: given back, or it answered a ping.
    checked: Instant,
}

/// What a set has done to keep its connections usable.
#[derive(Default)]
struct Counters {
    pinged_before_write: AtomicU64,
    keepalive_pings: AtomicU64,
    dropped_by_keepalive: AtomicU64,
}

/// A set's counts since it was made ([`DirectConnections::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Writes that pinged their connection first (it was not known open
    /// within the second).
    pub pinged_before_write: u64,
    /// Pings the keepalive sent.
    pub keepalive_pings: u64,
    /// Connections the keepalive dropped (no answer to its ping).
    pub dropped_by_keepalive: u64,
}

impl DirectConnections {
    /// Direct connections to a shard, opened on demand (none until the
    /// first call), at most `max` at once; kept open by the keepalive
    /// while their last call is within `keep_warm`.
    pub fn new(
        shard: ShardId,
        options: MySqlConnectOptions,
        max: usize,
        acquire_timeout: Duration,
        keep_warm: Duration,
    ) -> Self {
        Self {
            shard,
            options,
            idle: Mutex::default(),
            permits: Semaphore::new(max.max(1)),
            acquire_timeout,
            keep_warm,
            stats: Counters::default(),
        }
    }

    /// Lends a connection of the set: the idle one given back last if there
    /// is one, else a new one. Give it back with [`Lent::give_back`] once
    /// the call ran to its end. Reads go through [`read`], writes through
    /// [`Self::acquire_for_write`].
    pub async fn acquire(&self) -> Result<Lent<'_>> {
        let permit = tokio::time::timeout(self.acquire_timeout, self.permits.acquire())
            .await
            .map_err(|_| self.unavailable("no connection free in time"))?
            .map_err(|_| self.unavailable("connections closed"))?;
        let idle = self.lock_idle().pop();
        let (conn, checked) = match idle {
            Some(idle) => (idle.conn, Some(idle.checked)),
            None => (self.connect().await?, None),
        };
        Ok(Lent { conn: Some(conn), checked, owner: self, _permit: permit })
    }

    /// Lends a connection of the set for a write, which is never run
    /// twice: like [`Self::acquire`], but one not known open for
    /// `IDLE_PING_AFTER` (a second) or more is pinged first and replaced
    /// when the ping fails. One in use moments ago, or kept warm by the
    /// keepalive, costs no round trip.
    pub async fn acquire_for_write(&self) -> Result<Lent<'_>> {
        let mut lent = self.acquire().await?;
        if lent.checked.is_some_and(|checked| checked.elapsed() >= super::IDLE_PING_AFTER) {
            self.stats.pinged_before_write.fetch_add(1, Ordering::Relaxed);
            if lent.conn().ping().await.is_err() {
                lent = self.reconnect(lent).await?;
            }
        }
        Ok(lent)
    }

    /// Closes `lent`'s connection and lends a new one in its place.
    async fn reconnect<'a>(&'a self, mut lent: Lent<'a>) -> Result<Lent<'a>> {
        drop(lent.conn.take());
        lent.conn = Some(self.connect().await?);
        lent.checked = None;
        Ok(lent)
    }

    /// Connections idle in the set now (not those out for a keepalive
    /// ping).
    pub fn idle_count(&self) -> usize {
        self.lock_idle().len()
    }

    /// What the set has done to keep its connections usable so far.
    pub fn stats(&self) -> Stats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Stats {
            pinged_before_write: load(&self.stats.pinged_before_write),
            keepalive_pings: load(&self.stats.keepalive_pings),
            dropped_by_keepalive: load(&self.stats.dropped_by_keepalive),
        }
    }

    /// One look of the keepalive: pings each idle connection last known
    /// open `KEEPALIVE_AFTER` ago or more whose last call was within
    /// `keep_warm`, out of the set meanwhile with a permit of its own (so
    /// the set never holds more than `max`: a call that finds none idle
    /// may open one while these are out); puts back those that answered,
    /// in their place by last use, and drops the others.
    async fn keep_alive(&self) {
        let now = Instant::now();
        let due: Vec<(Idle, SemaphorePermit<'_>)> = {
            let mut idle = self.lock_idle();
            let mut due = Vec::new();
            let mut at = 0;
            while at < idle.len() {
                let entry = &idle[at];
                let tended = now.duration_since(entry.used) < self.keep_warm;
                if !tended || now.duration_since(entry.checked) < KEEPALIVE_AFTER {
                    at += 1;
                    continue;
                }
                let Ok(permit) = self.permits.try_acquire() else { break };
                due.push((idle.remove(at), permit));
            }
            due
        };
        if due.is_empty() {
            return;
        }
        let pinged =
            futures::future::join_all(due.into_iter().map(|(mut entry, permit)| async move {
                let ping = tokio::time::timeout(KEEPALIVE_PING_TIMEOUT, entry.conn.ping()).await;
                (entry, matches!(ping, Ok(Ok(()))), permit)
            }))
            .await;
        let mut idle = self.lock_idle();
        let answered = Instant::now();
        for (mut entry, alive, permit) in pinged {
            self.stats.keepalive_pings.fetch_add(1, Ordering::Relaxed);
            if alive {
                entry.checked = answered;
                idle.push(entry);
            } else {
                self.stats.dropped_by_keepalive.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    shard = self.shard.0,
                    "a direct connection did not answer its keepalive ping: dropped"
                );
            }
            // Given back after its connection is idle again (or closed).
            drop(permit);
        }
        idle.sort_by_key(|entry| entry.used);
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn connect(&self) -> Result<MySqlConnection> {
        match tokio::time::timeout(self.acquire_timeout, self.options.connect()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(self.unavailable(&format!("cannot connect: {e}")).into()),
            Err(_) => Err(self.unavailable("cannot connect: timed out").into()),
        }
    }

    fn unavailable(&self, what: &str) -> Error {
        Error::Unavailable(format!("shard {} direct connections: {what}", self.shard.0))
    }
}

/// A connection lent to one call: back to the set by [`Lent::give_back`]
/// once the call ran to its end; dropped otherwise (the call failed or was
/// cancelled, its replies may still be on the wire), which closes its
/// socket.
pub struct Lent<'a> {
    conn: Option<MySqlConnection>,
    /// When it was last known open while idle; `None` for a new connection.
    checked: Option<Instant>,
    owner: &'a DirectConnections,
    _permit: SemaphorePermit<'a>,
}

impl Lent<'_> {
    /// The connection, for one call.
    pub fn conn(&mut self) -> &mut MySqlConnection {
        self.conn.as_mut().expect("a lent connection until given back")
    }

    /// True when the connection sat idle before (the server may have
    /// closed it meanwhile: a failed read is worth one retry elsewhere).
    fn was_idle(&self) -> bool {
        self.checked.is_some()
    }

    /// Gives the connection back: its call ran to its end and left nothing
    /// on it (no reply unread, no transaction open).
    pub fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            let now = Instant::now();
            self.owner.lock_idle().push(Idle { conn, used: now, checked: now });
        }
    }
}

/// The direct connections of every shard.
pub struct ShardConnections {
    shards: Vec<DirectConnections>,
}

impl ShardConnections {
    /// One set per shard.
    pub fn new(shards: Vec<DirectConnections>) -> Self {
        Self { shards }
    }

    /// The set of `shard`, if it is configured.
    pub fn get(&self, shard: ShardId) -> Option<&DirectConnections> {
        self.shards.iter().find(|set| set.shard == shard)
    }

    /// Starts the keepalive of every set (module doc); it ends once the
    /// sets are dropped.
    pub fn spawn_keepalive(self: &Arc<Self>) {
        if self.shards.iter().all(|set| set.keep_warm.is_zero()) {
            return;
        }
        let sets: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(KEEPALIVE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(sets) = sets.upgrade() else { return };
                futures::future::join_all(sets.shards.iter().map(DirectConnections::keep_alive))
                    .await;
            }
        });
    }
}

/// Runs `read` (statements that only read, each run to its end) on one of
/// `direct`'s connections, and again on a new one when it fails on one that
/// sat idle; on one of the pool's when the shard has no direct set, and
/// again on another once when that one turns out broken (as
/// [`super::retrying`] runs a read again).
///
/// `read` is called with the connection and a [`Borrows`], which only lets
/// its future borrow what the caller holds (for `'a`) while it holds the
/// connection (`'c`).
pub async fn read<'a, T>(
    direct: Option<&DirectConnections>,
    pool: &MySqlPool,
    mut read: impl for<'c> FnMut(&'c mut MySqlConnection, Borrows<'c, 'a>) -> BoxFuture<'c, Result<T>>,
) -> Result<T> {
    let Some(direct) = direct else {
        let mut conn = pool.acquire().await?;
        let result = read(&mut conn, PhantomData).await;
        if !result.as_ref().is_err_and(|e| e.is_broken_connection()) {
            return result;
        }
        drop(conn);
        super::note_connection_loss();
        let mut conn = pool.acquire().await?;
        return read(&mut conn, PhantomData).await;
    };
    let mut lent = direct.acquire().await?;
    let mut result = read(lent.conn(), PhantomData).await;
    if result.is_err() && lent.was_idle() {
        lent = direct.reconnect(lent).await?;
        result = read(lent.conn(), PhantomData).await;
    }
    if result.is_ok() {
        lent.give_back();
    }
    result
}

/// Says that `'a` outlives `'c` to a closure given to [`read`] (a bound a
/// closure's signature cannot state otherwise).
pub type Borrows<'c, 'a> = PhantomData<&'c &'a ()>;
