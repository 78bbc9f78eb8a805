//! Recalls on a chunk's shard: a delivered chunk's items are taken back in
//! one transaction (the guard: the chunk moves done -> recalled, so a
//! redelivered task changes nothing), counted once in the shard's stats, and
//! the queries that publish, settle and finish a recall.
//!
//! The items left every list and count when the recall revoked the send's
//! content copies (every read of items leaves out a revoked send's); taking
//! a chunk's items back marks them (`message_items.recalled`, so each is
//! counted once), forgets their reads and counts them, and their rows go
//! with retention's purge of hidden items (`purge_hidden_after_secs`
//! later), as a cancelled send's do. Deleting them here cost the recall
//! more than inserting them cost the fan-out: a delete marks the row and
//! each index entry, and InnoDB's purge removes them again beside it; the
//! mark changes the row in place and no index.

use std::collections::HashMap;

use sqlx::{MySqlPool, QueryBuilder};
use tracing::instrument;

use super::chunks::{RECIPIENT_ROWS, STATS_SLOTS, decode_user_ids, state};
use super::{json_ids, push_ids};
use crate::error::Result;
use notify_domain::domain::MessageId;

/// What recalling a chunk did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecallOutcome {
    /// Its items were taken back now.
    Recalled {
        /// The chunk's recipients (their badges to invalidate).
        user_ids: Vec<u64>,
        /// Items taken back now (a recipient who had the item from another
        /// chunk of the send is counted with the chunk taken back first;
        /// one erased since, not at all).
        items: u64,
    },
    /// An earlier attempt took them back; `unsettled` when the recipients'
    /// badges may still need invalidating.
    AlreadyRecalled {
        /// The chunk's recipients.
        user_ids: Vec<u64>,
        /// True when it is [`state::RECALL_UNSETTLED`].
        unsettled: bool,
    },
    /// The chunk never delivered (pending, failed or cancelled): nothing to
    /// take back.
    NotDelivered,
    /// No such chunk on this shard.
    Missing,
}

/// Takes several delivered chunks of one send on this shard back in ONE
/// transaction (a worker's group of recall tasks, as deliveries go in
/// groups): the chunk rows are locked, the delivered ones (done or
/// unsettled) move to [`state::RECALL_UNSETTLED`] (or straight to
/// [`state::RECALLED`] when `settled`: no badge needs invalidating, the
/// caller knows), their recipients' items of the send not taken back yet
/// are locked, read (which were read) and marked recalled, the recorded
/// reads of those that were read are deleted, and the stats count the
/// items recalled (and no longer read), in the stats slot of the first
/// chunk recalled. The items' rows stay, hidden, for retention's purge
/// (module doc). Returns one outcome per chunk id, in the order given; the
/// items are counted on the first [`RecallOutcome::Recalled`] (the others
/// say 0), since one statement takes them all.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", chunks = chunk_ids.len()))]
pub async fn recall_many(
    pool: &MySqlPool,
    message_id: MessageId,
    chunk_ids: &[u64],
    settled: bool,
) -> Result<Vec<RecallOutcome>> {
    if chunk_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = pool.begin().await?;
    let mut select = QueryBuilder::new(
        "SELECT chunk_id, state, user_ids FROM message_chunks WHERE message_id = ",
    );
    select.push_bind(message_id.get()).push(" AND chunk_id IN (");
    push_ids(&mut select, chunk_ids);
    select.push(") ORDER BY chunk_id FOR UPDATE");
    let rows: Vec<(u64, u8, Vec<u8>)> = select.build_query_as().fetch_all(&mut *tx).await?;
    let mut found = HashMap::with_capacity(rows.len());
    let mut recalled = Vec::new();
    let mut users = Vec::new();
    for (chunk_id, chunk_state, packed) in rows {
        let user_ids = decode_user_ids(&packed)?;
        let outcome = match chunk_state {
            state::DONE | state::UNSETTLED => {
                recalled.push(chunk_id);
                users.extend_from_slice(&user_ids);
                RecallOutcome::Recalled { user_ids, items: 0 }
            }
            state::RECALLED | state::RECALL_UNSETTLED => RecallOutcome::AlreadyRecalled {
                user_ids,
                unsettled: chunk_state == state::RECALL_UNSETTLED,
            },
            _ => RecallOutcome::NotDelivered,
        };
        found.insert(chunk_id, outcome);
    }
    let mut items = 0;
    if recalled.is_empty() {
        tx.rollback().await?;
    } else {
        // The items not taken back yet, locked, saying which were read: only
        // their readers can have a read recorded (a read adds the row, a
        // mark-unread removes it), and the send's read count loses them.
        // Then marked, the same rows (locked), by primary key: a recipient
        // in an earlier chunk of the send was taken back with it and is not
        // counted again. Both statements name the chunks' users, so their
        // texts are one per group size, as a delivery's are.
        let mut select = in_users(
            "SELECT user_id, is_read FROM message_items WHERE recalled = 0",
            message_id,
            &users,
        );
        select.push(" FOR UPDATE");
        let taken: Vec<(u64, bool)> = select.build_query_as().fetch_all(&mut *tx).await?;
        items = taken.len() as u64;
        if !taken.is_empty() {
            in_users(
                "UPDATE message_items SET recalled = 1 WHERE recalled = 0",
                message_id,
                &users,
            )
            .build()
            .execute(&mut *tx)
            .await?;
        }
        let readers: Vec<u64> =
            taken.iter().filter(|(_, read)| *read).map(|(user_id, _)| *user_id).collect();
        if !readers.is_empty() {
            // One statement text whatever the number of readers (a JSON
            // array, read first, each reader's row by primary key), so no
            // connection caches a prepared statement per count.
            let delete = format!(
                "DELETE r FROM {RECIPIENT_ROWS} STRAIGHT_JOIN message_reads r \
                 ON r.message_id = ? AND r.user_id = j.user_id"
            );
            sqlx::query(sqlx::AssertSqlSafe(delete))
                .bind(json_ids(&readers))
                .bind(message_id.get())
                .execute(&mut *tx)
                .await?;
        }
        let read = readers.len() as i64;
        sqlx::query(
            "INSERT INTO message_shard_stats (message_id, slot, recalled, read_count) \
             VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
             recalled = recalled + VALUES(recalled), read_count = read_count + VALUES(read_count)",
        )
        .bind(message_id.get())
        .bind(1 + recalled[0] % (STATS_SLOTS - 1))
        .bind(items as i64)
        .bind(-read)
        .execute(&mut *tx)
        .await?;
        let mut update = QueryBuilder::new("UPDATE message_chunks SET state = ");
        update.push_bind(if settled { state::RECALLED } else { state::RECALL_UNSETTLED });
        update.push(", updated_at = UTC_TIMESTAMP(3) WHERE message_id = ");
        update.push_bind(message_id.get()).push(" AND chunk_id IN (");
        push_ids(&mut update, &recalled);
        update.push(")");
        update.build().execute(&mut *tx).await?;
        tx.commit().await?;
    }
    let mut first = Some(items);
    Ok(chunk_ids
        .iter()
        .map(|chunk_id| match found.remove(chunk_id) {
            Some(RecallOutcome::Recalled { user_ids, .. }) => {
                RecallOutcome::Recalled { user_ids, items: first.take().unwrap_or(0) }
            }
            Some(outcome) => outcome,
            None => RecallOutcome::Missing,
        })
        .collect())
}

/// `head` (a statement over one user-keyed table, ending in a condition)
/// narrowed to the send and the chunks' users (primary-key lookups).
fn in_users(head: &str, message_id: MessageId, user_ids: &[u64]) -> QueryBuilder<sqlx::MySql> {
    let mut sql = QueryBuilder::new(head);
    sql.push(" AND message_id = ").push_bind(message_id.get()).push(" AND user_id IN (");
    push_ids(&mut sql, user_ids);
    sql.push(")");
    sql
}

/// Moves recalled chunks' state to [`state::RECALLED`] once their
/// recipients' badges are invalidated.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn settle_recall(
    pool: &MySqlPool,
    message_id: MessageId,
    chunk_ids: &[u64],
) -> Result<()> {
    if chunk_ids.is_empty() {
        return Ok(());
    }
    let mut update = QueryBuilder::new("UPDATE message_chunks SET state = ");
    update.push_bind(state::RECALLED);
    update.push(", updated_at = UTC_TIMESTAMP(3) WHERE state = ");
    update.push_bind(state::RECALL_UNSETTLED);
    update.push(" AND message_id = ").push_bind(message_id.get()).push(" AND chunk_id IN (");
    push_ids(&mut update, chunk_ids);
    update.push(")");
    update.build().execute(pool).await?;
    Ok(())
}

/// The ids of a send's delivered chunks on this shard (done or unsettled:
/// still to recall), from `from` on (inclusive: chunk ids start at 0), up to
/// `limit`.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn delivered_page(
    pool: &MySqlPool,
    message_id: MessageId,
    from: u64,
    limit: u32,
) -> Result<Vec<u64>> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT chunk_id FROM message_chunks FORCE INDEX (idx_chunks_message_state) \
         WHERE message_id = ? AND state IN (",
        chunk_state!(DONE),
        ", ",
        chunk_state!(UNSETTLED),
        ") AND chunk_id >= ? ORDER BY chunk_id LIMIT ?"
    ))
    .bind(message_id.get())
    .bind(from)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Counts a recalled send's chunks on this shard that are not through yet:
/// pending (a cancel still to do), delivered (to take back) or recalled
/// with badges to invalidate. An index range over the send's chunks.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn unrecalled_chunks(pool: &MySqlPool, message_id: MessageId) -> Result<u64> {
    let count: i64 = sqlx::query_scalar(concat!(
        "SELECT COUNT(*) FROM message_chunks FORCE INDEX (idx_chunks_message_state) \
         WHERE message_id = ? AND state IN (",
        chunk_state!(PENDING),
        ", ",
        chunk_state!(DONE),
        ", ",
        chunk_state!(UNSETTLED),
        ", ",
        chunk_state!(RECALL_UNSETTLED),
        ")"
    ))
    .bind(message_id.get())
    .fetch_one(pool)
    .await?;
    Ok(count.max(0) as u64)
}
