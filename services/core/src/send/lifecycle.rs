//! Lifecycle transitions of a send and the status checks workers rely on,
//! and what they do to an announcement (a send to all users): it becomes
//! visible to every badge and stream when it starts and is hidden when it
//! is cancelled; pause, resume and redrive do not apply to it.
//! [`crate::announce`] stores and materializes announcements on top of sends.
//!
//! The home shard's `messages.status` is the truth; `status_version` grows
//! with every change. Every transition writes MySQL first, then caches
//! `version:status` in Redis with a compare-and-set that only moves versions
//! forward, so a delayed write of an older status (a slow StartMessage, a
//! worker filling the cache from an old read) can never overwrite a newer
//! one. Pause and cancel return only after the cache holds their status, so
//! a worker that checks the cache after PauseMessage returns sees PAUSED.

use std::collections::BTreeMap;

use shard_router::{Key, ShardId};
use sqlx::MySqlPool;
use tracing::{info, instrument, warn};

use super::webhooks::{Outboxed, record_of};
use super::{MessageView, fetch_visible, get};
use crate::context::Context;
use crate::events::{self, BusEvent};
use crate::queue::ChunkTask;
use crate::status::{refresh_status, refresh_status_best_effort};
use notify_domain::domain::{AudienceKind, Lane, MessageId, Priority, SendStatus};
use notify_domain::error::{Error, Result};
use notify_domain::settings::WebhookEvent;
use notify_store::db::messages::{self, ControlChange};
use notify_store::db::operations::OperationKind;
use notify_store::db::{chunks, event_outbox};
use notify_store::error::database_error;

async fn reject_announcement(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
    verb: &str,
) -> Result<()> {
    let row = fetch_visible(ctx, message_id, owner).await?;
    reject_for_announcement(row.audience, verb, message_id)
}

/// How an announcement starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnnouncementStart {
    /// Now, as it is sent.
    Now,
    /// Its `send_at` came (the scheduler).
    Due,
}

/// Starts an announcement on its home shard `home`, recording its
/// `Announced` event in the same transaction; returns the event and its
/// record's row when this call started it. Its content copies are stored
/// before it starts.
pub(crate) async fn start_announcement(
    home: &MySqlPool,
    message_id: MessageId,
    how: AnnouncementStart,
) -> Result<Option<(BusEvent, u64)>> {
    let mut tx = home.begin().await.map_err(database_error)?;
    let started = match how {
        AnnouncementStart::Now => {
            messages::request_start(&mut *tx, message_id, Lane::High as u8, true).await?
        }
        AnnouncementStart::Due => messages::start_scheduled(&mut *tx, message_id).await?,
    };
    if !started {
        tx.rollback().await.map_err(database_error)?;
        return Ok(None);
    }
    let (mut summary, template) = chunks::content_summary(&mut *tx, message_id)
        .await?
        .ok_or_else(|| Error::Internal(format!("announcement {message_id} has no content copy")))?;
    let mut titles = BTreeMap::new();
    if let Some(template) = template {
        // Every language's title with the send-wide vars: each gateway
        // shows its readers theirs.
        let texts = crate::render::Texts {
            message_id: message_id.get(),
            edited_at: None,
            template: &template,
            title: &summary.title,
            body: None,
            data: "{}",
        };
        if let Some(compiled) = crate::render::compiled(&texts) {
            summary.title = compiled.render_title("", None);
            titles = compiled.titles_by_language();
        }
    }
    let event = BusEvent::Announced { message_id: message_id.get(), summary, titles };
    let recorded = event_outbox::record(&mut tx, &event.recorded_body()).await?;
    tx.commit().await.map_err(database_error)?;
    Ok(Some((event, recorded)))
}

/// Makes a newly live announcement visible to every badge and stream: its
/// event (recorded with its start on `home`, row `recorded`) is published.
pub(crate) async fn activated(
    ctx: &Context,
    message_id: MessageId,
    home: ShardId,
    (event, recorded): (BusEvent, u64),
) {
    refresh_status_best_effort(ctx, message_id).await;
    // Every cached badge is retired before a gateway hears of it. When Redis
    // does not answer, the record stays for the event relay, which retires
    // them first once it does ([`events::relay_once`]).
    match ctx.cache.bump_announcement_epoch().await {
        Ok(_) => events::publish_recorded(ctx, home, recorded, Some(&event)).await,
        Err(e) => {
            warn!(error = %e, message_id = %message_id, "cached badges left to the event relay");
        }
    }
}

/// Rejects operations that do not apply to announcements.
fn reject_for_announcement(audience: u8, verb: &str, message_id: MessageId) -> Result<()> {
    if audience == AudienceKind::AllUsers as u8 {
        return Err(Error::FailedPrecondition(format!(
            "cannot {verb} message {message_id}: announcements can only be cancelled"
        )));
    }
    Ok(())
}

/// Moves `from -> to`, or explains why not: NOT_FOUND, or FAILED_PRECONDITION
/// naming the current status. Returns true if this call changed the status,
/// false if it already was `to` (repeating a pause or cancel is harmless).
/// A `webhook` event (when an endpoint asked for it) is recorded with the
/// change and queued after its commit (see [`super::webhooks`]).
pub(crate) async fn transition(
    ctx: &Context,
    message_id: MessageId,
    from: &[SendStatus],
    to: SendStatus,
    verb: &str,
    webhook: Option<WebhookEvent>,
) -> Result<bool> {
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    let webhook = webhook.and_then(|event| Outboxed::new(ctx, message_id, event, None));
    if messages::transition(&home, message_id, from, to, record_of(ctx, &webhook)).await? {
        if let Some(webhook) = webhook {
            // Queued without holding the map for a write (a freeze waits
            // on that): the record stays on the shard it was written to.
            let pool = MySqlPool::clone(&home);
            drop(home);
            webhook.queue(ctx, &pool).await;
        }
        refresh_status(ctx, message_id).await?;
        return Ok(true);
    }
    let (current, _) = messages::fetch_status_version(&home, message_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("message {message_id}")))?;
    if current == to {
        refresh_status(ctx, message_id).await?;
        return Ok(false);
    }
    Err(Error::FailedPrecondition(format!(
        "cannot {verb} message {message_id}: it is {}",
        current.name()
    )))
}

/// Starts a draft: now, or at its `send_at` if that is in the future (the
/// scheduler then starts it). Picks the lane from priority and size.
#[instrument(skip_all, fields(message_id = %message_id))]
pub async fn start(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
) -> Result<MessageView> {
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    let row = fetch_visible(ctx, message_id, owner).await?;
    let status = row.status()?;
    if status != SendStatus::NotStarted || row.start_requested {
        let state = if status == SendStatus::NotStarted { "scheduled" } else { status.name() };
        return Err(Error::FailedPrecondition(format!(
            "cannot start message {message_id}: it is already {state}"
        )));
    }
    // The control row is locked for the decision: appends hold it
    // share-locked until their batch is stored on every shard and recorded,
    // so the totals read below are final and no append slips in before the
    // update (it would then find the send started and be refused).
    let permit = ctx.cross_shard_permit().await?;
    let mut tx = home.begin().await.map_err(database_error)?;
    let locked: Option<(u8, bool)> = sqlx::query_as(
        "SELECT status, start_requested FROM messages WHERE message_id = ? FOR UPDATE",
    )
    .bind(message_id.get())
    .fetch_optional(&mut *tx)
    .await
    .map_err(database_error)?;
    if locked.is_none_or(|(status, requested)| status != SendStatus::NotStarted as u8 || requested)
    {
        return Err(Error::FailedPrecondition(format!(
            "cannot start message {message_id}: it was started concurrently"
        )));
    }
    let progress = super::progress(ctx, message_id).await?;
    if progress.total == 0 {
        return Err(Error::FailedPrecondition(format!(
            "cannot start message {message_id}: no recipients were appended"
        )));
    }
    // A batch whose AppendRecipients failed half-way is stored on some shards
    // but not recorded: refuse to deliver part of it.
    let recorded = messages::batch_recipients(&mut *tx, message_id).await?;
    if recorded != progress.total {
        return Err(Error::FailedPrecondition(format!(
            "cannot start message {message_id}: a batch was not completely appended \
             ({recorded} recipients recorded, {} stored); append it again",
            progress.total
        )));
    }
    let lane = if row.priority == Priority::High as u8
        || progress.total <= ctx.settings.send.small_send_threshold
    {
        Lane::High
    } else {
        Lane::Bulk
    };
    let start_now = row.send_at.is_none_or(|at| at <= super::now());
    if !messages::request_start(&mut *tx, message_id, lane as u8, start_now).await? {
        return Err(Error::FailedPrecondition(format!(
            "cannot start message {message_id}: it was started concurrently"
        )));
    }
    tx.commit().await.map_err(database_error)?;
    drop(permit);
    if start_now {
        refresh_status_best_effort(ctx, message_id).await;
        publish_or_leave_to_sweeper(ctx, message_id, lane).await;
    }
    info!(lane = lane.name(), start_now, total = progress.total, "message started");
    get(ctx, message_id, None).await
}

/// Starts a scheduled send that is due (called by the scheduler; safe with
/// several worker replicas: only the one whose update wins publishes).
#[instrument(skip_all, fields(message_id = %message_id))]
pub async fn start_due(ctx: &Context, message_id: MessageId) -> Result<bool> {
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    let row = messages::fetch_existing(&home, message_id).await?;
    if row.audience == AudienceKind::AllUsers as u8 {
        let due = AnnouncementStart::Due;
        let Some(started) = start_announcement(&home, message_id, due).await? else {
            return Ok(false);
        };
        let shard = home.shard();
        drop(home);
        refresh_status_best_effort(ctx, message_id).await;
        activated(ctx, message_id, shard, started).await;
        info!("scheduled announcement started");
        return Ok(true);
    }
    if !messages::start_scheduled(&*home, message_id).await? {
        return Ok(false);
    }
    refresh_status_best_effort(ctx, message_id).await;
    let lane = Lane::from_db(row.lane);
    publish_or_leave_to_sweeper(ctx, message_id, lane).await;
    info!(lane = lane.name(), "scheduled message started");
    Ok(true)
}

/// Publishes one task per pending chunk of a send, on every shard. The
/// chunk ids are read four publish windows at a time, so what the api
/// holds does not grow with the size of the send.
#[instrument(skip_all, fields(message_id = %message_id, lane = lane.name(), otel.kind = "producer"))]
pub async fn publish_pending(ctx: &Context, message_id: MessageId, lane: Lane) -> Result<u64> {
    let page = ctx.publisher.page();
    let mut published = 0;
    for (shard, pool) in ctx.pools.iter() {
        chunks::touch_pending(pool, message_id).await?;
        let mut from = Some(0);
        while let Some(start) = from {
            let ids = chunks::pending_page(pool, message_id, start, page).await?;
            from = chunks::next_page_from(&ids);
            let tasks: Vec<ChunkTask> = ids
                .into_iter()
                .map(|chunk_id| ChunkTask::deliver(message_id.get(), chunk_id, shard.0))
                .collect();
            ctx.publisher.publish(lane, &tasks).await?;
            published += tasks.len() as u64;
        }
    }
    Ok(published)
}

/// Publishes pending chunks; on failure the send stays SENDING and the
/// sweeper re-publishes its chunks after `worker.sweep_timeout_secs`.
async fn publish_or_leave_to_sweeper(ctx: &Context, message_id: MessageId, lane: Lane) {
    if let Err(e) = publish_pending(ctx, message_id, lane).await {
        warn!(error = %e, message_id = %message_id, "publishing chunks failed, the sweeper will retry");
    }
}

/// Pauses a sending send. After this returns, workers skip its chunks.
#[instrument(skip_all, fields(message_id = %message_id))]
pub async fn pause(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
) -> Result<MessageView> {
    reject_announcement(ctx, message_id, owner, "pause").await?;
    transition(ctx, message_id, &[SendStatus::Sending], SendStatus::Paused, "pause", None).await?;
    get(ctx, message_id, None).await
}

/// Resumes a paused send by re-publishing exactly its pending chunks.
#[instrument(skip_all, fields(message_id = %message_id))]
pub async fn resume(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
) -> Result<MessageView> {
    reject_announcement(ctx, message_id, owner, "resume").await?;
    // A repeated resume publishes again too: the first may have died before
    // publishing, and duplicate tasks are no-ops.
    transition(ctx, message_id, &[SendStatus::Paused], SendStatus::Sending, "resume", None).await?;
    // Not held across complete_if_done, which waits out a freeze.
    let home = ctx.pools.for_message(message_id.get());
    let lane = Lane::from_db(messages::fetch_existing(&home, message_id).await?.lane);
    drop(home);
    publish_or_leave_to_sweeper(ctx, message_id, lane).await;
    complete_if_done(ctx, message_id).await?;
    get(ctx, message_id, None).await
}

/// Cancels a send that has not completed: it is CANCELLED when this
/// returns (no chunk starts after), and its cancel is a control operation
/// ([`crate::control`]) that cancels its pending chunks a page at a time in
/// the background (an announcement's: hides it from every inbox at once).
#[instrument(skip_all, fields(message_id = %message_id))]
pub async fn cancel(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
) -> Result<MessageView> {
    let row = fetch_visible(ctx, message_id, owner).await?;
    let change =
        ControlChange::Status { from: &SendStatus::CANCELLABLE, to: SendStatus::Cancelled };
    if crate::control::begin(ctx, &row, change, OperationKind::Cancel, None).await? {
        info!(message_id = %message_id, "message cancelled");
    }
    super::get_after_change(ctx, message_id).await
}

/// Moves a send's failed chunks back to pending and publishes them again.
/// Allowed while the send is SENDING or COMPLETED (it goes back to SENDING).
#[instrument(skip_all, fields(message_id = %message_id))]
pub async fn redrive(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
) -> Result<MessageView> {
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    let row = fetch_visible(ctx, message_id, owner).await?;
    let status = row.status()?;
    reject_for_announcement(row.audience, "redrive", message_id)?;
    if !matches!(status, SendStatus::Sending | SendStatus::Completed) {
        return Err(Error::FailedPrecondition(format!(
            "cannot redrive message {message_id}: it is {}",
            status.name()
        )));
    }
    let mut reset = 0;
    for (_, pool) in ctx.pools.iter() {
        reset += chunks::reset_failed(pool, message_id).await?.len();
    }
    if reset > 0 {
        // Re-open (and bump the version) even if still SENDING, so a
        // completion check that saw no pending chunk a moment ago fails.
        messages::reopen(&home, message_id).await?;
        refresh_status_best_effort(ctx, message_id).await;
        publish_or_leave_to_sweeper(ctx, message_id, Lane::from_db(row.lane)).await;
    }
    get(ctx, message_id, None).await
}

/// Marks a SENDING send COMPLETED once no shard has a pending chunk of it.
/// Safe to call from anywhere, any number of times: the update only applies
/// if the status version read before the check is still current.
pub async fn complete_if_done(ctx: &Context, message_id: MessageId) -> Result<bool> {
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    let Some((status, version)) = messages::fetch_status_version(&home, message_id).await? else {
        return Ok(false);
    };
    if status != SendStatus::Sending {
        return Ok(false);
    }
    for (_, pool) in ctx.pools.iter() {
        if chunks::has_pending(pool, message_id).await? {
            return Ok(false);
        }
    }
    let webhook = Outboxed::new(ctx, message_id, WebhookEvent::MessageCompleted, None);
    let completed =
        messages::complete(&home, message_id, version, record_of(ctx, &webhook)).await?;
    if completed {
        let pool = MySqlPool::clone(&home);
        drop(home);
        refresh_status_best_effort(ctx, message_id).await;
        info!(message_id = %message_id, "message completed");
        if let Some(webhook) = webhook {
            webhook.queue(ctx, &pool).await;
        }
    }
    Ok(completed)
}
