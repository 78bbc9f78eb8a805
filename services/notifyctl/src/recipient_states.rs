//! `recipients` and `recipient`: who got a send and who read it.

use clap::{Args, ValueEnum};
use notify_proto::v1;
use notify_proto::v1::message_service_client::MessageServiceClient;

use crate::connect::Api;
use crate::inbox::rfc3339;

/// Which recipients `notifyctl recipients` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// Every recipient.
    All,
    /// Got it, read or not.
    Delivered,
    /// Read it.
    Read,
    /// Got it, not read.
    Unread,
    /// Their chunk was dead-lettered.
    Failed,
    /// Not delivered yet.
    Pending,
    /// Held back by their preferences, or erased.
    Suppressed,
    /// Taken back by a recall.
    Recalled,
    /// Left undelivered by a cancel.
    Cancelled,
}

impl StateArg {
    fn to_proto(self) -> v1::RecipientFilter {
        use v1::RecipientFilter as F;
        match self {
            StateArg::All => F::Unspecified,
            StateArg::Delivered => F::Delivered,
            StateArg::Read => F::Read,
            StateArg::Unread => F::Unread,
            StateArg::Failed => F::Failed,
            StateArg::Pending => F::Pending,
            StateArg::Suppressed => F::Suppressed,
            StateArg::Recalled => F::Recalled,
            StateArg::Cancelled => F::Cancelled,
        }
    }
}

/// Arguments of `notifyctl recipients`.
#[derive(Debug, Args)]
pub struct RecipientsArgs {
    /// Message id.
    message_id: u64,
    /// Only recipients in this state.
    #[arg(long, value_enum, default_value_t = StateArg::All)]
    state: StateArg,
    /// Recipients per page (up to 1,000).
    #[arg(long, default_value_t = 100)]
    page_size: u32,
    /// Page token from a previous page.
    #[arg(long, default_value = "", conflicts_with = "all")]
    page_token: String,
    /// Every page, not just the first.
    #[arg(long)]
    all: bool,
}

fn state_name(raw: i32) -> &'static str {
    use v1::RecipientState as S;
    match S::try_from(raw) {
        Ok(S::Unread) => "unread",
        Ok(S::Read) => "read",
        Ok(S::Pending) => "pending",
        Ok(S::Failed) => "failed",
        Ok(S::Suppressed) => "suppressed",
        Ok(S::Cancelled) => "cancelled",
        Ok(S::Recalled) => "recalled",
        Ok(S::NotARecipient) => "not-a-recipient",
        Ok(S::Unspecified) | Err(_) => "unknown",
    }
}

fn print_recipient(recipient: &v1::Recipient) {
    println!(
        "{:>20} {:<15} {:<25} {}",
        recipient.user_id,
        state_name(recipient.state),
        rfc3339(recipient.delivered_at),
        rfc3339(recipient.read_at)
    );
}

/// Prints a page of a send's recipients in user order (every page with
/// `--all`): user, state, delivered at, read at.
pub async fn recipients(channel: Api, args: RecipientsArgs) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel);
    let mut page_token = args.page_token;
    let mut listed = 0u64;
    loop {
        let page = client
            .list_recipients(v1::ListRecipientsRequest {
                message_id: args.message_id,
                state: args.state.to_proto() as i32,
                page_size: args.page_size,
                page_token,
            })
            .await?
            .into_inner();
        for recipient in &page.recipients {
            print_recipient(recipient);
        }
        listed += page.recipients.len() as u64;
        if page.next_page_token.is_empty() {
            if args.all {
                eprintln!("{listed} recipients");
            }
            return Ok(());
        }
        if !args.all {
            println!("next page: --page-token {}", page.next_page_token);
            return Ok(());
        }
        page_token = page.next_page_token;
    }
}

/// Prints where a send stands for each of the users.
pub async fn recipient(channel: Api, message_id: u64, user_ids: Vec<u64>) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel);
    let response = client
        .get_recipient_status(v1::GetRecipientStatusRequest { message_id, user_ids })
        .await?
        .into_inner();
    for recipient in &response.recipients {
        print_recipient(recipient);
    }
    Ok(())
}
