//! Reads waiting to be counted (`read_backlog`, on the user's shard).
//!
//! A filtered read or unread ([`super::item_updates`] with a filter)
//! changes the user's items and, in the same transaction, writes one row:
//! the messages it changed (a JSON array) and the direction (`+1` read,
//! `-1` unread). The sends' read counts (`message_shard_stats`, in the
//! user's slot, [`super::chunks::read_slot`]) and "who read it"
//! (`message_reads`) of those messages follow from it in [`apply`], a
//! moment later and out of the user's transaction, which then
//! writes one row where it wrote two per item (10,000 read counts and
//! 10,000 readers for a 10,000-item inbox).
//!
//! Exactly once: [`apply`] counts rows it holds locked and deletes them in
//! the same transaction. Order does not matter: read counts are sums, and
//! the readers of a message are set from the items as they are when the
//! rows are applied, not replayed (a reader row exists where the item is
//! read and not recalled: a recall deletes its items' readers, and a
//! withdrawn announcement, which takes no read back, keeps them). Updates
//! by a list of ids count their own items in their own transaction, as
//! before; they lock the user's waiting rows after their items and before
//! changing them ([`LOCK_WAITING`]), so an [`apply`] running meanwhile
//! reads the items before or after them, never between.

use std::time::Duration;

use sqlx::{MySqlPool, QueryBuilder, Row};
use tracing::instrument;

use super::chunks::read_slot;
use super::{json_ids, push_ids};
use crate::error::Result;

/// The statement an update by a list of ids takes the user's waiting rows
/// with (one user id, `?`), before it changes items: it waits for an
/// [`apply`] of that user to end.
pub(crate) const LOCK_WAITING: &str =
    "SELECT backlog_id FROM read_backlog WHERE user_id = ? FOR UPDATE";

/// The statement an update by a filter records what it is about to change
/// with, a script's template ([`super::script`]): `?` are the user, the
/// direction and the update's selection of the items `i` (a `WHERE`,
/// [`super::item_updates`]). It reads the rows with a shared lock, so the
/// update changes exactly those. No row when nothing is selected.
///
/// The ids are written as a JSON array of numbers, joined by
/// `GROUP_CONCAT` between brackets: the text `JSON_ARRAYAGG` makes, 2 ms
/// sooner for 10,000 ids. It is bounded by `group_concat_max_len`: the
/// update's script raises it first ([`RAISE_AGGREGATE_LIMIT`]).
pub(crate) const RECORD: &str = "INSERT INTO read_backlog (user_id, delta, message_ids) \
     SELECT ?, ?, CONCAT('[', GROUP_CONCAT(i.message_id), ']') \
     FROM message_items i ? HAVING COUNT(*) > 0";

/// Lifts MariaDB's bound on an aggregated string for the connection (its
/// default of 1 MiB holds ~50,000 ids, and a longer array is cut, not
/// refused). The largest a session may set; a script that sets it sets it
/// back at its end ([`RESTORE_AGGREGATE_LIMIT`]).
pub(crate) const RAISE_AGGREGATE_LIMIT: &str = "SET SESSION group_concat_max_len = 4294967295";

/// Gives the connection the server's bound again, as it was before
/// [`RAISE_AGGREGATE_LIMIT`].
pub(crate) const RESTORE_AGGREGATE_LIMIT: &str = "SET SESSION group_concat_max_len = DEFAULT";

/// The ids of a row, as a table. Joined first after the row
/// (`STRAIGHT_JOIN`): the optimizer otherwise reads the user's items by
/// their key and the array again for each of them (10,000 ids: 18 s).
const IDS: &str =
    "JSON_TABLE(b.message_ids, '$[*]' COLUMNS (message_id BIGINT UNSIGNED PATH '$')) j";

/// Counts every row of the user waiting on this shard, and deletes them, in
/// one transaction. READ COMMITTED: the rows it locks are the ones it
/// counts and deletes (a row committed meanwhile waits for the next count),
/// and it reads the items without locking them, so the user's own updates
/// never wait on a count.
///
/// Read counts move by the rows' sum per message, for messages whose
/// content copy is still here (retention dropped the rest, with their
/// counts). A message's reader row is then set from the user's item: kept
/// or written (with the item's read time) where the item is read and not
/// withdrawn, deleted where it is not read or gone. With `feed` (some
/// endpoint wants `item.read`), each of those reads of a read row is also
/// written to [`super::read_feed`] in the same transaction. Returns the
/// rows applied.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn apply(pool: &MySqlPool, user_id: u64, feed: bool) -> Result<u64> {
    // One text, so that the level never outlives this transaction on a
    // pooled connection (it applies to the next transaction only).
    let mut tx = pool
        .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
        .await?;
    let rows: Vec<(u64, i8)> = sqlx::query_as(
        "SELECT backlog_id, delta FROM read_backlog WHERE user_id = ? ORDER BY backlog_id FOR UPDATE",
    )
    .bind(user_id)
    .fetch_all(&mut *tx)
    .await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    let ids: Vec<u64> = rows.iter().map(|(id, _)| *id).collect();
    let chosen = |query: &mut QueryBuilder<sqlx::MySql>| {
        query.push(" b.backlog_id IN (");
        push_ids(query, &ids);
        query.push(")");
    };

    let slot = read_slot(user_id);
    let mut counts = QueryBuilder::new(format!(
        "INSERT INTO message_shard_stats (message_id, slot, read_count) \
         SELECT j.message_id, {slot}, SUM(b.delta) FROM read_backlog b STRAIGHT_JOIN {IDS} \
         STRAIGHT_JOIN message_contents c ON c.message_id = j.message_id WHERE"
    ));
    chosen(&mut counts);
    counts.push(
        " GROUP BY j.message_id HAVING SUM(b.delta) <> 0 \
         ON DUPLICATE KEY UPDATE read_count = read_count + VALUES(read_count)",
    );
    counts.build().execute(&mut *tx).await?;

    if rows.iter().any(|(_, delta)| *delta > 0) {
        let tables: &[&str] =
            if feed { &["message_reads", "read_feed"] } else { &["message_reads"] };
        for table in tables {
            let read_at = read_time!("i");
            // Who read it keeps when the item was delivered too (a page of
            // readers reads that table alone); the feed does not need it.
            let (delivered, delivered_at, updated) = if *table == "message_reads" {
                (", delivered_at", ", i.created_at", ", delivered_at = VALUES(delivered_at)")
            } else {
                ("", "", "")
            };
            let mut readers = QueryBuilder::new(format!(
                "INSERT INTO {table} (message_id, user_id, read_at{delivered}) \
                 SELECT DISTINCT i.message_id, i.user_id, {read_at}{delivered_at} FROM read_backlog b STRAIGHT_JOIN {IDS} \
                 STRAIGHT_JOIN message_items i ON i.user_id = b.user_id AND i.message_id = j.message_id \
                 WHERE b.delta > 0 AND i.is_read = 1 AND i.recalled = 0 AND"
            ));
            chosen(&mut readers);
            readers.push(format!(" ON DUPLICATE KEY UPDATE read_at = VALUES(read_at){updated}"));
            readers.build().execute(&mut *tx).await?;
        }
    }
    if rows.iter().any(|(_, delta)| *delta < 0) {
        // Found by a plain read, then deleted by key: a DELETE joined to
        // the items would lock them (shared), and the user's next update
        // would wait on this count, or deadlock with it.
        let mut gone = QueryBuilder::new(format!(
            "SELECT DISTINCT j.message_id FROM read_backlog b STRAIGHT_JOIN {IDS} \
             STRAIGHT_JOIN message_reads r ON r.message_id = j.message_id AND r.user_id = b.user_id \
             LEFT JOIN message_items i ON i.user_id = b.user_id AND i.message_id = j.message_id \
             AND i.is_read = 1 WHERE b.delta < 0 AND i.message_id IS NULL AND"
        ));
        chosen(&mut gone);
        let gone: Vec<u64> = gone.build_query_scalar().fetch_all(&mut *tx).await?;
        if !gone.is_empty() {
            sqlx::query(
                "DELETE r FROM JSON_TABLE(?, '$[*]' COLUMNS (message_id BIGINT UNSIGNED PATH '$')) j \
                 STRAIGHT_JOIN message_reads r ON r.message_id = j.message_id AND r.user_id = ?",
            )
            .bind(json_ids(&gone))
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        }
    }

    let mut delete = QueryBuilder::new("DELETE FROM read_backlog WHERE user_id = ");
    delete.push_bind(user_id).push(" AND backlog_id IN (");
    push_ids(&mut delete, &ids);
    delete.push(")");
    delete.build().execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows.len() as u64)
}

/// Users with a row waiting on this shard for longer than `older_than` (the
/// process that wrote it applies it at once; what it left, a crash or a
/// failure, the workers' settler applies), oldest first.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn waiting(pool: &MySqlPool, older_than: Duration, limit: u32) -> Result<Vec<u64>> {
    let rows = sqlx::query(
        "SELECT user_id FROM read_backlog \
         WHERE created_at < UTC_TIMESTAMP(3) - INTERVAL ? MICROSECOND \
         ORDER BY backlog_id LIMIT ?",
    )
    .bind(older_than.as_micros() as u64)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let mut users = Vec::with_capacity(rows.len());
    for row in rows {
        let user: u64 = row.try_get(0)?;
        if !users.contains(&user) {
            users.push(user);
        }
    }
    Ok(users)
}

/// Rows waiting on this shard (all users): 0 once every read is counted.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn count(pool: &MySqlPool) -> Result<u64> {
    let (count,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM read_backlog").fetch_one(pool).await?;
    Ok(count.max(0) as u64)
}
