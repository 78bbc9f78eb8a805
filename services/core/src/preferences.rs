//! A user's preferences: the categories and groups they mute, and their
//! language (which variant of a template they read). A change
//! applies to what is delivered after it (items already delivered stay as
//! they are): the fan-out and the materialization of announcements read the
//! preferences in the statement that writes the items, and the badge (which
//! counts live announcements not yet materialized, and the groups not
//! muted) is invalidated around the change like any other write.

use shard_router::Key;
use tracing::instrument;

use crate::context::Context;
use crate::events::{self, BusEvent};
use crate::repair;
use notify_domain::domain::UserId;
use notify_domain::error::Result;
use notify_domain::preferences::Preferences;
use notify_store::db::preferences as store;
use notify_store::db::retrying;

/// Reads a user's preferences (empty when they have none).
#[instrument(skip_all, fields(user_id = user_id.get()))]
pub async fn get(ctx: &Context, user_id: UserId) -> Result<Preferences> {
    let pool = ctx.pools.for_user(user_id.get());
    Ok(store::get(&*pool, user_id.get()).await?)
}

/// Replaces a user's mutes and locale; returns them as stored.
#[instrument(skip_all, fields(user_id = user_id.get()))]
pub async fn set(ctx: &Context, user_id: UserId, preferences: &Preferences) -> Result<Preferences> {
    let user = user_id.get();
    let pool = ctx.writable(Key::User(user)).await?;
    // Both caches show what preferences decide: the badge counts the live
    // announcements not muted, the group total the groups not muted.
    let repair = repair::begin(ctx, user, true).await;
    let event = BusEvent::PreferencesChanged { user_id: user, locale: preferences.language() };
    let body = event.recorded_body();
    let stored =
        retrying("preferences::set", || store::set(&pool, user, preferences, repair, &body)).await;
    repair::end(ctx, user, true).await;
    let shard = pool.shard();
    drop(pool);
    events::publish_recorded(ctx, shard, stored?, Some(&event)).await;
    Ok(preferences.clone())
}
