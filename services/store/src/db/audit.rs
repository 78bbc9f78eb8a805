//! The audit log on a shard: one row per lifecycle or admin action.

use chrono::NaiveDateTime;
use sqlx::{FromRow, MySqlPool};
use tracing::instrument;

use crate::error::Result;

/// A stored audit record.
#[derive(Debug, Clone, FromRow, PartialEq, Eq)]
pub struct AuditRow {
    /// Time-ordered id.
    pub audit_id: u64,
    /// When the action ended.
    pub at: NaiveDateTime,
    /// The client that acted.
    pub client: String,
    /// What it did (`message.pause`, ...).
    pub action: String,
    /// `message`, `group` or empty.
    pub target_kind: String,
    /// The message or group id, 0 without a target.
    pub target_id: u64,
    /// `ok` or the gRPC code of the failure.
    pub outcome: String,
    /// Free text: sizes, the scope that was missing, ...
    pub detail: String,
}

/// Inserts one record.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn insert(pool: &MySqlPool, row: &AuditRow) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit_log (audit_id, at, client, action, target_kind, target_id, outcome, detail) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(row.audit_id)
    .bind(row.at)
    .bind(&row.client)
    .bind(&row.action)
    .bind(&row.target_kind)
    .bind(row.target_id)
    .bind(&row.outcome)
    .bind(&row.detail)
    .execute(pool)
    .await?;
    Ok(())
}

const COLUMNS: &str = "audit_id, at, client, action, target_kind, target_id, outcome, detail";

/// Records of one target with ids below `before`, newest first.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn by_target(
    pool: &MySqlPool,
    kind: &str,
    id: u64,
    before: u64,
    limit: u32,
) -> Result<Vec<AuditRow>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM audit_log WHERE target_kind = ? AND target_id = ? AND audit_id < ? \
         ORDER BY audit_id DESC LIMIT ?"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(kind)
        .bind(id)
        .bind(before)
        .bind(limit)
        .fetch_all(pool)
        .await?)
}

/// Records of one client on this shard with ids below `before`, newest first.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn by_client(
    pool: &MySqlPool,
    client: &str,
    before: u64,
    limit: u32,
) -> Result<Vec<AuditRow>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM audit_log WHERE client = ? AND audit_id < ? \
         ORDER BY audit_id DESC LIMIT ?"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(client)
        .bind(before)
        .bind(limit)
        .fetch_all(pool)
        .await?)
}
