//! Applying chunk tasks: the worker's unit of work, one chunk or a group
//! of one send's chunks on one shard.
//!
//! Order of effects, each safe to repeat:
//! 1. check the send's status (cache, else home shard); not SENDING -> skip,
//!    the chunk stays pending (paused) or is cancelled later (cancelled);
//! 2. apply the chunk in one transaction on its shard (the guard);
//! 3. invalidate the recipients' cached badges and publish the chunk's
//!    change event for gateway streams (also when step 2 finds the chunk
//!    already done: a worker may have died between commit and here). The
//!    commit leaves the chunk unsettled, and only a confirmed invalidation
//!    moves it to done; when Redis does not answer, delivery goes on and
//!    [`settle`] invalidates once Redis is back. An unsettled chunk keeps its
//!    send from completing;
//! 4. complete the send if this shard has no pending chunk left and no other
//!    shard has either.
//!
//! The task is acknowledged only after all of it, so a crash anywhere means a
//! redelivery, and a redelivery changes nothing that already happened.

use shard_router::{Key, ShardId, Snapshot};
use sqlx::MySqlPool;
use tracing::{debug, instrument, warn};

use crate::context::Context;
use crate::events::{self, BusEvent};
use crate::queue::ChunkTask;
use crate::send;
use notify_domain::domain::{Lane, MessageId, SendStatus};
use notify_domain::error::{Error, Result};
use notify_store::db::chunks::{self, ApplyOutcome, ChunkPlan, ContentSummary};
use notify_store::db::messages;

/// What handling a task did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskOutcome {
    /// The chunk's items were written.
    Delivered {
        /// Items written.
        items: u64,
    },
    /// The chunk was already applied; nothing changed.
    AlreadyDone,
    /// The send is paused, cancelled or not started; the chunk stays as it is.
    Skipped(SendStatus),
    /// The send or the chunk does not exist; the task is dropped.
    Dropped,
    /// The chunk was taken too often without committing; it is recorded as failed.
    Failed,
    /// A recall took the chunk's items back.
    Recalled {
        /// Items taken back.
        items: u64,
    },
}

/// Applies one chunk task (steps 1-4 above).
#[instrument(skip_all, fields(message_id = task.message_id, chunk_id = task.chunk_id, shard = task.shard))]
///
/// `redelivered` says the broker handed this task out before (a worker died
/// or gave it back); only then is the attempt counted for poison detection,
/// which keeps the first delivery at one transaction.
pub async fn apply_task(ctx: &Context, task: &ChunkTask, redelivered: bool) -> Result<TaskOutcome> {
    let message_id = MessageId::from_raw(task.message_id);
    let Some(status) = send::status_of(ctx, message_id).await? else {
        debug!("message does not exist, dropping task");
        return Ok(TaskOutcome::Dropped);
    };
    let pool = ctx.task_pool(ShardId(task.shard))?;
    if !matches!(status, SendStatus::Sending | SendStatus::Completed) {
        // A redelivery of a chunk applied just before a crash must still
        // invalidate its recipients' badges, paused send or not.
        let finished = chunks::finished_recipients(pool, message_id, task.chunk_id).await?;
        if let Some((user_ids, unsettled)) = finished {
            ctx.cache.invalidate_counts(&user_ids).await?;
            if unsettled {
                chunks::settle(pool, message_id, task.chunk_id).await?;
            }
        }
        return Ok(TaskOutcome::Skipped(status));
    }
    let attempts =
        if redelivered { chunks::count_attempt(pool, message_id, task.chunk_id).await? } else { 0 };
    if attempts > ctx.settings.worker.poison_attempts {
        // Taken this often without ever committing (workers died on it):
        // record it as failed instead of letting it loop forever.
        record_failure(ctx, task).await?;
        return Ok(TaskOutcome::Failed);
    }
    let shard = ShardId(task.shard);
    let mut splits = 0;
    let applied = loop {
        // Held through the apply: this replica reports a newer map only
        // once the chunk's items are written by this one (and only while
        // its write lease holds: no bucket to check, the chunk's are below).
        let routes = ctx.writable_snapshot(&[]).await?;
        let placed = |user_ids: &[u64]| placed_on(&routes, shard, user_ids);
        let hold = ctx.holding_sends.check(shard, message_id);
        match chunks::apply(pool, message_id, task.chunk_id, hold, placed).await? {
            ApplyOutcome::Misplaced { user_ids } if splits < MAX_SPLITS => {
                drop(routes);
                splits += 1;
                split(ctx, shard, message_id, task.chunk_id, &user_ids).await?;
            }
            ApplyOutcome::Misplaced { .. } => {
                return Err(Error::Unavailable(format!(
                    "chunk {} of message {message_id}: its recipients kept moving between shards",
                    task.chunk_id
                )));
            }
            outcome => break outcome,
        }
    };
    match applied {
        ApplyOutcome::Applied { user_ids, delivered, held_back, summary } => {
            ctx.holding_sends.note(shard, message_id, !held_back.is_empty());
            let committed_at_ms = Some(chrono::Utc::now().timestamp_millis());
            match ctx.cache.invalidate_counts(&user_ids).await {
                Ok(()) => chunks::settle(pool, message_id, task.chunk_id).await?,
                Err(e) => {
                    // Redis is away: delivery goes on, the chunk stays
                    // unsettled (and its send incomplete) for the settler.
                    warn!(error = %e, "badges not invalidated, chunk left unsettled");
                    metrics::counter!("notify_chunks_unsettled_total").increment(1);
                }
            }
            let with_item = without(user_ids, &held_back);
            announce_items(ctx, message_id, with_item, summary, committed_at_ms).await?;
            // Tells the sweeper this send is moving; losing it only costs a
            // harmless re-publish.
            let _ =
                ctx.cache.heartbeat(task.message_id, ctx.settings.worker.sweep_timeout_secs).await;
            metrics::counter!("notify_items_delivered_total").increment(delivered);
            if !chunks::has_pending(pool, message_id).await? {
                send::complete_if_done(ctx, message_id).await?;
            }
            Ok(TaskOutcome::Delivered { items: delivered })
        }
        ApplyOutcome::AlreadyFinished { user_ids, delivered, unsettled, summary } => {
            ctx.cache.invalidate_counts(&user_ids).await?;
            if unsettled {
                chunks::settle(pool, message_id, task.chunk_id).await?;
            }
            if delivered {
                // The earlier attempt may have died before its event; it
                // was about the recipients that got the item.
                let with_item = chunks::recipients_with_item(pool, message_id, &user_ids).await?;
                announce_items(ctx, message_id, with_item, summary, None).await?;
            }
            if status == SendStatus::Sending && !chunks::has_pending(pool, message_id).await? {
                send::complete_if_done(ctx, message_id).await?;
            }
            Ok(TaskOutcome::AlreadyDone)
        }
        ApplyOutcome::Missing => Ok(TaskOutcome::Dropped),
        ApplyOutcome::Misplaced { .. } => unreachable!("handled above"),
    }
}

/// How often one task splits its chunk before giving up (a map that keeps
/// changing under it); the redelivery tries again.
const MAX_SPLITS: u32 = 3;

/// True when every user is routed to `shard` by `routes` and none of their
/// buckets is frozen by a move.
fn placed_on(routes: &Snapshot<'_, MySqlPool>, shard: ShardId, user_ids: &[u64]) -> bool {
    user_ids.iter().all(|user_id| {
        let bucket = shard_router::bucket_of(*user_id);
        !routes.is_frozen(bucket) && routes.of_bucket(bucket).0 == shard
    })
}

/// Splits a pending chunk planned by an older map: the recipients the map
/// in use routes to other shards go to those shards as chunks of their own
/// (stored first, with the content copy and their totals, then published),
/// and only then leave this chunk, so the send cannot complete in between
/// (the split bumps the send's status version, which fails a completion
/// check that looked at the target before the split chunk was there), and
/// a crash anywhere is repaired by the redelivery (the split chunks' ids
/// derive from the chunk, the target and the users, so storing them again
/// adds nothing). Waits out a move's freeze of their buckets and of the
/// send's home.
async fn split(
    ctx: &Context,
    shard: ShardId,
    message_id: MessageId,
    chunk_id: u64,
    user_ids: &[u64],
) -> Result<()> {
    let keys: Vec<Key<'_>> =
        user_ids.iter().map(|u| Key::User(*u)).chain([Key::Message(message_id.get())]).collect();
    let routes = ctx.writable_snapshot(&keys).await?;
    let pool = routes
        .get(shard)
        .ok_or_else(|| Error::Internal(format!("task names unknown shard {shard}")))?;
    let (keep, away): (Vec<_>, Vec<_>) =
        routes.partition_users(user_ids).into_iter().partition(|(owner, _)| *owner == shard);
    if away.is_empty() {
        // Only frozen before; routed here now.
        return Ok(());
    }
    let keep: Vec<u64> = keep.into_iter().flat_map(|(_, users)| users).collect();
    let content = chunks::stored_content(pool, message_id).await?.ok_or_else(|| {
        Error::Internal(format!("message {message_id}: no content on shard {shard}"))
    })?;
    let mut tasks = Vec::with_capacity(away.len());
    for (owner, users) in away {
        let target = routes
            .get(owner)
            .ok_or_else(|| Error::Internal(format!("the shard map names unknown shard {owner}")))?;
        let chunk =
            ChunkPlan { chunk_id: split_chunk_id(chunk_id, owner, &users), user_ids: users };
        chunks::store_split(target, message_id, &content, &chunk).await?;
        tasks.push(ChunkTask::deliver(message_id.get(), chunk.chunk_id, owner.0));
    }
    let home = routes.route(Key::Message(message_id.get()));
    messages::bump_status_version(&home, message_id).await?;
    if chunks::shrink(pool, message_id, chunk_id, user_ids, &keep).await? {
        metrics::counter!("notify_chunks_split_total").increment(1);
        debug!(chunk_id, moved = user_ids.len() - keep.len(), "chunk split by a newer shard map");
    }
    let lane = Lane::from_db(messages::fetch_existing(&home, message_id).await?.lane);
    drop((home, routes));
    if let Err(e) = ctx.publisher.publish(lane, &tasks).await {
        // Pending chunks of a sending send: the sweeper publishes them.
        warn!(error = %e, "could not publish split chunks; the sweeper will");
    }
    Ok(())
}

/// The id of the part of `chunk_id` that goes to `shard` with `users`:
/// the top bit set (no planned chunk has it) and a hash of the three, so
/// one split stored twice (a redelivery, under any later map that splits
/// the chunk the same way) is one chunk.
fn split_chunk_id(chunk_id: u64, shard: ShardId, users: &[u64]) -> u64 {
    let mut sorted = users.to_vec();
    sorted.sort_unstable();
    let seed = shard_router::stable_hash(chunk_id ^ u64::from(shard.0) << 32);
    let mixed = sorted.iter().fold(seed, |h, user| shard_router::stable_hash(h ^ user));
    chunks::SPLIT_CHUNK_BIT | mixed >> 1
}

/// Applies several first deliveries of ONE send's chunks on ONE shard as a
/// group: steps 1-4 above with one status check, one transaction (each chunk
/// keeps its guard: only pending ones are applied), one badge invalidation,
/// one settle and one completion check for all of them. Returns one outcome
/// per chunk id, in the order given; `None` when the group cannot go as one
/// (the send is not SENDING, or its content or a chunk is missing), with
/// nothing written: the caller applies the tasks one by one, which handles
/// each case.
#[instrument(skip_all, fields(message_id = message_id.get(), shard = shard.0, chunks = chunk_ids.len()))]
pub async fn apply_group(
    ctx: &Context,
    shard: ShardId,
    message_id: MessageId,
    chunk_ids: &[u64],
) -> Result<Option<Vec<TaskOutcome>>> {
    if send::status_of(ctx, message_id).await? != Some(SendStatus::Sending) {
        return Ok(None);
    }
    let pool = ctx.task_pool(shard)?;
    let routes = ctx.writable_snapshot(&[]).await?;
    let placed = |user_ids: &[u64]| placed_on(&routes, shard, user_ids);
    let hold = ctx.holding_sends.check(shard, message_id);
    let Some(group) = chunks::apply_many(pool, message_id, chunk_ids, hold, placed).await? else {
        return Ok(None);
    };
    if group.chunks.iter().any(|chunk| chunk.applied_now) {
        ctx.holding_sends.note(shard, message_id, !group.held_back.is_empty());
    }
    drop(routes);
    let committed_at_ms = Some(chrono::Utc::now().timestamp_millis());
    // Chunks done before (a duplicate task) were settled then; the ones left
    // unsettled, by this commit or an earlier one, need the invalidation.
    let unsettled: Vec<&chunks::GroupChunk> = group.chunks.iter().filter(|c| c.unsettled).collect();
    let users: Vec<u64> = unsettled.iter().flat_map(|c| c.user_ids.iter().copied()).collect();
    match ctx.cache.invalidate_counts(&users).await {
        Ok(()) => {
            let ids: Vec<u64> = unsettled.iter().map(|c| c.chunk_id).collect();
            chunks::settle_many(pool, message_id, &ids).await?;
        }
        Err(e) => {
            warn!(error = %e, chunks = unsettled.len(), "badges not invalidated, chunks left unsettled");
            metrics::counter!("notify_chunks_unsettled_total").increment(unsettled.len() as u64);
        }
    }
    for chunk in group.chunks.iter().filter(|c| c.delivered) {
        // Events are about the recipients that got the item: not those
        // their preferences held back now, and for a chunk applied before
        // (a duplicate task), those that have it.
        let (with_item, at) = if chunk.applied_now {
            (without(chunk.user_ids.clone(), &group.held_back), committed_at_ms)
        } else {
            (chunks::recipients_with_item(pool, message_id, &chunk.user_ids).await?, None)
        };
        announce_items(ctx, message_id, with_item, group.summary.clone(), at).await?;
    }
    let _ = ctx.cache.heartbeat(message_id.get(), ctx.settings.worker.sweep_timeout_secs).await;
    metrics::counter!("notify_items_delivered_total").increment(group.delivered);
    metrics::histogram!("notify_chunk_group_size").record(chunk_ids.len() as f64);
    if !chunks::has_pending(pool, message_id).await? {
        send::complete_if_done(ctx, message_id).await?;
    }
    // The items of the group are counted once, on its first applied chunk.
    let mut items = Some(group.delivered);
    let outcomes = chunk_ids
        .iter()
        .map(|chunk_id| match group.chunks.iter().find(|c| c.chunk_id == *chunk_id) {
            Some(chunk) if chunk.applied_now => {
                TaskOutcome::Delivered { items: items.take().unwrap_or(0) }
            }
            _ => TaskOutcome::AlreadyDone,
        })
        .collect();
    Ok(Some(outcomes))
}

/// How long a chunk may stay unsettled before a settler takes it over from
/// its worker (which settles it right after its commit when Redis answers).
const UNSETTLED_AFTER_MS: u64 = 1_000;

/// Settles up to `limit` unsettled chunks of one shard: invalidates their
/// recipients' cached badges, moves them to done and completes their sends
/// if nothing else is left. Stops at the first Redis error (still away).
/// Returns how many were settled.
pub async fn settle(ctx: &Context, pool: &MySqlPool, limit: u32) -> Result<u64> {
    let mut settled = 0;
    for chunk in chunks::unsettled(pool, UNSETTLED_AFTER_MS, limit).await? {
        ctx.cache.invalidate_counts(&chunk.user_ids).await?;
        chunks::settle(pool, chunk.message_id, chunk.chunk_id).await?;
        settled += 1;
        if !chunks::has_pending(pool, chunk.message_id).await? {
            send::complete_if_done(ctx, chunk.message_id).await?;
        }
    }
    if settled > 0 {
        metrics::counter!("notify_chunks_settled_total").increment(settled);
    }
    Ok(settled)
}

/// `user_ids` without the `held_back` ones (few, usually none).
fn without(mut user_ids: Vec<u64>, held_back: &[u64]) -> Vec<u64> {
    if !held_back.is_empty() {
        user_ids.retain(|user_id| !held_back.contains(user_id));
    }
    user_ids
}

/// Publishes the chunk's [`BusEvent::ItemsDelivered`]. Before the ack: a
/// failure fails the task, whose redelivery publishes again.
async fn announce_items(
    ctx: &Context,
    message_id: MessageId,
    user_ids: Vec<u64>,
    summary: ContentSummary,
    committed_at_ms: Option<i64>,
) -> Result<()> {
    let event = BusEvent::ItemsDelivered {
        message_id: message_id.get(),
        user_ids,
        summary,
        committed_at_ms,
    };
    events::publish(ctx, &event).await
}

/// Records a task's chunk as failed after its last attempt, so its
/// recipients show as failed in progress and the send can complete.
pub async fn record_failure(ctx: &Context, task: &ChunkTask) -> Result<()> {
    let message_id = MessageId::from_raw(task.message_id);
    let pool = ctx.task_pool(ShardId(task.shard))?;
    let event = notify_domain::settings::WebhookEvent::MessageFailed;
    let webhook = send::Outboxed::new(ctx, message_id, event, Some(task.chunk_id));
    let record = send::record_of(ctx, &webhook);
    if chunks::mark_failed(pool, message_id, task.chunk_id, record).await? {
        if let Some(webhook) = webhook {
            webhook.queue(ctx, pool).await;
        }
        send::complete_if_done(ctx, message_id).await?;
    }
    Ok(())
}
