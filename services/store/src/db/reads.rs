//! Connections for hot single-statement reads (inbox pages), kept apart
//! from sqlx's pool.
//!
//! sqlx's pool pings every connection it gets back before it lends it again
//! (`PoolConnection` drop: a `COM_PING` round trip per query), which on an
//! inbox page costs the api about as much CPU as decoding the page, and
//! MariaDB a wake-up per query. A read that ran to its end leaves nothing
//! on its connection, so these connections go back to their set without a
//! ping; one whose read failed or was cancelled half-way (its future
//! dropped, replies maybe still on the wire) is closed instead. A read on a
//! connection that sat idle is run again on a new one when it fails
//! ([`ReadConnections::reconnect`]), so a connection the server closed
//! meanwhile costs a reconnect, not an error (these statements only read,
//! so running one twice is harmless).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use shard_router::ShardId;
use sqlx::ConnectOptions;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use tokio::sync::{Semaphore, SemaphorePermit};

use notify_domain::error::{Error, Result};

/// At most `max` read connections to one shard.
pub struct ReadConnections {
    shard: ShardId,
    options: MySqlConnectOptions,
    idle: Mutex<Vec<MySqlConnection>>,
    permits: Semaphore,
    acquire_timeout: Duration,
}

impl ReadConnections {
    /// Read connections to a shard, opened on demand (none until the first
    /// read), at most `max` at once.
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

    /// Lends a connection of the set: an idle one if there is one, else a
    /// new one. Give it back with [`Lent::give_back`] once a read ran to
    /// its end; if a read on an idle one fails, [`Self::reconnect`] and run
    /// it again.
    pub async fn acquire(&self) -> Result<Lent<'_>> {
        let permit = tokio::time::timeout(self.acquire_timeout, self.permits.acquire())
            .await
            .map_err(|_| self.unavailable("no read connection free in time"))?
            .map_err(|_| self.unavailable("read connections closed"))?;
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let was_idle = idle.is_some();
        let conn = match idle {
            Some(conn) => conn,
            None => self.connect().await?,
        };
        Ok(Lent { conn: Some(conn), was_idle, owner: self, _permit: permit })
    }

    /// Closes `lent`'s connection and lends a new one in its place.
    pub async fn reconnect<'a>(&'a self, mut lent: Lent<'a>) -> Result<Lent<'a>> {
        drop(lent.conn.take());
        lent.conn = Some(self.connect().await?);
        lent.was_idle = false;
        Ok(lent)
    }

    async fn connect(&self) -> Result<MySqlConnection> {
        match tokio::time::timeout(self.acquire_timeout, self.options.connect()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(self.unavailable(&format!("cannot connect: {e}"))),
            Err(_) => Err(self.unavailable("cannot connect: timed out")),
        }
    }

    fn unavailable(&self, what: &str) -> Error {
        Error::Unavailable(format!("shard {} reads: {what}", self.shard.0))
    }
}

/// A connection lent to one read: back to the set by
/// [`Lent::give_back`] once the read ran to its end; dropped otherwise (the
/// read failed or was cancelled, its replies may still be on the wire),
/// which closes its socket.
pub struct Lent<'a> {
    conn: Option<MySqlConnection>,
    was_idle: bool,
    owner: &'a ReadConnections,
    _permit: SemaphorePermit<'a>,
}

impl Lent<'_> {
    /// The connection, for one read.
    pub fn conn(&mut self) -> &mut MySqlConnection {
        self.conn.as_mut().expect("a lent connection until given back")
    }

    /// True when the connection sat idle before (the server may have
    /// closed it meanwhile: a failed read is worth one retry elsewhere).
    pub fn was_idle(&self) -> bool {
        self.was_idle
    }

    /// Gives the connection back: its read ran to its end.
    pub fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            self.owner.idle.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
        }
    }
}

/// The read connections of every shard.
pub struct ShardReads {
    shards: Vec<ReadConnections>,
}

impl ShardReads {
    /// One set per shard.
    pub fn new(shards: Vec<ReadConnections>) -> Self {
        Self { shards }
    }

    /// The set of `shard`, if it is configured.
    pub fn get(&self, shard: ShardId) -> Option<&ReadConnections> {
        self.shards.iter().find(|set| set.shard == shard)
    }
}
