//! Retention: what grows with every send is removed on its own schedule.
//!
//! - Items (`message_items`) live in monthly partitions by message id; a
//!   month is dropped whole once it is all older than `retention.items_days`
//!   (a DDL statement, not a billion-row DELETE), and the months ahead are
//!   created before they start. Users who had unread items in a dropped
//!   month get their cached badges invalidated. The month's recipient
//!   records (`message_reads`, `announcement_recipients`) go with it.
//! - Hidden items, those of cancelled announcements and of expired
//!   messages, are purged `retention.purge_hidden_after_secs` after they
//!   were hidden, with the content row.
//! - A finished send's chunks go after `retention.chunks_days`; its control
//!   row, stats, batches, contents and idempotency key after
//!   `retention.sends_days`; audit rows after `retention.audit_days`.
//!
//! One process works on a shard at a time (a MySQL named lock), so worker
//! replicas and `notifyctl retention` can all run it.

pub mod partitions;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::MySqlPool;
use tracing::{info, instrument, warn};

use notify_cache::Cache;
use notify_domain::Result;
use notify_domain::ids;
use notify_domain::settings::RetentionSettings;
use notify_store::db::ShardPools;
use notify_store::db::chunks::{decode_user_ids, state};
use notify_store::error::database_error;

/// Rows deleted per statement: short transactions, short lock waits.
const DELETE_BATCH: u32 = 1000;
/// Badge invalidations per Redis call.
const INVALIDATE_BATCH: usize = 1000;
/// The MySQL named lock that keeps one retention run per shard (named
/// locks are per server, so the shard's database name is part of it).
const LOCK_PREFIX: &str = "notify_retention.";

/// What a run did, summed over the shards.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Monthly partitions created ahead.
    pub partitions_added: Vec<String>,
    /// Monthly partitions dropped.
    pub partitions_dropped: Vec<String>,
    /// Users whose cached badge was invalidated by a drop.
    pub badges_invalidated: u64,
    /// Hidden items purged (cancelled or expired).
    pub hidden_items_purged: u64,
    /// Chunk rows deleted.
    pub chunks_deleted: u64,
    /// Finished sends whose control rows were deleted.
    pub sends_deleted: u64,
    /// Audit rows deleted.
    pub audit_rows_deleted: u64,
    /// Group messages deleted.
    pub group_messages_deleted: u64,
    /// Group members whose cursor was moved past deleted messages.
    pub group_cursors_advanced: u64,
    /// Shards skipped because another process held their retention lock.
    pub shards_busy: u64,
}

/// Runs retention on every shard as of `now`. A shard that fails is
/// reported and the others still run; the first error is returned.
pub async fn run_once(
    pools: &ShardPools,
    cache: &Cache,
    settings: &RetentionSettings,
    now: DateTime<Utc>,
) -> Result<Report> {
    let mut report = Report::default();
    let mut first_error = None;
    for (shard, pool) in pools.iter() {
        if let Err(e) = run_on_shard(pool, cache, settings, now, &mut report).await {
            warn!(error = %e, shard = shard.0, "retention failed on a shard");
            first_error.get_or_insert(e);
        }
    }
    match delete_old_sends(pools, settings, now).await {
        Ok(deleted) => report.sends_deleted += deleted,
        Err(e) => {
            warn!(error = %e, "deleting old sends failed");
            first_error.get_or_insert(e);
        }
    }
    if let Err(e) = purge_group_messages(pools, cache, settings, now, &mut report).await {
        warn!(error = %e, "deleting old group messages failed");
        first_error.get_or_insert(e);
    }
    info!(?report, "retention run finished");
    match first_error {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

#[instrument(skip_all)]
async fn run_on_shard(
    pool: &MySqlPool,
    cache: &Cache,
    settings: &RetentionSettings,
    now: DateTime<Utc>,
    report: &mut Report,
) -> Result<()> {
    // The named lock belongs to one connection: hold it for the run.
    let mut lock = pool.acquire().await.map_err(database_error)?;
    let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(CONCAT(?, DATABASE()), 0)")
        .bind(LOCK_PREFIX)
        .fetch_one(&mut *lock)
        .await
        .map_err(database_error)?;
    if locked != Some(1) {
        report.shards_busy += 1;
        return Ok(());
    }
    let ran = async {
        maintain_partitions(pool, cache, settings, now, report).await?;
        purge_hidden(pool, settings, now, report).await?;
        delete_old_rows(pool, settings, now, report).await
    }
    .await;
    let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT(?, DATABASE()))")
        .bind(LOCK_PREFIX)
        .execute(&mut *lock)
        .await;
    ran
}

async fn maintain_partitions(
    pool: &MySqlPool,
    cache: &Cache,
    settings: &RetentionSettings,
    now: DateTime<Utc>,
    report: &mut Report,
) -> Result<()> {
    // A run that died between a drop and its invalidations left users behind.
    report.badges_invalidated += invalidate_pending(pool, cache).await?;
    let existing = partitions::existing(pool).await?;
    let plan = partitions::plan(&existing, now, settings.months_ahead, settings.items_days);
    partitions::add_months(pool, &plan.add).await?;
    report.partitions_added.extend(plan.add.into_iter().map(|m| m.name));
    for month in plan.drop {
        // Noted before the drop, invalidated after it: a badge counted in
        // between is invalidated too.
        let users = partitions::note_users(pool, &month).await?;
        partitions::drop_month(pool, &month).await?;
        // The recipient records of the month's sends go with their items.
        for sql in RECIPIENT_RECORDS_BELOW {
            delete_in_batches(pool, sql, month.bound).await?;
        }
        report.badges_invalidated += invalidate_pending(pool, cache).await?;
        // The month's read items leave cached inbox pages too, of users no
        // one noted: retire every cached page (and badge) at once.
        if let Err(e) = cache.bump_announcement_epoch().await {
            warn!(error = %e, partition = %month.name, "cached inbox pages lapse by their ttl instead");
        }
        info!(partition = %month.name, users, "dropped a month of items");
        report.partitions_dropped.push(month.name);
    }
    Ok(())
}

/// Deletes the recipient records (reads by message, announcements
/// materialized) of sends below an id, as `delete_in_batches` runs them.
const RECIPIENT_RECORDS_BELOW: [&str; 2] = [
    "DELETE FROM message_reads WHERE message_id < ? LIMIT ?",
    "DELETE FROM announcement_recipients WHERE message_id < ? LIMIT ?",
];

/// Deletes a send's recipient records on a shard (its items are purged).
async fn purge_recipient_records(pool: &MySqlPool, message_id: u64) -> Result<()> {
    for table in ["message_reads", "announcement_recipients"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table} WHERE message_id = ?")))
            .bind(message_id)
            .execute(pool)
            .await
            .map_err(database_error)?;
    }
    Ok(())
}

/// Invalidates the badges of `retention_pending_badges` a page at a time,
/// forgetting each page once Redis took it; returns how many.
async fn invalidate_pending(pool: &MySqlPool, cache: &Cache) -> Result<u64> {
    let mut invalidated = 0;
    loop {
        let users = partitions::pending_badges(pool, INVALIDATE_BATCH).await?;
        if users.is_empty() {
            return Ok(invalidated);
        }
        cache.invalidate_counts(&users).await?;
        partitions::forget_pending_badges(pool, &users).await?;
        invalidated += users.len() as u64;
    }
}

/// Purges hidden items, then their content rows: those of expired messages
/// through the recipients in the send's chunks on this shard (an expired
/// send's items whose chunks are gone already, after `chunks_days`, stay
/// hidden until their month is dropped), and those of revoked messages
/// (cancelled announcements, cancelled and recalled sends) by message id.
async fn purge_hidden(
    pool: &MySqlPool,
    settings: &RetentionSettings,
    now: DateTime<Utc>,
    report: &mut Report,
) -> Result<()> {
    let hidden_before =
        (now - chrono::Duration::seconds(settings.purge_hidden_after_secs as i64)).naive_utc();
    loop {
        let hidden: Vec<(u64, bool)> = sqlx::query_as(
            "SELECT message_id, revoked = 1 FROM message_contents \
             WHERE (revoked = 1 AND COALESCE(revoked_at, created_at) <= ?) OR expire_at <= ? \
             ORDER BY message_id LIMIT 100",
        )
        .bind(hidden_before)
        .bind(hidden_before)
        .fetch_all(pool)
        .await
        .map_err(database_error)?;
        for (message_id, revoked) in &hidden {
            if *revoked {
                purge_revoked(pool, *message_id, settings.purge_batch_rows, report).await?;
            } else {
                purge_message(pool, *message_id, report).await?;
            }
        }
        if hidden.len() < 100 {
            return Ok(());
        }
    }
}

/// Purges a revoked message's items on this shard, then its content row: a
/// cancelled announcement's (made per reader when they read their inbox,
/// so no chunk lists them), and a cancelled or recalled send's (a recall
/// marks its items and leaves the rows to this purge; a bucket move may
/// have brought some here that no chunk of this shard lists). `message_items`
/// is partitioned by message id, so the walk reads only the month partition
/// that holds the id, once; cancels and recalls are rare.
async fn purge_revoked(
    pool: &MySqlPool,
    message_id: u64,
    batch_rows: u64,
    report: &mut Report,
) -> Result<()> {
    // `message_items` has no index on message_id alone: walk its primary key
    // (user_id, message_id) upwards from the last batch's last reader, so
    // the month's partition is read once in all, not once per batch.
    let mut after = 0u64;
    loop {
        let last: Option<u64> = sqlx::query_scalar(
            "SELECT MAX(user_id) FROM (SELECT user_id FROM message_items \
             WHERE message_id = ? AND user_id > ? ORDER BY user_id LIMIT ?) batch",
        )
        .bind(message_id)
        .bind(after)
        .bind(batch_rows)
        .fetch_one(pool)
        .await
        .map_err(database_error)?;
        let Some(last) = last else { break };
        let done = sqlx::query(
            "DELETE FROM message_items WHERE message_id = ? AND user_id > ? AND user_id <= ?",
        )
        .bind(message_id)
        .bind(after)
        .bind(last)
        .execute(pool)
        .await
        .map_err(database_error)?
        .rows_affected();
        report.hidden_items_purged += done;
        after = last;
    }
    purge_recipient_records(pool, message_id).await?;
    sqlx::query("DELETE FROM message_contents WHERE message_id = ?")
        .bind(message_id)
        .execute(pool)
        .await
        .map_err(database_error)?;
    Ok(())
}

/// Purges one hidden message's items on this shard, then its content row.
async fn purge_message(pool: &MySqlPool, message_id: u64, report: &mut Report) -> Result<()> {
    let chunks: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT user_ids FROM message_chunks WHERE message_id = ? AND state IN (?, ?)",
    )
    .bind(message_id)
    .bind(state::DONE)
    .bind(state::UNSETTLED)
    .fetch_all(pool)
    .await
    .map_err(database_error)?;
    for packed in chunks {
        let user_ids = decode_user_ids(&packed)?;
        let mut delete = sqlx::QueryBuilder::new("DELETE FROM message_items WHERE message_id = ");
        delete.push_bind(message_id).push(" AND user_id IN (");
        let mut users = delete.separated(", ");
        for user_id in &user_ids {
            users.push_bind(*user_id);
        }
        delete.push(")");
        report.hidden_items_purged +=
            delete.build().execute(pool).await.map_err(database_error)?.rows_affected();
    }
    purge_recipient_records(pool, message_id).await?;
    sqlx::query("DELETE FROM message_contents WHERE message_id = ?")
        .bind(message_id)
        .execute(pool)
        .await
        .map_err(database_error)?;
    Ok(())
}

/// The first id of `days` days before `now`; 0 (nothing older) when `days`
/// is 0, which keeps rows forever.
fn horizon(now: DateTime<Utc>, days: u32) -> u64 {
    if days == 0 {
        return 0;
    }
    let at = now - chrono::Duration::days(i64::from(days));
    ids::first_id_at(at.timestamp_millis().max(0) as u64)
}

/// Deletes `sql` (which must end in `LIMIT ?`) in batches until none is left.
async fn delete_in_batches(pool: &MySqlPool, sql: &'static str, below: u64) -> Result<u64> {
    let mut deleted = 0;
    loop {
        let done = sqlx::query(sql)
            .bind(below)
            .bind(DELETE_BATCH)
            .execute(pool)
            .await
            .map_err(database_error)?
            .rows_affected();
        deleted += done;
        if done < u64::from(DELETE_BATCH) {
            return Ok(deleted);
        }
    }
}

async fn delete_old_rows(
    pool: &MySqlPool,
    settings: &RetentionSettings,
    now: DateTime<Utc>,
    report: &mut Report,
) -> Result<()> {
    // Chunks of finished work (applied or cancelled); failed chunks stay
    // with their send, for a re-drive.
    report.chunks_deleted += delete_in_batches(
        pool,
        concat!(
            "DELETE FROM message_chunks WHERE message_id < ? AND state IN (",
            notify_store::chunk_state!(DONE),
            ", ",
            notify_store::chunk_state!(CANCELLED),
            ") LIMIT ?"
        ),
        horizon(now, settings.chunks_days),
    )
    .await?;
    report.audit_rows_deleted += delete_in_batches(
        pool,
        "DELETE FROM audit_log WHERE audit_id < ? LIMIT ?",
        horizon(now, settings.audit_days),
    )
    .await?;
    Ok(())
}

/// Deletes group messages older than `retention.group_messages_days` on
/// every home shard, oldest first, a page at a time. Members still behind a
/// message about to go (offline since it was sent) first have their cursor
/// moved past it, under the same cache protocol as an ack, so
/// `max_seq - last_ack_seq` keeps counting only what a pull can return (as
/// a dropped month of items leaves a badge). Cursors move before messages
/// go, so a run stopped half-way leaves nothing inconsistent; running twice
/// (two replicas) is harmless.
async fn purge_group_messages(
    pools: &ShardPools,
    cache: &Cache,
    settings: &RetentionSettings,
    now: DateTime<Utc>,
    report: &mut Report,
) -> Result<()> {
    let below = horizon(now, settings.group_messages_days);
    if below == 0 {
        return Ok(());
    }
    for (_, home) in pools.iter() {
        loop {
            let old: Vec<(u64, u64)> = sqlx::query_as(
                "SELECT group_id, seq FROM group_messages WHERE message_id < ? \
                 ORDER BY message_id LIMIT ?",
            )
            .bind(below)
            .bind(DELETE_BATCH)
            .fetch_all(home)
            .await
            .map_err(database_error)?;
            if old.is_empty() {
                break;
            }
            // Each group's last seq going in this page.
            let mut through: BTreeMap<u64, u64> = BTreeMap::new();
            for (group_id, seq) in old {
                let last = through.entry(group_id).or_default();
                *last = (*last).max(seq);
            }
            let mut deleted = 0;
            for (group_id, seq) in through {
                report.group_cursors_advanced +=
                    advance_lagging_members(pools, cache, group_id, seq).await?;
                deleted += sqlx::query(
                    "DELETE FROM group_messages WHERE group_id = ? AND seq <= ? AND message_id < ?",
                )
                .bind(group_id)
                .bind(seq)
                .bind(below)
                .execute(home)
                .await
                .map_err(database_error)?
                .rows_affected();
                // Every cursor has passed them: recalled seqs up to here no
                // longer count (a cached copy that still lists them counts
                // them for nobody either).
                notify_store::db::groups::forget_recalls_through(home, group_id, seq).await?;
            }
            report.group_messages_deleted += deleted;
            if deleted == 0 {
                // Another run deleted this page meanwhile; it goes on from here.
                break;
            }
        }
    }
    Ok(())
}

/// Moves the cursor of every member of `group_id` still before `seq` to
/// `seq`; returns how many moved. Each cursor is written on the shard the
/// map routes its member to, outside a move's freeze (during a move a
/// member's row is on two shards for a while: a write to the copy would be
/// lost, or undone by the next sync).
async fn advance_lagging_members(
    pools: &ShardPools,
    cache: &Cache,
    group_id: u64,
    seq: u64,
) -> Result<u64> {
    let mut advanced = 0;
    for (_, pool) in pools.iter() {
        let mut after = 0u64;
        loop {
            let lagging: Vec<u64> = sqlx::query_scalar(
                "SELECT user_id FROM group_members WHERE group_id = ? AND last_ack_seq < ? \
                 AND user_id > ? ORDER BY user_id LIMIT ?",
            )
            .bind(group_id)
            .bind(seq)
            .bind(after)
            .bind(INVALIDATE_BATCH as u64)
            .fetch_all(pool)
            .await
            .map_err(database_error)?;
            let Some(last) = lagging.last() else { break };
            after = *last;
            advanced += advance_cursors(pools, cache, group_id, seq, &lagging).await?;
        }
    }
    Ok(advanced)
}

/// How long retention waits out a move's freeze before giving up (the
/// next run does it).
const FREEZE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Moves `users`' cursors of `group_id` to at least `seq`, on their shards.
async fn advance_cursors(
    pools: &ShardPools,
    cache: &Cache,
    group_id: u64,
    seq: u64,
    users: &[u64],
) -> Result<u64> {
    let buckets: Vec<u32> = users.iter().map(|u| shard_router::bucket_of(*u)).collect();
    let routes = tokio::time::timeout(FREEZE_WAIT, pools.writable_snapshot(&buckets))
        .await
        .map_err(|_| {
            notify_domain::Error::Unavailable(
                "group cursors: a shard move's freeze did not end".into(),
            )
        })?;
    cache.begin_membership_change(users).await?;
    let mut advanced = 0;
    let mut failed = None;
    for (shard, owned) in routes.partition_users(users) {
        let Some(pool) = routes.get(shard) else { continue };
        let mut update = sqlx::QueryBuilder::new(
            "UPDATE group_members SET last_ack_seq = GREATEST(last_ack_seq, ",
        );
        update.push_bind(seq).push(") WHERE group_id = ").push_bind(group_id);
        update.push(" AND user_id IN (");
        notify_store::db::push_ids(&mut update, &owned);
        update.push(")");
        match update.build().execute(pool).await {
            Ok(done) => advanced += done.rows_affected(),
            Err(e) => failed = Some(e),
        }
    }
    drop(routes);
    // On failure the dirty markers expire by themselves.
    if let Err(e) = cache.end_membership_change(users).await {
        warn!(error = %e, group_id, "could not clear group change markers");
    }
    match failed {
        Some(e) => Err(database_error(e)),
        None => Ok(advanced),
    }
}

/// Deletes finished sends (and drafts never started) older than
/// `retention.sends_days`: their rows on every shard, then the control row
/// on the home shard last, so a run stopped half-way leaves the send for
/// the next run. Live sends and announcements are never touched, however
/// old. Deleting twice (two replicas) is harmless.
async fn delete_old_sends(
    pools: &ShardPools,
    settings: &RetentionSettings,
    now: DateTime<Utc>,
) -> Result<u64> {
    let below = horizon(now, settings.sends_days);
    let mut deleted = 0;
    for (_, home) in pools.iter() {
        loop {
            let finished: Vec<u64> = sqlx::query_scalar(concat!(
                "SELECT message_id FROM messages WHERE message_id < ? \
                 AND (status IN (",
                notify_store::send_status!(COMPLETED),
                ", ",
                notify_store::send_status!(CANCELLED),
                ") OR (status = ",
                notify_store::send_status!(NOT_STARTED),
                " AND start_requested = 0)) \
                 ORDER BY message_id LIMIT 100"
            ))
            .bind(below)
            .fetch_all(home)
            .await
            .map_err(database_error)?;
            for message_id in &finished {
                for (_, pool) in pools.iter() {
                    // Idempotency keys live on the key's shard, not the home.
                    for table in [
                        "message_shard_stats",
                        "message_batches",
                        "message_contents",
                        "message_chunks",
                        "idempotency_keys",
                    ] {
                        let sql = format!("DELETE FROM {table} WHERE message_id = ?");
                        sqlx::query(sqlx::AssertSqlSafe(sql))
                            .bind(message_id)
                            .execute(pool)
                            .await
                            .map_err(database_error)?;
                    }
                }
                sqlx::query("DELETE FROM messages WHERE message_id = ?")
                    .bind(message_id)
                    .execute(home)
                    .await
                    .map_err(database_error)?;
            }
            deleted += finished.len() as u64;
            if finished.len() < 100 {
                break;
            }
        }
    }
    Ok(deleted)
}
