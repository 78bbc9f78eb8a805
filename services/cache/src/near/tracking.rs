//! The tracking connection: opened with `CLIENT TRACKING ON` over RESP3,
//! its pushes applied in frame order, kept honest by a heartbeat, and
//! replaced (with everything held dropped) when it is lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::tables::{Held, Tables, forget};
use crate::{Keys, cache_error};
use notify_domain::backoff::Reconnect;
use notify_domain::error::Result;

/// Shortest and longest wait before the tracking connection is tried again.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// What the maintenance task shares with readers and the push handler.
pub(super) struct Inner {
    pub(super) client: redis::Client,
    pub(super) keys: Keys,
    pub(super) capacity: usize,
    pub(super) max_lag: Duration,
    pub(super) born: Instant,
    pub(super) tables: Mutex<Tables>,
    /// The tracking connection and its generation, while it is up and
    /// tracking.
    pub(super) conn: Mutex<Option<(MultiplexedConnection, u64)>>,
    /// When the last acknowledged heartbeat was sent, in ms since `born`
    /// (plus one; 0: none since the connection came up).
    pub(super) synced_ms: AtomicU64,
    pub(super) started: AtomicBool,
    /// Which connection is current: pushes of an older one are ignored
    /// (its late disconnection must not end the current one).
    pub(super) generation: AtomicU64,
    /// Cancelled when the connection is lost (a new one per connection).
    pub(super) lost: Mutex<CancellationToken>,
}

impl Inner {
    pub(super) fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn elapsed_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// True while the last acknowledged heartbeat is recent enough.
    pub(super) fn in_sync(&self) -> bool {
        let synced = self.synced_ms.load(Ordering::Acquire);
        synced != 0 && self.elapsed_ms() < synced - 1 + self.max_lag.as_millis() as u64
    }

    /// The tracking connection and its generation: a read claims and
    /// fills slots only while the tables belong to that generation (see
    /// [`Tables::generation`]).
    pub(super) fn connection(&self) -> Option<(MultiplexedConnection, u64)> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops serving copies until a heartbeat confirms the connection again.
    pub(super) fn unsynced(&self) {
        self.synced_ms.store(0, Ordering::Release);
    }

    /// Applies a push from tracking connection `generation` (called by its
    /// reader, in frame order).
    fn on_push(&self, generation: u64, push: &PushInfo) {
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        match push.kind {
            PushKind::Invalidate => match push.data.first() {
                Some(Value::Array(keys)) => {
                    let prefix = self.keys.prefix().as_bytes();
                    let mut tables = self.tables();
                    for key in keys {
                        if let Value::BulkString(key) = key
                            && let Some(held) = Held::parse(prefix, key)
                        {
                            forget(&mut tables, held);
                        }
                    }
                }
                // FLUSHALL / FLUSHDB, or a form not known here.
                _ => self.tables().clear(),
            },
            PushKind::Disconnection => self.disconnected(),
            _ => {}
        }
    }

    /// Serves nothing until a new connection tracks again.
    fn disconnected(&self) {
        self.unsynced();
        self.conn.lock().unwrap_or_else(PoisonError::into_inner).take();
        self.tables().reset(0);
        self.lost.lock().unwrap_or_else(PoisonError::into_inner).cancel();
    }
}

/// Keeps a tracking connection up: connects, turns tracking on, publishes
/// it, and sends heartbeats until it is lost, then starts over.
pub(super) async fn maintain(inner: Arc<Inner>, stop: CancellationToken) {
    let mut backoff = Reconnect::new(RECONNECT_MIN, RECONNECT_MAX);
    while !stop.is_cancelled() {
        // From here on, pushes of the connection before are ignored, so its
        // late disconnection cannot cancel this one's token.
        let generation = inner.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let lost = CancellationToken::new();
        *inner.lost.lock().unwrap_or_else(PoisonError::into_inner) = lost.clone();
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            connected = connect(&inner, generation) => connected,
        };
        match connected {
            Ok(conn) => {
                backoff.reset();
                // Reads still running on an older connection (which Redis
                // tracks for that one only) can neither claim nor fill now.
                inner.tables().reset(generation);
                *inner.conn.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((conn.clone(), generation));
                info!("near cache tracking");
                heartbeat(&inner, conn, &lost, &stop).await;
                inner.disconnected();
            }
            Err(e) if unsupported(&e.to_string()) => {
                // Redis before 6 (no RESP3, no tracking): nothing to wait for.
                warn!(error = %e, "redis cannot track keys (needs 6.0+); near cache off");
                return;
            }
            Err(e) => {
                warn!(error = %e, "near cache cannot connect; badges read redis");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}

/// True when an error says the server speaks neither RESP3 nor tracking.
fn unsupported(error: &str) -> bool {
    let error = error.to_ascii_lowercase();
    error.contains("noproto")
        || error.contains("unknown command 'hello'")
        || error.contains("unknown command `hello`")
        || (error.contains("tracking") && error.contains("unknown"))
}

/// Opens a RESP3 connection whose pushes go to `inner` (as `generation`'s),
/// with tracking on.
async fn connect(inner: &Arc<Inner>, generation: u64) -> Result<MultiplexedConnection> {
    let pushes: Weak<Inner> = Arc::downgrade(inner);
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(3)))
        .set_push_sender(move |push: PushInfo| {
            if let Some(inner) = pushes.upgrade() {
                inner.on_push(generation, &push);
            }
            Ok::<(), std::convert::Infallible>(())
        });
    let mut conn = inner
        .client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(cache_error)?;
    redis::cmd("CLIENT")
        .arg("TRACKING")
        .arg("ON")
        .query_async::<()>(&mut conn)
        .await
        .map_err(cache_error)?;
    Ok(conn)
}

/// Sends a `PING` every quarter of the lag and records when the last one
/// answered was sent; returns when the connection is lost, a `PING`
/// fails, or at `stop`.
async fn heartbeat(
    inner: &Inner,
    mut conn: MultiplexedConnection,
    lost: &CancellationToken,
    stop: &CancellationToken,
) {
    let every = (inner.max_lag / 4).max(Duration::from_millis(10));
    loop {
        let sent = inner.elapsed_ms();
        let ping_cmd = redis::cmd("PING");
        let ping = ping_cmd.query_async::<()>(&mut conn);
        let answered = tokio::select! {
            () = stop.cancelled() => return,
            () = lost.cancelled() => return,
            answered = tokio::time::timeout(inner.max_lag, ping) => answered,
        };
        match answered {
            Ok(Ok(())) => inner.synced_ms.fetch_max(sent + 1, Ordering::AcqRel),
            Ok(Err(e)) => {
                warn!(error = %e, "near cache heartbeat failed; reconnecting");
                return;
            }
            Err(_) => {
                warn!("near cache heartbeat unanswered; reconnecting");
                return;
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = lost.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::unsupported;

    #[test]
    fn servers_without_resp3_or_tracking_are_told_apart_from_outages() {
        assert!(unsupported("NOPROTO unsupported protocol version"));
        assert!(unsupported("ERR unknown command 'HELLO', with args beginning with: '3'"));
        assert!(unsupported("ERR Unknown subcommand or wrong number of arguments for 'TRACKING'"));
        assert!(!unsupported("Connection refused (os error 111)"));
        assert!(!unsupported("timed out"));
    }
}
