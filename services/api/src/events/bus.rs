//! The replica's consumer of the `{prefix}.events` fanout exchange: an
//! exclusive, auto-deleted queue of its own, consumed without acks (an event
//! only matters to streams open now), running while any stream is open.

use std::time::Duration;

use futures::StreamExt as _;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use notify_core::events::BusEvent;
use notify_core::queue::{self, Topology};
use notify_domain::Error;
use notify_domain::backoff::Reconnect;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{info, warn};

use super::Hub;

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
        let consumed = consume(&hub, &bound, &stop, was_bound).await;
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
            lapin::types::AMQPValue::LongLongInt(ms) => Some(*ms),
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
                        hub.dispatch(event);
                    }
                    Err(e) => warn!(error = %e, "skipping a malformed event"),
                },
                Some(Err(e)) => break Err(e.into()),
                None => break Ok(()),
            },
            _ = check.tick() => if !channel.status().connected() {
                break Err(Error::Unavailable("event channel closed".to_owned()));
            },
            () = stop.cancelled() => break Ok(()),
        }
    };
    let _ = channel.close(200, "no event streams".into()).await;
    let _ = connection.close(200, "no event streams".into()).await;
    result
}
