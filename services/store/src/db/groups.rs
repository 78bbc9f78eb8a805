//! Groups in MySQL: the group row, seq counter and messages on the group's
//! home shard; each member's cursor on the member's shard.

use chrono::NaiveDateTime;
use sqlx::{FromRow, MySqlConnection, MySqlPool, QueryBuilder};
use tracing::instrument;

use super::push_ids;
use crate::error::Result;
use notify_domain::Error;
use notify_domain::domain::{Content, GroupCursor, GroupSeq, encode_seq_list, parse_seq_list};

/// Rows (or ids) per statement when adding or removing members, or reading
/// max seqs.
const MEMBER_ROWS_PER_STATEMENT: usize = 1000;

/// Outcome of creating a group row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreatedGroup {
    /// The group was created.
    Created,
    /// A group with this id exists already, under this name.
    Exists(String),
}

/// Creates a group and its seq counter (at 0) in one transaction.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn create_group(pool: &MySqlPool, group_id: u64, name: &str) -> Result<CreatedGroup> {
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT IGNORE INTO message_groups (group_id, name, created_at) \
         VALUES (?, ?, UTC_TIMESTAMP(3))",
    )
    .bind(group_id)
    .bind(name)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        let name: String = sqlx::query_scalar("SELECT name FROM message_groups WHERE group_id = ?")
            .bind(group_id)
            .fetch_one(&mut *tx)
            .await?;
        tx.rollback().await?;
        return Ok(CreatedGroup::Exists(name));
    }
    sqlx::query("INSERT INTO group_seqs (group_id, max_seq) VALUES (?, 0)")
        .bind(group_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(CreatedGroup::Created)
}

/// Returns true when the group exists.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn group_exists(pool: &MySqlPool, group_id: u64) -> Result<bool> {
    let found: Option<u64> =
        sqlx::query_scalar("SELECT group_id FROM message_groups WHERE group_id = ?")
            .bind(group_id)
            .fetch_optional(pool)
            .await?;
    Ok(found.is_some())
}

/// Locks the group row for a member change (member changes of one group
/// queue behind each other; sends do not wait). Returns false when the
/// group does not exist.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn lock_group(conn: &mut MySqlConnection, group_id: u64) -> Result<bool> {
    let found: Option<u64> =
        sqlx::query_scalar("SELECT group_id FROM message_groups WHERE group_id = ? FOR UPDATE")
            .bind(group_id)
            .fetch_optional(conn)
            .await?;
    Ok(found.is_some())
}

/// Reads a group's max seq, `None` when the group does not exist.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn max_seq<'e>(
    executor: impl sqlx::MySqlExecutor<'e>,
    group_id: u64,
) -> Result<Option<u64>> {
    Ok(sqlx::query_scalar("SELECT max_seq FROM group_seqs WHERE group_id = ?")
        .bind(group_id)
        .fetch_optional(executor)
        .await?)
}

/// The seq before the group's oldest kept message (older ones went with
/// retention), or `None` when it keeps none.
pub async fn before_oldest_kept<'e>(
    executor: impl sqlx::MySqlExecutor<'e>,
    group_id: u64,
) -> Result<Option<u64>> {
    let oldest: Option<u64> =
        sqlx::query_scalar("SELECT MIN(seq) FROM group_messages WHERE group_id = ?")
            .bind(group_id)
            .fetch_one(executor)
            .await?;
    Ok(oldest.map(|seq| seq - 1))
}

/// Reads the seq states (max seq and recalled seqs) of groups on one shard
/// (unknown groups are left out).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn seq_states(pool: &MySqlPool, group_ids: &[u64]) -> Result<Vec<(u64, GroupSeq)>> {
    let mut found = Vec::with_capacity(group_ids.len());
    for batch in group_ids.chunks(MEMBER_ROWS_PER_STATEMENT) {
        let mut select = QueryBuilder::new(
            "SELECT group_id, max_seq, recalled_seqs FROM group_seqs WHERE group_id IN (",
        );
        push_ids(&mut select, batch);
        select.push(")");
        let rows: Vec<(u64, u64, Option<String>)> = select.build_query_as().fetch_all(pool).await?;
        for (group_id, max_seq, recalled) in rows {
            found.push((group_id, seq_state(group_id, max_seq, recalled.as_deref())?));
        }
    }
    Ok(found)
}

fn seq_state(group_id: u64, max_seq: u64, recalled: Option<&str>) -> Result<GroupSeq> {
    let recalled = parse_seq_list(recalled.unwrap_or("")).ok_or_else(|| {
        Error::Internal(format!("group {group_id}: malformed recalled_seqs {recalled:?}"))
    })?;
    Ok(GroupSeq { max_seq, recalled })
}

/// A group message to store.
#[derive(Debug, Clone)]
pub struct NewGroupMessage<'a> {
    /// The group.
    pub group_id: u64,
    /// The id this message gets, unless the idempotency key is taken.
    pub message_id: u64,
    /// The calling service.
    pub sender: &'a str,
    /// The client that sends it (who may recall it with `sends.manage`).
    pub client: &'a str,
    /// Optional idempotency key, unique per group and sender.
    pub idempotency_key: Option<&'a str>,
    /// What members see.
    pub content: &'a Content,
}

/// A stored group message's id and seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The message id.
    pub message_id: u64,
    /// Its seq in the group.
    pub seq: u64,
    /// True when the idempotency key matched an earlier message.
    pub deduplicated: bool,
    /// The row of the event recorded with a new message.
    pub recorded: Option<u64>,
}

/// Stores a message under the group's next seq, in one transaction on the
/// home shard. Taking the seq locks the group's counter row until commit, so
/// concurrent senders (on any api replica) queue, and a rolled-back send
/// gives its seq back: seqs are strictly increasing without gaps. A new
/// message records `event` in [`super::event_outbox`] in the same
/// transaction.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn append_message(
    pool: &MySqlPool,
    message: &NewGroupMessage<'_>,
    event: &[u8],
) -> Result<Appended> {
    let mut tx = pool.begin().await?;
    // LAST_INSERT_ID(expr) hands the new value back in the OK packet.
    let bumped = sqlx::query(
        "UPDATE group_seqs SET max_seq = LAST_INSERT_ID(max_seq + 1) WHERE group_id = ?",
    )
    .bind(message.group_id)
    .execute(&mut *tx)
    .await?;
    if bumped.rows_affected() == 0 {
        tx.rollback().await?;
        return Err(Error::NotFound(format!("group {}", message.group_id)).into());
    }
    let seq = bumped.last_insert_id();
    if seq == 0 {
        // A proxy that drops LAST_INSERT_ID from the reply would break seqs.
        return Err(Error::Internal("the seq update returned no LAST_INSERT_ID".to_owned()).into());
    }
    if let Some(earlier) = find_by_key(&mut tx, message).await? {
        tx.rollback().await?;
        return Ok(earlier);
    }
    let content = message.content;
    let inserted = sqlx::query(
        "INSERT INTO group_messages (group_id, seq, message_id, sender, client, \
         idempotency_key, title, body, category, data, template, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(3))",
    )
    .bind(message.group_id)
    .bind(seq)
    .bind(message.message_id)
    .bind(message.sender)
    .bind(message.client)
    .bind(message.idempotency_key)
    .bind(&content.title)
    .bind(&content.body)
    .bind(&content.category)
    .bind(content.data_json())
    .bind(content.template_json())
    .execute(&mut *tx)
    .await;
    match inserted {
        Ok(_) => {
            let recorded = Some(super::event_outbox::record(&mut tx, event).await?);
            tx.commit().await?;
            Ok(Appended { message_id: message.message_id, seq, deduplicated: false, recorded })
        }
        // The counter lock serializes senders, so the key check above sees
        // every committed duplicate; this only guards that reasoning.
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            tx.rollback().await?;
            let mut conn = pool.acquire().await?;
            find_by_key(&mut conn, message).await?.ok_or_else(|| {
                Error::Internal("duplicate group message vanished".to_owned()).into()
            })
        }
        Err(e) => Err(e.into()),
    }
}

async fn find_by_key(
    conn: &mut MySqlConnection,
    message: &NewGroupMessage<'_>,
) -> Result<Option<Appended>> {
    let Some(key) = message.idempotency_key else {
        return Ok(None);
    };
    let found: Option<(u64, u64)> = sqlx::query_as(
        "SELECT message_id, seq FROM group_messages \
         WHERE group_id = ? AND sender = ? AND idempotency_key = ?",
    )
    .bind(message.group_id)
    .bind(message.sender)
    .bind(key)
    .fetch_optional(conn)
    .await?;
    Ok(found.map(|(message_id, seq)| Appended {
        message_id,
        seq,
        deduplicated: true,
        recorded: None,
    }))
}

/// A stored group message.
#[derive(Debug, Clone, FromRow)]
pub struct GroupMessageRow {
    /// Seq in the group.
    pub seq: u64,
    /// Message id (what clients dedup by).
    pub message_id: u64,
    /// The calling service that sent it.
    pub sender: String,
    /// Title.
    pub title: String,
    /// Body.
    pub body: String,
    /// Category.
    pub category: String,
    /// Data as a JSON object.
    pub data: String,
    /// When it was sent.
    pub created_at: NaiveDateTime,
    /// When it was recalled: a tombstone, its content cleared.
    pub recalled_at: Option<NaiveDateTime>,
    /// The content's template (stored JSON) when it is one: each reader's
    /// render fills it in their language.
    pub template: Option<String>,
}

/// Reads up to `limit` messages with seq above `after`, ascending (a range
/// of the primary key).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn messages_after(
    pool: &MySqlPool,
    group_id: u64,
    after: u64,
    limit: u32,
) -> Result<Vec<GroupMessageRow>> {
    Ok(sqlx::query_as(
        "SELECT seq, message_id, sender, title, body, category, data, created_at, recalled_at, \
         template FROM group_messages WHERE group_id = ? AND seq > ? ORDER BY seq LIMIT ?",
    )
    .bind(group_id)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// What a recall did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecall {
    /// The recalled message.
    pub message_id: u64,
    /// False when it was recalled before (nothing changed).
    pub recalled_now: bool,
    /// The group's seq state after the recall.
    pub seq: GroupSeq,
    /// The row of the event recorded with a recall made now.
    pub recorded: Option<u64>,
}

/// Recalls the message at `seq`, in one transaction on the group's home
/// shard: the message becomes a tombstone (content cleared, its seq kept)
/// and its seq joins the group's recalled seqs. With an `owner`, only a
/// message that client sent may be recalled. Taking the counter row's lock
/// first, as a send does, orders recalls and sends of a group. A recall
/// made now records `event` in [`super::event_outbox`] with it.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn recall_message(
    pool: &MySqlPool,
    group_id: u64,
    seq: u64,
    owner: Option<&str>,
    event: &[u8],
) -> Result<GroupRecall> {
    let mut tx = pool.begin().await?;
    let counter: Option<(u64, Option<String>)> = sqlx::query_as(
        "SELECT max_seq, recalled_seqs FROM group_seqs WHERE group_id = ? FOR UPDATE",
    )
    .bind(group_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((max_seq, recalled)) = counter else {
        tx.rollback().await?;
        return Err(Error::NotFound(format!("group {group_id}")).into());
    };
    let mut state = seq_state(group_id, max_seq, recalled.as_deref())?;
    let message: Option<(u64, String, bool)> = sqlx::query_as(
        "SELECT message_id, client, recalled_at IS NOT NULL FROM group_messages \
         WHERE group_id = ? AND seq = ? FOR UPDATE",
    )
    .bind(group_id)
    .bind(seq)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((message_id, client, recalled_before)) = message else {
        tx.rollback().await?;
        let why = if seq > max_seq { "its max seq is lower" } else { "retention removed it" };
        return Err(Error::NotFound(format!(
            "group {group_id} has no message at seq {seq} ({why})"
        ))
        .into());
    };
    if let Some(owner) = owner.filter(|owner| *owner != client) {
        tx.rollback().await?;
        return Err(Error::PermissionDenied(format!(
            "client {owner} did not send the message at seq {seq} of group {group_id}; \
             recalling another client's message needs the scope sends.all"
        ))
        .into());
    }
    if recalled_before {
        tx.rollback().await?;
        // Repaired here if a failure once left the list without it.
        state.recall(seq);
        return Ok(GroupRecall { message_id, recalled_now: false, seq: state, recorded: None });
    }
    sqlx::query(
        "UPDATE group_messages SET recalled_at = UTC_TIMESTAMP(3), \
         title = '', body = '', category = '', data = '{}' WHERE group_id = ? AND seq = ?",
    )
    .bind(group_id)
    .bind(seq)
    .execute(&mut *tx)
    .await?;
    state.recall(seq);
    sqlx::query("UPDATE group_seqs SET recalled_seqs = ? WHERE group_id = ?")
        .bind(encode_seq_list(&state.recalled))
        .bind(group_id)
        .execute(&mut *tx)
        .await?;
    let recorded = Some(super::event_outbox::record(&mut tx, event).await?);
    tx.commit().await?;
    Ok(GroupRecall { message_id, recalled_now: true, seq: state, recorded })
}

/// Drops recalled seqs up to `through` from a group's list (retention: every
/// cursor has passed them, so they no longer count).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn forget_recalls_through(pool: &MySqlPool, group_id: u64, through: u64) -> Result<()> {
    let mut tx = pool.begin().await?;
    let recalled: Option<Option<String>> =
        sqlx::query_scalar("SELECT recalled_seqs FROM group_seqs WHERE group_id = ? FOR UPDATE")
            .bind(group_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(Some(recalled)) = recalled else {
        tx.rollback().await?;
        return Ok(());
    };
    let mut state = seq_state(group_id, 0, Some(&recalled))?;
    let before = state.recalled.len();
    state.recalled.retain(|seq| *seq > through);
    if state.recalled.len() == before {
        tx.rollback().await?;
        return Ok(());
    }
    let kept = (!state.recalled.is_empty()).then(|| encode_seq_list(&state.recalled));
    sqlx::query("UPDATE group_seqs SET recalled_seqs = ? WHERE group_id = ?")
        .bind(kept)
        .bind(group_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// A member's cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct Membership {
    /// Seqs up to this one predate the membership.
    pub joined_seq: u64,
    /// The member's acknowledged seq.
    pub last_ack_seq: u64,
}

/// Reads a user's membership of a group (on the user's shard).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn membership<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
    group_id: u64,
) -> Result<Option<Membership>> {
    Ok(sqlx::query_as(
        "SELECT joined_seq, last_ack_seq FROM group_members WHERE user_id = ? AND group_id = ?",
    )
    .bind(user_id)
    .bind(group_id)
    .fetch_optional(pool)
    .await?)
}

/// Reads all of a user's groups, acknowledged seqs and mutes (from the
/// user's preferences, on the same shard), by group id.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn memberships(pool: &MySqlPool, user_id: u64) -> Result<Vec<GroupCursor>> {
    let rows: Vec<(u64, u64, bool)> = sqlx::query_as(
        "SELECT m.group_id, m.last_ack_seq, \
         COALESCE(FIND_IN_SET(m.group_id, p.muted_group_ids) > 0, 0) AS muted \
         FROM group_members m LEFT JOIN user_preferences p ON p.user_id = m.user_id \
         WHERE m.user_id = ? ORDER BY m.group_id",
    )
    .bind(user_id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(group_id, last_ack_seq, muted)| GroupCursor { group_id, last_ack_seq, muted })
        .collect())
}

/// Moves a member's cursor forward to `seq` (never back), recording `event`
/// in [`super::event_outbox`] (and the user for repair, with `repair`) in
/// the same transaction; returns the cursor after the update (`None` when
/// the user is not a member) and the event's row.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn advance_ack(
    pool: &MySqlPool,
    user_id: u64,
    group_id: u64,
    seq: u64,
    repair: bool,
    event: &[u8],
) -> Result<(Option<u64>, u64)> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE group_members SET last_ack_seq = GREATEST(last_ack_seq, ?) \
         WHERE user_id = ? AND group_id = ?",
    )
    .bind(seq)
    .bind(user_id)
    .bind(group_id)
    .execute(&mut *tx)
    .await?;
    if repair {
        super::badge_repairs::record(&mut tx, user_id).await?;
    }
    let membership = membership(&mut *tx, user_id, group_id).await?;
    let recorded = super::event_outbox::record(&mut tx, event).await?;
    tx.commit().await?;
    Ok((membership.map(|m| m.last_ack_seq), recorded))
}

/// Counts a group's members on one shard whose bucket `owned` says this shard
/// owns (a range of the group index).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn count_members(
    pool: &MySqlPool,
    group_id: u64,
    owned: impl Fn(u32) -> bool,
) -> Result<u64> {
    let counts: Vec<(u16, i64)> = sqlx::query_as(
        "SELECT bucket, COUNT(*) FROM group_members WHERE group_id = ? GROUP BY bucket",
    )
    .bind(group_id)
    .fetch_all(pool)
    .await?;
    Ok(counts
        .into_iter()
        .filter(|(bucket, _)| owned(u32::from(*bucket)))
        .map(|(_, count)| count.max(0) as u64)
        .sum())
}

/// Counts which of `user_ids` (all on this shard) are members already.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn count_present(pool: &MySqlPool, group_id: u64, user_ids: &[u64]) -> Result<u64> {
    let mut present = 0;
    for batch in user_ids.chunks(MEMBER_ROWS_PER_STATEMENT) {
        let mut select = QueryBuilder::new("SELECT COUNT(*) FROM group_members WHERE group_id = ");
        select.push_bind(group_id).push(" AND user_id IN (");
        push_ids(&mut select, batch);
        select.push(")");
        let count: i64 = select.build_query_scalar().fetch_one(pool).await?;
        present += count.max(0) as u64;
    }
    Ok(present)
}

/// Adds members (all on this shard) starting at `joined_seq`, in one
/// transaction; existing members keep their cursor. Returns how many were
/// added.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn add_members(
    pool: &MySqlPool,
    group_id: u64,
    user_ids: &[u64],
    joined_seq: u64,
) -> Result<u64> {
    let mut tx = pool.begin().await?;
    let mut added = 0;
    for batch in user_ids.chunks(MEMBER_ROWS_PER_STATEMENT) {
        let mut insert = QueryBuilder::new(
            "INSERT IGNORE INTO group_members \
             (user_id, group_id, joined_seq, last_ack_seq, joined_at) ",
        );
        insert.push_values(batch, |mut row, user_id| {
            row.push_bind(*user_id)
                .push_bind(group_id)
                .push_bind(joined_seq)
                .push_bind(joined_seq)
                .push("UTC_TIMESTAMP(3)");
        });
        added += insert.build().execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(added)
}

/// Removes members (all on this shard) in one transaction; returns how many
/// were members.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn remove_members(pool: &MySqlPool, group_id: u64, user_ids: &[u64]) -> Result<u64> {
    let mut tx = pool.begin().await?;
    let mut removed = 0;
    for batch in user_ids.chunks(MEMBER_ROWS_PER_STATEMENT) {
        let mut delete = QueryBuilder::new("DELETE FROM group_members WHERE group_id = ");
        delete.push_bind(group_id).push(" AND user_id IN (");
        push_ids(&mut delete, batch);
        delete.push(")");
        removed += delete.build().execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(removed)
}
