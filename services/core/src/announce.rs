//! Platform announcements to all users (read diffusion).
//!
//! An announcement is stored once: its control record on the home shard and
//! a content copy on every shard. Nothing is written per user at send time.
//! When a user's inbox is read, the active announcements the user has no item
//! for yet are materialized on the user's shard in one transaction (items,
//! per-shard stats and the user's watermark), under a lock on the user's
//! inbox-state row, so concurrent reads on several api replicas materialize
//! each announcement exactly once. A badge counts unmaterialized active
//! announcements without writing anything.
//!
//! Starting or cancelling an announcement bumps the cache epoch, which
//! retires every cached badge at once (see `cache::badge`). Cancelling also
//! revokes the content copies, which hides every materialized item at once.
//! Both are the send lifecycle's (`send::lifecycle`), which this module
//! builds on.

use chrono::{NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};
use shard_router::{Key, ShardId};
use sqlx::MySqlPool;
use tracing::{instrument, warn};

use crate::context::{Context, ShardRead};
use crate::send::{self, Created, NewSend};
use notify_domain::domain::{Lane, MessageId, SendStatus};
use notify_domain::error::{Error, Result};
use notify_store::db::{chunks, items, messages};

/// How long the active list stays cached (it is also refreshed on change).
const ACTIVE_LIST_TTL_SECS: u64 = 30;

/// Longest one shard gets to list its live announcements for a badge.
const SHARD_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// An announcement that is live now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Active {
    /// Its id.
    pub message_id: u64,
    /// When it ends, in ms since the epoch.
    pub expire_at_ms: Option<i64>,
    /// Its category: users who mute it neither see nor count it.
    #[serde(default)]
    pub category: String,
    /// A critical announcement ignores mutes.
    #[serde(default)]
    pub critical: bool,
}

impl Active {
    fn is_live(&self, now_ms: i64) -> bool {
        self.expire_at_ms.is_none_or(|at| at > now_ms)
    }
}

/// Stores an announcement once and starts it now, or at `send_at`.
#[instrument(skip_all, fields(sender = %new_send.sender))]
pub async fn send(ctx: &Context, new_send: &NewSend) -> Result<(Created, SendStatus)> {
    let created = send::create(ctx, new_send).await?;
    let id = created.message_id;
    let home = ctx.writable(Key::Message(id.get())).await?;
    let row = messages::fetch_existing(&home, id).await?;
    if row.status()? != SendStatus::NotStarted || row.start_requested {
        return Ok((created, row.status()?));
    }
    let copy = chunks::ContentCopy {
        content: &new_send.content,
        expire_at: row.expire_at,
        created_at: row.created_at,
        critical: new_send.critical,
    };
    let copies = ctx.pools.iter().map(|(_, pool)| chunks::store_content(pool, id, &copy));
    futures::future::try_join_all(copies).await?;
    let start_now = row.send_at.is_none_or(|at| at <= send::now());
    if start_now {
        let now = send::AnnouncementStart::Now;
        if let Some(started) = send::start_announcement(&home, id, now).await? {
            crate::status::refresh_status_best_effort(ctx, id).await;
            send::activated(ctx, id, home.shard(), started).await;
        }
    } else {
        messages::request_start(&*home, id, Lane::High as u8, false).await?;
    }
    let status = messages::fetch_existing(&home, id).await?.status()?;
    Ok((created, status))
}

/// Ends the announcements on `shard` (their home) whose expiry has
/// passed: SENDING -> COMPLETED. They have left every inbox and badge at
/// their expiry already; this makes their status say so.
pub async fn end_expired(ctx: &Context, shard: ShardId, pool: &MySqlPool) -> Result<Vec<u64>> {
    let mut ended = Vec::new();
    for id in messages::expired_announcements(pool).await? {
        // Written where the map routes it (during a move the record is on
        // two shards; a frozen one waits): a copy elsewhere is left alone.
        let home = ctx.writable(Key::Message(id)).await?;
        if home.shard() != shard || !messages::end_expired_announcement(&home, id).await? {
            continue;
        }
        drop(home);
        crate::status::refresh_status_best_effort(ctx, MessageId::from_raw(id)).await;
        tracing::info!(message_id = id, "announcement expired, completed");
        ended.push(id);
    }
    Ok(ended)
}

/// Returns the live announcements (cached per epoch, rebuilt on a miss).
pub async fn active(ctx: &Context) -> Result<Vec<Active>> {
    Ok(active_list(ctx).await?.0)
}

/// [`active`], and whether the list is complete: false when a shard could
/// not be read and its announcements are left out.
pub async fn active_list(ctx: &Context) -> Result<(Vec<Active>, bool)> {
    let now_ms = Utc::now().timestamp_millis();
    let (epoch, cached) = match ctx.cache.cached_announcements().await {
        Ok((epoch, cached)) => (Some(epoch), cached),
        Err(e) => {
            warn!(error = %e, "announcement cache unavailable, reading the shards");
            (None, None)
        }
    };
    if let Some(list) = cached.and_then(|json| serde_json::from_str::<Vec<Active>>(&json).ok()) {
        // Only a complete list is cached.
        return Ok((list.into_iter().filter(|a| a.is_live(now_ms)).collect(), true));
    }
    let mut list = Vec::new();
    let (mut reached, mut unreachable) = (0, None);
    // During a bucket move an announcement's home record is on two shards
    // for a while: only the shard the map routes it to counts.
    let routes = ctx.pools.snapshot();
    for (shard, pool) in ctx.pools.iter() {
        let read = match ctx.unreachable_shards.read(shard) {
            ShardRead::Read => read_shard(ctx, shard, pool).await,
            skip => {
                if skip == ShardRead::LeaveOutAndProbe {
                    let (ctx, pool) = (ctx.clone(), pool.clone());
                    tokio::spawn(async move { read_shard(&ctx, shard, &pool).await });
                }
                Err(Error::Unavailable(format!(
                    "shard {} did not answer its last read of live announcements",
                    shard.0
                )))
            }
        };
        match read {
            Ok(live) => {
                reached += 1;
                let homed = live
                    .into_iter()
                    .filter(|live| routes.of(Key::Message(live.message_id)).0 == shard);
                list.extend(homed.map(|live| Active {
                    message_id: live.message_id,
                    expire_at_ms: live.expire_at.map(to_ms),
                    category: live.category,
                    critical: live.critical,
                }));
            }
            // One shard down must not take every badge with it: the list
            // lacks that shard's announcements until it is back (and is not
            // cached meanwhile).
            Err(e) if e.is_transient() => {
                metrics::counter!("notify_announcement_list_shard_errors_total").increment(1);
                unreachable = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    let complete = unreachable.is_none();
    if let Some(e) = unreachable
        && reached == 0
    {
        return Err(e);
    }
    list.sort_unstable_by_key(|a| a.message_id);
    if let Some(epoch) = epoch.filter(|_| complete) {
        let json = serde_json::to_string(&list).unwrap_or_default();
        let _ = ctx.cache.store_announcements(epoch, &json, ACTIVE_LIST_TTL_SECS).await;
    }
    Ok((list, complete))
}

/// One shard's live announcements, within [`SHARD_READ_TIMEOUT`] (a shard
/// that accepts and never answers counts as unreachable). Notes in
/// [`Context::unreachable_shards`] whether it answered: one that did not
/// is left out of the reads after this one, until a probe (this again, in
/// the background) finds it back.
async fn read_shard(
    ctx: &Context,
    shard: ShardId,
    pool: &MySqlPool,
) -> Result<Vec<messages::LiveAnnouncement>> {
    let read = || messages::live_announcements(pool);
    let reading = tokio::time::timeout(
        SHARD_READ_TIMEOUT,
        notify_store::db::retry_read_on_broken_connection(read),
    );
    let read = reading.await.unwrap_or_else(|_| {
        Err(Error::Unavailable(format!("shard {} did not answer in time", shard.0)))
    });
    match &read {
        Ok(_) => ctx.unreachable_shards.answered(shard),
        Err(e) if e.is_transient() => {
            warn!(error = %e, shard = shard.0, "announcements of an unreachable shard left out");
            ctx.unreachable_shards.failed(shard);
        }
        Err(_) => {}
    }
    read
}

fn to_ms(at: NaiveDateTime) -> i64 {
    at.and_utc().timestamp_millis()
}

/// Live announcements the user has no item for yet and that the user's
/// preferences let through (a muted category, unless critical, or sent
/// before the user was erased: never materialized, never counted): one
/// query on the user's shard.
pub async fn unmaterialized(ctx: &Context, user_id: u64, live: &[Active]) -> Result<Vec<Active>> {
    if live.is_empty() {
        return Ok(Vec::new());
    }
    let pool = ctx.pools.for_user(user_id);
    let ids: Vec<u64> = live.iter().map(|a| a.message_id).collect();
    let missing = notify_store::db::retry_read_on_broken_connection(|| {
        items::missing_announcements(&pool, user_id, &ids)
    })
    .await?;
    Ok(live.iter().filter(|a| missing.contains(&a.message_id)).cloned().collect())
}

/// Materializes the user's missing live announcements (one transaction on the
/// user's shard). Returns whether every live announcement is now in place:
/// false when a shard that homes some could not be read (they are left out).
#[instrument(skip_all, fields(user_id))]
pub async fn materialize(ctx: &Context, user_id: u64) -> Result<bool> {
    materialize_live(ctx, user_id).await.map(|(_, complete)| complete)
}

/// [`materialize`], also handing back the live announcements it worked
/// from (what a badge read in the caller's transaction needs).
pub async fn materialize_live(ctx: &Context, user_id: u64) -> Result<(Vec<Active>, bool)> {
    let (live, complete) = active_list(ctx).await?;
    let missing = unmaterialized(ctx, user_id, &live).await?;
    if missing.is_empty() {
        return Ok((live, complete));
    }
    let pool = ctx.writable(Key::User(user_id)).await?;
    let ids: Vec<u64> = missing.iter().map(|a| a.message_id).collect();
    let repair = crate::repair::begin(ctx, user_id, false).await;
    // Concurrent first reads of a new user can deadlock creating its state row.
    let written = notify_store::db::retrying("items::materialize", || {
        items::materialize(&pool, user_id, &ids, repair)
    })
    .await;
    crate::repair::end(ctx, user_id, false).await;
    written.map(|_| (live, complete))
}
