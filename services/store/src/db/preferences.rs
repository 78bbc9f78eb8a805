//! A user's preferences row (`user_preferences`, on the user's shard): what
//! they mute, their language, and since when they are erased. The fan-out checks it in the
//! same statement that writes the items ([`LETS_THROUGH`]), so a preference
//! costs one primary-key lookup per recipient, and nothing for users who
//! have none.

use crate::error::Result;
use notify_domain::preferences::{Locale, Preferences, join_list, split_list};
use sqlx::MySqlPool;
use tracing::instrument;

/// [`LETS_THROUGH`] as a literal, for `concat!`.
macro_rules! lets_through {
    () => {
        "(p.user_id IS NULL OR NOT (p.erased_before > c.message_id \
         OR (c.critical = 0 AND c.category <> '' AND FIND_IN_SET(c.category, p.muted_categories) > 0)))"
    };
}

/// SQL condition: the preferences `p` (LEFT JOINed on the recipient, so NULL
/// when there are none) let through an item of the content copy `c`
/// (`message_id`, `category`, `critical`). Held back: sends in a muted
/// category unless critical, and sends queued before the user was erased.
pub const LETS_THROUGH: &str = lets_through!();

/// What a user's preferences hold back, as a badge rebuild needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Suppression {
    /// Muted categories.
    pub muted_categories: Vec<String>,
    /// Sends with a smaller id are never delivered (0: not erased).
    pub erased_before: u64,
}

impl Suppression {
    /// True when an item of `message_id` in `category` is held back.
    pub fn holds_back(&self, message_id: u64, category: &str, critical: bool) -> bool {
        self.erased_before > message_id
            || (!critical
                && !category.is_empty()
                && self.muted_categories.iter().any(|c| c == category))
    }
}

/// The languages of those of `user_ids` (on this shard) who set one.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn locales<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    user_ids: &[u64],
) -> Result<Vec<(u64, String)>> {
    if user_ids.is_empty() {
        return Ok(Vec::new());
    }
    let json = serde_json::to_string(user_ids)
        .map_err(|e| notify_domain::Error::Internal(e.to_string()))?;
    let sql = format!(
        // The recipients first, whatever the statistics say: a plan that
        // scanned the preferences table (stale row counts after a bulk
        // write) cost seconds a chunk.
        "SELECT STRAIGHT_JOIN p.user_id, p.locale FROM {} JOIN user_preferences p \
         ON p.user_id = j.user_id WHERE p.locale <> ''",
        super::chunks::RECIPIENT_ROWS
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(json).fetch_all(db).await?)
}

/// Reads a user's preferences (empty when the user has none).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn get<'e>(db: impl sqlx::MySqlExecutor<'e>, user_id: u64) -> Result<Preferences> {
    let row: Option<(String, String, String)> = sqlx::query_as(
        "SELECT muted_categories, muted_group_ids, locale FROM user_preferences WHERE user_id = ?",
    )
    .bind(user_id)
    .fetch_optional(db)
    .await?;
    Ok(row.map_or_else(Preferences::default, |(categories, groups, locale)| Preferences {
        muted_categories: split_list(&categories),
        muted_group_ids: split_list(&groups),
        // Stored as parsed: a tag that no longer parses reads as none.
        locale: (!locale.is_empty()).then(|| Locale::parse(&locale, "locale").ok()).flatten(),
    }))
}

/// Replaces a user's mutes and locale (an erasure marker stays as it is) and records
/// `event` in [`super::event_outbox`] (its row id is returned); with
/// `repair` (Redis did not answer the caller's invalidation), records the
/// user in [`super::badge_repairs`], all in one transaction.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn set(
    pool: &MySqlPool,
    user_id: u64,
    preferences: &Preferences,
    repair: bool,
    event: &[u8],
) -> Result<u64> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO user_preferences (user_id, muted_categories, muted_group_ids, locale) \
         VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
         muted_categories = VALUES(muted_categories), muted_group_ids = VALUES(muted_group_ids), \
         locale = VALUES(locale)",
    )
    .bind(user_id)
    .bind(join_list(&preferences.muted_categories))
    .bind(join_list(&preferences.muted_group_ids))
    .bind(preferences.locale.as_ref().map_or("", Locale::as_str))
    .execute(&mut *tx)
    .await?;
    if repair {
        super::badge_repairs::record(&mut tx, user_id).await?;
    }
    let recorded = super::event_outbox::record(&mut tx, event).await?;
    tx.commit().await?;
    Ok(recorded)
}

/// Reads what a user's preferences hold back.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn suppression<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
) -> Result<Suppression> {
    let row = sqlx::query_as(SUPPRESSION).bind(user_id).fetch_optional(db).await?;
    Ok(Suppression::from_row(row))
}

/// The read [`suppression`] runs, for one user id (`?`).
pub(crate) const SUPPRESSION: &str =
    "SELECT muted_categories, erased_before FROM user_preferences WHERE user_id = ?";

impl Suppression {
    /// From the row of [`SUPPRESSION`], if the user has one.
    pub(crate) fn from_row(row: Option<(String, u64)>) -> Self {
        row.map_or_else(Self::default, |(categories, erased_before)| Self {
            muted_categories: split_list(&categories),
            erased_before,
        })
    }
}

/// Leaves only the erasure marker of a user: no mutes, no locale, and items of sends
/// with an id below `before` (queued before the erasure) never written.
pub async fn mark_erased<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    user_id: u64,
    before: u64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO user_preferences (user_id, erased_before) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE muted_categories = '', muted_group_ids = '', locale = '', \
         erased_before = GREATEST(erased_before, VALUES(erased_before))",
    )
    .bind(user_id)
    .bind(before)
    .execute(db)
    .await?;
    Ok(())
}
