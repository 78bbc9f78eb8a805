//! `group ...`: create groups, manage members, send, recall, pull, ack and
//! unread.

use crate::connect::Api;
use clap::{Args, Subcommand};
use notify_proto::v1;
use notify_proto::v1::group_service_client::GroupServiceClient;

use crate::sends::ContentArgs;
use crate::{inbox, recipients};

/// Most ids per member call, as the api allows.
const MEMBER_BATCH: usize = 10_000;

/// `notifyctl group` subcommands.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Creates a group; prints its id (generated unless --id is given).
    Create {
        /// Display name.
        name: String,
        /// Use this id instead of a generated one (a retry is then safe).
        #[arg(long, default_value_t = 0)]
        id: u64,
    },
    /// Adds members: ids from a range (1..1000), a file, or stdin, sent in
    /// batches of 10,000. New members start at the current seq.
    Add {
        /// Group id.
        group_id: u64,
        #[command(flatten)]
        users: recipients::RecipientArgs,
        /// Start the new members at seq 0: they see the whole history.
        #[arg(long)]
        history: bool,
    },
    /// Removes members (same id sources as add).
    Remove {
        /// Group id.
        group_id: u64,
        #[command(flatten)]
        users: recipients::RecipientArgs,
    },
    /// Sends a message to a group; prints its id and seq.
    Send(SendArgs),
    /// Recalls the message at SEQ: it stays as a tombstone without content,
    /// out of every member's unread count (sends.manage for the client's own
    /// messages, sends.all for others').
    Recall {
        /// Group id.
        group_id: u64,
        /// The message's seq.
        seq: u64,
    },
    /// Pulls a member's messages after their cursor (or --after).
    Pull {
        /// User id.
        user_id: u64,
        /// Group id.
        group_id: u64,
        /// Pull after this seq instead of the member's cursor.
        #[arg(long)]
        after: Option<u64>,
        /// Messages per page.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Acknowledge the page after printing it.
        #[arg(long)]
        ack: bool,
    },
    /// Moves a member's cursor forward to SEQ.
    Ack {
        /// User id.
        user_id: u64,
        /// Group id.
        group_id: u64,
        /// Last seq read.
        seq: u64,
    },
    /// Shows a user's unread counts per group.
    Unread {
        /// User id.
        user_id: u64,
    },
}

/// Arguments of `notifyctl group send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// Group id.
    group_id: u64,
    #[command(flatten)]
    what: ContentArgs,
}

/// Runs a `group` subcommand.
pub async fn run(channel: Api, command: GroupCommand) -> anyhow::Result<()> {
    let mut client = GroupServiceClient::new(channel);
    match command {
        GroupCommand::Create { name, id } => {
            let request = v1::CreateGroupRequest { group_id: id, name };
            let created = client.create_group(request).await?.into_inner();
            println!("group {}", created.group_id);
        }
        GroupCommand::Add { group_id, users, history } => {
            let mut added = 0;
            for batch in users.read()?.chunks(MEMBER_BATCH) {
                let request = v1::AddGroupMembersRequest {
                    group_id,
                    user_ids: batch.to_vec(),
                    with_history: history,
                };
                added += client.add_group_members(request).await?.into_inner().added;
            }
            println!("added {added} members to group {group_id}");
        }
        GroupCommand::Remove { group_id, users } => {
            let mut removed = 0;
            for batch in users.read()?.chunks(MEMBER_BATCH) {
                let request = v1::RemoveGroupMembersRequest { group_id, user_ids: batch.to_vec() };
                removed += client.remove_group_members(request).await?.into_inner().removed;
            }
            println!("removed {removed} members from group {group_id}");
        }
        GroupCommand::Send(args) => {
            let request = v1::SendGroupMessageRequest {
                group_id: args.group_id,
                content: Some(args.what.content(&[])?),
                sender: args.what.sender,
                idempotency_key: args.what.idempotency_key,
            };
            let sent = client.send_group_message(request).await?.into_inner();
            println!("message {} seq {}", sent.message_id, sent.seq);
        }
        GroupCommand::Recall { group_id, seq } => {
            let request = v1::RecallGroupMessageRequest { group_id, seq };
            let recalled = client.recall_group_message(request).await?.into_inner();
            let how = if recalled.recalled_now { "recalled" } else { "was recalled already" };
            println!("message {} (group {group_id} seq {seq}) {how}", recalled.message_id);
        }
        GroupCommand::Pull { user_id, group_id, after, limit, ack } => {
            let request =
                v1::PullGroupMessagesRequest { user_id, group_id, after_seq: after, limit };
            let page = client.pull_group_messages(request).await?.into_inner();
            for message in &page.messages {
                let at = inbox::rfc3339(message.created_at);
                if message.recalled {
                    let recalled = inbox::rfc3339(message.recalled_at);
                    println!(
                        "{:>8} {} {at} {} (recalled {recalled})",
                        message.seq, message.message_id, message.sender
                    );
                    continue;
                }
                let content = message.content.clone().unwrap_or_default();
                println!(
                    "{:>8} {} {at} {} [{}] {}",
                    message.seq,
                    message.message_id,
                    message.sender,
                    content.category,
                    content.title
                );
            }
            if page.has_more {
                println!("more messages follow");
            }
            if let (true, Some(last)) = (ack, page.messages.last()) {
                let request = v1::AckGroupMessagesRequest { user_id, group_id, seq: last.seq };
                let cursor = client.ack_group_messages(request).await?.into_inner().last_ack_seq;
                println!("acknowledged up to seq {cursor}");
            }
        }
        GroupCommand::Ack { user_id, group_id, seq } => {
            let request = v1::AckGroupMessagesRequest { user_id, group_id, seq };
            let cursor = client.ack_group_messages(request).await?.into_inner().last_ack_seq;
            println!("user {user_id} group {group_id} last_ack_seq {cursor}");
        }
        GroupCommand::Unread { user_id } => {
            let request = v1::GetGroupUnreadRequest { user_id };
            let unread = client.get_group_unread(request).await?.into_inner();
            for group in &unread.groups {
                println!(
                    "group {} unread {} (max_seq {}, last_ack_seq {}){}",
                    group.group_id,
                    group.unread,
                    group.max_seq,
                    group.last_ack_seq,
                    if group.muted { " muted" } else { "" }
                );
            }
            println!("total {} (muted groups left out)", unread.total);
        }
    }
    Ok(())
}
