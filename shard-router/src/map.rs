//! The shard map: bucket ranges assigned to physical shards, validated once.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;

use crate::hash::{BUCKETS, bucket_of, bucket_of_key};

/// Identifies a physical shard, as named in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(transparent)]
pub struct ShardId(pub u32);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An inclusive range of buckets served by one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct BucketRange {
    /// Shard that owns the range.
    pub shard: ShardId,
    /// First bucket of the range.
    pub from: u32,
    /// Last bucket of the range, inclusive.
    pub to: u32,
}

/// Why a shard map was rejected. Each message names the offending setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShardMapError {
    /// No shard is defined.
    #[error("database.shards: at least one shard is required")]
    NoShards,
    /// Two shards share an id.
    #[error("database.shards[{index}]: shard id {shard} is defined twice")]
    DuplicateShard {
        /// Position of the second definition.
        index: usize,
        /// The repeated id.
        shard: ShardId,
    },
    /// A range names a shard that is not defined.
    #[error("database.bucket_ranges[{index}]: shard {shard} is not defined in database.shards")]
    UnknownShard {
        /// Position of the range.
        index: usize,
        /// The unknown id.
        shard: ShardId,
    },
    /// A range is empty or reaches past the last bucket.
    #[error(
        "database.bucket_ranges[{index}]: range {from}..={to} must satisfy from <= to < {BUCKETS}"
    )]
    BadRange {
        /// Position of the range.
        index: usize,
        /// First bucket.
        from: u32,
        /// Last bucket.
        to: u32,
    },
    /// Two ranges claim the same bucket.
    #[error(
        "database.bucket_ranges[{index}]: bucket {bucket} is already assigned to shard {owner}"
    )]
    Overlap {
        /// Position of the later range.
        index: usize,
        /// First bucket claimed twice.
        bucket: u32,
        /// Shard of the earlier range.
        owner: ShardId,
    },
    /// Some bucket has no shard.
    #[error("database.bucket_ranges: bucket {bucket} is not assigned to any shard")]
    Uncovered {
        /// First unassigned bucket.
        bucket: u32,
    },
}

/// A validated assignment of every bucket to exactly one shard.
#[derive(Debug, Clone)]
pub struct ShardMap {
    shards: Vec<ShardId>,
    /// Position in `shards` of each bucket's owner; indexed by bucket.
    owner: Vec<u16>,
}

impl ShardMap {
    /// Validates `ranges` against `shards` and builds the lookup table.
    pub fn new(shards: &[ShardId], ranges: &[BucketRange]) -> Result<Self, ShardMapError> {
        if shards.is_empty() {
            return Err(ShardMapError::NoShards);
        }
        let mut position = HashMap::new();
        for (index, shard) in shards.iter().enumerate() {
            if position.insert(*shard, index as u16).is_some() {
                return Err(ShardMapError::DuplicateShard { index, shard: *shard });
            }
        }
        let mut owner: Vec<Option<u16>> = vec![None; BUCKETS as usize];
        for (index, range) in ranges.iter().enumerate() {
            let Some(&slot) = position.get(&range.shard) else {
                return Err(ShardMapError::UnknownShard { index, shard: range.shard });
            };
            if range.from > range.to || range.to >= BUCKETS {
                return Err(ShardMapError::BadRange { index, from: range.from, to: range.to });
            }
            for bucket in range.from..=range.to {
                if let Some(existing) = owner[bucket as usize] {
                    let owner = shards[existing as usize];
                    return Err(ShardMapError::Overlap { index, bucket, owner });
                }
                owner[bucket as usize] = Some(slot);
            }
        }
        let owner = owner
            .into_iter()
            .enumerate()
            .map(|(bucket, slot)| slot.ok_or(ShardMapError::Uncovered { bucket: bucket as u32 }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { shards: shards.to_vec(), owner })
    }

    /// Splits the buckets evenly over `shards`, in order.
    pub fn even(shards: &[ShardId]) -> Result<Self, ShardMapError> {
        Self::new(shards, &Self::even_ranges(shards))
    }

    /// Returns the ranges that split the buckets evenly over `shards`, in order.
    pub fn even_ranges(shards: &[ShardId]) -> Vec<BucketRange> {
        let count = shards.len() as u32;
        shards
            .iter()
            .enumerate()
            .map(|(i, shard)| {
                let i = i as u32;
                BucketRange {
                    shard: *shard,
                    from: i * BUCKETS / count,
                    to: (i + 1) * BUCKETS / count - 1,
                }
            })
            .collect()
    }

    /// Returns the shards in configuration order.
    pub fn shards(&self) -> &[ShardId] {
        &self.shards
    }

    /// Returns the shard that owns a bucket.
    pub fn shard_of_bucket(&self, bucket: u32) -> ShardId {
        self.shards[self.slot_of_bucket(bucket)]
    }

    /// Returns the shard that stores everything about a user.
    pub fn shard_for_user(&self, user_id: u64) -> ShardId {
        self.shard_of_bucket(bucket_of(user_id))
    }

    /// Returns the home shard of a message's control record.
    pub fn home_shard_for_message(&self, message_id: u64) -> ShardId {
        self.shard_of_bucket(bucket_of(message_id))
    }

    /// Returns the shard that owns a string key (an idempotency key, say).
    pub fn shard_for_key(&self, key: &str) -> ShardId {
        self.shard_of_bucket(bucket_of_key(key))
    }

    /// Returns the position of a shard in [`Self::shards`].
    pub fn slot_of(&self, shard: ShardId) -> Option<usize> {
        self.shards.iter().position(|s| *s == shard)
    }

    fn slot_of_bucket(&self, bucket: u32) -> usize {
        self.owner[(bucket % BUCKETS) as usize] as usize
    }

    /// Groups user ids by their shard, keeping each group's input order.
    pub fn partition_users(&self, user_ids: &[u64]) -> Vec<(ShardId, Vec<u64>)> {
        let mut groups: Vec<Vec<u64>> = vec![Vec::new(); self.shards.len()];
        for &user_id in user_ids {
            groups[self.slot_of_bucket(bucket_of(user_id))].push(user_id);
        }
        self.shards.iter().copied().zip(groups).filter(|(_, users)| !users.is_empty()).collect()
    }

    /// Groups group ids by their home shard, like [`Self::partition_users`]
    /// (a group id hashes exactly like a user id).
    pub fn partition_groups(&self, group_ids: &[u64]) -> Vec<(ShardId, Vec<u64>)> {
        self.partition_users(group_ids)
    }
}

/// One value per shard (a connection pool, say), routed by a [`ShardMap`].
#[derive(Debug, Clone)]
pub struct Shards<T> {
    map: ShardMap,
    members: Vec<T>,
}

impl<T> Shards<T> {
    /// Pairs each shard of `map` with the value `make` builds for it.
    pub fn build<E>(map: ShardMap, make: impl FnMut(ShardId) -> Result<T, E>) -> Result<Self, E> {
        let members = map.shards().iter().copied().map(make).collect::<Result<_, _>>()?;
        Ok(Self { map, members })
    }

    /// Returns the shard map.
    pub fn map(&self) -> &ShardMap {
        &self.map
    }

    /// Returns the value of a shard, if the shard exists.
    pub fn get(&self, shard: ShardId) -> Option<&T> {
        self.map.slot_of(shard).map(|slot| &self.members[slot])
    }

    /// Returns the value of the shard that stores a user.
    pub fn for_user(&self, user_id: u64) -> (ShardId, &T) {
        let slot = self.map.slot_of_bucket(bucket_of(user_id));
        (self.map.shards[slot], &self.members[slot])
    }

    /// Returns the value of a message's home shard.
    pub fn for_message(&self, message_id: u64) -> (ShardId, &T) {
        self.for_user(message_id)
    }

    /// Returns the value of a group's home shard.
    pub fn for_group(&self, group_id: u64) -> (ShardId, &T) {
        self.for_user(group_id)
    }

    /// Returns the value of the shard that owns a string key.
    pub fn for_key(&self, key: &str) -> (ShardId, &T) {
        let slot = self.map.slot_of_bucket(bucket_of_key(key));
        (self.map.shards[slot], &self.members[slot])
    }

    /// Iterates over every shard and its value, in configuration order.
    pub fn iter(&self) -> impl Iterator<Item = (ShardId, &T)> {
        self.map.shards.iter().copied().zip(self.members.iter())
    }

    /// Returns the number of shards.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Returns true when there is no shard (never, for a validated map).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Vec<ShardId> {
        (0..n).map(ShardId).collect()
    }

    #[test]
    fn even_map_covers_every_bucket_in_order() {
        let map = ShardMap::even(&ids(4)).unwrap();
        assert_eq!(map.shard_of_bucket(0), ShardId(0));
        assert_eq!(map.shard_of_bucket(255), ShardId(0));
        assert_eq!(map.shard_of_bucket(256), ShardId(1));
        assert_eq!(map.shard_of_bucket(1023), ShardId(3));
    }

    #[test]
    fn known_users_land_on_known_shards() {
        let map = ShardMap::even(&ids(4)).unwrap();
        // bucket 812 -> shard 3, bucket 460 -> shard 1, bucket 999 -> shard 3.
        assert_eq!(map.shard_for_user(1), ShardId(3));
        assert_eq!(map.shard_for_user(42), ShardId(1));
        assert_eq!(map.shard_for_user(2), ShardId(3));
    }

    #[test]
    fn unknown_shard_in_range_is_rejected_with_its_setting() {
        let ranges = [BucketRange { shard: ShardId(9), from: 0, to: 1023 }];
        let err = ShardMap::new(&ids(2), &ranges).unwrap_err();
        assert_eq!(err, ShardMapError::UnknownShard { index: 0, shard: ShardId(9) });
        assert!(err.to_string().starts_with("database.bucket_ranges[0]: shard 9"));
    }

    #[test]
    fn overlapping_ranges_are_rejected() {
        let ranges = [
            BucketRange { shard: ShardId(0), from: 0, to: 600 },
            BucketRange { shard: ShardId(1), from: 500, to: 1023 },
        ];
        let err = ShardMap::new(&ids(2), &ranges).unwrap_err();
        assert_eq!(err, ShardMapError::Overlap { index: 1, bucket: 500, owner: ShardId(0) });
    }

    #[test]
    fn gaps_and_bad_ranges_are_rejected() {
        let gap = [
            BucketRange { shard: ShardId(0), from: 0, to: 100 },
            BucketRange { shard: ShardId(1), from: 102, to: 1023 },
        ];
        assert_eq!(
            ShardMap::new(&ids(2), &gap).unwrap_err(),
            ShardMapError::Uncovered { bucket: 101 }
        );
        let past_end = [BucketRange { shard: ShardId(0), from: 0, to: 1024 }];
        assert!(matches!(
            ShardMap::new(&ids(1), &past_end),
            Err(ShardMapError::BadRange { index: 0, .. })
        ));
        assert_eq!(ShardMap::new(&[], &[]).unwrap_err(), ShardMapError::NoShards);
        assert!(matches!(
            ShardMap::even(&[ShardId(1), ShardId(1)]),
            Err(ShardMapError::DuplicateShard { index: 1, .. })
        ));
    }

    #[test]
    fn moving_a_range_to_a_new_shard_moves_only_its_buckets() {
        let before = ShardMap::even(&ids(2)).unwrap();
        let after = ShardMap::new(
            &ids(3),
            &[
                BucketRange { shard: ShardId(0), from: 0, to: 511 },
                BucketRange { shard: ShardId(1), from: 512, to: 767 },
                BucketRange { shard: ShardId(2), from: 768, to: 1023 },
            ],
        )
        .unwrap();
        for user_id in 1..10_000u64 {
            let (old, new) = (before.shard_for_user(user_id), after.shard_for_user(user_id));
            if bucket_of(user_id) < 768 {
                assert_eq!(old, new, "user {user_id} moved although its bucket did not");
            } else {
                assert_eq!(new, ShardId(2));
            }
        }
    }

    #[test]
    fn partition_keeps_every_id_once() {
        let map = ShardMap::even(&ids(4)).unwrap();
        let users: Vec<u64> = (1..=5000).collect();
        let groups = map.partition_users(&users);
        let mut all: Vec<u64> = groups.iter().flat_map(|(_, u)| u.iter().copied()).collect();
        all.sort_unstable();
        assert_eq!(all, users);
        for (shard, users) in groups {
            assert!(users.iter().all(|u| map.shard_for_user(*u) == shard));
        }
    }

    #[test]
    fn shards_route_to_their_member() {
        let shards =
            Shards::build(ShardMap::even(&ids(4)).unwrap(), |id| Ok::<_, ()>(format!("pool-{id}")))
                .unwrap();
        assert_eq!(shards.len(), 4);
        let (shard, pool) = shards.for_user(42);
        assert_eq!(pool, &format!("pool-{shard}"));
        assert_eq!(shards.get(ShardId(3)).map(String::as_str), Some("pool-3"));
        assert!(shards.get(ShardId(7)).is_none());
    }
}
