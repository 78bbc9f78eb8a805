//! Changes to a user's items: seen, read, unread, archived, unarchived,
//! deleted, for a list of ids or for everything a list filter selects. Each
//! is one transaction on the user's shard between the badge's "before" and
//! "after commit" invalidations, publishes one event for gateways (never one
//! per item) and answers the user's new counts; for a filter, the counts are
//! read in the update's transaction, and the whole update is one round trip
//! to the user's shard. A filter's reads are counted for the sends a moment
//! later ([`read_counts`]). While some endpoint wants `item.read`, reads
//! are recorded for it, by ids in the update and by a filter when counted
//! ([`super::read_feed`] queues them).

use shard_router::Key;
use tracing::{instrument, warn};

use super::badge::counted;
use super::read_counts;
use crate::announce;
use crate::context::Context;
use crate::events::{self, BusEvent, BusFilter};
use crate::repair;
use notify_cache::Counts;
use notify_domain::domain::UserId;
use notify_domain::error::Result;
use notify_store::db::item_updates::{self, Action, Target};
use notify_store::db::items::{ItemFilter, View};

/// What an update changed, and the user's counts after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// Items that changed.
    pub changed: u64,
    /// Ids the user has no item for (for a list of ids).
    pub unknown: Vec<u64>,
    /// The user's unread and unseen counts after the change.
    pub counts: Counts,
}

/// Applies `action` to a user's items: `target` names ids (up to
/// [`super::MAX_BATCH_IDS`]) or a list filter, whose scope is exactly what
/// [`super::list`] shows with it. Live announcements the user has not seen
/// yet are materialized first, so that "all" covers them as the list does.
#[instrument(skip_all, fields(user_id = user_id.get(), action = action.name()))]
pub async fn update_items(
    ctx: &Context,
    user_id: UserId,
    action: Action,
    target: Target<'_>,
) -> Result<Changed> {
    let user = user_id.get();
    // The badge is read in the update's transaction, which needs the live
    // announcements (as a rebuild of the badge does).
    let live = match Box::pin(announce::materialize_live(ctx, user)).await {
        Ok((live, _)) => live,
        Err(e) => {
            warn!(error = %e, user_id = user, "could not materialize announcements before an update");
            announce::active(ctx).await?
        }
    };
    let pool = ctx.writable(Key::User(user)).await?;
    let live_ids: Vec<u64> = live.iter().map(|a| a.message_id).collect();
    let repair = repair::begin(ctx, user, false).await;
    let shard = pool.shard();
    let direct = ctx.direct.as_ref().and_then(|direct| direct.get(shard));
    let feed = ctx.read_feed;
    // What the relay tells gateways if this api cannot: refresh the user.
    let recorded = BusEvent::BadgesChanged { user_ids: vec![user] }.recorded_body();
    let result = notify_store::db::retrying("item_updates::update", || {
        let event = Some(recorded.as_slice());
        item_updates::update(&pool, direct, user, action, target, &live_ids, feed, repair, event)
    })
    .await;
    repair::end(ctx, user, false).await;
    drop(pool);
    let mut updated = result?;
    let event = (updated.changed > 0).then(|| {
        let (message_ids, filter) = match target {
            Target::Ids(_) => (std::mem::take(&mut updated.changed_ids), None),
            Target::All(filter) => (Vec::new(), Some(BusFilter::from(&filter))),
        };
        BusEvent::ItemsUpdated { user_id: user, action, message_ids, filter }
    });
    if let Some(id) = updated.recorded {
        events::publish_recorded(ctx, shard, id, event.as_ref()).await;
    }
    let counts_reads = matches!(action, Action::MarkRead | Action::MarkUnread);
    if counts_reads && matches!(target, Target::All(_)) && updated.changed > 0 {
        // The sends' read counts and readers follow from the row the
        // update wrote (read_counts). Last, as the call answers: counting
        // 10,000 reads keeps MariaDB busy for a while, and the event and
        // the answer should not share the cores with it.
        read_counts::count_soon(ctx, user);
    }
    let counts = counted(&updated.badge, &live).0;
    Ok(Changed { changed: updated.changed, unknown: updated.unknown, counts })
}

/// Marks messages read; returns how many changed and the ids the user has
/// no item for. The same as `update_items` with `MarkRead` and the ids.
pub async fn mark_read(ctx: &Context, user_id: UserId, message_ids: &[u64]) -> Result<Changed> {
    update_items(ctx, user_id, Action::MarkRead, Target::Ids(message_ids)).await
}

/// Marks every unread item read (optionally one category's, up to an id),
/// archived or not. The same as `update_items` with `MarkRead` over every
/// item of the view `All`.
pub async fn mark_all_read(
    ctx: &Context,
    user_id: UserId,
    category: Option<&str>,
    up_to: Option<u64>,
) -> Result<Changed> {
    let filter = ItemFilter { view: View::All, category, up_to, ..ItemFilter::default() };
    update_items(ctx, user_id, Action::MarkRead, Target::All(filter)).await
}
