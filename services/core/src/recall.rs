//! Recalling a send: taking it back from every inbox, whatever its state.
//!
//! `RecallMessage` moves the send to RECALLED (final), so no chunk starts
//! delivering after it returns (as a cancel, whose work on pending chunks it
//! repeats); revokes its content copies on every shard, which hides every
//! delivered item from lists and counts at once; retires the cached badges
//! and pages (the announcement epoch) and tells every gateway stream
//! (`ItemRevoked`). Then the workers take the items back chunk by chunk
//! through the same queues as deliveries, in groups as deliveries go
//! ([`apply_group`]): one transaction per group of one send's chunks on a
//! shard marks their recipients' items taken back (each once; the rows stay,
//! hidden, until retention's purge of hidden items takes them out, as it
//! does a cancelled send's), moves the chunks to recalled (the guard: a
//! redelivered task changes nothing) and counts the items in
//! `progress.recalled`; the recipients' badges are invalidated after the
//! commit, as a delivery's are. A chunk a worker applies concurrently with
//! the recall is recalled too: the sweeper publishes recall tasks for every
//! delivered chunk of a recalled send until none is left ([`sweep`]), which
//! also resumes a recall after any crash. The recall is finished (the send's
//! `finished_at`) once no chunk is pending, delivered or waiting for its
//! badges on any shard.
//!
//! An announcement has no chunks: its items are materialized per user, and
//! revoking its content copies hides every one of them at once; the recall
//! is finished when it returns.

use shard_router::{Key, ShardId};
use sqlx::MySqlPool;
use tracing::{info, instrument, warn};

use crate::context::Context;
use crate::deliver::TaskOutcome;
use crate::events::{self, BusEvent};
use crate::queue::ChunkTask;
use crate::send::{self, MessageView};
use notify_domain::domain::{AudienceKind, Lane, MessageId, SendStatus};
use notify_domain::error::Result;
use notify_domain::settings::WebhookEvent;
use notify_store::db::recall::{self as store, RecallOutcome};
use notify_store::db::{chunks, messages};

/// Recalls a send (see the module doc); repeating it publishes the chunks
/// left to recall again and is otherwise harmless.
#[instrument(skip_all, fields(message_id = %message_id))]
pub async fn recall(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
) -> Result<MessageView> {
    let row = send::fetch_visible(ctx, message_id, owner).await?;
    let from = [
        SendStatus::NotStarted,
        SendStatus::Sending,
        SendStatus::Paused,
        SendStatus::Completed,
        SendStatus::Cancelled,
    ];
    let webhook = Some(WebhookEvent::MessageRecalled);
    let now =
        send::transition(ctx, message_id, &from, SendStatus::Recalled, "recall", webhook).await?;
    if now {
        info!(message_id = %message_id, "message recalled");
    }
    // Hidden everywhere at once: every read joins the shard's content copy.
    for (_, pool) in ctx.pools.iter() {
        chunks::revoke_content(pool, message_id).await?;
    }
    let retired = match ctx.cache.bump_announcement_epoch().await {
        Ok(_) => true,
        Err(e) => {
            // Cached badges and pages catch up when their chunks are recalled.
            warn!(error = %e, message_id = %message_id, "could not retire cached badges and pages");
            false
        }
    };
    // Every gateway refreshes the badges of the users it follows; if they
    // are not told, they hear of it chunk by chunk.
    let told =
        events::publish_best_effort(ctx, &BusEvent::Revoked { message_id: message_id.get() }).await;
    if row.audience == AudienceKind::AllUsers as u8 {
        let home = ctx.writable(Key::Message(message_id.get())).await?;
        messages::finish_recall(&home, message_id).await?;
        drop(home);
        send::refresh_status_best_effort(ctx, message_id).await;
        return send::get(ctx, message_id, None).await;
    }
    for (shard, pool) in ctx.pools.iter() {
        // Nothing pending delivers any more; what a shard that is down
        // still has pending, the sweeper cancels.
        if let Err(e) = chunks::cancel_pending(pool, message_id, ctx.publisher.page()).await {
            warn!(error = %e, shard = %shard, message_id = %message_id, "cancelling chunks failed, the sweeper will retry");
        }
    }
    if let Err(e) = publish(ctx, message_id, retired && told).await {
        warn!(error = %e, message_id = %message_id, "publishing recall tasks failed, the sweeper will retry");
    }
    finish_if_done(ctx, message_id).await?;
    send::get(ctx, message_id, None).await
}

/// Publishes one recall task per delivered chunk of a recalled send, on
/// every shard, a publish window at a time. `badges_retired`: every cached
/// badge and page was retired after the content copies were revoked, and
/// every gateway was told ([`ChunkTask::badges_retired`]).
async fn publish(ctx: &Context, message_id: MessageId, badges_retired: bool) -> Result<u64> {
    let mut published = 0;
    for (shard, pool) in ctx.pools.iter() {
        published += publish_shard(ctx, shard, pool, message_id, badges_retired).await?;
    }
    Ok(published)
}

async fn publish_shard(
    ctx: &Context,
    shard: ShardId,
    pool: &MySqlPool,
    message_id: MessageId,
    badges_retired: bool,
) -> Result<u64> {
    let mut published = 0;
    let mut from = Some(0);
    while let Some(start) = from {
        let ids = store::delivered_page(pool, message_id, start, ctx.publisher.page()).await?;
        from = chunks::next_page_from(&ids);
        let task =
            |chunk: &u64| ChunkTask::recall(message_id.get(), *chunk, shard.0, badges_retired);
        let tasks: Vec<ChunkTask> = ids.iter().map(task).collect();
        ctx.publisher.publish(Lane::Bulk, &tasks).await?;
        published += tasks.len() as u64;
    }
    Ok(published)
}

/// Takes one chunk's items back (a worker's recall task): the group of one.
pub async fn apply_task(ctx: &Context, task: &ChunkTask) -> Result<TaskOutcome> {
    let message_id = MessageId::from_raw(task.message_id);
    let shard = ShardId(task.shard);
    let outcomes =
        apply_group(ctx, shard, message_id, &[task.chunk_id], task.badges_retired).await?;
    Ok(outcomes.into_iter().next().unwrap_or(TaskOutcome::Dropped))
}

/// Takes several chunks of ONE recalled send on ONE shard back as a group
/// (the recall tasks a worker had ready together, as deliveries go): one
/// transaction for all of them, then one invalidation of their recipients'
/// badges, one settle, one event for the gateway streams, and the end of
/// the recall if these were the last chunks. With `badges_retired` (every
/// task of the group says so, see [`ChunkTask::badges_retired`]) the
/// transaction settles the chunks itself: their recipients' badges left
/// the items out from the recall's call on, so there is nothing to
/// invalidate and nothing new to tell. Returns one outcome per chunk id, in
/// the order given; the items taken back are counted on the first chunk
/// recalled now.
#[instrument(skip_all, fields(message_id = message_id.get(), shard = shard.0, chunks = chunk_ids.len()))]
pub async fn apply_group(
    ctx: &Context,
    shard: ShardId,
    message_id: MessageId,
    chunk_ids: &[u64],
    badges_retired: bool,
) -> Result<Vec<TaskOutcome>> {
    let pool = ctx.task_pool(shard)?;
    let recalled = store::recall_many(pool, message_id, chunk_ids, badges_retired).await?;
    let mut unsettled = Vec::new();
    let mut users = Vec::new();
    let mut items = 0;
    let outcomes = chunk_ids
        .iter()
        .zip(&recalled)
        .map(|(chunk_id, recall)| match recall {
            RecallOutcome::Recalled { user_ids, items: taken } => {
                if !badges_retired {
                    unsettled.push(*chunk_id);
                    users.extend_from_slice(user_ids);
                }
                items += taken;
                TaskOutcome::Recalled { items: *taken }
            }
            RecallOutcome::AlreadyRecalled { user_ids, unsettled: left } => {
                if *left {
                    // An earlier attempt died before invalidating.
                    unsettled.push(*chunk_id);
                    users.extend_from_slice(user_ids);
                }
                TaskOutcome::AlreadyDone
            }
            RecallOutcome::NotDelivered | RecallOutcome::Missing => TaskOutcome::Dropped,
        })
        .collect();
    if !unsettled.is_empty() {
        settle_chunks(ctx, pool, message_id, &unsettled, users).await?;
    }
    // Tells the sweeper this recall is moving.
    let _ = ctx.cache.heartbeat(message_id.get(), ctx.settings.worker.sweep_timeout_secs).await;
    if !store::unrecalled_chunks(pool, message_id).await.is_ok_and(|left| left > 0) {
        finish_if_done(ctx, message_id).await?;
    }
    metrics::counter!("notify_items_recalled_total").increment(items);
    Ok(outcomes)
}

/// Invalidates recalled chunks' recipients' badges, then records them, and
/// tells their gateway streams. Redis away: the chunks wait for the settler.
async fn settle_chunks(
    ctx: &Context,
    pool: &MySqlPool,
    message_id: MessageId,
    chunk_ids: &[u64],
    user_ids: Vec<u64>,
) -> Result<()> {
    match ctx.cache.invalidate_counts(&user_ids).await {
        Ok(()) => store::settle_recall(pool, message_id, chunk_ids).await?,
        Err(e) => {
            warn!(error = %e, chunks = chunk_ids.len(), "badges not invalidated, recalled chunks left for the settler");
            return Ok(());
        }
    }
    events::badges_changed(ctx, user_ids).await;
    Ok(())
}

/// Records a recall as finished once no shard has a chunk of it pending,
/// delivered or waiting for its badges; returns true if this call did.
pub async fn finish_if_done(ctx: &Context, message_id: MessageId) -> Result<bool> {
    for (_, pool) in ctx.pools.iter() {
        if store::unrecalled_chunks(pool, message_id).await? > 0 {
            return Ok(false);
        }
    }
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    let finished = messages::finish_recall(&home, message_id).await?;
    drop(home);
    if finished {
        send::refresh_status_best_effort(ctx, message_id).await;
        info!(message_id = %message_id, "recall finished");
    }
    Ok(finished)
}

/// The sweeper's part (every worker, every sweep): for each recalled send
/// of this home shard whose recall is not finished, cancels what is still
/// pending, publishes a recall task for every delivered chunk left (a lost
/// publish, a crash, a chunk applied while the recall began), and finishes
/// the recall when nothing is left. Returns the tasks published.
pub async fn sweep(ctx: &Context, home: &MySqlPool, limit: u32) -> Result<u64> {
    let mut published = 0;
    let mut after = 0;
    loop {
        let ids = messages::recalling(home, after, limit).await?;
        for id in &ids {
            let message_id = MessageId::from_raw(*id);
            if !finish_if_done(ctx, message_id).await? {
                // Recall tasks of a recall that moves are only queued:
                // leave them be (a heartbeat per applied chunk says so).
                if ctx.cache.has_heartbeat(*id).await.unwrap_or(false) {
                    continue;
                }
                for (shard, pool) in ctx.pools.iter() {
                    chunks::cancel_pending(pool, message_id, ctx.publisher.page()).await?;
                    // Not known to be retired (the call may have died
                    // first): these invalidate, which is only redundant.
                    published += publish_shard(ctx, shard, pool, message_id, false).await?;
                }
            }
        }
        match ids.last() {
            Some(last) if ids.len() == limit as usize => after = *last,
            _ => return Ok(published),
        }
    }
}

/// Settles up to `limit` recalled chunks of one shard whose badges were not
/// invalidated (Redis was away). Stops at the first Redis error.
pub async fn settle(ctx: &Context, pool: &MySqlPool, limit: u32) -> Result<u64> {
    let mut settled = 0;
    for chunk in store::recall_unsettled(pool, 1_000, limit).await? {
        ctx.cache.invalidate_counts(&chunk.user_ids).await?;
        store::settle_recall(pool, chunk.message_id, &[chunk.chunk_id]).await?;
        events::badges_changed(ctx, chunk.user_ids).await;
        settled += 1;
        finish_if_done(ctx, chunk.message_id).await?;
    }
    Ok(settled)
}
