//! A send's webhook events (`message.completed`, `message.recalled`,
//! `message.failed`), queued at least once whatever fails after the change
//! they report. What a webhook job is and who wants it is
//! [`crate::webhooks`]'s.
//!
//! The transactional outbox: when some endpoint asked for the event, the
//! change's transaction also records it ([`Outboxed::record`], into the
//! shard's `webhook_outbox`). Right after the commit the process that made
//! the change queues it for the endpoints of the send's client and deletes
//! the record ([`Outboxed::queue`]). If that publish fails, or the process
//! dies first, the record is still there when it falls due
//! (`webhooks.outbox_retry_ms` after the change), and a worker's relay
//! ([`relay_once`]) queues it. Every `webhook-id` of an event derives from
//! its recorded key and the endpoint's url, so an event queued twice (both
//! ways) reaches an endpoint twice under one id, which receivers dedupe.
//! The payload is the send as it is when the event is queued, stamped with
//! the time of the change.

use std::time::Duration;

use sqlx::MySqlPool;
use tracing::{info, warn};

use super::get;
use crate::context::Context;
use crate::webhooks::{Job, anyone_wants, endpoints_for, outbox_webhook_id, payload};
use notify_domain::domain::MessageId;
use notify_domain::error::{Error, Result};
use notify_domain::settings::WebhookEvent;
use notify_store::db::webhook_outbox::{self, OutboxEvent, Record};

/// Events the relay takes from one shard at a time.
const RELAY_BATCH: u32 = 100;

/// A send's event recorded (or about to be) in the outbox with its change.
#[derive(Debug)]
pub(crate) struct Outboxed(OutboxEvent);

impl Outboxed {
    /// The event about `message_id`, when some endpoint of any client asked
    /// for it (the send's client is checked when it is queued); `None`, and
    /// nothing is recorded, otherwise.
    pub(crate) fn new(
        ctx: &Context,
        message_id: MessageId,
        event: WebhookEvent,
        chunk_id: Option<u64>,
    ) -> Option<Self> {
        anyone_wants(&ctx.settings, event)
            .then(|| Self(OutboxEvent::new(message_id.get(), event.name(), chunk_id)))
    }

    /// What the change's transaction writes: the event, due for the relay
    /// once its own process had `webhooks.outbox_retry_ms` to queue it.
    pub(crate) fn record(&self, ctx: &Context) -> Record<'_> {
        Record { event: &self.0, due_in_ms: ctx.settings.webhooks.outbox_retry_ms }
    }

    /// After the change committed: queues the event and deletes its record
    /// on `pool` (the shard of the change). Never fails the caller: an event
    /// not queued is counted (`notify_webhooks_unqueued_total`) and left to
    /// the relay.
    pub(crate) async fn queue(self, ctx: &Context, pool: &MySqlPool) {
        queue_and_forget(ctx, pool, &self.0).await;
    }
}

/// What a change's transaction writes for `event`, if there is one.
pub(crate) fn record_of<'a>(ctx: &Context, event: &'a Option<Outboxed>) -> Option<Record<'a>> {
    event.as_ref().map(|event| event.record(ctx))
}

/// Queues `event`, then deletes its record; returns true when it is gone
/// from the outbox (queued, or never to be: its send or every endpoint for
/// it left).
async fn queue_and_forget(ctx: &Context, pool: &MySqlPool, event: &OutboxEvent) -> bool {
    let name = event.event.as_str();
    if let Err(e) = queue_event(ctx, event).await {
        warn!(error = %e, message_id = event.message_id, event = name, "could not queue a webhook, the relay will");
        metrics::counter!("notify_webhooks_unqueued_total", "event" => name.to_owned())
            .increment(1);
        return false;
    }
    if let Err(e) = webhook_outbox::remove(pool, &event.event_key).await {
        // Queued: the relay queues it again under the same ids.
        warn!(error = %e, message_id = event.message_id, event = name, "could not delete a queued webhook's record");
        return false;
    }
    true
}

/// Queues one job per endpoint of the send's client that asked for the
/// event. `Ok` also when there is nothing to queue: the send is gone
/// (retention) or its client has no such endpoint any more.
async fn queue_event(ctx: &Context, event: &OutboxEvent) -> Result<()> {
    let Some(kind) = WebhookEvent::parse(&event.event) else {
        warn!(event = %event.event, "dropping an outbox event of an unknown type");
        return Ok(());
    };
    let message_id = MessageId::from_raw(event.message_id);
    let view = match get(ctx, message_id, None).await {
        Ok(view) => view,
        Err(Error::NotFound(_)) => {
            info!(message_id = %message_id, event = kind.name(), "dropping a webhook of a deleted send");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let client = view.row.client.as_str();
    let urls = endpoints_for(&ctx.settings, client, kind);
    if urls.is_empty() {
        return Ok(());
    }
    let status = view.row.status().map(|s| s.name()).unwrap_or("unknown");
    let p = view.progress.unwrap_or_default();
    let mut data = serde_json::json!({
        "message_id": message_id.get().to_string(),
        "sender": view.row.sender,
        "status": status,
        "progress": {
            "total": p.total, "delivered": p.delivered, "failed": p.failed, "read": p.read,
            "pending": p.pending, "cancelled": p.cancelled, "suppressed": p.suppressed,
            "recalled": p.recalled,
        },
    });
    if let (Some(chunk_id), Some(fields)) = (event.chunk_id, data.as_object_mut()) {
        fields.insert("chunk_id".into(), chunk_id.to_string().into());
    }
    let payload = payload(kind, data, event.created());
    for url in urls {
        let job = Job {
            id: outbox_webhook_id(&event.event_key, url),
            client: client.to_owned(),
            url: url.to_owned(),
            event: kind.name().to_owned(),
            attempt: 1,
            payload: payload.clone(),
        };
        ctx.publisher.publish_webhook(&job).await?;
    }
    Ok(())
}

/// The relay (a worker's periodic job): queues every event on every shard
/// whose own process did not within `webhooks.outbox_retry_ms`, a batch
/// at a time, each taken under a lease of that long so that two workers do
/// not queue it at once. A shard that does not answer is passed over until
/// the next run. Returns how many it queued.
pub async fn relay_once(ctx: &Context) -> Result<u64> {
    let lease = ctx.settings.webhooks.outbox_retry_ms;
    let limit = Duration::from_secs(ctx.settings.worker.operation_timeout_secs);
    let mut relayed = 0;
    for (shard, pool) in ctx.pools.iter() {
        let claimed =
            tokio::time::timeout(limit, webhook_outbox::claim_due(pool, lease, RELAY_BATCH)).await;
        let due = match claimed {
            Ok(Ok(due)) => due,
            Ok(Err(e)) => {
                warn!(error = %e, shard = %shard, "webhook relay cannot read this shard");
                continue;
            }
            Err(_) => {
                warn!(shard = %shard, "webhook relay gave up on a shard that does not answer");
                continue;
            }
        };
        for event in due {
            let queued = tokio::time::timeout(limit, queue_and_forget(ctx, pool, &event)).await;
            if queued == Ok(true) {
                info!(
                    message_id = event.message_id,
                    event = %event.event,
                    attempts = event.attempts + 1,
                    "relayed a webhook its own process did not queue"
                );
                metrics::counter!("notify_webhooks_relayed_total").increment(1);
                relayed += 1;
            }
        }
    }
    Ok(relayed)
}
