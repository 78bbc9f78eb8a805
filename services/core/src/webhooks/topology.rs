//! The webhook queues, apart from the chunk queues so that no endpoint can
//! hold up a delivery (names under `rabbitmq.prefix`):
//!
//! - `{p}.webhooks` topic exchange. A new job goes out as `new.{client}`.
//! - `{p}.webhooks.c.{client}`: one durable queue per client with an
//!   endpoint, bound with `*.{client}`, consumed by the dispatcher with the
//!   client's own prefetch, so a slow client fills only its own queue.
//! - `{p}.webhooks.retry` topic exchange -> `{p}.webhooks.retry.{ms}ms`, one
//!   classic queue per delay of `webhooks.retry_delays_ms`, bound with
//!   `r{ms}.#`, with `x-message-ttl` of that delay and dead-lettering to
//!   `{p}.webhooks`: a job retried after `ms` is published as
//!   `r{ms}.{client}`, waits out the TTL (every message of one queue has the
//!   same TTL, so the head always expires first) and comes back to its
//!   client's queue under the same routing key. The delay is in the name, so
//!   changing the delays declares new queues instead of clashing with old
//!   arguments.
//! - `{p}.webhooks.dead`: jobs that failed their last attempt, kept for
//!   inspection.

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

use notify_domain::error::Result;
use notify_domain::settings::Settings;

use crate::broker::broker_error;

/// Names and arguments of the webhook exchanges and queues.
#[derive(Debug, Clone)]
pub struct WebhookTopology {
    prefix: String,
    queue_type: String,
    clients: Vec<String>,
    delays_ms: Vec<u64>,
}

impl WebhookTopology {
    /// Builds the names for the clients of `settings` that have endpoints.
    pub fn new(settings: &Settings) -> Self {
        let mut delays_ms = settings.webhooks.retry_delays_ms.clone();
        delays_ms.sort_unstable();
        delays_ms.dedup();
        Self {
            prefix: settings.rabbitmq.prefix.clone(),
            queue_type: settings.rabbitmq.queue_type.clone(),
            clients: settings
                .auth
                .clients
                .iter()
                .filter(|client| !client.webhooks.is_empty())
                .map(|client| client.name.clone())
                .collect(),
            delays_ms,
        }
    }

    /// The clients that have a queue.
    pub fn clients(&self) -> &[String] {
        &self.clients
    }

    /// The exchange new and retried jobs reach their client's queue by.
    pub fn exchange(&self) -> String {
        format!("{}.webhooks", self.prefix)
    }

    /// The routing key of a new job.
    pub fn new_key(client: &str) -> String {
        format!("new.{client}")
    }

    /// A client's queue.
    pub fn queue(&self, client: &str) -> String {
        format!("{}.webhooks.c.{client}", self.prefix)
    }

    /// The exchange retried jobs wait behind.
    pub fn retry_exchange(&self) -> String {
        format!("{}.webhooks.retry", self.prefix)
    }

    /// The routing key of a job retried after `delay_ms`.
    pub fn retry_key(delay_ms: u64, client: &str) -> String {
        format!("r{delay_ms}.{client}")
    }

    /// The queue where jobs wait `delay_ms`.
    pub fn retry_queue(&self, delay_ms: u64) -> String {
        format!("{}.webhooks.retry.{delay_ms}ms", self.prefix)
    }

    /// The queue of jobs that failed their last attempt.
    pub fn dead_queue(&self) -> String {
        format!("{}.webhooks.dead", self.prefix)
    }

    /// Declares every webhook exchange and queue (idempotent).
    pub async fn declare(&self, channel: &Channel) -> Result<()> {
        let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
        for exchange in [self.exchange(), self.retry_exchange()] {
            channel
                .exchange_declare(
                    exchange.into(),
                    ExchangeKind::Topic,
                    durable,
                    FieldTable::default(),
                )
                .await
                .map_err(broker_error)?;
        }
        let queue_options = QueueDeclareOptions { durable: true, ..Default::default() };
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), AMQPValue::LongString(self.queue_type.as_str().into()));
        channel
            .queue_declare(self.dead_queue().into(), queue_options, args.clone())
            .await
            .map_err(broker_error)?;
        for client in &self.clients {
            let queue = self.queue(client);
            channel
                .queue_declare(queue.as_str().into(), queue_options, args.clone())
                .await
                .map_err(broker_error)?;
            channel
                .queue_bind(
                    queue.into(),
                    self.exchange().into(),
                    format!("*.{client}").into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(broker_error)?;
        }
        for delay in &self.delays_ms {
            // Classic: expiry and dead-lettering by TTL is what they do best.
            let mut args = FieldTable::default();
            args.insert("x-queue-type".into(), AMQPValue::LongString("classic".into()));
            args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(*delay as i64));
            args.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString(self.exchange().as_str().into()),
            );
            let queue = self.retry_queue(*delay);
            channel
                .queue_declare(queue.as_str().into(), queue_options, args)
                .await
                .map_err(broker_error)?;
            channel
                .queue_bind(
                    queue.into(),
                    self.retry_exchange().into(),
                    format!("r{delay}.#").into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(broker_error)?;
        }
        Ok(())
    }

    /// Deletes every webhook exchange and queue. Used by tests to clean up.
    pub async fn delete(&self, channel: &Channel) -> Result<()> {
        let queues = self
            .clients
            .iter()
            .map(|client| self.queue(client))
            .chain(self.delays_ms.iter().map(|delay| self.retry_queue(*delay)))
            .chain([self.dead_queue()]);
        for queue in queues {
            channel
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await
                .map_err(broker_error)?;
        }
        for exchange in [self.exchange(), self.retry_exchange()] {
            channel
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                .await
                .map_err(broker_error)?;
        }
        Ok(())
    }
}
