//! The status cache of sends: what a worker checks before every chunk.
//!
//! The home shard's `messages.status` is the truth; `status_version` grows
//! with every change. Every transition writes MySQL first, then caches
//! `version:status` in Redis with a compare-and-set that only moves versions
//! forward, so a delayed write of an older status (a slow StartMessage, a
//! worker filling the cache from an old read) can never overwrite a newer
//! one.

use tracing::warn;

use crate::context::Context;
use notify_domain::domain::{MessageId, SendStatus};
use notify_domain::error::Result;
use notify_store::db::messages;

/// Returns a send's status: from the cache, else from its home shard (then
/// cached). `None` when the send does not exist.
pub async fn status_of(ctx: &Context, message_id: MessageId) -> Result<Option<SendStatus>> {
    match ctx.cache.cached_status(message_id.get()).await {
        Ok(Some(status)) => return SendStatus::from_db(status).map(Some),
        Ok(None) => {}
        Err(e) => {
            warn!(error = %e, message_id = %message_id, "status cache unavailable, reading the home shard")
        }
    }
    let home = ctx.pools.for_message(message_id.get());
    let Some((status, version)) = messages::fetch_status_version(&home, message_id).await? else {
        return Ok(None);
    };
    let ttl = ctx.settings.send.status_cache_ttl_secs;
    if let Err(e) = ctx.cache.write_status(message_id.get(), version, status.to_db(), ttl).await {
        warn!(error = %e, message_id = %message_id, "could not cache a message status");
    }
    Ok(Some(status))
}

/// Caches the send's current status and version, read from its home shard.
pub(crate) async fn refresh_status(ctx: &Context, message_id: MessageId) -> Result<()> {
    let home = ctx.pools.for_message(message_id.get());
    if let Some((status, version)) = messages::fetch_status_version(&home, message_id).await? {
        let ttl = ctx.settings.send.status_cache_ttl_secs;
        ctx.cache.write_status(message_id.get(), version, status.to_db(), ttl).await?;
    }
    Ok(())
}

/// Refreshes the cache where a stale entry is harmless (a start or resume:
/// at worst workers skip chunks until the entry expires and the sweeper
/// re-publishes them).
pub(crate) async fn refresh_status_best_effort(ctx: &Context, message_id: MessageId) {
    if let Err(e) = refresh_status(ctx, message_id).await {
        warn!(error = %e, message_id = %message_id, "could not refresh the cached status");
    }
}
