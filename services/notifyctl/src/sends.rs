//! `send`, `status`, `pause`, `resume`, `cancel`, `list`.

use crate::connect::Api;
use chrono::{DateTime, Utc};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use notify_proto::v1;
use notify_proto::v1::message_service_client::MessageServiceClient;
use tokio_stream::StreamExt;

use crate::recipients::{self, Batch};
use anyhow::Context as _;

/// Most ids sent inline; larger lists use the draft flow.
const INLINE_LIMIT: usize = 100_000;

/// What a message says and who sends it: shared by `send`, `announce` and
/// `group send`.
#[derive(Debug, Args)]
pub struct ContentArgs {
    /// Title.
    #[arg(long)]
    title: String,
    /// Body.
    #[arg(long, default_value = "")]
    body: String,
    /// Category.
    #[arg(long, default_value = "")]
    category: String,
    /// Sender name (default: the calling client's own).
    #[arg(long, default_value = "")]
    pub sender: String,
    /// Idempotency key: a retry with the same key sends nothing new.
    #[arg(long, default_value = "")]
    pub idempotency_key: String,
    /// Title and body are templates (docs/templates.md); implied by --var,
    /// --translations and a users file with variables.
    #[arg(long)]
    template: bool,
    /// A send-wide template variable, NAME=VALUE (repeatable).
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    vars: Vec<(String, String)>,
    /// A JSON file of title and body templates by language:
    /// {"zh-Hant": {"title": "...", "body": "..."}, "de": {...}}.
    #[arg(long, value_name = "FILE")]
    translations: Option<std::path::PathBuf>,
}

fn parse_var(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))
}

impl ContentArgs {
    /// The content to send: a template when asked for, or when its
    /// recipients carry `recipient_vars`.
    pub fn content(&self, recipient_vars: &[String]) -> anyhow::Result<v1::Content> {
        let templated = self.template
            || !self.vars.is_empty()
            || self.translations.is_some()
            || !recipient_vars.is_empty();
        let template = if templated {
            let translations = match &self.translations {
                Some(path) => read_translations(path)?,
                None => Default::default(),
            };
            Some(v1::Template {
                vars: self.vars.iter().cloned().collect(),
                translations,
                recipient_vars: recipient_vars.to_vec(),
            })
        } else {
            None
        };
        Ok(v1::Content {
            title: self.title.clone(),
            body: self.body.clone(),
            category: self.category.clone(),
            data: Default::default(),
            template,
        })
    }
}

/// Reads `--translations`: a JSON object of language to title and body.
fn read_translations(
    path: &std::path::Path,
) -> anyhow::Result<std::collections::HashMap<String, v1::Translation>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--translations {path:?}"))?;
    let parsed: std::collections::HashMap<String, serde_json::Value> = serde_json::from_str(&text)
        .with_context(|| format!("--translations {path:?}: not a JSON object of languages"))?;
    parsed
        .into_iter()
        .map(|(locale, value)| {
            let text = |field: &str| value.get(field).and_then(|v| v.as_str()).map(str::to_owned);
            let title = text("title").with_context(|| {
                format!("--translations {path:?}: {locale} has no \"title\" string")
            })?;
            let body = text("body").unwrap_or_default();
            Ok((locale, v1::Translation { title, body }))
        })
        .collect()
}

/// What a send says and when it starts: shared by `send` and `announce`.
#[derive(Debug, Args)]
pub struct MessageArgs {
    #[command(flatten)]
    what: ContentArgs,
    /// Start time (RFC 3339, e.g. 2026-12-01T09:00:00Z); default now.
    #[arg(long)]
    at: Option<DateTime<Utc>>,
    /// Critical: ignores the recipients' muted categories (needs the
    /// send.critical scope).
    #[arg(long)]
    critical: bool,
}

/// Arguments of `notifyctl send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    #[command(flatten)]
    recipients: recipients::RecipientArgs,
    #[command(flatten)]
    message: MessageArgs,
    /// Expiry time (RFC 3339).
    #[arg(long)]
    expire: Option<DateTime<Utc>>,
    /// Use the high-priority lane.
    #[arg(long)]
    high: bool,
    /// Follow progress until the send ends.
    #[arg(long)]
    watch: bool,
}

/// Arguments of `notifyctl announce`.
#[derive(Debug, Args)]
pub struct AnnounceArgs {
    #[command(flatten)]
    message: MessageArgs,
    /// End of the validity window (RFC 3339), e.g. 2026-12-31T23:59:59Z.
    #[arg(long)]
    until: Option<DateTime<Utc>>,
}

/// Sends an announcement to every user.
pub async fn announce(channel: Api, args: AnnounceArgs) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel);
    let response = client
        .send_message(v1::SendMessageRequest {
            sender: args.message.what.sender.clone(),
            idempotency_key: args.message.what.idempotency_key.clone(),
            content: Some(args.message.what.content(&[])?),
            audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
            send_at: args.message.at.map(timestamp),
            expire_at: args.until.map(timestamp),
            priority: 0,
            critical: args.message.critical,
        })
        .await?
        .into_inner();
    println!("announcement {} [{}]", response.message_id, status_name(response.status));
    Ok(())
}

fn timestamp(at: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: at.timestamp(), nanos: at.timestamp_subsec_nanos() as i32 }
}

/// Sends inline (up to 100,000 users) or through the draft flow, reading
/// the users batch by batch.
pub async fn send(channel: Api, args: SendArgs) -> anyhow::Result<()> {
    let mut batches = args.recipients.batches(INLINE_LIMIT)?;
    let mut client = MessageServiceClient::new(channel.clone());
    let content = args.message.what.content(&batches.vars)?;
    let priority = if args.high { v1::Priority::High } else { v1::Priority::Normal } as i32;
    let first = batches.next().transpose()?.unwrap_or(Batch::Ids(Vec::new()));
    let second = batches.next().transpose()?;
    let mut sent = first.len();
    let message_id = if second.is_none() {
        let (user_ids, recipients) = first.into_fields();
        let response = client
            .send_message(v1::SendMessageRequest {
                sender: args.message.what.sender.clone(),
                idempotency_key: args.message.what.idempotency_key.clone(),
                content: Some(content),
                audience: Some(v1::send_message_request::Audience::Users(v1::UserAudience {
                    user_ids,
                    recipients,
                })),
                send_at: args.message.at.map(timestamp),
                expire_at: args.expire.map(timestamp),
                priority,
                critical: args.message.critical,
            })
            .await?
            .into_inner();
        response.message_id
    } else {
        let created = client
            .create_message(v1::CreateMessageRequest {
                sender: args.message.what.sender.clone(),
                idempotency_key: args.message.what.idempotency_key.clone(),
                content: Some(content),
                send_at: args.message.at.map(timestamp),
                expire_at: args.expire.map(timestamp),
                priority,
                critical: args.message.critical,
            })
            .await?
            .into_inner();
        let bar = bar(0, "appending");
        let rest = [Ok(first)].into_iter().chain(second.map(Ok)).chain(batches);
        // A few batches in flight: the file is read, and each batch encoded,
        // while the api stores the ones before.
        let appends = rest.enumerate().map(|(index, batch)| {
            let mut client = client.clone();
            let bar = bar.clone();
            async move {
                let (user_ids, recipients) = batch?.into_fields();
                let count = (user_ids.len() + recipients.len()) as u64;
                bar.inc_length(count);
                client
                    .append_recipients(v1::AppendRecipientsRequest {
                        message_id: created.message_id,
                        batch_number: index as u64 + 1,
                        user_ids,
                        recipients,
                    })
                    .await
                    .with_context(|| format!("batch {}", index + 1))?;
                bar.inc(count);
                anyhow::Ok(count as usize)
            }
        });
        let mut appends = futures::StreamExt::buffer_unordered(
            futures::stream::iter(appends),
            notify_core::send::APPENDS_IN_FLIGHT,
        );
        sent = 0;
        while let Some(appended) = futures::StreamExt::next(&mut appends).await {
            sent += appended?;
        }
        drop(appends);
        bar.finish();
        client.start_message(v1::StartMessageRequest { message_id: created.message_id }).await?;
        created.message_id
    };
    println!("message {message_id} accepted for {sent} recipients");
    if args.watch {
        watch(channel, message_id).await?;
    }
    Ok(())
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:>10} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style);
    }
    bar.set_message(what.to_owned());
    bar
}

fn status_name(status: i32) -> &'static str {
    match v1::MessageStatus::try_from(status) {
        Ok(v1::MessageStatus::NotStarted) => "not_started",
        Ok(v1::MessageStatus::Sending) => "sending",
        Ok(v1::MessageStatus::Paused) => "paused",
        Ok(v1::MessageStatus::Completed) => "completed",
        Ok(v1::MessageStatus::Cancelled) => "cancelled",
        Ok(v1::MessageStatus::Recalled) => "recalled",
        _ => "unknown",
    }
}

fn print_message(message: &v1::Message) {
    let p = message.progress.unwrap_or_default();
    println!(
        "message {} [{}] total={} delivered={} failed={} read={} pending={} cancelled={} suppressed={} recalled={} pending_chunks={}{}",
        message.message_id,
        status_name(message.status),
        p.total,
        p.delivered,
        p.failed,
        p.read,
        p.pending,
        p.cancelled,
        p.suppressed,
        p.recalled,
        p.pending_chunks,
        if message.critical { " critical" } else { "" }
    );
}

async fn watch(channel: Api, message_id: u64) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel);
    let mut stream = client
        .watch_message(v1::WatchMessageRequest { message_id, interval_ms: 250 })
        .await?
        .into_inner();
    let bar = bar(0, "delivering");
    let mut last = None;
    while let Some(message) = stream.next().await {
        let message = message?;
        let p = message.progress.unwrap_or_default();
        bar.set_length(p.total);
        if message.status == v1::MessageStatus::Recalled as i32 {
            // A recall's bar: items taken back of those delivered.
            bar.set_length(p.delivered);
            bar.set_position(p.recalled);
        } else {
            bar.set_position(p.delivered + p.failed + p.suppressed + p.cancelled);
        }
        bar.set_message(status_name(message.status).to_owned());
        last = Some(message);
    }
    bar.finish();
    if let Some(message) = last {
        print_message(&message);
    }
    Ok(())
}

/// Prints a send's state, or follows it.
pub async fn status(channel: Api, message_id: u64, follow: bool) -> anyhow::Result<()> {
    if follow {
        return watch(channel, message_id).await;
    }
    let mut client = MessageServiceClient::new(channel);
    let message = client.get_message(v1::GetMessageRequest { message_id }).await?.into_inner();
    print_message(&message);
    Ok(())
}

/// Pauses a send.
pub async fn pause(channel: Api, message_id: u64) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel);
    let message = client.pause_message(v1::PauseMessageRequest { message_id }).await?.into_inner();
    print_message(&message);
    Ok(())
}

/// Resumes a send.
pub async fn resume(channel: Api, message_id: u64) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel);
    let message =
        client.resume_message(v1::ResumeMessageRequest { message_id }).await?.into_inner();
    print_message(&message);
    Ok(())
}

/// Cancels a send.
pub async fn cancel(channel: Api, message_id: u64) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel);
    let message =
        client.cancel_message(v1::CancelMessageRequest { message_id }).await?.into_inner();
    print_message(&message);
    Ok(())
}

/// Re-drives a send's failed chunks.
pub async fn redrive(channel: Api, message_id: u64) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel);
    let message =
        client.redrive_message(v1::RedriveMessageRequest { message_id }).await?.into_inner();
    print_message(&message);
    Ok(())
}

/// Recalls a send from every inbox; with `watch`, follows the workers
/// taking its items back until the recall is finished.
pub async fn recall(channel: Api, message_id: u64, follow: bool) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel.clone());
    let message =
        client.recall_message(v1::RecallMessageRequest { message_id }).await?.into_inner();
    if !follow {
        print_message(&message);
        return Ok(());
    }
    watch(channel, message_id).await
}

/// Replaces a send's title and/or body (the category and data stay).
pub async fn edit(
    channel: Api,
    message_id: u64,
    title: Option<String>,
    body: Option<String>,
) -> anyhow::Result<()> {
    if title.is_none() && body.is_none() {
        anyhow::bail!("give --title and/or --body");
    }
    let mut client = MessageServiceClient::new(channel);
    let current = client.get_message(v1::GetMessageRequest { message_id }).await?.into_inner();
    let mut content = current.content.unwrap_or_default();
    if let Some(title) = title {
        content.title = title;
    }
    if let Some(body) = body {
        content.body = body;
    }
    let request = v1::EditMessageRequest { message_id, content: Some(content) };
    let message = client.edit_message(request).await?.into_inner();
    print_message(&message);
    Ok(())
}

/// Lists a sender's sends.
pub async fn list(channel: Api, sender: String, limit: u32) -> anyhow::Result<()> {
    let mut client = MessageServiceClient::new(channel);
    let response = client
        .list_messages(v1::ListMessagesRequest {
            sender,
            page_size: limit,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    for message in &response.messages {
        print_message(message);
    }
    Ok(())
}
