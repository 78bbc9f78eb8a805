//! The read side: inbox pages by view and filter (this module), changes to
//! items ([`items`]: seen, read, unread, archived, deleted, one by one or by
//! the list's own filter) and the badge's two counts ([`badge`]), with the
//! counter protocol of `notify_cache` (MySQL is the truth, Redis a leased
//! copy).
//!
//! Inbox pages are cached as the api encodes them for the wire
//! ([`PageFormat`]), so a cache hit goes out without being built again,
//! while this crate knows nothing of the wire format.

mod badge;
mod items;
pub mod read_counts;
pub mod read_feed;

pub use badge::{Badge, badge, counts};
pub use items::{Changed, mark_all_read, mark_read, update_items};
pub use notify_store::db::item_updates::{Action, Target};
pub use notify_store::db::items::{InboxQuery, InboxRow, ItemFilter, View};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use tracing::{instrument, warn};

use crate::announce;
use crate::context::Context;
use notify_cache::PageToStore;
use notify_domain::domain::UserId;
use notify_domain::error::{Error, Result};
use notify_store::db::items as store;

/// Largest inbox page.
pub const MAX_PAGE_SIZE: u32 = 100;
/// Most ids in MarkRead, UpdateItems or BatchGetUnreadCounts.
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
/// The leading version retires every cached page when the encoding changes
/// (`v2`: items carry seen and archived, and lists have views).
pub fn page_field(query: &InboxQuery<'_>) -> String {
    let filter = &query.filter;
    format!(
        "v2:{}:{}:{}:{}{}:{}:{}",
        query.before,
        query.limit,
        filter.view.name(),
        u8::from(filter.unread_only),
        u8::from(filter.read_only),
        filter.up_to.map_or(String::new(), |id| id.to_string()),
        filter.category.unwrap_or("")
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
    let direct = ctx.direct.as_deref().and_then(|direct| direct.get(pool.shard()));
    let mut rows = notify_store::db::direct::read(direct, &pool, |conn, _| {
        Box::pin(store::list(conn, user_id.get(), &fetch))
    })
    .await?;
    let earliest_expiry_ms =
        rows.iter().filter_map(|row| row.expire_at).map(|at| at.and_utc().timestamp_millis()).min();
    let next_page_token = if rows.len() > query.limit as usize {
        rows.truncate(query.limit as usize);
        rows.last().map(|row| encode_cursor(row.message_id))
    } else {
        None
    };
    crate::render::rows(&pool, &mut rows).await?;
    let page = InboxPage { items: rows, next_page_token: next_page_token.unwrap_or_default() };
    Ok((page, earliest_expiry_ms))
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
