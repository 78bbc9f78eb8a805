//! A user's items on the user's shard: inbox pages, unread counts, mark-read.

use chrono::NaiveDateTime;
use sqlx::{FromRow, MySqlPool, QueryBuilder};
use tracing::instrument;

use super::push_ids;
use notify_domain::error::Result;

/// One inbox entry with its content.
#[derive(Debug, Clone, FromRow)]
pub struct InboxRow {
    /// Message id (also the cursor).
    pub message_id: u64,
    /// Read state.
    pub is_read: bool,
    /// When it was read.
    pub read_at: Option<NaiveDateTime>,
    /// Title.
    pub title: String,
    /// Body.
    pub body: String,
    /// Category.
    pub category: String,
    /// Data as a JSON object.
    pub data: String,
    /// Message creation time.
    pub created_at: NaiveDateTime,
    /// Expiry.
    pub expire_at: Option<NaiveDateTime>,
}

/// Filters of an inbox page.
#[derive(Debug, Clone, Default)]
pub struct InboxQuery<'a> {
    /// Only ids below this one (the cursor); `u64::MAX` for the first page.
    pub before: u64,
    /// Rows to return.
    pub limit: u32,
    /// Only unread items.
    pub unread_only: bool,
    /// Only this category, when set.
    pub category: Option<&'a str>,
}

/// Reads one inbox page, newest first, in one query on the user's shard.
/// Expired items are skipped.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn list<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
    query: &InboxQuery<'_>,
) -> Result<Vec<InboxRow>> {
    // The index that serves each filter in message id order is named, and
    // the join order fixed: the plan is the same for every page, and
    // MariaDB skips weighing the other indexes on each execution (about a
    // tenth of a page's cost).
    let index = match (query.category, query.unread_only) {
        (Some(_), _) => "idx_items_category",
        (None, true) => "idx_items_unread",
        (None, false) => "PRIMARY",
    };
    let mut sql = QueryBuilder::new(format!(
        "SELECT STRAIGHT_JOIN i.message_id, i.is_read, i.read_at, c.title, c.body, c.category, \
         c.data, c.created_at, c.expire_at FROM message_items i FORCE INDEX ({index}) \
         JOIN message_contents c ON c.message_id = i.message_id WHERE i.user_id = "
    ));
    sql.push_bind(user_id).push(" AND i.message_id < ").push_bind(query.before);
    if query.unread_only {
        sql.push(" AND i.is_read = 0");
    }
    if let Some(category) = query.category {
        sql.push(" AND i.category = ").push_bind(category.to_owned());
    }
    sql.push(" AND c.revoked = 0 AND (i.expire_at IS NULL OR i.expire_at > UTC_TIMESTAMP(3))")
        .push(" ORDER BY i.message_id DESC LIMIT ")
        .push_bind(query.limit);
    Ok(sql.build_query_as().fetch_all(db).await?)
}

/// The database truth of a badge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnreadTruth {
    /// Unread, unexpired items.
    pub unread: u64,
    /// Earliest expiry among them: the count changes then.
    pub next_expiry: Option<NaiveDateTime>,
}

/// Counts a user's unread items and finds which of `announcement_ids` the
/// user has materialized, both in ONE snapshot (a read-only transaction), so
/// a materialization committing in between cannot be counted zero or two times.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn badge_truth(
    pool: &MySqlPool,
    user_id: u64,
    announcement_ids: &[u64],
) -> Result<(UnreadTruth, Vec<u64>)> {
    if announcement_ids.is_empty() {
        return Ok((count_unread(pool, user_id).await?, Vec::new()));
    }
    let mut tx = pool.begin().await?;
    let truth = count_unread(&mut *tx, user_id).await?;
    let present = present(&mut *tx, user_id, announcement_ids).await?;
    tx.commit().await?;
    Ok((truth, present))
}

/// Counts a user's unread, unexpired, unrevoked items (an index range scan
/// on one shard, joined to the shard's content copies by primary key).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn count_unread<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
) -> Result<UnreadTruth> {
    let (unread, next_expiry): (i64, Option<NaiveDateTime>) = sqlx::query_as(
        "SELECT COUNT(*), MIN(i.expire_at) FROM message_items i \
         JOIN message_contents c ON c.message_id = i.message_id \
         WHERE i.user_id = ? AND i.is_read = 0 AND c.revoked = 0 \
         AND (i.expire_at IS NULL OR i.expire_at > UTC_TIMESTAMP(3))",
    )
    .bind(user_id)
    .fetch_one(pool)
    .await?;
    Ok(UnreadTruth { unread: unread.max(0) as u64, next_expiry })
}

/// Returns which of `message_ids` the user has an item for.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn present<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
    message_ids: &[u64],
) -> Result<Vec<u64>> {
    if message_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut select = QueryBuilder::new("SELECT message_id FROM message_items WHERE user_id = ");
    select.push_bind(user_id).push(" AND message_id IN (");
    push_ids(&mut select, message_ids);
    select.push(")");
    Ok(select.build_query_scalar().fetch_all(pool).await?)
}

/// Materializes announcements for a user in one transaction: locks the
/// user's inbox-state row (so concurrent materializations queue), writes the
/// items still missing, bumps their stats and the user's watermark. Returns
/// how many items were written.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn materialize(pool: &MySqlPool, user_id: u64, message_ids: &[u64]) -> Result<u64> {
    let mut tx = pool.begin().await?;
    // Creates or exclusively locks the user's state row in one statement.
    sqlx::query(
        "INSERT INTO user_inbox_state (user_id) VALUES (?) \
         ON DUPLICATE KEY UPDATE announcement_watermark = announcement_watermark",
    )
    .bind(user_id)
    .execute(&mut *tx)
    .await?;
    let mut missing: Vec<u64> = message_ids.to_vec();
    let present = present(&mut *tx, user_id, message_ids).await?;
    missing.retain(|id| !present.contains(id));
    if missing.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    let mut insert = QueryBuilder::new(
        "INSERT INTO message_items (user_id, message_id, category, expire_at) \
         SELECT ",
    );
    insert.push_bind(user_id).push(
        ", message_id, category, expire_at FROM message_contents WHERE revoked = 0 AND message_id IN (",
    );
    push_ids(&mut insert, &missing);
    insert.push(")");
    let written = insert.build().execute(&mut *tx).await?.rows_affected();
    let mut stats =
        QueryBuilder::new("INSERT INTO message_shard_stats (message_id, slot, delivered) ");
    stats.push_values(&missing, |mut row, id| {
        row.push_bind(*id).push_bind(0u8).push_bind(1i64);
    });
    stats.push(" ON DUPLICATE KEY UPDATE delivered = delivered + VALUES(delivered)");
    if written == missing.len() as u64 {
        stats.build().execute(&mut *tx).await?;
    }
    let newest = missing.iter().copied().max().unwrap_or(0);
    sqlx::query(
        "UPDATE user_inbox_state SET announcement_watermark = GREATEST(announcement_watermark, ?) \
         WHERE user_id = ?",
    )
    .bind(newest)
    .bind(user_id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(written)
}

/// Marks the given messages read for a user. Returns the ids that changed and
/// the ids the user has no item for. Read stats follow in the same transaction.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn mark_read(
    pool: &MySqlPool,
    user_id: u64,
    message_ids: &[u64],
) -> Result<(Vec<u64>, Vec<u64>)> {
    let mut tx = pool.begin().await?;
    let mut select =
        QueryBuilder::new("SELECT message_id, is_read FROM message_items WHERE user_id = ");
    select.push_bind(user_id).push(" AND message_id IN (");
    push_ids(&mut select, message_ids);
    select.push(") FOR UPDATE");
    let found: Vec<(u64, bool)> = select.build_query_as().fetch_all(&mut *tx).await?;
    let unknown: Vec<u64> =
        message_ids.iter().copied().filter(|id| !found.iter().any(|(f, _)| f == id)).collect();
    let to_mark: Vec<u64> = found.iter().filter(|(_, read)| !read).map(|(id, _)| *id).collect();
    mark_ids(&mut tx, user_id, &to_mark).await?;
    tx.commit().await?;
    Ok((to_mark, unknown))
}

/// Marks every unread item read, optionally only one category and only ids
/// up to `up_to`. Returns how many changed.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn mark_all_read(
    pool: &MySqlPool,
    user_id: u64,
    category: Option<&str>,
    up_to: Option<u64>,
) -> Result<u64> {
    let mut tx = pool.begin().await?;
    let mut select =
        QueryBuilder::new("SELECT message_id FROM message_items WHERE is_read = 0 AND user_id = ");
    select.push_bind(user_id);
    if let Some(category) = category {
        select.push(" AND category = ").push_bind(category.to_owned());
    }
    if let Some(up_to) = up_to {
        select.push(" AND message_id <= ").push_bind(up_to);
    }
    select.push(" FOR UPDATE");
    let to_mark: Vec<u64> = select.build_query_scalar().fetch_all(&mut *tx).await?;
    mark_ids(&mut tx, user_id, &to_mark).await?;
    tx.commit().await?;
    Ok(to_mark.len() as u64)
}

async fn mark_ids(
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    user_id: u64,
    message_ids: &[u64],
) -> Result<()> {
    if message_ids.is_empty() {
        return Ok(());
    }
    let mut update = QueryBuilder::new(
        "UPDATE message_items SET is_read = 1, read_at = UTC_TIMESTAMP(3) WHERE is_read = 0 AND user_id = ",
    );
    update.push_bind(user_id).push(" AND message_id IN (");
    push_ids(&mut update, message_ids);
    update.push(")");
    update.build().execute(&mut **tx).await?;

    // One read per message; slot 0 holds read counts.
    let mut stats =
        QueryBuilder::new("INSERT INTO message_shard_stats (message_id, slot, read_count) ");
    stats.push_values(message_ids, |mut row, id| {
        row.push_bind(*id).push_bind(0u8).push_bind(1i64);
    });
    stats.push(" ON DUPLICATE KEY UPDATE read_count = read_count + VALUES(read_count)");
    stats.build().execute(&mut **tx).await?;
    Ok(())
}
