//! Operator lookups (the console): recent sends of every sender, a group's
//! row. Read-only, and never on a hot path.

use chrono::NaiveDateTime;
use sqlx::{FromRow, MySqlPool, QueryBuilder};
use tracing::instrument;

use super::messages::{MESSAGE_COLUMNS, MessageRow, ShardStats};
use crate::error::Result;
use notify_domain::domain::MessageId;

/// Which sends [`recent_sends`] lists.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendFilter<'a> {
    /// Only this stored status.
    pub status: Option<u8>,
    /// Only this sender.
    pub sender: Option<&'a str>,
    /// Only this client's (the caller's own, without `sends.all`).
    pub client: Option<&'a str>,
}

/// Up to `limit` control records of this home shard with ids below
/// `before`, newest first (the primary key, backwards).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn recent_sends(
    pool: &MySqlPool,
    filter: &SendFilter<'_>,
    before: u64,
    limit: u32,
) -> Result<Vec<MessageRow>> {
    let mut sql =
        QueryBuilder::new(format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE message_id < "));
    sql.push_bind(before);
    if let Some(status) = filter.status {
        sql.push(" AND status = ").push_bind(status);
    }
    if let Some(sender) = filter.sender {
        sql.push(" AND sender = ").push_bind(sender.to_owned());
    }
    if let Some(client) = filter.client {
        sql.push(" AND client = ").push_bind(client.to_owned());
    }
    sql.push(" ORDER BY message_id DESC LIMIT ").push_bind(limit);
    Ok(sql.build_query_as().fetch_all(pool).await?)
}

/// A group's row, as its home shard stores it.
#[derive(Debug, Clone, FromRow)]
pub struct GroupRow {
    /// The group.
    pub group_id: u64,
    /// Its name.
    pub name: String,
    /// When it was created.
    pub created_at: NaiveDateTime,
}

/// Reads a group's row from its home shard.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn group(pool: &MySqlPool, group_id: u64) -> Result<Option<GroupRow>> {
    Ok(sqlx::query_as("SELECT group_id, name, created_at FROM message_groups WHERE group_id = ?")
        .bind(group_id)
        .fetch_optional(pool)
        .await?)
}

/// A send's status as its home shard holds it, with that shard's stats, in
/// one statement (the console's live view reads each shard once per
/// interval, the home shard included).
#[derive(Debug, Clone, Copy)]
pub struct HomeStats {
    /// Stored status.
    pub status: u8,
    /// Set once it completed, was cancelled or its recall finished.
    pub finished: bool,
    /// The home shard's counters of the send.
    pub stats: ShardStats,
}

/// Reads [`HomeStats`] of `message_id`; `None` if the home shard has no
/// such send.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn home_stats(pool: &MySqlPool, message_id: MessageId) -> Result<Option<HomeStats>> {
    #[derive(FromRow)]
    struct Row {
        status: u8,
        finished: bool,
        #[sqlx(flatten)]
        stats: ShardStats,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT m.status, m.finished_at IS NOT NULL AS finished, \
         CAST(COALESCE(SUM(s.total), 0) AS UNSIGNED) AS total, \
         CAST(COALESCE(SUM(s.delivered), 0) AS UNSIGNED) AS delivered, \
         CAST(COALESCE(SUM(s.duplicates), 0) AS UNSIGNED) AS duplicates, \
         CAST(COALESCE(SUM(s.failed), 0) AS UNSIGNED) AS failed, \
         CAST(COALESCE(SUM(s.cancelled), 0) AS UNSIGNED) AS cancelled, \
         CAST(COALESCE(SUM(s.suppressed), 0) AS UNSIGNED) AS suppressed, \
         CAST(COALESCE(SUM(s.recalled), 0) AS UNSIGNED) AS recalled, \
         CAST(COALESCE(SUM(s.read_count), 0) AS UNSIGNED) AS read_count, \
         CAST(COALESCE(SUM(s.chunks), 0) AS UNSIGNED) AS chunks, \
         CAST(COALESCE(SUM(s.done_chunks), 0) AS UNSIGNED) AS done_chunks \
         FROM messages m LEFT JOIN message_shard_stats s ON s.message_id = m.message_id \
         WHERE m.message_id = ? GROUP BY m.message_id, m.status, m.finished_at",
    )
    .bind(message_id.get())
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| HomeStats { status: row.status, finished: row.finished, stats: row.stats }))
}
