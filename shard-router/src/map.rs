//! The shard map: bucket ranges assigned to physical shards, validated once,
//! with its text form (`shard=from-to,...;...`), as stored and versioned.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::buckets::BucketSet;
use crate::hash::{BUCKETS, bucket_of, bucket_of_key};
use crate::shard::{BucketRange, ShardId, ShardMapError};

/// A validated assignment of every bucket to exactly one shard.
#[derive(Debug, Clone)]
pub struct ShardMap {
    pub(crate) shards: Vec<ShardId>,
    /// Position in `shards` of each bucket's owner; indexed by bucket.
    pub(crate) owner: Vec<u16>,
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

    /// Returns the map as ranges: each run of consecutive buckets with one
    /// owner, in bucket order. `ShardMap::new(map.shards(), &map.ranges())`
    /// rebuilds the same map.
    pub fn ranges(&self) -> Vec<BucketRange> {
        let mut ranges: Vec<BucketRange> = Vec::new();
        for (bucket, slot) in self.owner.iter().enumerate() {
            let (bucket, shard) = (bucket as u32, self.shards[*slot as usize]);
            match ranges.last_mut() {
                Some(last) if last.shard == shard && last.to + 1 == bucket => last.to = bucket,
                _ => ranges.push(BucketRange { shard, from: bucket, to: bucket }),
            }
        }
        ranges
    }

    /// Returns the map with `shard` added, owning no bucket yet.
    pub fn with_shard(&self, shard: ShardId) -> Result<Self, ShardMapError> {
        let mut shards = self.shards.clone();
        shards.push(shard);
        Self::new(&shards, &self.ranges())
    }

    /// Returns the map with every bucket of `from..=to` given to `shard`,
    /// which must be in the map.
    pub fn with_range(&self, shard: ShardId, from: u32, to: u32) -> Result<Self, ShardMapError> {
        let mut ranges: Vec<BucketRange> = self
            .ranges()
            .into_iter()
            .flat_map(|r| {
                let before = (r.from < from).then(|| BucketRange { to: r.to.min(from - 1), ..r });
                let after = (r.to > to).then(|| BucketRange { from: r.from.max(to + 1), ..r });
                before.into_iter().chain(after)
            })
            .collect();
        ranges.push(BucketRange { shard, from, to });
        ranges.sort_by_key(|r| r.from);
        Self::new(&self.shards, &ranges)
    }

    /// Returns the buckets this map gives to another shard than `earlier`
    /// did: those a change from `earlier` to this map moved.
    pub fn moved_from(&self, earlier: &ShardMap) -> BucketSet {
        let mut moved = BucketSet::EMPTY;
        for bucket in
            (0..BUCKETS).filter(|b| self.shard_of_bucket(*b) != earlier.shard_of_bucket(*b))
        {
            moved.insert_range(bucket, bucket);
        }
        moved
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

/// The text form a map is stored in: each shard in order, `=`, and its
/// ranges, shards separated by `;` (`0=0-511;1=512-1023;2=` has shard 2
/// owning nothing yet).
impl fmt::Display for ShardMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ranges = self.ranges();
        for (index, shard) in self.shards.iter().enumerate() {
            if index > 0 {
                f.write_str(";")?;
            }
            write!(f, "{shard}=")?;
            let mut first = true;
            for range in ranges.iter().filter(|r| r.shard == *shard) {
                if !first {
                    f.write_str(",")?;
                }
                first = false;
                write!(f, "{}-{}", range.from, range.to)?;
            }
        }
        Ok(())
    }
}

impl FromStr for ShardMap {
    type Err = ShardMapError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let malformed = |part: &str, reason| ShardMapError::Malformed { text: part.into(), reason };
        let number = |part: &str| part.trim().parse::<u32>();
        let mut shards = Vec::new();
        let mut ranges = Vec::new();
        for entry in text.split(';') {
            let (shard, list) =
                entry.split_once('=').ok_or_else(|| malformed(entry, "expected shard=ranges"))?;
            let shard = ShardId(number(shard).map_err(|_| malformed(entry, "bad shard id"))?);
            shards.push(shard);
            for range in list.split(',').filter(|r| !r.trim().is_empty()) {
                let (from, to) =
                    range.split_once('-').ok_or_else(|| malformed(range, "expected from-to"))?;
                let (Ok(from), Ok(to)) = (number(from), number(to)) else {
                    return Err(malformed(range, "bad bucket number"));
                };
                ranges.push(BucketRange { shard, from, to });
            }
        }
        Self::new(&shards, &ranges)
    }
}
