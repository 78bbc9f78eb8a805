//! Control operations on a send (cancel, recall, edit) as durable intents
//! driven to the end on every shard, as delivery is.
//!
//! A call records its operation in the transaction that changes the send's
//! home record (`messages::change_with_operation`: the status, or the
//! content for an edit), leased to itself, and answers once the operation's
//! visible part is done or `control.answer_within_ms` has passed; the
//! operation goes on in a task of the api that took the call. Whatever fails
//! midway (a shard down or black-holed, a deadlock, Redis away, the api
//! killed between two steps) leaves the operation recorded with its lease
//! given back or running out, and any worker's sweeper takes it ([`sweep`])
//! and drives it again from where the shards say it stands. Every step is
//! idempotent: a step run twice finds its work done. The send reports the
//! operation (`pending_operations`) until every shard's part is done.
//!
//! A drive ([`drive`]) has two parts:
//! - **visible**, per shard, in parallel: the shard's content copy is
//!   revoked (a recall, an announcement's cancel) or takes the edit, so
//!   every read of the shard's items shows the change at once; then the
//!   cached badges and pages that may hold the old state are retired, in
//!   proportion to the change ([`Retire`]): the send's recipients on that
//!   shard, read from its delivered chunks (a recall or edit of a send of
//!   up to `control.retire_recipients_max`), or every user's through the
//!   announcement epoch (an announcement, or a larger send); then the
//!   gateway streams of those users are told. The shard is then recorded
//!   done for the operation's generation. The status cache is refreshed
//!   first, so no worker starts a chunk of a cancelled or recalled send
//!   after the call answered.
//! - **bulk**, on each shard whose visible part is done, at O(page) per
//!   statement: a cancel's or recall's pending chunks are cancelled a page
//!   per transaction ([`chunks::cancel_pending_page`]), so a
//!   10,000,000-recipient cancel answers at once and `progress.cancelled`
//!   rises as it goes; a recall publishes one recall task per delivered
//!   chunk, which the workers apply ([`crate::recall`]), and waits for them
//!   (its lease given back for `worker.sweep_timeout_secs`, after which a
//!   sweeper looks again and publishes the tasks of a recall that stopped
//!   moving).
//!
//! An operation is finished, and its row deleted, once every shard's part
//! is done: a cancel once no shard has a pending chunk, a recall once no
//! shard has a chunk left to take back (the send's `finished_at`), an edit
//! once every copy holds it and the streams were told.

mod recall;

use std::sync::Arc;
use std::time::Duration;

use shard_router::{Key, ShardId};
use sqlx::MySqlPool;
use tokio::sync::{Semaphore, oneshot};
use tracing::{Instrument as _, info, info_span, warn};

use crate::context::Context;
use crate::events::{self, BusEvent};
use crate::status::{refresh_status, refresh_status_best_effort};
use notify_domain::domain::{AudienceKind, MessageId, SendStatus};
use notify_domain::error::{Error, Result};
use notify_store::db::messages::{self, ControlChange, MessageRow};
use notify_store::db::operations::{self, Operation};
pub use notify_store::db::operations::{OperationKind, Retire};
use notify_store::db::webhook_outbox::Record;
use notify_store::db::{chunks, retrying};

/// Longest wait between two drives of a failing operation.
const MAX_RETRY: Duration = Duration::from_secs(10);

/// Operations a sweep takes from one home shard at once.
const CLAIM_BATCH: u32 = 100;

/// Chunks read per page when a shard's recipients are retired.
const RETIRE_PAGE: u32 = 200;

/// Records `kind` with `change` on a send's home record, then drives it: the
/// call's part of a control operation. Returns `Ok(false)` when the record
/// was already changed that way (a repeated cancel or recall: its operation
/// was recorded by the first call and goes on), and FAILED_PRECONDITION or
/// NOT_FOUND when the change does not apply. `webhook` is recorded with the
/// change (the caller queues it once this returned true).
pub(crate) async fn begin(
    ctx: &Context,
    row: &MessageRow,
    change: ControlChange<'_>,
    kind: OperationKind,
    webhook: Option<Record<'_>>,
) -> Result<bool> {
    let message_id = MessageId::from_raw(row.message_id);
    let retire = retire_for(ctx, row, kind).await?;
    let token: u64 = rand::random();
    let lease_ms = ctx.settings.control.lease_secs * 1000;
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    let recorded = retrying("messages::change_with_operation", || {
        messages::change_with_operation(
            &home, message_id, change, kind, retire, token, lease_ms, webhook,
        )
    })
    .await?;
    drop(home);
    let Some(operation) = recorded else {
        return explain_refusal(ctx, message_id, change, kind).await;
    };
    metrics::counter!("notify_control_operations_total", "kind" => kind.name()).increment(1);
    info!(message_id = %message_id, operation = kind.name(), retire = ?retire, "control operation recorded");
    drive_in_background(ctx, operation).await;
    Ok(true)
}

/// Which cached badges and pages `kind` retires on `row`'s send: an
/// announcement's, every user's; a send that never started, none; else its
/// recipients', unless there are more than `control.retire_recipients_max`
/// (the recipients recorded with its batches on the home shard).
async fn retire_for(ctx: &Context, row: &MessageRow, kind: OperationKind) -> Result<Retire> {
    if row.audience == AudienceKind::AllUsers as u8 {
        return Ok(Retire::Everyone);
    }
    if kind == OperationKind::Cancel || row.started_at.is_none() {
        return Ok(Retire::Nothing);
    }
    let home = ctx.pools.for_message(row.message_id);
    let message_id = MessageId::from_raw(row.message_id);
    let recipients = messages::batch_recipients(&*home, message_id).await?;
    Ok(if recipients <= ctx.settings.control.retire_recipients_max {
        Retire::Recipients
    } else {
        Retire::Everyone
    })
}

/// Why a change did not apply: the send is gone, already changed that way
/// (`Ok(false)`), or in a state the change does not apply to.
async fn explain_refusal(
    ctx: &Context,
    message_id: MessageId,
    change: ControlChange<'_>,
    kind: OperationKind,
) -> Result<bool> {
    let home = ctx.pools.for_message(message_id.get());
    let row = messages::fetch_existing(&home, message_id).await?;
    let current = row.status()?;
    match change {
        ControlChange::Status { to, .. } if current == to => Ok(false),
        _ => Err(Error::FailedPrecondition(format!(
            "cannot {} message {message_id}: it is {}",
            kind.name(),
            current.name()
        ))),
    }
}

/// Drives `operation` in a task of its own and waits for its visible part,
/// at most `control.answer_within_ms`: the call answers then, and the task
/// goes on (the lease is its own; if this process dies, a sweeper takes
/// the operation once the lease runs out).
async fn drive_in_background(ctx: &Context, operation: Operation) {
    let (visible, seen) = oneshot::channel();
    let span = info_span!("control", message_id = %operation.message_id, operation = operation.kind.name());
    let task_ctx = ctx.clone();
    tokio::spawn(
        async move {
            if let Err(e) = drive(&task_ctx, operation, Some(visible)).await {
                warn!(error = %e, "control operation not finished, the sweeper will go on");
            }
        }
        .instrument(span),
    );
    let wait = Duration::from_millis(ctx.settings.control.answer_within_ms);
    let _ = tokio::time::timeout(wait, seen).await;
}

/// How a drive ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drive {
    /// Every part is done: the operation is finished.
    Finished,
    /// Work it started is in flight (recall tasks): its lease was given
    /// back, to be looked at again after `worker.sweep_timeout_secs`.
    Waiting,
    /// Another driver holds the operation now (its lease ran out here).
    LostLease,
}

/// Drives `operation` (leased to its `lease_token`) as far as the shards
/// let it, and records how far: finished, waiting for work in flight, or
/// released to be tried again after a backoff when a step failed (the
/// error is returned). `visible` hears when the visible part is over,
/// done or not.
pub async fn drive(
    ctx: &Context,
    operation: Operation,
    visible: Option<oneshot::Sender<()>>,
) -> Result<Drive> {
    let message_id = operation.message_id;
    let kind = operation.kind;
    let result = drive_once(ctx, &operation, visible).await;
    let home = ctx.pools.for_message(message_id.get());
    let token = operation.lease_token;
    match &result {
        Ok(Drive::Waiting) => {
            let wait = ctx.settings.worker.sweep_timeout_secs * 1000;
            retrying("operations::release", || {
                operations::release(&home, message_id, kind, token, wait, "")
            })
            .await?;
        }
        Ok(_) => {}
        Err(e) => {
            metrics::counter!("notify_control_drive_errors_total", "kind" => kind.name())
                .increment(1);
            let backoff = retry_after(ctx, operation.attempts);
            let reason = e.to_string();
            let released = retrying("operations::release", || {
                let wait = backoff.as_millis() as u64;
                operations::release(&home, message_id, kind, token, wait, &reason)
            })
            .await;
            if let Err(release_error) = released {
                warn!(error = %release_error, message_id = %message_id, "could not give a control operation's lease back, it runs out");
            }
        }
    }
    result
}

/// The wait before drive number `attempts + 1` after a failure: doubling
/// from `control.retry_ms`, at most [`MAX_RETRY`].
fn retry_after(ctx: &Context, attempts: u32) -> Duration {
    let base = Duration::from_millis(ctx.settings.control.retry_ms);
    base.saturating_mul(1 << attempts.min(16)).min(MAX_RETRY)
}

/// Tells the caller that the visible part is over when dropped (on every
/// way out of a drive), or earlier with [`Self::now`].
struct Visible(Option<oneshot::Sender<()>>);

impl Visible {
    fn now(&mut self) {
        if let Some(visible) = self.0.take() {
            let _ = visible.send(());
        }
    }
}

impl Drop for Visible {
    fn drop(&mut self) {
        self.now();
    }
}

async fn drive_once(
    ctx: &Context,
    operation: &Operation,
    visible: Option<oneshot::Sender<()>>,
) -> Result<Drive> {
    let mut visible = Visible(visible);
    let message_id = operation.message_id;
    let home = ctx.pools.for_message(message_id.get());
    let row = messages::fetch_existing(&home, message_id).await?;
    drop(home);
    let (done, unfinished) = visible_part(ctx, operation, &row).await;
    let announcement = row.audience == AudienceKind::AllUsers as u8;
    if !announcement && operation.kind != OperationKind::Edit {
        // The rest pages through chunks: the call need not wait for it.
        visible.now();
    }
    // A shard whose visible part failed holds back only its own bulk part.
    let mut unfinished = unfinished.err();
    let paging = matches!(operation.kind, OperationKind::Cancel | OperationKind::Recall);
    if paging && !announcement {
        let delivered_any = row.started_at.is_some();
        for (shard, pool) in ctx.pools.iter().filter(|(shard, _)| done.contains(&shard.0)) {
            match cancel_pending(ctx, operation, shard, pool, delivered_any).await {
                Ok(true) => {}
                Ok(false) => return Ok(Drive::LostLease),
                Err(e) => {
                    warn!(error = %e, shard = shard.0, message_id = %message_id, "cancelling a shard's pending chunks failed");
                    unfinished.get_or_insert(e);
                }
            }
        }
    }
    if let Some(e) = unfinished {
        return Err(e);
    }
    if operation.kind == OperationKind::Recall && !announcement {
        recall::publish_unless_moving(ctx, message_id).await?;
        // Finishes the operation too, once the last chunk is through.
        return Ok(if finish_recall_if_done(ctx, message_id).await? {
            Drive::Finished
        } else {
            Drive::Waiting
        });
    }
    if operation.kind == OperationKind::Recall {
        let home = ctx.writable(Key::Message(message_id.get())).await?;
        retrying("messages::finish_recall", || messages::finish_recall(&home, message_id)).await?;
        drop(home);
        refresh_status_best_effort(ctx, message_id).await;
    }
    finish(ctx, operation).await?;
    Ok(Drive::Finished)
}

/// Runs the visible part on every shard not done yet, in parallel (each
/// bounded by `worker.operation_timeout_secs`); returns the shards done,
/// and the error of the first that failed, if one did, once all finished.
async fn visible_part(
    ctx: &Context,
    operation: &Operation,
    row: &MessageRow,
) -> (Vec<u32>, Result<()>) {
    let message_id = operation.message_id;
    // Workers check the status before every chunk: none starts a chunk of
    // a cancelled or recalled send once the cache holds it. Redis away,
    // they read the home shard; the drive fails and runs again, so the
    // cache is right once Redis is back.
    let refreshed = match operation.kind {
        OperationKind::Cancel | OperationKind::Recall => refresh_status(ctx, message_id).await,
        OperationKind::Edit => Ok(()),
    };
    let edited = match operation.kind {
        OperationKind::Edit => {
            let home = ctx.pools.for_message(message_id.get());
            match messages::edited_content(&home, message_id).await {
                Ok(edited) => Some(edited),
                Err(e) => return (operation.shards_done.clone(), Err(e.into())),
            }
        }
        _ => None,
    };
    let announcement = row.audience == AudienceKind::AllUsers as u8;
    let limit = Duration::from_secs(ctx.settings.worker.operation_timeout_secs);
    let steps = ctx.pools.iter().filter(|(shard, _)| !operation.is_done_on(shard.0)).map(
        |(shard, pool)| {
            let edited = edited.as_ref();
            async move {
                let step = shard_step(ctx, operation, shard, pool, announcement, edited);
                let result = tokio::time::timeout(limit, step).await.unwrap_or_else(|_| {
                    Err(Error::Unavailable(format!(
                        "shard {} did not answer within worker.operation_timeout_secs",
                        shard.0
                    )))
                });
                if let Err(e) = &result {
                    warn!(error = %e, shard = shard.0, message_id = %message_id, operation = operation.kind.name(), "a shard's part of a control operation failed");
                }
                (shard, result)
            }
        },
    );
    let results = futures::future::join_all(steps).await;
    let mut done = operation.shards_done.clone();
    let mut first_error = None;
    for (shard, result) in results {
        match result {
            Ok(()) => done.push(shard.0),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    (done, first_error.map_or(refreshed, Err))
}

/// One shard's visible part: its content copy changed, then what may hold
/// the old state retired, then the shard recorded done.
async fn shard_step(
    ctx: &Context,
    operation: &Operation,
    shard: ShardId,
    pool: &MySqlPool,
    announcement: bool,
    edited: Option<&messages::EditedContent>,
) -> Result<()> {
    let message_id = operation.message_id;
    match (operation.kind, edited) {
        (OperationKind::Edit, Some(edited)) => {
            retrying("chunks::edit_content", || chunks::edit_content(pool, message_id, edited))
                .await?;
        }
        (OperationKind::Cancel, _) if !announcement => {}
        _ => {
            retrying("chunks::revoke_content", || chunks::revoke_content(pool, message_id)).await?
        }
    }
    match operation.retire {
        Retire::Nothing => {}
        Retire::Everyone => {
            ctx.cache.bump_announcement_epoch().await?;
        }
        Retire::Recipients => retire_recipients(ctx, operation, pool).await?,
    }
    // Before the shard is recorded done: a publish that fails makes the
    // step run again, so the event is never dropped (a duplicate, per
    // shard, is harmless).
    tell_everyone(ctx, operation, announcement, edited).await?;
    let home = ctx.pools.for_message(message_id.get());
    let generation = operation.generation;
    retrying("operations::shard_done", || {
        operations::shard_done(&home, message_id, operation.kind, generation, shard.0)
    })
    .await
}

/// Retires the cached badges and pages of the send's recipients on one
/// shard (its delivered chunks', a page at a time), then tells their
/// streams of a recall.
async fn retire_recipients(ctx: &Context, operation: &Operation, pool: &MySqlPool) -> Result<()> {
    let message_id = operation.message_id;
    let mut from = Some(0);
    while let Some(start) = from {
        let (users, next) = retrying("chunks::delivered_recipients", || {
            chunks::delivered_recipients(pool, message_id, start, RETIRE_PAGE)
        })
        .await?;
        from = next;
        if users.is_empty() {
            continue;
        }
        ctx.cache.invalidate_counts(&users).await?;
        metrics::counter!("notify_control_badges_retired_total", "kind" => operation.kind.name())
            .increment(users.len() as u64);
        if operation.kind == OperationKind::Recall {
            let event = BusEvent::Revoked { message_id: message_id.get(), user_ids: Some(users) };
            events::publish(ctx, &event).await?;
        }
    }
    Ok(())
}

/// Tells every stream of a change whose audience is everyone (an
/// announcement's cancel or recall, a large recall) or that every stream
/// shows (an edit's new headline).
async fn tell_everyone(
    ctx: &Context,
    operation: &Operation,
    announcement: bool,
    edited: Option<&messages::EditedContent>,
) -> Result<()> {
    let message_id = operation.message_id.get();
    let event = match (operation.kind, edited) {
        (OperationKind::Edit, Some(edited)) => {
            let edited_at_ms = edited.edited_at.map_or(0, |at| at.and_utc().timestamp_millis());
            // A template's title differs by reader: streams get none, and
            // re-read the item.
            let title =
                if edited.template.is_some() { String::new() } else { edited.title.clone() };
            BusEvent::Edited { message_id, title, edited_at_ms }
        }
        (OperationKind::Cancel, _) if !announcement => return Ok(()),
        _ if operation.retire != Retire::Everyone => return Ok(()),
        _ => BusEvent::Revoked { message_id, user_ids: None },
    };
    events::publish(ctx, &event).await
}

/// Cancels a send's pending chunks on one shard, a page per transaction,
/// renewing the lease between pages. Returns false when the lease was lost.
async fn cancel_pending(
    ctx: &Context,
    operation: &Operation,
    shard: ShardId,
    pool: &MySqlPool,
    delivered_any: bool,
) -> Result<bool> {
    let message_id = operation.message_id;
    let page = ctx.settings.control.cancel_page_chunks;
    let lease_ms = ctx.settings.control.lease_secs * 1000;
    let mut from = Some(0);
    while let Some(start) = from {
        let (cancelled, next) = retrying("chunks::cancel_pending_page", || {
            chunks::cancel_pending_page(pool, message_id, start, page, delivered_any)
        })
        .await?;
        from = next;
        if cancelled > 0 {
            metrics::counter!("notify_chunks_cancelled_total").increment(cancelled);
        }
        if from.is_some() {
            let home = ctx.pools.for_message(message_id.get());
            let (kind, token) = (operation.kind, operation.lease_token);
            let renewed = retrying("operations::renew", || {
                operations::renew(&home, message_id, kind, token, lease_ms)
            })
            .await?;
            if !renewed {
                warn!(shard = shard.0, message_id = %message_id, "a control operation's lease was taken over");
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Finishes an operation whose every part is done (a no-op when it was
/// finished already, or asked for again since).
pub(crate) async fn finish(ctx: &Context, operation: &Operation) -> Result<()> {
    let message_id = operation.message_id;
    let home = ctx.pools.for_message(message_id.get());
    let (kind, generation) = (operation.kind, operation.generation);
    let finished =
        retrying("operations::finish", || operations::finish(&home, message_id, kind, generation))
            .await?;
    if finished {
        let age = (chrono::Utc::now().naive_utc() - operation.created_at).num_milliseconds();
        metrics::histogram!("notify_control_operation_seconds", "kind" => kind.name())
            .record(age.max(0) as f64 / 1000.0);
        info!(message_id = %message_id, operation = kind.name(), "control operation finished");
    }
    Ok(())
}

/// The sweeper's part (every worker, every sweep): takes this home shard's
/// operations whose lease ran out, as many as `drives` has permits free,
/// and drives each in a task of its own holding a permit (a drive of a
/// large cancel pages for a while; the sweep does not wait for it). Returns
/// how many it took.
pub async fn sweep(ctx: &Context, home: &MySqlPool, drives: &Arc<Semaphore>) -> Result<usize> {
    let free = drives.available_permits().min(CLAIM_BATCH as usize) as u32;
    if free == 0 {
        return Ok(0);
    }
    let token: u64 = rand::random();
    let lease_ms = ctx.settings.control.lease_secs * 1000;
    let due =
        retrying("operations::claim_due", || operations::claim_due(home, token, lease_ms, free))
            .await?;
    let taken = due.len();
    for operation in due {
        let Ok(permit) = Arc::clone(drives).acquire_owned().await else { break };
        let (message_id, kind) = (operation.message_id, operation.kind);
        let span = info_span!("control", message_id = %message_id, operation = kind.name());
        let ctx = ctx.clone();
        tokio::spawn(
            async move {
                match drive(&ctx, operation, None).await {
                    Ok(Drive::Finished) => info!("control operation finished by a sweeper"),
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "control operation not finished yet"),
                }
                drop(permit);
            }
            .instrument(span),
        );
    }
    Ok(taken)
}

pub use recall::finish_recall_if_done;

/// The operations of a send not finished yet.
pub async fn pending(ctx: &Context, message_id: MessageId) -> Result<Vec<OperationKind>> {
    let home = ctx.pools.for_message(message_id.get());
    Ok(operations::pending_kinds(&home, message_id).await?)
}

/// Returns true when a send's status says a control operation took it out
/// of delivery for good.
pub fn stops_delivery(status: SendStatus) -> bool {
    matches!(status, SendStatus::Cancelled | SendStatus::Recalled)
}
