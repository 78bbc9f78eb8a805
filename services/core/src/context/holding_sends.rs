//! Sends whose chunks hold recipients back on a shard, so that their next
//! chunks there check preferences before the insert.

use std::collections::HashSet;
use std::sync::Mutex;

use notify_domain::domain::MessageId;
use notify_store::db::chunks::HoldCheck;
use shard_router::ShardId;

/// Sends noted at once at most: past this the set starts over (a send
/// forgotten costs its next chunk on a shard the other way of checking,
/// which then notes it again).
const MAX_SENDS: usize = 10_000;

/// The (shard, send) pairs whose last apply held someone back (a category
/// some recipients mute): their chunks there are applied with
/// [`HoldCheck::First`], which looks each recipient's preferences up once,
/// where [`HoldCheck::InInsert`] looks them up in the insert and again to
/// tell who was held back. A send nobody mutes never enters, and keeps
/// its one statement per apply. Only a hint: either way of checking
/// writes the same items and counts, so a process that forgets (a restart,
/// a full set) pays a little time and nothing else.
#[derive(Debug, Default)]
pub struct HoldingSends {
    sends: Mutex<HashSet<(ShardId, u64)>>,
}

impl HoldingSends {
    /// How to check preferences when applying chunks of `message_id` on
    /// `shard`.
    pub fn check(&self, shard: ShardId, message_id: MessageId) -> HoldCheck {
        let sends = self.sends.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if sends.contains(&(shard, message_id.get())) {
            HoldCheck::First
        } else {
            HoldCheck::InInsert
        }
    }

    /// Notes whether an apply of `message_id` on `shard` held anyone back
    /// (one that held nobody takes the send out: its next apply there
    /// checks in the insert again).
    pub fn note(&self, shard: ShardId, message_id: MessageId, held_any: bool) {
        let key = (shard, message_id.get());
        let mut sends = self.sends.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !held_any {
            sends.remove(&key);
            return;
        }
        if sends.len() >= MAX_SENDS && !sends.contains(&key) {
            sends.clear();
        }
        sends.insert(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_that_held_someone_back_checks_first_until_an_apply_holds_nobody() {
        let sends = HoldingSends::default();
        let (shard, other, send) = (ShardId(1), ShardId(2), MessageId::from_raw(7));
        assert_eq!(sends.check(shard, send), HoldCheck::InInsert);
        sends.note(shard, send, true);
        assert_eq!(sends.check(shard, send), HoldCheck::First);
        assert_eq!(sends.check(other, send), HoldCheck::InInsert, "per shard");
        sends.note(shard, send, false);
        assert_eq!(sends.check(shard, send), HoldCheck::InInsert);
    }

    #[test]
    fn the_set_starts_over_when_full() {
        let sends = HoldingSends::default();
        for id in 0..MAX_SENDS as u64 {
            sends.note(ShardId(0), MessageId::from_raw(id), true);
        }
        assert_eq!(sends.check(ShardId(0), MessageId::from_raw(0)), HoldCheck::First);
        sends.note(ShardId(0), MessageId::from_raw(u64::MAX), true);
        assert_eq!(sends.check(ShardId(0), MessageId::from_raw(0)), HoldCheck::InInsert);
        assert_eq!(sends.check(ShardId(0), MessageId::from_raw(u64::MAX)), HoldCheck::First);
    }
}
