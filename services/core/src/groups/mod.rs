//! Group messages, pull model: a message is stored once on the group's home
//! shard under the group's next seq; each member keeps a cursor on their own
//! shard; unread = max seq - cursor, answered from Redis (see
//! [`notify_cache`]'s group protocol) without scanning messages.

mod repair;
mod unread;

pub use notify_store::db::groups::GroupMessageRow;
pub use repair::repair_stale_seqs;
pub use unread::{GroupUnread, UnreadSummary, unread, unread_from};

use std::collections::HashMap;

use shard_router::{Key, Snapshot};
use tracing::{instrument, warn};

use crate::context::Context;
use crate::events::{self, BusEvent};
use notify_domain::domain::{Content, GroupSeq, UserId};
use notify_domain::error::{Error, Result};
use notify_store::db::groups::{self as store, CreatedGroup, Membership, NewGroupMessage};
use notify_store::error::database_error;

/// Most users in one AddGroupMembers or RemoveGroupMembers call.
pub const MAX_MEMBER_BATCH: usize = 10_000;
/// Most messages in one pull.
pub const MAX_PULL_LIMIT: u32 = 1000;
/// Longest group name, in characters.
pub const MAX_GROUP_NAME_CHARS: usize = 200;

/// Checks a group id: not zero.
pub fn validate_group_id(group_id: u64, field: &str) -> Result<u64> {
    if group_id == 0 {
        return Err(Error::invalid(field, "group id must not be 0"));
    }
    Ok(group_id)
}

/// Checks a group name: not blank, at most 200 characters.
pub fn validate_group_name(name: &str, field: &str) -> Result<()> {
    notify_domain::limits::check_line(name, field, MAX_GROUP_NAME_CHARS)
}

/// Creates a group. With a caller's id, creating it again under the same
/// name succeeds (a retried call) and under another name is
/// `AlreadyExists`; `None` generates an id.
#[instrument(skip_all, fields(group_id))]
pub async fn create(ctx: &Context, group_id: Option<u64>, name: &str) -> Result<u64> {
    let generated = group_id.is_none();
    let group_id = match group_id {
        Some(id) => id,
        None => ctx.ids.next_id()?.get(),
    };
    tracing::Span::current().record("group_id", group_id);
    let home = ctx.writable(Key::Group(group_id)).await?;
    match store::create_group(&home, group_id, name).await? {
        CreatedGroup::Created => Ok(group_id),
        CreatedGroup::Exists(_) if generated => {
            Err(Error::Unavailable("group id collision, retry the request".to_owned()))
        }
        CreatedGroup::Exists(existing) if existing == name => Ok(group_id),
        CreatedGroup::Exists(_) => {
            Err(Error::AlreadyExists(format!("group {group_id} exists already under another name")))
        }
    }
}

/// Adds members (sorted, distinct ids). They start at the group's current
/// seq, or with `with_history` before its oldest message still kept (so
/// their unread count covers only what a pull can return); members already
/// in the group keep their cursor. Returns how many were added.
///
/// Member changes of a group hold its row lock, so the member limit holds
/// under concurrent calls. Each shard's rows are written in one transaction;
/// if a shard fails, the call fails after every other shard has finished,
/// and a retry adds the rest.
#[instrument(skip_all, fields(group_id = group_id, users = user_ids.len()))]
pub async fn add_members(
    ctx: &Context,
    group_id: u64,
    user_ids: &[u64],
    with_history: bool,
) -> Result<u64> {
    let _permit = ctx.cross_shard_permit().await?;
    let routes = writable_members(ctx, group_id, user_ids).await?;
    let mut lock = lock_group(&routes, group_id).await?;
    let max_seq = store::max_seq(&mut *lock, group_id).await?.unwrap_or(0);
    let joined_seq = if with_history {
        store::before_oldest_kept(&mut *lock, group_id).await?.unwrap_or(max_seq)
    } else {
        max_seq
    };
    let parts = routes.partition_users(user_ids);
    // Members may live on any shard, not only on those of this batch.
    // A member's row is on two shards while a bucket move runs: each shard
    // counts the members it owns.
    let routes = &routes;
    let members = on_every_shard(ctx.pools.iter().map(|(shard, pool)| {
        let owned = move |bucket: u32| routes.of_bucket(bucket).0 == shard;
        async move { Ok(store::count_members(pool, group_id, owned).await?) }
    }))
    .await?;
    let present = on_every_shard(parts.iter().map(|(shard, ids)| async move {
        Ok(store::count_present(shard_pool(ctx, *shard)?, group_id, ids).await?)
    }))
    .await?;
    let new = user_ids.len() as u64 - present;
    let limit = ctx.settings.groups.max_members;
    if members + new > limit || new == 0 {
        lock.rollback().await.map_err(database_error)?;
        if new == 0 {
            return Ok(0);
        }
        return Err(Error::FailedPrecondition(format!(
            "group {group_id} has {members} members; adding {new} would pass the limit of {limit}"
        )));
    }
    let added = change_members(
        ctx,
        user_ids,
        parts.iter().map(|(shard, ids)| async move {
            Ok(store::add_members(shard_pool(ctx, *shard)?, group_id, ids, joined_seq).await?)
        }),
    )
    .await;
    let event =
        BusEvent::MembersChanged { group_id, added: user_ids.to_vec(), removed: Vec::new() };
    let home = routes.of(Key::Group(group_id)).0;
    let recorded = record_and_commit(lock, &event).await?;
    let told = added.as_ref().is_ok_and(|added| *added > 0).then_some(&event);
    events::publish_recorded(ctx, home, recorded, told).await;
    added
}

/// Removes members (sorted, distinct ids); returns how many were members.
#[instrument(skip_all, fields(group_id = group_id, users = user_ids.len()))]
pub async fn remove_members(ctx: &Context, group_id: u64, user_ids: &[u64]) -> Result<u64> {
    let _permit = ctx.cross_shard_permit().await?;
    let routes = writable_members(ctx, group_id, user_ids).await?;
    let lock = lock_group(&routes, group_id).await?;
    let parts = routes.partition_users(user_ids);
    let removed = change_members(
        ctx,
        user_ids,
        parts.iter().map(|(shard, ids)| async move {
            Ok(store::remove_members(shard_pool(ctx, *shard)?, group_id, ids).await?)
        }),
    )
    .await;
    let event =
        BusEvent::MembersChanged { group_id, added: Vec::new(), removed: user_ids.to_vec() };
    let home = routes.of(Key::Group(group_id)).0;
    let recorded = record_and_commit(lock, &event).await?;
    let told = removed.as_ref().is_ok_and(|removed| *removed > 0).then_some(&event);
    events::publish_recorded(ctx, home, recorded, told).await;
    removed
}

/// Records a member change's event in the group's lock transaction (on its
/// home shard) and commits it: whichever shards the change reached, the
/// event is published, by this api or by the relay.
async fn record_and_commit(
    mut lock: sqlx::Transaction<'static, sqlx::MySql>,
    event: &BusEvent,
) -> Result<u64> {
    let recorded =
        notify_store::db::event_outbox::record(&mut lock, &event.recorded_body()).await?;
    lock.commit().await.map_err(database_error)?;
    Ok(recorded)
}

/// Runs per-shard member writes between the cursor cache's begin and end
/// of a change. Every write runs to completion (none is dropped halfway,
/// where its commit could still land after the cache was told the change
/// is over); the first error, if any, is returned after all have finished.
async fn change_members(
    ctx: &Context,
    user_ids: &[u64],
    writes: impl IntoIterator<Item = impl Future<Output = Result<u64>>>,
) -> Result<u64> {
    if let Err(e) = ctx.cache.begin_membership_change(user_ids).await {
        // Some batches may be marked already: count them out again.
        finish_membership_change(ctx, user_ids).await;
        return Err(e);
    }
    let changed = on_every_shard(writes).await;
    finish_membership_change(ctx, user_ids).await;
    changed
}

/// Awaits every per-shard future to the end and sums their counts; the
/// first error wins, but only after all have finished.
async fn on_every_shard(
    futures: impl IntoIterator<Item = impl Future<Output = Result<u64>>>,
) -> Result<u64> {
    futures::future::join_all(futures).await.into_iter().sum()
}

/// Opens a transaction on the group's home shard holding the group's row
/// lock (member changes of one group queue here); `NotFound` if unknown.
async fn lock_group(
    routes: &Snapshot<'_, sqlx::MySqlPool>,
    group_id: u64,
) -> Result<sqlx::Transaction<'static, sqlx::MySql>> {
    let mut lock = routes.of(Key::Group(group_id)).1.begin().await.map_err(database_error)?;
    if !store::lock_group(&mut lock, group_id).await? {
        lock.rollback().await.map_err(database_error)?;
        return Err(Error::NotFound(format!("group {group_id}")));
    }
    Ok(lock)
}

/// Holds the map for a member change: the group's home and the members'
/// shards, once a bucket move freezes none of them.
async fn writable_members<'c>(
    ctx: &'c Context,
    group_id: u64,
    user_ids: &[u64],
) -> Result<Snapshot<'c, sqlx::MySqlPool>> {
    let mut keys: Vec<Key<'_>> = user_ids.iter().map(|id| Key::User(*id)).collect();
    keys.push(Key::Group(group_id));
    ctx.writable_snapshot(&keys).await
}

fn shard_pool(ctx: &Context, shard: shard_router::ShardId) -> Result<&sqlx::MySqlPool> {
    ctx.pools.get(shard).ok_or_else(|| Error::Internal(format!("no pool for shard {shard}")))
}

async fn finish_membership_change(ctx: &Context, user_ids: &[u64]) {
    // On failure the dirty markers expire by themselves and caching resumes.
    if let Err(e) = ctx.cache.end_membership_change(user_ids).await {
        warn!(error = %e, users = user_ids.len(), "could not clear group change markers");
    }
}

/// A group message to send.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// The group.
    pub group_id: u64,
    /// The calling service.
    pub sender: String,
    /// The calling client (who may recall it with `sends.manage`).
    pub client: String,
    /// Optional idempotency key (per group and sender).
    pub idempotency_key: Option<String>,
    /// What members see.
    pub content: Content,
}

/// A sent group message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// The message id.
    pub message_id: u64,
    /// Its seq in the group.
    pub seq: u64,
    /// True when the idempotency key matched an earlier message.
    pub deduplicated: bool,
}

/// Stores a message once, under the group's next seq, and raises the cached
/// max seq. The cost does not depend on the group's size.
#[instrument(skip_all, fields(group_id = message.group_id, sender = %message.sender))]
pub async fn send(ctx: &Context, message: &NewMessage) -> Result<Sent> {
    let home = ctx.writable(Key::Group(message.group_id)).await?;
    let recorded = BusEvent::GroupChanged { group_id: message.group_id }.recorded_body();
    let new_message = NewGroupMessage {
        group_id: message.group_id,
        message_id: ctx.ids.next_id()?.get(),
        sender: &message.sender,
        client: &message.client,
        idempotency_key: message.idempotency_key.as_deref(),
        content: &message.content,
    };
    let appended = store::append_message(&home, &new_message, &recorded).await?;
    let shard = home.shard();
    drop(home);
    raise_cached_max_seq(ctx, message.group_id, appended.seq).await;
    if let Some(id) = appended.recorded {
        let event = BusEvent::GroupMessage {
            group_id: message.group_id,
            seq: appended.seq,
            message_id: appended.message_id,
        };
        events::publish_recorded(ctx, shard, id, Some(&event)).await;
    }
    Ok(Sent {
        message_id: appended.message_id,
        seq: appended.seq,
        deduplicated: appended.deduplicated,
    })
}

/// Merges a recall's whole seq state into the cached one (a group not
/// cached stays so: its next reader fills it from MySQL); on failure, notes
/// the group for [`repair_stale_seqs`].
async fn raise_recalled_seq(ctx: &Context, group_id: u64, seq: GroupSeq) {
    let ttl = ctx.settings.groups.seq_cache_ttl_secs;
    if let Err(e) = ctx.cache.raise_group_seqs(&HashMap::from([(group_id, seq)]), ttl).await {
        metrics::counter!("notify_group_seq_cache_errors_total").increment(1);
        warn!(error = %e, group_id, "could not raise a cached group seq state");
        ctx.stale_seqs.note([group_id]);
    }
}

/// Raises a cached max seq after a send; a group not cached stays so (its
/// recalled seqs are not known here: the next reader fills it whole). On
/// failure, notes the group for [`repair_stale_seqs`].
async fn raise_cached_max_seq(ctx: &Context, group_id: u64, max_seq: u64) {
    let ttl = ctx.settings.groups.seq_cache_ttl_secs;
    if let Err(e) = ctx.cache.raise_cached_max_seq(group_id, max_seq, ttl).await {
        metrics::counter!("notify_group_seq_cache_errors_total").increment(1);
        warn!(error = %e, group_id, "could not raise a cached group seq");
        ctx.stale_seqs.note([group_id]);
    }
}

/// A recalled group message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recalled {
    /// The message.
    pub message_id: u64,
    /// False when it was recalled before (a repeat changes nothing).
    pub recalled_now: bool,
}

/// Recalls the message at `seq`: it stays in the seq sequence as a tombstone
/// without content (pulls return it so), and the unread counts of members
/// whose cursor is before it drop by one, at once: the recalled seq joins
/// the cached seq state every badge reads, so no badge reads MySQL for it.
/// With an `owner`, only that client's messages may be recalled. A repeat
/// is harmless and repairs a cache write that failed the first time.
#[instrument(skip_all, fields(group_id = group_id, seq = seq))]
pub async fn recall(
    ctx: &Context,
    group_id: u64,
    seq: u64,
    owner: Option<&str>,
) -> Result<Recalled> {
    if seq == 0 {
        return Err(Error::invalid("seq", "must not be 0 (seqs start at 1)"));
    }
    let home = ctx.writable(Key::Group(group_id)).await?;
    let recorded = BusEvent::GroupChanged { group_id }.recorded_body();
    let recall = notify_store::db::retrying("groups::recall_message", || {
        store::recall_message(&home, group_id, seq, owner, &recorded)
    })
    .await?;
    let shard = home.shard();
    drop(home);
    raise_recalled_seq(ctx, group_id, recall.seq.clone()).await;
    if let Some(id) = recall.recorded {
        let event = BusEvent::GroupMessageRecalled { group_id, seq, message_id: recall.message_id };
        events::publish_recorded(ctx, shard, id, Some(&event)).await;
    }
    Ok(Recalled { message_id: recall.message_id, recalled_now: recall.recalled_now })
}

/// Reads a user's membership, or explains why there is none: `NotFound` for
/// an unknown group, `PermissionDenied` for a non-member.
async fn member_of(ctx: &Context, user_id: UserId, group_id: u64) -> Result<Membership> {
    let pool = ctx.pools.for_user(user_id.get());
    if let Some(membership) = store::membership(&*pool, user_id.get(), group_id).await? {
        return Ok(membership);
    }
    if store::group_exists(&ctx.pools.for_group(group_id), group_id).await? {
        Err(Error::PermissionDenied(format!(
            "user {} is not a member of group {group_id}",
            user_id.get()
        )))
    } else {
        Err(Error::NotFound(format!("group {group_id}")))
    }
}

/// One page of pulled messages.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// Messages, ascending by seq.
    pub messages: Vec<GroupMessageRow>,
    /// True when more messages follow the last one.
    pub has_more: bool,
}

/// Pulls a member's messages after `after_seq` (default: their cursor),
/// ascending. Messages sent before the user joined are never returned.
/// Pulling does not move the cursor: a page pulled again before its ack
/// comes back with the same message ids.
#[instrument(skip_all, fields(user_id = user_id.get(), group_id = group_id, limit = limit))]
pub async fn pull(
    ctx: &Context,
    user_id: UserId,
    group_id: u64,
    after_seq: Option<u64>,
    limit: u32,
) -> Result<Pulled> {
    let membership = member_of(ctx, user_id, group_id).await?;
    let after = after_seq.unwrap_or(membership.last_ack_seq).max(membership.joined_seq);
    let home = ctx.pools.for_group(group_id);
    let mut messages = store::messages_after(&home, group_id, after, limit + 1).await?;
    let has_more = messages.len() > limit as usize;
    messages.truncate(limit as usize);
    if messages.iter().any(|m| m.template.is_some()) {
        let preferences = crate::preferences::get(ctx, user_id).await?;
        let locale = preferences.locale.as_ref().map_or("", |l| l.as_str());
        crate::render::group_messages(&mut messages, locale);
    }
    Ok(Pulled { messages, has_more })
}

/// Moves a member's cursor forward to `seq`; returns the cursor. An older
/// seq is a no-op; one beyond the group's max seq is rejected.
#[instrument(skip_all, fields(user_id = user_id.get(), group_id = group_id, seq = seq))]
pub async fn ack(ctx: &Context, user_id: UserId, group_id: u64, seq: u64) -> Result<u64> {
    let membership = member_of(ctx, user_id, group_id).await?;
    if seq <= membership.last_ack_seq {
        return Ok(membership.last_ack_seq);
    }
    let max_seq = current_max_seq(ctx, group_id, seq).await?;
    if seq > max_seq {
        return Err(Error::invalid(
            "seq",
            &format!("is {seq}, beyond the group's max seq {max_seq}"),
        ));
    }
    let user = user_id.get();
    let pool = ctx.writable(Key::User(user)).await?;
    let repair = crate::repair::begin(ctx, user, true).await;
    let event = BusEvent::BadgesChanged { user_ids: vec![user] };
    let body = event.recorded_body();
    let advanced = notify_store::db::retrying("groups::advance_ack", || {
        store::advance_ack(&pool, user, group_id, seq, repair, &body)
    })
    .await;
    crate::repair::end(ctx, user, true).await;
    let shard = pool.shard();
    drop(pool);
    let (advanced, recorded) = advanced?;
    let told = advanced.is_some().then_some(&event);
    events::publish_recorded(ctx, shard, recorded, told).await;
    advanced.ok_or_else(|| {
        Error::PermissionDenied(format!(
            "user {} is not a member of group {group_id}",
            user_id.get()
        ))
    })
}

/// The group's max seq: the cached one when it already covers `at_least`,
/// else MySQL's (which also refreshes the cache).
async fn current_max_seq(ctx: &Context, group_id: u64, at_least: u64) -> Result<u64> {
    match ctx.cache.cached_group_seq(group_id).await {
        Ok(Some(cached)) if cached.max_seq >= at_least => return Ok(cached.max_seq),
        Ok(_) => {}
        Err(e) => warn!(error = %e, group_id, "group seq cache unavailable"),
    }
    let state = unread::fill_seq_states(ctx, &[group_id])
        .await?
        .remove(&group_id)
        .ok_or_else(|| Error::NotFound(format!("group {group_id}")))?;
    Ok(state.max_seq)
}
