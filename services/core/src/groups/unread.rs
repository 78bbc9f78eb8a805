//! Group unread counts: the seqs after the member's cursor that are not
//! recalled, per group, from cached cursors and seq states, with MySQL
//! filling whatever the cache misses.

use std::collections::HashMap;

use futures::future::try_join_all;
use tracing::{instrument, warn};

use super::shard_pool;
use crate::context::Context;
use notify_cache::CachedGroup;
use notify_domain::domain::{GroupCursor, GroupSeq, UserId};
use notify_domain::error::Result;
use notify_store::db::groups as store;

/// Unread messages of one group for one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupUnread {
    /// The group.
    pub group_id: u64,
    /// The seqs after `last_ack_seq` up to `max_seq` that are not recalled.
    pub unread: u64,
    /// The group's max seq.
    pub max_seq: u64,
    /// The member's cursor.
    pub last_ack_seq: u64,
    /// The member mutes the group: its unread stays out of the total.
    pub muted: bool,
}

/// A user's unread counts over all their groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnreadSummary {
    /// Per group, by group id.
    pub groups: Vec<GroupUnread>,
    /// Sum over the groups the user does not mute.
    pub total: u64,
}

/// Computes a user's group unread counts from cursors and max seqs: from
/// Redis when cached, else from the user's shard (one query) and the groups'
/// home shards (one query per shard), caching what was read.
#[instrument(skip_all, fields(user_id = user_id.get()))]
pub async fn unread(ctx: &Context, user_id: UserId) -> Result<UnreadSummary> {
    let cached = ctx.cache.cached_user_state(user_id.get()).await.map(|state| state.groups);
    unread_from(ctx, user_id, cached).await
}

/// [`unread`] given what the cache held (`Ok(None)`: a miss; `Err`: Redis
/// is unavailable, so nothing is cached either).
pub async fn unread_from(
    ctx: &Context,
    user_id: UserId,
    cached: Result<Option<Vec<CachedGroup>>>,
) -> Result<UnreadSummary> {
    let cursors: Vec<(GroupCursor, Option<GroupSeq>)> = match cached {
        Ok(Some(cached)) => {
            notify_domain::hot_counter!("notify_group_cursor_cache_hits_total").increment(1);
            cached
                .into_iter()
                .map(|g| {
                    let cursor = GroupCursor {
                        group_id: g.group_id,
                        last_ack_seq: g.last_ack_seq,
                        muted: g.muted,
                    };
                    (cursor, g.seq)
                })
                .collect()
        }
        Ok(None) => {
            notify_domain::hot_counter!("notify_group_cursor_cache_misses_total").increment(1);
            rebuild_cursors(ctx, user_id, true).await?
        }
        Err(e) => {
            warn!(error = %e, "group cache unavailable, reading mysql");
            rebuild_cursors(ctx, user_id, false).await?
        }
    };
    let missing: Vec<u64> =
        cursors.iter().filter(|(_, seq)| seq.is_none()).map(|(c, _)| c.group_id).collect();
    let mut loaded = fill_seq_states(ctx, &missing).await?;
    let mut groups: Vec<GroupUnread> = cursors
        .into_iter()
        .map(|(cursor, cached)| {
            let seq = cached.or_else(|| loaded.remove(&cursor.group_id)).unwrap_or_default();
            GroupUnread {
                group_id: cursor.group_id,
                unread: seq.unread_after(cursor.last_ack_seq),
                max_seq: seq.max_seq,
                last_ack_seq: cursor.last_ack_seq,
                muted: cursor.muted,
            }
        })
        .collect();
    groups.sort_unstable_by_key(|g| g.group_id);
    let total = groups.iter().filter(|g| !g.muted).map(|g| g.unread).sum();
    Ok(UnreadSummary { groups, total })
}

/// Reads a user's cursors from MySQL, caching them under a lease when asked.
async fn rebuild_cursors(
    ctx: &Context,
    user_id: UserId,
    cache: bool,
) -> Result<Vec<(GroupCursor, Option<GroupSeq>)>> {
    let lease =
        if cache { ctx.cache.take_membership_lease(user_id.get()).await.ok() } else { None };
    let pool = ctx.pools.for_user(user_id.get());
    let memberships = store::memberships(&pool, user_id.get()).await?;
    if let Some(token) = lease {
        let ttl = ctx.settings.groups.membership_cache_ttl_secs;
        let stored = ctx.cache.store_memberships(user_id.get(), token, &memberships, ttl).await;
        if let Err(e) = stored {
            warn!(error = %e, "could not cache group cursors");
        }
    }
    Ok(memberships.into_iter().map(|cursor| (cursor, None)).collect())
}

/// Reads groups' seq states from MySQL under fill leases taken first, and
/// caches them while the leases hold: a send that commits in between and
/// finds a group uncached ends its lease, so a state read before it is not
/// cached. Without leases (Redis unavailable) nothing is cached.
pub(super) async fn fill_seq_states(
    ctx: &Context,
    group_ids: &[u64],
) -> Result<HashMap<u64, GroupSeq>> {
    if group_ids.is_empty() {
        return Ok(HashMap::new());
    }
    let tokens = match ctx.cache.take_seq_leases(group_ids).await {
        Ok(tokens) => Some(tokens),
        Err(e) => {
            warn!(error = %e, groups = group_ids.len(), "group seq cache unavailable");
            None
        }
    };
    let seqs = read_seq_states(ctx, group_ids).await?;
    if let Some(tokens) = tokens {
        let ttl = ctx.settings.groups.seq_cache_ttl_secs;
        if let Err(e) = ctx.cache.fill_group_seqs(&seqs, &tokens, ttl).await {
            // Nothing cached is behind: a fill only adds what was missing.
            metrics::counter!("notify_group_seq_cache_errors_total").increment(1);
            warn!(error = %e, groups = seqs.len(), "could not cache group seqs");
        }
    }
    Ok(seqs)
}

/// Reads groups' seq states from their home shards (one query per shard).
pub(super) async fn read_seq_states(
    ctx: &Context,
    group_ids: &[u64],
) -> Result<HashMap<u64, GroupSeq>> {
    if group_ids.is_empty() {
        return Ok(HashMap::new());
    }
    // Held across the reads, so a move cleans no shard they were routed to.
    let routes = ctx.pools.snapshot();
    let by_shard = routes.map().partition_groups(group_ids);
    let found =
        try_join_all(by_shard.iter().map(|(shard, ids)| async move {
            store::seq_states(shard_pool(ctx, *shard)?, ids).await
        }))
        .await?;
    drop(routes);
    Ok(found.into_iter().flatten().collect())
}
