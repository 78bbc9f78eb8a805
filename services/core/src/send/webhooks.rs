//! A send's webhook events (`message.completed`, `message.recalled`,
//! `message.failed`): queued for the endpoints of the send's client that
//! asked for them, with the send's id, sender, status and progress. What a
//! webhook job is and who wants it is [`crate::webhooks`]'s.

use tracing::warn;

use super::get;
use crate::context::Context;
use crate::webhooks::{Job, anyone_wants, endpoints_for, new_webhook_id, payload};
use notify_domain::domain::MessageId;
use notify_domain::settings::WebhookEvent;

/// Queues `event` for every endpoint of `client` that asked for it. Never
/// fails the caller: a publish that fails is logged and counted
/// (`notify_webhooks_unqueued_total`).
async fn emit(ctx: &Context, client: &str, event: WebhookEvent, data: serde_json::Value) {
    let urls = endpoints_for(&ctx.settings, client, event);
    if urls.is_empty() {
        return;
    }
    let payload = payload(event, data);
    for url in urls {
        let job = Job {
            id: new_webhook_id(),
            client: client.to_owned(),
            url: url.to_owned(),
            event: event.name().to_owned(),
            attempt: 1,
            payload: payload.clone(),
        };
        if let Err(e) = ctx.publisher.publish_webhook(&job).await {
            warn!(error = %e, client, event = event.name(), "could not queue a webhook");
            metrics::counter!("notify_webhooks_unqueued_total", "event" => event.name())
                .increment(1);
        }
    }
}

/// Queues `event` about a send for its client's endpoints: the send's id,
/// sender, status and progress, plus `extra` fields. Reads the send only
/// when some endpoint asked for the event.
pub(crate) async fn emit_for_send(
    ctx: &Context,
    message_id: MessageId,
    event: WebhookEvent,
    extra: serde_json::Map<String, serde_json::Value>,
) {
    if !anyone_wants(&ctx.settings, event) {
        return;
    }
    let view = match get(ctx, message_id, None).await {
        Ok(view) => view,
        Err(e) => {
            warn!(error = %e, message_id = %message_id, event = event.name(), "could not read a send for its webhook");
            metrics::counter!("notify_webhooks_unqueued_total", "event" => event.name())
                .increment(1);
            return;
        }
    };
    if endpoints_for(&ctx.settings, &view.row.client, event).is_empty() {
        return;
    }
    let status = view.row.status().map(|s| s.name()).unwrap_or("unknown");
    let p = &view.progress;
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
    if let Some(fields) = data.as_object_mut() {
        fields.extend(extra);
    }
    emit(ctx, &view.row.client, event, data).await;
}
