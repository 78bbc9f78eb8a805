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
//! MySQL and Redis, and an event only says "this changed". None is dropped
//! silently:
//! - the worker publishes a delivery's event before it acks the chunk, so a
//!   failed publish redelivers the chunk and publishes again;
//! - a control operation (cancel, recall, edit) publishes its events as one
//!   of its steps, which run again until they succeed ([`crate::control`]);
//! - every other change records an event in its own transaction (the event
//!   outbox, [`Recorded`]): an event that tells every gateway what to
//!   refresh. After the commit the api publishes the change's own event and
//!   forgets the record ([`publish_recorded`]); a record left (the publish
//!   failed, the api died first) is published by a worker's relay
//!   `events.outbox_retry_ms` later ([`relay_once`]); an announcement's
//!   start, whose api could not retire the cached badges (Redis away), is
//!   left to the relay, which retires them first (and relays the rest
//!   meanwhile). So a gateway hears of
//!   every change at least once; what it hears may be the recorded event
//!   (fresh badges for the users, the group's followed members) rather than
//!   the detailed one, and twice, both harmless.
//!
//! The few events left best-effort ([`publish_best_effort`]) repeat one
//! already sent (a settler's badge refresh after Redis came back).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shard_router::ShardId;
use tracing::{info, warn};

use crate::context::Context;
use notify_domain::error::{Error, Result};
use notify_store::db::event_outbox;
use notify_store::db::item_updates::Action;
use notify_store::db::items::{ItemFilter, View};

pub use notify_store::db::chunks::ContentSummary;

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
        /// For a templated content: each recipient's rendered title,
        /// aligned with `user_ids` (the summary's title is the template).
        #[serde(rename = "ts", default, skip_serializing_if = "Vec::is_empty")]
        titles: Vec<String>,
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
    /// A group message was recalled: a tombstone now, out of the members'
    /// unread counts.
    #[serde(rename = "group_recalled")]
    GroupMessageRecalled {
        /// The group.
        #[serde(rename = "g")]
        group_id: u64,
        /// Its seq in the group (kept by the tombstone).
        #[serde(rename = "s")]
        seq: u64,
        /// The message.
        #[serde(rename = "m")]
        message_id: u64,
    },
    /// Something of a group changed (a message sent or recalled): every
    /// followed member's badge is refreshed. What a group change records in
    /// its transaction, published when the detailed event was not.
    #[serde(rename = "group_changed")]
    GroupChanged {
        /// The group.
        #[serde(rename = "g")]
        group_id: u64,
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
        /// What the gateway shows (the default language's title).
        #[serde(rename = "c")]
        summary: ContentSummary,
        /// For a template with translations: the title in each of its
        /// languages, which a gateway shows the readers of that language
        /// (by their `locale`, with fallbacks).
        #[serde(rename = "lt", default, skip_serializing_if = "BTreeMap::is_empty")]
        titles: BTreeMap<String, String>,
    },
    /// A send's items were withdrawn (a recall, an announcement's cancel).
    #[serde(rename = "revoked")]
    Revoked {
        /// The send.
        #[serde(rename = "m")]
        message_id: u64,
        /// Its recipients on one shard, whose streams and badges this is
        /// about (a recall of a send retired per recipient); absent: every
        /// user's (an announcement, or a recall of a large send).
        #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
        user_ids: Option<Vec<u64>>,
    },
    /// A send's content was edited: every stream's users who have the item
    /// see the new headline.
    #[serde(rename = "edited")]
    Edited {
        /// The send.
        #[serde(rename = "m")]
        message_id: u64,
        /// The new title; empty for a templated content, whose title
        /// differs by reader.
        #[serde(rename = "ti")]
        title: String,
        /// When, ms since the epoch.
        #[serde(rename = "at")]
        edited_at_ms: i64,
    },
    /// A user changed their preferences: their badge may count other
    /// announcements and groups, and their events speak `locale`.
    #[serde(rename = "preferences")]
    PreferencesChanged {
        /// The user.
        #[serde(rename = "u")]
        user_id: u64,
        /// Their language, as stored ('' for none).
        #[serde(rename = "l", default)]
        locale: String,
    },
    /// A user changed items (seen, read, archived, deleted...): one event
    /// per call, naming the ids that changed or the filter that selected
    /// them. Their badge changed with it.
    #[serde(rename = "updated")]
    ItemsUpdated {
        /// The user.
        #[serde(rename = "u")]
        user_id: u64,
        /// What was done.
        #[serde(rename = "a")]
        action: Action,
        /// The items that changed, for a call that named ids.
        #[serde(rename = "m", default, skip_serializing_if = "Vec::is_empty")]
        message_ids: Vec<u64>,
        /// The filter whose items changed, for a call over a filter.
        #[serde(rename = "f", default, skip_serializing_if = "Option::is_none")]
        filter: Option<BusFilter>,
    },
}

/// A list filter as an event carries it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BusFilter {
    /// Inbox, archive or both.
    #[serde(rename = "v", default)]
    pub view: View,
    /// Only this category.
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Only unread items.
    #[serde(rename = "ur", default, skip_serializing_if = "std::ops::Not::not")]
    pub unread_only: bool,
    /// Only read items.
    #[serde(rename = "rd", default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// Only ids up to this one.
    #[serde(rename = "to", default, skip_serializing_if = "Option::is_none")]
    pub up_to: Option<u64>,
}

impl From<&ItemFilter<'_>> for BusFilter {
    fn from(filter: &ItemFilter<'_>) -> Self {
        Self {
            view: filter.view,
            category: filter.category.map(str::to_owned),
            unread_only: filter.unread_only,
            read_only: filter.read_only,
            up_to: filter.up_to,
        }
    }
}

impl BusEvent {
    /// The event's kind, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ItemsDelivered { .. } => "items",
            Self::BadgesChanged { .. } => "badges",
            Self::GroupMessage { .. } => "group",
            Self::GroupMessageRecalled { .. } => "group_recalled",
            Self::GroupChanged { .. } => "group_changed",
            Self::MembersChanged { .. } => "members",
            Self::Announced { .. } => "announced",
            Self::Revoked { .. } => "revoked",
            Self::PreferencesChanged { .. } => "preferences",
            Self::ItemsUpdated { .. } => "updated",
            Self::Edited { .. } => "edited",
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

/// An event recorded in the transaction of the change it reports (the
/// event outbox, `event_outbox` on that transaction's shard), and what to
/// publish after the commit.
#[derive(Debug)]
pub struct Recorded {
    /// Where the record is.
    pub shard: ShardId,
    /// Its row, once the transaction wrote it.
    pub id: Option<u64>,
}

impl BusEvent {
    /// The body a change's transaction records for this event.
    pub fn recorded_body(&self) -> Vec<u8> {
        self.encode()
    }
}

/// After the commit of a change that recorded an event on `shard` (row
/// `id`): publishes `event` (the change's own, when it has one to tell),
/// then forgets the record (deleted with others in the background). A
/// failed publish leaves the record to the relay.
pub async fn publish_recorded(ctx: &Context, shard: ShardId, id: u64, event: Option<&BusEvent>) {
    if let Some(event) = event
        && !publish_best_effort(ctx, event).await
    {
        return;
    }
    ctx.event_outbox.forget(shard, id);
}

/// Publishes, on every shard that answers, the recorded events their api
/// left (older than `events.outbox_retry_ms`), deleting each once the
/// broker confirmed it. Returns how many it published.
pub async fn relay_once(ctx: &Context) -> Result<u64> {
    let older_than = ctx.settings.events.outbox_retry_ms;
    let mut published = 0;
    for (shard, pool) in ctx.pools.iter() {
        let relayed = event_outbox::relay(pool, older_than, RELAY_BATCH, |due| async move {
            Ok(relay_batch(ctx, shard, &due).await?)
        })
        .await;
        match relayed {
            Ok(count) => published += count,
            Err(e) => warn!(error = %e, shard = %shard, "cannot relay recorded events of a shard"),
        }
    }
    if published > 0 {
        metrics::counter!("notify_events_relayed_total").increment(published);
        info!(published, "relayed events their api did not publish");
    }
    Ok(published)
}

/// Publishes a batch of one shard's recorded events; returns the rows
/// published. An announcement's start left here (Redis did not answer its
/// api) retires every cached badge first, before its gateways hear of it;
/// while Redis is away it waits for a later run, and the other events go.
async fn relay_batch(
    ctx: &Context,
    shard: ShardId,
    due: &[event_outbox::Recorded],
) -> Result<Vec<u64>> {
    let events: Vec<Option<BusEvent>> =
        due.iter().map(|recorded| BusEvent::decode(&recorded.body).ok()).collect();
    let announced = |event: &Option<BusEvent>| matches!(event, Some(BusEvent::Announced { .. }));
    let mut retired = true;
    if events.iter().any(announced)
        && let Err(e) = ctx.cache.bump_announcement_epoch().await
    {
        warn!(error = %e, shard = %shard, "announcements wait for Redis to retire the cached badges");
        retired = false;
    }
    let mut published = Vec::with_capacity(due.len());
    for (recorded, event) in due.iter().zip(&events) {
        if !retired && announced(event) {
            continue;
        }
        let kind = event.as_ref().map_or("unknown", BusEvent::kind);
        ctx.publisher.publish_event(kind, &recorded.body).await?;
        published.push(recorded.id);
    }
    Ok(published)
}

/// Recorded events the relay takes from one shard at a time.
const RELAY_BATCH: u32 = 500;

/// Tells gateway streams that users' badges changed (best effort).
pub async fn badges_changed(ctx: &Context, user_ids: Vec<u64>) {
    publish_best_effort(ctx, &BusEvent::BadgesChanged { user_ids }).await;
}

/// Publishes `event`, waiting for the broker's confirm.
pub async fn publish(ctx: &Context, event: &BusEvent) -> Result<()> {
    ctx.publisher.publish_event(event.kind(), &event.encode()).await
}

/// Publishes an event about a change that is already committed. A failure is
/// logged and counted, never returned: the caller's change stands, and
/// subscribed gateways get fresh snapshots when the bus comes back.
/// Returns whether the broker confirmed it.
pub async fn publish_best_effort(ctx: &Context, event: &BusEvent) -> bool {
    match publish(ctx, event).await {
        Ok(()) => true,
        Err(e) => {
            metrics::counter!("notify_event_publish_errors_total", "kind" => event.kind())
                .increment(1);
            warn!(error = %e, kind = event.kind(), "could not publish a change event");
            false
        }
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
            titles: vec!["Hi Ann".to_owned(), "Hi Bo".to_owned()],
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
        let prefs = BusEvent::PreferencesChanged { user_id: 42, locale: "zh-Hant-TW".to_owned() };
        let text = String::from_utf8(prefs.encode()).unwrap();
        assert_eq!(text, r#"{"t":"preferences","u":42,"l":"zh-Hant-TW"}"#);
        assert_eq!(BusEvent::decode(text.as_bytes()).unwrap(), prefs);
    }

    #[test]
    fn an_announcement_carries_its_titles_by_language_only_when_it_has_them() {
        let summary = ContentSummary {
            title: "Notify 2 is out".to_owned(),
            category: String::new(),
            created_at_ms: 1_700_000_000_000,
            expire_at_ms: None,
        };
        let plain = BusEvent::Announced { message_id: 7, summary, titles: BTreeMap::new() };
        let text = String::from_utf8(plain.encode()).unwrap();
        assert!(!text.contains("\"lt\""), "{text}");
        assert_eq!(BusEvent::decode(text.as_bytes()).unwrap(), plain);
        let BusEvent::Announced { summary, .. } = plain else { unreachable!() };
        let titles = BTreeMap::from([("de".to_owned(), "Notify 2 ist da".to_owned())]);
        let translated = BusEvent::Announced { message_id: 7, summary, titles };
        let text = String::from_utf8(translated.encode()).unwrap();
        assert!(text.contains(r#""lt":{"de":"Notify 2 ist da"}"#), "{text}");
        assert_eq!(BusEvent::decode(text.as_bytes()).unwrap(), translated);
    }

    #[test]
    fn item_updates_name_their_ids_or_their_filter() {
        let by_ids = BusEvent::ItemsUpdated {
            user_id: 42,
            action: Action::MarkSeen,
            message_ids: vec![7, 9],
            filter: None,
        };
        let text = String::from_utf8(by_ids.encode()).unwrap();
        assert_eq!(text, r#"{"t":"updated","u":42,"a":"mark_seen","m":[7,9]}"#);
        assert_eq!(BusEvent::decode(text.as_bytes()).unwrap(), by_ids);
        let by_filter = BusEvent::ItemsUpdated {
            user_id: 42,
            action: Action::Archive,
            message_ids: Vec::new(),
            filter: Some(BusFilter {
                category: Some("billing".to_owned()),
                read_only: true,
                ..BusFilter::default()
            }),
        };
        let text = String::from_utf8(by_filter.encode()).unwrap();
        assert_eq!(
            text,
            r#"{"t":"updated","u":42,"a":"archive","f":{"v":"inbox","c":"billing","rd":true}}"#
        );
        assert_eq!(BusEvent::decode(text.as_bytes()).unwrap(), by_filter);
    }
}
