//! Changes to a user's items on the user's shard: seen, read, unread,
//! archived, unarchived, deleted, for a list of ids or for every item a
//! list filter selects ([`ItemFilter`]: the same conditions as the list, so
//! "all" is exactly what the user was shown). Each call is one transaction;
//! read counts of the sends follow in it (slot 0 of `message_shard_stats`),
//! and so do the reads recorded by message (`message_reads`: a read adds
//! the row, a mark-unread removes it), which answer "who read it". A
//! filtered update also reads the user's badge state in its transaction,
//! and the whole of it is one round trip ([`update_all`]).

use futures::TryStreamExt;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Either, MySql, MySqlPool, QueryBuilder, Row, Transaction};
use tracing::instrument;

use super::items::{BadgeState, COUNT_UNREAD, ItemFilter, UnreadTruth};
use super::preferences::{SUPPRESSION, Suppression};
use super::push_ids;
use notify_domain::error::{Error, Result};

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

    /// The assignments to the items `i`, evaluated left to right.
    fn assignments(self) -> &'static str {
        match self {
            Action::MarkSeen => "i.is_seen = 1, i.seen_at = UTC_TIMESTAMP(3)",
            Action::MarkRead => {
                "i.seen_at = COALESCE(i.seen_at, UTC_TIMESTAMP(3)), i.is_seen = 1, i.is_read = 1, \
                 i.read_at = UTC_TIMESTAMP(3)"
            }
            Action::MarkUnread => {
                "i.seen_at = COALESCE(i.seen_at, i.read_at), i.is_seen = 1, i.is_read = 0, \
                 i.read_at = NULL"
            }
            Action::Archive => "i.is_archived = 1, i.archived_at = UTC_TIMESTAMP(3)",
            Action::Unarchive => "i.is_archived = 0, i.archived_at = NULL",
            Action::Delete => "i.deleted_at = UTC_TIMESTAMP(3)",
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

/// Applies `action` to the user's items `message_ids` in one transaction:
/// reads and locks them, then changes those the action changes.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", action = action.name()))]
pub async fn update_ids(
    pool: &MySqlPool,
    user_id: u64,
    action: Action,
    message_ids: &[u64],
) -> Result<Updated> {
    let mut tx = pool.begin().await?;
    let updated = update_ids_in(&mut tx, user_id, action, message_ids).await?;
    tx.commit().await?;
    Ok(updated)
}

async fn update_ids_in(
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
            "UPDATE message_items i SET {} WHERE i.user_id = ",
            action.assignments()
        ));
        update.push_bind(user_id).push(" AND i.message_id IN (");
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

/// A filtered update's outcome.
#[derive(Debug, Clone)]
pub struct UpdatedAll {
    /// Items that changed.
    pub changed: u64,
    /// Their ids, when asked for.
    pub changed_ids: Vec<u64>,
    /// The user's badge state right after the change, in its transaction.
    pub badge: BadgeState,
}

/// What one statement of a filtered update's script is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Begin,
    ReadCounts,
    Reads,
    Changed,
    Update,
    Count,
    Present,
    Suppression,
    Commit,
}

/// Applies `action` to every item `filter` selects (what a list with it
/// shows: the items joined to their send's content copy, not withdrawn)
/// and reads the user's badge state in the same transaction, as
/// [`super::items::badge_state`] does for `announcement_ids`: ONE round
/// trip. The transaction goes as one script (values written in, see
/// [`ItemFilter::item_conditions`]): the read counts and reads by message of
/// exactly the items about to change first (which locks them, so the update
/// changes the same ones), then the update, then the badge's reads. With
/// `changed_ids`, it also answers the ids that changed (for `item.read`
/// webhooks: a feed that only then pays for them).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", action = action.name()))]
pub async fn update_all(
    pool: &MySqlPool,
    user_id: u64,
    action: Action,
    filter: &ItemFilter<'_>,
    announcement_ids: &[u64],
    changed_ids: bool,
) -> Result<UpdatedAll> {
    let (steps, script) = script(user_id, action, filter, announcement_ids, changed_ids)?;
    let mut conn = pool.acquire().await?;
    let ran = run(&mut conn, &steps, script).await;
    if ran.is_err() {
        // The script stopped at the failing statement, inside its
        // transaction: end it, or drop the connection if that fails too.
        if sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.is_err() {
            conn.close_on_drop();
        }
    }
    ran
}

/// The statements of a filtered update, and their script.
fn script(
    user_id: u64,
    action: Action,
    filter: &ItemFilter<'_>,
    announcement_ids: &[u64],
    changed_ids: bool,
) -> Result<(Vec<Step>, String)> {
    // What a list with the filter shows (items joined to their content
    // copies, not withdrawn) that the action changes.
    const ITEMS: &str = "message_items i JOIN message_contents c ON c.message_id = i.message_id";
    let selected = format!(
        "WHERE i.user_id = {user_id}{}{} AND c.revoked = 0",
        filter.item_conditions()?,
        action.changes()
    );
    let mut steps = vec![(Step::Begin, "START TRANSACTION".to_owned())];
    let delta = action.read_delta();
    if delta != 0 {
        steps.push((
            Step::ReadCounts,
            format!(
                "INSERT INTO message_shard_stats (message_id, slot, read_count) \
                 SELECT i.message_id, 0, {delta} FROM {ITEMS} {selected} \
                 ON DUPLICATE KEY UPDATE read_count = read_count + VALUES(read_count)"
            ),
        ));
        let reads = if action == Action::MarkRead {
            format!(
                "INSERT INTO message_reads (message_id, user_id, read_at) \
                 SELECT i.message_id, i.user_id, UTC_TIMESTAMP(3) FROM {ITEMS} {selected} \
                 ON DUPLICATE KEY UPDATE read_at = VALUES(read_at)"
            )
        } else {
            format!(
                "DELETE r FROM {ITEMS} JOIN message_reads r \
                 ON r.message_id = i.message_id AND r.user_id = i.user_id {selected}"
            )
        };
        steps.push((Step::Reads, reads));
    }
    if changed_ids {
        // Read before the update moves them out of the selection, as a
        // locking read (shared: the content copies stay readable to others)
        // that sees what the update will.
        let select = format!("SELECT i.message_id FROM {ITEMS} {selected} LOCK IN SHARE MODE");
        steps.push((Step::Changed, select));
    }
    steps.push((Step::Update, format!("UPDATE {ITEMS} SET {} {selected}", action.assignments())));
    let user = user_id.to_string();
    steps.push((Step::Count, COUNT_UNREAD.replacen('?', &user, 1)));
    if !announcement_ids.is_empty() {
        let ids: Vec<String> = announcement_ids.iter().map(u64::to_string).collect();
        steps.push((
            Step::Present,
            format!(
                "SELECT message_id FROM message_items WHERE user_id = {user_id} \
                 AND message_id IN ({})",
                ids.join(", ")
            ),
        ));
        steps.push((Step::Suppression, SUPPRESSION.replacen('?', &user, 1)));
    }
    steps.push((Step::Commit, "COMMIT".to_owned()));
    let script = steps.iter().map(|(_, sql)| sql.as_str()).collect::<Vec<_>>().join(";\n");
    Ok((steps.into_iter().map(|(step, _)| step).collect(), script))
}

/// Runs a filtered update's script and reads what its statements answer.
async fn run(
    conn: &mut sqlx::MySqlConnection,
    steps: &[Step],
    script: String,
) -> Result<UpdatedAll> {
    let malformed = |what: &str| Error::Internal(format!("a filtered update's script: {what}"));
    let mut results = sqlx::raw_sql(AssertSqlSafe(script)).fetch_many(&mut *conn);
    let mut at = 0;
    let mut changed = None;
    let mut truth = None;
    let mut present = Vec::new();
    let mut changed_ids = Vec::new();
    let mut suppression = None;
    while let Some(result) = results.try_next().await? {
        let step = *steps.get(at).ok_or_else(|| malformed("more results than statements"))?;
        match result {
            Either::Left(done) => {
                if step == Step::Update {
                    changed = Some(done.rows_affected());
                }
                at += 1;
            }
            Either::Right(row) => match step {
                Step::Count => truth = Some(UnreadTruth::from_row(count_row(&row)?)),
                Step::Present => present.push(row.try_get::<u64, _>(0)?),
                Step::Changed => changed_ids.push(row.try_get::<u64, _>(0)?),
                Step::Suppression => suppression = Some((row.try_get(0)?, row.try_get(1)?)),
                _ => return Err(malformed("a row from a statement that has none")),
            },
        }
    }
    if at != steps.len() {
        return Err(malformed("fewer results than statements"));
    }
    let changed = changed.ok_or_else(|| malformed("no update"))?;
    let truth = truth.ok_or_else(|| malformed("no count"))?;
    let suppression = Suppression::from_row(suppression);
    let badge = BadgeState { truth, present, suppression };
    Ok(UpdatedAll { changed, changed_ids, badge })
}

fn count_row(row: &MySqlRow) -> Result<(i64, i64, Option<chrono::NaiveDateTime>)> {
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::items::View;

    #[test]
    fn a_filtered_update_is_one_script_with_a_result_per_statement() {
        let filter =
            ItemFilter { view: View::Inbox, category: Some("billing.eu"), ..Default::default() };
        let (steps, sql) = script(42, Action::MarkRead, &filter, &[7, 9], true).unwrap();
        let expected = [
            Step::Begin,
            Step::ReadCounts,
            Step::Reads,
            Step::Changed,
            Step::Update,
            Step::Count,
            Step::Present,
            Step::Suppression,
            Step::Commit,
        ];
        assert_eq!(steps, expected);
        assert_eq!(sql.split(";\n").count(), steps.len());
        assert!(!sql.contains('?'), "every value is written in: {sql}");
        assert!(sql.contains("i.category = 'billing.eu'"), "{sql}");
        let (steps, _) = script(42, Action::Archive, &filter, &[], false).unwrap();
        assert_eq!(steps, [Step::Begin, Step::Update, Step::Count, Step::Commit]);
    }

    #[test]
    fn a_category_that_could_end_its_literal_is_refused() {
        for category in ["a'b", "a\\b", "A", "a;b", "a b"] {
            let filter = ItemFilter { category: Some(category), ..Default::default() };
            assert!(script(42, Action::Delete, &filter, &[], false).is_err(), "{category:?}");
        }
    }
}
