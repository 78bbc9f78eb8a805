//! `item.read`, batched: the read path only hands `(message, user)` pairs
//! to a bounded channel ([`ReadSink::record`], a `try_send` per item that
//! changed to read: no I/O, no lock held across an await, no wait), and one
//! task per process gathers them by message and queues one `item.read` job
//! per endpoint for every `webhooks.read_batch_users` readers of a message,
//! or for whatever a message gathered within `webhooks.read_flush_ms`.
//!
//! The trade: reads are cheap and never wait on RabbitMQ, but a process
//! that dies loses the reads it had not queued yet (at most one flush
//! interval's; a graceful shutdown queues them, [`ReadSink::drain`]), and a
//! full buffer drops reads (counted in
//! `notify_webhooks_reads_dropped_total`). Once queued, a batch is
//! delivered at least once like every webhook. Only reads of listed ids
//! (`MarkRead`, `UpdateItems` with ids) are reported: a filtered
//! "mark all read" does not know which messages it changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::queue::Publisher;
use crate::webhooks::{Job, anyone_wants, endpoints_for, new_webhook_id, payload};
use notify_domain::domain::MessageId;
use notify_domain::settings::{Settings, WebhookEvent};
use notify_store::db::{ShardPools, messages};

/// Messages whose owner is remembered at most; then the memory starts over.
const OWNERS_REMEMBERED: usize = 10_000;

/// Longest a process waits at shutdown for its gathered reads to be queued.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the read path drops reads for `item.read`.
#[derive(Debug, Clone)]
pub struct ReadSink {
    sender: mpsc::Sender<(u64, u64)>,
    stop: CancellationToken,
    batcher: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl ReadSink {
    /// Starts the batching task when some endpoint asked for `item.read`;
    /// `None` (and reads cost nothing) otherwise.
    pub fn spawn(
        settings: Arc<Settings>,
        pools: ShardPools,
        publisher: Arc<Publisher>,
    ) -> Option<Self> {
        if !anyone_wants(&settings, WebhookEvent::ItemRead) {
            return None;
        }
        let (sender, receiver) = mpsc::channel(settings.webhooks.read_buffer);
        let batcher = Batcher { settings, pools, publisher, owners: HashMap::new() };
        let stop = CancellationToken::new();
        let task = tokio::spawn(batcher.run(receiver, stop.clone()));
        Some(Self { sender, stop, batcher: Arc::new(Mutex::new(Some(task))) })
    }

    /// At shutdown, once no call records reads any more: queues what was
    /// gathered (within a few seconds) and stops the batching task.
    pub async fn drain(&self) {
        self.stop.cancel();
        let task = self.batcher.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task
            && tokio::time::timeout(DRAIN_TIMEOUT, task).await.is_err()
        {
            warn!("gathered item.read batches were not all queued before shutdown");
        }
    }

    /// Records that `user_id` read `message_ids`. Never waits.
    pub fn record(&self, user_id: u64, message_ids: &[u64]) {
        for message_id in message_ids {
            if self.sender.try_send((*message_id, user_id)).is_err() {
                metrics::counter!("notify_webhooks_reads_dropped_total").increment(1);
            }
        }
    }
}

struct Batcher {
    settings: Arc<Settings>,
    pools: ShardPools,
    publisher: Arc<Publisher>,
    /// Each message's client, or `None` for one no endpoint wants reads of.
    owners: HashMap<u64, Option<String>>,
}

impl Batcher {
    async fn run(mut self, mut receiver: mpsc::Receiver<(u64, u64)>, stop: CancellationToken) {
        let batch = self.settings.webhooks.read_batch_users;
        let mut ticks =
            tokio::time::interval(Duration::from_millis(self.settings.webhooks.read_flush_ms));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pending: HashMap<u64, Vec<u64>> = HashMap::new();
        loop {
            tokio::select! {
                read = receiver.recv() => {
                    let Some((message_id, user_id)) = read else { break };
                    let users = pending.entry(message_id).or_default();
                    users.push(user_id);
                    if users.len() >= batch {
                        let users = pending.remove(&message_id).unwrap_or_default();
                        self.flush(message_id, users).await;
                    }
                }
                _ = ticks.tick() => {
                    for (message_id, users) in std::mem::take(&mut pending) {
                        self.flush(message_id, users).await;
                    }
                }
                () = stop.cancelled() => {
                    while let Ok((message_id, user_id)) = receiver.try_recv() {
                        pending.entry(message_id).or_default().push(user_id);
                    }
                    break;
                }
            }
        }
        for (message_id, users) in pending {
            self.flush(message_id, users).await;
        }
    }

    /// Queues one `item.read` job per endpoint of the message's client
    /// that asked for it, with the readers (deduplicated).
    async fn flush(&mut self, message_id: u64, mut users: Vec<u64>) {
        let Some(client) = self.owner(message_id).await else { return };
        users.sort_unstable();
        users.dedup();
        let urls = endpoints_for(&self.settings, &client, WebhookEvent::ItemRead);
        let data = serde_json::json!({
            "message_id": message_id.to_string(),
            "user_ids": users.iter().map(u64::to_string).collect::<Vec<_>>(),
        });
        let body = payload(WebhookEvent::ItemRead, data, chrono::Utc::now());
        for url in urls {
            let job = Job {
                id: new_webhook_id(),
                client: client.clone(),
                url: url.to_owned(),
                event: WebhookEvent::ItemRead.name().to_owned(),
                attempt: 1,
                payload: body.clone(),
            };
            if let Err(e) = self.publisher.publish_webhook(&job).await {
                warn!(error = %e, message_id, users = users.len(), "could not queue item.read");
                metrics::counter!("notify_webhooks_unqueued_total", "event" => "item.read")
                    .increment(1);
            }
        }
    }

    /// The client of a message when one of its endpoints wants reads.
    async fn owner(&mut self, message_id: u64) -> Option<String> {
        if let Some(owner) = self.owners.get(&message_id) {
            return owner.clone();
        }
        let home = self.pools.for_message(message_id);
        let row = match messages::fetch(&*home, MessageId::from_raw(message_id)).await {
            Ok(row) => row,
            Err(e) => {
                warn!(error = %e, message_id, "could not read the owner of a read message");
                return None;
            }
        };
        drop(home);
        let owner = row.map(|row| row.client).filter(|client| {
            !endpoints_for(&self.settings, client, WebhookEvent::ItemRead).is_empty()
        });
        if self.owners.len() >= OWNERS_REMEMBERED {
            self.owners.clear();
        }
        self.owners.insert(message_id, owner.clone());
        owner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read path's part: a full buffer drops reads instead of waiting.
    #[tokio::test]
    async fn recording_never_waits_and_drops_what_does_not_fit() {
        let (sender, mut receiver) = mpsc::channel(2);
        let sink = ReadSink {
            sender,
            stop: CancellationToken::new(),
            batcher: Arc::new(Mutex::new(None)),
        };
        sink.record(42, &[7, 8, 9, 10]);
        assert_eq!(receiver.recv().await, Some((7, 42)));
        assert_eq!(receiver.recv().await, Some((8, 42)));
        assert!(receiver.try_recv().is_err(), "9 and 10 were dropped, not queued");
    }
}
