//! Groups whose cached seq state a failed Redis write may have left behind
//! MySQL.

use std::collections::HashSet;
use std::sync::Mutex;

use tokio::sync::Notify;

/// Groups noted beyond this many are left to their key's TTL (a Redis
/// outage while this many distinct groups sent: the set's memory is
/// bounded, and a miss or the next send fixes each of them anyway).
const MAX_GROUPS: usize = 100_000;

/// Groups whose cached seq state may be behind MySQL because a write to
/// Redis after a commit failed: a send's raise of the max seq, a recall's
/// merge of its recalled seq. `notify_core::groups::repair_stale_seqs`
/// raises them again from MySQL once Redis answers, so unread counts do
/// not wait for the key's TTL or the group's next send. Held in memory: a
/// process that dies with groups here leaves them to the TTL.
#[derive(Debug, Default)]
pub struct StaleSeqs {
    groups: Mutex<HashSet<u64>>,
    noted: Notify,
}

impl StaleSeqs {
    /// Notes groups whose cache write failed, and wakes the repair.
    pub fn note(&self, group_ids: impl IntoIterator<Item = u64>) {
        let mut dropped = 0u64;
        {
            let mut groups = self.groups.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            for group_id in group_ids {
                if groups.len() < MAX_GROUPS || groups.contains(&group_id) {
                    groups.insert(group_id);
                } else {
                    dropped += 1;
                }
            }
        }
        if dropped > 0 {
            metrics::counter!("notify_group_seq_repairs_dropped_total").increment(dropped);
        }
        self.noted.notify_one();
    }

    /// Takes every group noted so far.
    pub fn take(&self) -> Vec<u64> {
        let mut groups = self.groups.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        groups.drain().collect()
    }

    /// Waits until a group is noted (at once if one was noted since the
    /// last wait).
    pub async fn noted(&self) {
        self.noted.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_note_wakes_a_later_wait_and_each_group_is_taken_once() {
        let stale = StaleSeqs::default();
        stale.note([7, 9, 7]);
        stale.noted().await; // the note came first: its wake-up is kept
        let mut taken = stale.take();
        taken.sort_unstable();
        assert_eq!(taken, [7, 9]);
        assert!(stale.take().is_empty());
    }

    #[test]
    fn the_set_is_bounded_but_a_group_already_held_is_kept() {
        let stale = StaleSeqs::default();
        stale.note(0..MAX_GROUPS as u64);
        stale.note([1, MAX_GROUPS as u64]);
        let taken = stale.take();
        assert_eq!(taken.len(), MAX_GROUPS);
        assert!(!taken.contains(&(MAX_GROUPS as u64)));
    }
}
