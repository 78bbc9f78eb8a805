//! Monthly partitions of `message_items` by message id range: which to add
//! ahead of time and which to drop past the horizon (pure planning, tested
//! without a database), and the DDL that does it.
//!
//! Message ids are time-ordered ([`notify_domain::ids::first_id_at`]), so the
//! partition `p202611` holds the items of sends made in November 2026 (UTC)
//! and ends below the first id of December. The migration leaves one
//! catch-all partition, `p_future`; maintenance splits months off it before
//! they start, so it stays empty and the split copies nothing. The first
//! monthly partition also holds everything older than its month (items of
//! an install made before partitioning), and goes when its month does.

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use sqlx::MySqlPool;
use tracing::instrument;

use notify_domain::ids;
use notify_domain::{Error, Result};
use notify_store::error::database_error;

/// The catch-all partition above every month.
pub const FUTURE: &str = "p_future";

/// One monthly partition: its name and exclusive upper bound (an id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Month {
    /// `pYYYYMM`.
    pub name: String,
    /// The first id of the next month.
    pub bound: u64,
}

/// What one maintenance run changes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Months to split off `p_future`, oldest first.
    pub add: Vec<Month>,
    /// Months wholly older than the horizon, to drop.
    pub drop: Vec<Month>,
}

/// The month `(year, month)` plus `offset` months.
fn shift(year: i32, month: u32, offset: u32) -> (i32, u32) {
    let index = year * 12 + month as i32 - 1 + offset as i32;
    (index.div_euclid(12), index.rem_euclid(12) as u32 + 1)
}

fn month_start_ms(year: i32, month: u32) -> u64 {
    NaiveDate::from_ymd_opt(year, month, 1)
        .and_then(|day| day.and_hms_opt(0, 0, 0))
        .map(|start| start.and_utc().timestamp_millis().max(0) as u64)
        .unwrap_or(0)
}

/// The partition of the month `(year, month)`.
pub fn month(year: i32, month: u32) -> Month {
    let (next_year, next_month) = shift(year, month, 1);
    Month {
        name: format!("p{year:04}{month:02}"),
        bound: ids::first_id_at(month_start_ms(next_year, next_month)),
    }
}

/// The `(year, month)` of a partition named `pYYYYMM`.
fn year_month(name: &str) -> Option<(i32, u32)> {
    let digits = name.strip_prefix('p')?;
    if digits.len() != 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let month: u32 = digits[4..].parse().ok()?;
    (1..=12).contains(&month).then_some((digits[..4].parse().ok()?, month))
}

/// Plans a run at `now`: every month after the last existing one (or from
/// the current month when there is none) up to `months_ahead` months after
/// the current one, gaps left by runs that did not happen included; and the
/// existing months whose every id is older than `now - items_days` (none
/// when `items_days` is 0: items are kept forever).
pub fn plan(existing: &[Month], now: DateTime<Utc>, months_ahead: u32, items_days: u32) -> Plan {
    let (last_year, last_month) = shift(now.year(), now.month(), months_ahead);
    let first = existing
        .iter()
        .filter_map(|m| year_month(&m.name))
        .max()
        .map(|(year, number)| shift(year, number, 1))
        .unwrap_or((now.year(), now.month()));
    let mut add = Vec::new();
    let mut next = first;
    while next <= (last_year, last_month) {
        add.push(month(next.0, next.1));
        next = shift(next.0, next.1, 1);
    }
    let drop = if items_days == 0 {
        Vec::new()
    } else {
        let horizon = now - chrono::Duration::days(i64::from(items_days));
        let horizon_id = ids::first_id_at(horizon.timestamp_millis().max(0) as u64);
        existing.iter().filter(|m| m.bound <= horizon_id).cloned().collect()
    };
    Plan { add, drop }
}

/// Reads the monthly partitions of `message_items` (without `p_future`),
/// oldest first. Fails when the table is not partitioned (migrations not
/// applied).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn existing(pool: &MySqlPool) -> Result<Vec<Month>> {
    let rows: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT PARTITION_NAME, PARTITION_DESCRIPTION FROM information_schema.PARTITIONS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'message_items' \
         ORDER BY PARTITION_ORDINAL_POSITION",
    )
    .fetch_all(pool)
    .await
    .map_err(database_error)?;
    if !rows.iter().any(|(name, _)| name.as_deref() == Some(FUTURE)) {
        return Err(Error::Internal(
            "message_items has no p_future partition: apply the migrations (notifyctl migrate)"
                .to_owned(),
        ));
    }
    let mut months = Vec::new();
    for (name, bound) in rows {
        let (Some(name), Some(bound)) = (name, bound) else { continue };
        if name == FUTURE {
            continue;
        }
        if year_month(&name).is_none() {
            return Err(Error::Internal(format!(
                "message_items has a partition {name} that is not pYYYYMM: not made by Notify"
            )));
        }
        let bound = bound.trim().parse().map_err(|_| {
            Error::Internal(format!("partition {name} has a bound that is not an id: {bound}"))
        })?;
        months.push(Month { name, bound });
    }
    Ok(months)
}

/// Splits `months` off `p_future` (one statement; it copies nothing while
/// `p_future` is empty).
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn add_months(pool: &MySqlPool, months: &[Month]) -> Result<()> {
    if months.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = months
        .iter()
        .map(|m| format!("PARTITION {} VALUES LESS THAN ({})", m.name, m.bound))
        .collect();
    let ddl = format!(
        "ALTER TABLE message_items REORGANIZE PARTITION {FUTURE} INTO ({}, \
         PARTITION {FUTURE} VALUES LESS THAN MAXVALUE)",
        parts.join(", ")
    );
    // Names and bounds are ours (pYYYYMM, integers), never a caller's.
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl)).execute(pool).await.map_err(database_error)?;
    Ok(())
}

/// Records the users with items in a partition (the cached badges of those
/// with unread items there change when it goes) in
/// `retention_pending_badges`, server side.
///
/// Every user with an item, read or not: their ids are read from the
/// primary key by a loose index scan, one probe a user. Asking for unread
/// items only would read every row of the month, since no index holds
/// `is_read` (so that marking items read changes their rows alone); a user
/// whose items there were all read has a badge invalidated for nothing,
/// which the drop's epoch bump does to every cached badge anyway.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn note_users(pool: &MySqlPool, month: &Month) -> Result<u64> {
    let sql = format!(
        "INSERT IGNORE INTO retention_pending_badges (user_id) \
         SELECT DISTINCT user_id FROM message_items PARTITION ({})",
        month.name
    );
    Ok(sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .map_err(database_error)?
        .rows_affected())
}

/// Up to `limit` users of `retention_pending_badges`, lowest ids first.
pub async fn pending_badges(pool: &MySqlPool, limit: usize) -> Result<Vec<u64>> {
    sqlx::query_scalar("SELECT user_id FROM retention_pending_badges ORDER BY user_id LIMIT ?")
        .bind(limit as u64)
        .fetch_all(pool)
        .await
        .map_err(database_error)
}

/// Forgets users whose badges were invalidated.
pub async fn forget_pending_badges(pool: &MySqlPool, users: &[u64]) -> Result<()> {
    let mut query =
        sqlx::QueryBuilder::new("DELETE FROM retention_pending_badges WHERE user_id IN (");
    notify_store::db::push_ids(&mut query, users);
    query.push(")");
    query.build().execute(pool).await.map_err(database_error)?;
    Ok(())
}

/// Drops a month of items.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn drop_month(pool: &MySqlPool, month: &Month) -> Result<()> {
    let ddl = format!("ALTER TABLE message_items DROP PARTITION {}", month.name);
    // Names and bounds are ours (pYYYYMM, integers), never a caller's.
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl)).execute(pool).await.map_err(database_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn names(months: &[Month]) -> Vec<&str> {
        months.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn a_months_bound_is_the_first_id_of_the_next_month() {
        let november = month(2026, 11);
        assert_eq!(november.name, "p202611");
        let december_start = at("2026-12-01T00:00:00Z").timestamp_millis() as u64;
        assert_eq!(november.bound, ids::first_id_at(december_start));
        assert!(ids::first_id_at(december_start - 1) < november.bound);
        assert_eq!(month(2026, 12).bound, ids::first_id_at(month_start_ms(2027, 1)));
    }

    #[test]
    fn the_first_run_adds_this_month_and_the_months_ahead() {
        let plan = plan(&[], at("2026-11-23T10:00:00Z"), 2, 180);
        assert_eq!(names(&plan.add), ["p202611", "p202612", "p202701"]);
        assert!(plan.drop.is_empty());
    }

    #[test]
    fn later_runs_add_only_the_missing_months_and_fill_gaps() {
        let existing = [month(2026, 11), month(2026, 12), month(2027, 1)];
        let same_month = plan(&existing, at("2026-11-30T23:59:59Z"), 2, 180);
        assert!(same_month.add.is_empty());
        let next_month = plan(&existing, at("2026-12-01T00:00:00Z"), 2, 180);
        assert_eq!(names(&next_month.add), ["p202702"]);
        // A run after months without one adds every month up to the new
        // ahead mark, the skipped ones included.
        let much_later = plan(&existing, at("2027-04-02T00:00:00Z"), 1, 0);
        assert_eq!(names(&much_later.add), ["p202702", "p202703", "p202704", "p202705"]);
    }

    #[test]
    fn only_months_wholly_past_the_horizon_are_dropped() {
        let existing = [month(2026, 5), month(2026, 6), month(2026, 7), month(2026, 8)];
        // Horizon 2026-07-01T00:00: June ends exactly there, July does not.
        let plan = plan(&existing, at("2026-07-31T00:00:00Z"), 0, 30);
        assert_eq!(names(&plan.drop), ["p202605", "p202606"]);
        assert!(super::plan(&existing, at("2030-01-01T00:00:00Z"), 0, 0).drop.is_empty());
    }
}
