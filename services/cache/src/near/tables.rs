//! The copy itself: one slot per key held, with the token protocol that
//! keeps a read overtaken by an invalidation from storing what it read.

use std::collections::HashMap;
use std::time::Instant;

#[cfg(test)]
use crate::values::Counts;
use crate::values::{CachedCounts, CachedGroup, CachedUserState, count_at};
use notify_domain::domain::GroupSeq;

/// A copy of one key: being read (by the read holding the token), or read.
#[derive(Debug, Clone)]
pub(super) enum Slot<T> {
    Pending(u64),
    Ready { value: T, until: Option<Instant> },
}

impl<T> Slot<T> {
    /// The value, while it may be served.
    pub(super) fn fresh(&self, now: Instant) -> Option<&T> {
        match self {
            Self::Ready { value, until } if until.is_none_or(|until| now < until) => Some(value),
            _ => None,
        }
    }

    /// Marks the slot for a read with `token` unless it holds a fresh value.
    pub(super) fn claim(slot: &mut Option<Self>, token: u64, now: Instant) {
        if slot.as_ref().is_none_or(|held| held.fresh(now).is_none()) {
            *slot = Some(Self::Pending(token));
        }
    }

    /// Stores `value` if the slot is still pending for `token`.
    pub(super) fn fill(slot: &mut Option<Self>, token: u64, value: T, until: Option<Instant>) {
        if matches!(slot, Some(Self::Pending(held)) if *held == token) {
            *slot = Some(Self::Ready { value, until });
        }
    }
}

/// A user's group cursors as cached: `(group, last_ack_seq, muted)`, or
/// `None` when the hash is absent.
pub(super) type Cursors = Option<Vec<(u64, u64, bool)>>;

/// A user's two keys.
#[derive(Debug, Default)]
pub(super) struct UserSlots {
    /// `{u:ID}:unread`: the cached `epoch:unread:unseen`, `None` when absent.
    pub(super) unread: Option<Slot<Option<String>>>,
    /// `{u:ID}:gmem`: the cursors (`group, ack, muted`), `None` when absent.
    pub(super) cursors: Option<Slot<Cursors>>,
}

/// Every key held, and the token of the next read.
#[derive(Debug, Default)]
pub(super) struct Tables {
    pub(super) epoch: Option<Slot<u64>>,
    /// `{ann}:active2:EPOCH` of the epoch read last ([`Self::active_slot`]):
    /// the cached active-announcement list, `None` when absent.
    active: Option<Slot<Option<String>>>,
    active_epoch: u64,
    pub(super) users: HashMap<u64, UserSlots>,
    pub(super) seqs: HashMap<u64, Option<Slot<Option<GroupSeq>>>>,
    pub(super) next_token: u64,
    /// The tracking connection whose reads may claim and fill slots (0:
    /// none): a read still running on an older connection, whose keys Redis
    /// tracks for that connection only, must store nothing.
    pub(super) generation: u64,
}

impl Tables {
    /// Drops everything held and lets only `generation`'s reads fill.
    pub(super) fn reset(&mut self, generation: u64) {
        self.clear();
        self.generation = generation;
    }

    /// Takes a token and marks, under it, the slots `mark` names; token 0
    /// (which fills nothing) when the tables belong to another connection
    /// than `generation`.
    pub(super) fn claim(
        &mut self,
        generation: u64,
        mark: impl FnOnce(&mut Self, u64, Instant),
    ) -> u64 {
        if self.generation != generation {
            return 0;
        }
        self.next_token += 1;
        let token = self.next_token;
        mark(self, token, Instant::now());
        token
    }

    pub(super) fn clear(&mut self) {
        self.epoch = None;
        self.active = None;
        self.users.clear();
        self.seqs.clear();
    }

    /// Drops about an eighth of `map` when it holds more than `capacity`
    /// entries (which ones is up to the map's random order).
    pub(super) fn trim<V>(map: &mut HashMap<u64, V>, capacity: usize) {
        if map.len() <= capacity {
            return;
        }
        let victims: Vec<u64> = map.keys().take(map.len() - capacity * 7 / 8).copied().collect();
        for key in victims {
            map.remove(&key);
        }
    }

    /// The epoch and its active-announcement list, if both are held and
    /// fresh.
    pub(super) fn announcements(&self, now: Instant) -> Option<(u64, Option<String>)> {
        let epoch = *self.epoch.as_ref()?.fresh(now)?;
        if self.active_epoch != epoch {
            return None;
        }
        Some((epoch, self.active.as_ref()?.fresh(now)?.clone()))
    }

    /// The slot of `epoch`'s active list (one of another epoch is dropped).
    pub(super) fn active_slot(&mut self, epoch: u64) -> &mut Option<Slot<Option<String>>> {
        if self.active_epoch != epoch {
            self.active_epoch = epoch;
            self.active = None;
        }
        &mut self.active
    }

    /// A user's state, if every key it is made of is held and fresh.
    pub(super) fn user_state(&self, user_id: u64, now: Instant) -> Option<CachedUserState> {
        let epoch = *self.epoch.as_ref()?.fresh(now)?;
        let slots = self.users.get(&user_id)?;
        let unread = slots.unread.as_ref()?.fresh(now)?;
        let cursors = slots.cursors.as_ref()?.fresh(now)?;
        let groups = match cursors {
            None => None,
            Some(cursors) => {
                let mut groups = Vec::with_capacity(cursors.len());
                for (group_id, last_ack_seq, muted) in cursors {
                    let seq = self.seqs.get(group_id)?.as_ref()?.fresh(now)?.clone();
                    groups.push(CachedGroup {
                        group_id: *group_id,
                        last_ack_seq: *last_ack_seq,
                        seq,
                        muted: *muted,
                    });
                }
                Some(groups)
            }
        };
        let badge = CachedCounts { epoch, counts: vec![count_at(unread.as_deref(), epoch)] };
        Some(CachedUserState { badge, groups })
    }
}

/// Which key a name is, among those held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    Epoch,
    Active(u64),
    Unread(u64),
    Cursors(u64),
    Seq(u64),
}

impl Held {
    /// Parses a key name under `prefix`; `None` for keys not held here.
    pub(super) fn parse(prefix: &[u8], key: &[u8]) -> Option<Self> {
        let rest = std::str::from_utf8(key.strip_prefix(prefix)?).ok()?;
        if rest == "{ann}:epoch" {
            return Some(Self::Epoch);
        }
        if let Some(epoch) = rest.strip_prefix("{ann}:active2:") {
            return epoch.parse().ok().map(Self::Active);
        }
        let id = |tagged: &str, suffix: &str| tagged.strip_suffix(suffix)?.parse::<u64>().ok();
        if let Some(user) = rest.strip_prefix("{u:") {
            if let Some(id) = id(user, "}:unread") {
                return Some(Self::Unread(id));
            }
            return id(user, "}:gmem").map(Self::Cursors);
        }
        id(rest.strip_prefix("{g:")?, "}:seq").map(Self::Seq)
    }
}

pub(super) fn forget(tables: &mut Tables, held: Held) {
    match held {
        Held::Epoch => tables.epoch = None,
        Held::Active(epoch) => {
            if tables.active_epoch == epoch {
                tables.active = None;
            }
        }
        Held::Unread(user) => {
            if let Some(slots) = tables.users.get_mut(&user) {
                slots.unread = None;
            }
        }
        Held::Cursors(user) => {
            if let Some(slots) = tables.users.get_mut(&user) {
                slots.cursors = None;
            }
        }
        Held::Seq(group) => {
            tables.seqs.remove(&group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Keys;

    #[test]
    fn key_names_parse_to_what_they_hold() {
        let keys = Keys::new("t:");
        let prefix = b"t:";
        let parse = |key: String| Held::parse(prefix, key.as_bytes());
        assert_eq!(parse(keys.epoch()), Some(Held::Epoch));
        assert_eq!(parse(keys.active_list(12)), Some(Held::Active(12)));
        assert_eq!(parse(keys.unread(42)), Some(Held::Unread(42)));
        assert_eq!(parse(keys.memberships(7)), Some(Held::Cursors(7)));
        assert_eq!(parse(keys.group_seq(9)), Some(Held::Seq(9)));
        assert_eq!(parse(keys.unread_lease(42)), None);
        assert_eq!(parse(keys.status(42)), None);
        assert_eq!(Held::parse(b"other:", keys.unread(42).as_bytes()), None);
    }

    #[test]
    fn a_read_overtaken_by_an_invalidation_stores_nothing() {
        let now = Instant::now();
        let mut slot: Option<Slot<u64>> = None;
        Slot::claim(&mut slot, 1, now);
        slot = None; // the invalidation
        Slot::fill(&mut slot, 1, 5, None);
        assert!(slot.is_none());
        // A later read's claim wins over an earlier one's.
        Slot::claim(&mut slot, 2, now);
        Slot::claim(&mut slot, 3, now);
        Slot::fill(&mut slot, 2, 5, None);
        assert!(slot.as_ref().unwrap().fresh(now).is_none());
        Slot::fill(&mut slot, 3, 6, None);
        assert_eq!(slot.as_ref().unwrap().fresh(now), Some(&6));
        // A fresh value is not claimed again; an expired one is.
        Slot::claim(&mut slot, 4, now);
        assert_eq!(slot.as_ref().unwrap().fresh(now), Some(&6));
        let mut expiring = Some(Slot::Ready { value: 1, until: Some(now) });
        assert!(expiring.as_ref().unwrap().fresh(now).is_none());
        Slot::claim(&mut expiring, 5, now);
        assert!(matches!(expiring, Some(Slot::Pending(5))));
    }

    #[test]
    fn a_read_of_an_older_connection_claims_and_fills_nothing() {
        let mut tables = Tables::default();
        tables.reset(2);
        let stale =
            tables.claim(1, |tables, token, now| Slot::claim(&mut tables.epoch, token, now));
        assert_eq!(stale, 0);
        assert!(tables.epoch.is_none(), "an older connection's read claimed a slot");
        let token =
            tables.claim(2, |tables, token, now| Slot::claim(&mut tables.epoch, token, now));
        assert!(token > 0);
        Slot::fill(&mut tables.epoch, 0, 7, None);
        assert!(tables.epoch.as_ref().unwrap().fresh(Instant::now()).is_none());
        Slot::fill(&mut tables.epoch, token, 7, None);
        assert_eq!(tables.epoch.as_ref().unwrap().fresh(Instant::now()), Some(&7));
        // A reconnect drops everything and hands the tables to the new one.
        tables.reset(3);
        assert!(tables.epoch.is_none());
        assert_eq!(tables.claim(2, |_, _, _| {}), 0);
    }

    #[test]
    fn a_state_is_served_only_when_every_key_of_it_is_held() {
        let now = Instant::now();
        fn ready<T>(value: T) -> Option<Slot<T>> {
            Some(Slot::Ready { value, until: None })
        }
        let mut tables = Tables { epoch: ready(3), ..Tables::default() };
        tables.users.insert(
            1,
            UserSlots {
                unread: ready(Some("3:4:1".to_owned())),
                cursors: ready(Some(vec![(9, 2, true)])),
            },
        );
        assert!(tables.user_state(1, now).is_none(), "group 9's seq is not held");
        tables.seqs.insert(9, ready(Some(GroupSeq::new(5))));
        let state = tables.user_state(1, now).unwrap();
        assert_eq!(state.badge.counts, vec![Some(Counts { unread: 4, unseen: 1 })]);
        assert_eq!(
            state.groups,
            Some(vec![CachedGroup {
                group_id: 9,
                last_ack_seq: 2,
                seq: Some(GroupSeq::new(5)),
                muted: true
            }])
        );
        forget(&mut tables, Held::Epoch);
        assert!(tables.user_state(1, now).is_none());
        tables.epoch = ready(4);
        // A count of another epoch is a miss, as when read from Redis.
        assert_eq!(tables.user_state(1, now).unwrap().badge.counts, vec![None]);
        forget(&mut tables, Held::Cursors(1));
        assert!(tables.user_state(1, now).is_none());
    }

    #[test]
    fn trimming_keeps_the_map_under_its_capacity() {
        let mut map: HashMap<u64, ()> = (0..100).map(|k| (k, ())).collect();
        Tables::trim(&mut map, 100);
        assert_eq!(map.len(), 100);
        map.insert(100, ());
        Tables::trim(&mut map, 100);
        assert_eq!(map.len(), 87);
    }
}
