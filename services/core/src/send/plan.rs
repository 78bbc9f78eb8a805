//! Cutting a batch of recipients into chunks: pure and deterministic, so a
//! retried batch produces exactly the same chunk ids and contents.

use shard_router::{ShardId, ShardMap};

use notify_domain::error::{Error, Result};
use notify_store::db::chunks::ChunkPlan;

/// Bits of a chunk id that number the chunks of one batch.
pub const SEQUENCE_BITS: u32 = 20;
/// Largest batch number a client may use.
pub const MAX_BATCH_NUMBER: u64 = (1 << 40) - 1;

/// Splits sorted, distinct `user_ids` by shard and cuts each shard's share
/// into chunks of at most `chunk_size`. Chunk ids are
/// `batch_number << 20 | sequence`, numbered across shards in shard order.
pub fn plan_batch(
    map: &ShardMap,
    batch_number: u64,
    user_ids: &[u64],
    vars: Option<&[String]>,
    chunk_size: usize,
) -> Result<Vec<(ShardId, Vec<ChunkPlan>)>> {
    // Each recipient's vars follow them to their shard and chunk (found
    // by their place in `user_ids`, which is sorted).
    let vars_of = |user: &u64| user_ids.binary_search(user).ok().and_then(|at| vars?.get(at));
    if batch_number > MAX_BATCH_NUMBER {
        return Err(Error::invalid("batch_number", &format!("must be at most {MAX_BATCH_NUMBER}")));
    }
    let mut sequence: u64 = 0;
    let mut planned = Vec::new();
    for (shard, users) in map.partition_users(user_ids) {
        let mut chunks = Vec::with_capacity(users.len().div_ceil(chunk_size));
        for part in users.chunks(chunk_size) {
            if sequence >= 1 << SEQUENCE_BITS {
                return Err(Error::invalid("user_ids", "too many chunks in one batch"));
            }
            let vars = vars.map(|_| part.iter().filter_map(vars_of).cloned().collect());
            chunks.push(ChunkPlan {
                chunk_id: (batch_number << SEQUENCE_BITS) | sequence,
                user_ids: part.to_vec(),
                vars,
            });
            sequence += 1;
        }
        planned.push((shard, chunks));
    }
    Ok(planned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ShardMap {
        ShardMap::even(&[ShardId(0), ShardId(1), ShardId(2), ShardId(3)]).unwrap()
    }

    #[test]
    fn every_user_lands_in_exactly_one_chunk_on_its_shard() {
        let users: Vec<u64> = (1..=10_001).collect();
        let plan = plan_batch(&map(), 3, &users, None, 500).unwrap();
        let mut seen = Vec::new();
        for (shard, chunks) in &plan {
            for chunk in chunks {
                assert!(chunk.user_ids.len() <= 500);
                assert_eq!(chunk.chunk_id >> SEQUENCE_BITS, 3);
                for user in &chunk.user_ids {
                    assert_eq!(map().shard_for_user(*user), *shard);
                }
                seen.extend_from_slice(&chunk.user_ids);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, users);
    }

    #[test]
    fn planning_is_deterministic_and_ids_are_unique() {
        let users: Vec<u64> = (1..=3_000).map(|i| i * 7).collect();
        let first = plan_batch(&map(), 1, &users, None, 500).unwrap();
        assert_eq!(first, plan_batch(&map(), 1, &users, None, 500).unwrap());
        let mut ids: Vec<u64> =
            first.iter().flat_map(|(_, c)| c.iter().map(|c| c.chunk_id)).collect();
        let count = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), count);
    }

    #[test]
    fn oversized_batch_number_is_rejected() {
        assert!(plan_batch(&map(), MAX_BATCH_NUMBER + 1, &[1], None, 500).is_err());
    }

    #[test]
    fn each_recipients_vars_follow_them_to_their_chunk() {
        let users: Vec<u64> = (1..=2_000).collect();
        let vars: Vec<String> = users.iter().map(|u| format!("{{\"n\":\"{u}\"}}")).collect();
        let plan = plan_batch(&map(), 1, &users, Some(&vars), 500).unwrap();
        for (_, chunks) in plan {
            for chunk in chunks {
                let own = chunk.vars.expect("a personalized batch's chunks carry vars");
                assert_eq!(own.len(), chunk.user_ids.len());
                for (user, vars) in chunk.user_ids.iter().zip(own) {
                    assert_eq!(vars, format!("{{\"n\":\"{user}\"}}"));
                }
            }
        }
    }
}
