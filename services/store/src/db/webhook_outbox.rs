//! The webhook outbox (`webhook_outbox`, migration 18): a send's webhook
//! event recorded in the transaction of the change it reports, so that it
//! is queued at least once whatever fails after the commit. The process
//! that made the change queues it and [`remove`]s it; a worker's relay
//! [`claim_due`]s what is left past its due time.

use chrono::{DateTime, NaiveDateTime, SubsecRound, Utc};
use sqlx::mysql::{MySqlArguments, MySqlPool};
use sqlx::query::Query;
use sqlx::{FromRow, MySql, MySqlConnection, QueryBuilder};
use tracing::instrument;

use crate::error::Result;

/// One event of a send, as recorded and as the relay reads it back.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct OutboxEvent {
    /// 16 random bytes; every `webhook-id` of the event derives from them.
    pub event_key: Vec<u8>,
    /// The send.
    pub message_id: u64,
    /// The event's `type` (`message.completed`, ...).
    pub event: String,
    /// The chunk a `message.failed` is about.
    pub chunk_id: Option<u64>,
    /// When the change was made.
    pub created_at: NaiveDateTime,
    /// How many times the relay took the event before.
    pub attempts: u32,
}

impl OutboxEvent {
    /// A new event about `message_id`, happening now, with a fresh key.
    pub fn new(message_id: u64, event: &str, chunk_id: Option<u64>) -> Self {
        let key: [u8; 16] = rand::random();
        Self {
            event_key: key.to_vec(),
            message_id,
            event: event.to_owned(),
            chunk_id,
            // What DATETIME(3) keeps, so a record reads back equal.
            created_at: Utc::now().naive_utc().trunc_subsecs(3),
            attempts: 0,
        }
    }

    /// When the change was made, in UTC.
    pub fn created(&self) -> DateTime<Utc> {
        self.created_at.and_utc()
    }
}

/// Records `event` on `conn` (inside the change's transaction), due for the
/// relay `due_in_ms` from now.
async fn record(conn: &mut MySqlConnection, event: &OutboxEvent, due_in_ms: u64) -> Result<()> {
    sqlx::query(
        "INSERT INTO webhook_outbox (event_key, message_id, event, chunk_id, created_at, due_at) \
         VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND)",
    )
    .bind(&event.event_key)
    .bind(event.message_id)
    .bind(&event.event)
    .bind(event.chunk_id)
    .bind(event.created_at)
    .bind(due_in_ms)
    .execute(conn)
    .await?;
    Ok(())
}

/// An event to record with a change, and when the relay may take it.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The event.
    pub event: &'a OutboxEvent,
    /// How long its own process has to queue it before the relay does.
    pub due_in_ms: u64,
}

impl Record<'_> {
    /// Records the event on `conn`, inside the change's transaction.
    pub async fn write(&self, conn: &mut MySqlConnection) -> Result<()> {
        record(conn, self.event, self.due_in_ms).await
    }
}

/// Runs `change` (one statement that reports a change by touching one row)
/// and, when it did and `record` is given, records the event in the same
/// transaction. Without an event: the statement alone, no transaction.
pub async fn execute_with(
    pool: &MySqlPool,
    change: Query<'_, MySql, MySqlArguments>,
    record: Option<Record<'_>>,
) -> Result<bool> {
    let Some(record) = record else {
        return Ok(change.execute(pool).await?.rows_affected() == 1);
    };
    let mut tx = pool.begin().await?;
    let changed = change.execute(&mut *tx).await?.rows_affected() == 1;
    if changed {
        record.write(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(changed)
}

/// Forgets an event once it is queued (or can never be).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn remove(pool: &MySqlPool, event_key: &[u8]) -> Result<()> {
    sqlx::query("DELETE FROM webhook_outbox WHERE event_key = ?")
        .bind(event_key)
        .execute(pool)
        .await?;
    Ok(())
}

/// Takes up to `limit` events past their due time, oldest due first, and
/// moves their due time `lease_ms` on (in one transaction, skipping rows
/// another relay holds), so no other relay takes them meanwhile; an event
/// the caller fails to queue is due again after the lease.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn claim_due(pool: &MySqlPool, lease_ms: u64, limit: u32) -> Result<Vec<OutboxEvent>> {
    let mut tx = pool.begin().await?;
    let due: Vec<OutboxEvent> = sqlx::query_as(
        "SELECT event_key, message_id, event, chunk_id, created_at, attempts FROM webhook_outbox \
         WHERE due_at <= UTC_TIMESTAMP(3) ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    if !due.is_empty() {
        let mut lease = QueryBuilder::new(
            "UPDATE webhook_outbox SET attempts = attempts + 1, due_at = UTC_TIMESTAMP(3) + INTERVAL ",
        );
        lease.push_bind(lease_ms).push(" * 1000 MICROSECOND WHERE event_key IN (");
        let mut keys = lease.separated(", ");
        for event in &due {
            keys.push_bind(event.event_key.as_slice());
        }
        lease.push(")");
        lease.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(due)
}

/// How many events wait on this shard.
pub async fn count(pool: &MySqlPool) -> Result<u64> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM webhook_outbox").fetch_one(pool).await?;
    Ok(n.max(0) as u64)
}
