//! A recall's part that waits for the workers: one recall task per
//! delivered chunk (the workers take the items back, `crate::recall`), and
//! the end of the recall once no shard has a chunk left to take back.

use shard_router::{Key, ShardId};
use sqlx::MySqlPool;
use tracing::info;

use crate::context::Context;
use crate::queue::ChunkTask;
use crate::status::refresh_status_best_effort;
use notify_domain::domain::{Lane, MessageId};
use notify_domain::error::Result;
use notify_store::db::operations::{self, OperationKind};
use notify_store::db::recall as store;
use notify_store::db::{chunks, messages, retrying};

/// Publishes one recall task per delivered chunk of a recalled send, on
/// every shard, unless its recall tasks are moving (a heartbeat per applied
/// group says so): then they are only queued. Called by the recall's
/// operation once every shard's content copy is revoked and its recipients'
/// badges retired, so the tasks need not invalidate them again
/// ([`ChunkTask::badges_retired`]).
pub(super) async fn publish_unless_moving(ctx: &Context, message_id: MessageId) -> Result<u64> {
    if ctx.cache.has_heartbeat(message_id.get()).await.unwrap_or(false) {
        return Ok(0);
    }
    let mut published = 0;
    for (shard, pool) in ctx.pools.iter() {
        published += publish_shard(ctx, shard, pool, message_id).await?;
    }
    if published > 0 {
        info!(message_id = %message_id, published, "recall tasks published");
    }
    Ok(published)
}

async fn publish_shard(
    ctx: &Context,
    shard: ShardId,
    pool: &MySqlPool,
    message_id: MessageId,
) -> Result<u64> {
    let mut published = 0;
    let mut from = Some(0);
    while let Some(start) = from {
        let ids = retrying("recall::delivered_page", || {
            store::delivered_page(pool, message_id, start, ctx.publisher.page())
        })
        .await?;
        from = chunks::next_page_from(&ids);
        let task = |chunk: &u64| ChunkTask::recall(message_id.get(), *chunk, shard.0, true);
        let tasks: Vec<ChunkTask> = ids.iter().map(task).collect();
        ctx.publisher.publish(Lane::Bulk, &tasks).await?;
        published += tasks.len() as u64;
    }
    Ok(published)
}

/// Records a recall as finished (the send's `finished_at`, and the end of
/// its operation) once every shard's content copy is revoked and no shard
/// has a chunk of it pending, delivered or waiting for its badges; returns
/// true when it is finished.
pub async fn finish_recall_if_done(ctx: &Context, message_id: MessageId) -> Result<bool> {
    let home = ctx.pools.for_message(message_id.get());
    let operation = operations::get(&home, message_id, OperationKind::Recall).await?;
    drop(home);
    if let Some(operation) = &operation
        && !ctx.pools.iter().all(|(shard, _)| operation.is_done_on(shard.0))
    {
        return Ok(false);
    }
    for (_, pool) in ctx.pools.iter() {
        if store::unrecalled_chunks(pool, message_id).await? > 0 {
            return Ok(false);
        }
    }
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    let finished = messages::finish_recall(&home, message_id).await?;
    drop(home);
    if let Some(operation) = operation {
        super::finish(ctx, &operation).await?;
    }
    if finished {
        refresh_status_best_effort(ctx, message_id).await;
        info!(message_id = %message_id, "recall finished");
    }
    Ok(true)
}
