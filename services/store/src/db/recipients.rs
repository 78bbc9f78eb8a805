//! A send's recipients on one shard, read in user order from what the data
//! already holds: its chunks (each a sorted run of user ids; within one
//! batch the runs follow each other, found by `idx_chunks_recipients`), the
//! reads recorded by message (`message_reads`) and the announcements'
//! materializations (`announcement_recipients`), the record a chunk's apply
//! leaves on it (`applied_at`, `held_back`) and the users erased since a
//! send; the item of a user two chunks delivered to comes from a
//! primary-key lookup in `message_items`, which gets no index for this. A page's
//! chunks come from their index entries (one per 500 recipients past the
//! cursor), then by primary key: simple statements, cheap to plan.

use chrono::NaiveDateTime;
use sqlx::{FromRow, MySqlConnection, MySqlPool, QueryBuilder};
use tracing::instrument;

use super::chunks::{SPLIT_CHUNK_BIT, decode_user_ids};
use super::{json_ids, push_ids};
use crate::error::Result;
use notify_domain::domain::MessageId;

/// A chunk as the recipient queries read it.
#[derive(Debug, Clone)]
pub struct ChunkUsers {
    /// The chunk.
    pub chunk_id: u64,
    /// Its state.
    pub state: u8,
    /// Its batch.
    pub batch: u64,
    /// Its recipients, sorted.
    pub user_ids: Vec<u64>,
    /// What its apply recorded, once applied.
    pub applied: Option<Applied>,
}

/// What the transaction that applied a chunk recorded on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// When: the items of the chunk were written in that transaction.
    pub at: NaiveDateTime,
    /// The recipients their preferences held back (no item), sorted.
    pub held_back: Vec<u64>,
}

impl Applied {
    /// True when `user_id` was held back.
    pub fn held(&self, user_id: u64) -> bool {
        self.held_back.binary_search(&user_id).is_ok()
    }
}

#[derive(FromRow)]
struct ChunkRow {
    chunk_id: u64,
    state: u8,
    batch: u64,
    user_ids: Vec<u8>,
    applied_at: Option<NaiveDateTime>,
    held_back: Option<Vec<u8>>,
}

impl ChunkRow {
    fn decode(self) -> Result<ChunkUsers> {
        let applied = match self.applied_at {
            Some(at) => {
                let held_back = self.held_back.as_deref().map(decode_user_ids).transpose()?;
                Some(Applied { at, held_back: held_back.unwrap_or_default() })
            }
            None => None,
        };
        Ok(ChunkUsers {
            chunk_id: self.chunk_id,
            state: self.state,
            batch: self.batch,
            user_ids: decode_user_ids(&self.user_ids)?,
            applied,
        })
    }
}

/// The columns of a [`ChunkRow`] of `message_chunks c`.
const CHUNK_COLUMNS: &str = "c.chunk_id, c.state, c.batch, c.user_ids, c.applied_at, c.held_back";

/// The chunks of a send on this shard in `states` that a page after user
/// `after` needs, with their users, and the user id up to which they hold
/// every recipient of the shard in those states (`u64::MAX`: all).
///
/// Two statements, each simple to plan: the index entries of the send's
/// chunks past the cursor ([`chunk_ends_from`], index only), then by
/// primary key the chunks [`page_heads`] picks from them that start within
/// the bound. One statement with window functions did both, but MariaDB
/// planned it and materialized its ranking twice on every call, which cost
/// about twice the two reads. The chunks are read in the states asked for:
/// one that left them in between (applied, recalled) is left out, as a
/// page a moment later would leave it; one that entered them in between is
/// in the next page's reads. Either way each chunk's users are listed in a
/// state their chunk had during the call.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn chunks_after(
    conn: &mut MySqlConnection,
    message_id: MessageId,
    states: &[u8],
    after: u64,
    per_run: u32,
) -> Result<(Vec<ChunkUsers>, u64)> {
    let Some(low) = after.checked_add(1) else {
        return Ok((Vec::new(), u64::MAX));
    };
    if states.is_empty() {
        return Ok((Vec::new(), u64::MAX));
    }
    let ends = chunk_ends_from(&mut *conn, message_id, states, low).await?;
    let (wanted, complete_to) = page_heads(ends, per_run as usize);
    let chunks = chunks_in(conn, message_id, states, &wanted, complete_to).await?;
    Ok((chunks, complete_to))
}

/// The chunks `wanted` of a send, with their users, those in `states` that
/// start at or before `complete_to`: by primary key ([`page_heads`] picks
/// them from the chunk index, read now or kept).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", chunks = wanted.len()))]
pub async fn chunks_in(
    conn: &mut MySqlConnection,
    message_id: MessageId,
    states: &[u8],
    wanted: &[u64],
    complete_to: u64,
) -> Result<Vec<ChunkUsers>> {
    if wanted.is_empty() || states.is_empty() {
        return Ok(Vec::new());
    }
    let mut sql = QueryBuilder::new(format!("SELECT {CHUNK_COLUMNS} FROM JSON_TABLE("));
    sql.push_bind(json_ids(wanted))
        .push(
            ", '$[*]' COLUMNS (chunk_id BIGINT UNSIGNED PATH '$')) AS j \
             JOIN message_chunks c FORCE INDEX (PRIMARY) ON c.message_id = ",
        )
        .push_bind(message_id.get())
        .push(" AND c.chunk_id = j.chunk_id WHERE c.first_user <= ")
        .push_bind(complete_to)
        .push(" AND c.state IN (");
    let mut list = sql.separated(", ");
    for state in states {
        list.push_bind(*state);
    }
    sql.push(")");
    let rows: Vec<ChunkRow> = sql.build_query_as().fetch_all(conn).await?;
    rows.into_iter().map(ChunkRow::decode).collect()
}

/// Which of a send's chunks past the cursor (`ends`: their index entries,
/// any order) a page reads, and the user id up to which those hold every
/// recipient. Per run (the chunks of one batch in one state, whose user
/// ranges follow each other), the first `per_run` by last user: a run that
/// has more may go on past the last of those, so the least such last
/// bounds what is complete (`u64::MAX`: no run has more). Of those, the
/// chunks that start past that bound hold nothing the page can list yet,
/// and are not read (a send appended in batches of ascending ids has most
/// of its runs there).
pub fn page_heads(mut ends: Vec<ChunkEnd>, per_run: usize) -> (Vec<u64>, u64) {
    let per_run = per_run.max(1);
    ends.sort_unstable_by_key(|end| (end.state, end.batch, end.last_user));
    let runs = || ends.chunk_by(|a, b| (a.state, a.batch) == (b.state, b.batch));
    let complete_to = runs()
        .filter(|run| run.len() > per_run)
        .map(|run| run[per_run - 1].last_user)
        .min()
        .unwrap_or(u64::MAX);
    let wanted = runs()
        .flat_map(|run| run.iter().take(per_run))
        .filter(|end| end.first_user <= complete_to)
        .map(|end| end.chunk_id)
        .collect();
    (wanted, complete_to)
}

/// The users of these chunks of a send, by primary key.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", chunks = chunk_ids.len()))]
pub async fn chunk_users<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    chunk_ids: &[u64],
) -> Result<Vec<ChunkUsers>> {
    if chunk_ids.is_empty() {
        return Ok(Vec::new());
    }
    let select = format!("SELECT {CHUNK_COLUMNS} FROM message_chunks c WHERE c.message_id = ");
    let mut sql = of_send(&select, message_id, "c.chunk_id", chunk_ids);
    let rows: Vec<ChunkRow> = sql.build_query_as().fetch_all(pool).await?;
    rows.into_iter().map(ChunkRow::decode).collect()
}

/// Where a chunk's users end, as `idx_chunks_recipients` holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct ChunkEnd {
    /// The chunk.
    pub chunk_id: u64,
    /// Its state.
    pub state: u8,
    /// Its batch.
    pub batch: u64,
    /// Its last user.
    pub last_user: u64,
    /// Its first user.
    pub first_user: u64,
}

/// The send's chunks on this shard in `states` whose last user is `low` or
/// more: an index-only read.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn chunk_ends_from<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    states: &[u8],
    low: u64,
) -> Result<Vec<ChunkEnd>> {
    ends_from(pool, message_id, states, low, 0).await
}

/// The first batch of a split chunk ([`SPLIT_CHUNK_BIT`] set in its id),
/// each of which is a batch of its own: `batch` is `chunk_id >> 16` (the
/// schema's virtual column).
const FIRST_SPLIT_BATCH: u64 = SPLIT_CHUNK_BIT >> 16;

/// As [`chunk_ends_from`], only the chunks split off others during a
/// bucket move: the only chunks a send gains once it started (the chunk a
/// split takes users from only narrows). A range of each state's entries,
/// empty unless a bucket moved under the send.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn split_chunk_ends_from<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    states: &[u8],
    low: u64,
) -> Result<Vec<ChunkEnd>> {
    ends_from(pool, message_id, states, low, FIRST_SPLIT_BATCH).await
}

async fn ends_from<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    states: &[u8],
    low: u64,
    first_batch: u64,
) -> Result<Vec<ChunkEnd>> {
    if states.is_empty() {
        return Ok(Vec::new());
    }
    let mut sql = QueryBuilder::new(
        "SELECT chunk_id, state, batch, last_user, first_user FROM message_chunks \
         FORCE INDEX (idx_chunks_recipients) WHERE message_id = ",
    );
    sql.push_bind(message_id.get()).push(" AND state IN (");
    let mut list = sql.separated(", ");
    for state in states {
        list.push_bind(*state);
    }
    sql.push(")");
    if first_batch > 0 {
        sql.push(" AND batch >= ").push_bind(first_batch);
    }
    sql.push(" AND last_user >= ").push_bind(low);
    Ok(sql.build_query_as().fetch_all(pool).await?)
}

/// A user found in a chunk of a send by [`chunks_holding`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct Held {
    /// The user.
    pub user_id: u64,
    /// The chunk.
    pub chunk_id: u64,
    /// Its state.
    pub state: u8,
    /// Where the user's 8 bytes first occur in the chunk's `user_ids`
    /// (1-based): at an aligned offset the user is in the chunk; elsewhere
    /// (the bytes straddle two ids) the caller must decode the chunk.
    pub position: u64,
    /// Where they first occur in the chunk's `held_back` (1-based, 0: not
    /// at all, or no apply recorded it), aligned likewise when the chunk's
    /// apply held the user back.
    pub held_position: u64,
}

/// Which of these (chunk, user) pairs of a send hold the user, tested in
/// the database (the chunks' user ids never travel): one statement whatever
/// the number of pairs (a JSON array joined by primary key, so its prepared
/// form is reused), reading each chunk once when the pairs come sorted by
/// chunk, and skipping chunks that start past the user before searching.
/// A user found is also searched for among the ones the chunk's apply
/// recorded as held back.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", pairs = pairs.len()))]
pub async fn chunks_holding(
    pool: &MySqlPool,
    message_id: MessageId,
    pairs: &[(u64, u64)],
) -> Result<Vec<Held>> {
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let mut json = String::with_capacity(pairs.len() * 48);
    json.push('[');
    for (index, (chunk_id, user_id)) in pairs.iter().enumerate() {
        if index > 0 {
            json.push(',');
        }
        let bytes = hex(&user_id.to_le_bytes());
        json.push_str(&format!("[{chunk_id},{user_id},\"{bytes}\"]"));
    }
    json.push(']');
    Ok(sqlx::query_as(
        "SELECT p.user_id, c.chunk_id, c.state, \
         CAST(INSTR(c.user_ids, UNHEX(p.bytes)) AS UNSIGNED) AS position, \
         CAST(COALESCE(INSTR(c.held_back, UNHEX(p.bytes)), 0) AS UNSIGNED) AS held_position \
         FROM JSON_TABLE(?, '$[*]' COLUMNS (chunk_id BIGINT UNSIGNED PATH '$[0]', \
         user_id BIGINT UNSIGNED PATH '$[1]', bytes CHAR(16) PATH '$[2]')) AS p \
         JOIN message_chunks c FORCE INDEX (PRIMARY) \
         ON c.message_id = ? AND c.chunk_id = p.chunk_id \
         WHERE c.first_user <= p.user_id AND c.last_user >= p.user_id \
         AND INSTR(c.user_ids, UNHEX(p.bytes)) > 0",
    )
    .bind(json)
    .bind(message_id.get())
    .fetch_all(pool)
    .await?)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A recipient's item of a send, as the recipient queries read it.
#[derive(Debug, Clone, FromRow)]
pub struct ItemRow {
    /// The recipient.
    pub user_id: u64,
    /// Read (and not marked unread since).
    pub is_read: bool,
    /// When the item was written (delivered or materialized).
    pub created_at: NaiveDateTime,
    /// When it was read.
    pub read_at: Option<NaiveDateTime>,
}

/// The items of a send these users have on this shard (deleted ones
/// included: they were delivered): primary-key lookups, in one statement
/// whatever the number of users (a JSON array joined by primary key), so
/// its prepared form is reused rather than prepared again for each length
/// of an `IN` list.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", users = user_ids.len()))]
pub async fn items<'e>(
    conn: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    user_ids: &[u64],
) -> Result<Vec<ItemRow>> {
    if user_ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_as(concat!(
        "SELECT i.user_id, i.is_read, i.created_at, ",
        read_time!("i"),
        " AS read_at FROM JSON_TABLE(?, '$[*]' COLUMNS (user_id BIGINT UNSIGNED PATH '$')) AS j \
             JOIN message_items i FORCE INDEX (PRIMARY) \
             ON i.user_id = j.user_id AND i.message_id = ?"
    ))
    .bind(json_ids(user_ids))
    .bind(message_id.get())
    .fetch_all(conn)
    .await?)
}

/// What a shard records of a send's recipients in a range of user ids
/// besides their chunks: reads and erasures ([`marks_between`]).
#[derive(Debug, Clone, FromRow)]
pub struct Mark {
    /// The user.
    pub user_id: u64,
    /// When they read it (a read recorded by message); `None` for an
    /// erasure.
    pub read_at: Option<NaiveDateTime>,
    /// The user was erased after the send was written (their item, if they
    /// had one, is gone).
    pub erased: bool,
}

/// The reads of a send recorded on this shard for users in `from..=to` (a
/// range of `message_reads`' primary key: at most one row per recipient in
/// the range), and the users in that range erased since the send was
/// written (`idx_user_preferences_erased`: only users erased after it), in
/// one statement. The caller keeps the rows of users routed to this shard
/// (a bucket move leaves copies behind for a while).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn marks_between<'e>(
    conn: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    from: u64,
    to: u64,
) -> Result<Vec<Mark>> {
    Ok(sqlx::query_as(
        "SELECT r.user_id, r.read_at, FALSE AS erased FROM message_reads r FORCE INDEX (PRIMARY) \
         WHERE r.message_id = ? AND r.user_id BETWEEN ? AND ? \
         UNION ALL SELECT p.user_id, NULL, TRUE FROM user_preferences p \
         FORCE INDEX (idx_user_preferences_erased) \
         WHERE p.erased_before > ? AND p.user_id BETWEEN ? AND ?",
    )
    .bind(message_id.get())
    .bind(from)
    .bind(to)
    .bind(message_id.get())
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await?)
}

/// A recorded read.
#[derive(Debug, Clone, FromRow)]
pub struct ReadRow {
    /// The reader.
    pub user_id: u64,
    /// When they read it.
    pub read_at: NaiveDateTime,
    /// When the item was delivered; `None` if the read was recorded without
    /// it (by an older build) and the item is gone meanwhile.
    pub delivered_at: Option<NaiveDateTime>,
}

/// Up to `limit` readers of a send on this shard after user `after`, in user
/// order: a range of `message_reads`' primary key, the row holding the
/// read's time and the item's delivery, so a page of readers reads this
/// table alone.
///
/// A recorded read is the item's read: the update that reads or unreads an
/// item by id writes or deletes its row in the same transaction; a filtered
/// one's rows follow when its backlog row is counted (at once, by the
/// process that wrote it: [`super::read_backlog`]).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn reads_after<'e>(
    conn: impl sqlx::MySqlExecutor<'e>,
    message_id: MessageId,
    after: u64,
    limit: u32,
) -> Result<Vec<ReadRow>> {
    Ok(sqlx::query_as(
        "SELECT r.user_id, r.read_at, r.delivered_at FROM message_reads r FORCE INDEX (PRIMARY) \
         WHERE r.message_id = ? AND r.user_id > ? ORDER BY r.user_id LIMIT ?",
    )
    .bind(message_id.get())
    .bind(after)
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// A user who has an announcement materialized, with the item.
#[derive(Debug, Clone, FromRow)]
pub struct MaterializedRow {
    /// The user.
    pub user_id: u64,
    /// When it was materialized.
    pub materialized_at: NaiveDateTime,
    /// Read (false when the item is gone meanwhile).
    pub is_read: bool,
    /// When it was read.
    pub read_at: Option<NaiveDateTime>,
}

/// Up to `limit` users after `after` who have an announcement materialized
/// on this shard, in user order: a range of `announcement_recipients`'
/// primary key, and one item lookup each.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn materialized_after(
    pool: &MySqlPool,
    message_id: MessageId,
    after: u64,
    limit: u32,
) -> Result<Vec<MaterializedRow>> {
    Ok(sqlx::query_as(concat!(
        "SELECT r.user_id, r.materialized_at, COALESCE(i.is_read, 0) = 1 AS is_read, ",
        read_time!("i"),
        " AS read_at FROM announcement_recipients r FORCE INDEX (PRIMARY) \
         LEFT JOIN message_items i FORCE INDEX (PRIMARY) \
         ON i.user_id = r.user_id AND i.message_id = r.message_id \
         WHERE r.message_id = ? AND r.user_id > ? ORDER BY r.user_id LIMIT ?"
    ))
    .bind(message_id.get())
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Those of `user_ids` who have an announcement materialized on this shard.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", users = user_ids.len()))]
pub async fn materialized(
    pool: &MySqlPool,
    message_id: MessageId,
    user_ids: &[u64],
) -> Result<Vec<MaterializedRow>> {
    if user_ids.is_empty() {
        return Ok(Vec::new());
    }
    let select = concat!(
        "SELECT r.user_id, r.materialized_at, COALESCE(i.is_read, 0) = 1 AS is_read, ",
        read_time!("i"),
        " AS read_at FROM announcement_recipients r FORCE INDEX (PRIMARY) \
         LEFT JOIN message_items i FORCE INDEX (PRIMARY) \
         ON i.user_id = r.user_id AND i.message_id = r.message_id WHERE r.message_id = "
    );
    let mut sql = of_send(select, message_id, "r.user_id", user_ids);
    Ok(sql.build_query_as().fetch_all(pool).await?)
}

/// `select` (ending in `... message_id = `) for one send, with `column`
/// in `ids`: the shape of every by-id read here.
fn of_send(
    select: &str,
    message_id: MessageId,
    column: &str,
    ids: &[u64],
) -> QueryBuilder<sqlx::MySql> {
    let mut sql = QueryBuilder::new(select);
    sql.push_bind(message_id.get()).push(format!(" AND {column} IN ("));
    push_ids(&mut sql, ids);
    sql.push(")");
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk of ten users ending at `last_user`.
    fn end(chunk_id: u64, state: u8, batch: u64, last_user: u64) -> ChunkEnd {
        ChunkEnd { chunk_id, state, batch, last_user, first_user: last_user - 9 }
    }

    #[test]
    fn a_page_reads_the_first_chunks_of_each_run_up_to_the_least_complete_one() {
        // Run (1, 1): chunks ending at 10, 20, 30, 40; run (1, 2): 15, 25;
        // run (2, 1): 12, 22, 32.
        let ends = vec![
            end(4, 1, 1, 40),
            end(1, 1, 1, 10),
            end(12, 1, 2, 25),
            end(3, 1, 1, 30),
            end(2, 1, 1, 20),
            end(11, 1, 2, 15),
            end(23, 2, 1, 32),
            end(21, 2, 1, 12),
            end(22, 2, 1, 22),
        ];
        let (wanted, complete_to) = page_heads(ends.clone(), 2);
        // (1, 1) and (2, 1) have more than two: complete up to the lesser
        // of their second ends; (1, 2) has two and is complete.
        assert_eq!(complete_to, 20);
        assert_eq!(wanted, [1, 2, 11, 12, 21, 22]);
        // Runs with no more than `per_run` chunks are complete.
        let (wanted, complete_to) = page_heads(ends, 4);
        assert_eq!(complete_to, u64::MAX);
        assert_eq!(wanted.len(), 9);
        assert_eq!(page_heads(Vec::new(), 3), (Vec::new(), u64::MAX));
    }

    #[test]
    fn a_page_skips_chunks_that_start_past_what_it_can_list() {
        // Batch 1 holds users up to 40, batch 2 from 101: its first chunk
        // starts past batch 1's bound and holds nothing the page lists.
        let ends = vec![end(1, 1, 1, 20), end(2, 1, 1, 40), end(11, 1, 2, 110), end(12, 1, 2, 120)];
        let (wanted, complete_to) = page_heads(ends, 1);
        assert_eq!(complete_to, 20);
        assert_eq!(wanted, [1]);
    }
}
