//! Consumes one lane's chunk tasks for one shard (each shard has its own
//! queue, so one slow or unreachable shard only holds its own slots):
//! bounded concurrency, retries with
//! exponential backoff, requeueing on transient trouble, dead-lettering on
//! permanent failure, manual acks only after the work is committed, and
//! reconnection after broker restarts. Every lane's consumer has a channel
//! of its own on the worker's one connection ([`SharedConnection`]).

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use lapin::Connection;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use notify_core::Context;
use notify_core::deliver::{self, TaskOutcome};
use notify_core::health::Heartbeats;
use notify_core::queue::{self, ChunkTask, TaskKind, Topology};
use notify_core::recall;
use notify_core::telemetry::trace;
use notify_domain::Error;
use notify_domain::backoff::Reconnect;
use notify_domain::domain::{Lane, MessageId};
use notify_domain::settings::RabbitSettings;
use shard_router::ShardId;
use tokio_stream::wrappers::IntervalStream;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error, info, warn};

/// How often an idle consumer reports that it is alive.
const IDLE_BEAT: Duration = Duration::from_secs(5);

/// Shortest and longest wait before a lost consumer connects again.
const RECONNECT_MIN: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// What a lane's consumer of one shard tells the probes.
#[derive(Clone)]
pub struct LaneHealth {
    /// The name it beats under (`consumer high s0`).
    pub beat: &'static str,
    /// Beats while the consumer loop turns (deliveries handled, or idle ticks
    /// taken in the same loop, so a wedged loop stops beating).
    pub heartbeats: Heartbeats,
    /// True while the lane is subscribed to its queue.
    pub consuming: Arc<AtomicBool>,
    /// Shards found unreachable, shared by the lanes.
    pub circuits: ShardCircuits,
}

/// How long a shard that did not answer is skipped before it is tried again.
const SHARD_OPEN_FOR: Duration = Duration::from_secs(2);

/// Longest a shard gets to answer `SELECT 1` after a chunk failed on it.
const SHARD_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Shards that did not answer, and until when their chunks are parked.
///
/// A chunk whose shard is down would hold a consumer slot through every
/// retry and pool timeout, and enough of them would hold every slot: the
/// other shards' chunks would wait behind a shard they do not need. A parked
/// chunk's task is acknowledged and its row stays pending on its shard, where
/// the sweeper finds it and publishes it again once the shard is back
/// (`worker.sweep_timeout_secs` after the send last moved). Nothing is lost:
/// the pending row is the truth, the task only a pointer to it.
#[derive(Clone, Default)]
pub struct ShardCircuits {
    open_until: Arc<std::sync::Mutex<HashMap<u32, tokio::time::Instant>>>,
}

impl ShardCircuits {
    fn is_open(&self, shard: u32) -> bool {
        let open = self.open_until.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&shard).is_some_and(|until| *until > tokio::time::Instant::now())
    }

    /// After a transient failure: true (and the circuit opened) when the
    /// shard does not answer a ping.
    async fn trips(&self, ctx: &Context, shard: u32) -> bool {
        let Some(pool) = ctx.pools.get(ShardId(shard)) else { return false };
        let ping = sqlx::query("SELECT 1").execute(pool);
        let answers = matches!(tokio::time::timeout(SHARD_PROBE_TIMEOUT, ping).await, Ok(Ok(_)));
        if !answers {
            let until = tokio::time::Instant::now() + SHARD_OPEN_FOR;
            self.open_until.lock().unwrap_or_else(|e| e.into_inner()).insert(shard, until);
        }
        !answers
    }
}

/// The heartbeat name of a lane's consumer of one shard. Leaked: made once
/// per consumer at startup.
pub fn beat_name(lane: Lane, shard: u32) -> &'static str {
    Box::leak(format!("consumer {} s{shard}", lane.name()).into_boxed_str())
}

/// The worker's one connection to RabbitMQ, shared by the consumers of
/// every lane and shard, each on a channel of its own (RabbitMQ's advice:
/// one connection per process, a channel per consumer).
///
/// One, not one per lane and shard: lapin runs a thread and keeps two
/// 32-frame ring buffers (1 MiB at 16 KiB frames) per connection, and a
/// ring's pages become resident as it is written through. Tasks are ~100
/// bytes, so eight rings filled over millions of recipients and the
/// worker's RSS kept rising through a long send (+22% at 10M against 1M)
/// before it levelled off; one ring fills within the first send.
#[derive(Clone)]
pub struct SharedConnection {
    settings: RabbitSettings,
    current: Arc<tokio::sync::Mutex<Option<Arc<Connection>>>>,
}

impl SharedConnection {
    /// A connection to the broker of `settings`, made when first asked for.
    pub fn new(settings: RabbitSettings) -> Self {
        Self { settings, current: Arc::default() }
    }

    /// Returns the connection, connecting first when there is none or the
    /// one held was lost (the lanes that notice together connect once).
    pub async fn get(&self) -> Result<Arc<Connection>, Error> {
        let mut current = self.current.lock().await;
        if let Some(connection) = current.as_ref().filter(|c| c.status().connected()) {
            return Ok(Arc::clone(connection));
        }
        let connection = Arc::new(queue::connect(&self.settings, "notify-worker").await?);
        *current = Some(Arc::clone(&connection));
        Ok(connection)
    }

    /// Forgets `connection` after a step on it got no answer (the broker
    /// took it and then stopped answering, so it still reads as
    /// connected): the next [`get`](Self::get) connects anew. A connection
    /// another lane already replaced stays replaced. The old one closes
    /// when its last channel is dropped.
    pub async fn discard(&self, connection: &Arc<Connection>) {
        let mut current = self.current.lock().await;
        if current.as_ref().is_some_and(|held| Arc::ptr_eq(held, connection)) {
            *current = None;
        }
    }

    /// Closes the connection (after every consumer stopped).
    pub async fn close(&self) {
        if let Some(connection) = self.current.lock().await.take() {
            queue::close_connection(&connection, "worker shutting down").await;
        }
    }
}

/// Runs the consumer of a lane's queue for one shard until `shutdown`;
/// opens a new channel, and a new connection when the broker went away,
/// after each loss.
pub async fn run_lane(
    ctx: Context,
    broker: SharedConnection,
    lane: Lane,
    shard: u32,
    health: LaneHealth,
    shutdown: CancellationToken,
) {
    let mut backoff = Reconnect::new(RECONNECT_MIN, RECONNECT_MAX);
    while !shutdown.is_cancelled() {
        health.heartbeats.beat(health.beat);
        let consumed = match broker.get().await {
            Ok(connection) => {
                let consumed = consume(&ctx, &connection, lane, shard, &health, &shutdown).await;
                // A step that got no answer: the connection is dead to us,
                // whatever its state says. Other errors (a channel closed
                // by the broker, a queue gone) leave it to the other lanes.
                if matches!(consumed, Err(Error::Unavailable(_))) {
                    broker.discard(&connection).await;
                }
                consumed
            }
            Err(e) => Err(e),
        };
        // It got as far as consuming: the next loss starts the waits over.
        if health.consuming.swap(false, Ordering::Relaxed) {
            backoff.reset();
        }
        match consumed {
            Ok(()) if shutdown.is_cancelled() => break,
            Ok(()) => warn!(lane = lane.name(), shard, "consumer stream ended, reconnecting"),
            Err(e) => warn!(error = %e, lane = lane.name(), shard, "consumer failed, reconnecting"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay()) => {}
            () = shutdown.cancelled() => break,
        }
    }
    info!(lane = lane.name(), shard, "consumer stopped");
}

/// What the consumer loop takes next.
enum Event {
    /// Boxed: a delivery is large and a tick is nothing.
    Delivery(Box<Result<Delivery, lapin::Error>>),
    Tick,
}

async fn consume(
    ctx: &Context,
    connection: &Connection,
    lane: Lane,
    shard: u32,
    health: &LaneHealth,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let settings = &ctx.settings;
    let name = format!("notify-worker-{}-s{shard}", lane.name());
    let channel = queue::bounded("opening a channel", connection.create_channel()).await?;
    let topology = Topology::new(settings);
    topology.declare(&channel).await?;
    let concurrency = settings.worker.concurrency;
    // Groups on the bulk lane only: the tasks of one ready batch that are
    // not one send's go one by one in one slot, which would queue a burst
    // of small high-priority sends behind each other while other slots idle.
    let group = match lane {
        Lane::Bulk => settings.worker.chunks_per_transaction.max(1),
        Lane::High => 1,
    };
    // Prefetch fills every slot with a full group: the broker hands out no
    // more than we can work on, and unacked tasks return to the queue if
    // this process dies.
    let prefetch = u16::try_from(concurrency * group).unwrap_or(u16::MAX);
    queue::bounded("basic.qos", channel.basic_qos(prefetch, BasicQosOptions::default())).await?;
    let consume = channel.basic_consume(
        topology.queue(lane, shard).into(),
        format!("{name}-{}", std::process::id()).into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    );
    let consumer = queue::bounded("basic.consume", consume).await?;
    info!(lane = lane.name(), shard, concurrency, "consuming chunk tasks");
    health.consuming.store(true, Ordering::Relaxed);
    // Idle ticks share the deliveries' slots: when every slot is stuck, the
    // ticks stop too and the heartbeat goes stale.
    let ticks = IntervalStream::new(tokio::time::interval(IDLE_BEAT)).map(|_| Event::Tick);
    let events = futures::stream::select(consumer.map(|d| Event::Delivery(Box::new(d))), ticks);
    // A broken connection ends the stream (and this consumption, which the
    // caller starts again on a new connection): an aborted socket surfaces as
    // a delivery error, a silently dead one as a channel no longer connected
    // at the next tick. Tasks taken and not acked go back to the queue.
    let alive = |event: &Event| {
        let broken = match event {
            Event::Delivery(delivery) => match delivery.as_ref() {
                Err(e) => Some(e.to_string()),
                Ok(_) => None,
            },
            Event::Tick if !channel.status().connected() => Some("channel closed".to_owned()),
            Event::Tick => None,
        };
        if let Some(error) = &broken {
            warn!(error = %error, lane = lane.name(), shard, "consumer connection lost");
        }
        std::future::ready(broken.is_none())
    };
    // Stop taking new deliveries at shutdown; for_each_concurrent still
    // finishes (and acks) every delivery already taken. Deliveries already
    // waiting when a slot frees up go to it together (up to a group).
    events
        .take_until(shutdown.cancelled())
        .take_while(alive)
        .ready_chunks(group)
        .for_each_concurrent(concurrency, |events| async move {
            let deliveries: Vec<Delivery> = events
                .into_iter()
                .filter_map(|event| match event {
                    Event::Delivery(delivery) => (*delivery).ok(),
                    Event::Tick => None,
                })
                .collect();
            if !deliveries.is_empty() {
                handle_ready(ctx, lane, shard, deliveries, &health.circuits, shutdown).await;
            }
            health.heartbeats.beat(health.beat);
        })
        .await;
    // Closing returns any unacked (never started) deliveries to the queue;
    // the connection closes after every lane's channel
    // ([`SharedConnection::close`]).
    queue::close_channel(&channel, "worker shutting down").await;
    Ok(())
}

/// Acknowledges a task whose shard is down, leaving its chunk pending for
/// the sweeper (see [`ShardCircuits`]).
async fn park(lane: Lane, task: &ChunkTask, delivery: &Delivery) {
    metrics::counter!("notify_chunks_parked_total", "lane" => lane.name()).increment(1);
    warn!(
        message_id = task.message_id,
        chunk_id = task.chunk_id,
        shard = task.shard,
        "shard down, chunk left pending for the sweeper"
    );
    let _ = queue::ack(&delivery.acker, BasicAckOptions::default()).await;
}

/// The span of a task, a child of whatever published it (the send's call,
/// or a sweep) when traces are exported.
fn task_span(lane: Lane, shard: u32, delivery: &Delivery) -> tracing::Span {
    let span = tracing::info_span!(
        "chunk task",
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        lane = lane.name(),
        shard
    );
    trace::follow_amqp(&span, delivery.properties.headers().as_ref());
    span
}

/// Handles the deliveries that were ready together: first deliveries of the
/// same send's chunks go as one group (one transaction), and so do its
/// recall tasks; everything else (a lone task, a redelivery, a task of a
/// parked shard, a group that failed) one by one, with its retries.
async fn handle_ready(
    ctx: &Context,
    lane: Lane,
    shard: u32,
    deliveries: Vec<Delivery>,
    circuits: &ShardCircuits,
    shutdown: &CancellationToken,
) {
    let mut alone = Vec::new();
    let mut groups: HashMap<(TaskKind, u64), Vec<(ChunkTask, Delivery)>> = HashMap::new();
    for delivery in deliveries {
        match ChunkTask::decode(&delivery.data) {
            Ok(task)
                if !delivery.redelivered && task.shard == shard && !circuits.is_open(shard) =>
            {
                groups.entry((task.kind, task.message_id)).or_default().push((task, delivery));
            }
            _ => alone.push(delivery),
        }
    }
    for ((kind, message_id), tasks) in groups {
        if tasks.len() == 1 {
            alone.extend(tasks.into_iter().map(|(_, delivery)| delivery));
            continue;
        }
        // The group's span follows its first task's publisher (one send's
        // tasks are published from one place).
        let span = task_span(lane, shard, &tasks[0].1);
        let left = apply_group(ctx, lane, kind, message_id, tasks).instrument(span).await;
        alone.extend(left);
    }
    for delivery in alone {
        let span = task_span(lane, shard, &delivery);
        handle(ctx, lane, delivery, circuits, shutdown).instrument(span).await;
    }
}

/// Applies a group of one send's tasks in one go and acks them; returns the
/// deliveries to handle one by one instead (all of them when the group
/// failed: nothing of it is half done, since a failed transaction rolls
/// back and the rest repeats safely).
async fn apply_group(
    ctx: &Context,
    lane: Lane,
    kind: TaskKind,
    message_id: u64,
    tasks: Vec<(ChunkTask, Delivery)>,
) -> Vec<Delivery> {
    let started = std::time::Instant::now();
    let shard = ShardId(tasks[0].0.shard);
    let chunk_ids: Vec<u64> = tasks.iter().map(|(task, _)| task.chunk_id).collect();
    let limit = Duration::from_secs(ctx.settings.worker.operation_timeout_secs);
    let send = MessageId::from_raw(message_id);
    let retired = tasks.iter().all(|(task, _)| task.badges_retired);
    let applying = AssertUnwindSafe(async {
        match kind {
            TaskKind::Deliver => deliver::apply_group(ctx, shard, send, &chunk_ids, false).await,
            TaskKind::Recall => recall::apply_group(ctx, shard, send, &chunk_ids, retired).await,
        }
    })
    .catch_unwind();
    let outcomes = match tokio::time::timeout(limit, applying).await {
        Ok(Ok(Ok(outcomes))) => outcomes,
        failed => {
            let reason = match failed {
                Ok(Ok(Err(e))) => e.to_string(),
                Ok(Err(_)) => "applying the group panicked".to_owned(),
                _ => "applying the group took longer than worker.operation_timeout_secs".to_owned(),
            };
            warn!(error = %reason, message_id, chunks = chunk_ids.len(), "chunk group failed, applying its chunks one by one");
            return tasks.into_iter().map(|(_, delivery)| delivery).collect();
        }
    };
    for ((task, delivery), outcome) in tasks.into_iter().zip(outcomes) {
        record(lane, outcome, started);
        if let Err(e) = queue::ack(&delivery.acker, BasicAckOptions::default()).await {
            // The task will be redelivered; applying it again is a no-op.
            warn!(error = %e, message_id = task.message_id, chunk_id = task.chunk_id, "ack failed");
        }
    }
    Vec::new()
}

async fn handle(
    ctx: &Context,
    lane: Lane,
    delivery: Delivery,
    circuits: &ShardCircuits,
    shutdown: &CancellationToken,
) {
    let task = match ChunkTask::decode(&delivery.data) {
        Ok(task) => task,
        Err(e) => {
            error!(error = %e, "dead-lettering a malformed task");
            let _ = queue::nack(
                &delivery.acker,
                BasicNackOptions { requeue: false, ..Default::default() },
            )
            .await;
            return;
        }
    };
    if circuits.is_open(task.shard) {
        park(lane, &task, &delivery).await;
        return;
    }
    let max_attempts = ctx.settings.worker.max_attempts;
    let mut delay = Duration::from_millis(ctx.settings.worker.retry_base_ms);
    for attempt in 1..=max_attempts {
        let started = std::time::Instant::now();
        // A panic is a permanent failure of this task, not of the worker.
        // In-process retries count as redeliveries too.
        let redelivered = delivery.redelivered || attempt > 1;
        let limit = Duration::from_secs(ctx.settings.worker.operation_timeout_secs);
        // A lone task is a group of one.
        let applying = AssertUnwindSafe(async {
            let (shard, send, chunk) =
                (ShardId(task.shard), MessageId::from_raw(task.message_id), [task.chunk_id]);
            let outcomes = match task.kind {
                TaskKind::Deliver => {
                    deliver::apply_group(ctx, shard, send, &chunk, redelivered).await
                }
                TaskKind::Recall => {
                    recall::apply_group(ctx, shard, send, &chunk, task.badges_retired).await
                }
            };
            outcomes.map(|outcomes| outcomes.into_iter().next().unwrap_or(TaskOutcome::Dropped))
        })
        .catch_unwind();
        let result = match tokio::time::timeout(limit, applying).await {
            Ok(applied) => applied
                .unwrap_or_else(|_| Err(Error::Internal("applying the chunk panicked".to_owned()))),
            // Dropping the attempt rolls its transaction back.
            Err(_) => Err(Error::Unavailable(format!(
                "applying the chunk took longer than worker.operation_timeout_secs ({} s)",
                limit.as_secs()
            ))),
        };
        match result {
            Ok(outcome) => {
                record(lane, outcome, started);
                if let Err(e) = queue::ack(&delivery.acker, BasicAckOptions::default()).await {
                    // The task will be redelivered; applying it again is a no-op.
                    warn!(error = %e, message_id = task.message_id, chunk_id = task.chunk_id, "ack failed");
                }
                return;
            }
            Err(e) if e.is_transient() => {
                warn!(error = %e, attempt, task = ?task.kind, message_id = task.message_id, chunk_id = task.chunk_id, "chunk attempt failed");
                if circuits.trips(ctx, task.shard).await {
                    park(lane, &task, &delivery).await;
                    return;
                }
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
                error!(error = %e, kind = e.db_failure().map_or("", notify_domain::error::DbFailure::name), attempt, task = ?task.kind, message_id = task.message_id, chunk_id = task.chunk_id, "chunk failed for good, dead-lettering");
                metrics::counter!("notify_chunks_failed_total", "lane" => lane.name()).increment(1);
                // A recall task's chunk stays delivered: the sweeper
                // publishes it again.
                if task.kind == TaskKind::Deliver
                    && let Err(record_error) = deliver::record_failure(ctx, &task).await
                {
                    // The chunk stays pending; the sweeper re-publishes it later.
                    warn!(error = %record_error, "could not record the chunk as failed");
                }
                let _ = queue::nack(
                    &delivery.acker,
                    BasicNackOptions { requeue: false, ..Default::default() },
                )
                .await;
                return;
            }
        }
    }
    // Transient trouble (a shard or Redis down): nothing is lost, the task
    // goes back to the queue and is tried again later, by any worker.
    metrics::counter!("notify_chunks_requeued_total", "lane" => lane.name()).increment(1);
    let _ = queue::nack(&delivery.acker, BasicNackOptions { requeue: true, ..Default::default() })
        .await;
}

fn record(lane: Lane, outcome: TaskOutcome, started: std::time::Instant) {
    let outcome_name = match outcome {
        TaskOutcome::Delivered { .. } => "delivered",
        TaskOutcome::AlreadyDone => "already_done",
        TaskOutcome::Skipped(_) => "skipped",
        TaskOutcome::Dropped => "dropped",
        TaskOutcome::Failed => "failed",
        TaskOutcome::Recalled { .. } => "recalled",
    };
    metrics::counter!("notify_chunks_total", "lane" => lane.name(), "outcome" => outcome_name)
        .increment(1);
    metrics::histogram!("notify_chunk_apply_seconds", "lane" => lane.name())
        .record(started.elapsed().as_secs_f64());
}
