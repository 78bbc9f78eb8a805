//! Property tests: ids spread evenly over buckets and shards.

use proptest::prelude::*;
use shard_router::{BUCKETS, ShardId, ShardMap, bucket_of};

/// Largest relative deviation from a perfectly even split over `counts`.
fn max_skew(counts: &[u64]) -> f64 {
    let mean = counts.iter().sum::<u64>() as f64 / counts.len() as f64;
    counts.iter().map(|c| (*c as f64 - mean).abs() / mean).fold(0.0, f64::max)
}

#[test]
fn one_million_sequential_ids_spread_within_two_percent_over_four_shards() {
    let map = ShardMap::even(&[ShardId(0), ShardId(1), ShardId(2), ShardId(3)]).unwrap();
    let mut counts = [0u64; 4];
    for user_id in 1..=1_000_000u64 {
        counts[map.shard_for_user(user_id).0 as usize] += 1;
    }
    assert!(max_skew(&counts) < 0.02, "skew too high: {counts:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Any window of one million consecutive ids, anywhere in the id space,
    /// spreads within a few percent over 4 shards, and within 20% per bucket.
    #[test]
    fn any_million_consecutive_ids_spread_evenly(start in 1u64..u64::MAX - 1_000_000) {
        let map = ShardMap::even(&[ShardId(0), ShardId(1), ShardId(2), ShardId(3)]).unwrap();
        let mut shard_counts = [0u64; 4];
        let mut bucket_counts = vec![0u64; BUCKETS as usize];
        for user_id in start..start + 1_000_000 {
            shard_counts[map.shard_for_user(user_id).0 as usize] += 1;
            bucket_counts[bucket_of(user_id) as usize] += 1;
        }
        prop_assert!(max_skew(&shard_counts) < 0.03, "shards: {:?}", shard_counts);
        prop_assert!(max_skew(&bucket_counts) < 0.2);
    }

    /// Random (not consecutive) ids spread as well.
    #[test]
    fn random_ids_spread_evenly(ids in prop::collection::vec(any::<u64>(), 200_000)) {
        let map = ShardMap::even(&[ShardId(0), ShardId(1), ShardId(2), ShardId(3)]).unwrap();
        let mut counts = [0u64; 4];
        for id in ids {
            counts[map.shard_for_user(id).0 as usize] += 1;
        }
        prop_assert!(max_skew(&counts) < 0.03, "shards: {:?}", counts);
    }
}
