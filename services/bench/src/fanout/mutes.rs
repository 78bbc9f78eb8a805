//! `fanout --muted-percent P`: that share of the recipients mute the send's
//! category before the send (their `user_preferences` rows written straight
//! into the shard tables, as the store writes them), and the per-chunk cost
//! of the send compared with a reference send nobody mutes.

use std::fmt::Write as _;

use notify_domain::Settings;
use notify_domain::preferences::join_list;
use notify_testkit::metrics::MetricsPage;

use super::NotifyRun;
use super::preferences::{self, Column};
use crate::harness::{thousands, verdict};

/// Which recipients mute the send's category: `percent` of ids `1..=N`,
/// spread evenly (every 10th id at 10%), exactly `N * percent / 100` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mutes {
    pub(super) percent: u64,
}

impl Mutes {
    /// True when `user` (>= 1) mutes the send's category.
    pub(super) fn mutes(self, user: u64) -> bool {
        user * self.percent / 100 > (user - 1) * self.percent / 100
    }

    /// Recipients of `users` who get an item (those who do not mute).
    pub(super) fn delivered(self, users: &[u64]) -> u64 {
        users.iter().filter(|u| !self.mutes(**u)).count() as u64
    }
}

/// Writes a `user_preferences` row muting `category` for every muting user
/// of `users`, on each user's shard ([`preferences::seed`]). Returns the
/// rows and the seconds.
pub(super) async fn seed_preferences(
    settings: &Settings,
    users: &[u64],
    mutes: Mutes,
    category: &str,
) -> anyhow::Result<(u64, f64)> {
    let list = join_list(&[category]);
    let muting: Vec<(u64, &str)> =
        users.iter().filter(|u| mutes.mutes(**u)).map(|u| (*u, list.as_str())).collect();
    let secs = preferences::seed(settings, Column::MutedCategories, &muting).await?;
    Ok((muting.len() as u64, secs))
}

/// A send's chunks and their cost, from its worker's `/metrics` (each send
/// has a worker of its own, so the pages hold nothing else).
pub(super) struct ChunkCost {
    pub(super) chunks: f64,
    /// Mean of `notify_chunk_apply_seconds` (bulk lane): task received ->
    /// acked, per chunk.
    pub(super) mean_apply_secs: f64,
    /// Delivery phase (StartMessage returned -> COMPLETED) / chunks.
    pub(super) wall_secs: f64,
    /// MariaDB statements of the delivery phase / chunks.
    pub(super) statements: f64,
}

impl ChunkCost {
    /// The cost per chunk of `run`, with `worker` its worker's page.
    pub(super) fn of(run: &NotifyRun, worker: &MetricsPage) -> Self {
        let chunks_of = |outcome| worker.sum("notify_chunks_total", &[("outcome", outcome)]);
        let chunks = chunks_of("delivered") + chunks_of("already_done") + chunks_of("skipped");
        let lane = [("lane", "bulk")];
        let apply_sum = worker.sum("notify_chunk_apply_seconds_sum", &lane);
        let apply_count = worker.sum("notify_chunk_apply_seconds_count", &lane);
        Self {
            chunks,
            mean_apply_secs: apply_sum / apply_count.max(1.0),
            wall_secs: run.delivery.secs / chunks.max(1.0),
            statements: run.delivery_statements as f64 / chunks.max(1.0),
        }
    }
}

/// What the mutes run adds to the report: the seeding, and the reference
/// send (same users, a category nobody mutes) when it ran.
pub(super) struct MuteReport {
    pub(super) mutes: Mutes,
    pub(super) muting: u64,
    pub(super) seed_secs: f64,
    pub(super) muted_cost: ChunkCost,
    pub(super) reference: Option<Reference>,
}

/// The reference send.
pub(super) struct Reference {
    pub(super) run: NotifyRun,
    pub(super) items: u64,
    pub(super) cost: ChunkCost,
    /// Whether the muting users' preference rows were there (a category
    /// they do not mute) or no user had any.
    pub(super) with_rows: bool,
}

impl MuteReport {
    /// The report's lines about mutes.
    pub(super) fn lines(&self, recipients: u64, muted_send_secs: f64) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "mutes     {}% of recipients ({}) mute the send's category: preference rows written in \
             {:.2} s (not timed)",
            self.mutes.percent,
            thousands(self.muting),
            self.seed_secs
        );
        let Some(reference) = &self.reference else {
            let _ = writeln!(s, "          no reference send (--reference skip)");
            return s;
        };
        let p = &reference.run.final_progress;
        let rows = if reference.with_rows {
            "their preference rows present"
        } else {
            "no preference rows at all"
        };
        let _ = writeln!(
            s,
            "reference same {} users, a category nobody mutes ({rows}), fresh databases and \
             services: {:.2} s = {} rows/s | delivered {} suppressed {} COUNT(*) {} -> {}",
            thousands(recipients),
            reference.run.total.secs,
            thousands((recipients as f64 / reference.run.total.secs) as u64),
            p.delivered,
            p.suppressed,
            reference.items,
            verdict(
                p.delivered == recipients && p.suppressed == 0 && reference.items == recipients
            )
        );
        let (m, r) = (&self.muted_cost, &reference.cost);
        let apply_ratio = m.mean_apply_secs / r.mean_apply_secs;
        let wall_ratio = m.wall_secs / r.wall_secs;
        let _ = writeln!(
            s,
            "per chunk muted / reference: worker apply mean {:.2} ms / {:.2} ms = {apply_ratio:.2} \
             (target <= 1.10: {}) | delivery wall {:.2} ms / {:.2} ms = {wall_ratio:.2} (target <= \
             1.10: {}) | {:.0} / {:.0} chunks | statements {:.2} / {:.2} per chunk",
            m.mean_apply_secs * 1000.0,
            r.mean_apply_secs * 1000.0,
            verdict(apply_ratio <= 1.10),
            m.wall_secs * 1000.0,
            r.wall_secs * 1000.0,
            verdict(wall_ratio <= 1.10),
            m.chunks,
            r.chunks,
            m.statements,
            r.statements
        );
        let _ = writeln!(
            s,
            "          end to end: muted send {:.2} s vs reference {:.2} s = {:.2}",
            muted_send_secs,
            reference.run.total.secs,
            muted_send_secs / reference.run.total.secs
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutes_spread_exactly_their_share() {
        let users: Vec<u64> = (1..=1000).collect();
        let ten = Mutes { percent: 10 };
        assert_eq!(users.iter().filter(|u| ten.mutes(**u)).count(), 100);
        assert!(ten.mutes(10) && ten.mutes(20) && !ten.mutes(1) && !ten.mutes(11));
        assert_eq!(ten.delivered(&users), 900);
        assert_eq!(Mutes { percent: 0 }.delivered(&users), 1000);
        assert_eq!(Mutes { percent: 100 }.delivered(&users), 0);
        assert_eq!(Mutes { percent: 33 }.delivered(&users), 670);
    }
}
