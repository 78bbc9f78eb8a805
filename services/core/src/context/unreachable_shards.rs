//! Shards whose live announcements could not be read: every inbox and badge
//! read needs the list of live announcements, gathered from every shard
//! when it is not cached, and a list that lacks a shard is not cached. So
//! that one shard down does not make every read of every user wait for it,
//! a shard that failed is left out at once until a probe in the background
//! reads it again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use shard_router::ShardId;

/// How long a shard that failed is left out before the next probe.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long a probe keeps others from probing the same shard: longer than
/// one takes (its read times out first), so that a probe lost with its
/// task does not leave the shard out for long.
const PROBE_CLAIM: Duration = Duration::from_secs(10);

/// Shards left out of the live announcement list, with when each is due
/// for its next probe.
#[derive(Debug, Default)]
pub struct UnreachableShards {
    next_probe: Mutex<HashMap<ShardId, Instant>>,
}

/// What a read of the list does with a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardRead {
    /// Read it (it answered last time).
    Read,
    /// Leave it out; no probe is due.
    LeaveOut,
    /// Leave it out, and probe it in the background (this caller is the
    /// one that does: the next probe is due [`PROBE_EVERY`] after it failed).
    LeaveOutAndProbe,
}

impl UnreachableShards {
    /// What to do with `shard` now.
    pub fn read(&self, shard: ShardId) -> ShardRead {
        let mut next_probe = self.lock();
        let Some(due) = next_probe.get_mut(&shard) else {
            return ShardRead::Read;
        };
        let now = Instant::now();
        if now < *due {
            return ShardRead::LeaveOut;
        }
        // Claimed by this caller: no other probe until this one failed.
        *due = now + PROBE_CLAIM;
        ShardRead::LeaveOutAndProbe
    }

    /// Notes that `shard` failed a read or a probe.
    pub fn failed(&self, shard: ShardId) {
        self.lock().insert(shard, Instant::now() + PROBE_EVERY);
    }

    /// Notes that `shard` answered: reads ask it again.
    pub fn answered(&self, shard: ShardId) {
        self.lock().remove(&shard);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ShardId, Instant>> {
        self.next_probe.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_shard_is_left_out_and_probed_once_at_a_time() {
        let shards = UnreachableShards::default();
        assert_eq!(shards.read(ShardId(1)), ShardRead::Read);
        shards.failed(ShardId(1));
        assert_eq!(shards.read(ShardId(1)), ShardRead::LeaveOut);
        assert_eq!(shards.read(ShardId(2)), ShardRead::Read);
        // Due: one caller probes, the others go on leaving it out.
        shards.lock().insert(ShardId(1), Instant::now());
        assert_eq!(shards.read(ShardId(1)), ShardRead::LeaveOutAndProbe);
        assert_eq!(shards.read(ShardId(1)), ShardRead::LeaveOut);
        shards.failed(ShardId(1));
        assert_eq!(shards.read(ShardId(1)), ShardRead::LeaveOut);
        shards.answered(ShardId(1));
        assert_eq!(shards.read(ShardId(1)), ShardRead::Read);
    }
}
