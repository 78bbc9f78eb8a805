//! The badge: a user's unread and unseen counts (the list shows unread, the
//! bell unseen), answered from Redis and rebuilt from the user's shard on a
//! miss, under the counter protocol of `notify_cache` (leases and dirty
//! markers, so a count read before a concurrent commit is never cached).

use std::collections::HashMap;

use chrono::Utc;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tracing::{instrument, warn};

use crate::announce;
use crate::context::Context;
use crate::groups;
use notify_cache::{CachedCounts, Counts, RebuiltCount};
use notify_domain::domain::UserId;
use notify_domain::error::{Error, Result};
use notify_store::db::items::{self, BadgeState};

/// A user's whole badge: the inbox counts and the group total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Badge {
    /// Unread inbox items (including live announcements not muted).
    pub unread: u64,
    /// Of those, the ones not seen either.
    pub unseen: u64,
    /// Unread group messages over the user's groups it does not mute;
    /// `None` when they could not be read (a group's home shard is down):
    /// unknown, never shown as 0.
    pub group_unread: Option<u64>,
}

/// Returns users' inbox counts, in input order, from Redis where cached,
/// rebuilt from each user's shard where not.
#[instrument(skip_all, fields(users = user_ids.len()))]
pub async fn counts(ctx: &Context, user_ids: &[u64]) -> Result<Vec<Counts>> {
    let cached = ctx.cache.cached_counts(user_ids).await;
    counts_from(ctx, user_ids, cached).await
}

/// Returns a user's inbox and group unread counts, reading everything the
/// cache holds for them in ONE Redis round trip.
#[instrument(skip_all, fields(user_id = user_id.get()))]
pub async fn badge(ctx: &Context, user_id: UserId) -> Result<Badge> {
    let users = [user_id.get()];
    let (counts, groups) = match ctx.cache.cached_user_state(user_id.get()).await {
        Ok(state) => (Ok(state.badge), Ok(state.groups)),
        Err(e) => {
            let unavailable = || Error::Unavailable(e.to_string());
            (Err(unavailable()), Err(unavailable()))
        }
    };
    let (counts, groups) = futures::future::join(
        counts_from(ctx, &users, counts),
        groups::unread_from(ctx, user_id, groups),
    )
    .await;
    // The group total may need the home shards of the user's groups; one of
    // them being down must not take the inbox badge with it.
    let group_unread = match groups {
        Ok(summary) => Some(summary.total),
        Err(e) => {
            metrics::counter!("notify_badge_group_errors_total").increment(1);
            warn!(error = %e, user_id = user_id.get(), "group unread unavailable, the badge says unknown");
            None
        }
    };
    let inbox = counts?.first().copied().unwrap_or_default();
    Ok(Badge { unread: inbox.unread, unseen: inbox.unseen, group_unread })
}

/// [`counts`] given what the cache held.
async fn counts_from(
    ctx: &Context,
    user_ids: &[u64],
    cached: Result<CachedCounts>,
) -> Result<Vec<Counts>> {
    let cached = match cached {
        Ok(cached) => Some(cached),
        Err(e) => {
            warn!(error = %e, "badge cache unavailable, counting in mysql");
            None
        }
    };
    let epoch = cached.as_ref().map(|c| c.epoch);
    let counts = cached.map_or_else(|| vec![None; user_ids.len()], |c| c.counts);
    let missing: Vec<u64> =
        user_ids.iter().zip(&counts).filter(|(_, c)| c.is_none()).map(|(u, _)| *u).collect();
    if missing.is_empty() {
        notify_domain::hot_counter!("notify_badge_cache_hits_total")
            .increment(user_ids.len() as u64);
        return Ok(counts.into_iter().map(Option::unwrap_or_default).collect());
    }
    notify_domain::hot_counter!("notify_badge_cache_misses_total").increment(missing.len() as u64);
    let rebuilt = rebuild(ctx, epoch, &missing).await?;
    Ok(user_ids
        .iter()
        .zip(counts)
        .map(|(user, cached)| cached.or_else(|| rebuilt.get(user).copied()).unwrap_or_default())
        .collect())
}

/// A badge from its MySQL state: the items' counts plus the live
/// announcements the user has no item for and does not mute (both unread
/// and unseen); and when the counts change next by an expiry, in ms since
/// the epoch.
pub(crate) fn counted(state: &BadgeState, live: &[announce::Active]) -> (Counts, Option<i64>) {
    let pending: Vec<_> = live
        .iter()
        .filter(|a| !state.present.contains(&a.message_id))
        .filter(|a| !state.suppression.holds_back(a.message_id, &a.category, a.critical))
        .collect();
    let expiries = pending.iter().filter_map(|a| a.expire_at_ms);
    let next_expiry_ms = state
        .truth
        .next_expiry
        .map(|at| at.and_utc().timestamp_millis())
        .into_iter()
        .chain(expiries)
        .min();
    let counts = Counts {
        unread: state.truth.unread + pending.len() as u64,
        unseen: state.truth.unseen + pending.len() as u64,
    };
    (counts, next_expiry_ms)
}

/// One user's badge counted in MySQL, and when its count next changes by
/// itself (an item expiring), in ms since the epoch.
async fn count_one(
    ctx: &Context,
    live: &[announce::Active],
    announcement_ids: &[u64],
    user_id: u64,
) -> Result<(u64, Counts, Option<i64>)> {
    let pool = ctx.pools.for_user(user_id);
    let state = items::badge_state(&pool, user_id, announcement_ids).await?;
    let (counts, next_expiry_ms) = counted(&state, live);
    Ok((user_id, counts, next_expiry_ms))
}

/// Counts badges in MySQL (items plus the live announcements the user has
/// not materialized and does not mute: both unread and unseen) and caches
/// them under leases taken before counting.
async fn rebuild(
    ctx: &Context,
    epoch: Option<u64>,
    user_ids: &[u64],
) -> Result<HashMap<u64, Counts>> {
    // No epoch: the cache read failed, so count without caching.
    let leases = if epoch.is_some() { ctx.cache.take_leases(user_ids).await.ok() } else { None };
    let (live, complete) = announce::active_list(ctx).await?;
    let ids: Vec<u64> = live.iter().map(|a| a.message_id).collect();
    // As many counts in flight as the pools have connections: more would
    // only wait for one, each holding its future (a pool acquire and a
    // transaction's queries), which for a batch of 1,000 users missing the
    // cache was ~60 MB of the api at once. In the users' order.
    let in_flight = (ctx.settings.database.pool_max as usize)
        .saturating_mul(ctx.settings.database.shards.len())
        .max(1);
    let mut users = user_ids.iter();
    let mut running = FuturesOrdered::new();
    let mut truths = Vec::with_capacity(user_ids.len());
    loop {
        while running.len() < in_flight {
            let Some(user_id) = users.next() else { break };
            running.push_back(count_one(ctx, &live, &ids, *user_id));
        }
        match running.next().await {
            Some(truth) => truths.push(truth?),
            None => break,
        }
    }
    // A count that left out a down shard's announcements is not cached: the
    // reads after it count again, and count them once the shard is back.
    if let (Some(epoch), Some(tokens), true) = (epoch, leases, complete) {
        let max_ttl_ms = ctx.settings.inbox.counter_ttl_secs * 1000;
        let now_ms = Utc::now().timestamp_millis();
        let entries: Vec<RebuiltCount> = truths
            .iter()
            .zip(tokens)
            .map(|((user_id, counts, next_expiry_ms), token)| {
                let ttl_ms = next_expiry_ms
                    .map(|at| (at - now_ms).max(1) as u64)
                    .map_or(max_ttl_ms, |until_expiry| until_expiry.min(max_ttl_ms));
                RebuiltCount { user_id: *user_id, token, counts: *counts, ttl_ms }
            })
            .collect();
        if let Err(e) = ctx.cache.store_counts(epoch, &entries).await {
            warn!(error = %e, "could not cache rebuilt badges");
        }
    }
    Ok(truths.into_iter().map(|(user, counts, _)| (user, counts)).collect())
}
