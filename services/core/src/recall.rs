//! Recalling a send: taking it back from every inbox, whatever its state.
//!
//! `RecallMessage` moves the send to RECALLED (final, so no chunk starts
//! delivering after it returns) and records the recall as a control
//! operation in the same transaction ([`crate::control`]), which hides the
//! send everywhere at once: every shard's content copy is revoked (every
//! read joins it), the cached badges and pages of its recipients are
//! retired (every user's, for an announcement or a send over
//! `control.retire_recipients_max`) and their gateway streams told
//! (`ItemRevoked`), its pending chunks are cancelled, and one recall task
//! is published per delivered chunk ([`publish_unless_moving`]). The
//! workers take the items back chunk by chunk through the same queues as
//! deliveries, in groups as deliveries go ([`apply_group`]): one
//! transaction per group of one send's chunks on a shard marks their
//! recipients' items taken back (each once; the rows stay, hidden, until
//! retention's purge of hidden items takes them out, as it does a cancelled
//! send's), moves the chunks to recalled (the guard: a redelivered task
//! changes nothing) and counts the items in `progress.recalled`. A chunk a
//! worker applied while the recall began, a lost task or a crash are healed
//! by the operation's next drive, which publishes the tasks again for a
//! recall that stopped moving. The recall is finished (the send's
//! `finished_at`, and the operation's end) once every shard's copy is
//! revoked and no chunk is pending, delivered or waiting for its badges on
//! any shard ([`finish_if_done`]).
//!
//! An announcement has no chunks: its items are materialized per user, and
//! revoking its content copies hides every one of them at once.

use shard_router::ShardId;
use sqlx::MySqlPool;
use tracing::{info, instrument, warn};

use crate::context::Context;
use crate::control;
use crate::deliver::TaskOutcome;
use crate::events;
use crate::send::{self, MessageView, Outboxed, record_of};
use notify_domain::domain::{MessageId, SendStatus};
use notify_domain::error::Result;
use notify_domain::settings::WebhookEvent;
use notify_store::db::messages::ControlChange;
use notify_store::db::operations::OperationKind;
use notify_store::db::recall::{self as store, RecallOutcome};

/// Recalls a send (see the module doc); repeating it is harmless (the
/// operation recorded by the first call goes on).
#[instrument(skip_all, fields(message_id = %message_id))]
pub async fn recall(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
) -> Result<MessageView> {
    let row = send::fetch_visible(ctx, message_id, owner).await?;
    let change = ControlChange::Status { from: &SendStatus::RECALLABLE, to: SendStatus::Recalled };
    let webhook = Outboxed::new(ctx, message_id, WebhookEvent::MessageRecalled, None);
    let record = record_of(ctx, &webhook);
    if control::begin(ctx, &row, change, OperationKind::Recall, record).await? {
        info!(message_id = %message_id, "message recalled");
        if let Some(webhook) = webhook {
            let home = MySqlPool::clone(&ctx.pools.for_message(message_id.get()));
            webhook.queue(ctx, &home).await;
        }
    }
    send::get_after_change(ctx, message_id).await
}

/// Takes chunks of ONE recalled send on ONE shard back as a group (the
/// recall tasks a worker had ready together, as deliveries go; a lone task
/// is a group of one): one transaction for all of them, then one
/// invalidation of their recipients' badges, one settle, one event for the
/// gateway streams, and the end of the recall if these were the last
/// chunks. With `badges_retired` (every task of the group says so, see
/// [`ChunkTask::badges_retired`](crate::queue::ChunkTask::badges_retired))
/// the transaction settles the chunks itself: their recipients' badges
/// left the items out from the recall's call on, so there is nothing to
/// invalidate and nothing new to tell. Chunks left unsettled (Redis away)
/// wait for the settler ([`crate::deliver::settle`]). Returns one outcome
/// per chunk id, in the order given; the items taken back are counted on
/// the first chunk recalled now.
#[instrument(skip_all, fields(message_id = message_id.get(), shard = shard.0, chunks = chunk_ids.len(), chunk_ids = ?chunk_ids))]
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
        control::finish_recall_if_done(ctx, message_id).await?;
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
