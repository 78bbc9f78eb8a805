//! The worker's periodic jobs: the scheduler starts due scheduled sends; the
//! sweeper heals lost publishes and crashed workers by re-publishing chunks
//! left pending for a SENDING send, finishes cancels, and completes sends
//! whose last chunk finished while nobody checked; the settler invalidates
//! the badges of chunks applied while Redis was away; retention adds and
//! drops item partitions and deletes old rows.

use std::sync::Arc;
use std::time::Duration;

use notify_core::health::Heartbeats;
use notify_core::{Context, sweeper};
use notify_domain::Result;
use shard_router::ShardId;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

const BATCH: u32 = 1000;

/// Runs `job` every `every` until `shutdown`, beating `name` after each run
/// (a job that never returns stops the beats, and `/healthz` says so).
pub async fn every<F, Fut>(
    name: &'static str,
    every: Duration,
    heartbeats: Heartbeats,
    shutdown: CancellationToken,
    job: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heartbeats.beat(name);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => break,
        }
        if let Err(e) = job().await {
            warn!(error = %e, job = name, "background job failed");
        }
        heartbeats.beat(name);
    }
    info!(job = name, "background job stopped");
}

/// Runs retention at start and every `retention.interval_secs` until
/// `shutdown` (a run in progress is dropped at shutdown: each step is one
/// statement, and the next run picks up where it stopped).
pub async fn retention(ctx: Context, shutdown: CancellationToken) {
    let every = Duration::from_secs(ctx.settings.retention.interval_secs);
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => break,
        }
        let run = notify_core::retention::run_once(
            &ctx.pools,
            &ctx.cache,
            &ctx.settings.retention,
            chrono::Utc::now(),
        );
        let outcome = tokio::select! {
            outcome = run => outcome,
            () = shutdown.cancelled() => break,
        };
        match outcome {
            Ok(report) => {
                metrics::counter!("notify_retention_runs_total", "outcome" => "ok").increment(1);
                metrics::counter!("notify_retention_partitions_dropped_total")
                    .increment(report.partitions_dropped.len() as u64);
                metrics::counter!("notify_retention_rows_deleted_total").increment(
                    report.hidden_items_purged
                        + report.chunks_deleted
                        + report.sends_deleted
                        + report.audit_rows_deleted,
                );
            }
            Err(e) => {
                metrics::counter!("notify_retention_runs_total", "outcome" => "error").increment(1);
                warn!(error = %e, "retention run failed, retrying at the next interval");
            }
        }
    }
    info!("retention stopped");
}

/// Starts every due scheduled send on every shard.
/// A shard that does not answer is passed over until the next run.
pub async fn schedule_once(ctx: &Context) -> Result<()> {
    let limit = Duration::from_secs(ctx.settings.worker.operation_timeout_secs);
    let mut first_error = None;
    for (shard, pool) in ctx.pools.iter() {
        let starting = sweeper::start_due_sends(ctx, pool, BATCH);
        if let Err(e) = within(limit, starting).await {
            warn!(error = %e, shard = %shard, "scheduler passed over a shard");
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// One sweep over every shard. Returns the number of chunks re-published.
/// A failure on one shard or message is logged and the sweep goes on, so
/// one shard that is down does not stop healing on the others.
pub async fn sweep_once(ctx: &Context) -> Result<u64> {
    let timeout = ctx.settings.worker.sweep_timeout_secs;
    let limit = Duration::from_secs(ctx.settings.worker.operation_timeout_secs);
    let mut republished = 0;
    for (shard, pool) in ctx.pools.iter() {
        let claimed =
            tokio::time::timeout(limit, sweeper::claim_stale_chunks(pool, timeout, BATCH)).await;
        let by_message = match claimed {
            Ok(Ok(stale)) => stale,
            Ok(Err(e)) => {
                warn!(error = %e, shard = %shard, "sweeper cannot read this shard");
                continue;
            }
            Err(_) => {
                warn!(shard = %shard, "sweeper gave up on a shard that does not answer");
                continue;
            }
        };
        for (message_id, chunk_ids) in by_message {
            let healing = sweeper::heal_stale_chunks(ctx, shard, message_id, &chunk_ids);
            match within(limit, healing).await {
                Ok(count) => republished += count,
                Err(e) => {
                    let message_id = message_id.get();
                    warn!(error = %e, message_id, shard = %shard, "sweeping a message failed")
                }
            }
        }
    }
    for (shard, pool) in ctx.pools.iter() {
        let finishing = async {
            sweeper::complete_finished_sends(ctx, shard, pool, BATCH).await;
            end_expired_announcements(ctx, shard, pool).await;
        };
        if tokio::time::timeout(limit, finishing).await.is_err() {
            warn!(shard = %shard, "sweeper gave up on a shard that does not answer");
        }
    }
    report_sending(ctx, limit).await;
    if republished > 0 {
        info!(republished, "sweeper re-published stuck chunks");
        metrics::counter!("notify_chunks_republished_total").increment(republished);
    }
    Ok(republished)
}

/// Takes the control operations (cancel, recall, edit) whose lease ran out
/// on every home shard that answers, and drives each in a task of its own,
/// at most `drives` at once in this worker ([`notify_core::control::sweep`]).
pub async fn control_once(ctx: &Context, drives: &Arc<Semaphore>) -> Result<()> {
    let limit = Duration::from_secs(ctx.settings.worker.operation_timeout_secs);
    for (shard, pool) in ctx.pools.iter() {
        if let Err(e) = within(limit, notify_core::control::sweep(ctx, pool, drives)).await {
            warn!(error = %e, shard = %shard, "cannot take the control operations of a shard");
        }
    }
    report_operations(ctx, limit).await;
    Ok(())
}

/// Sets `notify_control_operations_pending` and
/// `notify_oldest_control_operation_age_seconds` over every home shard that
/// answers (an operation a shard keeps from finishing shows as an age that
/// keeps growing), and `notify_badge_repairs_pending` (users whose cached
/// state waits for Redis to answer again).
async fn report_operations(ctx: &Context, limit: Duration) {
    let (mut count, mut oldest, mut repairs) = (0u64, 0f64, 0u64);
    for (shard, pool) in ctx.pools.iter() {
        match within(limit, sweeper::operations_summary(pool)).await {
            Ok((n, age)) => {
                count += n;
                oldest = oldest.max(age);
            }
            Err(e) => warn!(error = %e, shard = %shard, "cannot count control operations"),
        }
        match within(limit, sweeper::badge_repairs_waiting(pool)).await {
            Ok(n) => repairs += n,
            Err(e) => warn!(error = %e, shard = %shard, "cannot count badge repairs"),
        }
    }
    metrics::gauge!("notify_control_operations_pending").set(count as f64);
    metrics::gauge!("notify_oldest_control_operation_age_seconds").set(oldest);
    metrics::gauge!("notify_badge_repairs_pending").set(repairs as f64);
}

/// Settles the chunks applied or recalled while Redis was away (see
/// [`notify_core::deliver::settle`]) on every shard that answers, and
/// counts the reads a filtered update left waiting
/// ([`notify_core::inbox::read_counts::count_left`]); a Redis still away
/// ends the round.
pub async fn settle_once(ctx: &Context) -> Result<()> {
    let limit = Duration::from_secs(ctx.settings.worker.operation_timeout_secs);
    for (shard, pool) in ctx.pools.iter() {
        // Counting reads needs no Redis: first, so that a Redis away does
        // not hold it back.
        let counting = notify_core::inbox::read_counts::count_left(ctx, shard, pool, BATCH);
        if let Err(e) = within(limit, counting).await {
            warn!(error = %e, shard = %shard, "settler could not count waiting reads on a shard");
        }
        let settling = async {
            notify_core::repair::settle(ctx, pool, BATCH).await?;
            notify_core::deliver::settle(ctx, pool, BATCH).await
        };
        match within(limit, settling).await {
            Ok(_) => {}
            Err(e @ notify_domain::Error::Cache(_)) => return Err(e),
            Err(e) => warn!(error = %e, shard = %shard, "settler passed over a shard"),
        }
    }
    Ok(())
}

/// `work`, or an error once it has taken longer than `limit`.
async fn within<T>(limit: Duration, work: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
        Err(notify_domain::Error::Unavailable(format!(
            "no answer within worker.operation_timeout_secs ({} s)",
            limit.as_secs()
        )))
    })
}

/// Sets `notify_sends_sending` and `notify_oldest_sending_send_age_seconds`
/// over every home shard that answers (a send stuck in SENDING shows as an
/// age that keeps growing).
async fn report_sending(ctx: &Context, limit: Duration) {
    let (mut count, mut oldest) = (0u64, None);
    for (shard, pool) in ctx.pools.iter() {
        match within(limit, sweeper::sending_summary(pool)).await {
            Ok((n, started)) => {
                count += n;
                oldest = match (oldest, started) {
                    (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
                    (a, b) => a.or(b),
                };
            }
            Err(e) => warn!(error = %e, shard = %shard, "cannot count sending messages"),
        }
    }
    let age = oldest.map_or(0.0, |started| {
        (chrono::Utc::now().naive_utc() - started).num_milliseconds().max(0) as f64 / 1000.0
    });
    metrics::gauge!("notify_sends_sending").set(count as f64);
    metrics::gauge!("notify_oldest_sending_send_age_seconds").set(age);
}

/// Announcements end (COMPLETED) when they expire; they have left every
/// inbox and badge already, this makes their status say so.
async fn end_expired_announcements(ctx: &Context, shard: ShardId, pool: &sqlx::MySqlPool) {
    if let Err(e) = notify_core::announce::end_expired(ctx, shard, pool).await {
        warn!(error = %e, shard = %shard, "sweeper cannot end expired announcements");
    }
}
