//! Consumes one lane's chunk tasks: bounded concurrency, retries with
//! exponential backoff, requeueing on transient trouble, dead-lettering on
//! permanent failure, manual acks only after the work is committed, and
//! reconnection after broker restarts.

use std::time::Duration;

use std::panic::AssertUnwindSafe;

use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use notify_core::deliver::{self, TaskOutcome};
use notify_core::domain::Lane;
use notify_core::queue::{self, ChunkTask, Topology};
use notify_core::{Context, Error};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Runs a lane's consumer until `shutdown`; reconnects when the broker goes away.
pub async fn run_lane(ctx: Context, lane: Lane, shutdown: CancellationToken) {
    let mut backoff = Duration::from_millis(200);
    while !shutdown.is_cancelled() {
        match consume(&ctx, lane, &shutdown).await {
            Ok(()) if shutdown.is_cancelled() => break,
            Ok(()) => warn!(lane = lane.name(), "consumer stream ended, reconnecting"),
            Err(e) => warn!(error = %e, lane = lane.name(), "consumer failed, reconnecting"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => break,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    info!(lane = lane.name(), "consumer stopped");
}

async fn consume(ctx: &Context, lane: Lane, shutdown: &CancellationToken) -> Result<(), Error> {
    let settings = &ctx.settings;
    let connection =
        queue::connect(&settings.rabbitmq, &format!("notify-worker-{}", lane.name())).await?;
    let channel = connection.create_channel().await?;
    let topology = Topology::new(&settings.rabbitmq);
    topology.declare(&channel).await?;
    let concurrency = settings.worker.concurrency;
    // Prefetch equals concurrency: the broker hands out no more than we can
    // work on, and unacked tasks return to the queue if this process dies.
    channel.basic_qos(concurrency as u16, BasicQosOptions::default()).await?;
    let consumer = channel
        .basic_consume(
            topology.queue(lane).into(),
            format!("notify-worker-{}-{}", lane.name(), std::process::id()).into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    info!(lane = lane.name(), concurrency, "consuming chunk tasks");
    // Stop taking new deliveries at shutdown; for_each_concurrent still
    // finishes (and acks) every delivery already taken.
    consumer
        .take_until(shutdown.cancelled())
        .for_each_concurrent(concurrency, |delivery| async move {
            match delivery {
                Ok(delivery) => handle(ctx, lane, delivery, shutdown).await,
                Err(e) => warn!(error = %e, "delivery error"),
            }
        })
        .await;
    // Closing returns any unacked (never started) deliveries to the queue.
    // The channel goes first: lapin logs a spurious error otherwise.
    let _ = channel.close(200, "worker shutting down".into()).await;
    let _ = connection.close(200, "worker shutting down".into()).await;
    Ok(())
}

async fn handle(ctx: &Context, lane: Lane, delivery: Delivery, shutdown: &CancellationToken) {
    let task = match ChunkTask::decode(&delivery.data) {
        Ok(task) => task,
        Err(e) => {
            error!(error = %e, "dead-lettering a malformed task");
            let _ = delivery.nack(BasicNackOptions { requeue: false, ..Default::default() }).await;
            return;
        }
    };
    let max_attempts = ctx.settings.worker.max_attempts;
    let mut delay = Duration::from_millis(ctx.settings.worker.retry_base_ms);
    for attempt in 1..=max_attempts {
        let started = std::time::Instant::now();
        // A panic is a permanent failure of this task, not of the worker.
        // In-process retries count as redeliveries too.
        let redelivered = delivery.redelivered || attempt > 1;
        let result = AssertUnwindSafe(deliver::apply_task(ctx, &task, redelivered))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(Error::Internal("applying the chunk panicked".to_owned())));
        match result {
            Ok(outcome) => {
                record(lane, outcome, started);
                if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
                    // The task will be redelivered; applying it again is a no-op.
                    warn!(error = %e, message_id = task.message_id, chunk_id = task.chunk_id, "ack failed");
                }
                return;
            }
            Err(e) if e.is_transient() => {
                warn!(error = %e, attempt, message_id = task.message_id, chunk_id = task.chunk_id, "chunk attempt failed");
                if attempt == max_attempts {
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => break,
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(e) => {
                error!(error = %e, attempt, message_id = task.message_id, chunk_id = task.chunk_id, "chunk failed for good, dead-lettering");
                metrics::counter!("notify_chunks_failed_total", "lane" => lane.name()).increment(1);
                if let Err(record_error) = deliver::record_failure(ctx, &task).await {
                    // The chunk stays pending; the sweeper re-publishes it later.
                    warn!(error = %record_error, "could not record the chunk as failed");
                }
                let _ =
                    delivery.nack(BasicNackOptions { requeue: false, ..Default::default() }).await;
                return;
            }
        }
    }
    // Transient trouble (a shard or Redis down): nothing is lost, the task
    // goes back to the queue and is tried again later, by any worker.
    metrics::counter!("notify_chunks_requeued_total", "lane" => lane.name()).increment(1);
    let _ = delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await;
}

fn record(lane: Lane, outcome: TaskOutcome, started: std::time::Instant) {
    let outcome_name = match outcome {
        TaskOutcome::Delivered { .. } => "delivered",
        TaskOutcome::AlreadyDone => "already_done",
        TaskOutcome::Skipped(_) => "skipped",
        TaskOutcome::Dropped => "dropped",
        TaskOutcome::Failed => "failed",
    };
    metrics::counter!("notify_chunks_total", "lane" => lane.name(), "outcome" => outcome_name)
        .increment(1);
    metrics::histogram!("notify_chunk_apply_seconds", "lane" => lane.name())
        .record(started.elapsed().as_secs_f64());
}
