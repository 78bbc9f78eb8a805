//! The state of given users for a send: their items by primary key, and for
//! those without one, the chunks of the send whose user ranges hold them.

use std::collections::HashMap;

use sqlx::MySqlPool;
use tracing::instrument;

use super::page::{announcement_recipient, items, rank};
use super::{MAX_PAGE_SIZE, Recipient, RecipientState, Sent};
use crate::context::Context;
use crate::send;
use notify_domain::domain::{AudienceKind, MessageId, SendStatus, validate_user_ids};
use notify_domain::error::Result;
use notify_store::db::chunks::state as chunk;
use notify_store::db::recipients as store;

const FIELD: &str = "user_ids";

/// Returns, in request order and once per distinct id, where the send
/// stands for each of up to [`MAX_PAGE_SIZE`] users, or
/// [`RecipientState::NotARecipient`]. `owner` as in [`super::list`].
#[instrument(skip_all, fields(message_id = %message_id, users = user_ids.len()))]
pub async fn status(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
    user_ids: &[u64],
) -> Result<Vec<Recipient>> {
    let sorted = validate_user_ids(user_ids, MAX_PAGE_SIZE as usize, FIELD, "")?;
    let row = send::fetch_visible(ctx, message_id, owner).await?;
    let send = Sent { message_id, recalled: row.status()? == SendStatus::Recalled };
    let found = if row.audience == AudienceKind::AllUsers as u8 {
        of_announcement(ctx, &send, &sorted).await?
    } else {
        of_send(ctx, &send, &sorted).await?
    };
    let mut seen = std::collections::HashSet::with_capacity(sorted.len());
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

async fn of_send(ctx: &Context, send: &Sent, users: &[u64]) -> Result<HashMap<u64, Recipient>> {
    let routes = ctx.pools.snapshot();
    let items = items(&routes, send, users).await?;
    let mut found: HashMap<u64, Recipient> = items
        .values()
        .map(|item| {
            let state = send.state_of(chunk::DONE, Some(item.is_read));
            let recipient = Recipient {
                user_id: item.user_id,
                state,
                delivered_at: Some(item.created_at),
                read_at: if send.recalled { None } else { item.read_at },
            };
            (item.user_id, recipient)
        })
        .collect();
    // The others: in a chunk not delivered (or delivered without an item:
    // held back), or no recipient at all. Chunks stay on the shard they
    // were cut for, so every shard is asked.
    let rest: Vec<u64> = users.iter().copied().filter(|u| !items.contains_key(u)).collect();
    if rest.is_empty() {
        return Ok(found);
    }
    let all_states = super::Filter::All.chunk_states(send.recalled);
    let scans = ctx.pools.iter().map(|(_, pool)| chunks_holding(pool, send, &all_states, &rest));
    let mut best: HashMap<u64, u8> = HashMap::new();
    for (user, chunk_state) in futures::future::try_join_all(scans).await?.into_iter().flatten() {
        best.entry(user)
            .and_modify(|state| {
                if rank(chunk_state) < rank(*state) {
                    *state = chunk_state;
                }
            })
            .or_insert(chunk_state);
    }
    for (user, chunk_state) in best {
        found.insert(user, Recipient::bare(user, send.state_of(chunk_state, None)));
    }
    Ok(found)
}

/// Which of `users` (sorted) this shard's chunks of the send hold, with the
/// chunk's state: from the index, the chunk of each run that may hold each
/// user (the first whose last user is at or past them), then the first
/// users of those chunks (rows, no user ids), then the user ids of the
/// chunks that do start at or before one of them.
async fn chunks_holding(
    pool: &MySqlPool,
    send: &Sent,
    states: &[u8],
    users: &[u64],
) -> Result<Vec<(u64, u8)>> {
    let Some(low) = users.first().copied() else {
        return Ok(Vec::new());
    };
    // One snapshot for the three reads (REPEATABLE READ).
    let mut tx = pool.begin().await?;
    let mut runs: HashMap<(u8, u64), Vec<store::ChunkEnd>> = HashMap::new();
    for end in store::chunk_ends_from(&mut *tx, send.message_id, states, low).await? {
        runs.entry((end.state, end.batch)).or_default().push(end);
    }
    let mut maybe: HashMap<u64, Vec<u64>> = HashMap::new();
    for ends in runs.values_mut() {
        ends.sort_unstable_by_key(|end| end.last_user);
        for user in users {
            let at = ends.partition_point(|end| end.last_user < *user);
            if let Some(end) = ends.get(at) {
                maybe.entry(end.chunk_id).or_default().push(*user);
            }
        }
    }
    let chunk_ids: Vec<u64> = maybe.keys().copied().collect();
    let firsts = store::first_users(&mut *tx, send.message_id, &chunk_ids).await?;
    let needed: Vec<u64> = firsts
        .into_iter()
        .filter(|(chunk_id, first)| maybe[chunk_id].iter().any(|user| user >= first))
        .map(|(chunk_id, _)| chunk_id)
        .collect();
    let mut held = Vec::new();
    let chunks = store::chunk_users(&mut *tx, send.message_id, &needed).await?;
    tx.commit().await?;
    for chunk in chunks {
        for user in users {
            if chunk.user_ids.binary_search(user).is_ok() {
                held.push((*user, chunk.state));
            }
        }
    }
    Ok(held)
}
