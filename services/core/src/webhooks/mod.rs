//! Webhooks: events of a client's own sends, queued in RabbitMQ for the
//! dispatcher in `notify-worker` to POST to the client's endpoints, signed
//! as Standard Webhooks says (see `docs/webhooks.md`).
//!
//! This module is what every side shares: the [`Job`] the queues carry, its
//! payload, which endpoints want an event, the queues ([`topology`]) and the
//! signature ([`sign`]). It names no other module of the crate, so the
//! publisher ([`crate::queue`]) builds on it; the events are queued above
//! the publisher, a send's by `send::webhooks` and `item.read` in
//! batches by [`crate::inbox::read_feed`].
//!
//! An event is queued once per endpoint that asked for it, as a [`Job`]
//! carrying its final payload and `webhook-id`, so every retry sends the
//! same bytes under the same id (receivers dedupe on it). A client without
//! an endpoint for an event costs nothing: no payload is built, nothing is
//! published. A send's events are recorded with the change they report and
//! queued after its commit, by the process that made it or else by a
//! worker's relay (`send::webhooks`), so a failed publish delays them and
//! loses none; so are reads, in a feed of their own that the workers
//! queue in batches.

pub mod sign;
pub mod topology;

use serde::{Deserialize, Serialize};

use notify_domain::error::{Error, Result};
use notify_domain::settings::{Settings, WebhookEvent};

pub use topology::WebhookTopology;

/// One event on its way to one endpoint: what the queues carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// The `webhook-id`: the same on every attempt.
    pub id: String,
    /// The client whose send it is about (and whose endpoint it goes to).
    pub client: String,
    /// The endpoint's url; a job whose endpoint left the config is dropped.
    pub url: String,
    /// The event's `type`.
    #[serde(rename = "type")]
    pub event: String,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// The JSON body, exactly as signed and sent.
    pub payload: String,
}

impl Job {
    /// Encodes the job as a queue message body.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a queue message body.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes)
            .map_err(|e| Error::Internal(format!("malformed webhook job: {e}")))
    }
}

/// The urls of `client`'s endpoints that asked for `event`.
pub fn endpoints_for<'a>(
    settings: &'a Settings,
    client: &str,
    event: WebhookEvent,
) -> Vec<&'a str> {
    settings
        .auth
        .clients
        .iter()
        .filter(|c| c.name == client)
        .flat_map(|c| c.webhooks.iter())
        .filter(|endpoint| endpoint.wants(event))
        .map(|endpoint| endpoint.url.as_str())
        .collect()
}

/// Returns true when some client's endpoint asked for `event`.
pub fn anyone_wants(settings: &Settings, event: WebhookEvent) -> bool {
    settings.auth.clients.iter().flat_map(|c| c.webhooks.iter()).any(|e| e.wants(event))
}

/// A fresh `webhook-id`: `msg_` and 128 random bits in hex.
pub fn new_webhook_id() -> String {
    format!("msg_{:032x}", rand::random::<u128>())
}

/// The `webhook-id` of an event recorded in the outbox, for one endpoint:
/// `msg_` and the first 128 bits of SHA-256 over the event's key and the
/// url in hex. The same however often the event is queued; another for
/// each endpoint (so that no receiver can match another's ids).
pub fn outbox_webhook_id(event_key: &[u8], url: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new().chain_update(event_key).chain_update(url.as_bytes()).finalize();
    let mut id = String::with_capacity(36);
    id.push_str("msg_");
    for byte in &digest[..16] {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

/// Builds the Standard Webhooks payload: `type`, `timestamp` (`at`, when
/// the event happened) and `data`.
pub fn payload(
    event: WebhookEvent,
    data: serde_json::Value,
    at: chrono::DateTime<chrono::Utc>,
) -> String {
    let timestamp = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    serde_json::json!({ "type": event.name(), "timestamp": timestamp, "data": data }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_event_has_one_id_per_endpoint_however_often_it_is_queued() {
        let key = [7u8; 16];
        let id = outbox_webhook_id(&key, "https://a.example/h");
        assert_eq!(id, outbox_webhook_id(&key, "https://a.example/h"));
        assert_ne!(id, outbox_webhook_id(&key, "https://b.example/h"));
        assert_ne!(id, outbox_webhook_id(&[8u8; 16], "https://a.example/h"));
        assert_eq!(id.len(), 4 + 32);
        assert!(id.starts_with("msg_"));
        assert!(id[4..].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }
}
