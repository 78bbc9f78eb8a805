//! The state of given users for a send: their items by primary key, and for
//! those without one, the chunks of the send whose user ranges hold them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use shard_router::{ShardId, bucket_of};
use sqlx::MySqlPool;
use tracing::{debug, instrument};

use super::page::{announcement_recipient, rank};
use super::{MAX_PAGE_SIZE, Recipient, RecipientState, Sent};
use crate::context::{ChunkIndex, Context};
use crate::send;
use notify_domain::domain::{AudienceKind, MessageId, SendStatus, validate_user_ids};
use notify_domain::error::Result;
use notify_store::db::chunks::state as chunk;
use notify_store::db::direct;
use notify_store::db::recipients::{self as store, ItemRow};

const FIELD: &str = "user_ids";

/// Returns, in request order and once per distinct id, where the send
/// stands for each of up to [`MAX_PAGE_SIZE`] users, or
/// [`RecipientState::NotARecipient`]. `owner` as in [`super::list`].
///
/// Two rounds of reads, each concurrent over the shards, whatever the
/// number of users: the send's record with, on each shard, the items of
/// the users routed there and the chunk index of the send (once the send
/// has started, a replica keeps its index, [`crate::context::ChunkIndexes`],
/// and reads only the chunks split off others since, once a bucket moved);
/// then, on each shard, one statement that
/// tests the users without an item routed there (or in a bucket that
/// moved, whose chunks may be anywhere) against the one chunk of each
/// batch whose range holds them. The reads are not one snapshot: a user
/// whose chunk is delivered but who had no item in the first round, and
/// whom the chunk's apply did not record as held back by their preferences
/// (delivered in between), has their item looked up again, a third round
/// for those users only, so a chunk applied mid-call reads as delivered,
/// never as suppressed.
#[instrument(skip_all, fields(message_id = %message_id, users = user_ids.len()))]
pub async fn status(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
    user_ids: &[u64],
) -> Result<Vec<Recipient>> {
    let sorted = validate_user_ids(user_ids, MAX_PAGE_SIZE as usize, FIELD, "")?;
    let low = sorted.first().copied().unwrap_or(u64::MAX);
    let kept = ctx.chunk_indexes.get(message_id.get(), low);
    // The shard reads do not depend on the record: they start with it (and
    // are dropped unread when it is not the caller's, or an announcement).
    let (row, first) = futures::future::try_join(
        send::fetch_visible(ctx, message_id, owner),
        first_round(ctx, message_id, &sorted, kept.clone()),
    )
    .await?;
    let status = row.status()?;
    let send = Sent { message_id, recalled: status == SendStatus::Recalled };
    let found = if row.audience == AudienceKind::AllUsers as u8 {
        of_announcement(ctx, &send, &sorted).await?
    } else {
        let found = of_send(ctx, &send, &sorted, first).await?;
        if kept.is_none() && status != SendStatus::NotStarted {
            keep_index(ctx, message_id, low).await;
        }
        found
    };
    let mut seen = HashSet::with_capacity(sorted.len());
    Ok(user_ids
        .iter()
        .filter(|user| seen.insert(**user))
        .map(|user| {
            found
                .get(user)
                .cloned()
                .unwrap_or_else(|| Recipient::bare(*user, RecipientState::NotARecipient))
        })
        .collect())
}

async fn of_announcement(
    ctx: &Context,
    send: &Sent,
    users: &[u64],
) -> Result<HashMap<u64, Recipient>> {
    let routes = ctx.pools.snapshot();
    let lookups = routes.partition_users(users).into_iter().filter_map(|(shard, users)| {
        let pool = routes.get(shard)?;
        Some(async move { store::materialized(pool, send.message_id, &users).await })
    });
    let rows = futures::future::try_join_all(lookups).await?;
    Ok(rows
        .into_iter()
        .flatten()
        .map(|row| (row.user_id, announcement_recipient(send, row)))
        .collect())
}

/// What the first round read: the items found, and the send's chunk index
/// (no user ids) from the first user on, read from every shard or kept
/// from an earlier call ([`ChunkIndexes`](crate::context::ChunkIndexes)).
struct FirstRound {
    items: HashMap<u64, ItemRow>,
    index: Arc<ChunkIndex>,
    /// With a kept index: each shard's chunks split off others (a bucket
    /// moved under the send), read now, sorted as the index is.
    splits: Vec<(ShardId, Vec<store::ChunkEnd>)>,
}

/// Reads the send's chunk index from user `low` on, on every shard at once
/// (chunks stay on the shard they were cut for, so every shard's is read:
/// a bucket move carries items, not chunks). Every chunk state: a recalled
/// send's chunks read as their state says.
async fn read_index(ctx: &Context, message_id: MessageId, low: u64) -> Result<ChunkIndex> {
    read_ends(ctx, message_id, low, false).await
}

/// Reads the send's chunks split off others from user `low` on, on every
/// shard at once: a kept index holds every other chunk for good, but a
/// bucket move under a send that is still delivering splits the pending
/// chunks whose users it moved (the split parts are new chunks, on the
/// shard that owns those users now; the chunks they came from only
/// narrow, which the membership test reads from the chunk itself).
pub(super) async fn read_splits(
    ctx: &Context,
    message_id: MessageId,
    low: u64,
) -> Result<Vec<(ShardId, Vec<store::ChunkEnd>)>> {
    Ok(read_ends(ctx, message_id, low, true).await?.shards)
}

/// The send's chunk index entries (only the split chunks' with `splits`)
/// from user `low` on, in every state, from every shard at once.
async fn read_ends(
    ctx: &Context,
    message_id: MessageId,
    low: u64,
    splits: bool,
) -> Result<ChunkIndex> {
    let states = super::Filter::All.chunk_states(false);
    let reads = ctx.pools.iter().map(|(shard, pool)| {
        let states = &states;
        async move {
            let ends = if splits {
                store::split_chunk_ends_from(pool, message_id, states, low).await?
            } else {
                store::chunk_ends_from(pool, message_id, states, low).await?
            };
            Ok::<_, notify_domain::error::Error>((shard, ends))
        }
    });
    Ok(ChunkIndex::new(low, futures::future::try_join_all(reads).await?))
}

/// Reads the send's chunk index again and keeps it for later calls. Only
/// once the record said the send started: every chunk of a send is stored
/// before it starts (appends are refused after), so an index read after
/// that is final but for chunks split off others, which each call reads
/// ([`read_splits`]). The call's own read ran beside the record's and may
/// have come before the start, so it is not the one kept. Best effort: a
/// failed read keeps nothing, and a send whose index is too large is not
/// read again for it.
pub(super) async fn keep_index(ctx: &Context, message_id: MessageId, low: u64) {
    if ctx.chunk_indexes.too_large(message_id.get()) {
        return;
    }
    match read_index(ctx, message_id, low).await {
        Ok(index) => ctx.chunk_indexes.keep(message_id.get(), Arc::new(index)),
        Err(e) => debug!(error = %e, "chunk index not kept"),
    }
}

/// At once: the items of the users on their shards, and the send's chunk
/// index from the first of them on, or, when it is `kept`, the chunks
/// split off others since (if a bucket ever moved).
async fn first_round(
    ctx: &Context,
    message_id: MessageId,
    users: &[u64],
    kept: Option<Arc<ChunkIndex>>,
) -> Result<FirstRound> {
    let Some(low) = users.first().copied() else {
        return Ok(FirstRound { items: HashMap::new(), index: Arc::default(), splits: Vec::new() });
    };
    // Only a bucket move splits chunks: while none ever moved (nor is
    // moving), there is nothing to read.
    let moves = {
        let routes = ctx.pools.snapshot();
        !routes.moved().union(routes.frozen()).is_empty()
    };
    let index = async {
        match kept {
            Some(kept) if moves => Ok((kept, read_splits(ctx, message_id, low).await?)),
            Some(kept) => Ok((kept, Vec::new())),
            None => Ok((Arc::new(read_index(ctx, message_id, low).await?), Vec::new())),
        }
    };
    let (items, (index, splits)) =
        futures::future::try_join(items_of(ctx, message_id, users), index).await?;
    Ok(FirstRound { items, index, splits })
}

async fn of_send(
    ctx: &Context,
    send: &Sent,
    users: &[u64],
    first: FirstRound,
) -> Result<HashMap<u64, Recipient>> {
    let FirstRound { items, index, splits } = first;
    let mut found: HashMap<u64, Recipient> = items
        .values()
        .map(|item| (item.user_id, send.recipient(item.user_id, chunk::DONE, Some(item))))
        .collect();
    // The others: in a chunk not delivered (or delivered without an item:
    // held back), or no recipient at all.
    let rest: Vec<u64> = users.iter().copied().filter(|u| !items.contains_key(u)).collect();
    if rest.is_empty() {
        return Ok(found);
    }
    // A user's chunks are on the shard their bucket is routed to, unless
    // the bucket moved (or is moving): chunks stay where they were cut.
    let routes = ctx.pools.snapshot();
    let anywhere = routes.moved().union(routes.frozen());
    // Each shard's pairs from its chunks in the index, and from those split
    // off others since it was kept (the same chunk may be in both).
    let mut pairs: HashMap<ShardId, Vec<(u64, u64)>> = HashMap::new();
    for (shard, ends) in index.shards.iter().chain(&splits) {
        let here: Vec<u64> = rest
            .iter()
            .copied()
            .filter(|user| {
                let bucket = bucket_of(*user);
                anywhere.contains(bucket) || routes.of_bucket(bucket).0 == *shard
            })
            .collect();
        pairs.entry(*shard).or_default().extend(candidate_pairs(ends, &here));
    }
    let tests = pairs.into_iter().filter_map(|(shard, mut pairs)| {
        let pool = ctx.pools.get(shard)?;
        pairs.sort_unstable();
        pairs.dedup();
        Some(async move { held_on(pool, send, &pairs).await })
    });
    let tests: Vec<_> = tests.collect();
    drop(routes);
    let mut best: HashMap<u64, u8> = HashMap::new();
    // Users a delivered chunk holds without having recorded them held back.
    let mut unsure = HashSet::new();
    for test in futures::future::try_join_all(tests).await?.into_iter().flatten() {
        let HeldBy { user_id: user, chunk_state, held_back } = test;
        if matches!(chunk_state, chunk::DONE | chunk::UNSETTLED) && !held_back {
            unsure.insert(user);
        }
        best.entry(user)
            .and_modify(|state| {
                if rank(chunk_state) < rank(*state) {
                    *state = chunk_state;
                }
            })
            .or_insert(chunk_state);
    }
    // A delivered chunk without the user's item: held back (which its
    // apply records), or applied after the first round read the items. A
    // third round (rare: only users whose chunk does not say) tells which;
    // the chunk's apply committed its items. A recalled send's users read as recalled whatever their item.
    let late: Vec<u64> = best
        .iter()
        .filter(|(user, state)| {
            !send.recalled
                && matches!(**state, chunk::DONE | chunk::UNSETTLED)
                && unsure.contains(*user)
        })
        .map(|(user, _)| *user)
        .collect();
    let items = items_of(ctx, send.message_id, &late).await?;
    for (user, chunk_state) in best {
        found.insert(user, send.recipient(user, chunk_state, items.get(&user)));
    }
    Ok(found)
}

/// The items of these users (sorted), on their shards at once.
async fn items_of(
    ctx: &Context,
    message_id: MessageId,
    users: &[u64],
) -> Result<HashMap<u64, ItemRow>> {
    if users.is_empty() {
        return Ok(HashMap::new());
    }
    let routes = ctx.pools.snapshot();
    let lookups = routes.partition_users(users).into_iter().filter_map(|(shard, users)| {
        let pool = routes.get(shard)?;
        let direct = ctx.direct.as_deref().and_then(|direct| direct.get(shard));
        Some(async move {
            direct::read(direct, pool, |conn, _| Box::pin(store::items(conn, message_id, &users)))
                .await
        })
    });
    let rows = futures::future::try_join_all(lookups).await?;
    Ok(rows.into_iter().flatten().map(|item| (item.user_id, item)).collect())
}

/// The (chunk, user) pairs to test on a shard, sorted by chunk: in each
/// batch (its chunks, whatever their state, are consecutive runs of its
/// sorted users, so they do not overlap), the one chunk whose range holds
/// each user, if any: the first whose last user is at or past them, when
/// it starts at or before them. `ends` are the shard's chunks that end at
/// or past the first of `users` (sorted), sorted by batch and last user
/// ([`ChunkIndex::new`]).
pub(super) fn candidate_pairs(ends: &[store::ChunkEnd], users: &[u64]) -> Vec<(u64, u64)> {
    let mut pairs = Vec::new();
    for batch in ends.chunk_by(|a, b| a.batch == b.batch) {
        for user in users {
            let at = batch.partition_point(|end| end.last_user < *user);
            match batch.get(at) {
                Some(end) if end.first_user <= *user => pairs.push((end.chunk_id, *user)),
                Some(_) => {}
                None => break,
            }
        }
    }
    pairs.sort_unstable();
    pairs
}

/// A user a chunk of the send holds.
struct HeldBy {
    user_id: u64,
    /// The chunk's state.
    chunk_state: u8,
    /// The chunk's apply recorded the user as held back (no item).
    held_back: bool,
}

/// Which users of `pairs` their chunk holds on this shard, with its state:
/// tested in the database; the rare match at an unaligned offset (the
/// user's bytes straddling two ids) is settled by decoding that chunk.
async fn held_on(pool: &MySqlPool, send: &Sent, pairs: &[(u64, u64)]) -> Result<Vec<HeldBy>> {
    let aligned = |position: u64| position > 0 && (position - 1).is_multiple_of(8);
    let rows = store::chunks_holding(pool, send.message_id, pairs).await?;
    let mut held = Vec::with_capacity(rows.len());
    let mut unsure: HashMap<u64, Vec<u64>> = HashMap::new();
    for row in rows {
        if aligned(row.position) && (row.held_position == 0 || aligned(row.held_position)) {
            held.push(HeldBy {
                user_id: row.user_id,
                chunk_state: row.state,
                held_back: row.held_position > 0,
            });
        } else {
            unsure.entry(row.chunk_id).or_default().push(row.user_id);
        }
    }
    if unsure.is_empty() {
        return Ok(held);
    }
    let chunk_ids: Vec<u64> = unsure.keys().copied().collect();
    for chunk in store::chunk_users(pool, send.message_id, &chunk_ids).await? {
        for user in unsure.get(&chunk.chunk_id).into_iter().flatten() {
            if chunk.user_ids.binary_search(user).is_ok() {
                held.push(HeldBy {
                    user_id: *user,
                    chunk_state: chunk.state,
                    held_back: chunk.applied.as_ref().is_some_and(|applied| applied.held(*user)),
                });
            }
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk of `batch` holding users `first_user..=last_user`.
    fn end(chunk_id: u64, batch: u64, first_user: u64, last_user: u64) -> store::ChunkEnd {
        store::ChunkEnd { chunk_id, state: chunk::DONE, batch, last_user, first_user }
    }

    /// The pairs of `ends` (any order), sorted as the index keeps them.
    fn candidate_pairs(ends: Vec<store::ChunkEnd>, users: &[u64]) -> Vec<(u64, u64)> {
        let index = ChunkIndex::new(0, vec![(ShardId(0), ends)]);
        super::candidate_pairs(&index.shards[0].1, users)
    }

    #[test]
    fn each_user_is_tested_against_the_one_chunk_per_batch_whose_range_holds_them() {
        // Batch 1: chunks 1..=10, 11..=20, 21..=30 (any states); batch 2:
        // 12..=25, 26..=40. User 5 is in no chunk of batch 2 (which starts
        // at 12), nor 41 in any.
        let ends = vec![
            end(3, 1, 21, 30),
            end(1, 1, 1, 10),
            end(2, 1, 11, 20),
            end(5, 2, 26, 40),
            end(4, 2, 12, 25),
        ];
        let pairs = candidate_pairs(ends, &[5, 10, 11, 26, 41]);
        assert_eq!(pairs, [(1, 5), (1, 10), (2, 11), (3, 26), (5, 26)]);
    }

    #[test]
    fn users_past_every_chunk_or_between_batches_are_tested_nowhere() {
        assert!(candidate_pairs(vec![end(1, 1, 1, 10)], &[11, 12]).is_empty());
        assert!(candidate_pairs(vec![end(1, 1, 101, 110)], &[50]).is_empty());
        assert!(candidate_pairs(Vec::new(), &[1]).is_empty());
    }
}
