//! The sends' read counts and readers behind a filtered read or unread:
//! the update writes one row of `read_backlog`, and the process that wrote
//! it counts it at once, in the background ([`count_soon`]); a row left by
//! a crash or a failure is counted by the workers' settler
//! ([`count_left`]). See `notify_store::db::read_backlog`.

use std::time::Duration;

use shard_router::{Key, ShardId};
use sqlx::MySqlPool;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::context::Context;
use notify_domain::error::Result;
use notify_store::db::{read_backlog, retrying};

/// How old a row is before the settler takes it (the writer's own count
/// normally ends within milliseconds).
pub const LEFT_AFTER: Duration = Duration::from_secs(2);

/// Counts the user's waiting reads on their shard. Returns the rows counted.
pub async fn count(ctx: &Context, user_id: u64) -> Result<u64> {
    // Like any write of the user's rows: not while a move freezes them.
    let pool = ctx.writable(Key::User(user_id)).await?;
    let counted =
        retrying("read_backlog::apply", || read_backlog::apply(&pool, user_id, ctx.read_feed))
            .await?;
    metrics::counter!("notify_read_backlog_applied_total").increment(counted);
    Ok(counted)
}

/// Counts running at once in a process, at most: each holds a connection of
/// the user's shard pool, which the calls need too.
const COUNTING_AT_ONCE: usize = 4;

static COUNTING: Semaphore = Semaphore::const_new(COUNTING_AT_ONCE);

/// Counts the user's waiting reads in the background, now, or as soon as
/// one of [`COUNTING_AT_ONCE`] counts is free.
pub fn count_soon(ctx: &Context, user_id: u64) {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let Ok(_permit) = COUNTING.acquire().await else { return };
        if let Err(e) = count(&ctx, user_id).await {
            warn!(error = %e, user_id, "counting reads failed, the settler will retry");
        }
    });
}

/// The settler's part: counts the reads of users whose rows on `shard`
/// waited longer than [`LEFT_AFTER`] (at most `limit` rows' users).
/// Returns the rows counted.
pub async fn count_left(
    ctx: &Context,
    shard: ShardId,
    pool: &MySqlPool,
    limit: u32,
) -> Result<u64> {
    let mut counted = 0;
    for user_id in read_backlog::waiting(pool, LEFT_AFTER, limit).await? {
        if ctx.pools.for_user(user_id).shard() != shard {
            // A copy a bucket move left behind: the move deletes it.
            continue;
        }
        // One user's failure (a frozen bucket, a deadlock retried out)
        // does not hold the others back; the next round retries it.
        match count(ctx, user_id).await {
            Ok(rows) => counted += rows,
            Err(e) => warn!(error = %e, user_id, shard = %shard, "settler could not count reads"),
        }
    }
    if counted > 0 {
        debug!(counted, shard = %shard, "settler counted reads left waiting");
    }
    Ok(counted)
}
