//! RabbitMQ: the chunk-task topology, the task format, and a publisher that
//! waits for broker confirms and reconnects after a broker restart.
//!
//! Topology (names under `rabbitmq.prefix`):
//! - `{p}.chunks` direct exchange; routing keys `{lane}.s{shard}`.
//! - `{p}.chunks.{lane}.s{shard}` (lanes `high` and `bulk`, one queue per
//!   shard of the map): durable queues (quorum by default, so they survive a
//!   broker restart and cap redeliveries of poison tasks), dead-lettering to
//!   `{p}.chunks.dlx`. One queue per shard keeps one slow or unreachable
//!   shard's chunks from taking the consumer slots the other shards' chunks
//!   need: workers consume each shard's queue with its own concurrency.
//! - `{p}.chunks.dlx` fanout exchange -> `{p}.chunks.dead`: tasks that failed
//!   their last attempt or were redelivered too often, kept for inspection.
//! - the webhook exchanges and queues: [`crate::webhooks::topology`].

use std::collections::VecDeque;
use std::time::Duration;

use lapin::options::{
    BasicAckOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::tcp::{AMQPUriTcpExt, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldTable};

use lapin::{
    Acker, BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
    PublisherConfirm,
};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::broker::broker_error;
use notify_domain::domain::Lane;
use notify_domain::error::{Error, Result};
use notify_domain::settings::{RabbitSettings, Settings};

/// Longest wait for anything asked of the broker: a connection, a channel
/// step, a frame written (a publish, an ack) or a confirm.
const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// Header of an event: when it was published, ms since the epoch.
pub const PUBLISHED_AT_HEADER: &str = "x-published-ms";

/// Redeliveries after which a quorum queue dead-letters a task. Guards against
/// a task that kills every worker that takes it.
const DELIVERY_LIMIT: i64 = 20;

/// One chunk to apply: small, so a million-recipient send is 2,000 tiny tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkTask {
    /// The send.
    #[serde(rename = "m")]
    pub message_id: u64,
    /// The chunk within the send.
    #[serde(rename = "c")]
    pub chunk_id: u64,
    /// Shard that stores the chunk.
    #[serde(rename = "s")]
    pub shard: u32,
    /// What to do with it: deliver (the default, left out of the body) or
    /// recall.
    #[serde(rename = "k", default, skip_serializing_if = "TaskKind::is_deliver")]
    pub kind: TaskKind,
    /// A recall task published by the recall itself once every cached
    /// badge and page was retired and every gateway told: the chunk's
    /// recipients' badges already leave its items out (their content copy
    /// is revoked), so taking the items back needs no invalidation and no
    /// event. Left out when false (the sweeper's tasks, and deliveries); a
    /// worker that does not know it invalidates, which is only redundant.
    #[serde(rename = "b", default, skip_serializing_if = "std::ops::Not::not")]
    pub badges_retired: bool,
}

/// What a [`ChunkTask`] asks of a worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskKind {
    /// Write the chunk's items.
    #[default]
    #[serde(rename = "d")]
    Deliver,
    /// Take the chunk's items back (a recalled send).
    #[serde(rename = "r")]
    Recall,
}

impl TaskKind {
    fn is_deliver(&self) -> bool {
        *self == TaskKind::Deliver
    }
}

impl ChunkTask {
    /// A task to deliver a chunk.
    pub fn deliver(message_id: u64, chunk_id: u64, shard: u32) -> Self {
        Self { message_id, chunk_id, shard, kind: TaskKind::Deliver, badges_retired: false }
    }

    /// A task to take a delivered chunk's items back; `badges_retired` as
    /// the field says.
    pub fn recall(message_id: u64, chunk_id: u64, shard: u32, badges_retired: bool) -> Self {
        Self { message_id, chunk_id, shard, kind: TaskKind::Recall, badges_retired }
    }

    /// Encodes the task body.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a task body.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes)
            .map_err(|e| Error::Internal(format!("malformed chunk task: {e}")))
    }
}

/// Names of the exchanges and queues under a prefix.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    queue_type: String,
    shards: Vec<u32>,
    webhooks: crate::webhooks::WebhookTopology,
}

impl Topology {
    /// Builds the names for `settings.rabbitmq.prefix` and the shards of
    /// `settings.database`.
    pub fn new(settings: &Settings) -> Self {
        Self {
            prefix: settings.rabbitmq.prefix.clone(),
            queue_type: settings.rabbitmq.queue_type.clone(),
            shards: settings.database.shards.iter().map(|shard| shard.id.0).collect(),
            webhooks: crate::webhooks::WebhookTopology::new(settings),
        }
    }

    /// The webhook exchanges and queues.
    pub fn webhooks(&self) -> &crate::webhooks::WebhookTopology {
        &self.webhooks
    }

    /// The shards that have task queues.
    pub fn shards(&self) -> &[u32] {
        &self.shards
    }

    /// The direct exchange tasks are published to.
    pub fn exchange(&self) -> String {
        format!("{}.chunks", self.prefix)
    }

    /// The routing key of a lane's tasks for one shard.
    pub fn routing_key(lane: Lane, shard: u32) -> String {
        format!("{}.s{shard}", lane.name())
    }

    /// The queue of a lane's tasks for one shard.
    pub fn queue(&self, lane: Lane, shard: u32) -> String {
        format!("{}.chunks.{}", self.prefix, Self::routing_key(lane, shard))
    }

    /// Every task queue.
    pub fn queues(&self) -> Vec<String> {
        [Lane::High, Lane::Bulk]
            .into_iter()
            .flat_map(|lane| self.shards.iter().map(move |shard| self.queue(lane, *shard)))
            .collect()
    }

    /// The fanout exchange change events go to (see `crate::events`).
    pub fn events_exchange(&self) -> String {
        format!("{}.events", self.prefix)
    }

    /// The stream queue that keeps the change events for a while, bound to
    /// the events exchange, declared by the edge (its streams resume from
    /// it).
    pub fn events_history(&self) -> String {
        format!("{}.history", self.events_exchange())
    }

    /// The dead-letter exchange.
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.chunks.dlx", self.prefix)
    }

    /// The queue that keeps dead-lettered tasks.
    pub fn dead_queue(&self) -> String {
        format!("{}.chunks.dead", self.prefix)
    }

    /// Declares every exchange and queue (idempotent), within the broker
    /// timeout (see [`bounded`]).
    pub async fn declare(&self, channel: &Channel) -> Result<()> {
        match tokio::time::timeout(BROKER_TIMEOUT, self.declare_all(channel)).await {
            Ok(declared) => declared,
            Err(_) => Err(Error::Unavailable(format!(
                "rabbitmq: declaring the topology got no answer within {} s",
                BROKER_TIMEOUT.as_secs()
            ))),
        }
    }

    async fn declare_all(&self, channel: &Channel) -> Result<()> {
        let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
        channel
            .exchange_declare(
                self.exchange().into(),
                ExchangeKind::Direct,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(broker_error)?;
        channel
            .exchange_declare(
                self.dead_letter_exchange().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(broker_error)?;
        channel
            .exchange_declare(
                self.events_exchange().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(broker_error)?;
        let queue_options = QueueDeclareOptions { durable: true, ..Default::default() };
        let mut dead_args = FieldTable::default();
        dead_args
            .insert("x-queue-type".into(), AMQPValue::LongString(self.queue_type.as_str().into()));
        channel
            .queue_declare(self.dead_queue().into(), queue_options, dead_args)
            .await
            .map_err(broker_error)?;
        channel
            .queue_bind(
                self.dead_queue().into(),
                self.dead_letter_exchange().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(broker_error)?;
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), AMQPValue::LongString(self.queue_type.as_str().into()));
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(self.dead_letter_exchange().as_str().into()),
        );
        if self.queue_type == "quorum" {
            args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(DELIVERY_LIMIT));
        }
        for lane in [Lane::High, Lane::Bulk] {
            for shard in &self.shards {
                let queue = self.queue(lane, *shard);
                channel
                    .queue_declare(queue.as_str().into(), queue_options, args.clone())
                    .await
                    .map_err(broker_error)?;
                channel
                    .queue_bind(
                        queue.into(),
                        self.exchange().into(),
                        Self::routing_key(lane, *shard).into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(broker_error)?;
            }
        }
        self.webhooks.declare(channel).await
    }

    /// Deletes every exchange and queue. Used by tests to clean up.
    pub async fn delete(&self, channel: &Channel) -> Result<()> {
        self.webhooks.delete(channel).await?;
        for queue in self.queues().into_iter().chain([self.dead_queue(), self.events_history()]) {
            channel
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await
                .map_err(broker_error)?;
        }
        for exchange in [self.exchange(), self.dead_letter_exchange(), self.events_exchange()] {
            channel
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                .await
                .map_err(broker_error)?;
        }
        Ok(())
    }
}

/// Largest AMQP frame asked of the broker (unless the url sets `frame_max`).
/// lapin keeps a zero-filled receive and send buffer of 32 frames per
/// connection: at RabbitMQ's default of 128 KiB that is 8 MiB resident per
/// connection once written through (72 MiB of a worker's 84 MiB at rest
/// when it had one connection per lane and shard). Tasks are ~100 bytes and
/// events a few KiB; a larger message simply goes as several frames. 8 KiB
/// is the least lapin asks for (`FRAME_MIN_SIZE`): 256 KiB a buffer, and a
/// 10M fan-out's worker peaked 0.5-1 MB lower than at 16 KiB.
const FRAME_MAX: u32 = 8 * 1024;

/// Connects to the broker, naming the setting when it is unreachable.
pub async fn connect(settings: &RabbitSettings, name: &str) -> Result<Connection> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let tls = if settings.tls_ca_file.is_empty() {
        OwnedTLSConfig::default()
    } else {
        let ca = std::fs::read_to_string(&settings.tls_ca_file).map_err(|e| {
            Error::Internal(format!(
                "rabbitmq.tls_ca_file: cannot read {}: {e}",
                settings.tls_ca_file
            ))
        })?;
        OwnedTLSConfig { identity: None, cert_chain: Some(ca) }
    };
    let mut uri: lapin::uri::AMQPUri = settings
        .url
        .expose_secret()
        .parse()
        .map_err(|e| Error::Internal(format!("rabbitmq.url: cannot parse: {e}")))?;
    if uri.query.frame_max.is_none() {
        uri.query.frame_max = Some(FRAME_MAX);
    }
    let runtime = lapin::runtime::default_runtime().map_err(broker_error)?;
    let cannot = |e: &dyn std::fmt::Display| {
        Error::Unavailable(format!("rabbitmq.url: cannot connect: {e}"))
    };
    let connecting = async move {
        // The socket (and TLS) first, then the AMQP handshake over it: lapin
        // 4.12 keeps ~10 KB of every attempt whose socket it fails to open
        // itself, for the life of the process (300 refused attempts held
        // 3 MB; tests/broker_connect.rs), so a process retrying through a
        // broker outage grew with each retry. A refused connect now fails
        // before lapin holds anything; a socket lapin reopens within the
        // handshake it opens as it would have.
        let socket =
            uri.connect_with_config_async(tls.as_ref(), &runtime).await.map_err(|e| cannot(&e))?;
        let opened = std::sync::Mutex::new(Some(socket));
        let handshake = Connection::connector(
            uri,
            runtime,
            async move |uri, runtime| {
                let socket =
                    opened.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
                match socket {
                    Some(socket) => Ok(socket),
                    None => Ok(uri.connect_with_config_async(tls.as_ref(), &runtime).await?),
                }
            },
            properties,
        );
        handshake.await.map_err(|e| cannot(&e))
    };
    match tokio::time::timeout(BROKER_TIMEOUT, connecting).await {
        Ok(connected) => connected,
        Err(_) => Err(Error::Unavailable("rabbitmq.url: connect timed out".to_owned())),
    }
}

/// Waits for a publish's confirm, within the broker timeout.
async fn confirmed(confirm: PublisherConfirm) -> Result<Confirmation> {
    tokio::time::timeout(BROKER_TIMEOUT, confirm)
        .await
        .map_err(|_| Error::Unavailable("rabbitmq confirms timed out".to_owned()))?
        .map_err(broker_error)
}

/// Waits for one task's confirm and turns a return or a nack into an error.
async fn settle(lane: Lane, confirm: PublisherConfirm) -> Result<()> {
    match confirmed(confirm).await? {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(returned)) => {
            metrics::counter!("notify_tasks_returned_total", "lane" => lane.name()).increment(1);
            Err(Error::Unavailable(format!(
                "rabbitmq returned a chunk task as unroutable ({} {}): the {} lane queue of a \
                 shard is missing",
                returned.reply_code,
                returned.reply_text,
                lane.name()
            )))
        }
        Confirmation::Nack(_) => {
            Err(Error::Unavailable("rabbitmq refused a chunk task".to_owned()))
        }
    }
}

/// Runs one step of setting up a channel (open it, declare, set QoS,
/// consume) within the broker timeout: a broker that took the connection
/// and then stopped answering must fail the step, so that the caller
/// reconnects, instead of holding it (and a consumer lane) forever.
pub async fn bounded<T>(
    step: &str,
    future: impl Future<Output = std::result::Result<T, lapin::Error>>,
) -> Result<T> {
    match tokio::time::timeout(BROKER_TIMEOUT, future).await {
        Ok(done) => Ok(done.map_err(broker_error)?),
        Err(_) => Err(Error::Unavailable(format!(
            "rabbitmq: {step} got no answer within {} s",
            BROKER_TIMEOUT.as_secs()
        ))),
    }
}

/// Acknowledges a delivery within the broker timeout. An ack only waits for
/// its frame to be written, but on a connection that died without lapin
/// noticing yet, that wait has no end, and it would hold the consumer's slot
/// (and a shutdown) forever. An ack that fails or times out leaves the
/// delivery unacked: the broker gives it again once the channel closes.
pub async fn ack(acker: &Acker, options: BasicAckOptions) -> Result<()> {
    bounded("basic.ack", acker.ack(options)).await.map(drop)
}

/// Negatively acknowledges a delivery within the broker timeout, as [`ack`].
pub async fn nack(acker: &Acker, options: BasicNackOptions) -> Result<()> {
    bounded("basic.nack", acker.nack(options)).await.map(drop)
}

/// Closes `channel`, waiting at most [`BROKER_TIMEOUT`] for the broker's
/// answer, and whatever the outcome: after a network blip a channel can
/// look open while its close-ok never comes, which would hold a shutdown.
pub async fn close_channel(channel: &Channel, why: &str) {
    let _ = bounded("closing a channel", channel.close(200, why.into())).await;
}

/// Closes `connection` as [`close_channel`] closes a channel.
pub async fn close_connection(connection: &Connection, why: &str) {
    let _ = bounded("closing the connection", connection.close(200, why.into())).await;
}

/// Publishes chunk tasks as persistent messages and waits for the broker's
/// confirms, so a task counts as queued only once RabbitMQ has it on disk.
/// At most `rabbitmq.publish_window` tasks are awaiting their confirm at a
/// time: each one in flight holds its frames and its confirm in lapin, and
/// publishing all of a shard's tasks at once (~5,000 for a 10M send over
/// four shards, 50,000 for 100M) once took the api to 68.1 MB.
pub struct Publisher {
    settings: RabbitSettings,
    topology: Topology,
    window: usize,
    channel: Mutex<Option<(Connection, Channel)>>,
}

impl Publisher {
    /// Connects, declares the topology and opens a confirm-mode channel.
    pub async fn connect(settings: &Settings) -> Result<Self> {
        let publisher = Self {
            settings: settings.rabbitmq.clone(),
            topology: Topology::new(settings),
            window: settings.rabbitmq.publish_window.max(1),
            channel: Mutex::new(None),
        };
        publisher.channel().await?;
        Ok(publisher)
    }

    /// Returns how many pending chunk ids to read per query when starting
    /// or cancelling a send: four windows, so walking a send of any size
    /// holds the same few KB, and a page's last confirms (each page's
    /// publish waits for them) stall the pipe once per four windows.
    pub fn page(&self) -> u32 {
        u32::try_from(self.window.saturating_mul(4)).unwrap_or(u32::MAX)
    }

    /// Returns the topology names.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Returns true when the publisher's channel is up, reconnecting first
    /// if it was lost (a health check).
    pub async fn check(&self) -> bool {
        self.channel().await.is_ok()
    }

    async fn channel(&self) -> Result<Channel> {
        let mut guard = self.channel.lock().await;
        if let Some((connection, channel)) = guard.as_ref() {
            if connection.status().connected() && channel.status().connected() {
                return Ok(channel.clone());
            }
            warn!("rabbitmq publisher channel lost, reconnecting");
        }
        let connection = connect(&self.settings, "notify-publisher").await?;
        let channel = bounded("opening a channel", connection.create_channel()).await?;
        self.topology.declare(&channel).await?;
        bounded("confirm.select", channel.confirm_select(ConfirmSelectOptions::default())).await?;
        info!("rabbitmq publisher connected");
        *guard = Some((connection, channel.clone()));
        Ok(channel)
    }

    /// Publishes tasks to a lane and returns once every one is confirmed.
    /// On a broken connection it reconnects and retries the whole set once;
    /// a task published twice is harmless (the chunk guard makes it a no-op).
    pub async fn publish(&self, lane: Lane, tasks: &[ChunkTask]) -> Result<()> {
        if tasks.is_empty() {
            return Ok(());
        }
        self.with_one_retry("tasks", || self.publish_once(lane, tasks)).await
    }

    /// Runs a publish; when it fails, drops the channel (its connection may
    /// be broken) and runs it once more on a new one, dropping that one too
    /// when it fails again.
    async fn with_one_retry<F, Fut>(&self, what: &str, once: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        match once().await {
            Ok(()) => Ok(()),
            Err(first) => {
                warn!(error = %first, what, "publish failed, retrying on a new channel");
                self.channel.lock().await.take();
                tokio::time::sleep(Duration::from_millis(100)).await;
                let again = once().await;
                if again.is_err() {
                    // The next call must not start on a channel that just
                    // failed and may not know yet that its socket is gone.
                    self.channel.lock().await.take();
                }
                again
            }
        }
    }

    /// Publishes one change event to the events exchange (transient: it
    /// only matters to streams open now) and waits for its confirm; retries
    /// once on a new channel like [`Self::publish`].
    pub async fn publish_event(&self, kind: &'static str, body: &[u8]) -> Result<()> {
        let once = || async {
            let channel = self.channel().await?;
            // When it was published, so consumers can measure their lag.
            let mut headers = FieldTable::default();
            headers.insert(
                PUBLISHED_AT_HEADER.into(),
                AMQPValue::LongLongInt(chrono::Utc::now().timestamp_millis()),
            );
            let properties = BasicProperties::default()
                .with_content_type("application/json".into())
                .with_headers(headers);
            let publishing = channel.basic_publish(
                self.topology.events_exchange().as_str().into(),
                "".into(),
                BasicPublishOptions::default(),
                body,
                properties,
            );
            let confirm = bounded("basic.publish", publishing).await?;
            if confirmed(confirm).await?.is_ack() {
                Ok(())
            } else {
                Err(Error::Unavailable("rabbitmq refused an event".to_owned()))
            }
        };
        let published = self.with_one_retry(kind, once).await;
        if published.is_ok() {
            metrics::counter!("notify_events_published_total", "kind" => kind).increment(1);
        }
        published
    }

    /// Queues a webhook job for its client's queue as a persistent message
    /// and waits for its confirm; retries once on a new channel like
    /// [`Self::publish`] (a job queued twice reaches the endpoint twice
    /// under one `webhook-id`, which receivers dedupe on).
    pub async fn publish_webhook(&self, job: &crate::webhooks::Job) -> Result<()> {
        let exchange = self.topology.webhooks().exchange();
        let key = crate::webhooks::WebhookTopology::new_key(&job.client);
        self.publish_persistent(&exchange, &key, &job.encode()).await
    }

    /// Publishes one persistent message and waits for its confirm, retrying
    /// once on a new channel. Mandatory: a message no queue takes fails.
    pub async fn publish_persistent(&self, exchange: &str, key: &str, body: &[u8]) -> Result<()> {
        let once = || async {
            let channel = self.channel().await?;
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into());
            let publishing = channel.basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions { mandatory: true, ..Default::default() },
                body,
                properties,
            );
            let confirm = bounded("basic.publish", publishing).await?;
            match confirmed(confirm).await? {
                Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
                Confirmation::Ack(Some(_)) => Err(Error::Unavailable(format!(
                    "rabbitmq returned a message to {exchange} as unroutable ({key})"
                ))),
                Confirmation::Nack(_) => {
                    Err(Error::Unavailable("rabbitmq refused a message".to_owned()))
                }
            }
        };
        self.with_one_retry(exchange, once).await
    }

    async fn publish_once(&self, lane: Lane, tasks: &[ChunkTask]) -> Result<()> {
        let channel = self.channel().await?;
        let exchange = self.topology.exchange();
        // The publishing span's trace context: each chunk's apply becomes a
        // child of the send (or sweep) that published it.
        let mut headers = FieldTable::default();
        crate::telemetry::trace::inject_into_amqp(&mut headers);
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_headers(headers);
        // A sliding window: once `window` tasks await their confirm, the
        // oldest is awaited before the next goes out (the broker confirms
        // in publish order, so the pipe stays full).
        let mut in_flight = VecDeque::with_capacity(self.window.min(tasks.len()));
        for task in tasks {
            if in_flight.len() == self.window
                && let Some(oldest) = in_flight.pop_front()
            {
                settle(lane, oldest).await?;
            }
            let body = task.encode();
            let publishing = channel.basic_publish(
                exchange.as_str().into(),
                Topology::routing_key(lane, task.shard).into(),
                // Mandatory: a task with no queue to go to comes back
                // instead of being confirmed and dropped.
                BasicPublishOptions { mandatory: true, ..Default::default() },
                &body,
                properties.clone(),
            );
            let confirm = bounded("basic.publish", publishing).await?;
            in_flight.push_back(confirm);
        }
        for confirm in in_flight {
            settle(lane, confirm).await?;
        }
        metrics::counter!("notify_tasks_published_total", "lane" => lane.name())
            .increment(tasks.len() as u64);
        Ok(())
    }
}
