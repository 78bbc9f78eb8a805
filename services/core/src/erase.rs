//! Erasure of a user (the right to be forgotten): every item, preference,
//! announcement watermark, group membership and cursor of the user, on every
//! shard, and every cached count, page and cursor in Redis.
//!
//! A personalized send's chunks still to apply lose the user's own vars;
//! applied ones kept none (the items held them).
//!
//! What stays is a marker on the user's shard holding the user id and a
//! message id taken at the erasure (`user_preferences.erased_before`): sends
//! queued for the user before it (chunks not applied yet, announcements not
//! materialized yet) write nothing for the user and count the user as
//! suppressed. Sends created after it are new messages to that id and are
//! delivered as usual. The sends' totals (delivered, read) keep their
//! numbers: they hold nothing of the user's.

use shard_router::Key;
use tracing::{info, instrument, warn};

use crate::context::Context;
use crate::events::{self, BusEvent};
use crate::groups;
use notify_domain::domain::UserId;
use notify_domain::error::{Error, Result};
use notify_domain::ids;
use notify_store::db::{chunks, erasure, event_outbox, groups as group_store, preferences};
use notify_store::error::database_error;

/// How far past the erasure the marker reaches (clock skew between replicas).
pub const ERASURE_MARGIN_MS: u64 = 1_000;

/// What an erasure removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Erased {
    /// Inbox items (deleted ones included).
    pub items: u64,
    /// Group memberships (with their cursors).
    pub memberships: u64,
}

/// Erases a user everywhere; safe to repeat (a second run finds nothing).
#[instrument(skip_all, fields(user_id = user_id.get()))]
pub async fn erase_user(ctx: &Context, user_id: UserId) -> Result<Erased> {
    let user = user_id.get();
    // Every send queued before this id skips the user from now on: ids are
    // time-ordered per replica, so the margin covers sends another replica
    // (its clock a little ahead) created just before.
    let now_ms = chrono::Utc::now().timestamp_millis().max(0) as u64;
    let erased_before = ids::first_id_at(now_ms + ERASURE_MARGIN_MS);

    // Memberships through the groups' own path, so each group's routes and
    // member events stay right; then whatever a move left on other shards.
    let pool = ctx.pools.for_user(user);
    let memberships = group_store::memberships(&pool, user).await?;
    drop(pool);
    let mut erased = Erased::default();
    for membership in &memberships {
        match groups::remove_members(ctx, membership.group_id, &[user]).await {
            Ok(removed) => erased.memberships += removed,
            // A group deleted since: nothing of the user's is left in it.
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }

    let home = ctx.writable(Key::User(user)).await?;
    ctx.cache.begin_count_change(user).await?;
    if let Err(e) = ctx.cache.begin_membership_change(&[user]).await {
        end_changes(ctx, user).await;
        return Err(e);
    }
    let event = BusEvent::BadgesChanged { user_ids: vec![user] };
    let mut recorded = None;
    let removed = async {
        // The marker first: from its commit on, no apply writes for the user.
        // Its transaction records the event that tells gateways.
        let mut marking = home.begin().await.map_err(database_error)?;
        preferences::mark_erased(&mut *marking, user, erased_before).await?;
        recorded = Some(event_outbox::record(&mut marking, &event.recorded_body()).await?);
        marking.commit().await.map_err(database_error)?;
        let mut removed = erasure::Removed::default();
        for (shard, pool) in ctx.pools.iter() {
            let on_shard = erasure::remove_user(pool, user, shard == home.shard()).await?;
            removed.add(&on_shard);
            chunks::forget_vars(pool, user, erased_before).await?;
        }
        Ok::<_, Error>(removed)
    }
    .await;
    end_changes(ctx, user).await;
    let home_shard = home.shard();
    drop(home);
    let removed = removed?;
    erased.items = removed.items;
    erased.memberships += removed.memberships;
    // Nothing of the user's is cached any more.
    if let Err(e) = ctx.cache.invalidate_counts(&[user]).await {
        warn!(error = %e, user_id = user, "could not invalidate the erased user's badge");
    }
    if let Some(id) = recorded {
        events::publish_recorded(ctx, home_shard, id, Some(&event)).await;
    }
    info!(user_id = user, items = erased.items, memberships = erased.memberships, "user erased");
    Ok(erased)
}

async fn end_changes(ctx: &Context, user_id: u64) {
    if let Err(e) = ctx.cache.end_membership_change(&[user_id]).await {
        warn!(error = %e, user_id, "could not clear a group cursor change marker");
    }
    if let Err(e) = ctx.cache.end_count_change(user_id).await {
        warn!(error = %e, user_id, "could not clear a badge change marker");
    }
}
