//! Writes that go on while Redis is away: Redis is a cache, so an inbox write
//! (an item update, an announcement's materialization, a preference change,
//! a group ack) never fails because Redis does not answer.
//!
//! A writer runs the badge protocol's "before commit" ([`begin`]); when
//! Redis does not answer it, the write records the user in
//! `badge_repairs` in its own transaction and commits. Nothing cached can
//! then outlive the write unnoticed: while Redis is away nobody reads it
//! (badges come from MySQL), and once it answers, every worker's settler
//! ([`settle`], every half second) retires the recorded users' cached
//! badges, pages and group cursors and tells their gateway streams, then
//! forgets them. A write that met Redis before its commit and lost it after
//! leaves the user's dirty marker, which keeps the user's state uncached
//! until it expires, as before.

use sqlx::MySqlPool;
use tracing::warn;

use crate::context::Context;
use crate::events;
use notify_domain::error::Result;
use notify_store::db::{badge_repairs, retrying};

/// Before a write's commit: invalidates the user's cached badge and pages
/// (and group cursors, with `memberships`) and marks the user dirty.
/// Returns true when Redis did not answer: the write records the user for
/// repair in its transaction.
pub(crate) async fn begin(ctx: &Context, user_id: u64, memberships: bool) -> bool {
    let began = match ctx.cache.begin_count_change(user_id).await {
        Ok(()) if memberships => ctx.cache.begin_membership_change(&[user_id]).await,
        began => began,
    };
    match began {
        Ok(()) => false,
        Err(e) => {
            metrics::counter!("notify_badge_repairs_recorded_total").increment(1);
            warn!(error = %e, user_id, "redis did not answer a write's invalidation, the write records the user for repair");
            true
        }
    }
}

/// After a write's commit (or its failure): counts the writer out of the
/// user's dirty markers and invalidates again. On failure the markers
/// expire by themselves, and caching resumes then.
pub(crate) async fn end(ctx: &Context, user_id: u64, memberships: bool) {
    if memberships && let Err(e) = ctx.cache.end_membership_change(&[user_id]).await {
        warn!(error = %e, user_id, "could not clear a group cursor change marker");
    }
    if let Err(e) = ctx.cache.end_count_change(user_id).await {
        warn!(error = %e, user_id, "could not clear a badge change marker");
    }
}

/// Retires the cached state of up to `limit` users recorded on this shard
/// (badge, pages, group cursors), tells their streams, and forgets them.
/// Fails, retiring nothing more, while Redis does not answer.
pub async fn settle(ctx: &Context, pool: &MySqlPool, limit: u32) -> Result<u64> {
    let due = retrying("badge_repairs::due", || badge_repairs::due(pool, limit)).await?;
    if due.is_empty() {
        return Ok(0);
    }
    let users: Vec<u64> = due.iter().map(|(user_id, _)| *user_id).collect();
    ctx.cache.invalidate_counts(&users).await?;
    ctx.cache.invalidate_memberships(&users).await?;
    retrying("badge_repairs::forget", || badge_repairs::forget(pool, &due)).await?;
    metrics::counter!("notify_badge_repairs_settled_total").increment(users.len() as u64);
    let settled = users.len() as u64;
    events::badges_changed(ctx, users).await;
    Ok(settled)
}
