//! Preference rows a fan-out run writes before its send (mutes, languages):
//! straight into each user's shard with the store's upsert, so MySQL holds
//! what `SetPreferences` leaves there.

use std::time::Instant;

use anyhow::Context as _;
use notify_domain::Settings;
use sqlx::QueryBuilder;

use crate::harness;

/// Rows per preferences INSERT.
const SEED_ROWS: usize = 5_000;

/// A `user_preferences` column a run sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Column {
    /// Comma-separated muted categories.
    MutedCategories,
    /// The user's language (a canonical BCP 47 tag).
    Locale,
}

impl Column {
    fn name(self) -> &'static str {
        match self {
            Self::MutedCategories => "muted_categories",
            Self::Locale => "locale",
        }
    }
}

/// Sets `column` to each `(user, value)` of `rows`, on each user's shard
/// (multi-row `INSERT ... ON DUPLICATE KEY UPDATE` of that column only, so
/// columns set before stay; the shards in parallel). Returns the seconds.
pub(super) async fn seed(
    settings: &Settings,
    column: Column,
    rows: &[(u64, &str)],
) -> anyhow::Result<f64> {
    let map = settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut per_slot: Vec<Vec<(u64, &str)>> = vec![Vec::new(); settings.database.shards.len()];
    for (user, value) in rows {
        let slot = map.slot_of(map.shard_for_user(*user)).context("shard slot")?;
        per_slot[slot].push((*user, value));
    }
    let pools = harness::shard_pools(settings, 2).await?;
    let name = column.name();
    let started = Instant::now();
    let writes = per_slot.iter().zip(&pools).map(|(rows, pool)| async move {
        for part in rows.chunks(SEED_ROWS) {
            let mut insert =
                QueryBuilder::new(format!("INSERT INTO user_preferences (user_id, {name}) "));
            insert.push_values(part, |mut row, (user_id, value)| {
                row.push_bind(*user_id).push_bind(*value);
            });
            insert.push(format!(" ON DUPLICATE KEY UPDATE {name} = VALUES({name})"));
            insert.build().execute(pool).await?;
        }
        Ok::<_, anyhow::Error>(())
    });
    futures::future::try_join_all(writes).await?;
    let secs = started.elapsed().as_secs_f64();
    for pool in pools {
        pool.close().await;
    }
    Ok(secs)
}

/// `ANALYZE TABLE user_preferences` on every shard: the statistics a shard
/// whose preferences grew over time has. Rows written in bulk a moment ago
/// leave InnoDB's saying the table is empty (it recalculates them in the
/// background, and had not on 3 of 4 shards 40 s after a seed), and a join
/// of a recipients' `JSON_TABLE` to the table the optimizer may order then
/// scans the table once for each chunk.
pub(super) async fn analyze(settings: &Settings) -> anyhow::Result<()> {
    for pool in harness::shard_pools(settings, 1).await? {
        sqlx::raw_sql("ANALYZE TABLE user_preferences").execute(&pool).await?;
        pool.close().await;
    }
    Ok(())
}
