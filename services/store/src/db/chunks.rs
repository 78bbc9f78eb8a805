//! Chunks on their target shard: storing them with the shard's content copy,
//! applying a group of one send's chunks (a lone chunk is a group of one) in
//! a single transaction (each chunk row its own exactly-once guard), and the
//! queries the scheduler, sweeper, settler, resume and cancel need.

use std::collections::{HashMap, HashSet};

use chrono::NaiveDateTime;
use serde_json::value::RawValue;
use sqlx::{MySqlPool, QueryBuilder};
use tracing::instrument;

use super::push_ids;
use super::webhook_outbox::Record;
use crate::error::Result;
use notify_domain::Error;
use notify_domain::domain::{Content, MessageId};

/// Chunk states as stored.
pub mod state {
    /// Waiting to be applied.
    pub const PENDING: u8 = 0;
    /// Applied: its items exist.
    pub const DONE: u8 = 1;
    /// Dead-lettered after too many failed attempts.
    pub const FAILED: u8 = 2;
    /// Left undelivered by a cancel.
    pub const CANCELLED: u8 = 3;
    /// Applied, its recipients' cached badges not yet invalidated: the
    /// apply transaction leaves a chunk here, and the worker moves it to
    /// done once Redis has confirmed the invalidation. If Redis does not
    /// answer, it stays here, and completion waits for it like for a
    /// pending chunk until a settler has invalidated them (see
    /// `deliver::settle`): a send never shows as completed while a badge
    /// cached before its items can still be served.
    pub const UNSETTLED: u8 = 4;
    /// Its items were taken back by a recall, and its recipients' cached
    /// badges invalidated.
    pub const RECALLED: u8 = 5;
    /// Its items were taken back by a recall, the recipients' badges not
    /// yet invalidated (as [`UNSETTLED`] is for a delivery): a recall is
    /// over once none of its chunks is left here, pending, unsettled or done.
    pub const RECALL_UNSETTLED: u8 = 6;
}

/// The bit set in the id of every chunk split off another when a bucket
/// move made some of its recipients another shard's (`deliver::split`),
/// and in no planned chunk's id (`batch_number << 20 | sequence`, with
/// batch numbers below 2^40).
pub const SPLIT_CHUNK_BIT: u64 = 1 << 63;

/// Stats rows per message and shard; chunks spread their updates over them.
pub const STATS_SLOTS: u64 = 8;

/// The stats row a user's reads of a send count in (`read_count`): spread
/// over the slots as chunks' updates are, so the readers of a send, who
/// come at once after a big send, do not queue on one row lock held to the
/// end of each of their transactions. Progress sums every slot.
pub(crate) fn read_slot(user_id: u64) -> u64 {
    1 + user_id % (STATS_SLOTS - 1)
}

/// Stats rows an announcement's materializations count in, past the
/// chunks' and the reads' slots: every user who opens the inbox right
/// after an announcement materializes it at once, so its count is spread
/// wider than a send's reads.
pub const MATERIALIZE_SLOTS: u64 = 64;

/// The stats row a user's materialization of an announcement counts in.
pub(crate) fn materialize_slot(user_id: u64) -> u64 {
    STATS_SLOTS + user_id % MATERIALIZE_SLOTS
}

/// One chunk about to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkPlan {
    /// `batch_number << 20 | sequence` (the planner's `SEQUENCE_BITS`, in
    /// `notify_core::send::plan`): unique within the message.
    pub chunk_id: u64,
    /// Sorted, distinct recipients on one shard.
    pub user_ids: Vec<u64>,
    /// Each recipient's own template variables (a JSON object), aligned
    /// with `user_ids`; `None` when the send's recipients carry none.
    pub vars: Option<Vec<String>>,
}

/// The content copy stored once per shard with recipients.
#[derive(Debug, Clone)]
pub struct ContentCopy<'a> {
    /// What recipients see.
    pub content: &'a Content,
    /// Expiry of the message.
    pub expire_at: Option<NaiveDateTime>,
    /// Creation time of the message.
    pub created_at: NaiveDateTime,
    /// A critical send ignores its recipients' mutes.
    pub critical: bool,
}

/// Packs user ids as little-endian u64s.
pub fn encode_user_ids(user_ids: &[u64]) -> Vec<u8> {
    user_ids.iter().flat_map(|id| id.to_le_bytes()).collect()
}

/// Unpacks user ids stored by [`encode_user_ids`].
pub fn decode_user_ids(bytes: &[u8]) -> Result<Vec<u64>> {
    if !bytes.len().is_multiple_of(8) {
        return Err(Error::Internal(format!("chunk user_ids has {} bytes", bytes.len())).into());
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        .collect())
}

/// Packs recipients' vars (JSON objects) as a chunk's `vars` stores them:
/// each one's length (u32, little-endian), then its bytes.
pub fn encode_vars(vars: &[String]) -> Vec<u8> {
    let mut packed = Vec::with_capacity(vars.iter().map(|v| v.len() + 4).sum());
    for one in vars {
        packed.extend_from_slice(&(one.len() as u32).to_le_bytes());
        packed.extend_from_slice(one.as_bytes());
    }
    packed
}

/// Unpacks vars stored by [`encode_vars`].
pub fn decode_vars(mut packed: &[u8]) -> Result<Vec<String>> {
    let mut vars = Vec::new();
    while !packed.is_empty() {
        let broken = || Error::Internal("a chunk's vars are cut short".to_owned());
        let (len, rest) = packed.split_first_chunk::<4>().ok_or_else(broken)?;
        let len = u32::from_le_bytes(*len) as usize;
        let one = rest.get(..len).ok_or_else(broken)?;
        vars.push(String::from_utf8(one.to_vec()).map_err(|e| Error::Internal(e.to_string()))?);
        packed = &rest[len..];
    }
    Ok(vars)
}

/// Decodes a chunk row's recipients and vars, checking they align.
fn decode_chunk(packed: &[u8], vars: Option<&[u8]>) -> Result<(Vec<u64>, Option<Vec<String>>)> {
    let user_ids = decode_user_ids(packed)?;
    let vars = vars.map(decode_vars).transpose()?;
    if let Some(vars) = &vars
        && vars.len() != user_ids.len()
    {
        return Err(Error::Internal(format!(
            "a chunk has {} recipients and {} vars",
            user_ids.len(),
            vars.len()
        ))
        .into());
    }
    Ok((user_ids, vars))
}

/// Stores one batch's chunks for one shard, with the shard's content copy and
/// totals, in one transaction. Idempotent: storing the same chunks again adds
/// nothing. Returns the recipients newly stored.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn store(
    pool: &MySqlPool,
    message_id: MessageId,
    copy: &ContentCopy<'_>,
    chunks: &[ChunkPlan],
) -> Result<u64> {
    if chunks.is_empty() {
        return Ok(0);
    }
    let mut tx = pool.begin().await?;
    store_content(&mut *tx, message_id, copy).await?;
    let recipients = insert_chunks(&mut tx, message_id, chunks).await?;
    if recipients == 0 {
        // The whole batch was stored by an earlier attempt.
        tx.rollback().await?;
        return Ok(0);
    }
    tx.commit().await?;
    Ok(recipients)
}

/// Inserts chunks (pending) and adds them to the shard's totals; returns
/// their recipients, or 0 when every one of them existed already.
async fn insert_chunks(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    message_id: MessageId,
    chunks: &[ChunkPlan],
) -> Result<u64> {
    let mut insert = QueryBuilder::new(
        "INSERT IGNORE INTO message_chunks (message_id, chunk_id, recipients, user_ids, vars) ",
    );
    insert.push_values(chunks, |mut row, chunk| {
        row.push_bind(message_id.get())
            .push_bind(chunk.chunk_id)
            .push_bind(chunk.user_ids.len() as u16)
            .push_bind(encode_user_ids(&chunk.user_ids))
            .push_bind(chunk.vars.as_deref().map(encode_vars));
    });
    let inserted = insert.build().execute(&mut **tx).await?.rows_affected();
    if inserted == 0 {
        return Ok(0);
    }
    if inserted != chunks.len() as u64 {
        return Err(Error::Internal(format!(
            "message {message_id}: {inserted} of {} chunks of one batch already existed",
            chunks.len()
        ))
        .into());
    }
    let recipients: u64 = chunks.iter().map(|c| c.user_ids.len() as u64).sum();
    sqlx::query(
        "INSERT INTO message_shard_stats (message_id, slot, total, chunks) VALUES (?, 0, ?, ?) \
         ON DUPLICATE KEY UPDATE total = total + VALUES(total), chunks = chunks + VALUES(chunks)",
    )
    .bind(message_id.get())
    .bind(recipients)
    .bind(inserted)
    .execute(&mut **tx)
    .await?;
    Ok(recipients)
}

/// A shard's content copy of a message as stored, to copy it to another
/// shard unchanged.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredContent {
    title: String,
    body: String,
    category: String,
    data: String,
    expire_at: Option<NaiveDateTime>,
    created_at: NaiveDateTime,
    revoked: bool,
    revoked_at: Option<NaiveDateTime>,
    critical: bool,
    template: Option<String>,
}

/// Reads a shard's content copy of a message as stored.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn stored_content(
    pool: &MySqlPool,
    message_id: MessageId,
) -> Result<Option<StoredContent>> {
    Ok(sqlx::query_as(
        "SELECT title, body, category, data, expire_at, created_at, revoked <> 0 AS revoked, \
         revoked_at, critical <> 0 AS critical, template FROM message_contents WHERE message_id = ?",
    )
    .bind(message_id.get())
    .fetch_optional(pool)
    .await?)
}

/// Stores, in one transaction on the shard that now owns their users, a
/// chunk split off a chunk of another shard (see [`shrink`]), with that
/// shard's content copy and this shard's totals. Idempotent by chunk id: a
/// second call adds nothing.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn store_split(
    pool: &MySqlPool,
    message_id: MessageId,
    content: &StoredContent,
    chunk: &ChunkPlan,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT IGNORE INTO message_contents (message_id, title, body, category, data, \
         expire_at, created_at, revoked, revoked_at, critical, template) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(message_id.get())
    .bind(&content.title)
    .bind(&content.body)
    .bind(&content.category)
    .bind(&content.data)
    .bind(content.expire_at)
    .bind(content.created_at)
    .bind(content.revoked)
    .bind(content.revoked_at)
    .bind(content.critical)
    .bind(&content.template)
    .execute(&mut *tx)
    .await?;
    insert_chunks(&mut tx, message_id, std::slice::from_ref(chunk)).await?;
    tx.commit().await?;
    Ok(())
}

/// Keeps only `keep` of a pending chunk's recipients, whose other ones were
/// stored on the shards that now own them ([`store_split`]), and takes those
/// off this shard's totals. Returns false, changing nothing, when the chunk
/// is no longer pending with exactly `expected` recipients (another worker
/// got there first).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn shrink(
    pool: &MySqlPool,
    message_id: MessageId,
    chunk_id: u64,
    expected: &[u64],
    keep: &[u64],
) -> Result<bool> {
    let mut tx = pool.begin().await?;
    let chunk = lock_chunk(&mut tx, message_id, chunk_id).await?;
    let vars = match chunk {
        Some((chunk_state, packed, vars)) if chunk_state == state::PENDING => {
            let (user_ids, vars) = decode_chunk(&packed, vars.as_deref())?;
            (user_ids == expected).then_some(vars)
        }
        _ => None,
    };
    let Some(vars) = vars else {
        tx.rollback().await?;
        return Ok(false);
    };
    let kept_vars = vars.map(|vars| {
        let vars = expected.iter().zip(vars).collect::<HashMap<_, _>>();
        encode_vars(&keep.iter().filter_map(|user| vars.get(user).cloned()).collect::<Vec<_>>())
    });
    sqlx::query(
        "UPDATE message_chunks SET user_ids = ?, vars = ?, recipients = ?, \
         updated_at = UTC_TIMESTAMP(3) WHERE message_id = ? AND chunk_id = ?",
    )
    .bind(encode_user_ids(keep))
    .bind(kept_vars)
    .bind(keep.len() as u16)
    .bind(message_id.get())
    .bind(chunk_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE message_shard_stats SET total = total - ? WHERE message_id = ? AND slot = 0",
    )
    .bind((expected.len() - keep.len()) as u64)
    .bind(message_id.get())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Blanks `user_id`'s own vars (to `{}`) in this shard's chunks still to
/// apply (pending, or failed and waiting for a re-drive) of the sends
/// created before `sent_before`: the user's erasure, whose marker keeps
/// those chunks from writing the user an item. A chunk keeps no vars once
/// applied or cancelled, so these are the only ones left. Sends created
/// since are new messages to that id and keep theirs. Returns the chunks
/// blanked; safe to repeat.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn forget_vars(pool: &MySqlPool, user_id: u64, sent_before: u64) -> Result<u64> {
    // The sends with chunks to apply (the state index), then each one's
    // chunks whose recipient range holds the user (the recipients index).
    let sends: Vec<u64> = sqlx::query_scalar(concat!(
        "SELECT DISTINCT message_id FROM message_chunks WHERE state IN (",
        chunk_state!(PENDING),
        ", ",
        chunk_state!(FAILED),
        ") AND message_id < ?"
    ))
    .bind(sent_before)
    .fetch_all(pool)
    .await?;
    let mut blanked = 0;
    for message_id in sends {
        let chunk_ids: Vec<u64> = sqlx::query_scalar(concat!(
            "SELECT chunk_id FROM message_chunks WHERE message_id = ? AND state IN (",
            chunk_state!(PENDING),
            ", ",
            chunk_state!(FAILED),
            ") AND first_user <= ? AND last_user >= ? AND vars IS NOT NULL"
        ))
        .bind(message_id)
        .bind(user_id)
        .bind(user_id)
        .fetch_all(pool)
        .await?;
        for chunk_id in chunk_ids {
            let forget = || forget_in_chunk(pool, message_id, chunk_id, user_id);
            if super::retrying("chunks::forget_vars", forget).await? {
                blanked += 1;
            }
        }
    }
    Ok(blanked)
}

/// [`forget_vars`] in one chunk: true when it held the user's vars.
async fn forget_in_chunk(
    pool: &MySqlPool,
    message_id: u64,
    chunk_id: u64,
    user_id: u64,
) -> Result<bool> {
    let mut tx = pool.begin().await?;
    let locked: Option<(Vec<u8>, Option<Vec<u8>>)> = sqlx::query_as(concat!(
        "SELECT user_ids, vars FROM message_chunks WHERE message_id = ? AND chunk_id = ? \
         AND state IN (",
        chunk_state!(PENDING),
        ", ",
        chunk_state!(FAILED),
        ") FOR UPDATE"
    ))
    .bind(message_id)
    .bind(chunk_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((packed, Some(vars))) = locked else {
        tx.rollback().await?;
        return Ok(false);
    };
    let (user_ids, vars) = decode_chunk(&packed, Some(&vars))?;
    let mut vars = vars.unwrap_or_default();
    let Some(at) = user_ids.iter().position(|user| *user == user_id) else {
        tx.rollback().await?;
        return Ok(false);
    };
    if vars[at] == ERASED_VARS {
        tx.rollback().await?;
        return Ok(false);
    }
    vars[at] = ERASED_VARS.to_owned();
    sqlx::query("UPDATE message_chunks SET vars = ? WHERE message_id = ? AND chunk_id = ?")
        .bind(encode_vars(&vars))
        .bind(message_id)
        .bind(chunk_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(true)
}

/// What an erased recipient's vars become in a chunk still to apply.
const ERASED_VARS: &str = "{}";

/// Stores the shard's content copy of a message (a no-op if it exists).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn store_content<'e>(
    executor: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    copy: &ContentCopy<'_>,
) -> Result<()> {
    sqlx::query(
        "INSERT IGNORE INTO message_contents \
         (message_id, title, body, category, data, expire_at, created_at, critical, template) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(message_id.get())
    .bind(&copy.content.title)
    .bind(&copy.content.body)
    .bind(&copy.content.category)
    .bind(copy.content.data_json())
    .bind(copy.expire_at)
    .bind(copy.created_at)
    .bind(copy.critical)
    .bind(copy.content.template_json())
    .execute(executor)
    .await?;
    Ok(())
}

/// Gives the shard's content copy the home record's edited title, body and
/// data, unless it holds that edit or a later one already (two drives of
/// edits may run at once: every copy ends with the last); a no-op on a
/// shard without a copy.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn edit_content(
    pool: &MySqlPool,
    message_id: MessageId,
    edited: &super::messages::EditedContent,
) -> Result<()> {
    sqlx::query(
        "UPDATE message_contents SET title = ?, body = ?, data = ?, template = ?, edited_at = ?, \
         content_version = ? WHERE message_id = ? AND content_version < ?",
    )
    .bind(&edited.title)
    .bind(&edited.body)
    .bind(&edited.data)
    .bind(&edited.template)
    .bind(edited.edited_at)
    .bind(edited.content_version)
    .bind(message_id.get())
    .bind(edited.content_version)
    .execute(pool)
    .await?;
    Ok(())
}

/// Revokes the shard's content copy: its items vanish from inboxes and badges.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn revoke_content(pool: &MySqlPool, message_id: MessageId) -> Result<()> {
    sqlx::query("UPDATE message_contents SET revoked = 1, revoked_at = UTC_TIMESTAMP(3) WHERE message_id = ?")
        .bind(message_id.get())
        .execute(pool)
        .await?;
    Ok(())
}

/// Locks a chunk: its state, recipients and their vars.
async fn lock_chunk(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    message_id: MessageId,
    chunk_id: u64,
) -> Result<Option<(u8, Vec<u8>, Option<Vec<u8>>)>> {
    Ok(sqlx::query_as(
        "SELECT state, user_ids, vars FROM message_chunks \
         WHERE message_id = ? AND chunk_id = ? FOR UPDATE",
    )
    .bind(message_id.get())
    .bind(chunk_id)
    .fetch_optional(&mut **tx)
    .await?)
}

/// One chunk of a group, as [`apply`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupChunk {
    /// The chunk.
    pub chunk_id: u64,
    /// Its recipients.
    pub user_ids: Vec<u64>,
    /// Their own template variables, aligned with `user_ids` (see
    /// [`ChunkPlan::vars`]), while it is pending: a chunk keeps them only
    /// until it is applied (its items hold them then) or cancelled.
    pub vars: Option<Vec<String>>,
    /// True when this transaction applied it; false when an earlier one did
    /// (or failed or cancelled it), which changed nothing now.
    pub applied_now: bool,
    /// True when its items exist (applied now or before).
    pub delivered: bool,
    /// True when it is left [`state::UNSETTLED`] (its badges to invalidate).
    pub unsettled: bool,
}

/// What [`apply`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupApplied {
    /// The chunks of the group found on this shard, in chunk id order (a
    /// chunk id not among them names no chunk here: a draft that never
    /// committed, say).
    pub chunks: Vec<GroupChunk>,
    /// Items written by this transaction.
    pub delivered: u64,
    /// Recipients of the chunks applied now whom their preferences held
    /// back (no item was written).
    pub held_back: Vec<u64>,
    /// What the items show.
    pub summary: ContentSummary,
    /// The content's template (stored JSON) when it is one: the summary's
    /// title is then a template too, which each recipient's event renders.
    pub template: Option<String>,
    /// When the content was last edited (its version, for the template).
    pub edited_at: Option<NaiveDateTime>,
    /// The languages of the recipients of the delivered chunks who set
    /// one, when the template has translations (their events' titles
    /// render in them): read with their preferences, in the apply's one
    /// look at each recipient's row. `None` when not read, or when some
    /// delivered chunk was applied before (its recipients were not read).
    pub locales: Option<HashMap<u64, String>>,
}

/// What applying a group of chunks did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The pending chunks were applied (none, when every one was finished
    /// before).
    Applied(GroupApplied),
    /// The send has no content copy on this shard: nothing was written.
    Missing,
    /// Pending chunks some of whose recipients are no longer routed to this
    /// shard, or whose bucket is frozen by a move: nothing was written.
    Misplaced {
        /// Those chunks.
        chunks: Vec<GroupChunk>,
    },
}

/// Applies chunks of ONE send on this shard in ONE transaction, a single
/// chunk being a group of one: the chunk rows are locked (in primary-key
/// order, so two groups cannot deadlock each other) and each is its own
/// guard: only the pending ones are applied, moved pending -> unsettled
/// ([`settle`] makes them done once the badges are invalidated), their
/// items go in one `INSERT` and the shard stats get one bump. A redelivered
/// task finds its chunk done and changes nothing. `placed` says whether a
/// pending chunk's recipients may be written here (routed to this shard,
/// not frozen); when it says no to one, nothing is written.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", chunks = chunk_ids.len()))]
pub async fn apply(
    pool: &MySqlPool,
    message_id: MessageId,
    chunk_ids: &[u64],
    hold: HoldCheck,
    placed: impl Fn(&[u64]) -> bool,
) -> Result<ApplyOutcome> {
    let Some(content) = content_row(pool, message_id).await? else {
        return Ok(ApplyOutcome::Missing);
    };
    let summary = content.summary();
    let mut tx = pool.begin().await?;
    let mut select = QueryBuilder::new(
        "SELECT chunk_id, state, user_ids, vars, UTC_TIMESTAMP(3) FROM message_chunks \
         WHERE message_id = ",
    );
    select.push_bind(message_id.get()).push(" AND chunk_id IN (");
    let mut ids = select.separated(", ");
    for chunk_id in chunk_ids {
        ids.push_bind(*chunk_id);
    }
    select.push(") ORDER BY chunk_id FOR UPDATE");
    let rows: Vec<LockedChunk> = select.build_query_as().fetch_all(&mut *tx).await?;
    // One statement's time, the apply's: its items' `created_at` and the
    // chunks' `applied_at`, one value, so every view of a delivery shows the
    // same time.
    let at = rows.first().map(|row| row.4);
    let mut chunks = Vec::with_capacity(rows.len());
    for (chunk_id, chunk_state, packed, vars, _) in rows {
        let pending = chunk_state == state::PENDING;
        let (user_ids, vars) = decode_chunk(&packed, vars.as_deref())?;
        chunks.push(GroupChunk {
            chunk_id,
            user_ids,
            vars,
            applied_now: pending,
            delivered: pending || chunk_state == state::DONE || chunk_state == state::UNSETTLED,
            unsettled: pending || chunk_state == state::UNSETTLED,
        });
    }
    let misplaced: Vec<GroupChunk> =
        chunks.iter().filter(|c| c.applied_now && !placed(&c.user_ids)).cloned().collect();
    if !misplaced.is_empty() {
        tx.rollback().await?;
        return Ok(ApplyOutcome::Misplaced { chunks: misplaced });
    }
    let pending: Vec<&GroupChunk> = chunks.iter().filter(|c| c.applied_now).collect();
    if pending.is_empty() {
        tx.rollback().await?;
        let held_back = Vec::new();
        return Ok(ApplyOutcome::Applied(GroupApplied {
            chunks,
            delivered: 0,
            held_back,
            summary,
            template: content.template,
            edited_at: content.edited_at,
            locales: None,
        }));
    }
    let all = pending.iter().flat_map(|c| c.user_ids.iter().copied()).collect();
    let vars = group_vars(&pending)?;
    let at = at.ok_or_else(|| Error::Internal("a group of chunks without rows".into()))?;
    let written = Written {
        content: &content,
        at,
        first_chunk: pending[0].chunk_id,
        done_chunks: pending.len() as u64,
    };
    let hold = if content.translated()? { HoldCheck::WithLocales } else { hold };
    let (delivered, held_back, locales) =
        write_items(&mut tx, message_id, &written, all, vars, hold).await?;
    let mut update = QueryBuilder::new(concat!(
        "UPDATE message_chunks SET state = ",
        chunk_state!(UNSETTLED),
        ", vars = NULL, updated_at = UTC_TIMESTAMP(3), applied_at = "
    ));
    update.push_bind(at);
    let held_by_chunk = held_by_chunk(&pending, &held_back);
    if !held_by_chunk.is_empty() {
        // Only a send some recipients mute has any: one CASE arm per chunk
        // that held someone back.
        update.push(", held_back = CASE chunk_id");
        for (chunk_id, held) in held_by_chunk {
            update.push(" WHEN ").push_bind(chunk_id).push(" THEN ").push_bind(held);
        }
        update.push(" END");
    }
    update.push(" WHERE message_id = ").push_bind(message_id.get()).push(" AND chunk_id IN (");
    let mut ids = update.separated(", ");
    for chunk in &pending {
        ids.push_bind(chunk.chunk_id);
    }
    update.push(")");
    update.build().execute(&mut *tx).await?;

    tx.commit().await?;
    let read_all = chunks.iter().filter(|c| c.delivered).all(|c| c.applied_now);
    let locales = locales.filter(|_| read_all);
    let (template, edited_at) = (content.template, content.edited_at);
    Ok(ApplyOutcome::Applied(GroupApplied {
        chunks,
        delivered,
        held_back,
        summary,
        template,
        edited_at,
        locales,
    }))
}

/// A chunk row as an apply locks it: id, state, recipients, their vars,
/// and the statement's time.
type LockedChunk = (u64, u8, Vec<u8>, Option<Vec<u8>>, NaiveDateTime);

/// The vars of a group's recipients, in the order of their ids: every
/// chunk of a send carries vars, or none does.
fn group_vars(pending: &[&GroupChunk]) -> Result<Option<Vec<String>>> {
    if pending.iter().all(|chunk| chunk.vars.is_none()) {
        return Ok(None);
    }
    let mut vars = Vec::new();
    for chunk in pending {
        let Some(own) = &chunk.vars else {
            return Err(Error::Internal(format!(
                "chunk {} carries no vars beside chunks that do",
                chunk.chunk_id
            ))
            .into());
        };
        vars.extend(own.iter().cloned());
    }
    Ok(Some(vars))
}

/// A chunk's recipients held back by their preferences, as its `held_back`
/// stores them (sorted, packed like `user_ids`); `None` when there are none.
fn packed_held_back(held: &[u64]) -> Option<Vec<u8>> {
    if held.is_empty() {
        return None;
    }
    let mut sorted = held.to_vec();
    sorted.sort_unstable();
    Some(encode_user_ids(&sorted))
}

/// The recipients held back in a group apply, by the chunk they are in
/// (`held_back` of each chunk that held someone back).
fn held_by_chunk(chunks: &[&GroupChunk], held: &[u64]) -> Vec<(u64, Vec<u8>)> {
    if held.is_empty() {
        return Vec::new();
    }
    chunks
        .iter()
        .filter_map(|chunk| {
            let mine: Vec<u64> = held
                .iter()
                .copied()
                .filter(|user| chunk.user_ids.binary_search(user).is_ok())
                .collect();
            packed_held_back(&mine).map(|packed| (chunk.chunk_id, packed))
        })
        .collect()
}

/// What a gateway shows of a message (bodies stay behind `ListInbox`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContentSummary {
    /// Headline.
    #[serde(rename = "t")]
    pub title: String,
    /// Category.
    #[serde(rename = "c", default)]
    pub category: String,
    /// When the message was created, ms since the epoch.
    #[serde(rename = "at")]
    pub created_at_ms: i64,
    /// When its items expire, ms since the epoch.
    #[serde(rename = "x", default, skip_serializing_if = "Option::is_none")]
    pub expire_at_ms: Option<i64>,
}

impl ContentSummary {
    fn new(
        title: String,
        category: String,
        created_at: NaiveDateTime,
        expire_at: Option<NaiveDateTime>,
    ) -> Self {
        Self {
            title,
            category,
            created_at_ms: created_at.and_utc().timestamp_millis(),
            expire_at_ms: expire_at.map(|at| at.and_utc().timestamp_millis()),
        }
    }
}

/// Reads a message's summary from its content copy on `pool`, with the
/// content's template (stored JSON) when it is one: the summary's title
/// is then its title's template.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn content_summary<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
) -> Result<Option<(ContentSummary, Option<String>)>> {
    Ok(content_row(pool, message_id).await?.map(|content| (content.summary(), content.template)))
}

/// What a chunk's apply reads of the shard's content copy.
#[derive(Debug, Clone, sqlx::FromRow)]
struct ContentRow {
    title: String,
    category: String,
    expire_at: Option<NaiveDateTime>,
    created_at: NaiveDateTime,
    critical: bool,
    template: Option<String>,
    edited_at: Option<NaiveDateTime>,
}

impl ContentRow {
    fn summary(&self) -> ContentSummary {
        ContentSummary::new(
            self.title.clone(),
            self.category.clone(),
            self.created_at,
            self.expire_at,
        )
    }

    /// True when a recipient's muted categories can hold this send back.
    fn mutable(&self) -> bool {
        !self.critical && !self.category.is_empty()
    }

    /// True when the content is a template with translations: its events'
    /// titles render in each recipient's language.
    fn translated(&self) -> Result<bool> {
        let Some(template) = &self.template else { return Ok(false) };
        Ok(!notify_domain::template::Template::from_json(template)?.translations.is_empty())
    }
}

async fn content_row<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
) -> Result<Option<ContentRow>> {
    Ok(sqlx::query_as(
        "SELECT title, category, expire_at, created_at, critical <> 0 AS critical, template, \
         edited_at FROM message_contents WHERE message_id = ?",
    )
    .bind(message_id.get())
    .fetch_optional(pool)
    .await?)
}

/// Recipients as the rows of an items insert: one JSON array the server
/// expands (`JSON_TABLE`, [`ITEM_ROWS`] or [`PERSONAL_ROWS`]) of
/// `[user_id, bucket]`, or `[user_id, bucket, {vars}]` with their vars.
/// Each row brings its user's bucket (`shard_router::bucket_of`, which the
/// column's `DEFAULT` computes in `DECIMAL` arithmetic: a sixth of
/// MariaDB's time on a raw insert of items).
struct RecipientsJson {
    rows: String,
    personal: bool,
    user_ids: Vec<u64>,
}

impl RecipientsJson {
    fn of(user_ids: impl Iterator<Item = u64>) -> Result<Self> {
        let user_ids: Vec<u64> = user_ids.collect();
        let rows: Vec<(u64, u32)> =
            user_ids.iter().map(|user| (*user, shard_router::bucket_of(*user))).collect();
        let rows = serde_json::to_string(&rows).map_err(|e| Error::Internal(e.to_string()))?;
        Ok(Self { rows, personal: false, user_ids })
    }

    /// Recipients with their vars; `keep` says which of them to take. Each
    /// one's vars (a JSON object) go in as they are, not as a string: the
    /// server then copies them instead of unescaping them (a third less
    /// work for its `JSON_TABLE`). They are checked to be JSON here, so one
    /// broken value fails its chunk by name instead of the statement.
    fn with_vars(user_ids: &[u64], vars: &[String], keep: impl Fn(u64) -> bool) -> Result<Self> {
        let rows: Vec<(u64, u32, &RawValue)> = user_ids
            .iter()
            .zip(vars)
            .filter(|(user, _)| keep(**user))
            .map(|(user, vars)| {
                let raw: &RawValue = serde_json::from_str(vars).map_err(|e| {
                    Error::Internal(format!("user {user}'s stored vars are not JSON: {e}"))
                })?;
                Ok((*user, shard_router::bucket_of(*user), raw))
            })
            .collect::<Result<_>>()?;
        let user_ids = rows.iter().map(|row| row.0).collect();
        let rows = serde_json::to_string(&rows).map_err(|e| Error::Internal(e.to_string()))?;
        Ok(Self { rows, personal: true, user_ids })
    }

    /// How many.
    fn count(&self) -> u64 {
        self.user_ids.len() as u64
    }

    /// The user ids alone, as [`RECIPIENT_ROWS`] reads them.
    fn ids_json(&self) -> Result<String> {
        serde_json::to_string(&self.user_ids).map_err(|e| Error::Internal(e.to_string()).into())
    }
}

/// The recipients as rows `j.user_id`.
pub(super) const RECIPIENT_ROWS: &str =
    "JSON_TABLE(?, '$[*]' COLUMNS (user_id BIGINT UNSIGNED PATH '$')) AS j";

/// The recipients as rows `j.user_id`, `j.bucket` ([`RecipientsJson`]).
const ITEM_ROWS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (user_id BIGINT UNSIGNED PATH '$[0]', \
     bucket SMALLINT UNSIGNED PATH '$[1]')) AS j";

/// The recipients with their vars as rows `j.user_id`, `j.bucket`, `j.vars`
/// (a JSON column: the object's text as it is in the argument).
const PERSONAL_ROWS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (user_id BIGINT UNSIGNED PATH '$[0]', \
     bucket SMALLINT UNSIGNED PATH '$[1]', vars JSON PATH '$[2]')) AS j";

/// SQL condition on a recipient's preferences `p` (joined on `j.user_id`):
/// they hold the send back. Binds: message id, whether mutes apply (not
/// critical, a category), the category.
const HELD_BACK: &str = "(p.erased_before > ? OR (? AND FIND_IN_SET(?, p.muted_categories) > 0))";

/// How an apply tells the recipients whose preferences hold the send back
/// (a muted category, an erasure) from the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldCheck {
    /// In the insert: one statement, one preference lookup per recipient,
    /// and a second statement asking who was held back only when the insert
    /// wrote fewer items than it had recipients. For sends nobody mutes.
    InInsert,
    /// Before the insert: who is held back first (one preference lookup per
    /// recipient), then the insert of the others, which looks nothing up.
    /// For a send that held someone back on this shard before (a category
    /// some of its recipients mute), whose every chunk would otherwise look
    /// each recipient's preferences up twice.
    First,
    /// As [`HoldCheck::First`], the same look at each recipient's
    /// preferences bringing their language too. For a template with
    /// translations, whose events' titles would otherwise read each
    /// recipient's row a second time.
    WithLocales,
}

/// Inserts one item per recipient (none twice) whose preferences let the
/// send through (`user_preferences`, checked in the same statement: one
/// primary-key lookup per recipient), or every recipient when `checked`
/// says their preferences were checked before ([`HoldCheck::First`]);
/// returns how many were new.
///
/// The recipients go as one JSON array that the server expands, so every
/// chunk and group has the same statement text. A multi-row `VALUES` list
/// differs with the row count (up to 4,000 rows of placeholders, 56 KB for a
/// group), and each pooled connection caching every size made the worker
/// grow with the length of a send (49 MB after 10M recipients); not caching
/// them cost MariaDB a parse of each (fan-out 0.72 of raw INSERT, not 0.86).
async fn insert_items(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    message_id: MessageId,
    content: &ContentRow,
    at: NaiveDateTime,
    recipients: &RecipientsJson,
    checked: bool,
) -> Result<u64> {
    let insert = match recipients.personal {
        false => format!(
            "INSERT IGNORE INTO message_items \
             (user_id, message_id, category, expire_at, created_at, bucket) \
             SELECT j.user_id, ?, ?, ?, ?, j.bucket FROM {ITEM_ROWS}"
        ),
        true => format!(
            "INSERT IGNORE INTO message_items \
             (user_id, message_id, category, expire_at, created_at, bucket, vars) \
             SELECT j.user_id, ?, ?, ?, ?, j.bucket, j.vars FROM {PERSONAL_ROWS}"
        ),
    };
    let sql = if checked {
        insert
    } else {
        format!(
            "{insert} LEFT JOIN user_preferences p ON p.user_id = j.user_id \
             WHERE p.user_id IS NULL OR NOT {HELD_BACK}"
        )
    };
    let query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(message_id.get())
        .bind(&content.category)
        .bind(content.expire_at)
        .bind(at)
        .bind(&recipients.rows);
    let query = if checked {
        query
    } else {
        query.bind(message_id.get()).bind(content.mutable()).bind(&content.category)
    };
    Ok(query.execute(&mut **tx).await?.rows_affected())
}

/// Recipients without the item whom their preferences hold back: a
/// recipient who had the item already (from another batch, before muting)
/// is a duplicate, not suppressed. Asked after an insert that wrote fewer
/// items than it had recipients, or before the insert
/// ([`HoldCheck::First`]).
async fn held_back(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    message_id: MessageId,
    content: &ContentRow,
    recipients: &RecipientsJson,
) -> Result<Vec<u64>> {
    let sql = format!(
        "SELECT j.user_id FROM {RECIPIENT_ROWS} JOIN user_preferences p ON p.user_id = j.user_id \
         WHERE {HELD_BACK} AND NOT EXISTS (SELECT 1 FROM message_items i \
         WHERE i.user_id = j.user_id AND i.message_id = ?)"
    );
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(recipients.ids_json()?)
        .bind(message_id.get())
        .bind(content.mutable())
        .bind(&content.category)
        .bind(message_id.get())
        .fetch_all(&mut **tx)
        .await?)
}

/// What one apply transaction wrote, for the shard's stats.
struct Applied {
    /// The first chunk (its stats slot).
    chunk_id: u64,
    /// Recipients of the applied chunks.
    recipients: u64,
    /// Items written.
    delivered: u64,
    /// Recipients held back by their preferences.
    suppressed: u64,
    /// Chunks applied.
    done_chunks: u64,
}

/// Adds an apply's delivered, duplicate and suppressed recipients and its
/// chunks to the stats slot of its first chunk.
async fn bump_delivered(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    message_id: MessageId,
    applied: &Applied,
) -> Result<()> {
    let duplicates = applied.recipients.saturating_sub(applied.delivered + applied.suppressed);
    sqlx::query(
        "INSERT INTO message_shard_stats \
         (message_id, slot, delivered, duplicates, suppressed, done_chunks) \
         VALUES (?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
         delivered = delivered + VALUES(delivered), duplicates = duplicates + VALUES(duplicates), \
         suppressed = suppressed + VALUES(suppressed), \
         done_chunks = done_chunks + VALUES(done_chunks)",
    )
    .bind(message_id.get())
    .bind(1 + applied.chunk_id % (STATS_SLOTS - 1))
    .bind(applied.delivered)
    .bind(duplicates)
    .bind(applied.suppressed)
    .bind(applied.done_chunks)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// What an apply writes besides its recipients.
struct Written<'a> {
    /// The send's content copy.
    content: &'a ContentRow,
    /// The apply's time: its items' `created_at` (the chunks' `applied_at`).
    at: NaiveDateTime,
    /// The first chunk applied (its stats slot).
    first_chunk: u64,
    /// Chunks applied.
    done_chunks: u64,
}

/// Writes the items of an apply and its stats, checking preferences as
/// `hold` says; returns the items written, the recipients held back by
/// their preferences, and with [`HoldCheck::WithLocales`] the languages of
/// those who set one.
async fn write_items(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    message_id: MessageId,
    written: &Written<'_>,
    user_ids: Vec<u64>,
    vars: Option<Vec<String>>,
    hold: HoldCheck,
) -> Result<(u64, Vec<u64>, Option<HashMap<u64, String>>)> {
    let Written { content, at, first_chunk, done_chunks } = *written;
    let recipients = match &vars {
        None => RecipientsJson::of(user_ids.iter().copied())?,
        Some(vars) => RecipientsJson::with_vars(&user_ids, vars, |_| true)?,
    };
    let count = recipients.count();
    let (delivered, held, locales) = match hold {
        HoldCheck::InInsert => {
            let delivered = insert_items(tx, message_id, content, at, &recipients, false).await?;
            let held = if delivered < recipients.count() {
                held_back(tx, message_id, content, &recipients).await?
            } else {
                Vec::new()
            };
            (delivered, held, None)
        }
        HoldCheck::First | HoldCheck::WithLocales => {
            let (held, locales) = if hold == HoldCheck::First {
                (held_back(tx, message_id, content, &recipients).await?, None)
            } else {
                let (held, locales) = preferences_of(tx, message_id, content, &recipients).await?;
                (held, Some(locales))
            };
            let rest = if held.is_empty() {
                recipients
            } else {
                let skip: HashSet<u64> = held.iter().copied().collect();
                match &vars {
                    None => RecipientsJson::of(
                        user_ids.into_iter().filter(|user| !skip.contains(user)),
                    )?,
                    Some(vars) => {
                        RecipientsJson::with_vars(&user_ids, vars, |user| !skip.contains(&user))?
                    }
                }
            };
            (insert_items(tx, message_id, content, at, &rest, true).await?, held, locales)
        }
    };
    let applied = Applied {
        chunk_id: first_chunk,
        recipients: count,
        delivered,
        suppressed: held.len() as u64,
        done_chunks,
    };
    bump_delivered(tx, message_id, &applied).await?;
    Ok((delivered, held, locales))
}

/// Reads, in one look at each recipient's preferences row, who of them
/// is held back (as [`held_back`] tells) and the language of each who set
/// one.
async fn preferences_of(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    message_id: MessageId,
    content: &ContentRow,
    recipients: &RecipientsJson,
) -> Result<(Vec<u64>, HashMap<u64, String>)> {
    // The recipients first, whatever the statistics say (as
    // `preferences::locales`).
    let sql = format!(
        "SELECT STRAIGHT_JOIN j.user_id, p.locale, {HELD_BACK} AND NOT EXISTS (SELECT 1 \
         FROM message_items i WHERE i.user_id = j.user_id AND i.message_id = ?) AS held \
         FROM {RECIPIENT_ROWS} JOIN user_preferences p ON p.user_id = j.user_id"
    );
    let rows: Vec<(u64, String, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(message_id.get())
        .bind(content.mutable())
        .bind(&content.category)
        .bind(message_id.get())
        .bind(recipients.ids_json()?)
        .fetch_all(&mut **tx)
        .await?;
    let mut held = Vec::new();
    let mut locales = HashMap::new();
    for (user, locale, held_back) in rows {
        if held_back {
            held.push(user);
        } else if !locale.is_empty() {
            locales.insert(user, locale);
        }
    }
    Ok((held, locales))
}

/// Adds `recipients` to `column`, `duplicates` and `done` chunks to the
/// stats slot of `chunk_id`.
async fn bump_stats_by(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    message_id: MessageId,
    chunk_id: u64,
    column: &'static str,
    recipients: u64,
    duplicates: u64,
    done: u64,
) -> Result<()> {
    // `column` is one of a fixed set of names chosen by this module.
    let sql = format!(
        "INSERT INTO message_shard_stats (message_id, slot, {column}, duplicates, done_chunks) \
         VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE {column} = {column} + VALUES({column}), \
         duplicates = duplicates + VALUES(duplicates), done_chunks = done_chunks + VALUES(done_chunks)"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(message_id.get())
        .bind(1 + chunk_id % (STATS_SLOTS - 1))
        .bind(recipients)
        .bind(duplicates)
        .bind(done)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Returns which of `user_ids` have a visible (not deleted) item of
/// `message_id`, with the item's own vars: the recipients a redelivered
/// chunk's event is about (those held back by their preferences, or who
/// deleted the item since, are not), and what its titles are filled with
/// (the applied chunk keeps no vars).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn recipients_with_item(
    pool: &MySqlPool,
    message_id: MessageId,
    user_ids: &[u64],
) -> Result<Vec<(u64, Option<String>)>> {
    if user_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut select = QueryBuilder::new(concat!(
        "SELECT user_id, vars FROM message_items WHERE ",
        not_deleted!("message_items"),
        " AND message_id = "
    ));
    select.push_bind(message_id.get()).push(" AND user_id IN (");
    push_ids(&mut select, user_ids);
    select.push(")");
    Ok(select.build_query_as().fetch_all(pool).await?)
}

/// Counts one more attempt at a pending chunk, committed on its own before
/// the attempt, so a chunk that kills its workers is noticed. Returns the
/// attempts so far (0 if the chunk is no longer pending).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn count_attempt(pool: &MySqlPool, message_id: MessageId, chunk_id: u64) -> Result<u32> {
    sqlx::query(
        concat!("UPDATE message_chunks SET attempts = attempts + 1 WHERE message_id = ? AND chunk_id = ? AND state = ", chunk_state!(PENDING)),
    )
    .bind(message_id.get())
    .bind(chunk_id)
    .execute(pool)
    .await?;
    let attempts: Option<u32> = sqlx::query_scalar(concat!(
        "SELECT attempts FROM message_chunks WHERE message_id = ? AND chunk_id = ? AND state = ",
        chunk_state!(PENDING)
    ))
    .bind(message_id.get())
    .bind(chunk_id)
    .fetch_optional(pool)
    .await?;
    Ok(attempts.unwrap_or(0))
}

/// Returns a chunk's recipients, and whether it is [`state::UNSETTLED`], if
/// it is no longer pending.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn finished_recipients(
    pool: &MySqlPool,
    message_id: MessageId,
    chunk_id: u64,
) -> Result<Option<(Vec<u64>, bool)>> {
    let row: Option<(Vec<u8>, u8)> = sqlx::query_as(
        "SELECT user_ids, state FROM message_chunks WHERE message_id = ? AND chunk_id = ? AND state <> 0",
    )
    .bind(message_id.get())
    .bind(chunk_id)
    .fetch_optional(pool)
    .await?;
    row.map(|(bytes, chunk_state)| Ok((decode_user_ids(&bytes)?, chunk_state == state::UNSETTLED)))
        .transpose()
}

/// Records a pending chunk as failed after its last attempt: its recipients
/// count as failed in progress. Returns false if it was no longer pending;
/// otherwise records `webhook` (`message.failed`) with the change.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn mark_failed(
    pool: &MySqlPool,
    message_id: MessageId,
    chunk_id: u64,
    webhook: Option<Record<'_>>,
) -> Result<bool> {
    finish_pending(pool, message_id, chunk_id, state::FAILED, "failed", webhook).await
}

async fn finish_pending(
    pool: &MySqlPool,
    message_id: MessageId,
    chunk_id: u64,
    new_state: u8,
    column: &'static str,
    webhook: Option<Record<'_>>,
) -> Result<bool> {
    let mut tx = pool.begin().await?;
    let chunk: Option<(u16, Vec<u8>)> = sqlx::query_as(concat!(
        "SELECT recipients, user_ids FROM message_chunks \
         WHERE message_id = ? AND chunk_id = ? AND state = ",
        chunk_state!(PENDING),
        " FOR UPDATE"
    ))
    .bind(message_id.get())
    .bind(chunk_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((recipients, packed)) = chunk else {
        tx.rollback().await?;
        return Ok(false);
    };
    // Recipients who got the item from another batch's chunk are
    // duplicates, not undelivered: counting them as failed or cancelled
    // would count them twice in the send's total.
    // A chunk whose recipient list cannot be read (the poison chunk that
    // is being failed) counts every recipient as undelivered.
    let user_ids = decode_user_ids(&packed).unwrap_or_default();
    let already = if user_ids.is_empty() {
        0
    } else {
        let mut delivered =
            QueryBuilder::new("SELECT COUNT(*) FROM message_items WHERE message_id = ");
        delivered.push_bind(message_id.get()).push(" AND user_id IN (");
        push_ids(&mut delivered, &user_ids);
        delivered.push(")");
        let already: i64 = delivered.build_query_scalar().fetch_one(&mut *tx).await?;
        (already.max(0) as u64).min(u64::from(recipients))
    };
    // A failed chunk keeps its recipients' vars for a re-drive; a cancelled
    // one never delivers.
    sqlx::query(
        "UPDATE message_chunks SET state = ?, vars = IF(?, vars, NULL), \
         updated_at = UTC_TIMESTAMP(3) WHERE message_id = ? AND chunk_id = ?",
    )
    .bind(new_state)
    .bind(new_state == state::FAILED)
    .bind(message_id.get())
    .bind(chunk_id)
    .execute(&mut *tx)
    .await?;
    let undelivered = u64::from(recipients) - already;
    bump_stats_by(&mut tx, message_id, chunk_id, column, undelivered, already, 1).await?;
    if let Some(webhook) = webhook {
        webhook.write(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// Cancels up to `limit` of a send's pending chunks on this shard, from
/// chunk id `from` on, in ONE transaction (set-based: a locking read of the
/// page, one `UPDATE`, one stats bump), so cancelling a 10M-recipient send
/// is 20,000 chunks in 40 statements a shard, not 20,000 transactions.
/// Recipients who got the item from another batch's chunk are counted as
/// duplicates, not cancelled (they are not undelivered); `delivered_any`
/// false (the send never started) skips that lookup: nothing of it was
/// delivered. Returns the chunks cancelled and where the next page starts
/// (`None` after the last).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn cancel_pending_page(
    pool: &MySqlPool,
    message_id: MessageId,
    from: u64,
    limit: u32,
    delivered_any: bool,
) -> Result<(u64, Option<u64>)> {
    let mut tx = pool.begin().await?;
    let page: Vec<(u64, u16, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT chunk_id, recipients, user_ids FROM message_chunks \
         FORCE INDEX (idx_chunks_message_state) WHERE message_id = ? AND state = {} \
         AND chunk_id >= ? ORDER BY chunk_id LIMIT ? FOR UPDATE",
        state::PENDING
    )))
    .bind(message_id.get())
    .bind(from)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let Some(last) = page.last().map(|(chunk_id, _, _)| *chunk_id) else {
        tx.rollback().await?;
        return Ok((0, None));
    };
    let next = if page.len() < limit as usize { None } else { last.checked_add(1) };
    let recipients: u64 = page.iter().map(|(_, recipients, _)| u64::from(*recipients)).sum();
    let already = if delivered_any {
        let mut users = Vec::with_capacity(recipients as usize);
        for (_, _, packed) in &page {
            // A chunk whose list cannot be read counts every recipient as
            // undelivered.
            users.extend(decode_user_ids(packed).unwrap_or_default());
        }
        let delivered: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {RECIPIENT_ROWS} STRAIGHT_JOIN message_items i \
             ON i.user_id = j.user_id AND i.message_id = ?"
        )))
        .bind(super::json_ids(&users))
        .bind(message_id.get())
        .fetch_one(&mut *tx)
        .await?;
        (delivered.max(0) as u64).min(recipients)
    } else {
        0
    };
    let mut update = QueryBuilder::new("UPDATE message_chunks SET state = ");
    update.push_bind(state::CANCELLED);
    update.push(", vars = NULL, updated_at = UTC_TIMESTAMP(3) WHERE message_id = ");
    update.push_bind(message_id.get()).push(" AND chunk_id IN (");
    let ids: Vec<u64> = page.iter().map(|(chunk_id, _, _)| *chunk_id).collect();
    push_ids(&mut update, &ids);
    update.push(")");
    update.build().execute(&mut *tx).await?;
    let cancelled = page.len() as u64;
    bump_stats_by(&mut tx, message_id, last, "cancelled", recipients - already, already, cancelled)
        .await?;
    tx.commit().await?;
    Ok((cancelled, next))
}

/// Cancels every pending chunk of a send on this shard, a page of `page`
/// chunks per transaction ([`cancel_pending_page`]). Returns how many.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn cancel_pending(pool: &MySqlPool, message_id: MessageId, page: u32) -> Result<u64> {
    let mut cancelled = 0;
    let mut from = Some(0);
    while let Some(start) = from {
        let (count, next) = super::retrying("chunks::cancel_pending", || {
            cancel_pending_page(pool, message_id, start, page, true)
        })
        .await?;
        cancelled += count;
        from = next;
    }
    Ok(cancelled)
}

/// A page of a send's delivered chunks on this shard (applied, or taken back
/// since) from chunk id `from` on: their ids and recipients, whose cached
/// badges and pages an edit or a recall retires. Returns where the next page
/// starts (`None` after the last).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn delivered_recipients(
    pool: &MySqlPool,
    message_id: MessageId,
    from: u64,
    limit: u32,
) -> Result<(Vec<u64>, Option<u64>)> {
    let page: Vec<(u64, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT chunk_id, user_ids FROM message_chunks FORCE INDEX (idx_chunks_message_state) \
         WHERE message_id = ? AND state IN ({}, {}, {}, {}) AND chunk_id >= ? \
         ORDER BY chunk_id LIMIT ?",
        state::DONE,
        state::UNSETTLED,
        state::RECALLED,
        state::RECALL_UNSETTLED
    )))
    .bind(message_id.get())
    .bind(from)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let next = match page.last() {
        Some((last, _)) if page.len() == limit as usize => last.checked_add(1),
        _ => None,
    };
    let mut users = Vec::new();
    for (_, packed) in &page {
        users.extend(decode_user_ids(packed)?);
    }
    Ok((users, next))
}

/// Where the page after `ids` (a page of [`pending_page`]) starts; `None`
/// when it was the last (empty, or it ended at the highest possible id).
pub fn next_page_from(ids: &[u64]) -> Option<u64> {
    ids.last().and_then(|last| last.checked_add(1))
}

/// Moves failed chunks back to pending (re-drive) and returns their ids.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn reset_failed(pool: &MySqlPool, message_id: MessageId) -> Result<Vec<u64>> {
    let mut tx = pool.begin().await?;
    let failed: Vec<(u64, u16)> = sqlx::query_as(concat!(
        "SELECT chunk_id, recipients FROM message_chunks WHERE message_id = ? AND state = ",
        chunk_state!(FAILED),
        " FOR UPDATE"
    ))
    .bind(message_id.get())
    .fetch_all(&mut *tx)
    .await?;
    if failed.is_empty() {
        tx.rollback().await?;
        return Ok(Vec::new());
    }
    let recipients: u64 = failed.iter().map(|(_, r)| u64::from(*r)).sum();
    sqlx::query(concat!(
        "UPDATE message_chunks SET state = ",
        chunk_state!(PENDING),
        ", attempts = 0, updated_at = UTC_TIMESTAMP(3) \
         WHERE message_id = ? AND state = ",
        chunk_state!(FAILED)
    ))
    .bind(message_id.get())
    .execute(&mut *tx)
    .await?;
    // Failed counts are spread over slots; subtracting in slot 0 keeps
    // every sum exact (stats columns are signed for this reason).
    sqlx::query(
        "INSERT INTO message_shard_stats (message_id, slot, failed, done_chunks) VALUES (?, 0, ?, ?) \
         ON DUPLICATE KEY UPDATE failed = failed + VALUES(failed), done_chunks = done_chunks + VALUES(done_chunks)",
    )
    .bind(message_id.get())
    .bind(-(recipients as i64))
    .bind(-(failed.len() as i64))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(failed.into_iter().map(|(id, _)| id).collect())
}

/// Returns the ids of up to `limit` of a message's pending chunks on this
/// shard, the lowest from `from` on (0 for the first page: 0 is a chunk
/// id), in id order: callers walk a send of any size a page at a time.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn pending_page(
    pool: &MySqlPool,
    message_id: MessageId,
    from: u64,
    limit: u32,
) -> Result<Vec<u64>> {
    // The index holds (message_id, state) and then the primary key, so the
    // page is a range read in chunk id order.
    Ok(sqlx::query_scalar(concat!(
        "SELECT chunk_id FROM message_chunks FORCE INDEX (idx_chunks_message_state) \
         WHERE message_id = ? AND state = ",
        chunk_state!(PENDING),
        " AND chunk_id >= ? ORDER BY chunk_id LIMIT ?"
    ))
    .bind(message_id.get())
    .bind(from)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Marks a message's pending chunks on this shard as just published, so the
/// sweeper does not re-publish them before the timeout.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn touch_pending(pool: &MySqlPool, message_id: MessageId) -> Result<()> {
    sqlx::query(concat!(
        "UPDATE message_chunks SET updated_at = UTC_TIMESTAMP(3) WHERE message_id = ? AND state = ",
        chunk_state!(PENDING)
    ))
    .bind(message_id.get())
    .execute(pool)
    .await?;
    Ok(())
}

/// Returns true if the message has a chunk on this shard that is pending or
/// not settled yet (either keeps the send from completing).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn has_pending(pool: &MySqlPool, message_id: MessageId) -> Result<bool> {
    let found: Option<u64> = sqlx::query_scalar(
        // Forced: on young tables the optimizer prefers the primary key and
        // scans every finished chunk of the send, after every chunk.
        concat!(
            "SELECT chunk_id FROM message_chunks FORCE INDEX (idx_chunks_message_state) \
         WHERE message_id = ? AND state IN (",
            chunk_state!(PENDING),
            ", ",
            chunk_state!(UNSETTLED),
            ") LIMIT 1"
        ),
    )
    .bind(message_id.get())
    .fetch_optional(pool)
    .await?;
    Ok(found.is_some())
}

/// Claims up to `limit` chunks left pending for longer than
/// `older_than_secs`: they are locked (`SKIP LOCKED`: chunks another
/// sweeper is claiming are passed over) and marked as just handled in one
/// transaction, so several workers' sweepers never republish the same chunk
/// in the same round. Returns (message id, chunk id) pairs.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn claim_stale(
    pool: &MySqlPool,
    older_than_secs: u64,
    limit: u32,
) -> Result<Vec<(u64, u64)>> {
    // Two claims moving the same index range can deadlock (the victim
    // claimed nothing).
    Ok(super::retrying("chunks::claim_stale", || claim_stale_once(pool, older_than_secs, limit))
        .await?)
}

async fn claim_stale_once(
    pool: &MySqlPool,
    older_than_secs: u64,
    limit: u32,
) -> Result<Vec<(u64, u64)>> {
    let mut tx = pool.begin().await?;
    let stale: Vec<(u64, u64)> = sqlx::query_as(concat!(
        "SELECT message_id, chunk_id FROM message_chunks WHERE state = ",
        chunk_state!(PENDING),
        " \
         AND updated_at < UTC_TIMESTAMP(3) - INTERVAL ? SECOND ORDER BY updated_at LIMIT ? \
         FOR UPDATE SKIP LOCKED"
    ))
    .bind(older_than_secs)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    if stale.is_empty() {
        tx.rollback().await?;
        return Ok(stale);
    }
    let mut update = QueryBuilder::new(concat!(
        "UPDATE message_chunks SET updated_at = UTC_TIMESTAMP(3) WHERE state = ",
        chunk_state!(PENDING),
        " AND (message_id, chunk_id) IN ("
    ));
    let mut pairs = update.separated(", ");
    for (message_id, chunk_id) in &stale {
        pairs.push("(").push_bind_unseparated(*message_id).push_unseparated(", ");
        pairs.push_bind_unseparated(*chunk_id).push_unseparated(")");
    }
    update.push(")");
    update.build().execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(stale)
}

/// Moves [`state::UNSETTLED`] chunks of one send to done, once their
/// recipients' cached badges have been invalidated.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn settle(pool: &MySqlPool, message_id: MessageId, chunk_ids: &[u64]) -> Result<()> {
    if chunk_ids.is_empty() {
        return Ok(());
    }
    let mut update = QueryBuilder::new(concat!(
        "UPDATE message_chunks SET state = ",
        chunk_state!(DONE),
        ", updated_at = UTC_TIMESTAMP(3) WHERE state = ",
        chunk_state!(UNSETTLED),
        " AND message_id = "
    ));
    update.push_bind(message_id.get()).push(" AND chunk_id IN (");
    push_ids(&mut update, chunk_ids);
    update.push(")");
    update.build().execute(pool).await?;
    Ok(())
}

/// A chunk a worker applied or recalled whose recipients' badges still
/// need invalidating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsettled {
    /// The send.
    pub message_id: MessageId,
    /// The chunk.
    pub chunk_id: u64,
    /// Its recipients.
    pub user_ids: Vec<u64>,
    /// True for a recalled chunk ([`state::RECALL_UNSETTLED`]), false for a
    /// delivered one ([`state::UNSETTLED`]).
    pub recalled: bool,
}

/// Chunks of this shard left [`state::UNSETTLED`] for longer than
/// `older_than_ms` (younger ones are in the hands of their worker), then
/// those left [`state::RECALL_UNSETTLED`] as long: up to `limit` of each,
/// oldest first.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn unsettled(pool: &MySqlPool, older_than_ms: u64, limit: u32) -> Result<Vec<Unsettled>> {
    let mut chunks = Vec::new();
    for chunk_state in [state::UNSETTLED, state::RECALL_UNSETTLED] {
        let rows: Vec<(u64, u64, Vec<u8>)> = sqlx::query_as(
            "SELECT message_id, chunk_id, user_ids FROM message_chunks FORCE INDEX (idx_chunks_state) \
             WHERE state = ? AND updated_at < UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND \
             ORDER BY updated_at LIMIT ?",
        )
        .bind(chunk_state)
        .bind(older_than_ms * 1000)
        .bind(limit)
        .fetch_all(pool)
        .await?;
        for (message_id, chunk_id, packed) in rows {
            chunks.push(Unsettled {
                message_id: MessageId::from_raw(message_id),
                chunk_id,
                user_ids: decode_user_ids(&packed)?,
                recalled: chunk_state == state::RECALL_UNSETTLED,
            });
        }
    }
    Ok(chunks)
}

/// Marks chunks as just re-published.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn touch(pool: &MySqlPool, message_id: MessageId, chunk_ids: &[u64]) -> Result<()> {
    if chunk_ids.is_empty() {
        return Ok(());
    }
    let mut update = QueryBuilder::new(concat!(
        "UPDATE message_chunks SET updated_at = UTC_TIMESTAMP(3) WHERE state = ",
        chunk_state!(PENDING),
        " AND message_id = "
    ));
    update.push_bind(message_id.get()).push(" AND chunk_id IN (");
    push_ids(&mut update, chunk_ids);
    update.push(")");
    update.build().execute(pool).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_ids_round_trip_through_their_packed_form() {
        let ids = vec![1, 42, u64::MAX];
        assert_eq!(decode_user_ids(&encode_user_ids(&ids)).unwrap(), ids);
        assert!(decode_user_ids(&[1, 2, 3]).is_err());
    }

    #[test]
    fn the_next_page_starts_past_the_last_id_and_ends_at_the_top() {
        assert_eq!(next_page_from(&[]), None);
        // 0 is a chunk id (batch 0, chunk 0): the first page starts at it.
        assert_eq!(next_page_from(&[0]), Some(1));
        assert_eq!(next_page_from(&[3, 7, 9]), Some(10));
        assert_eq!(next_page_from(&[u64::MAX - 1, u64::MAX]), None);
    }

    #[test]
    fn stats_slots_keep_apart_totals_chunks_reads_and_materializations() {
        // Slot 0 holds the totals, 1..8 chunks and reads (by chunk or user),
        // 8.. an announcement's materializations: every one fits the column.
        let reads: Vec<u64> = (0..1000).map(read_slot).collect();
        let materialized: Vec<u64> = (0..1000).map(materialize_slot).collect();
        assert!(reads.iter().all(|slot| (1..STATS_SLOTS).contains(slot)));
        assert!(materialized.iter().all(|slot| (STATS_SLOTS..=u64::from(u8::MAX)).contains(slot)));
        let spread: HashSet<&u64> = materialized.iter().collect();
        assert_eq!(spread.len() as u64, MATERIALIZE_SLOTS);
    }
}
