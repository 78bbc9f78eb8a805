//! `notify-bench control`: the control paths' targets (issue 61).
//!
//! - **A big cancel and recall answer at once.** Two scheduled sends of
//!   `--recipients` users each (10,000,000 by default); `CancelMessage` on
//!   one, `RecallMessage` on the other, each timed as the call (target: under
//!   1 s) and to the end of its operation (every chunk cancelled: target,
//!   within the fan-out time of the same send, projected from the rate of a
//!   `--sample`-recipient fan-out run in the same process just before).
//! - **Invalidation in proportion.** The sample's recipients' badges are
//!   cached (`--others` of them); a two-user send is edited, then recalled;
//!   re-reading the others' badges must miss the cache for none of them
//!   (`notify_badge_cache_misses_total` on the api, which only counts badge
//!   reads that went to MySQL).

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::{StreamExt, TryStreamExt};
use notify_domain::Settings;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use tonic::transport::Channel;

use crate::harness::{self, Env, thousands, verdict};

/// Users per `BatchGetUnreadCounts` call.
const BADGE_BATCH: usize = 1000;

/// Arguments of `notify-bench control`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControlArgs {
    /// Recipients of each scheduled send cancelled or recalled.
    #[arg(long, default_value_t = 10_000_000)]
    recipients: u64,
    /// Recipients of the fan-out whose rate projects the big sends' fan-out.
    #[arg(long, default_value_t = 200_000)]
    sample: u64,
    /// Users (of the sample's recipients) whose cached badges a small
    /// recall and edit must leave alone.
    #[arg(long, default_value_t = 10_000)]
    others: u64,
    /// Shard databases.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Longest wait for any phase.
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: ControlArgs) -> anyhow::Result<()> {
    ensure!(args.sample >= 1000 && args.recipients >= args.sample, "--sample >= 1000, <= N");
    ensure!(args.others <= args.sample && args.shards > 0, "--others <= --sample");
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut env = Env::new(harness::settings_for(&base, &tag, args.shards))?;
    println!(
        "notify-bench control: tag {tag}, {} recipients per scheduled send, {} in the sample, \
         {} shards, loadavg {}",
        thousands(args.recipients),
        thousands(args.sample),
        args.shards,
        crate::procstat::loadavg()
    );
    let outcome = crate::guarded(body(&mut env, &args)).await;
    env.finish(outcome).await
}

async fn body(env: &mut Env, args: &ControlArgs) -> anyhow::Result<String> {
    env.start_services().await?;
    let channel = env.channel().await?;
    let mut server = harness::server_connection(&env.settings).await?;

    // The same-run baseline: a fan-out's rate.
    let sample: Vec<u64> = (1..=args.sample).collect();
    let id = harness::draft(&channel, content("sample"), &sample).await?;
    harness::quiesce(&mut server, Duration::from_secs(60)).await?;
    let started = Instant::now();
    harness::start_message(&channel, id).await?;
    harness::watch_until(&channel, id, args.timeout_secs, "COMPLETED", |m| {
        m.status == v1::MessageStatus::Completed as i32
    })
    .await?;
    let rate = args.sample as f64 / started.elapsed().as_secs_f64();
    let projected = args.recipients as f64 / rate;
    println!(
        "sample fan-out: {rate:.0} recipients/s; {} would take {projected:.0} s",
        thousands(args.recipients)
    );

    let cancel = big_operation(env, args, &channel, &mut server, Operation::Cancel).await?;
    let recall = big_operation(env, args, &channel, &mut server, Operation::Recall).await?;
    let (misses, small) = small_recall_and_edit(env, args, &channel).await?;

    let answered_ok = cancel.answered_ms < 1000.0 && recall.answered_ms < 1000.0;
    let settled_ok = cancel.settled_secs <= projected && recall.settled_secs <= projected;
    Ok(format!(
        "\n================ notify-bench control: summary ================\n\
         cancel of a scheduled {n}-recipient send: answered in {:.1} ms, every chunk cancelled in {:.1} s\n\
         recall of a scheduled {n}-recipient send: answered in {:.1} ms, every chunk cancelled in {:.1} s\n\
         the calls answer under 1 s: {}\n\
         settled within the same send's fan-out ({projected:.0} s at the sample's {rate:.0}/s, same run): \
         cancel {:.2}, recall {:.2} of it: {}\n\
         edit and recall of the two-user send {small}: {misses} of {} re-reads of other users' cached badges \
         went to MySQL (target 0): {}\n\
         ===============================================================",
        cancel.answered_ms,
        cancel.settled_secs,
        recall.answered_ms,
        recall.settled_secs,
        verdict(answered_ok),
        cancel.settled_secs / projected,
        recall.settled_secs / projected,
        verdict(settled_ok),
        thousands(args.others),
        verdict(misses == 0),
        n = thousands(args.recipients),
    ))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Cancel,
    Recall,
}

struct Timed {
    answered_ms: f64,
    settled_secs: f64,
}

/// Stores a scheduled send to `--recipients` users (a day ahead), then
/// cancels or recalls it: the call's time, and the time until its
/// operation reports no shard's part left.
async fn big_operation(
    env: &mut Env,
    args: &ControlArgs,
    channel: &Channel,
    server: &mut sqlx::MySqlConnection,
    operation: Operation,
) -> anyhow::Result<Timed> {
    let stored = Instant::now();
    let id = scheduled(channel, args.recipients).await?;
    println!(
        "{operation:?}: scheduled send {id} of {} stored in {:.1} s",
        thousands(args.recipients),
        stored.elapsed().as_secs_f64()
    );
    env.check_children()?;
    harness::quiesce(server, Duration::from_secs(120)).await?;
    let mut messages = MessageServiceClient::new(channel.clone());
    let started = Instant::now();
    let answer = match operation {
        Operation::Cancel => {
            messages.cancel_message(v1::CancelMessageRequest { message_id: id }).await?
        }
        Operation::Recall => {
            messages.recall_message(v1::RecallMessageRequest { message_id: id }).await?
        }
    };
    let answered_ms = started.elapsed().as_secs_f64() * 1000.0;
    let pending = answer.into_inner().pending_operations.len();
    let done = harness::watch_until(channel, id, args.timeout_secs, "settled", |m| {
        m.pending_operations.is_empty()
    })
    .await?;
    let settled_secs = started.elapsed().as_secs_f64();
    let progress = done.progress.unwrap_or_default();
    ensure!(
        progress.cancelled == args.recipients && progress.pending_chunks == 0,
        "{operation:?} left {progress:?}"
    );
    println!(
        "{operation:?}: answered in {answered_ms:.1} ms ({pending} operation pending then), \
         settled in {settled_secs:.1} s"
    );
    Ok(Timed { answered_ms, settled_secs })
}

/// Creates a send to users `1..=n` scheduled a day ahead, and starts it.
async fn scheduled(channel: &Channel, n: u64) -> anyhow::Result<u64> {
    let mut messages = MessageServiceClient::new(channel.clone())
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let at = chrono::Utc::now() + chrono::Duration::days(1);
    let id = messages
        .create_message(v1::CreateMessageRequest {
            sender: "notify-bench".into(),
            content: Some(content("scheduled")),
            send_at: Some(prost_types::Timestamp { seconds: at.timestamp(), nanos: 0 }),
            ..Default::default()
        })
        .await
        .context("CreateMessage")?
        .into_inner()
        .message_id;
    let users: Vec<u64> = (1..=n).collect();
    for (index, batch) in users.chunks(100_000).enumerate() {
        let request = v1::AppendRecipientsRequest {
            message_id: id,
            batch_number: index as u64 + 1,
            user_ids: batch.to_vec(),
            ..Default::default()
        };
        messages.append_recipients(request).await.context("AppendRecipients")?;
    }
    messages.start_message(v1::StartMessageRequest { message_id: id }).await?;
    Ok(id)
}

/// Caches `--others` badges (every one holds the sample's item), edits then
/// recalls a two-user send, and re-reads those badges: returns how many of
/// the re-reads missed the cache, and the small send's id.
async fn small_recall_and_edit(
    env: &Env,
    args: &ControlArgs,
    channel: &Channel,
) -> anyhow::Result<(u64, u64)> {
    let inbox = InboxServiceClient::new(channel.clone());
    let others: Vec<u64> = (1..=args.others).collect();
    badges(&inbox, &others).await?;
    badges(&inbox, &others).await?; // every one cached now
    let pair = [args.sample + 1, args.sample + 2];
    let id = harness::draft(channel, content("a typo"), &pair).await?;
    harness::start_message(channel, id).await?;
    harness::watch_until(channel, id, args.timeout_secs, "COMPLETED", |m| {
        m.status == v1::MessageStatus::Completed as i32
    })
    .await?;
    let before = env.scrape("notify-api").await.sum("notify_badge_cache_misses_total", &[]);
    let mut messages = MessageServiceClient::new(channel.clone());
    let fixed = v1::EditMessageRequest { message_id: id, content: Some(content("the typo fixed")) };
    messages.edit_message(fixed).await?;
    messages.recall_message(v1::RecallMessageRequest { message_id: id }).await?;
    harness::watch_until(channel, id, args.timeout_secs, "recalled", |m| {
        m.finished_at.is_some() && m.pending_operations.is_empty()
    })
    .await?;
    badges(&inbox, &others).await?;
    let after = env.scrape("notify-api").await.sum("notify_badge_cache_misses_total", &[]);
    Ok(((after - before).max(0.0) as u64, id))
}

/// Reads every user's badge, 1,000 per call.
async fn badges(inbox: &InboxServiceClient<Channel>, users: &[u64]) -> anyhow::Result<()> {
    futures::stream::iter(users.chunks(BADGE_BATCH))
        .map(|user_ids| {
            let mut inbox = inbox.clone();
            async move {
                let request = v1::BatchGetUnreadCountsRequest { user_ids: user_ids.to_vec() };
                inbox.batch_get_unread_counts(request).await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(4)
        .try_collect()
        .await
}

fn content(title: &str) -> v1::Content {
    v1::Content {
        title: title.into(),
        body: "notify-bench control".into(),
        category: "bench".into(),
        data: Default::default(),
        ..Default::default()
    }
}
