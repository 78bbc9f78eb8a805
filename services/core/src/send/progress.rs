//! Progress of a send, summed from per-shard stats: O(shards), never a COUNT
//! over items.

use crate::context::Context;
use notify_domain::domain::MessageId;
use notify_domain::error::Result;
use notify_store::db::messages::{self, ShardStats};

/// Counters of a send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Distinct recipients.
    pub total: u64,
    /// Items written.
    pub delivered: u64,
    /// Recipients of dead-lettered chunks.
    pub failed: u64,
    /// Items read.
    pub read: u64,
    /// Recipients still to deliver.
    pub pending: u64,
    /// Recipients left undelivered by a cancel.
    pub cancelled: u64,
    /// Recipients their preferences held back (a muted category, or erased
    /// after the send was queued): no item was written for them.
    pub suppressed: u64,
    /// Items taken back by a recall.
    pub recalled: u64,
    /// Chunks still pending.
    pub pending_chunks: u64,
}

impl Progress {
    /// Derives the counters from summed shard stats: always
    /// `total = delivered + failed + suppressed + cancelled + pending`.
    pub fn from_stats(stats: &ShardStats) -> Self {
        let total = stats.total.saturating_sub(stats.duplicates);
        let finished = stats.delivered + stats.failed + stats.suppressed + stats.cancelled;
        Self {
            total,
            delivered: stats.delivered,
            failed: stats.failed,
            read: stats.read_count,
            pending: total.saturating_sub(finished),
            cancelled: stats.cancelled,
            suppressed: stats.suppressed,
            recalled: stats.recalled,
            pending_chunks: stats.chunks.saturating_sub(stats.done_chunks),
        }
    }
}

impl Progress {
    /// For an announcement, recipients are the users who have it
    /// materialized so far: `total` and `delivered` both count them.
    pub fn for_audience(mut self, audience: u8) -> Self {
        if audience == notify_domain::domain::AudienceKind::AllUsers as u8 {
            self.total = self.delivered;
            self.pending = 0;
        }
        self
    }
}

/// Sums a send's stats over every shard, in parallel.
pub async fn progress(ctx: &Context, message_id: MessageId) -> Result<Progress> {
    let per_shard = ctx.pools.iter().map(|(_, pool)| messages::shard_stats(pool, message_id));
    let mut sum = ShardStats::default();
    for stats in futures::future::try_join_all(per_shard).await? {
        sum.add(&stats);
    }
    Ok(Progress::from_stats(&sum))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_not_counted_as_recipients_or_pending() {
        let stats = ShardStats {
            total: 1000,
            delivered: 700,
            duplicates: 100,
            failed: 50,
            cancelled: 0,
            suppressed: 30,
            recalled: 0,
            read_count: 7,
            chunks: 4,
            done_chunks: 3,
        };
        let progress = Progress::from_stats(&stats);
        assert_eq!(progress.total, 900);
        assert_eq!(progress.pending, 120);
        assert_eq!(progress.suppressed, 30);
        let p = progress;
        assert_eq!(p.total, p.delivered + p.failed + p.suppressed + p.cancelled + p.pending);
        assert_eq!(progress.pending_chunks, 1);
        assert_eq!(progress.read, 7);
    }
}
