//! Sends to explicit user lists: create, append recipients, start, pause,
//! resume, cancel, progress. Every step is idempotent so a retried call, or a
//! call retried after a crash, converges on the same state.

mod lifecycle;
pub mod plan;
mod progress;
mod webhooks;

use chrono::{NaiveDateTime, Utc};
use shard_router::Key;
use tracing::{info, instrument};

use crate::context::Context;
use notify_domain::domain::{
    AudienceKind, Content, MessageId, Priority, Recipients, SendStatus, StoredRecipients,
};
use notify_domain::error::{Error, Result};
use notify_domain::template::Template;
use notify_store::db::chunks::{self, ContentCopy};
pub use notify_store::db::messages::MessageRow;
use notify_store::db::messages::{self, NewMessage};
use notify_store::db::operations::OperationKind;
use notify_store::error::database_error;

pub use crate::status::status_of;
pub(crate) use lifecycle::{AnnouncementStart, activated, start_announcement};
pub use lifecycle::{complete_if_done, publish_pending, start_due};
pub use progress::{Progress, progress};
pub use webhooks::relay_once as relay_webhooks;
pub(crate) use webhooks::{Outboxed, record_of};

/// Batch number used for the inline recipients of `SendMessage`; client
/// batches of `AppendRecipients` start at 1.
pub const INLINE_BATCH: u64 = 0;

/// `AppendRecipients` calls a client of ours (`notifyctl send`, the bench)
/// keeps in flight for one draft: while the api decodes and stores one
/// batch, the client encodes the next and MariaDB writes a third, where
/// one at a time leaves each waiting on the others. The api admits at most
/// half its pool's connections of appends at once, whatever the clients send.
pub const APPENDS_IN_FLIGHT: usize = 4;

/// A validated request to create a send.
#[derive(Debug, Clone)]
pub struct NewSend {
    /// The client that sends (and will own the send).
    pub client: String,
    /// The sender it sends as.
    pub sender: String,
    /// Optional idempotency key.
    pub idempotency_key: Option<String>,
    /// What recipients see.
    pub content: Content,
    /// Who it goes to.
    pub audience: AudienceKind,
    /// Requested priority.
    pub priority: Priority,
    /// Scheduled start.
    pub send_at: Option<NaiveDateTime>,
    /// Expiry.
    pub expire_at: Option<NaiveDateTime>,
    /// Ignores the recipients' mutes (needs the `send.critical` scope).
    pub critical: bool,
}

/// A send with its progress.
#[derive(Debug, Clone)]
pub struct MessageView {
    /// The control record.
    pub row: MessageRow,
    /// Its counters; `None` in the answer to a control operation when a
    /// shard could not be read (the operation is recorded and goes on).
    pub progress: Option<Progress>,
    /// Its control operations not yet done on every shard.
    pub pending_operations: Vec<OperationKind>,
}

/// Result of creating a send.
#[derive(Debug, Clone, Copy)]
pub struct Created {
    /// The send's id.
    pub message_id: MessageId,
    /// True when the idempotency key matched an earlier send.
    pub deduplicated: bool,
}

/// Result of appending a batch.
#[derive(Debug, Clone, Copy)]
pub struct Appended {
    /// Distinct recipients in the batch.
    pub accepted: u64,
    /// True when the batch number had been appended before.
    pub duplicate_batch: bool,
}

/// Creates a draft (NOT_STARTED) control record, or returns the send that
/// already holds the idempotency key.
#[instrument(skip_all, fields(sender = %send.sender))]
pub async fn create(ctx: &Context, send: &NewSend) -> Result<Created> {
    let Some(key) = &send.idempotency_key else {
        return Ok(Created {
            message_id: insert_with_fresh_id(ctx, send).await?,
            deduplicated: false,
        });
    };
    let candidate = ctx.ids.next_id()?;
    let key = messages::IdempotencyKey { client: &send.client, sender: &send.sender, key };
    let route = messages::idempotency_route(key.client, key.sender, key.key);
    // One route at a time: a route held while waiting out a freeze of
    // another key would hold back the move that froze it (it waits for
    // every route of older maps to be dropped).
    let holder = {
        let key_pool = ctx.writable(Key::Str(&route)).await?;
        messages::claim_idempotency_key(&key_pool, key, candidate).await?
    };
    // The holder's control record may be missing if the first attempt died
    // right after claiming the key: write it now (a no-op if it exists).
    let home = ctx.writable(Key::Message(holder.get())).await?;
    if !messages::insert(&home, &new_message(send, holder)).await? {
        // The id exists: it must be this key's send, not another send whose
        // id collided with ours (two replicas with the same instance id).
        let existing = messages::fetch_existing(&home, holder).await?;
        if existing.client != send.client
            || existing.sender != send.sender
            || existing.idempotency_key.as_deref() != Some(key.key)
        {
            drop(home);
            if holder == candidate {
                let key_pool = ctx.writable(Key::Str(&route)).await?;
                messages::release_idempotency_key(&key_pool, key, holder).await?;
            }
            return Err(Error::Unavailable("message id collision, retry the request".to_owned()));
        }
    }
    Ok(Created { message_id: holder, deduplicated: holder != candidate })
}

async fn insert_with_fresh_id(ctx: &Context, send: &NewSend) -> Result<MessageId> {
    for _ in 0..8 {
        let id = ctx.ids.next_id()?;
        let home = ctx.writable(Key::Message(id.get())).await?;
        if messages::insert(&home, &new_message(send, id)).await? {
            return Ok(id);
        }
    }
    Err(Error::Internal("could not allocate a free message id".to_owned()))
}

fn new_message(send: &NewSend, message_id: MessageId) -> NewMessage {
    NewMessage {
        message_id,
        client: send.client.clone(),
        sender: send.sender.clone(),
        idempotency_key: send.idempotency_key.clone(),
        audience: send.audience,
        priority: send.priority as u8,
        content: send.content.clone(),
        send_at: send.send_at,
        expire_at: send.expire_at,
        critical: send.critical,
    }
}

/// Appends one numbered batch of sorted, distinct recipients to a draft.
///
/// The draft's control row is share-locked on its home shard for the whole
/// call, so a concurrent StartMessage waits until the batch is stored on
/// every target shard. Each shard stores its chunks idempotently, and the
/// batch number is recorded last: a retry after any failure stores the
/// missing part and nothing twice.
///
/// Recipients' vars are checked against the draft's template here (exactly
/// its `recipient_vars`, within the size limit), before anything is stored.
#[instrument(skip_all, fields(message_id = %message_id, batch_number, recipients = recipients.len()))]
pub async fn append(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
    batch_number: u64,
    recipients: Recipients,
) -> Result<Appended> {
    let count = recipients.len();
    let stored = |template: Option<&Template>| recipients.into_stored(template);
    append_with(ctx, message_id, owner, batch_number, count, stored).await
}

/// [`append`] of `count` recipients that `stored` gives as stored for the
/// draft's template, once the draft is locked.
async fn append_with(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
    batch_number: u64,
    count: usize,
    stored: impl FnOnce(Option<&Template>) -> Result<StoredRecipients>,
) -> Result<Appended> {
    // Each append holds a home connection while it takes one per target
    // shard; bounding concurrent appends keeps pools from starving each other.
    let _permit = ctx.cross_shard_permit().await?;
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    let mut tx = home.begin().await.map_err(database_error)?;
    let row: Option<(u8, bool, Option<NaiveDateTime>, NaiveDateTime, u8, String)> = sqlx::query_as(
        "SELECT status, start_requested, expire_at, created_at, audience, client \
             FROM messages WHERE message_id = ? LOCK IN SHARE MODE",
    )
    .bind(message_id.get())
    .fetch_optional(&mut *tx)
    .await
    .map_err(database_error)?;
    let Some((status, start_requested, expire_at, created_at, audience, client)) = row else {
        return Err(Error::NotFound(format!("message {message_id}")));
    };
    if owner.is_some_and(|owner| owner != client) {
        return Err(Error::NotFound(format!("message {message_id}")));
    }
    if audience != AudienceKind::Users as u8 {
        return Err(Error::FailedPrecondition(format!(
            "message {message_id} goes to all users; recipients cannot be appended"
        )));
    }
    if SendStatus::from_db(status)? != SendStatus::NotStarted || start_requested {
        return Err(Error::FailedPrecondition(format!(
            "message {message_id} was already started; recipients can only be appended to a draft"
        )));
    }
    if messages::batch_exists(&mut *tx, message_id, batch_number).await? {
        return Ok(Appended { accepted: count as u64, duplicate_batch: true });
    }
    let row = messages::fetch(&mut *tx, message_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("message {message_id}")))?;
    let content = row.content();
    let batch = stored(content.template.as_ref())?;
    let copy = ContentCopy { content: &content, expire_at, created_at, critical: row.critical };
    let planned = plan::plan_batch(
        &ctx.pools.map(),
        batch_number,
        &batch.user_ids,
        batch.vars.as_deref(),
        ctx.settings.send.chunk_size,
    )?;
    drop(batch);
    let stores = planned.iter().map(|(shard, chunk_plans)| {
        let copy = &copy;
        async move {
            let pool = ctx
                .pools
                .get(*shard)
                .ok_or_else(|| Error::Internal(format!("no pool for shard {shard}")))?;
            // Stores of concurrent sends next to each other in the chunk and
            // stats indexes can deadlock; a store is idempotent.
            notify_store::db::retrying("chunks::store", || {
                chunks::store(pool, message_id, copy, chunk_plans)
            })
            .await
        }
    });
    futures::future::try_join_all(stores).await?;
    sqlx::query("INSERT IGNORE INTO message_batches (message_id, batch_number, recipients) VALUES (?, ?, ?)")
        .bind(message_id.get())
        .bind(batch_number)
        .bind(count as u32)
        .execute(&mut *tx)
        .await.map_err(database_error)?;
    tx.commit().await.map_err(database_error)?;
    info!(accepted = count, "recipients appended");
    Ok(Appended { accepted: count as u64, duplicate_batch: false })
}

/// Creates, fills and starts a send in one call (`SendMessage`). A retry with
/// the same idempotency key resumes an attempt that died halfway.
#[instrument(skip_all, fields(sender = %send.sender, recipients = recipients.len()))]
pub async fn send_to_users(
    ctx: &Context,
    send: &NewSend,
    recipients: Recipients,
) -> Result<(Created, SendStatus)> {
    // Checked before the control record exists: a send whose recipients
    // do not fit its template leaves nothing behind.
    let count = recipients.len();
    let batch = recipients.into_stored(send.content.template.as_ref())?;
    let created = create(ctx, send).await?;
    // Routes are taken per statement here: append and start wait out
    // freezes, which a route held across them would hold back.
    let row = messages::fetch_existing(
        &ctx.pools.for_message(created.message_id.get()),
        created.message_id,
    )
    .await?;
    if row.status()? != SendStatus::NotStarted || row.start_requested {
        return Ok((created, row.status()?));
    }
    // The batch fits the template of the send just created; a send found
    // by its idempotency key may hold another (a key reused for another
    // content), whose recipients these were not checked against.
    let template = send.content.template.as_ref();
    let fits = |stored: Option<&Template>| {
        if stored == template {
            Ok(batch)
        } else {
            Err(Error::FailedPrecondition(format!(
                "the send of idempotency key {:?} has another template than this request's",
                send.idempotency_key.as_deref().unwrap_or_default()
            )))
        }
    };
    let appended = append_with(ctx, created.message_id, None, INLINE_BATCH, count, fits);
    let started = match appended.await {
        Ok(_) => start(ctx, created.message_id, None).await.map(|view| view.row),
        Err(e) => Err(e),
    };
    match started {
        Ok(row) => Ok((created, row.status()?)),
        // A concurrent duplicate of this request (same idempotency key) won
        // the race to start: that is this request's outcome too. Only if it
        // did start: a draft is never reported as a send that went out.
        Err(Error::FailedPrecondition(reason)) if created.deduplicated => {
            let home = ctx.pools.for_message(created.message_id.get());
            let row = messages::fetch_existing(&home, created.message_id).await?;
            if row.status()? == SendStatus::NotStarted && !row.start_requested {
                return Err(Error::FailedPrecondition(reason));
            }
            Ok((created, row.status()?))
        }
        Err(e) => Err(e),
    }
}

/// Returns a send with its progress, or NOT_FOUND (also for a send of
/// another client than `owner`, when set).
pub async fn get(ctx: &Context, message_id: MessageId, owner: Option<&str>) -> Result<MessageView> {
    let row = fetch_visible(ctx, message_id, owner).await?;
    let progress = Some(view_progress(ctx, &row).await?);
    let pending_operations = crate::control::pending(ctx, message_id).await?;
    Ok(MessageView { row, progress, pending_operations })
}

/// Reads a send right after a control operation was recorded on it (the
/// answer of CancelMessage, RecallMessage, EditMessage): as [`get`], but a
/// shard that cannot be read leaves the progress out instead of failing the
/// call, since the operation is recorded and the system finishes it.
pub(crate) async fn get_after_change(ctx: &Context, message_id: MessageId) -> Result<MessageView> {
    let row = fetch_visible(ctx, message_id, None).await?;
    let progress = match view_progress(ctx, &row).await {
        Ok(progress) => Some(progress),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, message_id = %message_id, "progress left out of the answer: a shard is unavailable");
            None
        }
        Err(e) => return Err(e),
    };
    let pending_operations = crate::control::pending(ctx, message_id).await?;
    Ok(MessageView { row, progress, pending_operations })
}

/// A send's progress as its view shows it: per audience, and for a recall
/// in progress the chunks it has left on every shard (an announcement's
/// recall takes back every materialized item at once).
pub(crate) async fn view_progress(ctx: &Context, row: &MessageRow) -> Result<Progress> {
    let message_id = MessageId::from_raw(row.message_id);
    let mut progress = progress(ctx, message_id).await?.for_audience(row.audience);
    if row.status()? == SendStatus::Recalled {
        if row.audience == AudienceKind::AllUsers as u8 {
            progress.recalled = progress.delivered;
        } else if row.finished_at.is_none() {
            let left = ctx
                .pools
                .iter()
                .map(|(_, pool)| notify_store::db::recall::unrecalled_chunks(pool, message_id));
            progress.pending_chunks = futures::future::try_join_all(left).await?.into_iter().sum();
        }
    }
    Ok(progress)
}

/// Reads a send's control record, NOT_FOUND unless `owner` may see it.
pub(crate) async fn fetch_visible(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
) -> Result<MessageRow> {
    let home = ctx.pools.for_message(message_id.get());
    let row = messages::fetch_existing(&home, message_id).await?;
    row.visible_to(owner)?;
    Ok(row)
}

/// Lists a sender's sends with ids below `before`, newest first, over all
/// shards; only those of client `owner`, when set.
pub async fn list(
    ctx: &Context,
    sender: &str,
    owner: Option<&str>,
    before: u64,
    limit: u32,
) -> Result<Vec<MessageView>> {
    newest_views(ctx, limit, |pool| messages::list_by_sender(pool, sender, owner, before, limit))
        .await
}

/// The sends `page` reads on each shard (newest first, `limit` at most),
/// merged newest first, cut to `limit`, with their progress. During a
/// bucket move a send's home record is on two shards for a while: only the
/// shard the map routes it to counts.
pub(crate) async fn newest_views<'p, F, Fut>(
    ctx: &'p Context,
    limit: u32,
    page: F,
) -> Result<Vec<MessageView>>
where
    F: Fn(&'p sqlx::MySqlPool) -> Fut,
    Fut: Future<Output = notify_store::Result<Vec<MessageRow>>>,
{
    let routes = ctx.pools.snapshot();
    let pages = ctx.pools.iter().map(|(shard, pool)| {
        let rows = page(pool);
        async move { Ok::<_, Error>((shard, rows.await?)) }
    });
    let mut rows: Vec<MessageRow> = futures::future::try_join_all(pages)
        .await?
        .into_iter()
        .flat_map(|(shard, rows)| rows.into_iter().map(move |row| (shard, row)))
        .filter(|(shard, row)| routes.of(Key::Message(row.message_id)).0 == *shard)
        .map(|(_, row)| row)
        .collect();
    drop(routes);
    rows.sort_unstable_by_key(|row| std::cmp::Reverse(row.message_id));
    rows.truncate(limit as usize);
    let views = rows.into_iter().map(|row| async move {
        let progress = Some(view_progress(ctx, &row).await?);
        let message_id = MessageId::from_raw(row.message_id);
        let pending_operations = crate::control::pending(ctx, message_id).await?;
        Ok::<_, Error>(MessageView { row, progress, pending_operations })
    });
    futures::future::try_join_all(views).await
}

/// Returns the current UTC time as stored in the database.
pub fn now() -> NaiveDateTime {
    Utc::now().naive_utc()
}

pub use lifecycle::{cancel, pause, redrive, resume, start};
