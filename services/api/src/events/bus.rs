//! The replica's consumer of the `{prefix}.events` fanout exchange.
//!
//! [`BusSource::Exclusive`] (the api): an exclusive, auto-deleted queue of
//! its own, consumed without acks (an event only matters to streams open
//! now), running while any stream is open.
//!
//! [`BusSource::Stream`] (the edge): the stream queue
//! `{prefix}.events.history`, bound to the exchange and shared by every
//! edge replica, each event at the same offset for all (RabbitMQ keeps it
//! for the retention). The consumer runs always; it starts that far back
//! (the history fills before the first resume), and after a lost
//! connection reads on from the offset after its last event, so the hub
//! misses nothing the stream still holds; when the stream no longer holds
//! it, every stream gets a snapshot.

use std::time::Duration;

use futures::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use notify_core::broker::broker_error;
use notify_core::events::BusEvent;
use notify_core::queue::{self, Topology};
use notify_domain::Error;
use notify_domain::backoff::Reconnect;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{info, warn};

use super::{BusSource, Hub, Position};

/// Stream deliveries unacknowledged at once (a stream consumer must
/// acknowledge, for credit; the events stay in the stream).
const STREAM_PREFETCH: u16 = 2000;

/// Deliveries acknowledged together.
const ACK_EVERY: u64 = 256;

/// Segments of the events stream: retention drops whole segments, so small
/// ones keep its disk close to the retention.
const STREAM_SEGMENT_BYTES: i64 = 8 << 20;

/// Longest a new stream waits for the consumer to be bound.
const BIND_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a quiet consumer checks that its channel is still open.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Shortest and longest wait before a lost consumer connects again.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Starts and stops the consumer with the first and last stream.
#[derive(Default)]
pub struct BusControl {
    running: tokio::sync::Mutex<Option<Running>>,
}

struct Running {
    stop: CancellationToken,
    bound: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl BusControl {
    /// Starts the consumer if it is not running, and waits until its queue
    /// is bound (UNAVAILABLE after 10 s).
    pub async fn ensure(&self, hub: &Hub) -> Result<(), Status> {
        let mut bound = {
            let mut running = self.running.lock().await;
            if running.as_ref().is_none_or(|r| r.task.is_finished()) {
                let stop = hub.inner.shutdown.child_token();
                let (tx, rx) = watch::channel(false);
                let task = tokio::spawn(run(hub.clone(), tx, stop.clone()));
                *running = Some(Running { stop, bound: rx, task });
            }
            running.as_ref().map(|r| r.bound.clone()).expect("just started")
        };
        match tokio::time::timeout(BIND_TIMEOUT, bound.wait_for(|bound| *bound)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Status::unavailable(
                "the event bus (rabbitmq.url) is unreachable; subscribe again later",
            )),
        }
    }

    /// Stops the consumer when no stream is open (its queue goes with it).
    pub async fn stop_if_idle(&self, hub: &Hub) {
        let mut running = self.running.lock().await;
        if hub.streams() == 0
            && let Some(running) = running.take()
        {
            running.stop.cancel();
        }
    }
}

async fn run(hub: Hub, bound: watch::Sender<bool>, stop: CancellationToken) {
    let mut was_bound = false;
    let mut backoff = Reconnect::new(RECONNECT_MIN, RECONNECT_MAX);
    while !stop.is_cancelled() {
        let consumed = match hub.source() {
            BusSource::Exclusive => consume(&hub, &bound, &stop, was_bound).await,
            BusSource::Stream { retention, .. } => {
                consume_stream(&hub, &bound, &stop, retention).await
            }
        };
        was_bound |= *bound.borrow();
        if *bound.borrow() {
            backoff.reset();
        }
        bound.send_replace(false);
        match consumed {
            Ok(()) if stop.is_cancelled() => break,
            Ok(()) => warn!("event consumer ended, reconnecting"),
            Err(e) => warn!(error = %e, "event consumer failed, reconnecting"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay()) => {}
            () = stop.cancelled() => break,
        }
    }
    info!("event consumer stopped");
}

/// Records how long the event took from its publish to this replica.
fn record_lag(delivery: &lapin::message::Delivery) {
    let published = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(queue::PUBLISHED_AT_HEADER))
        .and_then(|value| match value {
            AMQPValue::LongLongInt(ms) => Some(*ms),
            _ => None,
        });
    if let Some(published) = published {
        let lag_ms = (chrono::Utc::now().timestamp_millis() - published).max(0);
        metrics::histogram!("notify_event_lag_seconds").record(lag_ms as f64 / 1000.0);
    }
}

async fn consume(
    hub: &Hub,
    bound: &watch::Sender<bool>,
    stop: &CancellationToken,
    resync: bool,
) -> Result<(), Error> {
    let settings = &hub.context().settings;
    let connection = queue::connect(&settings.rabbitmq, "notify-api-events").await?;
    let channel = queue::bounded("opening a channel", connection.create_channel()).await?;
    let topology = Topology::new(settings);
    topology.declare(&channel).await?;
    let exclusive =
        QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() };
    let declare = channel.queue_declare("".into(), exclusive, FieldTable::default());
    let queue = queue::bounded("declaring the events queue", declare).await?;
    let bind = channel.queue_bind(
        queue.name().as_str().into(),
        topology.events_exchange().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    );
    queue::bounded("binding the events queue", bind).await?;
    let consume = channel.basic_consume(
        queue.name().as_str().into(),
        "notify-api-events".into(),
        BasicConsumeOptions { no_ack: true, ..Default::default() },
        FieldTable::default(),
    );
    let mut deliveries = queue::bounded("basic.consume", consume).await?;
    bound.send_replace(true);
    info!(queue = queue.name().as_str(), "consuming change events");
    if resync {
        // Events published while the consumer was away are lost to it.
        metrics::counter!("notify_event_bus_reconnects_total").increment(1);
        hub.resync_all();
    }
    let mut check = tokio::time::interval(CHECK_EVERY);
    let result = loop {
        tokio::select! {
            delivery = deliveries.next() => match delivery {
                Some(Ok(delivery)) => match BusEvent::decode(&delivery.data) {
                    Ok(event) => {
                        record_lag(&delivery);
                        hub.dispatch(event, None);
                    }
                    Err(e) => warn!(error = %e, "skipping a malformed event"),
                },
                Some(Err(e)) => break Err(broker_error(e)),
                None => break Ok(()),
            },
            _ = check.tick() => if !channel.status().connected() {
                break Err(Error::Unavailable("event channel closed".to_owned()));
            },
            () = stop.cancelled() => break Ok(()),
        }
    };
    queue::close_channel(&channel, "no event streams").await;
    queue::close_connection(&connection, "no event streams").await;
    result
}

/// Reads the events stream from `retention` ago (first connection) or from
/// the offset after the hub's last (a reconnection), until `stop`.
async fn consume_stream(
    hub: &Hub,
    bound: &watch::Sender<bool>,
    stop: &CancellationToken,
    retention: Duration,
) -> Result<(), Error> {
    let settings = &hub.context().settings;
    let connection = queue::connect(&settings.rabbitmq, "notify-edge-events").await?;
    let channel = queue::bounded("opening a channel", connection.create_channel()).await?;
    let topology = Topology::new(settings);
    topology.declare(&channel).await?;
    let name = topology.events_history();
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString("stream".into()));
    args.insert(
        "x-max-age".into(),
        AMQPValue::LongString(format!("{}s", retention.as_secs().max(1)).as_str().into()),
    );
    args.insert(
        "x-stream-max-segment-size-bytes".into(),
        AMQPValue::LongLongInt(STREAM_SEGMENT_BYTES),
    );
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    let declare = channel.queue_declare(name.as_str().into(), durable, args);
    queue::bounded("declaring the events stream", declare).await?;
    let bind = channel.queue_bind(
        name.as_str().into(),
        topology.events_exchange().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    );
    queue::bounded("binding the events stream", bind).await?;
    let qos = channel.basic_qos(STREAM_PREFETCH, BasicQosOptions::default());
    queue::bounded("basic.qos", qos).await?;
    // On from the last event routed, or from as far back as streams resume.
    let last = hub.routed();
    let from = match last {
        Some(last) => AMQPValue::LongLongInt((last.offset + 1) as i64),
        None => {
            let since = chrono::Utc::now().timestamp() - retention.as_secs() as i64;
            AMQPValue::Timestamp(since.max(0) as u64)
        }
    };
    let mut offset = FieldTable::default();
    offset.insert("x-stream-offset".into(), from);
    let consume = channel.basic_consume(
        name.as_str().into(),
        "notify-edge-events".into(),
        BasicConsumeOptions::default(),
        offset,
    );
    let mut deliveries = queue::bounded("basic.consume", consume).await?;
    bound.send_replace(true);
    info!(stream = %name, from = ?last, "reading the events stream");
    let mut first = true;
    let mut unacked = 0;
    let mut check = tokio::time::interval(CHECK_EVERY);
    let result = loop {
        tokio::select! {
            delivery = deliveries.next() => match delivery {
                Some(Ok(delivery)) => {
                    let Some(at) = position(&delivery) else {
                        warn!("an events stream delivery without x-stream-offset, skipped");
                        continue;
                    };
                    if first && last.is_some_and(|last| at.offset != last.offset + 1) {
                        // The stream no longer holds what came after the
                        // last event routed here.
                        metrics::counter!("notify_event_bus_reconnects_total").increment(1);
                        hub.resync_all();
                    }
                    first = false;
                    match BusEvent::decode(&delivery.data) {
                        Ok(event) => {
                            record_lag(&delivery);
                            hub.dispatch(event, Some(at));
                        }
                        Err(e) => warn!(error = %e, "skipping a malformed event"),
                    }
                    unacked += 1;
                    if unacked >= ACK_EVERY {
                        unacked = 0;
                        let acked = queue::ack(&delivery.acker, BasicAckOptions { multiple: true });
                        if let Err(e) = acked.await {
                            break Err(e);
                        }
                    }
                }
                Some(Err(e)) => break Err(broker_error(e)),
                None => break Ok(()),
            },
            _ = check.tick() => if !channel.status().connected() {
                break Err(Error::Unavailable("events stream channel closed".to_owned()));
            },
            () = stop.cancelled() => break Ok(()),
        }
    };
    queue::close_channel(&channel, "edge stopping").await;
    queue::close_connection(&connection, "edge stopping").await;
    result
}

/// Where a delivery of the events stream is: its offset, and its publish
/// time as the check of the stream's life.
fn position(delivery: &lapin::message::Delivery) -> Option<Position> {
    let headers = delivery.properties.headers().as_ref()?.inner();
    let offset = match headers.get("x-stream-offset")? {
        AMQPValue::LongLongInt(offset) => u64::try_from(*offset).ok()?,
        AMQPValue::LongUInt(offset) => u64::from(*offset),
        _ => return None,
    };
    let stamp = match headers.get(queue::PUBLISHED_AT_HEADER) {
        Some(AMQPValue::LongLongInt(ms)) => u64::try_from(*ms).unwrap_or(0),
        _ => 0,
    };
    Some(Position { offset, stamp })
}
