//! Users whose cached state a write could not retire because Redis did not
//! answer (`badge_repairs`, migration 28). The write records the user in
//! its own transaction ([`RECORD`], [`record`]), so it succeeds with Redis
//! away and no commit is left without its invalidation; a settler takes the
//! rows ([`due`]) once Redis answers, retires each user's cached badge,
//! pages and group cursors, and forgets the rows it retired ([`forget`]),
//! unless a later write stamped them again meanwhile.

use chrono::NaiveDateTime;
use sqlx::{MySqlConnection, MySqlPool, QueryBuilder};
use tracing::instrument;

use crate::error::Result;

/// The statement that records a user (`?`: the user id, bound, or written
/// in by a script, [`super::script`]); a later write stamps the row again,
/// so a settler that read it before that write's commit leaves it for the
/// next round.
pub const RECORD: &str = "INSERT INTO badge_repairs (user_id, changed_at) \
    VALUES (?, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE changed_at = VALUES(changed_at)";

/// Records `user_id` in the write's transaction `conn`.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn record(conn: &mut MySqlConnection, user_id: u64) -> Result<()> {
    sqlx::query(RECORD).bind(user_id).execute(conn).await?;
    Ok(())
}

/// Up to `limit` users waiting for their cached state to be retired, with
/// the stamp each was read with.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn due(pool: &MySqlPool, limit: u32) -> Result<Vec<(u64, NaiveDateTime)>> {
    Ok(sqlx::query_as("SELECT user_id, changed_at FROM badge_repairs ORDER BY user_id LIMIT ?")
        .bind(limit)
        .fetch_all(pool)
        .await?)
}

/// Forgets the users whose cached state was retired, each only if no write
/// stamped it again since it was read.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn forget(pool: &MySqlPool, retired: &[(u64, NaiveDateTime)]) -> Result<()> {
    if retired.is_empty() {
        return Ok(());
    }
    let mut delete =
        QueryBuilder::new("DELETE FROM badge_repairs WHERE (user_id, changed_at) IN (");
    let mut rows = delete.separated(", ");
    for (user_id, changed_at) in retired {
        rows.push("(").push_bind_unseparated(*user_id);
        rows.push_unseparated(", ").push_bind_unseparated(*changed_at).push_unseparated(")");
    }
    delete.push(")");
    delete.build().execute(pool).await?;
    Ok(())
}

/// How many users wait on this shard.
pub async fn count(pool: &MySqlPool) -> Result<u64> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM badge_repairs").fetch_one(pool).await?;
    Ok(n.max(0) as u64)
}
