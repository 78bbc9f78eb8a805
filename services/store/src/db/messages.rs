//! Control records of sends on their home shard: create, read, transition,
//! idempotency keys, appended batches, and progress summed from shard stats.
//!
//! Every `UPDATE` of a control row names the primary key (`FORCE INDEX
//! (PRIMARY)`): for its `status = ...` condition MariaDB otherwise may walk
//! `idx_messages_due` (it does on a small table), X-locking other sends'
//! entries in that index, and two sends started at once deadlock.

use chrono::NaiveDateTime;
use sqlx::{FromRow, MySqlPool};
use tracing::instrument;

use super::operations::{self, Operation, OperationKind, Retire};
use super::webhook_outbox::{Record, execute_with};

use crate::error::Result;
use notify_domain::Error;
use notify_domain::domain::{AudienceKind, Content, MessageId, SendStatus};
use notify_domain::template::Template;

/// MySQL's error code for a duplicate key.
const ER_DUP_ENTRY: &str = "23000";

/// A control record about to be written.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Its id, which also picks its home shard.
    pub message_id: MessageId,
    /// The client that creates it (its owner).
    pub client: String,
    /// Calling service.
    pub sender: String,
    /// Optional idempotency key.
    pub idempotency_key: Option<String>,
    /// Who it goes to.
    pub audience: AudienceKind,
    /// Requested priority (1 normal, 2 high).
    pub priority: u8,
    /// What recipients see.
    pub content: Content,
    /// When to start; `None` means on start.
    pub send_at: Option<NaiveDateTime>,
    /// When it leaves inboxes.
    pub expire_at: Option<NaiveDateTime>,
    /// A critical send ignores its recipients' mutes.
    pub critical: bool,
}

/// A control record as stored.
#[derive(Debug, Clone, FromRow)]
pub struct MessageRow {
    /// Id.
    pub message_id: u64,
    /// The client that created it.
    pub client: String,
    /// Calling service.
    pub sender: String,
    /// Idempotency key, if the send had one.
    pub idempotency_key: Option<String>,
    /// Stored audience kind.
    pub audience: u8,
    /// Stored status (0..4).
    pub status: u8,
    /// Set once StartMessage was called.
    pub start_requested: bool,
    /// Requested priority.
    pub priority: u8,
    /// Lane chosen at start.
    pub lane: u8,
    /// A critical send ignores its recipients' mutes.
    pub critical: bool,
    /// Title.
    pub title: String,
    /// Body.
    pub body: String,
    /// Category.
    pub category: String,
    /// Data as a JSON object.
    pub data: String,
    /// Scheduled start.
    pub send_at: Option<NaiveDateTime>,
    /// Expiry.
    pub expire_at: Option<NaiveDateTime>,
    /// Creation time.
    pub created_at: NaiveDateTime,
    /// When it went SENDING.
    pub started_at: Option<NaiveDateTime>,
    /// When it completed or was cancelled.
    pub finished_at: Option<NaiveDateTime>,
    /// When the content was last edited.
    pub edited_at: Option<NaiveDateTime>,
    /// The content's template as JSON; `None` for plain content.
    pub template: Option<String>,
}

impl MessageRow {
    /// Decodes the stored status.
    pub fn status(&self) -> notify_domain::Result<SendStatus> {
        SendStatus::from_db(self.status)
    }

    /// Fails with NOT_FOUND unless `owner` is `None` (the caller sees every
    /// client's sends) or the client that created this send: another
    /// client's send is invisible, not forbidden.
    pub fn visible_to(&self, owner: Option<&str>) -> notify_domain::Result<&Self> {
        match owner {
            Some(client) if client != self.client => {
                Err(Error::NotFound(format!("message {}", self.message_id)))
            }
            _ => Ok(self),
        }
    }

    /// Rebuilds the content.
    pub fn content(&self) -> Content {
        Content {
            title: self.title.clone(),
            body: self.body.clone(),
            category: self.category.clone(),
            data: Content::data_from_json(&self.data),
            template: self.template.as_deref().and_then(|json| Template::from_json(json).ok()),
        }
    }
}

pub(crate) const MESSAGE_COLUMNS: &str = "message_id, client, sender, idempotency_key, audience, status, start_requested, priority, lane, \
    critical <> 0 AS critical, title, body, category, data, send_at, expire_at, created_at, started_at, finished_at, \
    edited_at, template";

/// Inserts a control record in NOT_STARTED. Returns false when the id is taken.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn insert(pool: &MySqlPool, message: &NewMessage) -> Result<bool> {
    let result = sqlx::query(
        "INSERT INTO messages (message_id, client, sender, idempotency_key, audience, status, \
         priority, critical, title, body, category, data, send_at, expire_at, template) \
         VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(message.message_id.get())
    .bind(&message.client)
    .bind(&message.sender)
    .bind(&message.idempotency_key)
    .bind(message.audience as u8)
    .bind(message.priority)
    .bind(message.critical)
    .bind(&message.content.title)
    .bind(&message.content.body)
    .bind(&message.content.category)
    .bind(message.content.data_json())
    .bind(message.send_at)
    .bind(message.expire_at)
    .bind(message.content.template_json())
    .execute(pool)
    .await;
    match result {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(ER_DUP_ENTRY) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// An idempotency key: per client and sender.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyKey<'a> {
    /// The client that sends.
    pub client: &'a str,
    /// The sender it sends as.
    pub sender: &'a str,
    /// The caller's key.
    pub key: &'a str,
}

/// The string an idempotency key is routed by (its home is the shard of
/// its bucket, `bucket_of_key` of this).
pub fn idempotency_route(client: &str, sender: &str, key: &str) -> String {
    format!("{client}\u{1f}{sender}\u{1f}{key}")
}

/// Claims a key for `candidate`, or returns the id that already holds it.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn claim_idempotency_key(
    pool: &MySqlPool,
    key: IdempotencyKey<'_>,
    candidate: MessageId,
) -> Result<MessageId> {
    sqlx::query(
        "INSERT IGNORE INTO idempotency_keys \
         (client, sender, idempotency_key, message_id, bucket) VALUES (?, ?, ?, ?, ?)",
    )
    .bind(key.client)
    .bind(key.sender)
    .bind(key.key)
    .bind(candidate.get())
    .bind(shard_router::bucket_of_key(&idempotency_route(key.client, key.sender, key.key)))
    .execute(pool)
    .await?;
    let holder: u64 = sqlx::query_scalar(
        "SELECT message_id FROM idempotency_keys \
         WHERE client = ? AND sender = ? AND idempotency_key = ?",
    )
    .bind(key.client)
    .bind(key.sender)
    .bind(key.key)
    .fetch_one(pool)
    .await?;
    Ok(MessageId::from_raw(holder))
}

/// Releases a key claimed for `holder` (after an id collision).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn release_idempotency_key(
    pool: &MySqlPool,
    key: IdempotencyKey<'_>,
    holder: MessageId,
) -> Result<()> {
    sqlx::query(
        "DELETE FROM idempotency_keys \
         WHERE client = ? AND sender = ? AND idempotency_key = ? AND message_id = ?",
    )
    .bind(key.client)
    .bind(key.sender)
    .bind(key.key)
    .bind(holder.get())
    .execute(pool)
    .await?;
    Ok(())
}

/// Reads a control record.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn fetch<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
) -> Result<Option<MessageRow>> {
    let sql = format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE message_id = ?");
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(message_id.get()).fetch_optional(pool).await?)
}

/// Reads a control record or fails with NOT_FOUND.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn fetch_existing(pool: &MySqlPool, message_id: MessageId) -> Result<MessageRow> {
    fetch(pool, message_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("message {message_id}")).into())
}

/// Reads the status with its version (bumped by every status change).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn fetch_status_version(
    pool: &MySqlPool,
    message_id: MessageId,
) -> Result<Option<(SendStatus, u64)>> {
    let row: Option<(u8, u64)> =
        sqlx::query_as("SELECT status, status_version FROM messages WHERE message_id = ?")
            .bind(message_id.get())
            .fetch_optional(pool)
            .await?;
    row.map(|(status, version)| Ok((SendStatus::from_db(status)?, version))).transpose()
}

/// Completes a SENDING send, but only if its status version is still
/// `version`: a redrive that re-opened it in between wins. Records
/// `webhook` (`message.completed`) with the change.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn complete(
    pool: &MySqlPool,
    message_id: MessageId,
    version: u64,
    webhook: Option<Record<'_>>,
) -> Result<bool> {
    let change = sqlx::query(concat!(
        "UPDATE messages FORCE INDEX (PRIMARY) SET status = ",
        send_status!(COMPLETED),
        ", status_version = status_version + 1, \
         finished_at = UTC_TIMESTAMP(3) WHERE message_id = ? AND status = ",
        send_status!(SENDING),
        " AND status_version = ? \
         AND audience = ",
        audience!(USERS)
    ))
    .bind(message_id.get())
    .bind(version);
    execute_with(pool, change, webhook).await
}

/// Re-opens a SENDING or COMPLETED send for a redrive (bumps the version so
/// a racing completion check fails). Returns false in any other status.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn reopen(pool: &MySqlPool, message_id: MessageId) -> Result<bool> {
    let result = sqlx::query(concat!(
        "UPDATE messages FORCE INDEX (PRIMARY) SET status = ",
        send_status!(SENDING),
        ", status_version = status_version + 1, finished_at = NULL \
         WHERE message_id = ? AND status IN (",
        send_status!(SENDING),
        ", ",
        send_status!(COMPLETED),
        ")"
    ))
    .bind(message_id.get())
    .execute(pool)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Moves a message to `to` if its status is one of `from`. Returns true when
/// this call made the change (so only one of several racing callers wins),
/// and then records `webhook` with it.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn transition(
    pool: &MySqlPool,
    message_id: MessageId,
    from: &[SendStatus],
    to: SendStatus,
    webhook: Option<Record<'_>>,
) -> Result<bool> {
    let sql = transition_sql(from, to);
    let change = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(to.to_db()).bind(message_id.get());
    execute_with(pool, change, webhook).await
}

/// The statement of [`transition`]: binds the new status and the id.
fn transition_sql(from: &[SendStatus], to: SendStatus) -> String {
    let allowed: Vec<String> = from.iter().map(|s| s.to_db().to_string()).collect();
    let stamp = match to {
        SendStatus::Sending => ", started_at = COALESCE(started_at, UTC_TIMESTAMP(3))",
        SendStatus::Completed | SendStatus::Cancelled => ", finished_at = UTC_TIMESTAMP(3)",
        // A recall is finished once its chunks are through (finish_recall).
        SendStatus::Recalled => ", finished_at = NULL",
        _ => "",
    };
    format!(
        "UPDATE messages FORCE INDEX (PRIMARY) SET status = ?, status_version = status_version + 1{stamp} \
         WHERE message_id = ? AND status IN ({})",
        allowed.join(",")
    )
}

/// What a control operation changes on a send's home record.
#[derive(Debug, Clone, Copy)]
pub enum ControlChange<'a> {
    /// Its status moves `from` one of these `to` this.
    Status {
        /// The statuses it may move from.
        from: &'a [SendStatus],
        /// Where it moves.
        to: SendStatus,
    },
    /// Its title, body and data become these (an edit), stamped with
    /// `edited_at` and the next `content_version`; refused for a draft and
    /// for a recalled send.
    Content(&'a Content),
}

/// Changes a send's home record and records the operation that carries the
/// change to every shard ([`super::operations::record`]), in ONE
/// transaction, with `webhook` when given: nothing changes without the
/// intent to finish it. Returns the operation, or `None` when the record
/// was not in a state the change applies to (nothing was written).
#[allow(clippy::too_many_arguments)]
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn change_with_operation(
    pool: &MySqlPool,
    message_id: MessageId,
    change: ControlChange<'_>,
    kind: OperationKind,
    retire: Retire,
    token: u64,
    lease_ms: u64,
    webhook: Option<Record<'_>>,
) -> Result<Option<Operation>> {
    let mut tx = pool.begin().await?;
    let changed = match change {
        ControlChange::Status { from, to } => {
            let sql = transition_sql(from, to);
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(to.to_db())
                .bind(message_id.get())
                .execute(&mut *tx)
                .await?
        }
        ControlChange::Content(content) => {
            sqlx::query(concat!(
                "UPDATE messages FORCE INDEX (PRIMARY) SET title = ?, body = ?, data = ?, \
                 template = ?, edited_at = UTC_TIMESTAMP(3), content_version = content_version + 1 \
                 WHERE message_id = ? AND status IN (",
                send_status!(SENDING),
                ", ",
                send_status!(PAUSED),
                ", ",
                send_status!(COMPLETED),
                ", ",
                send_status!(CANCELLED),
                ")"
            ))
            .bind(&content.title)
            .bind(&content.body)
            .bind(content.data_json())
            .bind(content.template_json())
            .bind(message_id.get())
            .execute(&mut *tx)
            .await?
        }
    };
    if changed.rows_affected() != 1 {
        tx.rollback().await?;
        return Ok(None);
    }
    if let Some(webhook) = webhook {
        webhook.write(&mut tx).await?;
    }
    let operation = operations::record(&mut tx, message_id, kind, retire, token, lease_ms).await?;
    tx.commit().await?;
    Ok(Some(operation))
}

/// The home record's content as an edit left it: what every shard's copy
/// takes, with its version and when it was made.
#[derive(Debug, Clone, FromRow)]
pub struct EditedContent {
    /// Title.
    pub title: String,
    /// Body.
    pub body: String,
    /// Data as a JSON object.
    pub data: String,
    /// The template as JSON; `None` for plain content.
    pub template: Option<String>,
    /// How many edits it has had.
    pub content_version: u32,
    /// When the last was made.
    pub edited_at: Option<NaiveDateTime>,
}

/// Reads a send's content as the home record holds it, with its version.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn edited_content(pool: &MySqlPool, message_id: MessageId) -> Result<EditedContent> {
    sqlx::query_as(
        "SELECT title, body, data, template, content_version, edited_at FROM messages \
         WHERE message_id = ?",
    )
    .bind(message_id.get())
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| Error::NotFound(format!("message {message_id}")).into())
}

/// Records StartMessage on a NOT_STARTED message: picks the lane and, when
/// `start_now`, moves it to SENDING. Returns false if it was not NOT_STARTED.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn request_start<'e>(
    executor: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    lane: u8,
    start_now: bool,
) -> Result<bool> {
    let sql = if start_now {
        concat!(
            "UPDATE messages FORCE INDEX (PRIMARY) SET start_requested = 1, lane = ?, status = ",
            send_status!(SENDING),
            ", \
         status_version = status_version + 1, started_at = UTC_TIMESTAMP(3) \
         WHERE message_id = ? AND status = ",
            send_status!(NOT_STARTED)
        )
    } else {
        concat!(
            "UPDATE messages FORCE INDEX (PRIMARY) SET start_requested = 1, lane = ? \
         WHERE message_id = ? AND status = ",
            send_status!(NOT_STARTED)
        )
    };
    let result = sqlx::query(sql).bind(lane).bind(message_id.get()).execute(executor).await?;
    Ok(result.rows_affected() == 1)
}

/// Starts a scheduled send whose time has come. Returns true for the one
/// caller (of several worker replicas) whose update won.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn start_scheduled<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
) -> Result<bool> {
    let result = sqlx::query(concat!(
        "UPDATE messages FORCE INDEX (PRIMARY) SET status = ",
        send_status!(SENDING),
        ", status_version = status_version + 1, \
         started_at = UTC_TIMESTAMP(3) WHERE message_id = ? \
         AND status = ",
        send_status!(NOT_STARTED),
        " AND start_requested = 1 AND send_at <= UTC_TIMESTAMP(3)"
    ))
    .bind(message_id.get())
    .execute(pool)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Returns up to `limit` ids above `after` of this home shard's recalled
/// sends whose recall is not finished, in id order.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn recalling(pool: &MySqlPool, after: u64, limit: u32) -> Result<Vec<u64>> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT message_id FROM messages FORCE INDEX (idx_messages_due) WHERE status = ",
        send_status!(RECALLED),
        " \
         AND finished_at IS NULL AND message_id > ? ORDER BY message_id LIMIT ?"
    ))
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Records that a recall is finished (every chunk through); returns true
/// if this call did.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn finish_recall(pool: &MySqlPool, message_id: MessageId) -> Result<bool> {
    let result = sqlx::query(concat!(
        "UPDATE messages FORCE INDEX (PRIMARY) SET finished_at = UTC_TIMESTAMP(3), \
         status_version = status_version + 1 WHERE message_id = ? AND status = ",
        send_status!(RECALLED),
        " \
         AND finished_at IS NULL"
    ))
    .bind(message_id.get())
    .execute(pool)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Returns this home shard's live announcements: started, not cancelled,
/// not expired.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn live_announcements(pool: &MySqlPool) -> Result<Vec<LiveAnnouncement>> {
    Ok(sqlx::query_as(concat!(
        "SELECT message_id, expire_at, category, critical <> 0 AS critical FROM messages \
         WHERE audience = ",
        audience!(ALL_USERS),
        " AND status = ",
        send_status!(SENDING),
        " AND (expire_at IS NULL OR expire_at > UTC_TIMESTAMP(3))"
    ))
    .fetch_all(pool)
    .await?)
}

/// A live announcement, as badges and materialization need it.
#[derive(Debug, Clone, FromRow)]
pub struct LiveAnnouncement {
    /// Its id.
    pub message_id: u64,
    /// When it ends.
    pub expire_at: Option<NaiveDateTime>,
    /// Its category (a user muting it neither sees nor counts it).
    pub category: String,
    /// A critical announcement ignores mutes.
    pub critical: bool,
}

/// Bumps a sending send's status version without changing its status: a
/// completion check that read the older version then fails, as its view of
/// the send's pending chunks may be out of date (see `deliver::split`).
/// Only while `SENDING`: completion happens only from `SENDING`, with the
/// version it read, and every change of status bumps the version too, so a
/// check that read a send before it was paused fails after the resume
/// whether or not a split happened while it was paused, and one that reads
/// it after the resume finds the split's chunks already stored.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn bump_status_version(pool: &MySqlPool, message_id: MessageId) -> Result<()> {
    sqlx::query(
        concat!("UPDATE messages FORCE INDEX (PRIMARY) SET status_version = status_version + 1 WHERE message_id = ? AND status = ", send_status!(SENDING)),
    )
    .bind(message_id.get())
    .execute(pool)
    .await?;
    Ok(())
}

/// Live announcements on this shard whose `expire_at` has passed.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn expired_announcements(pool: &MySqlPool) -> Result<Vec<u64>> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT message_id FROM messages WHERE audience = ",
        audience!(ALL_USERS),
        " AND status = ",
        send_status!(SENDING),
        " \
         AND expire_at <= UTC_TIMESTAMP(3)"
    ))
    .fetch_all(pool)
    .await?)
}

/// Ends an expired live announcement (SENDING -> COMPLETED); true when
/// this call ended it.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn end_expired_announcement(pool: &MySqlPool, message_id: u64) -> Result<bool> {
    let result = sqlx::query(concat!(
        "UPDATE messages FORCE INDEX (PRIMARY) SET status = ",
        send_status!(COMPLETED),
        ", status_version = status_version + 1, \
         finished_at = UTC_TIMESTAMP(3) WHERE message_id = ? AND audience = ",
        audience!(ALL_USERS),
        " AND status = ",
        send_status!(SENDING),
        " \
         AND expire_at <= UTC_TIMESTAMP(3)"
    ))
    .bind(message_id)
    .execute(pool)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Returns scheduled sends whose `send_at` has come.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn due_scheduled(pool: &MySqlPool, limit: u32) -> Result<Vec<u64>> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT message_id FROM messages WHERE status = ",
        send_status!(NOT_STARTED),
        " AND start_requested = 1 \
         AND send_at <= UTC_TIMESTAMP(3) ORDER BY send_at LIMIT ?"
    ))
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Returns the ids of sends in SENDING on this home shard above `after`,
/// in id order (keyset paging).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn sending(pool: &MySqlPool, after: u64, limit: u32) -> Result<Vec<u64>> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT message_id FROM messages WHERE status = ",
        send_status!(SENDING),
        " AND audience = ",
        audience!(USERS),
        " AND message_id > ? \
         ORDER BY message_id LIMIT ?"
    ))
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Counts this home shard's sends to users in SENDING, with the start of
/// the oldest (for the "send stuck in SENDING" alert).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn sending_summary(pool: &MySqlPool) -> Result<(u64, Option<NaiveDateTime>)> {
    let (count, oldest): (i64, Option<NaiveDateTime>) = sqlx::query_as(concat!(
        "SELECT COUNT(*), MIN(started_at) FROM messages WHERE status = ",
        send_status!(SENDING),
        " AND audience = ",
        audience!(USERS)
    ))
    .fetch_one(pool)
    .await?;
    Ok((count.max(0) as u64, oldest))
}

/// Lists a sender's messages on this shard with ids below `before`, newest
/// first; only those of client `owner` when it is set.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn list_by_sender(
    pool: &MySqlPool,
    sender: &str,
    owner: Option<&str>,
    before: u64,
    limit: u32,
) -> Result<Vec<MessageRow>> {
    let (filter, client) = match owner {
        Some(client) => ("client = ? AND ", client),
        None => ("", ""),
    };
    let sql = format!(
        "SELECT {MESSAGE_COLUMNS} FROM messages WHERE {filter}sender = ? AND message_id < ? \
         ORDER BY message_id DESC LIMIT ?"
    );
    let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
    if owner.is_some() {
        query = query.bind(client);
    }
    Ok(query.bind(sender).bind(before).bind(limit).fetch_all(pool).await?)
}

/// Returns true when `batch_number` was already appended to the message.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn batch_exists<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    batch: u64,
) -> Result<bool> {
    let found: Option<u64> = sqlx::query_scalar(
        "SELECT batch_number FROM message_batches WHERE message_id = ? AND batch_number = ?",
    )
    .bind(message_id.get())
    .bind(batch)
    .fetch_optional(pool)
    .await?;
    Ok(found.is_some())
}

/// Sums the recipients of every recorded batch of a send.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn batch_recipients<'e>(
    executor: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
) -> Result<u64> {
    let sum: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(recipients), 0) AS SIGNED) FROM message_batches WHERE message_id = ?",
    )
    .bind(message_id.get())
    .fetch_one(executor)
    .await?;
    Ok(sum.max(0) as u64)
}

/// Per-shard counters of a send, summed over slots.
#[derive(Debug, Clone, Copy, Default, FromRow, PartialEq, Eq)]
pub struct ShardStats {
    /// Recipients stored (deduplicated within each batch).
    pub total: u64,
    /// Items written.
    pub delivered: u64,
    /// Recipients that already had the item (duplicates across batches).
    pub duplicates: u64,
    /// Recipients of dead-lettered chunks.
    pub failed: u64,
    /// Recipients of chunks cancelled before delivery.
    pub cancelled: u64,
    /// Recipients held back by their preferences (a muted category, an
    /// erasure).
    pub suppressed: u64,
    /// Items taken back by a recall.
    pub recalled: u64,
    /// Items read.
    pub read_count: u64,
    /// Chunks stored.
    pub chunks: u64,
    /// Chunks done, failed or cancelled.
    pub done_chunks: u64,
}

impl ShardStats {
    /// Adds another shard's counters.
    pub fn add(&mut self, other: &ShardStats) {
        self.total += other.total;
        self.delivered += other.delivered;
        self.duplicates += other.duplicates;
        self.failed += other.failed;
        self.cancelled += other.cancelled;
        self.suppressed += other.suppressed;
        self.recalled += other.recalled;
        self.read_count += other.read_count;
        self.chunks += other.chunks;
        self.done_chunks += other.done_chunks;
    }
}

/// Sums a send's counters on one shard (one indexed query over a few slots).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn shard_stats(pool: &MySqlPool, message_id: MessageId) -> Result<ShardStats> {
    Ok(sqlx::query_as(
        "SELECT CAST(COALESCE(SUM(total), 0) AS UNSIGNED) AS total, \
         CAST(COALESCE(SUM(delivered), 0) AS UNSIGNED) AS delivered, \
         CAST(COALESCE(SUM(duplicates), 0) AS UNSIGNED) AS duplicates, \
         CAST(COALESCE(SUM(failed), 0) AS UNSIGNED) AS failed, \
         CAST(COALESCE(SUM(cancelled), 0) AS UNSIGNED) AS cancelled, \
         CAST(COALESCE(SUM(suppressed), 0) AS UNSIGNED) AS suppressed, \
         CAST(COALESCE(SUM(recalled), 0) AS UNSIGNED) AS recalled, \
         CAST(COALESCE(SUM(read_count), 0) AS UNSIGNED) AS read_count, \
         CAST(COALESCE(SUM(chunks), 0) AS UNSIGNED) AS chunks, \
         CAST(COALESCE(SUM(done_chunks), 0) AS UNSIGNED) AS done_chunks \
         FROM message_shard_stats WHERE message_id = ?",
    )
    .bind(message_id.get())
    .fetch_one(pool)
    .await?)
}
