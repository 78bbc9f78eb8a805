//! Deletes the records of published events (the event outbox,
//! `crate::events`) in the background, in batches per shard: one statement
//! per shard and batch, off the calls' path.

use std::collections::BTreeMap;

use shard_router::ShardId;
use tracing::warn;

use notify_store::db::{ShardPools, event_outbox};

/// Most records one delete takes.
const FORGET_BATCH: usize = 1000;

/// Deletes the records of published events.
pub struct OutboxCleaner {
    forgotten: tokio::sync::mpsc::UnboundedSender<(ShardId, u64)>,
}

impl OutboxCleaner {
    /// A cleaner deleting from `pools`, in a task of its own that ends
    /// with the last handle.
    pub fn start(pools: ShardPools) -> Self {
        let (forgotten, mut published) = tokio::sync::mpsc::unbounded_channel::<(ShardId, u64)>();
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(FORGET_BATCH);
            while published.recv_many(&mut batch, FORGET_BATCH).await > 0 {
                let mut by_shard: BTreeMap<ShardId, Vec<u64>> = BTreeMap::new();
                for (shard, id) in batch.drain(..) {
                    by_shard.entry(shard).or_default().push(id);
                }
                for (shard, ids) in by_shard {
                    let Some(pool) = pools.get(shard) else { continue };
                    // Not deleted: the relay publishes them again, which is
                    // only redundant.
                    if let Err(e) = event_outbox::remove(pool, &ids).await {
                        warn!(error = %e, shard = %shard, "could not forget published events");
                    }
                }
            }
        });
        Self { forgotten }
    }

    /// Forgets one published event's record.
    pub fn forget(&self, shard: ShardId, id: u64) {
        let _ = self.forgotten.send((shard, id));
    }
}
