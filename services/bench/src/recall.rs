//! `notify-bench recall`: recall of a big COMPLETED send against its own
//! fan-out. One send to `--recipients` users (the draft flow), timed from
//! `StartMessage` to `COMPLETED`; 1% of them read it and every badge is
//! cached; then `RecallMessage`, timed to the recall's end (`RECALLED` with
//! `finished_at`: every chunk's items taken back). Target (issue 34): the
//! recall takes at most the fan-out's time, and afterwards every recipient's
//! badge (unread and unseen, as served) equals MySQL's count. Then, reported
//! beside (not judged): retention's purge of the recalled rows, which a
//! worker runs `purge_hidden_after_secs` after the recall, timed as such a
//! run from a quiet server.

use std::collections::HashMap;
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
const BADGE_BATCH: u64 = 1000;

/// Arguments of `notify-bench recall`.
#[derive(Debug, Clone, clap::Args)]
pub struct RecallArgs {
    /// Recipients of the send (user ids `1..=N`).
    #[arg(long, default_value_t = 1_000_000)]
    recipients: u64,
    /// Shard databases.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Longest wait for the send, and then for the recall, to finish.
    #[arg(long, default_value_t = 1800)]
    timeout_secs: u64,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: RecallArgs) -> anyhow::Result<()> {
    ensure!(args.recipients >= 1000 && args.shards > 0, "--recipients >= 1000, --shards > 0");
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut env = Env::new(harness::settings_for(&base, &tag, args.shards))?;
    println!(
        "notify-bench recall: tag {tag}, {} recipients on {} shards, loadavg {}",
        thousands(args.recipients),
        args.shards,
        crate::procstat::loadavg()
    );
    let outcome = crate::guarded(body(&mut env, &args)).await;
    env.finish(outcome).await
}

async fn body(env: &mut Env, args: &RecallArgs) -> anyhow::Result<String> {
    env.start_services().await?;
    let channel = env.channel().await?;
    let inbox = InboxServiceClient::new(channel.clone());
    let n = args.recipients;
    let users: Vec<u64> = (1..=n).collect();
    let content = v1::Content {
        title: "Recall benchmark".into(),
        body: "A send taken back from every inbox.".into(),
        category: "bench".into(),
        data: Default::default(),
        ..Default::default()
    };
    let id = harness::draft(&channel, content, &users).await?;
    // Each timed phase starts on a server done writing what came before
    // (the appends' pages here, the fan-out's before the recall), as the
    // other phase did: a flush behind one of them is not its own cost.
    let mut server = harness::server_connection(&env.settings).await?;
    let (waited, dirty) = harness::quiesce(&mut server, Duration::from_secs(60)).await?;
    println!("quiesce before the fan-out: {waited:.1} s, {dirty} dirty pages left");
    let started = Instant::now();
    harness::start_message(&channel, id).await?;
    harness::watch_until(&channel, id, args.timeout_secs, "COMPLETED", |m| {
        m.status == v1::MessageStatus::Completed as i32
    })
    .await?;
    let fanout_secs = started.elapsed().as_secs_f64();
    println!("send {id}: fan-out {fanout_secs:.2} s");

    // 1% read it; every badge is cached (and checked) before the recall.
    futures::stream::iter(0..n / 100)
        .map(|i| {
            let mut inbox = inbox.clone();
            async move {
                let request = v1::MarkReadRequest { user_id: 1 + i * 100, message_ids: vec![id] };
                inbox.mark_read(request).await.context("MarkRead")?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<()>()
        .await?;
    let before = badges(&inbox, n).await?;
    let unread_before = before.values().filter(|(unread, _)| *unread == 1).count() as u64;
    println!("before: {} of {} badges show it unread", thousands(unread_before), thousands(n));
    env.check_children()?;

    let (waited, dirty) = harness::quiesce(&mut server, Duration::from_secs(60)).await?;
    println!("quiesce before the recall: {waited:.1} s, {dirty} dirty pages left");
    let mut messages = MessageServiceClient::new(channel.clone());
    let recalling = Instant::now();
    messages.recall_message(v1::RecallMessageRequest { message_id: id }).await?;
    let answered_ms = recalling.elapsed().as_secs_f64() * 1000.0;
    let done =
        harness::watch_until(&channel, id, args.timeout_secs, "RECALLED and finished", |m| {
            m.status == v1::MessageStatus::Recalled as i32 && m.finished_at.is_some()
        })
        .await?;
    let recall_secs = recalling.elapsed().as_secs_f64();
    let recalled = done.progress.map_or(0, |p| p.recalled);
    println!(
        "recall: answered in {answered_ms:.1} ms, finished in {recall_secs:.2} s, {} items taken back",
        thousands(recalled)
    );
    env.check_children()?;

    let served = badges(&inbox, n).await?;
    let truth = mysql_badges(&env.settings, n).await?;
    let wrong: Vec<u64> = served
        .iter()
        .filter(|(user, counts)| truth.get(user).copied().unwrap_or((0, 0)) != **counts)
        .map(|(user, _)| *user)
        .collect();
    // The rows' purge, as a retention run that late would do it.
    let (waited, dirty) = harness::quiesce(&mut server, Duration::from_secs(60)).await?;
    println!("quiesce before the purge: {waited:.1} s, {dirty} dirty pages left");
    let (purge_secs, purged) = purge(&env.settings).await?;
    println!("purge: {} rows in {purge_secs:.2} s", thousands(purged));
    ensure!(purged == recalled, "the purge took {purged} rows out, {recalled} were taken back");
    let ratio = recall_secs / fanout_secs.max(1e-9);
    let time_ok = ratio <= 1.0;
    let badges_ok = wrong.is_empty() && served.len() as u64 == n;
    let first_wrong = wrong.first().map(|user| (user, served[user], truth.get(user)));
    Ok(format!(
        "\n================ notify-bench recall: summary ================\n\
         send {id}: {} recipients over {} shards, 1% read\n\
         fan-out (StartMessage -> COMPLETED)        {fanout_secs:>8.2} s\n\
         recall  (RecallMessage -> finished)        {recall_secs:>8.2} s  (the call answered in {answered_ms:.1} ms)\n\
         recall / fan-out = {ratio:.2}  target <= 1.0: {}\n\
         then retention's purge of the recalled rows (a worker's run purge_hidden_after_secs \
         later; not judged) {purge_secs:>8.2} s, {:.2} of the fan-out\n\
         items taken back {}; badges as served equal to MySQL: {} of {} ({} wrong{}): {}\n\
         ==============================================================",
        thousands(n),
        args.shards,
        verdict(time_ok),
        purge_secs / fanout_secs.max(1e-9),
        thousands(recalled),
        thousands(n - wrong.len() as u64),
        thousands(n),
        wrong.len(),
        first_wrong.map(|w| format!(", first {w:?}")).unwrap_or_default(),
        verdict(badges_ok),
    ))
}

/// Runs retention once as a worker would `purge_hidden_after_secs` after the
/// recall (every shard, one after the other); returns its time and the
/// hidden rows it purged.
async fn purge(settings: &Settings) -> anyhow::Result<(f64, u64)> {
    let pools = notify_store::db::connect(settings).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let cache =
        notify_cache::Cache::connect(&settings.redis).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let retention = &settings.retention;
    let later = chrono::Utc::now()
        + chrono::Duration::seconds(retention.purge_hidden_after_secs as i64 + 60);
    let started = Instant::now();
    let report = notify_core::retention::run_once(&pools, &cache, retention, later)
        .await
        .map_err(|e| anyhow::anyhow!("retention: {e}"))?;
    Ok((started.elapsed().as_secs_f64(), report.hidden_items_purged))
}

/// Every user's badge as served, `user -> (unread, unseen)`.
async fn badges(
    inbox: &InboxServiceClient<Channel>,
    n: u64,
) -> anyhow::Result<HashMap<u64, (u64, u64)>> {
    let batches: Vec<Vec<u64>> =
        (1..=n).collect::<Vec<_>>().chunks(BADGE_BATCH as usize).map(<[u64]>::to_vec).collect();
    let replies: Vec<Vec<v1::UnreadCount>> = futures::stream::iter(batches)
        .map(|user_ids| {
            let mut inbox = inbox.clone();
            async move {
                let request = v1::BatchGetUnreadCountsRequest { user_ids };
                let reply = inbox.batch_get_unread_counts(request).await?;
                Ok::<_, anyhow::Error>(reply.into_inner().counts)
            }
        })
        .buffer_unordered(8)
        .try_collect()
        .await?;
    Ok(replies.into_iter().flatten().map(|c| (c.user_id, (c.unread, c.unseen))).collect())
}

/// Users `1..=n` with a nonzero badge in MySQL, counted as the badge counts
/// (unread items in the inbox, unexpired, not withdrawn), `user -> (unread,
/// unseen)`; no live announcement runs here.
async fn mysql_badges(settings: &Settings, n: u64) -> anyhow::Result<HashMap<u64, (u64, u64)>> {
    let mut truth = HashMap::new();
    for pool in &harness::shard_pools(settings, 2).await? {
        let rows: Vec<(u64, i64, i64)> = sqlx::query_as(
            "SELECT i.user_id, COUNT(*), CAST(COALESCE(SUM(i.is_seen = 0), 0) AS SIGNED) \
             FROM message_items i JOIN message_contents c ON c.message_id = i.message_id \
             WHERE i.user_id BETWEEN 1 AND ? AND i.is_read = 0 AND i.is_archived = 0 \
             AND i.is_deleted = 0 AND c.revoked = 0 \
             AND (i.expire_at IS NULL OR i.expire_at > UTC_TIMESTAMP(3)) GROUP BY i.user_id",
        )
        .bind(n)
        .fetch_all(pool)
        .await?;
        for (user, unread, unseen) in rows {
            truth.insert(user, (unread.max(0) as u64, unseen.max(0) as u64));
        }
    }
    Ok(truth)
}
