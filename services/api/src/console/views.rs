//! The console's pages: askama templates (`templates/console/`, compiled
//! into the binary, HTML-escaped) and the plain data they show.

use askama::Template;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::NaiveDateTime;
use notify_core::recipients;
use notify_core::send::{MessageView, Progress};
use notify_domain::domain::{AudienceKind, SendStatus};

/// Renders a page as HTML (a 500 when a template fails, which a test of
/// every page would catch first).
pub(crate) fn render<T: Template>(page: &T) -> Response {
    match page.render() {
        Ok(html) => ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "console template failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page could not be rendered").into_response()
        }
    }
}

/// A time as the console shows it (UTC, to the second).
pub(crate) fn when(at: Option<NaiveDateTime>) -> String {
    at.map(|at| at.format("%Y-%m-%d %H:%M:%S UTC").to_string()).unwrap_or_default()
}

/// `part` of `whole` in percent, one decimal.
pub(crate) fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0".to_owned();
    }
    format!("{:.1}", part as f64 * 100.0 / whole as f64)
}

/// A stacked progress bar (an inline SVG: widths are attributes, which the
/// Content-Security-Policy allows where it refuses inline styles), in
/// percent of the recipients: delivered, failed, held back, cancelled.
#[derive(Debug, Clone)]
pub(crate) struct Bar {
    pub label: String,
    pub delivered: String,
    pub failed_x: String,
    pub failed: String,
    pub suppressed_x: String,
    pub suppressed: String,
    pub cancelled_x: String,
    pub cancelled: String,
}

impl Bar {
    pub(crate) fn new(p: &Progress) -> Self {
        let share = |n: u64| if p.total == 0 { 0.0 } else { n as f64 * 100.0 / p.total as f64 };
        let parts = [share(p.delivered), share(p.failed), share(p.suppressed), share(p.cancelled)];
        let mut x = 0.0;
        let mut at = [0.0; 4];
        for (i, part) in parts.iter().enumerate() {
            at[i] = x;
            x += part;
        }
        let f = |v: f64| format!("{:.2}", v.min(100.0));
        Self {
            label: format!(
                "{} of {} delivered, {} failed, {} held back, {} cancelled, {} pending",
                p.delivered, p.total, p.failed, p.suppressed, p.cancelled, p.pending
            ),
            delivered: f(parts[0]),
            failed_x: f(at[1]),
            failed: f(parts[1]),
            suppressed_x: f(at[2]),
            suppressed: f(parts[2]),
            cancelled_x: f(at[3]),
            cancelled: f(parts[3]),
        }
    }
}

/// A send's counters as text (`1,234`).
#[derive(Debug, Clone)]
pub(crate) struct CountsText {
    pub total: String,
    pub delivered: String,
    pub read: String,
    pub pending: String,
    pub failed: String,
    pub cancelled: String,
    pub suppressed: String,
    pub recalled: String,
}

impl CountsText {
    pub(crate) fn new(p: &Progress) -> Self {
        Self {
            total: group_digits(p.total),
            delivered: group_digits(p.delivered),
            read: group_digits(p.read),
            pending: group_digits(p.pending),
            failed: group_digits(p.failed),
            cancelled: group_digits(p.cancelled),
            suppressed: group_digits(p.suppressed),
            recalled: group_digits(p.recalled),
        }
    }
}

/// `1234567` as `1,234,567`.
pub(crate) fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What every page's header needs of the session (`Session::nav`).
#[derive(Debug, Clone)]
pub(crate) struct Nav {
    /// The logged-in client.
    pub client: String,
    /// The logout form's token.
    pub csrf: String,
    /// Which tab is open.
    pub tab: &'static str,
}

/// The login page.
#[derive(Template)]
#[template(path = "console/login.html")]
pub(crate) struct LoginPage {
    pub next: String,
    pub error: String,
    pub auth_off: bool,
}

/// An error page (unknown send, user, group; a backend down).
#[derive(Template)]
#[template(path = "console/error.html")]
pub(crate) struct ErrorPage {
    pub nav: Option<Nav>,
    pub title: String,
    pub detail: String,
}

/// One send in a list or on its page.
#[derive(Debug, Clone)]
pub(crate) struct SendRow {
    pub id: u64,
    pub status: &'static str,
    pub sender: String,
    pub client: String,
    pub audience: &'static str,
    pub title: String,
    pub category: String,
    pub created: String,
    /// Recipients (or, for an announcement, users who have it so far).
    pub total: String,
    /// Every counter, digits grouped as the live updates show them.
    pub counts: CountsText,
    /// Its bar.
    pub bar: Bar,
    /// Delivered, failed, suppressed and cancelled of the total, in percent.
    pub done_percent: String,
    /// Read of delivered, in percent.
    pub read_percent: String,
}

impl SendRow {
    pub(crate) fn new(view: &MessageView) -> Self {
        let row = &view.row;
        let status = row.status().map_or("unknown", SendStatus::name);
        let audience =
            if row.audience == AudienceKind::AllUsers as u8 { "all users" } else { "users" };
        let p = view.progress.unwrap_or_default();
        let finished = p.delivered + p.failed + p.suppressed + p.cancelled;
        Self {
            id: row.message_id,
            status,
            sender: row.sender.clone(),
            client: row.client.clone(),
            audience,
            title: row.title.clone(),
            category: row.category.clone(),
            created: when(Some(row.created_at)),
            total: group_digits(p.total),
            counts: CountsText::new(&p),
            bar: Bar::new(&p),
            done_percent: percent(finished, p.total),
            read_percent: percent(p.read, p.delivered),
        }
    }
}

/// The sends list.
#[derive(Template)]
#[template(path = "console/sends.html")]
pub(crate) struct SendsPage {
    pub nav: Nav,
    pub rows: Vec<SendRow>,
    pub status: String,
    pub sender: String,
    pub statuses: &'static [&'static str],
    /// The query of the next page, when there is one.
    pub next_page: Option<String>,
}

/// One shard's bar on a send's page.
#[derive(Debug, Clone)]
pub(crate) struct ShardBar {
    pub shard: u32,
    pub total: String,
    pub delivered: String,
    pub bar: Bar,
}

/// A moment of a send's life.
#[derive(Debug, Clone)]
pub(crate) struct Moment {
    pub at: String,
    pub what: String,
}

/// An audit record as shown.
#[derive(Debug, Clone)]
pub(crate) struct AuditLine {
    pub at: String,
    pub client: String,
    pub action: String,
    pub outcome: String,
    pub detail: String,
}

/// A lifecycle button.
#[derive(Debug, Clone)]
pub(crate) struct Action {
    /// The path segment (`pause`).
    pub name: &'static str,
    /// The button's text.
    pub label: &'static str,
    /// What the confirmation asks.
    pub confirm: String,
    /// Styled as dangerous (cancel, recall).
    pub danger: bool,
}

/// One send's page.
#[derive(Template)]
#[template(path = "console/send.html")]
pub(crate) struct SendPage {
    pub nav: Nav,
    pub send: SendRow,
    pub body: String,
    pub data: Vec<(String, String)>,
    pub priority: &'static str,
    pub critical: bool,
    pub paused: bool,
    pub live: bool,
    pub shards: Vec<ShardBar>,
    pub timeline: Vec<Moment>,
    pub audit: Vec<AuditLine>,
    pub actions: Vec<Action>,
    /// The session may look but not press buttons.
    pub read_only: bool,
    /// A notice after a button press (`paused`, or why it failed).
    pub notice: String,
    pub recipients: RecipientsView,
    /// When the handler began reading the send (Unix ms): live updates
    /// read before it are older than the page.
    pub rendered_at_ms: i64,
    /// The content's template, when it is one.
    pub template: Option<TemplateView>,
}

/// A templated send's template as shown, with a sample rendered for one
/// user.
#[derive(Debug, Clone, Default)]
pub(crate) struct TemplateView {
    /// Send-wide vars.
    pub vars: Vec<(String, String)>,
    /// The variables each recipient carries.
    pub recipient_vars: String,
    /// Translations: language, title, body.
    pub translations: Vec<(String, String, String)>,
    /// The user id typed for a sample ('' when none).
    pub sample_user: String,
    /// The sample, or why there is none.
    pub sample: Option<SampleView>,
    /// Why the sample could not be made ('' when it was, or none was asked).
    pub sample_error: String,
}

/// A templated send rendered for one user.
#[derive(Debug, Clone, Default)]
pub(crate) struct SampleView {
    pub locale: String,
    pub variant: String,
    pub has_item: bool,
    pub title: String,
    pub body: String,
    pub data: Vec<(String, String)>,
}

/// One recipient of a send as shown.
#[derive(Debug, Clone)]
pub(crate) struct RecipientLine {
    pub user_id: u64,
    pub state: &'static str,
    pub delivered: String,
    pub read: String,
}

impl RecipientLine {
    pub(crate) fn new(r: &recipients::Recipient) -> Self {
        Self {
            user_id: r.user_id,
            state: state_name(r.state),
            delivered: when(r.delivered_at),
            read: when(r.read_at),
        }
    }
}

/// How the console names a recipient's state.
pub(crate) fn state_name(state: recipients::RecipientState) -> &'static str {
    use recipients::RecipientState as S;
    match state {
        S::Unread => "unread",
        S::Read => "read",
        S::Pending => "pending",
        S::Failed => "failed",
        S::Suppressed => "suppressed",
        S::Cancelled => "cancelled",
        S::Recalled => "recalled",
        S::NotARecipient => "not a recipient",
    }
}

/// The recipients section of a send's page: a page of one state, and the
/// states of the users looked up.
#[derive(Debug, Clone, Default)]
pub(crate) struct RecipientsView {
    /// The state listed.
    pub filter: String,
    /// Every state the list can show.
    pub filters: &'static [&'static str],
    /// The page token this page started after ("" on the first).
    pub after: String,
    pub rows: Vec<RecipientLine>,
    /// The query of the next page.
    pub next: Option<String>,
    pub page_size: u32,
    /// The user ids looked up, as typed.
    pub check: String,
    pub statuses: Vec<RecipientLine>,
    /// Why the list or the look-up failed.
    pub error: String,
}

/// A user's item as shown.
#[derive(Debug, Clone)]
pub(crate) struct ItemLine {
    pub id: u64,
    pub title: String,
    pub category: String,
    pub created: String,
    pub unread: bool,
    pub state: String,
}

/// A user's group as shown.
#[derive(Debug, Clone)]
pub(crate) struct GroupLine {
    pub id: u64,
    pub unread: u64,
    pub max_seq: u64,
    pub last_ack_seq: u64,
    pub muted: bool,
}

/// A user's page.
#[derive(Template)]
#[template(path = "console/user.html")]
pub(crate) struct UserPage {
    pub nav: Nav,
    pub user_id: Option<u64>,
    /// What was typed in the search box.
    pub query: String,
    pub view: String,
    pub unread: u64,
    pub unseen: u64,
    /// "unknown" when a group's home shard could not be read.
    pub group_unread: String,
    pub items: Vec<ItemLine>,
    pub groups: Vec<GroupLine>,
    pub muted_categories: Vec<String>,
    pub muted_groups: Vec<u64>,
    /// The user's language ("" when not set).
    pub locale: String,
    /// The cursor of the next, older page of items.
    pub older: Option<u64>,
    /// This is not the newest page.
    pub newer: bool,
}

/// A group message as shown.
#[derive(Debug, Clone)]
pub(crate) struct GroupMessageLine {
    pub seq: u64,
    pub id: u64,
    pub sender: String,
    pub title: String,
    pub created: String,
    /// When it was recalled (a tombstone), or empty.
    pub recalled: String,
}

/// A group's page.
#[derive(Template)]
#[template(path = "console/group.html")]
pub(crate) struct GroupPage {
    pub nav: Nav,
    pub group_id: Option<u64>,
    /// What was typed in the search box.
    pub query: String,
    pub name: String,
    pub created: String,
    pub members: u64,
    pub max_seq: u64,
    pub recent: Vec<GroupMessageLine>,
}

/// A replica's report as shown.
#[derive(Debug, Clone)]
pub(crate) struct ReplicaLine {
    pub replica: String,
    pub role: String,
    pub version: u64,
    /// The newest migration of its build (what the contract step waits on).
    pub schema: String,
    pub age: String,
    /// Behind, refused a version, an older build, gone?
    pub notes: String,
}

/// One shard's buckets as shown.
#[derive(Debug, Clone)]
pub(crate) struct ShardLine {
    pub shard: u32,
    pub buckets: u32,
    pub ranges: String,
    /// Its share of the buckets, percent.
    pub percent: String,
}

/// The shards page.
#[derive(Template)]
#[template(path = "console/shards.html")]
pub(crate) struct ShardsPage {
    pub nav: Nav,
    pub version: u64,
    pub shards: Vec<ShardLine>,
    pub frozen: String,
    pub reason: String,
    pub created: String,
    pub replicas: Vec<ReplicaLine>,
    /// The bucket move under way: a summary and how far it got, percent.
    pub moving: Option<(String, String)>,
}
