//! When each recipient's item was committed: the worker publishes one
//! change event per applied chunk group to the `{prefix}.events` exchange,
//! with the commit time of its transaction (`committed_at_ms`), and the
//! edge reads the same events from the stream bound to that exchange. The
//! bench binds an exclusive queue of its own to the exchange and keeps, per
//! user, the commit time of the first delivery event naming them (the start
//! of the commit -> client latency) and its publish time (the
//! `x-published-ms` header the publisher sets), which splits the latency
//! into the worker's part and the rest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use hdrhistogram::Histogram;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use notify_core::events::BusEvent;
use notify_core::queue::{self, Topology};
use notify_domain::Settings;
use tokio::task::JoinHandle;

/// When a user's item was committed and its event published, ms since the
/// epoch (0: the event had no publish time).
#[derive(Debug, Clone, Copy)]
pub struct Committed {
    /// The chunk's transaction committed.
    pub at: i64,
    /// Its event was published.
    pub published: i64,
}

/// Delivery events by message and user.
type ByMessage = HashMap<u64, HashMap<u64, Committed>>;

/// One delivery event: its message and when its chunk committed and it was
/// published. The chunks a worker applies in one transaction share one
/// commit time, and it publishes their events one after the other, each
/// once the broker confirmed the one before.
#[derive(Debug, Clone, Copy)]
struct Event {
    message_id: u64,
    committed: Committed,
}

#[derive(Default)]
struct Recorded {
    by_message: ByMessage,
    events: Vec<Event>,
}

/// How the worker's commit -> publish time divides, ms: commit -> the
/// first publish of a transaction's chunks (badge invalidation, settling),
/// and the gaps between the publishes after it (each waits for the
/// broker's confirm of the one before).
#[derive(Debug)]
pub struct PublishGaps {
    /// Commit -> first publish, one per transaction.
    pub first: Histogram<u64>,
    /// Publish -> the next publish of the same transaction.
    pub between: Histogram<u64>,
    /// Chunks per transaction, most seen.
    pub most_chunks: usize,
}

/// The running recorder; stops when dropped.
pub struct Commits {
    recorded: Arc<Mutex<Recorded>>,
    task: JoinHandle<()>,
}

impl Commits {
    /// Binds the queue (so nothing published after this returns is missed)
    /// and starts recording.
    pub async fn start(settings: &Settings) -> anyhow::Result<Self> {
        let connection = queue::connect(&settings.rabbitmq, "notify-bench-commits").await?;
        let channel = connection.create_channel().await?;
        let topology = Topology::new(settings);
        topology.declare(&channel).await?;
        let exclusive =
            QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() };
        let declared = channel.queue_declare("".into(), exclusive, FieldTable::default()).await?;
        let name = declared.name().as_str().to_owned();
        channel
            .queue_bind(
                name.as_str().into(),
                topology.events_exchange().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut deliveries = channel
            .basic_consume(
                name.as_str().into(),
                "notify-bench-commits".into(),
                BasicConsumeOptions { no_ack: true, ..Default::default() },
                FieldTable::default(),
            )
            .await?;
        let recorded = Arc::new(Mutex::new(Recorded::default()));
        let task = {
            let recorded = recorded.clone();
            tokio::spawn(async move {
                // Held for as long as the task reads.
                let _connection = connection;
                while let Some(Ok(delivery)) = deliveries.next().await {
                    let Ok(BusEvent::ItemsDelivered {
                        message_id,
                        user_ids,
                        committed_at_ms: Some(at),
                        ..
                    }) = BusEvent::decode(&delivery.data)
                    else {
                        continue;
                    };
                    let header = delivery.properties.headers().as_ref().and_then(|headers| {
                        headers.inner().get(queue::PUBLISHED_AT_HEADER).cloned()
                    });
                    let published = match header {
                        Some(AMQPValue::LongLongInt(ms)) => ms,
                        _ => 0,
                    };
                    let committed = Committed { at, published };
                    let mut recorded = recorded.lock().unwrap_or_else(|e| e.into_inner());
                    recorded.events.push(Event { message_id, committed });
                    let users = recorded.by_message.entry(message_id).or_default();
                    for user in user_ids {
                        users.entry(user).or_insert(committed);
                    }
                }
            })
        };
        Ok(Self { recorded, task })
    }

    /// When each user's item of `message_id` was committed and published.
    pub fn of(&self, message_id: u64) -> HashMap<u64, Committed> {
        let recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        recorded.by_message.get(&message_id).cloned().unwrap_or_default()
    }

    /// The worker's commit -> publish time of `message_id`'s events,
    /// divided (a transaction's chunks are told apart by their shared
    /// commit time).
    pub fn gaps(&self, message_id: u64) -> anyhow::Result<PublishGaps> {
        let recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        let mut transactions: HashMap<i64, Vec<i64>> = HashMap::new();
        for event in recorded.events.iter().filter(|e| e.message_id == message_id) {
            if event.committed.published > 0 {
                let published = transactions.entry(event.committed.at).or_default();
                published.push(event.committed.published);
            }
        }
        let mut gaps =
            PublishGaps { first: Histogram::new(3)?, between: Histogram::new(3)?, most_chunks: 0 };
        for (committed, mut published) in transactions {
            published.sort_unstable();
            gaps.most_chunks = gaps.most_chunks.max(published.len());
            gaps.first.record((published[0] - committed).max(0) as u64)?;
            for pair in published.windows(2) {
                gaps.between.record((pair[1] - pair[0]).max(0) as u64)?;
            }
        }
        Ok(gaps)
    }
}

impl Drop for Commits {
    fn drop(&mut self) {
        self.task.abort();
    }
}
