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
//! harmless); a write is never run twice, so one
//! idle for `IDLE_PING_AFTER` (a second) is pinged before a write
//! ([`DirectConnections::acquire_for_write`]) and replaced when that fails.

use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use shard_router::ShardId;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool};
use sqlx::{ConnectOptions, Connection as _};
use tokio::sync::{Semaphore, SemaphorePermit};

use notify_domain::error::{Error, Result};

/// At most `max` direct connections to one shard.
pub struct DirectConnections {
    shard: ShardId,
    options: MySqlConnectOptions,
    /// Idle connections with the time each was given back, the last given
    /// back at the end.
    idle: Mutex<Vec<(MySqlConnection, Instant)>>,
    permits: Semaphore,
    acquire_timeout: Duration,
}

impl DirectConnections {
    /// Direct connections to a shard, opened on demand (none until the
    /// first call), at most `max` at once.
    pub fn new(
        shard: ShardId,
        options: MySqlConnectOptions,
        max: usize,
        acquire_timeout: Duration,
    ) -> Self {
        Self {
            shard,
            options,
            idle: Mutex::default(),
            permits: Semaphore::new(max.max(1)),
            acquire_timeout,
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
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let (conn, idle_since) = match idle {
            Some((conn, since)) => (conn, Some(since)),
            None => (self.connect().await?, None),
        };
        Ok(Lent { conn: Some(conn), idle_since, owner: self, _permit: permit })
    }

    /// Lends a connection of the set for a write, which is never run
    /// twice: like [`Self::acquire`], but one idle for
    /// `IDLE_PING_AFTER` (a second) or more is pinged first and replaced
    /// when the ping fails. One in use moments ago costs no round trip.
    pub async fn acquire_for_write(&self) -> Result<Lent<'_>> {
        let mut lent = self.acquire().await?;
        if lent.idle_since.is_some_and(|since| since.elapsed() >= super::IDLE_PING_AFTER)
            && lent.conn().ping().await.is_err()
        {
            lent = self.reconnect(lent).await?;
        }
        Ok(lent)
    }

    /// Closes `lent`'s connection and lends a new one in its place.
    async fn reconnect<'a>(&'a self, mut lent: Lent<'a>) -> Result<Lent<'a>> {
        drop(lent.conn.take());
        lent.conn = Some(self.connect().await?);
        lent.idle_since = None;
        Ok(lent)
    }

    /// Connections idle in the set now.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    async fn connect(&self) -> Result<MySqlConnection> {
        match tokio::time::timeout(self.acquire_timeout, self.options.connect()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(self.unavailable(&format!("cannot connect: {e}"))),
            Err(_) => Err(self.unavailable("cannot connect: timed out")),
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
    /// When it was given back last; `None` for a new connection.
    idle_since: Option<Instant>,
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
        self.idle_since.is_some()
    }

    /// Gives the connection back: its call ran to its end and left nothing
    /// on it (no reply unread, no transaction open).
    pub fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            let mut idle = self.owner.idle.lock().unwrap_or_else(PoisonError::into_inner);
            idle.push((conn, Instant::now()));
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
}

/// Runs `read` (statements that only read, each run to its end) on one of
/// `direct`'s connections, and again on a new one when it fails on one that
/// sat idle; on one of the pool's when the shard has no direct set, and
/// again on another while those turn out broken (as
/// [`super::retry_read_on_broken_connection`]).
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
        let mut more = super::BROKEN_READ_RETRIES;
        loop {
            let mut conn = pool.acquire().await?;
            match read(&mut conn, PhantomData).await {
                Err(e) if e.is_broken_connection() && more > 0 => more -= 1,
                result => return result,
            }
        }
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
