//! What the worker's scheduler and sweeper do on one shard, on the worker's
//! timer (`notify_worker::background` runs them, bounded in time, over every
//! shard): start the scheduled sends that are due, take the chunks left
//! pending past the sweep timeout and deal with each by its send's state,
//! complete the SENDING sends whose last chunk finished while nobody
//! checked, and read the counts the worker's gauges show.

use std::collections::BTreeMap;

use chrono::NaiveDateTime;
use shard_router::ShardId;
use sqlx::MySqlPool;
use tracing::warn;

use crate::context::Context;
use crate::queue::ChunkTask;
use crate::send;
use notify_domain::domain::{Lane, MessageId, SendStatus};
use notify_domain::error::Result;
use notify_store::db::{badge_repairs, chunks, messages, operations};

/// Starts up to `limit` scheduled sends of this home shard whose time has
/// come ([`send::start_due`]).
pub async fn start_due_sends(ctx: &Context, pool: &MySqlPool, limit: u32) -> Result<()> {
    for id in messages::due_scheduled(pool, limit).await? {
        send::start_due(ctx, MessageId::from_raw(id)).await?;
    }
    Ok(())
}

/// Claims up to `limit` chunks of this shard pending for longer than
/// `older_than_secs` (a claim touches them, so another sweeper leaves them
/// be for as long), by send.
pub async fn claim_stale_chunks(
    pool: &MySqlPool,
    older_than_secs: u64,
    limit: u32,
) -> Result<BTreeMap<MessageId, Vec<u64>>> {
    let mut by_message: BTreeMap<MessageId, Vec<u64>> = BTreeMap::new();
    for (message_id, chunk_id) in chunks::claim_stale(pool, older_than_secs, limit).await? {
        by_message.entry(MessageId::from_raw(message_id)).or_default().push(chunk_id);
    }
    Ok(by_message)
}

/// Deals with stale chunks of one send on `shard` by the send's state:
/// re-published while it is SENDING and nobody makes progress on it,
/// cancelled once it is cancelled or recalled, touched otherwise (pending
/// is where they belong, and the touch keeps them out of the oldest-first
/// window). Returns how many were re-published.
pub async fn heal_stale_chunks(
    ctx: &Context,
    shard: ShardId,
    message_id: MessageId,
    chunk_ids: &[u64],
) -> Result<u64> {
    let Some(pool) = ctx.pools.get(shard) else {
        return Ok(0);
    };
    let home = ctx.pools.for_message(message_id.get());
    let Some(row) = messages::fetch(&*home, message_id).await? else {
        return Ok(0);
    };
    match row.status()? {
        // Chunks of a send that is making progress are only queued behind
        // its other chunks, not lost: leave them be.
        SendStatus::Sending if ctx.cache.has_heartbeat(message_id.get()).await.unwrap_or(false) => {
            Ok(0)
        }
        SendStatus::Sending => {
            let tasks: Vec<ChunkTask> = chunk_ids
                .iter()
                .map(|chunk_id| ChunkTask::deliver(message_id.get(), *chunk_id, shard.0))
                .collect();
            chunks::touch(pool, message_id, chunk_ids).await?;
            ctx.publisher.publish(Lane::from_db(row.lane), &tasks).await?;
            Ok(tasks.len() as u64)
        }
        SendStatus::Cancelled | SendStatus::Recalled => {
            chunks::cancel_pending(pool, message_id, ctx.publisher.page()).await?;
            Ok(0)
        }
        // Paused or not started: pending is where these chunks belong. Touch
        // them so they leave the oldest-first window and cannot starve the
        // chunks of sending messages.
        _ => {
            chunks::touch(pool, message_id, chunk_ids).await?;
            Ok(0)
        }
    }
}

/// Completes the SENDING sends of one home shard whose last chunk finished
/// while nobody checked (keyset paging over all of them, `page` at a time);
/// a failure is logged and the rest go on.
pub async fn complete_finished_sends(ctx: &Context, shard: ShardId, pool: &MySqlPool, page: u32) {
    let mut after = 0;
    loop {
        let ids = match messages::sending(pool, after, page).await {
            Ok(ids) => ids,
            Err(e) => {
                warn!(error = %e, shard = %shard, "sweeper cannot list sending messages");
                return;
            }
        };
        for id in &ids {
            if let Err(e) = send::complete_if_done(ctx, MessageId::from_raw(*id)).await {
                warn!(error = %e, message_id = *id, "completion check failed");
            }
        }
        match ids.last() {
            Some(last) if ids.len() == page as usize => after = *last,
            _ => return,
        }
    }
}

/// The SENDING sends of this home shard: how many, and when the oldest
/// started.
pub async fn sending_summary(pool: &MySqlPool) -> Result<(u64, Option<NaiveDateTime>)> {
    Ok(messages::sending_summary(pool).await?)
}

/// The control operations of this home shard not finished yet: how many,
/// and the age of the oldest in seconds.
pub async fn operations_summary(pool: &MySqlPool) -> Result<(u64, f64)> {
    Ok(operations::summary(pool).await?)
}

/// Users of this shard whose cached state waits for Redis to answer again.
pub async fn badge_repairs_waiting(pool: &MySqlPool) -> Result<u64> {
    Ok(badge_repairs::count(pool).await?)
}
