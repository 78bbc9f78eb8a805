//! A set of buckets, such as the buckets a move has frozen for writes.

use std::fmt;
use std::str::FromStr;

use crate::hash::BUCKETS;
use crate::shard::ShardMapError;

const WORDS: usize = (BUCKETS as usize).div_ceil(64);

/// A set of buckets (a bitmap of [`BUCKETS`] bits). Its text form lists
/// inclusive ranges, `512-767,900-900`; the empty set is the empty string.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketSet([u64; WORDS]);

impl BucketSet {
    /// The empty set.
    pub const EMPTY: Self = Self([0; WORDS]);

    /// The buckets `from..=to` (nothing past the last bucket).
    pub fn range(from: u32, to: u32) -> Self {
        let mut set = Self::EMPTY;
        set.insert_range(from, to);
        set
    }

    /// Adds the buckets `from..=to`.
    pub fn insert_range(&mut self, from: u32, to: u32) {
        for bucket in from..=to.min(BUCKETS - 1) {
            self.0[bucket as usize / 64] |= 1 << (bucket % 64);
        }
    }

    /// Returns the buckets of either set.
    pub fn union(self, other: Self) -> Self {
        let mut words = self.0;
        for (word, theirs) in words.iter_mut().zip(other.0) {
            *word |= theirs;
        }
        Self(words)
    }

    /// Returns true when `bucket` is in the set.
    pub fn contains(&self, bucket: u32) -> bool {
        bucket < BUCKETS && self.0[bucket as usize / 64] & (1 << (bucket % 64)) != 0
    }

    /// Returns true when the set has no bucket.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|word| *word == 0)
    }

    /// Returns the number of buckets in the set.
    pub fn len(&self) -> u32 {
        self.0.iter().map(|word| word.count_ones()).sum()
    }

    /// The set's inclusive ranges, in bucket order.
    pub fn ranges(&self) -> Vec<(u32, u32)> {
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        for bucket in (0..BUCKETS).filter(|b| self.contains(*b)) {
            match ranges.last_mut() {
                Some((_, to)) if *to + 1 == bucket => *to = bucket,
                _ => ranges.push((bucket, bucket)),
            }
        }
        ranges
    }
}

impl fmt::Debug for BucketSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BucketSet({self})")
    }
}

impl fmt::Display for BucketSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, (from, to)) in self.ranges().into_iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            write!(f, "{from}-{to}")?;
        }
        Ok(())
    }
}

impl FromStr for BucketSet {
    type Err = ShardMapError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let malformed = |part: &str, reason| ShardMapError::Malformed { text: part.into(), reason };
        let mut set = Self::EMPTY;
        for range in text.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let (from, to) = range.split_once('-').unwrap_or((range, range));
            let (Ok(from), Ok(to)) = (from.trim().parse::<u32>(), to.trim().parse::<u32>()) else {
                return Err(malformed(range, "bad bucket number"));
            };
            if from > to || to >= BUCKETS {
                return Err(malformed(range, "a bucket range must satisfy from <= to < 1024"));
            }
            set.insert_range(from, to);
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_hold_their_ranges_and_round_trip_through_text() {
        let mut set = BucketSet::range(512, 767);
        set.insert_range(900, 900);
        set.insert_range(1020, 5000);
        assert!(set.contains(512) && set.contains(767) && set.contains(900) && set.contains(1023));
        assert!(!set.contains(511) && !set.contains(768) && !set.contains(899));
        assert!(!set.contains(1024));
        assert_eq!(set.len(), 256 + 1 + 4);
        assert_eq!(set.to_string(), "512-767,900-900,1020-1023");
        assert_eq!(set.to_string().parse::<BucketSet>().unwrap(), set);
        assert_eq!("7".parse::<BucketSet>().unwrap(), BucketSet::range(7, 7));
        assert!("".parse::<BucketSet>().unwrap().is_empty());
        assert_eq!(BucketSet::EMPTY.to_string(), "");
        let union = BucketSet::range(3, 5).union(BucketSet::range(5, 9));
        assert_eq!(union, BucketSet::range(3, 9));
        assert_eq!(BucketSet::EMPTY.union(union), union);
        for bad in ["x", "5-4", "0-1024", "1-"] {
            assert!(bad.parse::<BucketSet>().is_err(), "{bad:?} parsed");
        }
    }
}
