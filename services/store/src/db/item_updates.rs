//! Changes to a user's items on the user's shard: seen, read, unread,
//! archived, unarchived, deleted, for a list of ids or for every item a
//! list filter selects ([`ItemFilter`]: the same conditions as the list, so
//! "all" is exactly what the user was shown). Each call is one transaction.
//! For a list of ids, the read counts of the sends follow in it (the user's
//! slot of `message_shard_stats`, [`read_slot`]), and so do the reads recorded by message
//! (`message_reads`: a read adds the row, a mark-unread removes it), which
//! answer "who read it". For a filter, which may change every item of the
//! inbox, they follow from one row of [`super::read_backlog`] written in
//! it, a moment after. The user's badge state is read in the same
//! transaction, and the whole of it is one round trip ([`update`]).

use std::collections::HashSet;

use sqlx::mysql::MySqlRow;
use sqlx::{MySqlPool, Row};
use tracing::instrument;

use super::chunks::read_slot;
use super::direct::DirectConnections;
use super::items::{BadgeState, COUNT_UNREAD, ItemFilter, NOT_REVOKED, NOW, UnreadTruth};
use super::preferences::{SUPPRESSION, Suppression};
use super::script::{self, Arg, Built, Outcome, Script, Sql};
use super::{event_outbox, read_backlog, read_feed};
use crate::error::Result;
use notify_domain::Error;

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

    /// The assignments to the items `i`, evaluated left to right. Times go
    /// to the never-NULL columns ([`super::item_times`]), changed in place.
    fn assignments(self) -> &'static str {
        match self {
            Action::MarkSeen => "i.is_seen = 1, i.seen_time = UTC_TIMESTAMP(3)",
            Action::MarkRead => concat!(
                "i.seen_time = IF(",
                has_seen_time!("i"),
                ", i.seen_time, UTC_TIMESTAMP(3)), i.is_seen = 1, i.is_read = 1, \
                 i.read_time = UTC_TIMESTAMP(3)"
            ),
            // The read's time becomes the seen time when the item had none
            // of its own, read while it is still read (left to right).
            Action::MarkUnread => concat!(
                "i.seen_time = IF(",
                has_seen_time!("i"),
                ", i.seen_time, COALESCE(",
                read_time!("i"),
                ", UTC_TIMESTAMP(3))), i.is_seen = 1, i.is_read = 0, i.read_time = ",
                not_yet!()
            ),
            Action::Archive => "i.is_archived = 1, i.archived_time = UTC_TIMESTAMP(3)",
            Action::Unarchive => concat!("i.is_archived = 0, i.archived_time = ", not_yet!()),
            Action::Delete => "i.is_deleted = 1",
        }
    }

    /// The condition under which the action changes an item (on `i`).
    fn changes(self) -> &'static str {
        match self {
            Action::MarkSeen => " AND i.is_seen = 0",
            Action::MarkRead => " AND i.is_read = 0",
            Action::MarkUnread => " AND i.is_read = 1",
            Action::Archive => " AND i.is_archived = 0",
            Action::Unarchive => " AND i.is_archived = 1",
            Action::Delete => "",
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

/// What an update did, and the user's badge state right after it.
#[derive(Debug, Clone)]
pub struct Updated {
    /// Items that changed.
    pub changed: u64,
    /// Their ids, for a list of ids (a filter's are in its backlog row).
    pub changed_ids: Vec<u64>,
    /// Ids the user has no item for (for a list of ids).
    pub unknown: Vec<u64>,
    /// The user's badge state after the change, read in its transaction.
    pub badge: BadgeState,
    /// The row of the event recorded with the change, when one was given.
    pub recorded: Option<u64>,
}

/// The time a filtered read or unread's items expire against, fixed by
/// the script's first statements ([`FIX_NOW`]): its backlog row and its
/// `UPDATE` each select the items, and each statement reads the clock anew,
/// so an item expiring between the two would be recorded as read (its
/// send's read count up by one) and stay unread. A user variable, set back
/// to NULL at the script's end ([`UNFIX_NOW`]).
const FIXED_NOW: &str = "@notify_now";

/// Sets [`FIXED_NOW`].
const FIX_NOW: &str = "SET @notify_now = UTC_TIMESTAMP(3)";

/// Unsets [`FIXED_NOW`] (NULL, as a new connection has it: nothing else
/// sets it).
const UNFIX_NOW: &str = "SET @notify_now = NULL";

/// What one statement of an update's script is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Session,
    Begin,
    Found,
    Waiting,
    Changed,
    Backlog,
    ReadCounts,
    Reads,
    Feed,
    Update,
    Count,
    Present,
    Suppression,
    Repair,
    Outbox,
    OutboxId,
    Commit,
    Reset,
}

/// Applies `action` to the user's items `target` selects and reads the
/// user's badge state (as [`super::items::badge_state`] does, for
/// `announcement_ids`) in the same transaction: ONE round trip, the
/// transaction going as one script ([`super::script`]: values written in,
/// session state set back at its end).
///
/// Ids are locked first (those found, the rest are unknown), then the
/// user's reads waiting to be counted; a filter's items are what a list
/// with it shows (of sends not withdrawn, as the badge counts them).
/// Then, over the items the action changes: for ids, their ids, the read
/// counts by message, an unread's recorded reads deleted, and (a read, with
/// `feed`: some endpoint wants `item.read`) the reads for the feed
/// ([`read_feed`]); for a filter, the backlog row (which also locks its
/// items, so the update changes the same ones, and whose count feeds
/// `item.read`); then the update, a read's recorded reads (from the items
/// now read, with their read time and delivery), and the badge's reads.
///
/// With `event`, the transaction records it in [`super::event_outbox`] (its
/// row id is in the answer).
///
/// With `repair` (Redis did not answer the caller's "before commit"
/// invalidation), the transaction also records the user in
/// [`super::badge_repairs`], whose settler retires the user's cached state
/// once Redis answers.
///
/// The script goes on one of the shard's `direct` connections when the
/// api has them (given back without sqlx's ping, [`super::direct`]), else
/// on a pooled one. A script that fails is rolled back on its connection,
/// which is closed when that fails too.
#[allow(clippy::too_many_arguments)]
#[instrument(level = "debug", skip_all, fields(db.system = "mysql", action = action.name()))]
pub async fn update(
    pool: &MySqlPool,
    direct: Option<&DirectConnections>,
    user_id: u64,
    action: Action,
    target: Target<'_>,
    announcement_ids: &[u64],
    feed: bool,
    repair: bool,
    event: Option<&[u8]>,
) -> Result<Updated> {
    if let Target::Ids([]) = target {
        let badge = super::items::badge_state(pool, user_id, announcement_ids).await?;
        let (changed_ids, unknown) = (Vec::new(), Vec::new());
        return Ok(Updated { changed: 0, changed_ids, unknown, badge, recorded: None });
    }
    let script = script(user_id, action, target, announcement_ids, feed, repair, event)?;
    let ran = match direct {
        Some(direct) => {
            let mut lent = direct.acquire_for_write().await?;
            let ran = script::run(lent.conn(), script).await;
            // Dropped, a lent connection closes.
            if !matches!(ran, Err((_, false))) {
                lent.give_back();
            }
            ran
        }
        None => {
            let mut conn = pool.acquire().await?;
            let ran = script::run(&mut conn, script).await;
            if matches!(ran, Err((_, false))) {
                conn.close_on_drop();
            }
            ran
        }
    };
    let (mut updated, found) = read(ran.map_err(|(e, _)| e)?)?;
    if let Target::Ids(ids) = target {
        let found: HashSet<u64> = found.into_iter().collect();
        updated.unknown = ids.iter().copied().filter(|id| !found.contains(id)).collect();
    }
    Ok(updated)
}

/// The script of an update.
fn script(
    user_id: u64,
    action: Action,
    target: Target<'_>,
    announcement_ids: &[u64],
    feed: bool,
    repair: bool,
    event: Option<&[u8]>,
) -> Result<Built<Step>> {
    let user = Arg::Int(user_id);
    let delta = action.read_delta();
    let mut script = Script::new();
    // A filtered read or unread selects its items twice (backlog, update).
    let twice = delta != 0 && matches!(target, Target::All(_));
    if twice {
        let (raise, restore) =
            (read_backlog::RAISE_AGGREGATE_LIMIT, read_backlog::RESTORE_AGGREGATE_LIMIT);
        script.session(Step::Session, raise, &[], restore);
        script.session(Step::Session, FIX_NOW, &[], UNFIX_NOW);
    }
    script.push(Step::Begin, "START TRANSACTION", &[]);
    // What the update changes, and for a list of ids the items it names
    // (changed or not).
    let (selected, named) = match target {
        Target::Ids(ids) => {
            // An item of a withdrawn send (recalled, a cancelled
            // announcement) is unknown, as no list shows it: a read of it
            // would count for a send taken back.
            let mut named = Sql::new(
                concat!("WHERE i.user_id = ? AND ", not_deleted!("i"), " AND i.message_id IN (?)"),
                &[user, Arg::Ints(ids)],
            );
            named.push(NOT_REVOKED, &[]);
            let found = "SELECT i.message_id FROM message_items i ? FOR UPDATE";
            script.push(Step::Found, found, &[Arg::Sql(&named)]);
            if delta != 0 {
                // After the items, as every writer of a user's items locks
                // them: a waiting read of this user is counted before or
                // after this update, never across it.
                script.push(Step::Waiting, read_backlog::LOCK_WAITING, &[user]);
            }
            let mut selected = named.clone();
            selected.push(action.changes(), &[]);
            (selected, Some(named))
        }
        // Items alone, their withdrawn sends tested by NOT IN: with a join
        // to the content copies MariaDB runs a multi-table UPDATE, which
        // first copies every row it changes to a temporary table whenever
        // it reads them by an index the update writes (a read or unread
        // would, with an index over `is_read`), then reads each
        // back; 10,000 items: the script took 185 ms against 137 ms
        // without the join.
        Target::All(filter) => {
            let mut selected = Sql::new("WHERE i.user_id = ?", &[user]);
            selected.append(&filter.item_conditions(if twice { FIXED_NOW } else { NOW })?);
            selected.push(action.changes(), &[]).push(NOT_REVOKED, &[]);
            (selected, None)
        }
    };
    let selection = Arg::Sql(&selected);
    if named.is_some() {
        // Before the update moves them out of the selection; a locking read
        // sees what the update will.
        let changed = "SELECT i.message_id FROM message_items i ? LOCK IN SHARE MODE";
        script.push(Step::Changed, changed, &[selection]);
    }
    if twice {
        // A filter's items are counted from one row, after the update
        // (read_backlog): the row reads them with a shared lock, so the
        // update changes exactly the ids it holds.
        script.push(Step::Backlog, read_backlog::RECORD, &[user, Arg::Signed(delta), selection]);
    } else if delta != 0 {
        let slot = Arg::Int(read_slot(user_id));
        script.push(
            Step::ReadCounts,
            "INSERT INTO message_shard_stats (message_id, slot, read_count) \
             SELECT i.message_id, ?, ? FROM message_items i ? \
             ON DUPLICATE KEY UPDATE read_count = read_count + VALUES(read_count)",
            &[slot, Arg::Signed(delta), selection],
        );
        if action == Action::MarkUnread {
            script.push(
                Step::Reads,
                "DELETE r FROM message_items i JOIN message_reads r \
                 ON r.message_id = i.message_id AND r.user_id = i.user_id ?",
                &[selection],
            );
        }
        if feed && action == Action::MarkRead {
            script.push(Step::Feed, read_feed::RECORD, &[selection]);
        }
    }
    let assignments = Sql::new(action.assignments(), &[]);
    script.push(
        Step::Update,
        "UPDATE message_items i SET ? ?",
        &[Arg::Sql(&assignments), selection],
    );
    if let (Action::MarkRead, Some(named)) = (action, &named) {
        // After the update, from the items, so that the record holds the
        // item's own read time and delivery (a page of readers reads this
        // table alone): every named item now read, those read before
        // included (their rows hold the same).
        script.push(Step::Reads, RECORD_READS, &[Arg::Sql(named)]);
    }
    script.push(Step::Count, COUNT_UNREAD, &[user]);
    if !announcement_ids.is_empty() {
        script.push(
            Step::Present,
            "SELECT message_id FROM message_items WHERE user_id = ? AND message_id IN (?)",
            &[user, Arg::Ints(announcement_ids)],
        );
        script.push(Step::Suppression, SUPPRESSION, &[user]);
    }
    if repair {
        script.push(Step::Repair, super::badge_repairs::RECORD, &[user]);
    }
    if let Some(event) = event {
        script.push(Step::Outbox, event_outbox::RECORD, &[Arg::Bytes(event)]);
        script.push(Step::OutboxId, event_outbox::RECORDED_ID, &[]);
    }
    script.push(Step::Commit, "COMMIT", &[]);
    Ok(script.build(Step::Reset))
}

/// The reads a read by ids records, from the items it names (`?`, a
/// `WHERE`), after the update.
const RECORD_READS: &str = concat!(
    "INSERT INTO message_reads (message_id, user_id, read_at, delivered_at) \
     SELECT i.message_id, i.user_id, ",
    read_time!("i"),
    ", i.created_at FROM message_items i ? AND i.is_read = 1 \
     ON DUPLICATE KEY UPDATE read_at = VALUES(read_at), delivered_at = VALUES(delivered_at)"
);

/// Reads what an update's statements answered: the update, and the ids
/// found (for a list of ids).
fn read(outcomes: Vec<(Step, Outcome)>) -> Result<(Updated, Vec<u64>)> {
    let malformed = |what: &str| Error::Internal(format!("an item update's script: {what}"));
    let ids = |outcome: &Outcome| -> Result<Vec<u64>> {
        Ok(outcome.rows.iter().map(|row| row.try_get(0)).collect::<sqlx::Result<_>>()?)
    };
    let mut changed = None;
    let mut truth = None;
    let mut found = Vec::new();
    let mut changed_ids = Vec::new();
    let mut present = Vec::new();
    let mut suppression = None;
    let mut recorded = None;
    for (step, outcome) in &outcomes {
        let row = outcome.rows.first();
        match step {
            Step::Update => changed = Some(outcome.rows_affected),
            Step::Found => found = ids(outcome)?,
            Step::Changed => changed_ids = ids(outcome)?,
            Step::Waiting => {}
            Step::Count => {
                let row = row.ok_or_else(|| malformed("no count"))?;
                truth = Some(UnreadTruth::from_row(count_row(row)?));
            }
            Step::Present => present = ids(outcome)?,
            Step::Suppression => {
                suppression =
                    row.map(|row| Ok::<_, crate::Error>((row.try_get(0)?, row.try_get(1)?)));
            }
            Step::OutboxId => recorded = row.map(|row| row.try_get::<u64, _>(0)).transpose()?,
            _ if row.is_some() => {
                return Err(malformed("a row from a statement that has none").into());
            }
            _ => {}
        }
    }
    let changed = changed.ok_or_else(|| malformed("no update"))?;
    let truth = truth.ok_or_else(|| malformed("no count"))?;
    let suppression = Suppression::from_row(suppression.transpose()?);
    let badge = BadgeState { truth, present, suppression };
    let unknown = Vec::new();
    Ok((Updated { changed, changed_ids, unknown, badge, recorded }, found))
}

fn count_row(row: &MySqlRow) -> Result<(i64, i64, Option<chrono::NaiveDateTime>)> {
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::items::View;

    /// An update's script as its steps and its text.
    fn parts(
        user_id: u64,
        action: Action,
        target: Target<'_>,
        announcement_ids: &[u64],
        feed: bool,
        repair: bool,
        event: Option<&[u8]>,
    ) -> Result<(Vec<Step>, String)> {
        let built = script(user_id, action, target, announcement_ids, feed, repair, event)?;
        Ok((built.steps, built.text))
    }

    #[test]
    fn a_filtered_update_is_one_script_with_a_result_per_statement() {
        let filter =
            ItemFilter { view: View::Inbox, category: Some("billing.eu"), ..Default::default() };
        let (steps, sql) =
            parts(42, Action::MarkRead, Target::All(filter), &[7, 9], true, false, None).unwrap();
        // The feed of a filtered read is written when its row is counted.
        let expected = [
            [Step::Session, Step::Session, Step::Begin, Step::Backlog].as_slice(),
            &[Step::Update, Step::Count, Step::Present, Step::Suppression, Step::Commit],
            &[Step::Reset, Step::Reset],
        ];
        assert_eq!(steps, expected.concat());
        assert_eq!(sql.split(";\n").count(), steps.len());
        assert!(!sql.contains('?'), "every value is written in: {sql}");
        assert!(sql.contains("i.category = 'billing.eu'"), "{sql}");
        // No join: MariaDB would copy every changed row to a temporary table.
        assert!(!sql.contains("JOIN"), "{sql}");
        assert!(sql.contains(&format!("AND i.is_read = 0{NOT_REVOKED}")), "{sql}");
        // The ids as a JSON array joined by GROUP_CONCAT, 2 ms less than
        // JSON_ARRAYAGG for 10,000 (read_backlog::RECORD).
        assert!(sql.contains("CONCAT('[', GROUP_CONCAT(i.message_id), ']')"), "{sql}");
        assert!(!sql.contains("JSON_ARRAYAGG"), "{sql}");
        // The backlog row and the update expire items against one time, and
        // the session is set back after the commit: a pooled connection
        // leaves as it came.
        assert!(
            sql.starts_with(
                "SET SESSION group_concat_max_len = 4294967295;\n\
                 SET @notify_now = UTC_TIMESTAMP(3);\nSTART TRANSACTION;"
            ),
            "{sql}"
        );
        assert!(
            sql.ends_with(
                "COMMIT;\nSET SESSION group_concat_max_len = DEFAULT;\nSET @notify_now = NULL"
            ),
            "{sql}"
        );
        assert_eq!(sql.matches("i.expire_at > @notify_now").count(), 2, "{sql}");
        assert_eq!(sql.matches("i.expire_at > UTC_TIMESTAMP(3)").count(), 1, "the count's: {sql}");
        let (steps, sql) =
            parts(42, Action::Archive, Target::All(filter), &[], false, false, None).unwrap();
        assert_eq!(steps, [Step::Begin, Step::Update, Step::Count, Step::Commit]);
        // One statement selects the items: the clock as it starts, and no
        // session state to set or set back.
        assert!(!sql.contains("@notify_now") && sql.contains("i.expire_at > UTC_TIMESTAMP(3)"));
        assert!(!sql.contains("SET SESSION") && !sql.contains("SET @"), "{sql}");
        let (steps, sql) =
            parts(42, Action::Archive, Target::Ids(&[5, 6]), &[], false, false, None).unwrap();
        let expected = [Step::Begin, Step::Found, Step::Changed, Step::Update, Step::Count];
        assert_eq!(steps, [&expected[..], &[Step::Commit]].concat());
        assert!(sql.contains("i.message_id IN (5, 6)"), "{sql}");
        // Readers of one send count in slots by user, not all in one row.
        for user in [42, 43] {
            let (_, sql) =
                parts(user, Action::MarkRead, Target::Ids(&[5]), &[], false, false, None).unwrap();
            let slot = read_slot(user);
            assert!((1..super::super::chunks::STATS_SLOTS).contains(&slot));
            assert!(sql.contains(&format!("SELECT i.message_id, {slot}, 1 FROM")), "{sql}");
        }
        assert_ne!(read_slot(42), read_slot(43));
        let (steps, _) =
            parts(42, Action::MarkUnread, Target::Ids(&[5]), &[], false, false, None).unwrap();
        let expected = [Step::Begin, Step::Found, Step::Waiting, Step::Changed, Step::ReadCounts];
        assert_eq!(
            steps,
            [&expected[..], &[Step::Reads, Step::Update, Step::Count, Step::Commit]].concat()
        );
        // A read records its readers after the update, from the items.
        let (steps, sql) =
            parts(42, Action::MarkRead, Target::Ids(&[5]), &[], false, false, None).unwrap();
        assert_eq!(
            steps,
            [&expected[..], &[Step::Update, Step::Reads, Step::Count, Step::Commit]].concat()
        );
        assert!(sql.contains("i.created_at FROM message_items i WHERE i.user_id = 42"), "{sql}");
        let (steps, _) =
            parts(42, Action::MarkSeen, Target::All(filter), &[], false, false, None).unwrap();
        assert_eq!(steps, [Step::Begin, Step::Update, Step::Count, Step::Commit]);
    }

    #[test]
    fn a_read_by_ids_records_its_reads_for_the_feed_only_when_asked() {
        let fed = |action, feed| {
            let (steps, sql) =
                parts(42, action, Target::Ids(&[5, 6]), &[], feed, false, None).unwrap();
            let at = steps.iter().position(|step| *step == Step::Feed);
            if let Some(at) = at {
                // Before the update moves the items out of its selection.
                assert_eq!(steps[at + 1], Step::Update);
                assert!(sql.contains("INSERT INTO read_feed"), "{sql}");
            }
            at.is_some()
        };
        assert!(fed(Action::MarkRead, true));
        assert!(!fed(Action::MarkRead, false));
        for action in [Action::MarkUnread, Action::MarkSeen, Action::Archive, Action::Delete] {
            assert!(!fed(action, true), "{action:?}");
        }
    }

    #[test]
    fn a_category_that_could_end_its_literal_is_refused_naming_the_field() {
        for category in ["a'b", "a\\b", "A", "a;b", "a b", "a?b"] {
            let filter = ItemFilter { category: Some(category), ..Default::default() };
            let target = Target::All(filter);
            let refused = parts(42, Action::Delete, target, &[], false, false, None).unwrap_err();
            assert!(refused.to_string().starts_with("category:"), "{category:?}: {refused}");
        }
    }

    #[test]
    fn a_write_redis_did_not_see_records_its_user_for_repair_in_its_transaction() {
        let (steps, sql) =
            parts(42, Action::MarkRead, Target::Ids(&[5]), &[], false, true, None).unwrap();
        let repair = steps.iter().position(|step| *step == Step::Repair).unwrap();
        assert_eq!(steps[repair + 1], Step::Commit, "in the transaction");
        assert!(sql.contains("INSERT INTO badge_repairs (user_id, changed_at) VALUES (42,"));
        let (steps, _) =
            parts(42, Action::MarkRead, Target::Ids(&[5]), &[], false, false, None).unwrap();
        assert!(!steps.contains(&Step::Repair));
    }
}
