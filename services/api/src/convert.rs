//! Conversions between the proto contract and domain types, validating every
//! field on the way in.

use chrono::{DateTime, NaiveDateTime, Utc};
use notify_core::control::OperationKind;
use notify_core::inbox::{Action, InboxPage, InboxRow, ItemFilter, PageFormat, View};
use notify_core::send::{MessageView, Progress};
use notify_domain::auth::{Client, Scope};
use notify_domain::domain::{self, AudienceKind, Content, Priority, Recipients, SendStatus};
use notify_domain::template::{Template, Translation};
use notify_domain::{Error, Result};
use notify_proto::v1;

/// Converts a stored UTC time to a proto timestamp.
pub fn timestamp(at: NaiveDateTime) -> prost_types::Timestamp {
    let utc = at.and_utc();
    prost_types::Timestamp { seconds: utc.timestamp(), nanos: utc.timestamp_subsec_nanos() as i32 }
}

/// Inbox pages as `ListInboxResponse`, the encoding the page cache stores:
/// a cached page is decoded once and sent, never built again.
pub struct WirePages;

impl PageFormat for WirePages {
    type Page = v1::ListInboxResponse;

    fn build(page: InboxPage) -> Self::Page {
        v1::ListInboxResponse {
            items: page.items.into_iter().map(inbox_item).collect(),
            next_page_token: page.next_page_token,
        }
    }

    fn encode(page: &Self::Page) -> Vec<u8> {
        prost::Message::encode_to_vec(page)
    }

    fn decode(bytes: &[u8]) -> std::result::Result<Self::Page, String> {
        prost::Message::decode(bytes).map_err(|e| e.to_string())
    }
}

/// Converts an inbox row to its proto item.
pub fn inbox_item(row: InboxRow) -> v1::InboxItem {
    v1::InboxItem {
        message_id: row.message_id,
        content: Some(v1::Content {
            data: Content::data_from_json(&row.data).into_iter().collect(),
            title: row.title,
            body: row.body,
            category: row.category,
            // Rendered for the reader already.
            template: None,
        }),
        created_at: Some(timestamp(row.created_at)),
        read: row.is_read,
        read_at: row.read_at.map(timestamp),
        expire_at: row.expire_at.map(timestamp),
        seen: row.is_seen,
        seen_at: row.seen_at.map(timestamp),
        archived: row.is_archived,
        archived_at: row.archived_at.map(timestamp),
        edited_at: row.edited_at.map(timestamp),
    }
}

/// Reads an `InboxView`, naming `field` when it is not one.
pub fn view(raw: i32, field: &str) -> Result<View> {
    match v1::InboxView::try_from(raw) {
        Ok(v1::InboxView::Unspecified | v1::InboxView::Inbox) => Ok(View::Inbox),
        Ok(v1::InboxView::Archive) => Ok(View::Archive),
        Ok(v1::InboxView::All) => Ok(View::All),
        Err(_) => Err(Error::invalid(field, &format!("unknown view {raw}"))),
    }
}

/// The proto view of a view.
pub fn view_to_proto(view: View) -> v1::InboxView {
    match view {
        View::Inbox => v1::InboxView::Inbox,
        View::Archive => v1::InboxView::Archive,
        View::All => v1::InboxView::All,
    }
}

/// Reads an `ItemAction`, naming `field` when it is missing or unknown.
pub fn action(raw: i32, field: &str) -> Result<Action> {
    match v1::ItemAction::try_from(raw) {
        Ok(v1::ItemAction::MarkSeen) => Ok(Action::MarkSeen),
        Ok(v1::ItemAction::MarkRead) => Ok(Action::MarkRead),
        Ok(v1::ItemAction::MarkUnread) => Ok(Action::MarkUnread),
        Ok(v1::ItemAction::Archive) => Ok(Action::Archive),
        Ok(v1::ItemAction::Unarchive) => Ok(Action::Unarchive),
        Ok(v1::ItemAction::Delete) => Ok(Action::Delete),
        Ok(v1::ItemAction::Unspecified) => Err(Error::invalid(field, "is required")),
        Err(_) => Err(Error::invalid(field, &format!("unknown action {raw}"))),
    }
}

/// The proto action of an action.
pub fn action_to_proto(action: Action) -> v1::ItemAction {
    match action {
        Action::MarkSeen => v1::ItemAction::MarkSeen,
        Action::MarkRead => v1::ItemAction::MarkRead,
        Action::MarkUnread => v1::ItemAction::MarkUnread,
        Action::Archive => v1::ItemAction::Archive,
        Action::Unarchive => v1::ItemAction::Unarchive,
        Action::Delete => v1::ItemAction::Delete,
    }
}

/// The list filters shared by `ListInbox` and `ItemFilter`, validated:
/// `prefix` names the fields (`""` or `"all."`).
pub fn item_filter<'a>(
    view_raw: i32,
    category: &'a str,
    unread_only: bool,
    read_only: bool,
    up_to: u64,
    prefix: &str,
) -> Result<ItemFilter<'a>> {
    let view = view(view_raw, &format!("{prefix}view"))?;
    if !category.is_empty() {
        domain::validate_category(category, &format!("{prefix}category"))?;
    }
    if unread_only && read_only {
        return Err(Error::invalid(
            &format!("{prefix}read_only"),
            &format!("cannot be combined with {prefix}unread_only"),
        ));
    }
    Ok(ItemFilter {
        view,
        unread_only,
        read_only,
        category: (!category.is_empty()).then_some(category),
        up_to: (up_to != 0).then_some(up_to),
    })
}

/// Converts an optional stored time.
pub fn opt_timestamp(at: Option<NaiveDateTime>) -> Option<prost_types::Timestamp> {
    at.map(timestamp)
}

/// Parses a proto timestamp, naming `field` when it is out of range.
pub fn parse_timestamp(ts: &prost_types::Timestamp, field: &str) -> Result<NaiveDateTime> {
    if !(0..1_000_000_000).contains(&ts.nanos) {
        return Err(Error::invalid(field, "nanos must be in 0..1e9"));
    }
    // MySQL DATETIME holds years 1000..=9999; sends live after 1970.
    const MAX_SECONDS: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    if !(0..=MAX_SECONDS).contains(&ts.seconds) {
        return Err(Error::invalid(field, "must be between 1970 and 9999"));
    }
    DateTime::<Utc>::from_timestamp(ts.seconds, ts.nanos as u32)
        .map(|t| t.naive_utc())
        .ok_or_else(|| Error::invalid(field, "is out of range"))
}

/// Checks a page size: at least 1, at most `max`.
pub fn page_limit(raw: u32, max: u32, field: &str) -> Result<u32> {
    match raw {
        0 => Err(Error::invalid(field, "must be at least 1")),
        n if n > max => Err(Error::invalid(field, &format!("is {n}, the maximum is {max}"))),
        n => Ok(n),
    }
}

/// Validates and converts content; `field` names it in errors.
pub fn content(raw: Option<v1::Content>, field: &str) -> Result<Content> {
    let raw = raw.ok_or_else(|| Error::invalid(field, "is required"))?;
    let template = raw
        .template
        .map(|t| {
            let translations = t.translations.into_iter().map(|(tag, translation)| {
                (tag, Translation { title: translation.title, body: translation.body })
            });
            Template::new(
                t.vars.into_iter().collect(),
                translations,
                t.recipient_vars,
                &format!("{field}.template"),
            )
        })
        .transpose()?;
    let content = Content {
        title: raw.title,
        body: raw.body,
        category: raw.category,
        data: raw.data.into_iter().collect(),
        template,
    };
    content.validate(field)?;
    Ok(content)
}

/// Converts content to its proto form.
pub fn content_to_proto(content: Content) -> v1::Content {
    v1::Content {
        title: content.title,
        body: content.body,
        category: content.category,
        data: content.data.into_iter().collect(),
        template: content.template.map(|t| v1::Template {
            vars: t.vars.into_iter().collect(),
            translations: t
                .translations
                .into_iter()
                .map(|(tag, tr)| (tag, v1::Translation { title: tr.title, body: tr.body }))
                .collect(),
            recipient_vars: t.recipient_vars.into_iter().collect(),
        }),
    }
}

/// A request's recipients: bare `user_ids`, or `recipients` with their
/// vars (not both); `field` is the message that holds them.
pub fn recipients(
    user_ids: &[u64],
    recipients: Vec<v1::RecipientVars>,
    max: usize,
    field: &str,
    hint: &str,
) -> Result<Recipients> {
    let prefix = if field.is_empty() { String::new() } else { format!("{field}.") };
    match (user_ids.is_empty(), recipients.is_empty()) {
        (false, false) => Err(Error::invalid(
            &format!("{prefix}recipients"),
            &format!("cannot be given with {prefix}user_ids: list every user in one of them"),
        )),
        (_, true) => Recipients::ids(user_ids, max, &format!("{prefix}user_ids"), hint),
        (true, false) => Recipients::with_vars(
            recipients.into_iter().map(|r| (r.user_id, r.vars)).collect(),
            max,
            &format!("{prefix}recipients"),
            hint,
        ),
    }
}

/// Parses a priority enum value.
pub fn priority(raw: i32) -> Result<Priority> {
    match v1::Priority::try_from(raw) {
        Ok(v1::Priority::Unspecified | v1::Priority::Normal) => Ok(Priority::Normal),
        Ok(v1::Priority::High) => Ok(Priority::High),
        Err(_) => Err(Error::invalid("priority", &format!("unknown value {raw}"))),
    }
}

/// Validates `send_at` and `expire_at` against now and each other.
pub fn schedule(
    send_at: Option<&prost_types::Timestamp>,
    expire_at: Option<&prost_types::Timestamp>,
    past_tolerance_secs: i64,
) -> Result<(Option<NaiveDateTime>, Option<NaiveDateTime>)> {
    let now = Utc::now().naive_utc();
    let send_at = send_at.map(|ts| parse_timestamp(ts, "send_at")).transpose()?;
    if let Some(at) = send_at
        && (now - at).num_seconds() > past_tolerance_secs
    {
        return Err(Error::invalid(
            "send_at",
            &format!("is more than {past_tolerance_secs} s in the past"),
        ));
    }
    let expire_at = expire_at.map(|ts| parse_timestamp(ts, "expire_at")).transpose()?;
    if let Some(expire) = expire_at {
        if expire <= now {
            return Err(Error::invalid("expire_at", "must be in the future"));
        }
        if send_at.is_some_and(|at| expire <= at) {
            return Err(Error::invalid("expire_at", "must be after send_at"));
        }
    }
    Ok((send_at, expire_at))
}

/// Resolves a request's `sender` for `caller`: empty means the caller's
/// default sender; one the caller may not use is PERMISSION_DENIED.
pub fn sender(caller: &Client, raw: String, field: &str) -> Result<String> {
    let sender = if raw.is_empty() { caller.default_sender().to_owned() } else { raw };
    domain::validate_sender(&sender, field)?;
    if !caller.may_send_as(&sender) {
        return Err(Error::PermissionDenied(format!(
            "{field}: client {} may not send as {sender:?} (its senders are set in auth.clients)",
            caller.name()
        )));
    }
    Ok(sender)
}

/// The fields SendMessage and CreateMessage share.
#[derive(Debug, Clone, Default)]
pub struct SendFields {
    /// `sender`; empty: the caller's default.
    pub sender: String,
    /// `idempotency_key`; empty: none.
    pub idempotency_key: String,
    /// `content`.
    pub content: Option<v1::Content>,
    /// `priority`.
    pub priority: i32,
    /// `send_at`.
    pub send_at: Option<prost_types::Timestamp>,
    /// `expire_at`.
    pub expire_at: Option<prost_types::Timestamp>,
    /// `critical` (the caller's scope is checked by the handler).
    pub critical: bool,
}

/// Validates the fields shared by SendMessage and CreateMessage.
pub fn new_send(
    caller: &Client,
    fields: SendFields,
    audience: AudienceKind,
    past_tolerance_secs: i64,
) -> Result<notify_core::send::NewSend> {
    let sender = sender(caller, fields.sender, "sender")?;
    if fields.critical && !caller.allows(Scope::SendCritical) {
        return Err(Error::PermissionDenied(format!(
            "critical: client {} lacks the scope send.critical (a critical send ignores mutes)",
            caller.name()
        )));
    }
    domain::validate_idempotency_key(&fields.idempotency_key, "idempotency_key")?;
    let content = content(fields.content, "content")?;
    if audience == AudienceKind::AllUsers
        && content.template.as_ref().is_some_and(Template::per_recipient)
    {
        return Err(Error::invalid(
            "content.template.recipient_vars",
            "must be empty for all_users: an announcement is stored once and rendered with \
             the send-wide vars in each reader's language",
        ));
    }
    let priority = priority(fields.priority)?;
    let (send_at, expire_at) =
        schedule(fields.send_at.as_ref(), fields.expire_at.as_ref(), past_tolerance_secs)?;
    let idempotency_key = fields.idempotency_key;
    Ok(notify_core::send::NewSend {
        client: caller.name().to_owned(),
        sender,
        idempotency_key: (!idempotency_key.is_empty()).then_some(idempotency_key),
        content,
        audience,
        priority,
        send_at,
        expire_at,
        critical: fields.critical,
    })
}

/// Converts a stored status to the proto enum.
pub fn status_to_proto(status: SendStatus) -> v1::MessageStatus {
    match status {
        SendStatus::NotStarted => v1::MessageStatus::NotStarted,
        SendStatus::Sending => v1::MessageStatus::Sending,
        SendStatus::Paused => v1::MessageStatus::Paused,
        SendStatus::Completed => v1::MessageStatus::Completed,
        SendStatus::Cancelled => v1::MessageStatus::Cancelled,
        SendStatus::Recalled => v1::MessageStatus::Recalled,
    }
}

/// Converts progress to the proto form.
pub fn progress_to_proto(progress: &Progress) -> v1::Progress {
    v1::Progress {
        total: progress.total,
        delivered: progress.delivered,
        failed: progress.failed,
        read: progress.read,
        pending: progress.pending,
        cancelled: progress.cancelled,
        pending_chunks: progress.pending_chunks,
        suppressed: progress.suppressed,
        recalled: progress.recalled,
    }
}

/// Converts a send with its progress to the proto `Message`.
pub fn message_to_proto(view: MessageView) -> Result<v1::Message> {
    let row = view.row;
    let status = status_to_proto(row.status()?);
    let audience = if row.audience == AudienceKind::AllUsers as u8 {
        v1::AudienceKind::AllUsers
    } else {
        v1::AudienceKind::Users
    };
    let priority = if row.priority == Priority::High as u8 {
        v1::Priority::High
    } else {
        v1::Priority::Normal
    };
    Ok(v1::Message {
        message_id: row.message_id,
        sender: row.sender.clone(),
        status: status as i32,
        progress: view.progress.as_ref().map(progress_to_proto),
        content: Some(content_to_proto(row.content())),
        audience: audience as i32,
        priority: priority as i32,
        send_at: opt_timestamp(row.send_at),
        expire_at: opt_timestamp(row.expire_at),
        created_at: Some(timestamp(row.created_at)),
        started_at: opt_timestamp(row.started_at),
        finished_at: opt_timestamp(row.finished_at),
        critical: row.critical,
        edited_at: opt_timestamp(row.edited_at),
        pending_operations: view
            .pending_operations
            .iter()
            .map(|kind| operation_to_proto(*kind) as i32)
            .collect(),
    })
}

/// The proto name of a control operation.
fn operation_to_proto(kind: OperationKind) -> v1::ControlOperation {
    match kind {
        OperationKind::Cancel => v1::ControlOperation::Cancel,
        OperationKind::Recall => v1::ControlOperation::Recall,
        OperationKind::Edit => v1::ControlOperation::Edit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_at_far_in_the_past_is_rejected_but_slightly_late_is_fine() {
        let now = Utc::now().timestamp();
        let old = prost_types::Timestamp { seconds: now - 3600, nanos: 0 };
        let err = schedule(Some(&old), None, 300).unwrap_err();
        assert_eq!(err.to_string(), "send_at: is more than 300 s in the past");
        let late = prost_types::Timestamp { seconds: now - 10, nanos: 0 };
        assert!(schedule(Some(&late), None, 300).is_ok());
    }

    #[test]
    fn expire_at_must_follow_send_at() {
        let now = Utc::now().timestamp();
        let send = prost_types::Timestamp { seconds: now + 100, nanos: 0 };
        let expire = prost_types::Timestamp { seconds: now + 50, nanos: 0 };
        let err = schedule(Some(&send), Some(&expire), 300).unwrap_err();
        assert_eq!(err.to_string(), "expire_at: must be after send_at");
    }

    #[test]
    fn timestamps_past_year_9999_are_rejected() {
        let far = prost_types::Timestamp { seconds: 300_000_000_000, nanos: 0 };
        let err = schedule(None, Some(&far), 300).unwrap_err();
        assert_eq!(err.to_string(), "expire_at: must be between 1970 and 9999");
    }

    #[test]
    fn unknown_priority_is_rejected() {
        assert_eq!(priority(9).unwrap_err().to_string(), "priority: unknown value 9");
        assert_eq!(priority(0).unwrap(), Priority::Normal);
    }
}
