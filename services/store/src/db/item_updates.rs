//! Changes to a user's items on the user's shard: seen, read, unread,
//! archived, unarchived, deleted, for a list of ids or for every item a
//! list filter selects ([`ItemFilter`]: the same conditions as the list, so
//! "all" is exactly what the user was shown). Each call is one transaction;
//! read counts of the sends follow in it (slot 0 of `message_shard_stats`),
//! and so do the reads recorded by message (`message_reads`: a read adds
//! the row, a mark-unread removes it), which answer "who read it".

use sqlx::{MySql, MySqlPool, QueryBuilder, Transaction};
use tracing::instrument;

use super::items::ItemFilter;
use super::push_ids;
use notify_domain::error::Result;

/// What to do to items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Seen (the bell was opened); read items are seen already.
    MarkSeen,
    /// Read, which implies seen.
    MarkRead,
    /// Unread again (it stays seen).
    MarkUnread,
    /// Out of the inbox, into the archive.
    Archive,
    /// Back into the inbox.
    Unarchive,
    /// Gone for the user from every view, count and event; the row stays
    /// as a tombstone so that nothing writes the item again.
    Delete,
}

impl Action {
    /// A short stable name (events, logs).
    pub fn name(self) -> &'static str {
        match self {
            Action::MarkSeen => "seen",
            Action::MarkRead => "read",
            Action::MarkUnread => "unread",
            Action::Archive => "archive",
            Action::Unarchive => "unarchive",
            Action::Delete => "delete",
        }
    }

    /// The assignments, evaluated left to right (a single-table `UPDATE`).
    fn assignments(self) -> &'static str {
        match self {
            Action::MarkSeen => "is_seen = 1, seen_at = UTC_TIMESTAMP(3)",
            Action::MarkRead => {
                "seen_at = COALESCE(seen_at, UTC_TIMESTAMP(3)), is_seen = 1, is_read = 1, \
                 read_at = UTC_TIMESTAMP(3)"
            }
            Action::MarkUnread => {
                "seen_at = COALESCE(seen_at, read_at), is_seen = 1, is_read = 0, read_at = NULL"
            }
            Action::Archive => "is_archived = 1, archived_at = UTC_TIMESTAMP(3)",
            Action::Unarchive => "is_archived = 0, archived_at = NULL",
            Action::Delete => "deleted_at = UTC_TIMESTAMP(3)",
        }
    }

    /// The condition under which the action changes an item (on `i`).
    fn changes(self) -> &'static str {
        match self {
            Action::MarkSeen => " AND i.is_seen = 0 AND i.is_read = 0",
            Action::MarkRead => " AND i.is_read = 0",
            Action::MarkUnread => " AND i.is_read = 1",
            Action::Archive => " AND i.is_archived = 0",
            Action::Unarchive => " AND i.is_archived = 1",
            Action::Delete => "",
        }
    }

    /// [`Self::changes`] on a row read by id.
    fn would_change(self, item: &ItemState) -> bool {
        match self {
            Action::MarkSeen => !item.is_seen && !item.is_read,
            Action::MarkRead => !item.is_read,
            Action::MarkUnread => item.is_read,
            Action::Archive => !item.is_archived,
            Action::Unarchive => item.is_archived,
            Action::Delete => true,
        }
    }

    /// How the action moves a changed item's send's read count.
    fn read_delta(self) -> i64 {
        match self {
            Action::MarkRead => 1,
            Action::MarkUnread => -1,
            _ => 0,
        }
    }
}

/// Which items an update applies to.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// These ids (deleted items count as unknown).
    Ids(&'a [u64]),
    /// Every item the filter selects, as a list with it shows them.
    All(ItemFilter<'a>),
}

/// What an update did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Updated {
    /// Items that changed.
    pub changed: u64,
    /// Their ids (for a list of ids; empty for a filter).
    pub changed_ids: Vec<u64>,
    /// Ids the user has no item for (for a list of ids).
    pub unknown: Vec<u64>,
}

#[derive(Debug, sqlx::FromRow)]
struct ItemState {
    message_id: u64,
    is_seen: bool,
    is_read: bool,
    is_archived: bool,
}

/// Applies `action` to a user's items in one transaction: for ids, reads
/// and locks them, then changes those the action changes; for a filter,
/// changes every visible item it selects in one statement (two when read
/// counts move: they are added first, from the same selection, under the
/// same locks).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", action = action.name()))]
pub async fn update(
    pool: &MySqlPool,
    user_id: u64,
    action: Action,
    target: Target<'_>,
) -> Result<Updated> {
    let mut tx = pool.begin().await?;
    let updated = match target {
        Target::Ids(ids) => update_ids(&mut tx, user_id, action, ids).await?,
        Target::All(filter) => update_all(&mut tx, user_id, action, &filter).await?,
    };
    tx.commit().await?;
    Ok(updated)
}

async fn update_ids(
    tx: &mut Transaction<'_, MySql>,
    user_id: u64,
    action: Action,
    message_ids: &[u64],
) -> Result<Updated> {
    if message_ids.is_empty() {
        return Ok(Updated::default());
    }
    let mut select = QueryBuilder::new(
        "SELECT message_id, is_seen, is_read, is_archived FROM message_items \
         WHERE deleted_at IS NULL AND user_id = ",
    );
    select.push_bind(user_id).push(" AND message_id IN (");
    push_ids(&mut select, message_ids);
    select.push(") FOR UPDATE");
    let found: Vec<ItemState> = select.build_query_as().fetch_all(&mut **tx).await?;
    let unknown: Vec<u64> = message_ids
        .iter()
        .copied()
        .filter(|id| !found.iter().any(|item| item.message_id == *id))
        .collect();
    let changed_ids: Vec<u64> =
        found.iter().filter(|item| action.would_change(item)).map(|item| item.message_id).collect();
    if !changed_ids.is_empty() {
        let mut update = QueryBuilder::new(format!(
            "UPDATE message_items SET {} WHERE user_id = ",
            action.assignments()
        ));
        update.push_bind(user_id).push(" AND message_id IN (");
        push_ids(&mut update, &changed_ids);
        update.push(")");
        update.build().execute(&mut **tx).await?;
        let delta = action.read_delta();
        if delta != 0 {
            let mut stats = QueryBuilder::new(
                "INSERT INTO message_shard_stats (message_id, slot, read_count) ",
            );
            stats.push_values(&changed_ids, |mut row, id| {
                row.push_bind(*id).push_bind(0u8).push_bind(delta);
            });
            stats.push(" ON DUPLICATE KEY UPDATE read_count = read_count + VALUES(read_count)");
            stats.build().execute(&mut **tx).await?;
        }
        record_reads_of_ids(tx, user_id, action, &changed_ids).await?;
    }
    Ok(Updated { changed: changed_ids.len() as u64, changed_ids, unknown })
}

/// `WHERE` of a filtered update: the user's items the filter selects (a
/// list's conditions), whose send was not withdrawn, that the action changes.
fn push_selection(
    sql: &mut QueryBuilder<MySql>,
    user_id: u64,
    action: Action,
    filter: &ItemFilter<'_>,
) {
    sql.push(" WHERE i.user_id = ").push_bind(user_id);
    filter.push_item_conditions(sql);
    sql.push(action.changes()).push(
        " AND NOT EXISTS (SELECT 1 FROM message_contents c \
         WHERE c.message_id = i.message_id AND c.revoked = 1)",
    );
}

async fn update_all(
    tx: &mut Transaction<'_, MySql>,
    user_id: u64,
    action: Action,
    filter: &ItemFilter<'_>,
) -> Result<Updated> {
    let delta = action.read_delta();
    if delta != 0 {
        // The read counts of exactly the items about to change: this locks
        // them, so the update below changes the same ones.
        let mut stats = QueryBuilder::new(
            "INSERT INTO message_shard_stats (message_id, slot, read_count) SELECT i.message_id, 0, ",
        );
        stats.push_bind(delta).push(" FROM message_items i");
        push_selection(&mut stats, user_id, action, filter);
        stats.push(" ON DUPLICATE KEY UPDATE read_count = read_count + VALUES(read_count)");
        stats.build().execute(&mut **tx).await?;
        // The reads by message of the same items, before the update moves
        // them out of the selection.
        let mut reads = match action {
            Action::MarkRead => QueryBuilder::new(
                "INSERT INTO message_reads (message_id, user_id, read_at) \
                 SELECT i.message_id, i.user_id, UTC_TIMESTAMP(3) FROM message_items i",
            ),
            _ => QueryBuilder::new("DELETE FROM message_reads WHERE user_id = "),
        };
        if action == Action::MarkRead {
            push_selection(&mut reads, user_id, action, filter);
            reads.push(" ON DUPLICATE KEY UPDATE read_at = VALUES(read_at)");
        } else {
            reads
                .push_bind(user_id)
                .push(" AND message_id IN (SELECT i.message_id FROM message_items i");
            push_selection(&mut reads, user_id, action, filter);
            reads.push(")");
        }
        reads.build().execute(&mut **tx).await?;
    }
    let mut update =
        QueryBuilder::new(format!("UPDATE message_items i SET {}", action.assignments()));
    push_selection(&mut update, user_id, action, filter);
    let changed = update.build().execute(&mut **tx).await?.rows_affected();
    Ok(Updated { changed, changed_ids: Vec::new(), unknown: Vec::new() })
}

/// Records reads by message for items a list of ids changed: a read adds
/// the row (`message_reads`), a mark-unread removes it.
async fn record_reads_of_ids(
    tx: &mut Transaction<'_, MySql>,
    user_id: u64,
    action: Action,
    message_ids: &[u64],
) -> Result<()> {
    match action {
        Action::MarkRead => {
            let mut insert =
                QueryBuilder::new("INSERT INTO message_reads (message_id, user_id, read_at) ");
            insert.push_values(message_ids, |mut row, id| {
                row.push_bind(*id).push_bind(user_id).push("UTC_TIMESTAMP(3)");
            });
            insert.push(" ON DUPLICATE KEY UPDATE read_at = VALUES(read_at)");
            insert.build().execute(&mut **tx).await?;
        }
        Action::MarkUnread => {
            let mut delete = QueryBuilder::new("DELETE FROM message_reads WHERE user_id = ");
            delete.push_bind(user_id).push(" AND message_id IN (");
            push_ids(&mut delete, message_ids);
            delete.push(")");
            delete.build().execute(&mut **tx).await?;
        }
        _ => {}
    }
    Ok(())
}
