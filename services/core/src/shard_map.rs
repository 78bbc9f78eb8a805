//! The shard map as a serving process follows it: it joins before it serves
//! (reports itself and routes by the newest stored version) and follows the
//! stored map until it has drained, as `notify_store::shard_map` keeps it.

use tokio_util::sync::CancellationToken;

use crate::context::Context;
use notify_domain::error::Result;

pub use notify_store::shard_map::Replica;

/// Reports this process as `replica` to the directory shard and routes by
/// the newest stored map; returns the version it routes by. Called before
/// the process serves anything ([`notify_store::shard_map::join`]).
pub async fn join(ctx: &Context, replica: &Replica) -> Result<u64> {
    Ok(notify_store::shard_map::join(&ctx.pools, &ctx.settings.database, replica).await?)
}

/// Follows the stored map and reports `replica` until `drained` is
/// cancelled, then removes the report ([`notify_store::shard_map::follow`]):
/// cancel it only once the process writes nothing more.
pub async fn follow(ctx: Context, replica: Replica, drained: CancellationToken) {
    let database = ctx.settings.database.clone();
    notify_store::shard_map::follow(ctx.pools, database, replica, drained).await;
}
