//! The edge's JSON: what each call takes and answers, and what the event
//! stream carries, each with its OpenAPI schema.
//!
//! Ids (messages, groups) are 64-bit and go as decimal strings, which
//! JavaScript numbers cannot hold beyond 2^53; counts and seqs are numbers.
//! Times are RFC 3339 in UTC with milliseconds. The shapes follow the gRPC
//! contract's (`notify.v1`), built from the same messages, so the two
//! answer alike.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use notify_proto::v1;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;

/// A 64-bit id as JSON: a decimal string (a number is accepted on input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ToSchema)]
#[schema(value_type = String, example = "255350402717900800")]
pub struct Id(pub u64);

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(u64),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(number) => Ok(Self(number)),
            Raw::Text(text) => text.parse().map(Self).map_err(|_| {
                serde::de::Error::custom(format!("{text:?} is not a 64-bit unsigned id"))
            }),
        }
    }
}

fn ids(raw: &[u64]) -> Vec<Id> {
    raw.iter().copied().map(Id).collect()
}

/// A proto timestamp as RFC 3339 (UTC, milliseconds).
pub fn time(at: &prost_types::Timestamp) -> String {
    DateTime::<Utc>::from_timestamp(at.seconds, at.nanos.clamp(0, 999_999_999) as u32)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn opt_time(at: Option<&prost_types::Timestamp>) -> Option<String> {
    at.map(time)
}

/// One item of the user's inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InboxItem {
    /// The message.
    pub message_id: Id,
    /// Its title (edited in place by an edit).
    pub title: String,
    /// Its body.
    pub body: String,
    /// Its category (`""`: none).
    pub category: String,
    /// The sender's string pairs.
    pub data: BTreeMap<String, String>,
    /// When it was delivered.
    pub created_at: String,
    /// When it expires (then it leaves the inbox), if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expire_at: Option<String>,
    /// When its content was last edited, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited_at: Option<String>,
    /// Seen (shown in a list); a read item is seen too.
    pub seen: bool,
    /// When it was first seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seen_at: Option<String>,
    /// Read.
    pub read: bool,
    /// When it was read, while it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_at: Option<String>,
    /// Archived (out of the inbox view, in the archive view).
    pub archived: bool,
    /// When it was archived, while it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archived_at: Option<String>,
}

impl From<v1::InboxItem> for InboxItem {
    fn from(item: v1::InboxItem) -> Self {
        let content = item.content.unwrap_or_default();
        Self {
            message_id: Id(item.message_id),
            title: content.title,
            body: content.body,
            category: content.category,
            data: content.data.into_iter().collect(),
            created_at: opt_time(item.created_at.as_ref()).unwrap_or_default(),
            expire_at: opt_time(item.expire_at.as_ref()),
            edited_at: opt_time(item.edited_at.as_ref()),
            seen: item.seen,
            seen_at: opt_time(item.seen_at.as_ref()),
            read: item.read,
            read_at: opt_time(item.read_at.as_ref()),
            archived: item.archived,
            archived_at: opt_time(item.archived_at.as_ref()),
        }
    }
}

/// A page of the inbox, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InboxPage {
    /// The items.
    pub items: Vec<InboxItem>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

impl From<v1::ListInboxResponse> for InboxPage {
    fn from(page: v1::ListInboxResponse) -> Self {
        Self {
            items: page.items.into_iter().map(InboxItem::from).collect(),
            next_cursor: (!page.next_page_token.is_empty()).then_some(page.next_page_token),
        }
    }
}

/// The user's badge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Badge {
    /// Unread, unexpired inbox items (direct sends and announcements).
    pub unread: u64,
    /// Of those, the ones not seen either (the bell's number).
    pub unseen: u64,
    /// Unread group messages over the groups the user does not mute.
    pub group_unread: u64,
    /// True when the group part could not be read now (a group's shard is
    /// down): `group_unread` is then 0 and means nothing.
    pub group_unread_unknown: bool,
}

impl From<&v1::GetUnreadCountResponse> for Badge {
    fn from(counts: &v1::GetUnreadCountResponse) -> Self {
        Self {
            unread: counts.unread,
            unseen: counts.unseen,
            group_unread: counts.group_unread,
            group_unread_unknown: counts.group_unread_unknown,
        }
    }
}

/// Which items: the list filters, shared by pages and updates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemFilter {
    /// `inbox` (the default), `archive` or `all`.
    #[serde(default)]
    pub view: View,
    /// Only this category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Only unread items.
    #[serde(default)]
    pub unread_only: bool,
    /// Only read items.
    #[serde(default)]
    pub read_only: bool,
    /// Only items up to this message id (what the user saw when they
    /// asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_message_id: Option<Id>,
}

impl ItemFilter {
    /// The gRPC filter.
    pub fn to_proto(&self) -> v1::ItemFilter {
        v1::ItemFilter {
            view: self.view.to_proto() as i32,
            category: self.category.clone().unwrap_or_default(),
            unread_only: self.unread_only,
            read_only: self.read_only,
            up_to_message_id: self.up_to_message_id.map_or(0, |id| id.0),
        }
    }

    fn from_proto(filter: v1::ItemFilter) -> Self {
        Self {
            view: View::from_proto(filter.view),
            category: (!filter.category.is_empty()).then_some(filter.category),
            unread_only: filter.unread_only,
            read_only: filter.read_only,
            up_to_message_id: (filter.up_to_message_id != 0).then_some(Id(filter.up_to_message_id)),
        }
    }
}

/// A list view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum View {
    /// Items not archived.
    #[default]
    Inbox,
    /// Archived items.
    Archive,
    /// Both.
    All,
}

impl View {
    /// The gRPC view.
    pub fn to_proto(self) -> v1::InboxView {
        match self {
            Self::Inbox => v1::InboxView::Inbox,
            Self::Archive => v1::InboxView::Archive,
            Self::All => v1::InboxView::All,
        }
    }

    fn from_proto(raw: i32) -> Self {
        match v1::InboxView::try_from(raw) {
            Ok(v1::InboxView::Archive) => Self::Archive,
            Ok(v1::InboxView::All) => Self::All,
            _ => Self::Inbox,
        }
    }
}

/// What an update does to its items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Seen (shown); does not change read.
    MarkSeen,
    /// Read (and seen).
    MarkRead,
    /// Unread again.
    MarkUnread,
    /// Out of the inbox view.
    Archive,
    /// Back into it.
    Unarchive,
    /// Gone for this user, for good.
    Delete,
}

impl Action {
    /// The gRPC action.
    pub fn to_proto(self) -> v1::ItemAction {
        match self {
            Self::MarkSeen => v1::ItemAction::MarkSeen,
            Self::MarkRead => v1::ItemAction::MarkRead,
            Self::MarkUnread => v1::ItemAction::MarkUnread,
            Self::Archive => v1::ItemAction::Archive,
            Self::Unarchive => v1::ItemAction::Unarchive,
            Self::Delete => v1::ItemAction::Delete,
        }
    }

    fn from_proto(raw: i32) -> Option<Self> {
        match v1::ItemAction::try_from(raw).ok()? {
            v1::ItemAction::MarkSeen => Some(Self::MarkSeen),
            v1::ItemAction::MarkRead => Some(Self::MarkRead),
            v1::ItemAction::MarkUnread => Some(Self::MarkUnread),
            v1::ItemAction::Archive => Some(Self::Archive),
            v1::ItemAction::Unarchive => Some(Self::Unarchive),
            v1::ItemAction::Delete => Some(Self::Delete),
            v1::ItemAction::Unspecified => None,
        }
    }
}

/// `POST /v1/items/update`: an action on listed items or on every item a
/// filter selects (exactly one of the two).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateRequest {
    /// What to do.
    pub action: Action,
    /// These items (1 to 1,000 ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub message_ids: Vec<Id>,
    /// Or every item this filter selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<ItemFilter>,
}

/// What an update changed, and the badge after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UpdateResponse {
    /// Items whose state changed.
    pub changed: u64,
    /// Listed ids that are not the user's items (or are withdrawn).
    pub unknown_message_ids: Vec<Id>,
    /// Unread items after the update.
    pub unread: u64,
    /// Unseen unread items after the update.
    pub unseen: u64,
}

impl From<v1::UpdateItemsResponse> for UpdateResponse {
    fn from(reply: v1::UpdateItemsResponse) -> Self {
        Self {
            changed: reply.changed,
            unknown_message_ids: ids(&reply.unknown_message_ids),
            unread: reply.unread,
            unseen: reply.unseen,
        }
    }
}

/// What the user mutes, and their language.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Preferences {
    /// Categories not delivered to the user (critical sends still are).
    #[serde(default)]
    pub muted_categories: Vec<String>,
    /// Groups whose unread stays out of the badge.
    #[serde(default)]
    pub muted_group_ids: Vec<Id>,
    /// The language the user reads, a BCP 47 tag (`zh-Hant-TW`), answered
    /// in its canonical form; `""` (or absent): not set.
    #[serde(default)]
    #[schema(example = "zh-Hant-TW")]
    pub locale: String,
}

impl From<v1::Preferences> for Preferences {
    fn from(preferences: v1::Preferences) -> Self {
        Self {
            muted_categories: preferences.muted_categories,
            muted_group_ids: ids(&preferences.muted_group_ids),
            locale: preferences.locale,
        }
    }
}

/// One of the user's groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GroupUnread {
    /// The group.
    pub group_id: Id,
    /// Messages after the user's cursor, not recalled.
    pub unread: u64,
    /// The group's newest seq.
    pub max_seq: u64,
    /// The user's cursor (what they acknowledged).
    pub last_ack_seq: u64,
    /// The user mutes it: its unread is not in `total`.
    pub muted: bool,
}

/// `GET /v1/groups`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Groups {
    /// The user's groups.
    pub groups: Vec<GroupUnread>,
    /// Unread over the groups the user does not mute.
    pub total: u64,
}

impl From<v1::GetGroupUnreadResponse> for Groups {
    fn from(reply: v1::GetGroupUnreadResponse) -> Self {
        Self {
            groups: reply
                .groups
                .into_iter()
                .map(|g| GroupUnread {
                    group_id: Id(g.group_id),
                    unread: g.unread,
                    max_seq: g.max_seq,
                    last_ack_seq: g.last_ack_seq,
                    muted: g.muted,
                })
                .collect(),
            total: reply.total,
        }
    }
}

/// A message of a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GroupMessage {
    /// The message.
    pub message_id: Id,
    /// Its place in the group.
    pub seq: u64,
    /// Its title; absent once recalled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its body; absent once recalled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Its category.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Its string pairs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<BTreeMap<String, String>>,
    /// Who sent it.
    pub sender: String,
    /// When.
    pub created_at: String,
    /// A tombstone: recalled (its seq stays taken).
    pub recalled: bool,
    /// When it was recalled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recalled_at: Option<String>,
}

impl From<v1::GroupMessage> for GroupMessage {
    fn from(message: v1::GroupMessage) -> Self {
        let content = message.content;
        Self {
            message_id: Id(message.message_id),
            seq: message.seq,
            title: content.as_ref().map(|c| c.title.clone()),
            body: content.as_ref().map(|c| c.body.clone()),
            category: content.as_ref().map(|c| c.category.clone()),
            data: content.map(|c| c.data.into_iter().collect()),
            sender: message.sender,
            created_at: opt_time(message.created_at.as_ref()).unwrap_or_default(),
            recalled: message.recalled,
            recalled_at: opt_time(message.recalled_at.as_ref()),
        }
    }
}

/// `GET /v1/groups/{group_id}/messages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GroupMessages {
    /// Ascending by seq.
    pub messages: Vec<GroupMessage>,
    /// More follow the last.
    pub has_more: bool,
}

impl From<v1::PullGroupMessagesResponse> for GroupMessages {
    fn from(reply: v1::PullGroupMessagesResponse) -> Self {
        Self {
            messages: reply.messages.into_iter().map(GroupMessage::from).collect(),
            has_more: reply.has_more,
        }
    }
}

/// `POST /v1/groups/{group_id}/ack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    /// Everything up to this seq is read.
    pub seq: u64,
}

/// The user's cursor after an ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AckResponse {
    /// The cursor (an older seq than it leaves it as it was).
    pub last_ack_seq: u64,
}

/// The newest item, in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ItemSummary {
    /// The message.
    pub message_id: Id,
    /// Its title.
    pub title: String,
    /// Its category.
    pub category: String,
    /// When it was delivered.
    pub created_at: String,
}

/// The `snapshot` event: the badge and the newest item, the state every
/// later event changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    /// The badge.
    #[serde(flatten)]
    pub badge: Badge,
    /// The newest inbox item; absent when the inbox is empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latest: Option<ItemSummary>,
}

/// The `item_delivered` event: a new item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ItemDelivered {
    /// The message.
    pub message_id: Id,
    /// Its title.
    pub title: String,
    /// Its category.
    pub category: String,
    /// When it was delivered.
    pub created_at: String,
}

/// The `item_updated` event: items changed state (by this user on any
/// device), or a message's content was edited (`title`, `edited_at`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ItemUpdated {
    /// The item, when one changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<Id>,
    /// The items, when a list changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub message_ids: Vec<Id>,
    /// Every item this filter selected, when an update named a filter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all: Option<ItemFilter>,
    /// What the user did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// The states set (the others unchanged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seen: Option<bool>,
    /// Read or unread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read: Option<bool>,
    /// Archived or not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archived: Option<bool>,
    /// Deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<bool>,
    /// An edit's new title.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// When it was edited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited_at: Option<String>,
}

/// The `item_revoked` event: the message was withdrawn (recalled, or an
/// announcement cancelled or expired): drop it from the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ItemRevoked {
    /// The message.
    pub message_id: Id,
}

/// The `group_message` event: a message in one of the user's groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GroupMessageSent {
    /// The group.
    pub group_id: Id,
    /// Its seq.
    pub seq: u64,
    /// The message.
    pub message_id: Id,
}

/// The `resync` event: events were lost to this stream. Reload the first
/// page; a `snapshot` follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Resync {
    /// `history`: the stream resumed from further back than the edge
    /// holds (or from an id it does not know); `lost`: events of the stream
    /// were lost since (the client read too slowly, or the edge's bus lost
    /// some).
    pub reason: String,
}

/// An event of the stream: its name (the SSE `event:` field) and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// `snapshot`.
    Snapshot(Snapshot),
    /// `badge`.
    Badge(Badge),
    /// `item_delivered`.
    ItemDelivered(ItemDelivered),
    /// `item_updated`.
    ItemUpdated(ItemUpdated),
    /// `item_revoked`.
    ItemRevoked(ItemRevoked),
    /// `group_message`.
    GroupMessage(GroupMessageSent),
    /// `resync`.
    Resync(Resync),
}

impl StreamEvent {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Snapshot(_) => "snapshot",
            Self::Badge(_) => "badge",
            Self::ItemDelivered(_) => "item_delivered",
            Self::ItemUpdated(_) => "item_updated",
            Self::ItemRevoked(_) => "item_revoked",
            Self::GroupMessage(_) => "group_message",
            Self::Resync(_) => "resync",
        }
    }

    /// The body, as JSON.
    pub fn data(&self) -> String {
        let json = match self {
            Self::Snapshot(e) => serde_json::to_string(e),
            Self::Badge(e) => serde_json::to_string(e),
            Self::ItemDelivered(e) => serde_json::to_string(e),
            Self::ItemUpdated(e) => serde_json::to_string(e),
            Self::ItemRevoked(e) => serde_json::to_string(e),
            Self::GroupMessage(e) => serde_json::to_string(e),
            Self::Resync(e) => serde_json::to_string(e),
        };
        json.unwrap_or_default()
    }

    /// The stream's form of a gateway event; none for a heartbeat (the edge
    /// sends its own).
    pub fn from_proto(event: v1::subscribe_response::Event) -> Option<Self> {
        use v1::subscribe_response::Event;
        Some(match event {
            Event::Snapshot(s) => Self::Snapshot(Snapshot {
                badge: Badge {
                    unread: s.unread,
                    unseen: s.unseen,
                    group_unread: s.group_unread,
                    group_unread_unknown: s.group_unread_unknown,
                },
                latest: s.latest.map(|latest| ItemSummary {
                    message_id: Id(latest.message_id),
                    title: latest.title,
                    category: latest.category,
                    created_at: opt_time(latest.created_at.as_ref()).unwrap_or_default(),
                }),
            }),
            Event::BadgeChanged(b) => Self::Badge(Badge {
                unread: b.unread,
                unseen: b.unseen,
                group_unread: b.group_unread,
                group_unread_unknown: b.group_unread_unknown,
            }),
            Event::ItemDelivered(d) => Self::ItemDelivered(ItemDelivered {
                message_id: Id(d.message_id),
                title: d.title,
                category: d.category,
                created_at: opt_time(d.created_at.as_ref()).unwrap_or_default(),
            }),
            Event::ItemUpdated(u) => Self::ItemUpdated(ItemUpdated {
                message_id: (u.message_id != 0).then_some(Id(u.message_id)),
                message_ids: ids(&u.message_ids),
                all: u.all.map(ItemFilter::from_proto),
                action: Action::from_proto(u.action),
                seen: u.seen,
                read: u.read,
                archived: u.archived,
                deleted: u.deleted,
                title: (!u.title.is_empty()).then_some(u.title),
                edited_at: opt_time(u.edited_at.as_ref()),
            }),
            Event::ItemRevoked(r) => {
                Self::ItemRevoked(ItemRevoked { message_id: Id(r.message_id) })
            }
            Event::GroupMessage(g) => Self::GroupMessage(GroupMessageSent {
                group_id: Id(g.group_id),
                seq: g.seq,
                message_id: Id(g.message_id),
            }),
            Event::Heartbeat(_) => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_go_as_strings_and_come_as_strings_or_numbers() {
        assert_eq!(serde_json::to_string(&Id(u64::MAX)).unwrap(), "\"18446744073709551615\"");
        let parsed: Vec<Id> = serde_json::from_str("[\"7\", 8]").unwrap();
        assert_eq!(parsed, [Id(7), Id(8)]);
        let refused = serde_json::from_str::<Id>("\"7x\"").unwrap_err().to_string();
        assert!(refused.contains("not a 64-bit unsigned id"), "{refused}");
    }

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        let at = prost_types::Timestamp { seconds: 1_765_000_000, nanos: 123_456_789 };
        assert_eq!(time(&at), "2025-12-06T05:46:40.123Z");
    }

    #[test]
    fn an_update_takes_only_its_fields() {
        let refused =
            serde_json::from_str::<UpdateRequest>(r#"{"action":"mark_read","ids":["1"]}"#);
        assert!(refused.unwrap_err().to_string().contains("unknown field `ids`"));
        let update: UpdateRequest =
            serde_json::from_str(r#"{"action":"archive","all":{"view":"all"}}"#).unwrap();
        assert_eq!(update.all.unwrap().to_proto().view, v1::InboxView::All as i32);
    }
}
