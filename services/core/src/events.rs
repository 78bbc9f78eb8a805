//! Change events for the gateway stream (`notify.v1.EventService`).
//!
//! Whatever changes what an online user sees publishes one small event to the
//! `{prefix}.events` fanout exchange: the worker one per applied chunk (the
//! chunk's user ids, never one event per user), the api one per mark-read,
//! group message, membership change, announcement start or cancel. Every api
//! replica with subscribers consumes them through its own exclusive queue and
//! routes them to the streams that hold the users (see the api's `events`
//! module).
//!
//! Events are hints on top of the stored truth: a stream's snapshot reads
//! MySQL and Redis, and an event only says "this changed". Publishing is
//! best-effort where the change is already committed (a lost event is made
//! up by the fresh snapshots every replica sends after its event consumer
//! reconnects), except for deliveries: the worker publishes before it acks
//! the chunk, so a failed publish redelivers the chunk and publishes again.

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::context::Context;
use notify_domain::error::{Error, Result};
use notify_store::db::chunks::ContentSummary;

/// One change, as carried on the bus (JSON, short field names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t")]
pub enum BusEvent {
    /// A chunk's items were written: one item of `message_id` per user.
    #[serde(rename = "items")]
    ItemsDelivered {
        /// The send.
        #[serde(rename = "m")]
        message_id: u64,
        /// The chunk's recipients.
        #[serde(rename = "u")]
        user_ids: Vec<u64>,
        /// What the gateway shows.
        #[serde(rename = "c")]
        summary: ContentSummary,
        /// When the chunk's transaction committed, ms since the epoch (unset
        /// when a redelivery publishes it again).
        #[serde(rename = "k", default, skip_serializing_if = "Option::is_none")]
        committed_at_ms: Option<i64>,
    },
    /// These users' badges changed (mark-read, mark-all-read, group ack).
    #[serde(rename = "badges")]
    BadgesChanged {
        /// The users.
        #[serde(rename = "u")]
        user_ids: Vec<u64>,
    },
    /// A message was sent to a group.
    #[serde(rename = "group")]
    GroupMessage {
        /// The group.
        #[serde(rename = "g")]
        group_id: u64,
        /// Its seq in the group.
        #[serde(rename = "s")]
        seq: u64,
        /// The message.
        #[serde(rename = "m")]
        message_id: u64,
    },
    /// Members joined or left a group.
    #[serde(rename = "members")]
    MembersChanged {
        /// The group.
        #[serde(rename = "g")]
        group_id: u64,
        /// Users who joined.
        #[serde(rename = "a", default)]
        added: Vec<u64>,
        /// Users who left.
        #[serde(rename = "r", default)]
        removed: Vec<u64>,
    },
    /// An announcement went live: every user has a new item.
    #[serde(rename = "announced")]
    Announced {
        /// The announcement.
        #[serde(rename = "m")]
        message_id: u64,
        /// What the gateway shows.
        #[serde(rename = "c")]
        summary: ContentSummary,
    },
    /// A send's items were withdrawn (an announcement was cancelled).
    #[serde(rename = "revoked")]
    Revoked {
        /// The send.
        #[serde(rename = "m")]
        message_id: u64,
    },
}

impl BusEvent {
    /// The event's kind, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ItemsDelivered { .. } => "items",
            Self::BadgesChanged { .. } => "badges",
            Self::GroupMessage { .. } => "group",
            Self::MembersChanged { .. } => "members",
            Self::Announced { .. } => "announced",
            Self::Revoked { .. } => "revoked",
        }
    }

    /// Encodes the event body.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes an event body.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| Error::Internal(format!("malformed event: {e}")))
    }
}

/// Publishes `event`, waiting for the broker's confirm.
pub async fn publish(ctx: &Context, event: &BusEvent) -> Result<()> {
    ctx.publisher.publish_event(event.kind(), &event.encode()).await
}

/// Publishes an event about a change that is already committed. A failure is
/// logged and counted, never returned: the caller's change stands, and
/// subscribed gateways get fresh snapshots when the bus comes back.
pub async fn publish_best_effort(ctx: &Context, event: &BusEvent) {
    if let Err(e) = publish(ctx, event).await {
        metrics::counter!("notify_event_publish_errors_total", "kind" => event.kind()).increment(1);
        warn!(error = %e, kind = event.kind(), "could not publish a change event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_with_short_names() {
        let event = BusEvent::ItemsDelivered {
            message_id: 7,
            user_ids: vec![1, 2],
            summary: ContentSummary {
                title: "hi".to_owned(),
                category: "promo".to_owned(),
                created_at_ms: 1_700_000_000_000,
                expire_at_ms: None,
            },
            committed_at_ms: Some(1_700_000_000_001),
        };
        let bytes = event.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with(r#"{"t":"items","m":7,"u":[1,2]"#), "{text}");
        assert_eq!(BusEvent::decode(&bytes).unwrap(), event);
        let members = BusEvent::decode(br#"{"t":"members","g":3,"a":[4]}"#).unwrap();
        assert_eq!(
            members,
            BusEvent::MembersChanged { group_id: 3, added: vec![4], removed: vec![] }
        );
        assert!(BusEvent::decode(b"{}").is_err());
    }
}
