//! The vocabulary of a shard map: shard ids, bucket ranges, and why a map
//! is refused.

use std::fmt;

use serde::Deserialize;

use crate::hash::BUCKETS;

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
    /// A map names a shard this process has no connection settings for.
    #[error("shard {shard} is in the shard map but not in this process's database.shards")]
    NotConfigured {
        /// The shard.
        shard: ShardId,
    },
    /// The text form of a map does not parse.
    #[error("shard map {text:?}: {reason}")]
    Malformed {
        /// The text, or the part of it that failed.
        text: String,
        /// What is wrong.
        reason: &'static str,
    },
}
