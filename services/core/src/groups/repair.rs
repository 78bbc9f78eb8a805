//! Cached group seq states raised again from MySQL after a failed write.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::unread::read_seq_states;
use crate::context::Context;
use notify_domain::error::Result;

/// First wait after a repair that failed (Redis still away); doubled after
/// each failure up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Until `shutdown`: as soon as groups are noted in
/// [`crate::context::StaleSeqs`] (a send's raise or a recall's merge failed
/// after its commit), reads their seq states from MySQL and merges them
/// into the keys Redis holds, retrying with a backoff while Redis fails.
/// A group whose key is gone stays uncached (its next reader fills it
/// whole); merging only raises, so a repair racing a send or a recall
/// cannot lower what they wrote.
pub async fn repair_stale_seqs(ctx: Context, shutdown: CancellationToken) {
    let mut backoff = MIN_BACKOFF;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = ctx.stale_seqs.noted() => {}
        }
        loop {
            let groups = ctx.stale_seqs.take();
            if groups.is_empty() {
                break;
            }
            match repair(&ctx, &groups).await {
                Ok(()) => {
                    metrics::counter!("notify_group_seq_repairs_total")
                        .increment(groups.len() as u64);
                    info!(groups = groups.len(), "cached group seqs raised again");
                    backoff = MIN_BACKOFF;
                }
                Err(e) => {
                    warn!(error = %e, groups = groups.len(), ?backoff, "could not repair cached group seqs yet");
                    ctx.stale_seqs.note(groups);
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

async fn repair(ctx: &Context, group_ids: &[u64]) -> Result<()> {
    let seqs = read_seq_states(ctx, group_ids).await?;
    ctx.cache.raise_group_seqs(&seqs, ctx.settings.groups.seq_cache_ttl_secs).await
}
