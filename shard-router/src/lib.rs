//! Maps user ids to buckets to shards, and message ids to home shards.
//!
//! The mapping has two fixed layers and one configurable layer:
//!
//! 1. [`stable_hash`] mixes a 64-bit id with the MurmurHash3 `fmix64` finalizer.
//!    It is fixed forever: changing it would move every user's data. The unit
//!    tests pin known vectors so a change cannot slip through.
//! 2. `bucket = stable_hash(id) % BUCKETS` with [`BUCKETS`] = 1024 virtual buckets.
//! 3. A [`ShardMap`] assigns contiguous bucket ranges to physical shards. Adding a
//!    shard later moves whole buckets to it; users are never rehashed.
//!
//! Nothing here does I/O: [`Shards`] holds one value (a connection pool, in the
//! services) per shard and routes to it.

mod buckets;
mod hash;
mod map;
mod routing;
mod shard;
#[cfg(test)]
mod tests;

pub use buckets::BucketSet;
pub use hash::{BUCKETS, bucket_of, bucket_of_key, stable_hash, stable_hash_str};
pub use map::ShardMap;
pub use routing::{Key, Routed, Shards, Snapshot};
pub use shard::{BucketRange, ShardId, ShardMapError};
