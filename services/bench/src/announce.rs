//! `notify-bench announce`: `SendMessage(all_users)` latency with 1,000 and
//! with 1,000,000 users known to the system, and the cost of the first inbox
//! read after an announcement (which materializes it) against a second read.

use std::time::Instant;

use anyhow::ensure;
use hdrhistogram::Histogram;
use notify_domain::Settings;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use shard_router::ShardMap;
use sqlx::QueryBuilder;
use sqlx::mysql::MySqlPool;
use tonic::transport::Channel;

use crate::harness::{self, Env, thousands, verdict};

/// Arguments of `notify-bench announce`.
#[derive(Debug, Clone, clap::Args)]
pub struct AnnounceArgs {
    /// Users known in the small run.
    #[arg(long, default_value_t = 1_000)]
    small: u64,
    /// Users known in the large run.
    #[arg(long, default_value_t = 1_000_000)]
    large: u64,
    /// Timed SendMessage(all_users) calls per run.
    #[arg(long, default_value_t = 50)]
    sends: u32,
    /// Users whose first and second inbox reads are timed.
    #[arg(long, default_value_t = 200)]
    readers: u64,
    /// Known users whose first reads of a fresh announcement go at once.
    #[arg(long, default_value_t = 2_000)]
    crowd: u64,
    /// Concurrent readers of the crowd.
    #[arg(long, default_value_t = 16)]
    crowd_tasks: usize,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: AnnounceArgs) -> anyhow::Result<()> {
    ensure!(args.small > 0 && args.large > args.small && args.sends > 0, "bad flags");
    ensure!(args.crowd > 0 && args.crowd <= args.large && args.crowd_tasks > 0, "bad flags");
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut env = Env::new(harness::settings_for(&base, &tag, 4))?;
    println!(
        "notify-bench announce: tag {tag}, {} then {} known users",
        thousands(args.small),
        thousands(args.large)
    );
    let outcome = crate::guarded(body(&mut env, &args)).await;
    env.finish(outcome).await
}

async fn body(env: &mut Env, args: &AnnounceArgs) -> anyhow::Result<String> {
    env.start_services().await?;
    let pools = harness::shard_pools(&env.settings, 8).await?;
    let map = env.settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;
    let channel = env.channel().await?;

    seed_users(&pools, &map, 1, args.small).await?;
    let small = time_sends(&channel, args.sends).await?;
    seed_users(&pools, &map, args.small + 1, args.large).await?;
    let large = time_sends(&channel, args.sends).await?;

    // First read after an announcement (materializes every live one in one
    // transaction) against a second read of the same inbox.
    let mut server = harness::server_connection(&env.settings).await?;
    let announcement = send_announcement(&mut MessageServiceClient::new(channel.clone())).await?;
    let mut inbox = InboxServiceClient::new(channel.clone());
    let mut first = Histogram::<u64>::new(3)?;
    let mut second = Histogram::<u64>::new(3)?;
    let (mut first_commits, mut second_commits) = (0, 0);
    for user_id in 5_000_000_001..5_000_000_001 + args.readers {
        let before = harness::mysql_status(&mut server).await?;
        let took = list(&mut inbox, user_id).await?;
        let middle = harness::mysql_status(&mut server).await?;
        first.record(took)?;
        let took = list(&mut inbox, user_id).await?;
        let after = harness::mysql_status(&mut server).await?;
        second.record(took)?;
        first_commits += commits(&before, &middle);
        second_commits += commits(&middle, &after);
    }
    let extra = (first_commits as f64 - second_commits as f64) / args.readers as f64;

    // A crowd of known users opening their inbox right after a fresh
    // announcement: each first read materializes it (every first read
    // counts it in the announcement's stats on its shard), against the
    // same users' second reads, which have nothing to materialize. Both
    // miss the page cache, as every first read after an announcement does
    // (its start retires every cached page): the second reads ask for
    // another page size.
    let crowd: Vec<u64> = (1..=args.crowd).map(|i| i * (args.large / args.crowd)).collect();
    read_all(&channel, &crowd, args.crowd_tasks, 20).await?; // the announcements timed above
    send_announcement(&mut MessageServiceClient::new(channel.clone())).await?;
    let first_crowd = read_all(&channel, &crowd, args.crowd_tasks, 20).await?;
    let second_crowd = read_all(&channel, &crowd, args.crowd_tasks, 19).await?;
    let crowd_ratio = second_crowd / first_crowd;
    let growth = large.value_at_quantile(0.5) as f64 / small.value_at_quantile(0.5).max(1) as f64;
    Ok(format!(
        "\n================ notify-bench announce: summary ================\n\
         SendMessage(all_users), {} known users: p50 {:.2} ms  p99 {:.2} ms\n\
         SendMessage(all_users), {} known users: p50 {:.2} ms  p99 {:.2} ms\n\
         growth    p50 large/small = {growth:.2}  (flat means <= 1.5: {})\n\
         inbox     first read after announcement {announcement}: p50 {:.2} ms p99 {:.2} ms; second read p50 {:.2} ms p99 {:.2} ms\n\
         txns      extra commits per first read = {extra:.2}  (target <= 1: {})\n\
         crowd     {} first reads by {} readers: {:.0}/s; second reads {:.0}/s; ratio {crowd_ratio:.2}  (target >= 0.5: {})\n\
         ==================================================================",
        thousands(args.small),
        ms(&small, 0.5),
        ms(&small, 0.99),
        thousands(args.large),
        ms(&large, 0.5),
        ms(&large, 0.99),
        verdict(growth <= 1.5),
        ms(&first, 0.5),
        ms(&first, 0.99),
        ms(&second, 0.5),
        ms(&second, 0.99),
        verdict(extra <= 1.0),
        thousands(args.crowd),
        args.crowd_tasks,
        args.crowd as f64 / first_crowd,
        args.crowd as f64 / second_crowd,
        verdict(crowd_ratio >= 0.5),
    ))
}

/// Reads every user's first inbox page of `page_size`, `tasks` readers at
/// once; returns the seconds it took.
async fn read_all(
    channel: &Channel,
    users: &[u64],
    tasks: usize,
    page_size: u32,
) -> anyhow::Result<f64> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    let readers = (0..tasks).map(|_| {
        let mut inbox = InboxServiceClient::new(channel.clone());
        let next = &next;
        async move {
            loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(user_id) = users.get(index) else { return Ok::<_, anyhow::Error>(()) };
                list_page(&mut inbox, *user_id, page_size).await?;
            }
        }
    });
    futures::future::try_join_all(readers).await?;
    Ok(started.elapsed().as_secs_f64())
}

fn ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1000.0
}

fn commits(
    a: &std::collections::HashMap<String, u64>,
    b: &std::collections::HashMap<String, u64>,
) -> u64 {
    let get =
        |m: &std::collections::HashMap<String, u64>| m.get("Com_commit").copied().unwrap_or(0);
    get(b).saturating_sub(get(a))
}

/// Makes users known to the system the way real ones are: an inbox-state row
/// and one delivered item each, on their own shard.
async fn seed_users(pools: &[MySqlPool], map: &ShardMap, from: u64, to: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    let users: Vec<u64> = (from..=to).collect();
    for (shard, ids) in map.partition_users(&users) {
        let pool = &pools[map.slot_of(shard).unwrap_or(0)];
        for part in ids.chunks(1000) {
            let mut state = QueryBuilder::new("INSERT IGNORE INTO user_inbox_state (user_id) ");
            state.push_values(part, |mut row, id| {
                row.push_bind(*id);
            });
            state.build().execute(pool).await?;
            let mut items = QueryBuilder::new(
                "INSERT IGNORE INTO message_items (user_id, message_id, is_read) ",
            );
            items.push_values(part, |mut row, id| {
                row.push_bind(*id).push_bind(1u64).push_bind(1u8);
            });
            items.build().execute(pool).await?;
        }
    }
    println!(
        "seeded users {}..={} in {:.1} s",
        thousands(from),
        thousands(to),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn send_announcement(client: &mut MessageServiceClient<Channel>) -> anyhow::Result<u64> {
    let response = client
        .send_message(v1::SendMessageRequest {
            sender: "bench".into(),
            content: Some(v1::Content {
                title: "announcement".into(),
                body: "body".into(),
                ..Default::default()
            }),
            audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
            ..Default::default()
        })
        .await?;
    Ok(response.into_inner().message_id)
}

async fn time_sends(channel: &Channel, sends: u32) -> anyhow::Result<Histogram<u64>> {
    let mut client = MessageServiceClient::new(channel.clone());
    let mut histogram = Histogram::<u64>::new(3)?;
    send_announcement(&mut client).await?; // warm-up
    for _ in 0..sends {
        let started = Instant::now();
        send_announcement(&mut client).await?;
        histogram.record(started.elapsed().as_micros() as u64)?;
    }
    Ok(histogram)
}

async fn list(inbox: &mut InboxServiceClient<Channel>, user_id: u64) -> anyhow::Result<u64> {
    list_page(inbox, user_id, 20).await
}

async fn list_page(
    inbox: &mut InboxServiceClient<Channel>,
    user_id: u64,
    page_size: u32,
) -> anyhow::Result<u64> {
    let started = Instant::now();
    let page = inbox
        .list_inbox(v1::ListInboxRequest { user_id, page_size, ..Default::default() })
        .await?
        .into_inner();
    ensure!(!page.items.is_empty(), "user {user_id} saw no announcement");
    Ok(started.elapsed().as_micros() as u64)
}
