//! Coalesced badge reads: every badge read waiting at the same moment is
//! answered by ONE call of the user state script over all their users.
//!
//! A badge read is a few key lookups, but each script call costs Redis a
//! fixed ~8 µs (argument table, Lua call) and the api a write and a read
//! syscall. Under load, many `GetUnreadCount` calls are in flight at once:
//! reading them together makes Redis and the api pay those costs once per
//! batch instead of once per call. There is no timer: a read is sent as soon
//! as a call slot is free, so an idle api answers a lone read at once, and
//! batches grow only while earlier calls are still on the wire.
//!
//! One reader task owns the queue. It takes up to [`MAX_BATCH`] waiting
//! reads, starts one read for them (at most [`MAX_IN_FLIGHT`] at a time;
//! one script call on a single node, one per slot on a cluster), and hands
//! every caller its own user's state or the read's error. The task ends
//! when the last [`super::Cache`] handle is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{Cache, CachedUserState};
use notify_domain::error::{Error, Result};

/// Most users in one script call (a script blocks Redis while it runs).
pub const MAX_BATCH: usize = 128;
/// Most script calls in flight at once; reads that arrive meanwhile wait
/// for a slot and go out together.
pub const MAX_IN_FLIGHT: usize = 4;

type Reply = oneshot::Sender<Result<CachedUserState, String>>;

/// Queue of badge reads served by the reader task.
#[derive(Clone)]
pub(super) struct UserStateReads {
    queue: mpsc::UnboundedSender<(u64, Reply)>,
    stats: Arc<ReadStats>,
}

/// How many reads the reader served, with how many script calls.
#[derive(Debug, Default)]
struct ReadStats {
    reads: AtomicU64,
    calls: AtomicU64,
}

impl UserStateReads {
    /// Starts the reader task over `cache`, which must be [`Self::idle`]
    /// (a handle whose reads go to the task would keep the task alive).
    pub(super) fn start(cache: Cache) -> Self {
        let (queue, waiting) = mpsc::unbounded_channel();
        let stats = Arc::new(ReadStats::default());
        tokio::spawn(serve(cache, waiting, stats.clone()));
        Self { queue, stats }
    }

    /// Reads that no task serves (every read fails): the reader task's own
    /// handle of the cache, which does not read badges through itself.
    pub(super) fn idle() -> Self {
        let (queue, _) = mpsc::unbounded_channel();
        Self { queue, stats: Arc::default() }
    }

    /// Returns (reads served, script calls made) since the start.
    pub(super) fn stats(&self) -> (u64, u64) {
        (self.stats.reads.load(Ordering::Relaxed), self.stats.calls.load(Ordering::Relaxed))
    }

    /// Reads one user's cached state, together with whatever other reads
    /// are waiting.
    pub(super) async fn read(&self, user_id: u64) -> Result<CachedUserState> {
        let (reply, answer) = oneshot::channel();
        let stopped = || Error::Unavailable("cache: the badge reader stopped".to_owned());
        self.queue.send((user_id, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?.map_err(Error::Unavailable)
    }
}

async fn serve(
    cache: Cache,
    mut waiting: mpsc::UnboundedReceiver<(u64, Reply)>,
    stats: Arc<ReadStats>,
) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // One handle shared by the batches (a Cache clone copies its scripts).
    let cache = Arc::new(cache);
    let batch_sizes = metrics::histogram!("notify_badge_read_batch_size");
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let mut batch = Vec::with_capacity(MAX_BATCH);
        if waiting.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return;
        }
        batch_sizes.record(batch.len() as f64);
        stats.reads.fetch_add(batch.len() as u64, Ordering::Relaxed);
        stats.calls.fetch_add(1, Ordering::Relaxed);
        let cache = cache.clone();
        tokio::spawn(async move {
            let users: Vec<u64> = batch.iter().map(|(user_id, _)| *user_id).collect();
            match cache.read_user_states(&users).await {
                Ok(states) => {
                    for ((_, reply), state) in batch.into_iter().zip(states) {
                        // The caller may have gone (a cancelled RPC).
                        let _ = reply.send(Ok(state));
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    for (_, reply) in batch {
                        let _ = reply.send(Err(message.clone()));
                    }
                }
            }
            drop(slot);
        });
    }
}
