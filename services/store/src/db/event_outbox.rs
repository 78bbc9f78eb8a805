//! Gateway events recorded with the change they report (`event_outbox`,
//! migration 28): the transaction that makes a change also records the
//! event ([`record`], or [`RECORD`] and [`RECORDED_ID`] inside a script),
//! so the event outlives whatever fails after the commit. The process that
//! made the change publishes it and [`remove`]s the row; a worker's relay
//! [`claim_due`]s rows left past their due time, publishes them and deletes
//! them in the transaction that claimed them.

use sqlx::{MySqlConnection, MySqlPool, QueryBuilder};
use tracing::instrument;

use crate::error::Result;

/// A recorded event, as the relay reads it back.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Recorded {
    /// Its row.
    pub id: u64,
    /// The event, as published.
    pub body: Vec<u8>,
}

/// The statement that records an event (`?`: its body, bound, or written
/// in by a script as a hex literal, [`super::script`]).
pub(crate) const RECORD: &str = "INSERT INTO event_outbox (body) VALUES (?)";

/// The statement that follows [`RECORD`] in a script: its row id (one row,
/// one column).
pub(crate) const RECORDED_ID: &str = "SELECT LAST_INSERT_ID()";

/// Records `body` in the caller's transaction `conn`; returns its row id.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn record(conn: &mut MySqlConnection, body: &[u8]) -> Result<u64> {
    let done = sqlx::query(RECORD).bind(body).execute(conn).await?;
    Ok(done.last_insert_id())
}

/// Deletes published events' rows.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn remove(pool: &MySqlPool, ids: &[u64]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut delete = QueryBuilder::new("DELETE FROM event_outbox WHERE id IN (");
    super::push_ids(&mut delete, ids);
    delete.push(")");
    delete.build().execute(pool).await?;
    Ok(())
}

/// Takes up to `limit` events recorded over `older_than_ms` ago (their
/// process did not publish them, or died first), oldest first, skipping rows
/// another relay holds, and hands them to `publish` inside the transaction
/// that deletes the ones it returns: a row is gone only once `publish`
/// returned `Ok` naming it (one it leaves waits for a later run).
/// Returns how many were published.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn relay<F, Fut>(
    pool: &MySqlPool,
    older_than_ms: u64,
    limit: u32,
    publish: F,
) -> Result<u64>
where
    F: FnOnce(Vec<Recorded>) -> Fut,
    Fut: Future<Output = Result<Vec<u64>>>,
{
    let mut tx = pool.begin().await?;
    let due: Vec<Recorded> = sqlx::query_as(
        "SELECT id, body FROM event_outbox \
         WHERE created_at < UTC_TIMESTAMP(3) - INTERVAL ? * 1000 MICROSECOND \
         ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
    )
    .bind(older_than_ms)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    if due.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    let ids = publish(due).await?;
    if ids.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    let mut delete = QueryBuilder::new("DELETE FROM event_outbox WHERE id IN (");
    super::push_ids(&mut delete, &ids);
    delete.push(")");
    delete.build().execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(ids.len() as u64)
}

/// How many events wait on this shard.
pub async fn count(pool: &MySqlPool) -> Result<u64> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM event_outbox").fetch_one(pool).await?;
    Ok(n.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::script::{Arg, Sql};

    #[test]
    fn a_script_records_its_body_as_hex_with_nothing_to_escape() {
        let body = br#"{"t":"badges","u":[42]}'; DROP"#;
        let insert = Sql::new(RECORD, &[Arg::Bytes(body)]);
        let insert = insert.as_str();
        assert!(insert.starts_with("INSERT INTO event_outbox (body) VALUES (X'7B2274223A"));
        assert!(!insert[..insert.len() - 2].contains("';"), "{insert}");
    }
}
