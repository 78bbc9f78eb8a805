//! The `item.read` feed (`read_feed`, migration 21, on the user's shard):
//! reads waiting to be queued as `item.read` webhooks, written in the
//! transaction of the read they report, so none is lost whatever fails
//! after its commit.
//!
//! Written only while some endpoint asked for `item.read` (the writers
//! pass `feed`): by an update by ids ([`super::item_updates`], one row per
//! item it changed to read, [`record`]) and by the count of a filtered
//! read ([`super::read_backlog::apply`], one row per item read when it
//! counts). A worker's relay [`take`]s the rows a batch at a time and
//! [`Taken::forget`]s those it queued in the same transaction.

use chrono::NaiveDateTime;
use sqlx::{FromRow, MySql, MySqlPool, Transaction};
use tracing::instrument;

use crate::error::Result;

/// The statement an update by ids records its reads with, a script's
/// template ([`super::script`]): `?` is the update's selection of the items
/// `i` it is about to change (a `WHERE`). One row per item, read now. A row
/// still waiting for the relay (read, unread, read again) is reported once,
/// with the last read's time.
pub(crate) const RECORD: &str = "INSERT INTO read_feed (message_id, user_id, read_at) \
     SELECT i.message_id, i.user_id, UTC_TIMESTAMP(3) FROM message_items i ? \
     ON DUPLICATE KEY UPDATE read_at = VALUES(read_at)";

/// One read waiting to be queued.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct FeedRead {
    /// The message read.
    pub message_id: u64,
    /// Its reader.
    pub user_id: u64,
    /// When it was read (the last time, if more than once).
    pub read_at: NaiveDateTime,
}

/// Reads taken from one shard, held locked by an open transaction until
/// they are forgotten (queued) or the value is dropped (given back).
#[derive(Debug)]
pub struct Taken {
    tx: Transaction<'static, MySql>,
    /// The reads, ordered by message, then user.
    pub reads: Vec<FeedRead>,
}

/// Whether any read waits on this shard: one plain read, no lock, no
/// transaction (what a relay asks before it opens a take, so an idle feed
/// costs one round trip per shard and run).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn any_waiting(pool: &MySqlPool) -> Result<bool> {
    let (any,): (bool,) =
        sqlx::query_as("SELECT EXISTS (SELECT 1 FROM read_feed)").fetch_one(pool).await?;
    Ok(any)
}

/// Takes up to `limit` waiting reads, ordered by message then user, locked
/// in a transaction of their own. READ COMMITTED with `SKIP LOCKED`: rows
/// another relay holds, or a read has not committed yet, are passed over
/// (they are another take's), and no gap is locked, so reads go on adding
/// rows meanwhile; a row a read wants to write again waits for this take
/// to end, which is why the caller should hold it for no longer than its
/// queueing takes.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn take(pool: &MySqlPool, limit: u32) -> Result<Taken> {
    // One text, so that the level never outlives this transaction on a
    // pooled connection (it applies to the next transaction only).
    let mut tx = pool
        .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
        .await?;
    let reads = sqlx::query_as(
        "SELECT message_id, user_id, read_at FROM read_feed \
         ORDER BY message_id, user_id LIMIT ? FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    Ok(Taken { tx, reads })
}

impl Taken {
    /// Deletes `reads` (queued, or never to be: nobody wants them) and
    /// ends the take; the rest of what was taken waits for another.
    pub async fn forget(mut self, reads: &[&FeedRead]) -> Result<()> {
        if !reads.is_empty() {
            let pairs: Vec<[u64; 2]> = reads.iter().map(|r| [r.message_id, r.user_id]).collect();
            let pairs = serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".to_owned());
            sqlx::query(
                "DELETE f FROM JSON_TABLE(?, '$[*]' COLUMNS (\
                 message_id BIGINT UNSIGNED PATH '$[0]', user_id BIGINT UNSIGNED PATH '$[1]')) j \
                 STRAIGHT_JOIN read_feed f ON f.message_id = j.message_id AND f.user_id = j.user_id",
            )
            .bind(pairs)
            .execute(&mut *self.tx)
            .await?;
        }
        self.tx.commit().await?;
        Ok(())
    }
}

/// Reads waiting on this shard (all users): 0 once the relay queued them.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn count(pool: &MySqlPool) -> Result<u64> {
    let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM read_feed").fetch_one(pool).await?;
    Ok(count.max(0) as u64)
}
