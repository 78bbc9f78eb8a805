//! What the cache hands out, shared by the readers of Redis ([`crate::badge`],
//! [`crate::groups`]) and the api's near copy of it ([`crate::near`]): cached
//! counts and user states, and how a stored count or cursor is read.

use notify_domain::domain::GroupSeq;

/// A user's two badge counts: `unread` is what the list shows as unread,
/// `unseen` what the bell shows (never more than `unread`: reading implies
/// seeing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Unread inbox items.
    pub unread: u64,
    /// Of those, the ones not seen either.
    pub unseen: u64,
}

impl Counts {
    /// The value stored under `epoch`: `epoch:unread:unseen`.
    pub(crate) fn stored_at(self, epoch: u64) -> String {
        format!("{epoch}:{}:{}", self.unread, self.unseen)
    }
}

/// A cached `epoch:unread:unseen` as counts, if they were counted under
/// `epoch`. Any other shape is a miss.
pub(crate) fn count_at(value: Option<&str>, epoch: u64) -> Option<Counts> {
    let mut parts = value?.split(':');
    let (counted_at, unread, unseen) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || counted_at.parse::<u64>().ok()? != epoch {
        return None;
    }
    Some(Counts { unread: unread.parse().ok()?, unseen: unseen.parse().ok()? })
}

/// The value of a group in a user's cached cursors (`{u:ID}:gmem`): the
/// acknowledged seq, and `:m` when the user mutes the group.
pub(crate) fn cursor_value(last_ack_seq: u64, muted: bool) -> String {
    if muted { format!("{last_ack_seq}:m") } else { last_ack_seq.to_string() }
}

/// Reads a cursor entry; `None` for a field that is not a group (the hash's
/// `_` marker) or a value it cannot read.
pub(crate) fn parse_cursor(group: &str, value: &str) -> Option<(u64, u64, bool)> {
    let group_id = group.parse().ok()?;
    let (ack, muted) = match value.split_once(':') {
        Some((ack, "m")) => (ack, true),
        Some(_) => return None,
        None => (value, false),
    };
    Some((group_id, ack.parse().ok()?, muted))
}

/// Cached counts of some users under the epoch they were read at.
#[derive(Debug, Clone)]
pub struct CachedCounts {
    /// The announcement epoch.
    pub epoch: u64,
    /// Each user's cached counts, `None` on a miss.
    pub counts: Vec<Option<Counts>>,
}

/// One of a user's groups as cached: the cursor, and the seq state if cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedGroup {
    /// The group.
    pub group_id: u64,
    /// The user's acknowledged seq.
    pub last_ack_seq: u64,
    /// The group's max seq and recalled seqs, `None` on a miss.
    pub seq: Option<GroupSeq>,
    /// The user mutes the group: its unread stays out of the badge total.
    pub muted: bool,
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
    use super::*;

    #[test]
    fn counts_of_another_epoch_or_shape_are_a_miss() {
        let counts = Counts { unread: 12, unseen: 3 };
        assert_eq!(counts.stored_at(7), "7:12:3");
        assert_eq!(count_at(Some("7:12:3"), 7), Some(counts));
        assert_eq!(count_at(Some("6:12:3"), 7), None);
        assert_eq!(count_at(Some("17:12:3"), 7), None);
        assert_eq!(count_at(Some("7:12"), 7), None, "a count stored before unseen existed");
        assert_eq!(count_at(Some("7:12:3:1"), 7), None);
        assert_eq!(count_at(Some("12"), 7), None);
        assert_eq!(count_at(Some("7::"), 7), None);
        assert_eq!(count_at(None, 7), None);
    }

    #[test]
    fn cursors_carry_the_mute() {
        assert_eq!(parse_cursor("9", &cursor_value(4, false)), Some((9, 4, false)));
        assert_eq!(parse_cursor("9", &cursor_value(4, true)), Some((9, 4, true)));
        assert_eq!(parse_cursor("_", "1"), None);
        assert_eq!(parse_cursor("9", "4:x"), None);
        assert_eq!(parse_cursor("9", "x"), None);
    }
}
