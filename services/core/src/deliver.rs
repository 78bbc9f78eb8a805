//! Applying chunk tasks: the worker's unit of work, a group of one send's
//! chunks on one shard ([`apply_group`]; a lone task is a group of one).
//!
//! Order of effects, each safe to repeat:
//! 1. check the send's status (cache, else home shard); not SENDING -> skip,
//!    the chunks stay pending (paused) or are cancelled later (cancelled);
//! 2. apply the chunks in one transaction on their shard (each chunk its
//!    own guard);
//! 3. invalidate the recipients' cached badges and publish each chunk's
//!    change event for gateway streams (also when step 2 finds a chunk
//!    already done: a worker may have died between commit and here). The
//!    commit leaves the chunks unsettled, and only a confirmed invalidation
//!    moves them to done; when Redis does not answer, delivery goes on and
//!    [`settle`] invalidates once Redis is back (for recalled chunks too,
//!    [`crate::recall`]). An unsettled chunk keeps its send from completing;
//! 4. complete the send if this shard has no pending chunk left and no other
//!    shard has either.
//!
//! The task is acknowledged only after all of it, so a crash anywhere means a
//! redelivery, and a redelivery changes nothing that already happened.

use std::collections::HashMap;

use shard_router::{Key, ShardId, Snapshot};
use sqlx::MySqlPool;
use tracing::{debug, instrument, warn};

use crate::context::Context;
use crate::control;
use crate::events::{self, BusEvent};
use crate::queue::ChunkTask;
use crate::render;
use crate::send;
use notify_domain::domain::{Lane, MessageId, SendStatus};
use notify_domain::error::{Error, Result};
use notify_store::db::chunks::{
    self, ApplyOutcome, ChunkPlan, ContentSummary, GroupApplied, GroupChunk,
};
use notify_store::db::{messages, recall};

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

/// Applies chunk tasks of ONE send on ONE shard (steps 1-4 above), a single
/// task being a group of one: one status check, one transaction (each
/// chunk keeps its guard: only pending ones are applied), one badge
/// invalidation, one settle and one completion check for all of them.
/// Returns one outcome per chunk id, in the order given; the items written
/// are counted on the first chunk applied now.
///
/// `redelivered` says the broker handed these tasks out before (a worker
/// died or gave them back); only then is the attempt counted for poison
/// detection, which keeps a first delivery at one transaction.
#[instrument(skip_all, fields(message_id = message_id.get(), shard = shard.0, chunks = chunk_ids.len(), chunk_ids = ?chunk_ids))]
pub async fn apply_group(
    ctx: &Context,
    shard: ShardId,
    message_id: MessageId,
    chunk_ids: &[u64],
    redelivered: bool,
) -> Result<Vec<TaskOutcome>> {
    let Some(status) = send::status_of(ctx, message_id).await? else {
        debug!("message does not exist, dropping the tasks");
        return Ok(vec![TaskOutcome::Dropped; chunk_ids.len()]);
    };
    let pool = ctx.task_pool(shard)?;
    if !matches!(status, SendStatus::Sending | SendStatus::Completed) {
        settle_finished(ctx, pool, message_id, chunk_ids).await?;
        return Ok(vec![TaskOutcome::Skipped(status); chunk_ids.len()]);
    }
    let failed =
        if redelivered { poisoned(ctx, shard, message_id, chunk_ids).await? } else { Vec::new() };
    let applying: Vec<u64> = chunk_ids.iter().copied().filter(|id| !failed.contains(id)).collect();
    if applying.is_empty() {
        return Ok(vec![TaskOutcome::Failed; chunk_ids.len()]);
    }
    let Some(group) = apply_placed(ctx, shard, message_id, &applying).await? else {
        let dropped =
            |id: &u64| if failed.contains(id) { TaskOutcome::Failed } else { TaskOutcome::Dropped };
        return Ok(chunk_ids.iter().map(dropped).collect());
    };
    let committed_at_ms = Some(chrono::Utc::now().timestamp_millis());
    settle_unsettled(ctx, pool, message_id, &group).await?;
    announce_delivered(ctx, pool, message_id, &group, committed_at_ms).await?;
    let applied_now = group.chunks.iter().any(|c| c.applied_now);
    if applied_now {
        // Tells the sweeper this send is moving; losing it only costs a
        // harmless re-publish.
        let _ = ctx.cache.heartbeat(message_id.get(), ctx.settings.worker.sweep_timeout_secs).await;
        metrics::counter!("notify_items_delivered_total").increment(group.delivered);
    }
    if chunk_ids.len() > 1 {
        // Groups of several: a lone task is counted in `notify_chunks_total`.
        metrics::histogram!("notify_chunk_group_size").record(chunk_ids.len() as f64);
    }
    // A send whose chunks were all done before may have missed its
    // completion (an earlier attempt died first).
    let found = !group.chunks.is_empty();
    let check = applied_now || (found && status == SendStatus::Sending);
    if check && !chunks::has_pending(pool, message_id).await? {
        send::complete_if_done(ctx, message_id).await?;
    }
    let mut items = Some(group.delivered);
    let outcomes = chunk_ids
        .iter()
        .map(|chunk_id| match group.chunks.iter().find(|c| c.chunk_id == *chunk_id) {
            _ if failed.contains(chunk_id) => TaskOutcome::Failed,
            Some(chunk) if chunk.applied_now => {
                TaskOutcome::Delivered { items: items.take().unwrap_or(0) }
            }
            Some(_) => TaskOutcome::AlreadyDone,
            None => TaskOutcome::Dropped,
        })
        .collect();
    Ok(outcomes)
}

/// Invalidates the badges of the group's unsettled chunks' recipients and
/// settles those chunks: the ones this commit applied, and any an earlier
/// attempt left so (chunks done before, a duplicate task, were settled
/// then). Redis away: delivery goes on, and the chunks stay unsettled (and
/// their send incomplete) for the settler.
async fn settle_unsettled(
    ctx: &Context,
    pool: &MySqlPool,
    message_id: MessageId,
    group: &GroupApplied,
) -> Result<()> {
    let unsettled: Vec<&GroupChunk> = group.chunks.iter().filter(|c| c.unsettled).collect();
    let users: Vec<u64> = unsettled.iter().flat_map(|c| c.user_ids.iter().copied()).collect();
    match ctx.cache.invalidate_counts(&users).await {
        Ok(()) => {
            let ids: Vec<u64> = unsettled.iter().map(|c| c.chunk_id).collect();
            chunks::settle(pool, message_id, &ids).await?;
        }
        Err(e) => {
            warn!(error = %e, chunks = unsettled.len(), "badges not invalidated, chunks left unsettled");
            metrics::counter!("notify_chunks_unsettled_total").increment(unsettled.len() as u64);
        }
    }
    Ok(())
}

/// Publishes the event of each chunk of the group whose items exist. It is
/// about the recipients that got the item: not those their preferences
/// held back now, and for a chunk applied before (a duplicate task, whose
/// first attempt may have died before its event), those that have it.
async fn announce_delivered(
    ctx: &Context,
    pool: &MySqlPool,
    message_id: MessageId,
    group: &GroupApplied,
    committed_at_ms: Option<i64>,
) -> Result<()> {
    let mut delivered = Vec::new();
    for chunk in group.chunks.iter().filter(|c| c.delivered) {
        // Each recipient's own vars: the chunk's, read by the apply; for a
        // chunk applied before (which keeps none), its items'.
        let (with_item, item_vars, at) = if chunk.applied_now {
            (without(chunk.user_ids.clone(), &group.held_back), None, committed_at_ms)
        } else {
            let found = chunks::recipients_with_item(pool, message_id, &chunk.user_ids).await?;
            let with_item = found.iter().map(|(user_id, _)| *user_id).collect();
            let vars: Vec<(u64, String)> =
                found.into_iter().filter_map(|(user_id, vars)| Some((user_id, vars?))).collect();
            (with_item, (!vars.is_empty()).then_some(vars), None)
        };
        delivered.push((chunk, with_item, item_vars, at));
    }
    // A templated content's titles, rendered for the whole group at once
    // (one read of the recipients' languages).
    let mut titles = match &group.template {
        Some(template) => {
            let texts = render::Texts {
                message_id: message_id.get(),
                edited_at: group.edited_at,
                template,
                title: &group.summary.title,
                body: None,
                data: "{}",
            };
            let recipients: Vec<render::Recipients<'_>> = delivered
                .iter()
                .map(|(chunk, with_item, item_vars, _)| render::Recipients {
                    user_ids: with_item,
                    vars: match item_vars {
                        Some(vars) => Some(
                            vars.iter().map(|(user_id, vars)| (*user_id, vars.as_str())).collect(),
                        ),
                        None => chunk.vars.as_ref().map(|vars| {
                            chunk
                                .user_ids
                                .iter()
                                .copied()
                                .zip(vars.iter().map(String::as_str))
                                .collect()
                        }),
                    },
                })
                .collect();
            render::titles(pool, &texts, &recipients, group.locales.as_ref()).await?
        }
        None => Vec::new(),
    }
    .into_iter();
    for (_, with_item, _, at) in delivered {
        let titles = titles.next().unwrap_or_default();
        let items = Delivered { user_ids: with_item, titles, summary: group.summary.clone() };
        announce_items(ctx, message_id, items, at).await?;
    }
    Ok(())
}

/// Invalidates the badges of the recipients of each chunk that is no longer
/// pending, and settles it if it is unsettled: a redelivery of a chunk
/// applied just before a crash must still do that, paused send or not.
async fn settle_finished(
    ctx: &Context,
    pool: &MySqlPool,
    message_id: MessageId,
    chunk_ids: &[u64],
) -> Result<()> {
    for chunk_id in chunk_ids {
        let finished = chunks::finished_recipients(pool, message_id, *chunk_id).await?;
        if let Some((user_ids, unsettled)) = finished {
            ctx.cache.invalidate_counts(&user_ids).await?;
            if unsettled {
                chunks::settle(pool, message_id, &[*chunk_id]).await?;
            }
        }
    }
    Ok(())
}

/// Counts an attempt at each chunk and records those taken too often
/// without ever committing (workers died on them) as failed, instead of
/// letting them loop forever; returns those.
async fn poisoned(
    ctx: &Context,
    shard: ShardId,
    message_id: MessageId,
    chunk_ids: &[u64],
) -> Result<Vec<u64>> {
    let pool = ctx.task_pool(shard)?;
    let mut failed = Vec::new();
    for chunk_id in chunk_ids {
        let attempts = chunks::count_attempt(pool, message_id, *chunk_id).await?;
        if attempts > ctx.settings.worker.poison_attempts {
            record_failure(ctx, &ChunkTask::deliver(message_id.get(), *chunk_id, shard.0)).await?;
            failed.push(*chunk_id);
        }
    }
    Ok(failed)
}

/// Applies the chunks ([`chunks::apply`]) under a map that routes their
/// pending recipients here, first splitting off those a newer map routes
/// elsewhere; `None` when the send has no content copy here.
async fn apply_placed(
    ctx: &Context,
    shard: ShardId,
    message_id: MessageId,
    chunk_ids: &[u64],
) -> Result<Option<GroupApplied>> {
    let pool = ctx.task_pool(shard)?;
    let mut splits = 0;
    loop {
        // Held through the apply: this replica reports a newer map only
        // once the chunks' items are written by this one (and only while
        // its write lease holds: no bucket to check, the chunks' are below).
        let routes = ctx.writable_snapshot(&[]).await?;
        let placed = |user_ids: &[u64]| placed_on(&routes, shard, user_ids);
        let hold = ctx.holding_sends.check(shard, message_id);
        match chunks::apply(pool, message_id, chunk_ids, hold, placed).await? {
            ApplyOutcome::Applied(group) => {
                if group.chunks.iter().any(|c| c.applied_now) {
                    ctx.holding_sends.note(shard, message_id, !group.held_back.is_empty());
                }
                return Ok(Some(group));
            }
            ApplyOutcome::Missing => return Ok(None),
            ApplyOutcome::Misplaced { chunks } if splits < MAX_SPLITS => {
                drop(routes);
                splits += 1;
                for chunk in chunks {
                    split(ctx, shard, message_id, &chunk).await?;
                }
            }
            ApplyOutcome::Misplaced { chunks } => {
                return Err(Error::Unavailable(format!(
                    "chunk {} of message {message_id}: its recipients kept moving between shards",
                    chunks[0].chunk_id
                )));
            }
        }
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
    chunk: &GroupChunk,
) -> Result<()> {
    let (chunk_id, user_ids) = (chunk.chunk_id, chunk.user_ids.as_slice());
    let vars: Option<HashMap<u64, &String>> =
        chunk.vars.as_ref().map(|vars| user_ids.iter().copied().zip(vars).collect());
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
        let own_vars = vars.as_ref().map(|vars| {
            users.iter().filter_map(|user| vars.get(user).map(|v| (*v).clone())).collect()
        });
        let chunk = ChunkPlan {
            chunk_id: split_chunk_id(chunk_id, owner, &users),
            user_ids: users,
            vars: own_vars,
        };
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

/// How long a chunk may stay unsettled before a settler takes it over from
/// its worker (which settles it right after its commit when Redis answers).
const UNSETTLED_AFTER_MS: u64 = 1_000;

/// Settles the chunks of one shard a worker applied or recalled while
/// Redis was away (up to `limit` of each, [`chunks::unsettled`]):
/// invalidates their recipients' cached badges, moves them on (to done, to
/// recalled), and finishes what waited for them: a send's completion if
/// nothing else of it is left, a recall's gateway event and end. Stops at
/// the first Redis error (still away). Returns how many were settled.
pub async fn settle(ctx: &Context, pool: &MySqlPool, limit: u32) -> Result<u64> {
    let mut settled = 0;
    for chunk in chunks::unsettled(pool, UNSETTLED_AFTER_MS, limit).await? {
        ctx.cache.invalidate_counts(&chunk.user_ids).await?;
        let (message_id, chunk_ids) = (chunk.message_id, [chunk.chunk_id]);
        if chunk.recalled {
            recall::settle_recall(pool, message_id, &chunk_ids).await?;
            events::badges_changed(ctx, chunk.user_ids).await;
            control::finish_recall_if_done(ctx, message_id).await?;
        } else {
            chunks::settle(pool, message_id, &chunk_ids).await?;
            if !chunks::has_pending(pool, message_id).await? {
                send::complete_if_done(ctx, message_id).await?;
            }
        }
        settled += 1;
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

/// Who got a chunk's items, and what their events show.
struct Delivered {
    user_ids: Vec<u64>,
    /// Each one's title, for a templated content (else empty).
    titles: Vec<String>,
    summary: ContentSummary,
}

/// Publishes the chunk's [`BusEvent::ItemsDelivered`]. Before the ack: a
/// failure fails the task, whose redelivery publishes again.
async fn announce_items(
    ctx: &Context,
    message_id: MessageId,
    items: Delivered,
    committed_at_ms: Option<i64>,
) -> Result<()> {
    let event = BusEvent::ItemsDelivered {
        message_id: message_id.get(),
        user_ids: items.user_ids,
        summary: items.summary,
        titles: items.titles,
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
