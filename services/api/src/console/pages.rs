//! The console's page handlers: each reads through `notify-core` what the
//! gRPC call of the same name would (bounded reads, O(shards)) and renders
//! its template; the buttons call the same lifecycle functions as the gRPC
//! handlers and are audited as those calls are.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use notify_core::Context;
use notify_core::audit::{self, AuditRow, Target};
use notify_core::inbox::View;
use notify_core::lookups::{self, LiveProgress, LiveReader, SendFilter};
use notify_core::recall;
use notify_core::recipients;
use notify_core::send::MessageRow;
use notify_core::send::{self, MessageView};
use notify_domain::Error;
use notify_domain::domain::{AudienceKind, MessageId, SendStatus, UserId};
use serde::Deserialize;
use tracing::warn;

use super::Console;
use super::session::{CurrentSession, Session, check_csrf};
use super::views::{
    Action, AuditLine, Bar, ErrorPage, GroupLine, GroupMessageLine, GroupPage, ItemLine, Moment,
    Nav, RecipientLine, RecipientsView, ReplicaLine, SampleView, SendPage, SendRow, SendsPage,
    ShardBar, ShardLine, ShardsPage, TemplateView, UserPage, group_digits, percent, render, when,
};

/// Sends on one page of the list.
const SENDS_PAGE: u32 = 50;
/// Items shown on a user's page.
const USER_ITEMS: u32 = 50;
/// Recent messages shown on a group's page.
const GROUP_MESSAGES: u32 = 20;
/// Audit records shown on a send's page.
const AUDIT_LINES: u32 = 100;

/// The statuses the list filters by, as the API names them.
const STATUSES: &[&str] =
    &["not_started", "sending", "paused", "completed", "cancelled", "recalled"];

/// An error as a page: NOT_FOUND and refusals say what they are; a backend
/// failure is logged and shown without its internals.
fn error_page(nav: Option<Nav>, e: &Error) -> Response {
    let (status, title, detail) = match e {
        Error::NotFound(_) => (StatusCode::NOT_FOUND, "Not found", e.to_string()),
        Error::InvalidArgument { .. } => (StatusCode::BAD_REQUEST, "Not valid", e.to_string()),
        Error::FailedPrecondition(_) => (StatusCode::CONFLICT, "Not possible now", e.to_string()),
        _ => {
            warn!(error = %e, "console page failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "A backend is unavailable",
                "The page could not be read; the api's log has the details. Try again shortly."
                    .to_owned(),
            )
        }
    };
    let mut response = render(&ErrorPage { nav, title: title.to_owned(), detail });
    *response.status_mut() = status;
    response
}

/// The page for an unknown path.
pub(crate) fn not_found() -> Response {
    let mut response = render(&ErrorPage {
        nav: None,
        title: "Not found".to_owned(),
        detail: "There is no such console page.".to_owned(),
    });
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// Query of the sends list.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SendsQuery {
    /// A status name, or empty for all.
    #[serde(default)]
    status: String,
    /// A sender, or empty for all.
    #[serde(default)]
    sender: String,
    /// A message id to open.
    #[serde(default)]
    id: String,
    /// Ids below this one (the next page).
    #[serde(default)]
    before: Option<u64>,
}

/// The sends list: newest first over every home shard, filtered.
pub(crate) async fn sends(
    State(console): State<Arc<Console>>,
    CurrentSession(session): CurrentSession,
    Query(query): Query<SendsQuery>,
) -> Response {
    let nav = session.nav("sends");
    let id = query.id.trim();
    if !id.is_empty() {
        return match id.parse::<u64>() {
            Ok(id) if id > 0 => Redirect::to(&format!("/console/sends/{id}")).into_response(),
            _ => error_page(Some(nav), &Error::invalid("id", "must be a message id (a number)")),
        };
    }
    let status = match query.status.as_str() {
        "" => None,
        name => match STATUSES.iter().position(|s| *s == name) {
            Some(_) => Some(status_code(name)),
            None => {
                return error_page(
                    Some(nav),
                    &Error::invalid("status", &format!("must be one of {}", STATUSES.join(", "))),
                );
            }
        },
    };
    let sender = query.sender.trim();
    let filter =
        SendFilter { status, sender: (!sender.is_empty()).then_some(sender), client: None };
    let before = query.before.unwrap_or(u64::MAX);
    match lookups::recent_sends(&console.ctx, &filter, before, SENDS_PAGE).await {
        Ok(views) => {
            let next_page = (views.len() == SENDS_PAGE as usize).then(|| {
                let last = views.last().map_or(0, |v| v.row.message_id);
                let mut query = form_urlencoded::Serializer::new(String::new());
                query.append_pair("status", &query_status(status)).append_pair("sender", sender);
                query.append_pair("before", &last.to_string());
                query.finish()
            });
            render(&SendsPage {
                nav,
                rows: views.iter().map(SendRow::new).collect(),
                status: query.status,
                sender: sender.to_owned(),
                statuses: STATUSES,
                next_page,
            })
        }
        Err(e) => error_page(Some(nav), &e),
    }
}

fn status_code(name: &str) -> u8 {
    [
        SendStatus::NotStarted,
        SendStatus::Sending,
        SendStatus::Paused,
        SendStatus::Completed,
        SendStatus::Cancelled,
        SendStatus::Recalled,
    ]
    .into_iter()
    .find(|s| s.name() == name)
    .map_or(u8::MAX, |s| s as u8)
}

fn query_status(status: Option<u8>) -> String {
    status
        .and_then(|s| SendStatus::from_db(s).ok())
        .map(|s| s.name().to_owned())
        .unwrap_or_default()
}

/// Query of a send's page.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SendQuery {
    /// What the last button press did (`paused`, ...).
    #[serde(default)]
    done: String,
    /// The recipients' state listed (`all` when empty).
    #[serde(default)]
    state: String,
    /// The recipients page token to list after.
    #[serde(default)]
    after: String,
    /// User ids to look up among the recipients (commas or spaces).
    #[serde(default)]
    users: String,
    /// A user id to render a templated send's sample for.
    #[serde(default)]
    sample: String,
}

/// Recipients listed on a send's page.
const RECIPIENTS_PAGE: u32 = 50;

/// The states the recipients list shows, as the console names them.
const RECIPIENT_FILTERS: &[&str] = &[
    "all",
    "delivered",
    "read",
    "unread",
    "pending",
    "failed",
    "suppressed",
    "cancelled",
    "recalled",
];

fn recipient_filter(name: &str) -> Option<recipients::Filter> {
    use recipients::Filter as F;
    Some(match name {
        "" | "all" => F::All,
        "delivered" => F::Delivered,
        "read" => F::Read,
        "unread" => F::Unread,
        "pending" => F::Pending,
        "failed" => F::Failed,
        "suppressed" => F::Suppressed,
        "cancelled" => F::Cancelled,
        "recalled" => F::Recalled,
        _ => return None,
    })
}

/// The recipients section: a page of the chosen state (the query the API's
/// `ListRecipients` answers) and the users looked up (`GetRecipientStatus`).
async fn recipients_view(ctx: &Context, id: MessageId, query: &SendQuery) -> RecipientsView {
    let mut view = RecipientsView {
        filter: if query.state.is_empty() { "all".to_owned() } else { query.state.clone() },
        filters: RECIPIENT_FILTERS,
        after: query.after.clone(),
        page_size: RECIPIENTS_PAGE,
        check: query.users.clone(),
        ..RecipientsView::default()
    };
    let Some(filter) = recipient_filter(&query.state) else {
        let reason = format!("must be one of {}", RECIPIENT_FILTERS.join(", "));
        view.error = Error::invalid("state", &reason).to_string();
        return view;
    };
    let users: Result<Vec<u64>, _> = query
        .users
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|part| !part.is_empty())
        .map(str::parse::<u64>)
        .collect();
    let Ok(users) = users else {
        view.error = Error::invalid("users", "must be user ids (numbers)").to_string();
        return view;
    };
    let page = recipients::list(ctx, id, None, filter, RECIPIENTS_PAGE, &query.after);
    let statuses = async {
        if users.is_empty() {
            Ok(Vec::new())
        } else {
            recipients::status(ctx, id, None, &users).await
        }
    };
    let (page, statuses) = futures::future::join(page, statuses).await;
    match page {
        Ok(page) => {
            view.rows = page.recipients.iter().map(RecipientLine::new).collect();
            view.next = (!page.next_page_token.is_empty()).then(|| {
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("state", &view.filter)
                    .append_pair("after", &page.next_page_token)
                    .finish()
            });
        }
        Err(e) => view.error = e.to_string(),
    }
    match statuses {
        Ok(found) => view.statuses = found.iter().map(RecipientLine::new).collect(),
        Err(e) => view.error = e.to_string(),
    }
    view
}

/// The buttons a send in `status` offers.
fn actions(view: &MessageView, manage: bool) -> Vec<Action> {
    if !manage {
        return Vec::new();
    }
    let row = &view.row;
    let Ok(status) = row.status() else { return Vec::new() };
    let announcement = row.audience == AudienceKind::AllUsers as u8;
    let recipients = if announcement {
        "every user".to_owned()
    } else {
        format!("{} recipients", group_digits(view.progress.unwrap_or_default().total))
    };
    let named = format!("send {} (\u{201c}{}\u{201d}) to {recipients}", row.message_id, row.title);
    let action = |name, label, confirm: String, danger| Action { name, label, confirm, danger };
    let mut actions = Vec::new();
    match status {
        SendStatus::Sending if !announcement => {
            actions.push(action("pause", "Pause", format!("Pause {named}?"), false));
        }
        SendStatus::Paused => {
            actions.push(action("resume", "Resume", format!("Resume {named}?"), false));
        }
        SendStatus::Completed if !announcement && view.progress.is_some_and(|p| p.failed > 0) => {
            let failed = group_digits(view.progress.unwrap_or_default().failed);
            actions.push(action(
                "redrive",
                "Redrive failed",
                format!("Deliver again to the {failed} failed recipients of {named}?"),
                false,
            ));
        }
        _ => {}
    }
    if matches!(status, SendStatus::NotStarted | SendStatus::Sending | SendStatus::Paused) {
        actions.push(action(
            "cancel",
            "Cancel",
            format!("Cancel {named}? Recipients not yet reached will not get it."),
            true,
        ));
    }
    if status != SendStatus::Recalled {
        actions.push(action(
            "recall",
            "Recall",
            format!("Recall {named}? It is taken out of every inbox, read or not."),
            true,
        ));
    }
    actions
}

/// The moments of a send's life: its record's times and the lifecycle
/// calls that succeeded, oldest first.
fn timeline(view: &MessageView, audit: &[AuditRow]) -> Vec<Moment> {
    let row = &view.row;
    let mut moments = vec![(row.created_at, "created".to_owned())];
    if let Some(at) = row.send_at {
        moments.push((at, "scheduled start".to_owned()));
    }
    if let Some(at) = row.started_at {
        moments.push((at, "started".to_owned()));
    }
    for record in audit.iter().filter(|r| r.outcome == "ok") {
        let what = match record.action.as_str() {
            "message.pause" => "paused",
            "message.resume" => "resumed",
            "message.redrive" => "redriven",
            "message.cancel" => "cancel requested",
            "message.recall" => "recall requested",
            "message.edit" => "edited",
            _ => continue,
        };
        moments.push((record.at, format!("{what} by {}", record.client)));
    }
    if let Some(at) = row.finished_at {
        let what = match row.status() {
            Ok(SendStatus::Completed) => "completed",
            Ok(SendStatus::Cancelled) => "cancelled",
            Ok(SendStatus::Recalled) => "recalled from every inbox",
            _ => "finished",
        };
        moments.push((at, what.to_owned()));
    }
    moments.sort_by_key(|(at, _)| *at);
    moments.into_iter().map(|(at, what)| Moment { at: when(Some(at)), what }).collect()
}

/// One send's page.
pub(crate) async fn send(
    State(console): State<Arc<Console>>,
    CurrentSession(session): CurrentSession,
    Path(id): Path<String>,
    Query(query): Query<SendQuery>,
) -> Response {
    let nav = session.nav("sends");
    let id = match parse_message_id(&id) {
        Ok(id) => id,
        Err(e) => return error_page(Some(nav), &e),
    };
    let rendered_at_ms = chrono::Utc::now().timestamp_millis();
    let ctx = &console.ctx;
    let view = match send::get(ctx, id, None).await {
        Ok(view) => view,
        Err(e) => return error_page(Some(nav), &e),
    };
    let records =
        audit::list(ctx, audit::Filter::Target(Target::Message(id.get())), 0, AUDIT_LINES);
    let (live, records) = match futures::future::try_join(
        lookups::live(ctx, id, view.row.audience, LiveReader::Page),
        records,
    )
    .await
    {
        Ok(read) => read,
        Err(e) => return error_page(Some(nav), &e),
    };
    let Some(live) = live else {
        return error_page(Some(nav), &Error::NotFound(format!("message {id}")));
    };
    let mut page = send_page(nav, &view, &live, &records, &session, &query.done);
    page.recipients = recipients_view(ctx, id, &query).await;
    page.template = template_view(ctx, &view.row, &query.sample).await;
    page.rendered_at_ms = rendered_at_ms;
    render(&page)
}

/// A templated send's template, with a sample for the user typed (if any).
async fn template_view(ctx: &Context, row: &MessageRow, sample_user: &str) -> Option<TemplateView> {
    let template = row.content().template?;
    let mut view = TemplateView {
        vars: template.vars.clone().into_iter().collect(),
        recipient_vars: template.recipient_vars.iter().cloned().collect::<Vec<_>>().join(", "),
        translations: template
            .translations
            .iter()
            .map(|(tag, t)| (tag.clone(), t.title.clone(), t.body.clone()))
            .collect(),
        sample_user: sample_user.trim().to_owned(),
        ..TemplateView::default()
    };
    if view.sample_user.is_empty() {
        return Some(view);
    }
    let user = view
        .sample_user
        .parse()
        .map_err(|_| Error::invalid("sample", "is not a user id"))
        .and_then(|raw| UserId::parse(raw, "sample"));
    let sampled = match user {
        Ok(user) => lookups::sample(ctx, row, user).await,
        Err(e) => Err(e),
    };
    match sampled {
        Ok(Some(sample)) => {
            view.sample = Some(SampleView {
                locale: sample.locale,
                variant: sample.variant.unwrap_or_else(|| "default".to_owned()),
                has_item: sample.has_item,
                title: sample.rendered.title,
                body: sample.rendered.body,
                data: sample.rendered.data.into_iter().collect(),
            })
        }
        Ok(None) => {}
        Err(e) => view.sample_error = e.to_string(),
    }
    Some(view)
}

fn send_page(
    nav: Nav,
    view: &MessageView,
    live: &LiveProgress,
    records: &[AuditRow],
    session: &Session,
    done: &str,
) -> SendPage {
    let row = &view.row;
    let data: Vec<(String, String)> = serde_json::from_str::<serde_json::Map<_, _>>(&row.data)
        .map(|map| {
            map.into_iter()
                .map(|(k, v)| (k, v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
                .collect()
        })
        .unwrap_or_default();
    let shards = live
        .shards
        .iter()
        .map(|(shard, p)| ShardBar {
            shard: shard.0,
            total: group_digits(p.total),
            delivered: group_digits(p.delivered),
            bar: Bar::new(p),
        })
        .collect();
    let notice = match done {
        "pause" => "Paused: workers skip its chunks until it is resumed.",
        "resume" => "Resumed: its pending chunks were queued again.",
        "cancel" => "Cancelled: recipients not yet reached will not get it.",
        "redrive" => "Redriven: its failed chunks were queued again.",
        "recall" => "Recalled: its items are being taken out of every inbox.",
        _ => "",
    };
    SendPage {
        nav,
        send: SendRow::new(view),
        body: row.body.clone(),
        data,
        priority: if row.priority >= 2 { "high" } else { "normal" },
        critical: row.critical,
        paused: live.status == SendStatus::Paused,
        live: !live.finished,
        shards,
        timeline: timeline(view, records),
        audit: records
            .iter()
            .map(|r| AuditLine {
                at: when(Some(r.at)),
                client: r.client.clone(),
                action: r.action.clone(),
                outcome: r.outcome.clone(),
                detail: r.detail.clone(),
            })
            .collect(),
        actions: actions(view, session.manage),
        read_only: !session.manage,
        notice: notice.to_owned(),
        recipients: RecipientsView::default(),
        rendered_at_ms: 0,
        template: None,
    }
}

fn parse_message_id(raw: &str) -> notify_domain::Result<MessageId> {
    let raw: u64 = raw.parse().map_err(|_| Error::invalid("message_id", "must be a number"))?;
    MessageId::parse(raw, "message_id")
}

/// A button's form.
#[derive(Debug, Deserialize)]
pub(crate) struct ActionForm {
    #[serde(default)]
    csrf: String,
}

/// Presses a lifecycle button: same-origin POST with the session's token,
/// `console.manage` required; audited as the gRPC call it stands for, with
/// the session's client and `via console`.
pub(crate) async fn act(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    CurrentSession(session): CurrentSession,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Err(refused) = check_csrf(&headers, &session, &form.csrf) {
        return refused.into_response();
    }
    let nav = session.nav("sends");
    let id = match parse_message_id(&id) {
        Ok(id) => id,
        Err(e) => return error_page(Some(nav), &e),
    };
    let ctx = &console.ctx;
    let Some(audit_action) = [
        ("pause", "message.pause"),
        ("resume", "message.resume"),
        ("cancel", "message.cancel"),
        ("redrive", "message.redrive"),
        ("recall", "message.recall"),
    ]
    .into_iter()
    .find_map(|(name, audited)| (name == action).then_some(audited)) else {
        return not_found();
    };
    if !session.manage {
        let result: notify_domain::Result<()> =
            Err(Error::PermissionDenied("console.manage is required to change a send".to_owned()));
        audit::record(
            ctx,
            audit::Entry {
                client: &session.client,
                action: audit_action,
                target: Target::Message(id.get()),
                outcome: audit::outcome_of(&result),
                detail: "via console; lacks console.manage".to_owned(),
            },
        )
        .await;
        let mut response = render(&ErrorPage {
            nav: Some(nav),
            title: "Not allowed".to_owned(),
            detail: format!(
                "Client {} may look but not change sends: its token lacks the scope \
                 console.manage (or admin).",
                session.client
            ),
        });
        *response.status_mut() = StatusCode::FORBIDDEN;
        return response;
    }
    // The action and its record run to the end even if the browser goes
    // away meanwhile (a closed tab drops this handler, not the change).
    let ctx = ctx.clone();
    let client = session.client.clone();
    let verb = action.clone();
    let pressed = tokio::spawn(async move {
        let result = match verb.as_str() {
            "pause" => send::pause(&ctx, id, None).await,
            "resume" => send::resume(&ctx, id, None).await,
            "cancel" => send::cancel(&ctx, id, None).await,
            "redrive" => send::redrive(&ctx, id, None).await,
            _ => recall::recall(&ctx, id, None).await,
        };
        let outcome = audit::outcome_of(&result);
        let entry = audit::Entry {
            client: &client,
            action: audit_action,
            target: Target::Message(id.get()),
            outcome,
            detail: "via console".to_owned(),
        };
        audit::record(&ctx, entry).await;
        metrics::counter!("notify_console_actions_total", "action" => audit_action, "outcome" => outcome)
            .increment(1);
        result.map(|_| ())
    });
    match pressed.await {
        Ok(Ok(())) => Redirect::to(&format!("/console/sends/{id}?done={action}")).into_response(),
        Ok(Err(e)) => error_page(Some(nav), &e),
        Err(e) => error_page(Some(nav), &Error::Internal(format!("the action failed: {e}"))),
    }
}

/// Query of the user page.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct UserQuery {
    #[serde(default)]
    user_id: String,
    #[serde(default)]
    view: String,
    /// Items with ids below this one (the older pages).
    #[serde(default)]
    before: Option<u64>,
}

/// A user's badge, groups, preferences and newest items.
pub(crate) async fn user(
    State(console): State<Arc<Console>>,
    CurrentSession(session): CurrentSession,
    Query(query): Query<UserQuery>,
) -> Response {
    let nav = session.nav("users");
    let raw = query.user_id.trim();
    let view = match query.view.as_str() {
        "" | "inbox" => View::Inbox,
        "archive" => View::Archive,
        "all" => View::All,
        _ => {
            return error_page(Some(nav), &Error::invalid("view", "must be inbox, archive or all"));
        }
    };
    let mut page = UserPage {
        nav,
        user_id: None,
        query: raw.to_owned(),
        view: view.name().to_owned(),
        unread: 0,
        unseen: 0,
        group_unread: "0".to_owned(),
        items: Vec::new(),
        groups: Vec::new(),
        muted_categories: Vec::new(),
        muted_groups: Vec::new(),
        locale: String::new(),
        older: None,
        newer: query.before.is_some(),
    };
    if raw.is_empty() {
        return render(&page);
    }
    let user_id = match raw
        .parse::<u64>()
        .map_err(|_| Error::invalid("user_id", "must be a number"))
        .and_then(|id| UserId::parse(id, "user_id"))
    {
        Ok(id) => id,
        Err(e) => return error_page(Some(page.nav), &e),
    };
    let before = query.before.unwrap_or(u64::MAX);
    let state = match lookups::user(&console.ctx, user_id, view, before, USER_ITEMS).await {
        Ok(state) => state,
        Err(e) => return error_page(Some(page.nav), &e),
    };
    page.user_id = Some(user_id.get());
    page.older = (state.items.len() == USER_ITEMS as usize)
        .then(|| state.items.last().map(|item| item.message_id))
        .flatten();
    page.unread = state.badge.unread;
    page.unseen = state.badge.unseen;
    page.group_unread = state.badge.group_unread.map_or_else(|| "unknown".to_owned(), group_digits);
    page.items = state
        .items
        .iter()
        .map(|item| {
            let mut state = Vec::new();
            state.push(if item.is_read { "read" } else { "unread" });
            if item.is_seen && !item.is_read {
                state.push("seen");
            }
            if item.is_archived {
                state.push("archived");
            }
            if item.edited_at.is_some() {
                state.push("edited");
            }
            ItemLine {
                id: item.message_id,
                title: item.title.clone(),
                category: item.category.clone(),
                created: when(Some(item.created_at)),
                unread: !item.is_read,
                state: state.join(", "),
            }
        })
        .collect();
    let muted_groups = &state.preferences.muted_group_ids;
    page.groups = state
        .groups
        .groups
        .iter()
        .map(|g| GroupLine {
            id: g.group_id,
            unread: g.unread,
            max_seq: g.max_seq,
            last_ack_seq: g.last_ack_seq,
            muted: muted_groups.binary_search(&g.group_id).is_ok(),
        })
        .collect();
    page.muted_categories = state.preferences.muted_categories.clone();
    page.muted_groups = muted_groups.clone();
    page.locale =
        state.preferences.locale.as_ref().map(|l| l.as_str().to_owned()).unwrap_or_default();
    render(&page)
}

/// Query of the group page.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct GroupQuery {
    #[serde(default)]
    group_id: String,
}

/// A group's members count, max seq and recent messages.
pub(crate) async fn group(
    State(console): State<Arc<Console>>,
    CurrentSession(session): CurrentSession,
    Query(query): Query<GroupQuery>,
) -> Response {
    let nav = session.nav("groups");
    let raw = query.group_id.trim();
    let mut page = GroupPage {
        nav,
        group_id: None,
        query: raw.to_owned(),
        name: String::new(),
        created: String::new(),
        members: 0,
        max_seq: 0,
        recent: Vec::new(),
    };
    if raw.is_empty() {
        return render(&page);
    }
    let group_id = match raw.parse::<u64>() {
        Ok(id) if id > 0 => id,
        _ => {
            return error_page(
                Some(page.nav),
                &Error::invalid("group_id", "must be a group id (a number above 0)"),
            );
        }
    };
    let state = match lookups::group(&console.ctx, group_id, GROUP_MESSAGES).await {
        Ok(Some(state)) => state,
        Ok(None) => {
            return error_page(Some(page.nav), &Error::NotFound(format!("group {group_id}")));
        }
        Err(e) => return error_page(Some(page.nav), &e),
    };
    page.group_id = Some(group_id);
    page.name = state.group.name.clone();
    page.created = when(Some(state.group.created_at));
    page.members = state.members;
    page.max_seq = state.max_seq;
    page.recent = state
        .recent
        .iter()
        .map(|m| GroupMessageLine {
            seq: m.seq,
            id: m.message_id,
            sender: m.sender.clone(),
            title: m.title.clone(),
            created: when(Some(m.created_at)),
            recalled: m.recalled_at.map(|at| when(Some(at))).unwrap_or_default(),
        })
        .collect();
    render(&page)
}

/// The shard map in force, every replica's report and the bucket move.
pub(crate) async fn shards(
    State(console): State<Arc<Console>>,
    CurrentSession(session): CurrentSession,
) -> Response {
    let nav = session.nav("shards");
    let overview = match lookups::shards(&console.ctx).await {
        Ok(overview) => overview,
        Err(e) => return error_page(Some(nav), &e),
    };
    let Some(stored) = overview.map else {
        return error_page(Some(nav), &Error::NotFound("a stored shard map".to_owned()));
    };
    let ranges = stored.map.ranges();
    let buckets_total: u32 = ranges.iter().map(|r| r.to - r.from + 1).sum();
    let shards = stored
        .map
        .shards()
        .iter()
        .map(|shard| {
            let owned: Vec<_> = ranges.iter().filter(|r| r.shard == *shard).collect();
            let buckets: u32 = owned.iter().map(|r| r.to - r.from + 1).sum();
            let ranges: Vec<String> =
                owned.iter().map(|r| format!("{}..={}", r.from, r.to)).collect();
            ShardLine {
                shard: shard.0,
                buckets,
                ranges: if ranges.is_empty() { "none".to_owned() } else { ranges.join(", ") },
                percent: percent(u64::from(buckets), u64::from(buckets_total)),
            }
        })
        .collect();
    let replicas = overview
        .replicas
        .iter()
        .map(|r| {
            let notes = r.notes(stored.version);
            ReplicaLine {
                replica: r.replica.clone(),
                role: r.role.clone(),
                version: r.version,
                schema: if r.schema_version > 0 {
                    r.schema_version.to_string()
                } else {
                    "not reported".to_owned()
                },
                age: format!("{:.1} s", r.age_secs),
                notes: notes.join(", "),
            }
        })
        .collect();
    let moving = overview.active_move.map(|m| {
        let buckets = u64::from(m.to_bucket - m.from_bucket) + 1;
        let flipped = u64::try_from(m.flipped_to - i32::from(m.from_bucket) + 1).unwrap_or(0);
        (
            format!(
                "move {}: buckets {}..={} to shard {}, {} ({} rows copied, longest freeze {} ms{})",
                m.move_id,
                m.from_bucket,
                m.to_bucket,
                m.target,
                m.state,
                group_digits(m.rows_copied),
                m.longest_freeze_ms,
                if m.detail.is_empty() { String::new() } else { format!("; {}", m.detail) },
            ),
            percent(flipped.min(buckets), buckets),
        )
    });
    render(&ShardsPage {
        nav,
        version: stored.version,
        shards,
        frozen: stored.frozen.to_string(),
        reason: stored.reason.clone(),
        created: when(Some(stored.created_at)),
        replicas,
        moving,
    })
}

#[cfg(test)]
mod tests {
    use super::super::views::group_digits;

    #[test]
    fn digits_are_grouped_by_thousands() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(1_234_567), "1,234,567");
    }
}
