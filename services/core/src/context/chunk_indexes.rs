//! The chunk index of started sends, kept in memory for
//! `GetRecipientStatus`.
//!
//! A status call tests each user without an item against the one chunk of
//! each batch whose user range holds them, which it finds in the send's
//! chunk index: every shard's chunk ids, batches and user ranges. Reading
//! that index from every shard cost more than the item lookups themselves
//! (2,000 entries for a 1M send, on every call). Every chunk of a send is
//! stored before the send starts (appends are refused after); a redrive, a
//! cancel or a recall changes their states, not their ranges, and a bucket
//! move carries items, not chunks. The one change after the start: a
//! bucket move under a send still delivering splits a pending chunk whose
//! users it moved, the chunk narrowing to the users that stayed and the
//! others going into a new chunk (its id's top bit set, a batch of its
//! own) on the shard that owns them now. So an index read once the send
//! started holds for good but for those new chunks: a replica keeps it,
//! and later calls read only the items, the split chunks (once a bucket
//! moved; there are none before) and the chunks they test. A
//! narrowed chunk's kept range is wider than its users, which the test
//! reads from the chunk itself. Chunk states are not kept: the test reads
//! them each time. Retention dropping the chunks leaves entries that match
//! nothing, as the index read then would.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use notify_store::db::recipients::ChunkEnd;
use shard_router::ShardId;

/// Chunk entries kept at most, over every send (40 bytes each: 8 MB, the
/// index of 100 sends of a million recipients); the oldest sends go first.
const MAX_CHUNKS: usize = 200_000;

/// A send's chunk index from one user on: on each shard, the chunks whose
/// last user is `low` or more, sorted by batch and last user.
#[derive(Debug, Clone, Default)]
pub struct ChunkIndex {
    /// Chunks ending before this user are not in it.
    pub low: u64,
    /// Each shard's chunks.
    pub shards: Vec<(ShardId, Vec<ChunkEnd>)>,
}

impl ChunkIndex {
    /// An index as read, each shard's entries sorted as a lookup wants
    /// them.
    pub fn new(low: u64, mut shards: Vec<(ShardId, Vec<ChunkEnd>)>) -> Self {
        for (_, ends) in &mut shards {
            ends.sort_unstable_by_key(|end| (end.batch, end.last_user));
        }
        Self { low, shards }
    }

    fn chunks(&self) -> usize {
        self.shards.iter().map(|(_, ends)| ends.len()).sum()
    }
}

/// The chunk indexes of started sends, oldest kept first out.
#[derive(Debug, Default)]
pub struct ChunkIndexes {
    inner: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    by_send: HashMap<u64, Arc<ChunkIndex>>,
    order: VecDeque<u64>,
    chunks: usize,
    /// Sends whose index was too large to keep, the latest
    /// [`MAX_TOO_LARGE`]: not read again to be kept.
    too_large: VecDeque<u64>,
}

/// Sends remembered as too large to keep.
const MAX_TOO_LARGE: usize = 1_024;

impl ChunkIndexes {
    /// The index of a started send that covers users from `low` on.
    pub fn get(&self, message_id: u64, low: u64) -> Option<Arc<ChunkIndex>> {
        let kept = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        kept.by_send.get(&message_id).filter(|index| index.low <= low).cloned()
    }

    /// The send's index was read to be kept, and was too large: reading it
    /// again for that would be in vain.
    pub fn too_large(&self, message_id: u64) -> bool {
        let kept = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        kept.too_large.contains(&message_id)
    }

    /// Keeps the index of a started send, read after it started (only then
    /// is it final), unless one that covers as much is kept already.
    pub fn keep(&self, message_id: u64, index: Arc<ChunkIndex>) {
        let size = index.chunks();
        let mut kept = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let kept = &mut *kept;
        if size > MAX_CHUNKS {
            if !kept.too_large.contains(&message_id) {
                kept.too_large.push_back(message_id);
                if kept.too_large.len() > MAX_TOO_LARGE {
                    kept.too_large.pop_front();
                }
            }
            return;
        }
        match kept.by_send.get_mut(&message_id) {
            Some(old) if old.low <= index.low => return,
            Some(old) => {
                kept.chunks = kept.chunks - old.chunks() + size;
                *old = index;
            }
            None => {
                kept.by_send.insert(message_id, index);
                kept.order.push_back(message_id);
                kept.chunks += size;
            }
        }
        while kept.chunks > MAX_CHUNKS {
            let Some(oldest) = kept.order.pop_front() else { break };
            if let Some(gone) = kept.by_send.remove(&oldest) {
                kept.chunks -= gone.chunks();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(low: u64, chunks: u64) -> Arc<ChunkIndex> {
        let ends = (0..chunks)
            .map(|i| ChunkEnd { chunk_id: i, state: 0, batch: 1, last_user: i, first_user: i })
            .collect();
        Arc::new(ChunkIndex::new(low, vec![(ShardId(0), ends)]))
    }

    #[test]
    fn an_index_serves_calls_from_its_low_user_on_and_a_wider_one_replaces_it() {
        let indexes = ChunkIndexes::default();
        assert!(indexes.get(7, 0).is_none());
        indexes.keep(7, index(100, 3));
        assert!(indexes.get(7, 99).is_none());
        assert_eq!(indexes.get(7, 100).unwrap().low, 100);
        indexes.keep(7, index(200, 3));
        assert_eq!(indexes.get(7, 500).unwrap().low, 100, "a narrower index is not kept");
        indexes.keep(7, index(5, 4));
        assert_eq!(indexes.get(7, 5).unwrap().low, 5);
        assert_eq!(indexes.inner.lock().unwrap().chunks, 4);
    }

    #[test]
    fn the_oldest_sends_go_once_too_many_chunks_are_kept() {
        let indexes = ChunkIndexes::default();
        let each = MAX_CHUNKS as u64 / 4;
        for send in 1..=5 {
            indexes.keep(send, index(0, each));
        }
        assert!(indexes.get(1, 0).is_none());
        assert!((2..=5).all(|send| indexes.get(send, 0).is_some()));
        assert_eq!(indexes.inner.lock().unwrap().chunks, MAX_CHUNKS);
        assert!(!indexes.too_large(9));
        indexes.keep(9, index(0, MAX_CHUNKS as u64 + 1));
        assert!(indexes.get(9, 0).is_none(), "an index larger than the bound is not kept");
        assert!(indexes.too_large(9), "and is not read again to be kept");
    }
}
