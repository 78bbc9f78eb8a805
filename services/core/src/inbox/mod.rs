//! The read side: inbox pages, mark-read and unread badges, with the counter
//! protocol of [`notify_cache`] (MySQL is the truth, Redis a leased copy).

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use shard_router::Key;
use tracing::{instrument, warn};

use crate::announce;
use crate::context::Context;
use crate::events::{self, BusEvent};
use crate::groups;
use notify_cache::{CachedCounts, PageToStore, RebuiltCount};
use notify_domain::domain::UserId;
use notify_domain::error::{Error, Result};
use notify_store::db::items::{self, InboxQuery, InboxRow};

/// Largest inbox page.
pub const MAX_PAGE_SIZE: u32 = 100;
/// Most ids in MarkRead or BatchGetUnreadCounts.
pub const MAX_BATCH_IDS: usize = 1000;

const CURSOR_VERSION: &str = "v1";

/// Encodes an opaque page token for "ids below `message_id`".
pub fn encode_cursor(message_id: u64) -> String {
    URL_SAFE_NO_PAD.encode(format!("{CURSOR_VERSION}:{message_id}"))
}

/// Decodes a page token; an empty token means the first page.
pub fn decode_cursor(token: &str, field: &str) -> Result<u64> {
    if token.is_empty() {
        return Ok(u64::MAX);
    }
    let malformed = || Error::invalid(field, "is not a page token returned by this service");
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| malformed())?;
    let text = String::from_utf8(bytes).map_err(|_| malformed())?;
    let (version, id) = text.split_once(':').ok_or_else(malformed)?;
    if version != CURSOR_VERSION {
        return Err(malformed());
    }
    id.parse().map_err(|_| malformed())
}

/// One inbox page as read from the user's shard.
#[derive(Debug, Clone, Default)]
pub struct InboxPage {
    /// The items, newest first.
    pub items: Vec<InboxRow>,
    /// The token of the next page; empty on the last page.
    pub next_page_token: String,
}

/// How the caller (the api) turns an inbox page into what it sends, and
/// back from the bytes the page cache holds: a page is cached as its
/// encoding, so that a hit is decoded once and not built again.
pub trait PageFormat {
    /// The page as the caller sends it.
    type Page;

    /// Builds the page from what the shard returned.
    fn build(page: InboxPage) -> Self::Page;

    /// Encodes the page for the cache.
    fn encode(page: &Self::Page) -> Vec<u8>;

    /// Decodes a cached page; an error (logged) reads as a miss.
    fn decode(bytes: &[u8]) -> std::result::Result<Self::Page, String>;
}

/// The page cache's name of a page query: everything that selects its rows.
/// The leading version retires every cached page when the encoding changes.
fn page_field(query: &InboxQuery<'_>) -> String {
    format!(
        "v1:{}:{}:{}:{}",
        query.before,
        query.limit,
        u8::from(query.unread_only),
        query.category.unwrap_or("")
    )
}

/// Lists a user's inbox page: from the page cache (see [`notify_cache`]'s
/// `pages`) when it holds the page, else in one query on the user's shard,
/// stored for the next read if no write to the user's items came between.
/// The page is cached as the encoded response, so a hit is served as it was
/// built.
///
/// Announcements appear on the first read of the inbox after they start
/// (materialized into the user's items). A page is stored only by a read
/// whose materialization succeeded, under the epoch read before it, and
/// every announcement that starts bumps the epoch: so a hit under the
/// current epoch was built with every live announcement in place, and needs
/// no materialization check.
#[instrument(skip_all, fields(user_id = user_id.get()))]
pub async fn list<F: PageFormat>(
    ctx: &Context,
    user_id: UserId,
    query: &InboxQuery<'_>,
) -> Result<F::Page> {
    let ttl_ms = ctx.settings.inbox.page_cache_ttl_secs * 1000;
    if ttl_ms == 0 {
        materialize(ctx, user_id).await;
        return Ok(F::build(read_page(ctx, user_id, query).await?.0));
    }
    let field = page_field(query);
    let now_ms = Utc::now().timestamp_millis();
    let looked = async {
        let (epoch, _) = ctx.cache.cached_announcements().await?;
        Ok::<_, Error>((epoch, ctx.cache.cached_page(user_id.get(), &field, epoch, now_ms).await?))
    }
    .await;
    let epoch = match looked {
        Ok((_, Some(cached))) => match F::decode(cached.payload()) {
            Ok(page) => {
                notify_domain::hot_counter!("notify_inbox_page_cache_hits_total").increment(1);
                return Ok(page);
            }
            Err(e) => {
                warn!(error = %e, user_id = user_id.get(), "undecodable cached inbox page");
                None
            }
        },
        Ok((epoch, None)) => Some(epoch),
        Err(e) => {
            metrics::counter!("notify_inbox_page_cache_errors_total").increment(1);
            tracing::debug!(error = %e, "inbox page cache unavailable, reading mysql");
            None
        }
    };
    notify_domain::hot_counter!("notify_inbox_page_cache_misses_total").increment(1);
    // The lease after materializing: materializing invalidates the user's
    // pages (it writes items), leases included.
    let materialized = materialize(ctx, user_id).await;
    let lease = match epoch.filter(|_| materialized) {
        Some(epoch) => match ctx.cache.lease_page(user_id.get(), &field).await {
            Ok(token) => Some((epoch, token)),
            Err(e) => {
                tracing::debug!(error = %e, "could not lease an inbox page");
                None
            }
        },
        None => None,
    };
    let (page, earliest_expiry_ms) = read_page(ctx, user_id, query).await?;
    let page = F::build(page);
    if let Some((epoch, token)) = lease {
        let deadline_ms =
            earliest_expiry_ms.map_or(now_ms + ttl_ms as i64, |at| at.min(now_ms + ttl_ms as i64));
        let payload = F::encode(&page);
        let entry = PageToStore {
            user_id: user_id.get(),
            query: &field,
            token,
            epoch,
            deadline_ms,
            payload: &payload,
            ttl_ms,
            max_fields: ctx.settings.inbox.page_cache_pages,
        };
        if let Err(e) = ctx.cache.store_page(&entry).await {
            tracing::debug!(error = %e, "could not cache an inbox page");
        }
    }
    Ok(page)
}

/// Materializes the user's live announcements; false (logged) when some
/// could not be: the read goes on without them, and its page is not cached.
async fn materialize(ctx: &Context, user_id: UserId) -> bool {
    // Boxed: inlined, its future's nesting took the callers' (ListInbox, the
    // event stream's snapshot) past the compiler's query depth in release
    // builds.
    match Box::pin(announce::materialize(ctx, user_id.get())).await {
        Ok(complete) => complete,
        Err(e) => {
            warn!(error = %e, user_id = user_id.get(), "could not materialize announcements");
            false
        }
    }
}

/// Reads an inbox page in one query on the user's shard; returns it with
/// the earliest expiry (unix ms) among the rows that decided it (the page
/// and the row after it).
async fn read_page(
    ctx: &Context,
    user_id: UserId,
    query: &InboxQuery<'_>,
) -> Result<(InboxPage, Option<i64>)> {
    let pool = ctx.pools.for_user(user_id.get());
    let fetch = InboxQuery { limit: query.limit + 1, ..query.clone() };
    let mut rows = match ctx.reads.as_ref().and_then(|reads| reads.get(pool.shard())) {
        Some(reads) => {
            let mut lent = reads.acquire().await?;
            let mut rows = items::list(lent.conn(), user_id.get(), &fetch).await;
            if rows.is_err() && lent.was_idle() {
                lent = reads.reconnect(lent).await?;
                rows = items::list(lent.conn(), user_id.get(), &fetch).await;
            }
            let rows = rows?;
            lent.give_back();
            rows
        }
        None => {
            let read = || items::list(&*pool, user_id.get(), &fetch);
            notify_store::db::retry_read_on_broken_connection(read).await?
        }
    };
    let earliest_expiry_ms =
        rows.iter().filter_map(|row| row.expire_at).map(|at| at.and_utc().timestamp_millis()).min();
    let next_page_token = if rows.len() > query.limit as usize {
        rows.truncate(query.limit as usize);
        rows.last().map(|row| encode_cursor(row.message_id))
    } else {
        None
    };
    let page = InboxPage { items: rows, next_page_token: next_page_token.unwrap_or_default() };
    Ok((page, earliest_expiry_ms))
}

/// Marks messages read; returns (ids changed, ids unknown).
#[instrument(skip_all, fields(user_id = user_id.get(), ids = message_ids.len()))]
pub async fn mark_read(
    ctx: &Context,
    user_id: UserId,
    message_ids: &[u64],
) -> Result<(Vec<u64>, Vec<u64>)> {
    let pool = ctx.writable(Key::User(user_id.get())).await?;
    ctx.cache.begin_count_change(user_id.get()).await?;
    let result = items::mark_read(&pool, user_id.get(), message_ids).await;
    finish_count_change(ctx, user_id).await;
    if result.as_ref().is_ok_and(|(changed, _)| !changed.is_empty()) {
        badges_changed(ctx, user_id).await;
    }
    result
}

/// Marks all (or a category's, or up to an id) unread items read.
#[instrument(skip_all, fields(user_id = user_id.get()))]
pub async fn mark_all_read(
    ctx: &Context,
    user_id: UserId,
    category: Option<&str>,
    up_to: Option<u64>,
) -> Result<u64> {
    let pool = ctx.writable(Key::User(user_id.get())).await?;
    ctx.cache.begin_count_change(user_id.get()).await?;
    let result = items::mark_all_read(&pool, user_id.get(), category, up_to).await;
    finish_count_change(ctx, user_id).await;
    if result.as_ref().is_ok_and(|changed| *changed > 0) {
        badges_changed(ctx, user_id).await;
    }
    result
}

/// Tells gateway streams that a user's badge changed.
pub(crate) async fn badges_changed(ctx: &Context, user_id: UserId) {
    let event = BusEvent::BadgesChanged { user_ids: vec![user_id.get()] };
    events::publish_best_effort(ctx, &event).await;
}

async fn finish_count_change(ctx: &Context, user_id: UserId) {
    // On failure the dirty marker expires by itself and caching resumes.
    if let Err(e) = ctx.cache.end_count_change(user_id.get()).await {
        warn!(error = %e, user_id = user_id.get(), "could not clear a badge change marker");
    }
}

/// Returns users' unread counts, in input order, from Redis where cached,
/// rebuilt from each user's shard where not.
#[instrument(skip_all, fields(users = user_ids.len()))]
pub async fn unread_counts(ctx: &Context, user_ids: &[u64]) -> Result<Vec<u64>> {
    let cached = ctx.cache.cached_counts(user_ids).await;
    counts_from(ctx, user_ids, cached).await
}

/// A user's whole badge: the inbox count and the group total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Badge {
    /// Unread inbox items (including live announcements).
    pub unread: u64,
    /// Unread group messages over all the user's groups.
    pub group_unread: u64,
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
    let group_unread = groups.map(|summary| summary.total).unwrap_or_else(|e| {
        metrics::counter!("notify_badge_group_errors_total").increment(1);
        warn!(error = %e, user_id = user_id.get(), "group unread unavailable, badge shows 0");
        0
    });
    Ok(Badge { unread: counts?.first().copied().unwrap_or(0), group_unread })
}

/// [`unread_counts`] given what the cache held.
async fn counts_from(
    ctx: &Context,
    user_ids: &[u64],
    cached: Result<CachedCounts>,
) -> Result<Vec<u64>> {
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
        return Ok(counts.into_iter().map(|c| c.unwrap_or(0)).collect());
    }
    notify_domain::hot_counter!("notify_badge_cache_misses_total").increment(missing.len() as u64);
    let rebuilt = rebuild(ctx, epoch, &missing).await?;
    Ok(user_ids
        .iter()
        .zip(counts)
        .map(|(user, cached)| cached.or_else(|| rebuilt.get(user).copied()).unwrap_or(0))
        .collect())
}

/// Counts badges in MySQL (items plus unmaterialized live announcements) and
/// caches them under leases taken before counting.
async fn rebuild(ctx: &Context, epoch: Option<u64>, user_ids: &[u64]) -> Result<HashMap<u64, u64>> {
    // No epoch: the cache read failed, so count without caching.
    let leases = if epoch.is_some() { ctx.cache.take_leases(user_ids).await.ok() } else { None };
    let live = announce::active(ctx).await?;
    let counts = user_ids.iter().map(|user_id| {
        let live = &live;
        async move {
            let pool = ctx.pools.for_user(*user_id);
            let ids: Vec<u64> = live.iter().map(|a| a.message_id).collect();
            let (truth, present) = items::badge_truth(&pool, *user_id, &ids).await?;
            let pending: Vec<_> =
                live.iter().filter(|a| !present.contains(&a.message_id)).collect();
            let expiries = pending.iter().filter_map(|a| a.expire_at_ms);
            let next_expiry_ms = truth
                .next_expiry
                .map(|at| at.and_utc().timestamp_millis())
                .into_iter()
                .chain(expiries)
                .min();
            Ok::<_, Error>((*user_id, truth.unread + pending.len() as u64, next_expiry_ms))
        }
    });
    let truths = futures::future::try_join_all(counts).await?;
    if let (Some(epoch), Some(tokens)) = (epoch, leases) {
        let max_ttl_ms = ctx.settings.inbox.counter_ttl_secs * 1000;
        let now_ms = Utc::now().timestamp_millis();
        let entries: Vec<RebuiltCount> = truths
            .iter()
            .zip(tokens)
            .map(|((user_id, count, next_expiry_ms), token)| {
                let ttl_ms = next_expiry_ms
                    .map(|at| (at - now_ms).max(1) as u64)
                    .map_or(max_ttl_ms, |until_expiry| until_expiry.min(max_ttl_ms));
                RebuiltCount { user_id: *user_id, token, count: *count, ttl_ms }
            })
            .collect();
        if let Err(e) = ctx.cache.store_counts(epoch, &entries).await {
            warn!(error = %e, "could not cache rebuilt badges");
        }
    }
    Ok(truths.into_iter().map(|(user, count, _)| (user, count)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        assert_eq!(decode_cursor(&encode_cursor(42), "page_token").unwrap(), 42);
        assert_eq!(decode_cursor("", "page_token").unwrap(), u64::MAX);
        let err = decode_cursor("not-a-token!", "page_token").unwrap_err();
        assert!(err.to_string().starts_with("page_token: "), "{err}");
        assert!(decode_cursor(&URL_SAFE_NO_PAD.encode("v9:1"), "page_token").is_err());
    }
}
