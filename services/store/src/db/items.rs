//! A user's items on the user's shard: inbox pages by view and filter, the
//! badge's two counts, and announcements materialized into items. Changes to
//! items (seen, read, archived, deleted) are in [`super::item_updates`].
//!
//! An item is unseen -> seen -> read, and independently in the inbox or
//! archived; a deleted item keeps its row as a tombstone (`is_deleted`), so
//! that a redelivered chunk or an announcement's materialization never
//! writes it again, and every read here leaves it out. A read sets seen
//! too.

use chrono::NaiveDateTime;
use sqlx::{FromRow, MySqlPool, QueryBuilder};
use tracing::instrument;

use super::preferences::{self, Suppression};
use super::push_ids;
use super::script::{Arg, Built, SafeText, Script, Sql};
use crate::error::Result;

/// One inbox entry with its content.
#[derive(Debug, Clone, FromRow)]
pub struct InboxRow {
    /// Message id (also the cursor).
    pub message_id: u64,
    /// Seen (read items are seen).
    pub is_seen: bool,
    /// When it was seen (or read, for items read before seen existed).
    pub seen_at: Option<NaiveDateTime>,
    /// Read state.
    pub is_read: bool,
    /// When it was read.
    pub read_at: Option<NaiveDateTime>,
    /// Archived (out of the inbox view, in the archive's).
    pub is_archived: bool,
    /// When it was archived.
    pub archived_at: Option<NaiveDateTime>,
    /// Title.
    pub title: String,
    /// Body.
    pub body: String,
    /// Category.
    pub category: String,
    /// Data as a JSON object.
    pub data: String,
    /// Message creation time.
    pub created_at: NaiveDateTime,
    /// Expiry.
    pub expire_at: Option<NaiveDateTime>,
    /// When the sender last edited the content.
    pub edited_at: Option<NaiveDateTime>,
    /// True when the content is a template: `title`, `body` and `data` are
    /// then templates, which the reader's render fills
    /// (`notify_core::render`, which compiles each template once per
    /// process: a page does not carry the template's text, see
    /// [`templates`]).
    pub templated: bool,
    /// The recipient's own vars (a JSON object), for a templated content.
    pub vars: Option<String>,
    /// The reader's language, read for a templated content only ('' when
    /// not set).
    pub locale: String,
}

/// Which of a user's items a list (or a bulk update) covers.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum View {
    /// Items not archived (the default).
    #[default]
    Inbox,
    /// Archived items only.
    Archive,
    /// Both.
    All,
}

impl View {
    /// A short stable name (page cache keys, logs).
    pub fn name(self) -> &'static str {
        match self {
            View::Inbox => "inbox",
            View::Archive => "archive",
            View::All => "all",
        }
    }
}

/// The filter a list shows and a bulk update applies to: the same filter
/// selects the same items in both, so "all" means exactly what was shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemFilter<'a> {
    /// Inbox, archive or both.
    pub view: View,
    /// Only unread items.
    pub unread_only: bool,
    /// Only read items.
    pub read_only: bool,
    /// Only this category, when set.
    pub category: Option<&'a str>,
    /// Only ids up to this one, when set (what the client has seen).
    pub up_to: Option<u64>,
}

impl ItemFilter<'_> {
    /// Appends the filter's conditions on the items `i` to a `WHERE` that
    /// has named the user: items of the view and filters that are neither
    /// deleted nor expired. Whether the content copy was revoked (a
    /// cancelled announcement) is the caller's to add: a list joins the copy
    /// `c` anyway ([`CONTENT_VISIBLE`]), an update asks for it by id.
    pub(crate) fn push_item_conditions(&self, sql: &mut QueryBuilder<sqlx::MySql>) -> Result<()> {
        sql.push(self.item_conditions(NOW)?.as_str());
        Ok(())
    }

    /// [`Self::push_item_conditions`] as a script's piece ([`super::script`]),
    /// its values written in: ids are numbers, and a category a
    /// [`SafeText`] (`[a-z0-9_.-]`), so no value can end its literal. A
    /// bulk update sends its whole transaction as one script, which takes
    /// no bound values. Items expire against `now`, SQL: [`NOW`], or a time
    /// the script fixed before, when more than one of its statements
    /// selects the items (each statement reads the clock anew).
    pub(crate) fn item_conditions(&self, now: &'static str) -> Result<Sql> {
        let view = match self.view {
            View::Inbox => " AND i.is_archived = 0",
            View::Archive => " AND i.is_archived = 1",
            View::All => "",
        };
        let mut sql = Sql::new(concat!(" AND ", not_deleted!("i")), &[]);
        sql.push(view, &[]);
        if self.unread_only {
            sql.push(" AND i.is_read = 0", &[]);
        }
        if self.read_only {
            sql.push(" AND i.is_read = 1", &[]);
        }
        if let Some(category) = self.category {
            let category = SafeText::new("category", category)?;
            sql.push(" AND i.category = ?", &[Arg::Text(&category)]);
        }
        if let Some(up_to) = self.up_to {
            sql.push(" AND i.message_id <= ?", &[Arg::Int(up_to)]);
        }
        sql.push(" AND (i.expire_at IS NULL OR i.expire_at > ", &[]).push(now, &[]).push(")", &[]);
        Ok(sql)
    }
}

/// The time items expire against in a statement of its own: the clock as
/// the statement starts.
pub(crate) const NOW: &str = "UTC_TIMESTAMP(3)";

/// SQL condition on a joined content copy `c`: its send was not withdrawn.
pub(crate) const CONTENT_VISIBLE: &str = " AND c.revoked = 0";

/// One inbox page's query.
#[derive(Debug, Clone, Default)]
pub struct InboxQuery<'a> {
    /// Only ids below this one (the cursor); `u64::MAX` for the first page.
    pub before: u64,
    /// Rows to return.
    pub limit: u32,
    /// Which items.
    pub filter: ItemFilter<'a>,
}

/// The columns of an [`InboxRow`], selected from `i` and `c`.
const ROW_COLUMNS: &str = concat!(
    "i.message_id, i.is_seen, ",
    seen_time!("i"),
    " AS seen_at, i.is_read, ",
    read_time!("i"),
    " AS read_at, i.is_archived, ",
    archived_time!("i"),
    " AS archived_at, c.title, c.body, c.category, c.data, c.created_at, c.expire_at, c.edited_at, \
     c.template IS NOT NULL AS templated, i.vars, IF(c.template IS NULL, '', \
     COALESCE((SELECT p.locale FROM user_preferences p WHERE p.user_id = i.user_id), '')) AS locale"
);

/// Reads one inbox page, newest first, in one query on the user's shard.
/// Expired, revoked and deleted items are skipped.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn list<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
    query: &InboxQuery<'_>,
) -> Result<Vec<InboxRow>> {
    // The index that serves each filter in message id order is named, and
    // the join order fixed: the plan is the same for every page, and
    // MariaDB skips weighing the other indexes on each execution (about a
    // tenth of a page's cost). Unread-only pages read the primary key too,
    // skipping read items: no index holds `is_read`, so that marking
    // items read or unread changes their rows alone.
    let index = match query.filter.category {
        Some(_) => "idx_items_category",
        None => "PRIMARY",
    };
    let mut sql = QueryBuilder::new(format!(
        "SELECT STRAIGHT_JOIN {ROW_COLUMNS} FROM message_items i FORCE INDEX ({index}) \
         JOIN message_contents c ON c.message_id = i.message_id WHERE i.user_id = "
    ));
    sql.push_bind(user_id).push(" AND i.message_id < ").push_bind(query.before);
    query.filter.push_item_conditions(&mut sql)?;
    sql.push(CONTENT_VISIBLE).push(" ORDER BY i.message_id DESC LIMIT ").push_bind(query.limit);
    Ok(sql.build_query_as().fetch_all(db).await?)
}

/// A templated content's texts, as a render compiles them.
#[derive(Debug, Clone, FromRow)]
pub struct TemplateTexts {
    /// The send.
    pub message_id: u64,
    /// Title template.
    pub title: String,
    /// Body template.
    pub body: String,
    /// Data templates (a JSON object).
    pub data: String,
    /// The version: when the content was last edited.
    pub edited_at: Option<NaiveDateTime>,
    /// The template (stored JSON).
    pub template: String,
}

/// The texts of the templated contents among `message_ids` (those a page
/// shows whose template this process has not compiled yet).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn templates<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    message_ids: &[u64],
) -> Result<Vec<TemplateTexts>> {
    if message_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut sql = QueryBuilder::new(
        "SELECT message_id, title, body, data, edited_at, template FROM message_contents \
         WHERE template IS NOT NULL AND message_id IN (",
    );
    push_ids(&mut sql, message_ids);
    sql.push(")");
    Ok(sql.build_query_as().fetch_all(db).await?)
}

/// A user's item of a send, as a render needs it: `None` when the user
/// has no item (not a recipient, or not delivered yet); else the item's
/// vars (`None` for an item without).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn item_vars<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
    message_id: u64,
) -> Result<Option<Option<String>>> {
    Ok(sqlx::query_scalar("SELECT vars FROM message_items WHERE user_id = ? AND message_id = ?")
        .bind(user_id)
        .bind(message_id)
        .fetch_optional(db)
        .await?)
}

/// The database truth of a badge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnreadTruth {
    /// Unread items in the inbox (not archived, not deleted, unexpired).
    pub unread: u64,
    /// Of those, the ones not seen either (read implies seen).
    pub unseen: u64,
    /// Earliest expiry among them: the counts change then.
    pub next_expiry: Option<NaiveDateTime>,
}

/// What a badge rebuild reads in one snapshot of the user's shard: the
/// counts of the user's items, which of the live announcements the user has
/// an item for, and what the user's preferences hold back.
#[derive(Debug, Clone)]
pub struct BadgeState {
    /// The items' counts.
    pub truth: UnreadTruth,
    /// Announcements among those asked for that the user has an item for.
    pub present: Vec<u64>,
    /// What the user mutes, or was erased before.
    pub suppression: Suppression,
}

/// Counts a user's unread and unseen items and finds which of
/// `announcement_ids` the user has materialized, with the user's
/// preferences, all in ONE snapshot (a read-only transaction), so a
/// materialization committing in between cannot be counted zero or two
/// times.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn badge_state(
    pool: &MySqlPool,
    user_id: u64,
    announcement_ids: &[u64],
) -> Result<BadgeState> {
    if announcement_ids.is_empty() {
        let truth = count_unread(pool, user_id).await?;
        return Ok(BadgeState { truth, present: Vec::new(), suppression: Suppression::default() });
    }
    let mut tx = pool.begin().await?;
    let truth = count_unread(&mut *tx, user_id).await?;
    let present = present(&mut *tx, user_id, announcement_ids).await?;
    let suppression = preferences::suppression(&mut *tx, user_id).await?;
    tx.commit().await?;
    Ok(BadgeState { truth, present, suppression })
}

/// Counts a user's unread and unseen inbox items: unexpired, unrevoked, not
/// archived, not deleted, on the user's shard ([`COUNT_UNREAD`]).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn count_unread<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
) -> Result<UnreadTruth> {
    let counted = sqlx::query_as(COUNT_UNREAD).bind(user_id).fetch_one(pool).await?;
    Ok(UnreadTruth::from_row(counted))
}

/// SQL condition on items `i`: their send was not withdrawn (no revoked
/// content copy), as [`COUNT_UNREAD`] and a filtered update test it (see
/// there for how MariaDB runs it).
macro_rules! not_revoked {
    () => {
        " AND i.message_id NOT IN (SELECT message_id FROM message_contents WHERE revoked = 1)"
    };
}

/// [`not_revoked!`] as a value.
pub(crate) const NOT_REVOKED: &str = not_revoked!();

/// The count [`count_unread`] runs, for one user id (`?`).
///
/// The revoked messages (a recalled send, a cancelled announcement) are
/// left out by `NOT IN` over the shard's revoked content copies, which
/// `idx_contents_revoked` finds: while they are few (retention purges them)
/// the optimizer reads them once into an in-memory set that each item is
/// tested against, and when they are many it looks each item's copy up by
/// primary key, which is what the join to the copies it replaced did for
/// every item (for a user with 10,000 unread, that count took 4-6x as
/// long). The items are read by the primary key's range of the user
/// (every column in place; no index holds `is_read`, see [`list`]), about
/// 3 ms for 10,000 items. An item whose copy is gone counts (the
/// join left it out): retention deletes a copy after its items, or once it
/// expired, and its items expired with it (they carry its `expire_at`).
pub(crate) const COUNT_UNREAD: &str = concat!(
    "SELECT COUNT(*), CAST(COALESCE(SUM(i.is_seen = 0), 0) AS SIGNED), MIN(i.expire_at) \
     FROM message_items i \
     WHERE i.user_id = ? AND i.is_read = 0 AND i.is_archived = 0 AND ",
    not_deleted!("i"),
    " AND (i.expire_at IS NULL OR i.expire_at > UTC_TIMESTAMP(3))",
    not_revoked!()
);

impl UnreadTruth {
    /// From a row of [`COUNT_UNREAD`].
    pub(crate) fn from_row(
        (unread, unseen, next_expiry): (i64, i64, Option<NaiveDateTime>),
    ) -> Self {
        Self { unread: unread.max(0) as u64, unseen: unseen.max(0) as u64, next_expiry }
    }
}

/// Returns which of `message_ids` the user has an item for (deleted ones
/// included: a deleted announcement stays deleted).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn present<'e>(
    pool: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
    message_ids: &[u64],
) -> Result<Vec<u64>> {
    if message_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut select = QueryBuilder::new("SELECT message_id FROM message_items WHERE user_id = ");
    select.push_bind(user_id).push(" AND message_id IN (");
    push_ids(&mut select, message_ids);
    select.push(")");
    Ok(select.build_query_scalar().fetch_all(pool).await?)
}

/// Which of `message_ids` (live announcements) the user has no item for
/// (a deleted one counts as had: it stays deleted) and the user's
/// preferences let through, in ONE query on the user's shard: what a read
/// must materialize. Nothing, the common case, means no write at all.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn missing_announcements(
    pool: &MySqlPool,
    user_id: u64,
    message_ids: &[u64],
) -> Result<Vec<u64>> {
    if message_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut select = QueryBuilder::new(
        "SELECT c.message_id FROM message_contents c LEFT JOIN user_preferences p ON p.user_id = ",
    );
    select.push_bind(user_id).push(" WHERE c.revoked = 0 AND c.message_id IN (");
    push_ids(&mut select, message_ids);
    select.push(") AND ").push(preferences::LETS_THROUGH);
    select.push(" AND NOT EXISTS (SELECT 1 FROM message_items i WHERE i.user_id = ");
    select.push_bind(user_id).push(" AND i.message_id = c.message_id)");
    Ok(select.build_query_scalar().fetch_all(pool).await?)
}

/// One statement of a materialization's script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Begin,
    Lock,
    Item,
    Other,
    Commit,
}

/// Materializes announcements for a user in one transaction, sent as ONE
/// script ([`super::script`]): locks the user's inbox-state row (so
/// concurrent materializations of the user queue), and for each
/// announcement writes the item if the user has none and their preferences
/// let it through (an announcement in a muted category, unless critical, is
/// neither shown nor counted; one sent before the user was erased never
/// comes back), and only then, by the item statement's `ROW_COUNT()`,
/// counts it in the announcement's stats and records the user among its
/// recipients; then moves the user's watermark. With `repair` (Redis did
/// not answer the caller's invalidation), records the user in
/// [`super::badge_repairs`]. Returns how many items were written.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn materialize(
    pool: &MySqlPool,
    user_id: u64,
    message_ids: &[u64],
    repair: bool,
) -> Result<u64> {
    if message_ids.is_empty() {
        return Ok(0);
    }
    let script = materialize_script(user_id, message_ids, repair);
    let mut conn = pool.acquire().await?;
    match super::script::run(&mut conn, script).await {
        Ok(outcomes) => Ok(outcomes
            .iter()
            .filter(|(step, _)| *step == Step::Item)
            .map(|(_, outcome)| outcome.rows_affected)
            .sum()),
        Err((e, fit)) => {
            if !fit {
                conn.close_on_drop();
            }
            Err(e)
        }
    }
}

fn materialize_script(user_id: u64, message_ids: &[u64], repair: bool) -> Built<Step> {
    let user = Arg::Int(user_id);
    // In one of many slots, by user: the first reads of a new announcement
    // come all at once, and one row for all of them would queue every
    // materialization behind one lock held to its commit.
    let slot = Arg::Int(super::chunks::materialize_slot(user_id));
    let mut script = Script::new();
    script.push(Step::Begin, "START TRANSACTION", &[]);
    // Creates or exclusively locks the user's state row in one statement.
    script.push(
        Step::Lock,
        "INSERT INTO user_inbox_state (user_id) VALUES (?) \
         ON DUPLICATE KEY UPDATE announcement_watermark = announcement_watermark",
        &[user],
    );
    for id in message_ids {
        let id = Arg::Int(*id);
        script.push(Step::Item, MATERIALIZE_ITEM, &[user, user, id, user]);
        // Only when the item was written (the statement before changed a
        // row), and then this one changes one or two: the next follows it.
        script.push(
            Step::Other,
            "INSERT INTO message_shard_stats (message_id, slot, delivered) \
             SELECT ?, ?, 1 FROM DUAL WHERE ROW_COUNT() > 0 \
             ON DUPLICATE KEY UPDATE delivered = delivered + 1",
            &[id, slot],
        );
        // Who has the announcement: its recipients, in user order by message.
        script.push(
            Step::Other,
            "INSERT IGNORE INTO announcement_recipients (message_id, user_id) \
             SELECT ?, ? FROM DUAL WHERE ROW_COUNT() > 0",
            &[id, user],
        );
    }
    if repair {
        script.push(Step::Other, super::badge_repairs::RECORD, &[user]);
    }
    let newest = Arg::Int(message_ids.iter().copied().max().unwrap_or(0));
    script.push(
        Step::Other,
        "UPDATE user_inbox_state SET announcement_watermark = \
         GREATEST(announcement_watermark, ?) WHERE user_id = ?",
        &[newest, user],
    );
    script.push(Step::Commit, "COMMIT", &[]);
    script.build(Step::Other)
}

/// Writes user `?`'s item of announcement `?` from its content copy, if
/// the user has none (under the state row's lock, so none can appear
/// meanwhile) and their preferences let it through (read under that lock:
/// a preference change applies to what materializes after it).
const MATERIALIZE_ITEM: &str = concat!(
    "INSERT INTO message_items (user_id, message_id, category, expire_at) \
     SELECT ?, c.message_id, c.category, c.expire_at FROM message_contents c \
     LEFT JOIN user_preferences p ON p.user_id = ? \
     WHERE c.message_id = ? AND c.revoked = 0 AND ",
    lets_through!(),
    " AND NOT EXISTS (SELECT 1 FROM message_items i WHERE i.user_id = ? \
     AND i.message_id = c.message_id)"
);
