//! Control operations on a send (cancel, recall, edit) as durable intents:
//! `message_operations` on the send's home shard (migration 28). An
//! operation is [`record`]ed in the transaction that changes the send's
//! status or content, leased to the caller that recorded it; whoever holds
//! the lease drives it shard by shard (`notify_core::control`), marks each
//! shard's visible part [`shard_done`], and [`finish`]es it once every part
//! is done. A drive that fails [`release`]s the lease to be tried again
//! later; one that dies lets it run out, and a sweeper [`claim_due`]s it.

use chrono::NaiveDateTime;
use sqlx::{FromRow, MySqlConnection, MySqlPool};
use tracing::instrument;

use crate::error::Result;
use notify_domain::Error;
use notify_domain::domain::MessageId;

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationKind {
    /// A cancel: the pending chunks are cancelled; an announcement's
    /// content copies are revoked.
    Cancel = 1,
    /// A recall: the content copies are revoked, the pending chunks
    /// cancelled and the delivered ones taken back.
    Recall = 2,
    /// An edit: the content copies take the home record's content.
    Edit = 3,
}

impl OperationKind {
    /// Every kind, as stored.
    pub const ALL: [Self; 3] = [Self::Cancel, Self::Recall, Self::Edit];

    /// Decodes a stored kind.
    pub fn from_db(value: u8) -> notify_domain::Result<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| *kind as u8 == value)
            .ok_or_else(|| Error::Internal(format!("unknown operation kind {value}")))
    }

    /// Its name, for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Recall => "recall",
            Self::Edit => "edit",
        }
    }
}

/// Which cached badges and pages an operation retires once it changed a
/// shard's content copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Retire {
    /// None: nothing of the send was delivered (a cancel, a recall of a send
    /// that never started).
    Nothing = 0,
    /// The send's recipients', read from its delivered chunks on each shard.
    Recipients = 1,
    /// Every user's (the announcement epoch): an announcement, whose
    /// audience is everyone, or a send too large to retire one by one.
    Everyone = 2,
}

impl Retire {
    fn from_db(value: u8) -> Self {
        match value {
            0 => Self::Nothing,
            1 => Self::Recipients,
            _ => Self::Everyone,
        }
    }
}

/// An operation as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// The send.
    pub message_id: MessageId,
    /// What it does.
    pub kind: OperationKind,
    /// Grows each time the operation is asked for again.
    pub generation: u32,
    /// Which cached badges and pages it retires.
    pub retire: Retire,
    /// Shards whose visible part is done for this generation.
    pub shards_done: Vec<u32>,
    /// The lease its current driver holds.
    pub lease_token: u64,
    /// How many drives took it from the sweeper.
    pub attempts: u32,
    /// When it was first recorded.
    pub created_at: NaiveDateTime,
}

impl Operation {
    /// True when `shard`'s visible part is done.
    pub fn is_done_on(&self, shard: u32) -> bool {
        self.shards_done.contains(&shard)
    }
}

#[derive(FromRow)]
struct OperationRow {
    message_id: u64,
    kind: u8,
    generation: u32,
    retire: u8,
    shards_done: String,
    lease_token: u64,
    attempts: u32,
    created_at: NaiveDateTime,
}

impl TryFrom<OperationRow> for Operation {
    type Error = Error;

    fn try_from(row: OperationRow) -> notify_domain::Result<Self> {
        let shards_done = row
            .shards_done
            .split(',')
            .filter(|part| !part.is_empty())
            .map(|part| {
                part.parse().map_err(|_| Error::Internal(format!("operation shards_done {part:?}")))
            })
            .collect::<notify_domain::Result<_>>()?;
        Ok(Self {
            message_id: MessageId::from_raw(row.message_id),
            kind: OperationKind::from_db(row.kind)?,
            generation: row.generation,
            retire: Retire::from_db(row.retire),
            shards_done,
            lease_token: row.lease_token,
            attempts: row.attempts,
            created_at: row.created_at,
        })
    }
}

const COLUMNS: &str =
    "message_id, kind, generation, retire, shards_done, lease_token, attempts, created_at";

/// Records `kind` on `message_id` in the caller's transaction `conn` (the
/// one that changes the send's status or content), leased for `lease_ms`
/// to `token`. Asked for again while one is pending, the operation starts
/// over at the next generation (no shard done), retiring at least what
/// either asked for. Returns the operation as recorded.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn record(
    conn: &mut MySqlConnection,
    message_id: MessageId,
    kind: OperationKind,
    retire: Retire,
    token: u64,
    lease_ms: u64,
) -> Result<Operation> {
    sqlx::query(
        "INSERT INTO message_operations (message_id, kind, retire, leased_until, lease_token) \
         VALUES (?, ?, ?, UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND, ?) \
         ON DUPLICATE KEY UPDATE generation = generation + 1, \
         retire = GREATEST(retire, VALUES(retire)), shards_done = '', \
         leased_until = VALUES(leased_until), lease_token = VALUES(lease_token)",
    )
    .bind(message_id.get())
    .bind(kind as u8)
    .bind(retire as u8)
    .bind(lease_ms)
    .bind(token)
    .execute(&mut *conn)
    .await?;
    let sql = format!("SELECT {COLUMNS} FROM message_operations WHERE message_id = ? AND kind = ?");
    let row: OperationRow = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(message_id.get())
        .bind(kind as u8)
        .fetch_one(&mut *conn)
        .await?;
    Ok(row.try_into()?)
}

/// Reads one operation (`None` once it finished).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn get(
    pool: &MySqlPool,
    message_id: MessageId,
    kind: OperationKind,
) -> Result<Option<Operation>> {
    let sql = format!("SELECT {COLUMNS} FROM message_operations WHERE message_id = ? AND kind = ?");
    let row: Option<OperationRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(message_id.get())
        .bind(kind as u8)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(Operation::try_from).transpose()?)
}

/// The kinds of a send's operations not finished yet.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn pending_kinds(pool: &MySqlPool, message_id: MessageId) -> Result<Vec<OperationKind>> {
    let kinds: Vec<u8> = sqlx::query_scalar(
        "SELECT kind FROM message_operations WHERE message_id = ? ORDER BY kind",
    )
    .bind(message_id.get())
    .fetch_all(pool)
    .await?;
    Ok(kinds.into_iter().map(OperationKind::from_db).collect::<notify_domain::Result<_>>()?)
}

/// Takes up to `limit` operations of this home shard whose lease ran out
/// (their driver died, gave them back, or waits for them), oldest lease
/// first, each leased to `token` for `lease_ms`: locked with `SKIP LOCKED`
/// and leased in one transaction, so two sweepers never take the same one.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn claim_due(
    pool: &MySqlPool,
    token: u64,
    lease_ms: u64,
    limit: u32,
) -> Result<Vec<Operation>> {
    let mut tx = pool.begin().await?;
    let sql = format!(
        "SELECT {COLUMNS} FROM message_operations FORCE INDEX (idx_operations_due) \
         WHERE leased_until <= UTC_TIMESTAMP(3) ORDER BY leased_until LIMIT ? \
         FOR UPDATE SKIP LOCKED"
    );
    let rows: Vec<OperationRow> =
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(limit).fetch_all(&mut *tx).await?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        let mut operation = Operation::try_from(row)?;
        sqlx::query(
            "UPDATE message_operations SET leased_until = UTC_TIMESTAMP(3) + INTERVAL ? * 1000 \
             MICROSECOND, lease_token = ?, attempts = attempts + 1 WHERE message_id = ? AND kind = ?",
        )
        .bind(lease_ms)
        .bind(token)
        .bind(operation.message_id.get())
        .bind(operation.kind as u8)
        .execute(&mut *tx)
        .await?;
        operation.lease_token = token;
        operation.attempts += 1;
        claimed.push(operation);
    }
    tx.commit().await?;
    Ok(claimed)
}

/// Extends the lease `token` holds by `lease_ms` from now. False when the
/// lease is no longer `token`'s (it ran out and another driver took it, or
/// the operation finished): the caller stops driving.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn renew(
    pool: &MySqlPool,
    message_id: MessageId,
    kind: OperationKind,
    token: u64,
    lease_ms: u64,
) -> Result<bool> {
    let renewed = sqlx::query(
        "UPDATE message_operations SET leased_until = UTC_TIMESTAMP(3) + INTERVAL ? * 1000 \
         MICROSECOND WHERE message_id = ? AND kind = ? AND lease_token = ?",
    )
    .bind(lease_ms)
    .bind(message_id.get())
    .bind(kind as u8)
    .bind(token)
    .execute(pool)
    .await?;
    Ok(renewed.rows_affected() == 1)
}

/// Records `shard`'s visible part of `generation` done (a no-op once the
/// operation was asked for again: the new generation does it again).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn shard_done(
    pool: &MySqlPool,
    message_id: MessageId,
    kind: OperationKind,
    generation: u32,
    shard: u32,
) -> Result<()> {
    sqlx::query(
        "UPDATE message_operations SET shards_done = CONCAT_WS(',', NULLIF(shards_done, ''), ?) \
         WHERE message_id = ? AND kind = ? AND generation = ? AND NOT FIND_IN_SET(?, shards_done)",
    )
    .bind(shard.to_string())
    .bind(message_id.get())
    .bind(kind as u8)
    .bind(generation)
    .bind(shard.to_string())
    .execute(pool)
    .await?;
    Ok(())
}

/// Ends an operation whose every part is done: deleted, unless it was
/// asked for again since `generation` (the newer one is still to drive).
/// Returns true when this call ended it.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn finish(
    pool: &MySqlPool,
    message_id: MessageId,
    kind: OperationKind,
    generation: u32,
) -> Result<bool> {
    let finished = sqlx::query(
        "DELETE FROM message_operations WHERE message_id = ? AND kind = ? AND generation = ?",
    )
    .bind(message_id.get())
    .bind(kind as u8)
    .bind(generation)
    .execute(pool)
    .await?;
    Ok(finished.rows_affected() == 1)
}

/// Gives the lease `token` holds back, to be taken again `retry_ms` from
/// now, noting why the drive stopped (`error`, empty when it waits for
/// work in flight rather than failed).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn release(
    pool: &MySqlPool,
    message_id: MessageId,
    kind: OperationKind,
    token: u64,
    retry_ms: u64,
    error: &str,
) -> Result<()> {
    let error: String = error.chars().take(255).collect();
    sqlx::query(
        "UPDATE message_operations SET leased_until = UTC_TIMESTAMP(3) + INTERVAL ? * 1000 \
         MICROSECOND, last_error = ? WHERE message_id = ? AND kind = ? AND lease_token = ?",
    )
    .bind(retry_ms)
    .bind(error)
    .bind(message_id.get())
    .bind(kind as u8)
    .bind(token)
    .execute(pool)
    .await?;
    Ok(())
}

/// Counts this home shard's operations not finished, and the age in
/// seconds of the oldest (0 when none): what the alert on stuck control
/// operations reads.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn summary(pool: &MySqlPool) -> Result<(u64, f64)> {
    let (count, oldest): (i64, Option<f64>) = sqlx::query_as(
        "SELECT COUNT(*), CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(3)) \
         AS DOUBLE) / 1e6 FROM message_operations",
    )
    .fetch_one(pool)
    .await?;
    Ok((count.max(0) as u64, oldest.unwrap_or(0.0).max(0.0)))
}
