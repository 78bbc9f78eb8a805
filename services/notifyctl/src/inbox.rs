//! `inbox`, `items`, `prefs` and `badge`.

use crate::connect::Api;
use chrono::DateTime;
use clap::{Args, ValueEnum};
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;

/// Arguments of `notifyctl inbox`.
#[derive(Debug, Args)]
pub struct InboxArgs {
    /// User id.
    user_id: u64,
    /// Only unread items.
    #[arg(long, conflicts_with = "read")]
    unread: bool,
    /// Only read items.
    #[arg(long)]
    read: bool,
    /// Only this category.
    #[arg(long, default_value = "")]
    category: String,
    /// The archive instead of the inbox.
    #[arg(long, conflicts_with = "everything")]
    archive: bool,
    /// The inbox and the archive together.
    #[arg(long)]
    everything: bool,
    /// Items per page.
    #[arg(long, default_value_t = 20)]
    limit: u32,
    /// Page token from a previous page.
    #[arg(long, default_value = "")]
    page_token: String,
}

fn view(archive: bool, everything: bool) -> v1::InboxView {
    match (archive, everything) {
        (true, _) => v1::InboxView::Archive,
        (_, true) => v1::InboxView::All,
        _ => v1::InboxView::Inbox,
    }
}

/// Prints one inbox page: `*` unread, `+` unseen, `A` archived.
pub async fn inbox(channel: Api, args: InboxArgs) -> anyhow::Result<()> {
    let mut client = InboxServiceClient::new(channel);
    let page = client
        .list_inbox(v1::ListInboxRequest {
            user_id: args.user_id,
            page_size: args.limit,
            page_token: args.page_token,
            unread_only: args.unread,
            category: args.category,
            view: view(args.archive, args.everything) as i32,
            read_only: args.read,
        })
        .await?
        .into_inner();
    for item in &page.items {
        let content = item.content.clone().unwrap_or_default();
        let at = rfc3339(item.created_at);
        let marks = format!(
            "{}{}{}",
            if item.read { " " } else { "*" },
            if item.seen { " " } else { "+" },
            if item.archived { "A" } else { " " }
        );
        println!("{marks} {} {at} [{}] {}", item.message_id, content.category, content.title);
    }
    if !page.next_page_token.is_empty() {
        println!("next page: --page-token {}", page.next_page_token);
    }
    Ok(())
}

/// What `notifyctl items` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ItemVerb {
    /// Mark seen.
    Seen,
    /// Mark read (and seen).
    Read,
    /// Mark unread again.
    Unread,
    /// Move to the archive.
    Archive,
    /// Move back to the inbox.
    Unarchive,
    /// Delete for good.
    Delete,
}

impl ItemVerb {
    fn action(self) -> v1::ItemAction {
        match self {
            ItemVerb::Seen => v1::ItemAction::MarkSeen,
            ItemVerb::Read => v1::ItemAction::MarkRead,
            ItemVerb::Unread => v1::ItemAction::MarkUnread,
            ItemVerb::Archive => v1::ItemAction::Archive,
            ItemVerb::Unarchive => v1::ItemAction::Unarchive,
            ItemVerb::Delete => v1::ItemAction::Delete,
        }
    }
}

/// Arguments of `notifyctl items`.
#[derive(Debug, Args)]
pub struct ItemsArgs {
    /// User id.
    user_id: u64,
    /// What to do.
    #[arg(value_enum)]
    verb: ItemVerb,
    /// Message ids (or --all).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    message_ids: Vec<u64>,
    /// Every item the filter selects (as `notifyctl inbox` with it shows).
    #[arg(long)]
    all: bool,
    /// With --all: only this category.
    #[arg(long, default_value = "", requires = "all")]
    category: String,
    /// With --all: only unread items.
    #[arg(long, requires = "all", conflicts_with = "read")]
    unread: bool,
    /// With --all: only read items.
    #[arg(long, requires = "all")]
    read: bool,
    /// With --all: only ids up to this one.
    #[arg(long, default_value_t = 0, requires = "all")]
    up_to: u64,
    /// With --all: the archive instead of the inbox.
    #[arg(long, requires = "all", conflicts_with = "everything")]
    archive: bool,
    /// With --all: the inbox and the archive.
    #[arg(long, requires = "all")]
    everything: bool,
}

/// Changes items and prints what changed and the new counts.
pub async fn items(channel: Api, args: ItemsArgs) -> anyhow::Result<()> {
    let all = args.all.then(|| v1::ItemFilter {
        view: view(args.archive, args.everything) as i32,
        category: args.category.clone(),
        unread_only: args.unread,
        read_only: args.read,
        up_to_message_id: args.up_to,
    });
    let response = InboxServiceClient::new(channel)
        .update_items(v1::UpdateItemsRequest {
            user_id: args.user_id,
            action: args.verb.action() as i32,
            message_ids: args.message_ids,
            all,
        })
        .await?
        .into_inner();
    println!(
        "changed {} (user {} unread {} unseen {})",
        response.changed, args.user_id, response.unread, response.unseen
    );
    if !response.unknown_message_ids.is_empty() {
        println!("unknown: {:?}", response.unknown_message_ids);
    }
    Ok(())
}

/// Arguments of `notifyctl prefs`.
#[derive(Debug, Args)]
pub struct PrefsArgs {
    /// User id.
    user_id: u64,
    /// Mute a category (repeatable).
    #[arg(long)]
    mute: Vec<String>,
    /// Unmute a category (repeatable).
    #[arg(long)]
    unmute: Vec<String>,
    /// Mute a group (repeatable).
    #[arg(long)]
    mute_group: Vec<u64>,
    /// Unmute a group (repeatable).
    #[arg(long)]
    unmute_group: Vec<u64>,
    /// Set the user's language, a BCP 47 tag (`zh-Hant-TW`); `""` clears it.
    #[arg(long)]
    locale: Option<String>,
}

/// Shows a user's preferences, changing them first when asked.
pub async fn prefs(channel: Api, args: PrefsArgs) -> anyhow::Result<()> {
    let mut client = InboxServiceClient::new(channel);
    let request = v1::GetPreferencesRequest { user_id: args.user_id };
    let mut prefs =
        client.get_preferences(request).await?.into_inner().preferences.unwrap_or_default();
    let changes = !(args.mute.is_empty()
        && args.unmute.is_empty()
        && args.mute_group.is_empty()
        && args.unmute_group.is_empty()
        && args.locale.is_none());
    if changes {
        prefs.muted_categories.extend(args.mute);
        prefs.muted_categories.retain(|c| !args.unmute.contains(c));
        prefs.muted_group_ids.extend(args.mute_group);
        prefs.muted_group_ids.retain(|g| !args.unmute_group.contains(g));
        if let Some(locale) = args.locale {
            prefs.locale = locale;
        }
        let request = v1::SetPreferencesRequest { user_id: args.user_id, preferences: Some(prefs) };
        prefs = client.set_preferences(request).await?.into_inner().preferences.unwrap_or_default();
    }
    let groups: Vec<String> = prefs.muted_group_ids.iter().map(u64::to_string).collect();
    println!("user {}", args.user_id);
    println!("  muted categories: {}", listed(&prefs.muted_categories));
    println!("  muted groups:     {}", listed(&groups));
    println!(
        "  locale:           {}",
        if prefs.locale.is_empty() { "none" } else { &prefs.locale }
    );
    Ok(())
}

fn listed(items: &[String]) -> String {
    if items.is_empty() { "none".to_owned() } else { items.join(" ") }
}

/// Formats a proto timestamp for humans (empty when absent).
pub fn rfc3339(at: Option<prost_types::Timestamp>) -> String {
    at.and_then(|t| DateTime::from_timestamp(t.seconds, 0))
        .map(|t| t.to_rfc3339())
        .unwrap_or_default()
}

/// Prints unread and unseen counts.
pub async fn badge(channel: Api, user_ids: Vec<u64>) -> anyhow::Result<()> {
    let mut client = InboxServiceClient::new(channel);
    let response = client
        .batch_get_unread_counts(v1::BatchGetUnreadCountsRequest { user_ids })
        .await?
        .into_inner();
    for count in response.counts {
        println!("user {} unread {} unseen {}", count.user_id, count.unread, count.unseen);
    }
    Ok(())
}
