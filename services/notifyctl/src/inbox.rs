//! `inbox` and `badge`.

use crate::connect::Api;
use chrono::DateTime;
use clap::Args;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;

/// Arguments of `notifyctl inbox`.
#[derive(Debug, Args)]
pub struct InboxArgs {
    /// User id.
    user_id: u64,
    /// Only unread items.
    #[arg(long)]
    unread: bool,
    /// Only this category.
    #[arg(long, default_value = "")]
    category: String,
    /// Items per page.
    #[arg(long, default_value_t = 20)]
    limit: u32,
    /// Page token from a previous page.
    #[arg(long, default_value = "")]
    page_token: String,
}

/// Prints one inbox page.
pub async fn inbox(channel: Api, args: InboxArgs) -> anyhow::Result<()> {
    let mut client = InboxServiceClient::new(channel);
    let page = client
        .list_inbox(v1::ListInboxRequest {
            user_id: args.user_id,
            page_size: args.limit,
            page_token: args.page_token,
            unread_only: args.unread,
            category: args.category,
        })
        .await?
        .into_inner();
    for item in &page.items {
        let content = item.content.clone().unwrap_or_default();
        let at = rfc3339(item.created_at);
        let mark = if item.read { " " } else { "*" };
        println!("{mark} {} {at} [{}] {}", item.message_id, content.category, content.title);
    }
    if !page.next_page_token.is_empty() {
        println!("next page: --page-token {}", page.next_page_token);
    }
    Ok(())
}

/// Formats a proto timestamp for humans (empty when absent).
pub fn rfc3339(at: Option<prost_types::Timestamp>) -> String {
    at.and_then(|t| DateTime::from_timestamp(t.seconds, 0))
        .map(|t| t.to_rfc3339())
        .unwrap_or_default()
}

/// Prints unread counts.
pub async fn badge(channel: Api, user_ids: Vec<u64>) -> anyhow::Result<()> {
    let mut client = InboxServiceClient::new(channel);
    let response = client
        .batch_get_unread_counts(v1::BatchGetUnreadCountsRequest { user_ids })
        .await?
        .into_inner();
    for count in response.counts {
        println!("user {} unread {}", count.user_id, count.unread);
    }
    Ok(())
}
