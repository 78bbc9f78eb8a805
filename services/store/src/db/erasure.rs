//! Removing everything a shard holds of one user (their erasure): items,
//! announcement watermark, group cursors, preferences (the erasure marker
//! stays on the user's own shard), a pending badge invalidation, the
//! recipient records (reads by message, announcements materialized), and
//! reads not yet reported to `item.read` webhooks.

use sqlx::MySqlPool;
use tracing::instrument;

use crate::error::Result;

/// Rows per `DELETE` of a user's items, so no statement runs for long.
const ITEMS_PER_DELETE: u64 = 10_000;

/// What was removed of a user.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Inbox items (deleted ones included).
    pub items: u64,
    /// Group cursors.
    pub memberships: u64,
}

impl Removed {
    /// Adds another shard's counts.
    pub fn add(&mut self, other: &Removed) {
        self.items += other.items;
        self.memberships += other.memberships;
    }
}

/// Removes a user's rows from one shard. On the user's own shard
/// (`keep_marker`) their preferences row stays, as the erasure marker
/// `preferences::mark_erased` wrote; elsewhere (a copy a bucket move left)
/// it goes too.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn remove_user(pool: &MySqlPool, user_id: u64, keep_marker: bool) -> Result<Removed> {
    // Reads waiting to be counted first: the sends keep their read counts
    // (as for reads counted before), and a count running meanwhile ends
    // before the readers go. None of them is reported (`item.read`).
    super::retrying("erasure::count_reads", || super::read_backlog::apply(pool, user_id, false))
        .await?;
    let mut removed = Removed::default();
    loop {
        let deleted = sqlx::query("DELETE FROM message_items WHERE user_id = ? LIMIT ?")
            .bind(user_id)
            .bind(ITEMS_PER_DELETE)
            .execute(pool)
            .await?
            .rows_affected();
        removed.items += deleted;
        if deleted < ITEMS_PER_DELETE {
            break;
        }
    }
    removed.memberships = sqlx::query("DELETE FROM group_members WHERE user_id = ?")
        .bind(user_id)
        .execute(pool)
        .await?
        .rows_affected();
    for table in [
        "user_inbox_state",
        "retention_pending_badges",
        "read_backlog",
        "read_feed",
        "message_reads",
        "announcement_recipients",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table} WHERE user_id = ?")))
            .bind(user_id)
            .execute(pool)
            .await?;
    }
    if !keep_marker {
        sqlx::query("DELETE FROM user_preferences WHERE user_id = ?")
            .bind(user_id)
            .execute(pool)
            .await?;
    }
    Ok(removed)
}
