//! What the cache hands out, shared by the readers of Redis ([`crate::badge`],
//! [`crate::groups`]) and the api's near copy of it ([`crate::near`]): cached
//! counts and user states, and how a stored count is read.

/// A cached `epoch:count` as a count, if it was counted under `epoch`.
pub(crate) fn count_at(value: Option<&str>, epoch: u64) -> Option<u64> {
    let (counted_at, count) = value?.split_once(':')?;
    (counted_at.parse::<u64>().ok()? == epoch).then(|| count.parse().ok()).flatten()
}

/// Cached counts of some users under the epoch they were read at.
#[derive(Debug, Clone)]
pub struct CachedCounts {
    /// The announcement epoch.
    pub epoch: u64,
    /// Each user's cached count, `None` on a miss.
    pub counts: Vec<Option<u64>>,
}

/// One of a user's groups as cached: the cursor, and the max seq if cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedGroup {
    /// The group.
    pub group_id: u64,
    /// The user's acknowledged seq.
    pub last_ack_seq: u64,
    /// The group's max seq, `None` on a miss.
    pub max_seq: Option<u64>,
}

/// A user's cached badge and group cursors.
#[derive(Debug, Clone)]
pub struct CachedUserState {
    /// The inbox badge (one entry) under the epoch it was read at.
    pub badge: CachedCounts,
    /// The user's groups, `None` when their cursors are not cached.
    pub groups: Option<Vec<CachedGroup>>,
}

#[cfg(test)]
mod tests {
    use super::count_at;

    #[test]
    fn a_count_of_another_epoch_is_a_miss() {
        assert_eq!(count_at(Some("7:12"), 7), Some(12));
        assert_eq!(count_at(Some("6:12"), 7), None);
        assert_eq!(count_at(Some("17:12"), 7), None);
        assert_eq!(count_at(Some("12"), 7), None);
        assert_eq!(count_at(Some("7:"), 7), None);
        assert_eq!(count_at(None, 7), None);
    }
}
