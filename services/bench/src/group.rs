//! `notify-bench group`: `SendGroupMessage` latency in a 10-member and in a
//! 100,000-member group (the same sends, in alternating rounds, with one call
//! in flight and with `--concurrency`), then a member offline for 20,000
//! messages who pulls them in pages of 200, acking each page.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use notify_domain::Settings;
use notify_proto::v1;
use notify_proto::v1::group_service_client::GroupServiceClient;
use tonic::transport::Channel;

use crate::harness::{self, Env, thousands, verdict};
use crate::procstat::{CpuUse, Tracked};

type Client = GroupServiceClient<Channel>;

/// Most ids per `AddGroupMembers` call (the api's limit).
const MEMBER_BATCH: usize = 10_000;

/// Arguments of `notify-bench group`.
#[derive(Debug, Clone, clap::Args)]
pub struct GroupArgs {
    /// Members of the small group.
    #[arg(long, default_value_t = 10)]
    small: u64,
    /// Members of the big group (at most the api's `groups.max_members`).
    #[arg(long, default_value_t = 100_000)]
    big: u64,
    /// Timed SendGroupMessage calls per group, at each concurrency.
    #[arg(long, default_value_t = 2_000)]
    sends: u64,
    /// Calls in flight in the concurrent run (the other run has one).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Rounds the sends are split into; the groups alternate round by round.
    #[arg(long, default_value_t = 20)]
    rounds: u64,
    /// Messages the offline member misses.
    #[arg(long, default_value_t = 20_000)]
    backlog: u64,
    /// Sends in flight while the backlog builds up.
    #[arg(long, default_value_t = 32)]
    backlog_concurrency: usize,
    /// Messages per PullGroupMessages page.
    #[arg(long, default_value_t = 200)]
    page: u32,
    /// gRPC channels (HTTP/2 connections) the senders share.
    #[arg(long, default_value_t = 4)]
    channels: usize,
    /// Shard databases.
    #[arg(long, default_value_t = 4)]
    shards: u32,
}

/// Timed sends into one group: latencies (µs) and wall seconds.
struct Sends {
    hist: Histogram<u64>,
    secs: f64,
}

impl Sends {
    fn line(&self) -> String {
        format!(
            "p50 {:.3} ms  p99 {:.3} ms  mean {:.3} ms  {:>6} sends/s",
            ms(&self.hist, 0.5),
            ms(&self.hist, 0.99),
            self.hist.mean() / 1000.0,
            thousands((self.hist.len() as f64 / self.secs.max(1e-9)) as u64)
        )
    }
}

/// Both groups at one concurrency.
struct Level {
    concurrency: usize,
    small: Sends,
    big: Sends,
    cpu: CpuUse,
}

impl Level {
    fn ratio(&self, quantile: f64) -> f64 {
        ms(&self.big.hist, quantile) / ms(&self.small.hist, quantile).max(1e-3)
    }

    fn flat(&self) -> bool {
        self.ratio(0.5) <= 1.5 && self.ratio(0.99) <= 1.5
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1000.0
}

fn micros(started: Instant) -> u64 {
    (started.elapsed().as_nanos() as u64 / 1000).max(1)
}

/// Runs the benchmark and prints its report.
pub async fn run(args: GroupArgs) -> anyhow::Result<()> {
    ensure!(
        args.small > 0 && args.big > args.small && args.concurrency > 0 && args.channels > 0,
        "flags must be > 0 and --big must exceed --small"
    );
    ensure!(args.sends >= args.rounds && args.rounds > 0, "--sends must be >= --rounds > 0");
    ensure!(args.backlog > 0 && args.backlog_concurrency > 0, "backlog flags must be > 0");
    ensure!((1..=1000).contains(&args.page), "--page must be 1..=1000");
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut env = Env::new(harness::settings_for(&base, &tag, args.shards))?;
    println!(
        "notify-bench group: tag {tag}, groups of {} and {} members, {} sends per group at 1 and {} in flight, backlog {}, loadavg {}",
        thousands(args.small),
        thousands(args.big),
        thousands(args.sends),
        args.concurrency,
        thousands(args.backlog),
        crate::procstat::loadavg()
    );
    let outcome = crate::guarded(body(&mut env, &args)).await;
    env.finish(outcome).await
}

async fn body(env: &mut Env, args: &GroupArgs) -> anyhow::Result<String> {
    env.start_services().await?;
    let api_pid = env.pid("notify-api");
    println!(
        "services up: notify-api pid {api_pid} ({}); logs in {}",
        env.settings.api.listen,
        env.dir.display()
    );
    let tracked = Tracked::new(&[("api", api_pid)]);
    let mut clients = Vec::new();
    for _ in 0..args.channels {
        clients.push(GroupServiceClient::new(env.channel().await?));
    }
    let client = &mut clients[0].clone();

    // Both groups live on the same home shard, so only their size differs.
    let map = env.settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;
    let small_id = 1_000_000_001;
    let home = map.shard_for_user(small_id);
    let big_id = (small_id + 1..).find(|id| map.shard_for_user(*id) == home).context("group id")?;
    create_group(client, small_id, "bench-small").await?;
    create_group(client, big_id, "bench-big").await?;
    add_members(client, small_id, 1..=args.small).await?;
    let reader = args.small + 1;
    let (add_secs, slowest) = add_members(client, big_id, reader..=args.small + args.big).await?;
    println!(
        "groups: {small_id} with {} members, {big_id} with {} members (added in {add_secs:.1} s, slowest call {slowest:.0} ms), home shard {home}",
        thousands(args.small),
        thousands(args.big),
    );
    let mut server = harness::server_connection(&env.settings).await?;
    let (waited, dirty) = harness::quiesce(&mut server, Duration::from_secs(30)).await?;
    println!("quiesce: {waited:.1} s, {dirty} dirty pages left");

    // Warm-up (not timed): connections, caches, the seq rows.
    for group in [small_id, big_id] {
        burst(&clients, group, 200, args.concurrency).await?;
    }
    let mut levels = Vec::new();
    for concurrency in [1, args.concurrency] {
        let level = run_level(&clients, [small_id, big_id], args, concurrency, &tracked).await?;
        println!(
            "{concurrency} in flight: p50 small {:.3} ms, big {:.3} ms; big/small p50 {:.2} p99 {:.2}",
            ms(&level.small.hist, 0.5),
            ms(&level.big.hist, 0.5),
            level.ratio(0.5),
            level.ratio(0.99)
        );
        levels.push(level);
        env.check_children()?;
    }

    let offline = backlog(&clients, big_id, reader, args).await?;
    env.check_children()?;
    Ok(summary(args, [small_id, big_id], add_secs, slowest, &levels, &offline, &tracked))
}

async fn create_group(client: &mut Client, group_id: u64, name: &str) -> anyhow::Result<()> {
    let request = v1::CreateGroupRequest { group_id, name: name.into() };
    let created = client.create_group(request).await.context("CreateGroup")?.into_inner();
    ensure!(created.group_id == group_id, "CreateGroup returned group {}", created.group_id);
    Ok(())
}

/// Adds `users` in calls of 10,000; returns seconds taken and the slowest
/// call in ms.
async fn add_members(
    client: &mut Client,
    group_id: u64,
    users: std::ops::RangeInclusive<u64>,
) -> anyhow::Result<(f64, f64)> {
    let users: Vec<u64> = users.collect();
    let started = Instant::now();
    let mut slowest = 0.0f64;
    for batch in users.chunks(MEMBER_BATCH) {
        let call = Instant::now();
        let request =
            v1::AddGroupMembersRequest { group_id, user_ids: batch.to_vec(), with_history: false };
        let added = client.add_group_members(request).await.context("AddGroupMembers")?;
        slowest = slowest.max(call.elapsed().as_secs_f64() * 1000.0);
        let added = added.into_inner().added;
        ensure!(added == batch.len() as u64, "AddGroupMembers added {added} of {}", batch.len());
    }
    Ok((started.elapsed().as_secs_f64(), slowest))
}

/// One SendGroupMessage; returns (seq, message id, µs).
async fn send(mut client: Client, group_id: u64) -> anyhow::Result<(u64, u64, u64)> {
    let request = v1::SendGroupMessageRequest {
        group_id,
        sender: "notify-bench".into(),
        idempotency_key: String::new(),
        content: Some(v1::Content {
            title: "Group benchmark".into(),
            body: "A group message of notify-bench group, about as long as a chat line.".into(),
            category: "bench".into(),
            data: Default::default(),
            ..Default::default()
        }),
    };
    let started = Instant::now();
    let sent = client.send_group_message(request).await.context("SendGroupMessage")?.into_inner();
    Ok((sent.seq, sent.message_id, micros(started)))
}

/// `n` sends into one group with `concurrency` in flight over the shared
/// channels; returns every (seq, message id, µs) and the wall time.
async fn burst(
    clients: &[Client],
    group_id: u64,
    n: u64,
    concurrency: usize,
) -> anyhow::Result<(Vec<(u64, u64, u64)>, f64)> {
    let started = Instant::now();
    let sent = futures::stream::iter(0..n as usize)
        .map(|i| send(clients[i % clients.len()].clone(), group_id))
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok((sent, started.elapsed().as_secs_f64()))
}

/// `--sends` per group at one concurrency, in `--rounds` rounds that
/// alternate the groups (and which goes first), so drift hits both alike.
async fn run_level(
    clients: &[Client],
    groups: [u64; 2],
    args: &GroupArgs,
    concurrency: usize,
    tracked: &Tracked,
) -> anyhow::Result<Level> {
    let mut runs = [(); 2].map(|()| Sends { hist: new_hist(), secs: 0.0 });
    let cpu0 = tracked.snap();
    for round in 0..args.rounds {
        let n = args.sends * (round + 1) / args.rounds - args.sends * round / args.rounds;
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let (sent, secs) = burst(clients, groups[which], n, concurrency).await?;
            for (_, _, took) in sent {
                runs[which].hist.saturating_record(took);
            }
            runs[which].secs += secs;
        }
    }
    let cpu = tracked.between(&cpu0, &tracked.snap());
    let [small, big] = runs;
    Ok(Level { concurrency, small, big, cpu })
}

async fn group_unread(
    client: &mut Client,
    user_id: u64,
    group_id: u64,
) -> anyhow::Result<(u64, u64)> {
    let reply = client.get_group_unread(v1::GetGroupUnreadRequest { user_id }).await?;
    let group = reply.into_inner().groups.into_iter().find(|g| g.group_id == group_id);
    let group = group.with_context(|| format!("user {user_id} is not in group {group_id}"))?;
    Ok((group.unread, group.max_seq))
}

/// The reader acks everything so far, misses `--backlog` messages sent
/// concurrently, then pulls them page by page, acking each page; every
/// message must come back once, in seq order, with the id its send returned.
async fn backlog(
    clients: &[Client],
    group_id: u64,
    reader: u64,
    args: &GroupArgs,
) -> anyhow::Result<String> {
    let client = &mut clients[0].clone();
    let (_, max_seq) = group_unread(client, reader, group_id).await?;
    let request = v1::AckGroupMessagesRequest { user_id: reader, group_id, seq: max_seq };
    client.ack_group_messages(request).await.context("AckGroupMessages")?;

    let (mut sent, send_secs) =
        burst(clients, group_id, args.backlog, args.backlog_concurrency).await?;
    println!(
        "backlog: {} messages sent with {} in flight in {send_secs:.1} s ({} msg/s)",
        thousands(args.backlog),
        args.backlog_concurrency,
        thousands((args.backlog as f64 / send_secs) as u64)
    );
    sent.sort_unstable();
    let (unread_before, _) = group_unread(client, reader, group_id).await?;
    ensure!(unread_before == args.backlog, "reader has {unread_before} unread before pulling");

    let (mut pull, mut ack) = (new_hist(), new_hist());
    let mut received: Vec<(u64, u64)> = Vec::with_capacity(sent.len());
    let max_pages = args.backlog / u64::from(args.page) + 2;
    let mut pages = 0;
    let started = Instant::now();
    loop {
        ensure!(pages < max_pages, "still pulling after {pages} pages: the cursor does not move");
        let call = Instant::now();
        let request = v1::PullGroupMessagesRequest {
            user_id: reader,
            group_id,
            after_seq: None,
            limit: args.page,
        };
        let page = client.pull_group_messages(request).await.context("PullGroupMessages")?;
        pull.saturating_record(micros(call));
        let page = page.into_inner();
        pages += 1;
        received.extend(page.messages.iter().map(|m| (m.seq, m.message_id)));
        if let Some(last) = page.messages.last() {
            let call = Instant::now();
            let request = v1::AckGroupMessagesRequest { user_id: reader, group_id, seq: last.seq };
            let acked = client.ack_group_messages(request).await.context("AckGroupMessages")?;
            ack.saturating_record(micros(call));
            let cursor = acked.into_inner().last_ack_seq;
            ensure!(cursor == last.seq, "ack of seq {} left the cursor at {cursor}", last.seq);
        }
        if !page.has_more {
            break;
        }
        ensure!(!page.messages.is_empty(), "an empty page said has_more");
    }
    let pull_secs = started.elapsed().as_secs_f64();

    ensure!(
        received.len() == sent.len(),
        "pulled {} messages, {} were sent",
        received.len(),
        sent.len()
    );
    for (index, ((seq, id), (sent_seq, sent_id, _))) in received.iter().zip(&sent).enumerate() {
        ensure!(
            seq == sent_seq && id == sent_id,
            "message {index}: pulled seq {seq} id {id}, expected seq {sent_seq} id {sent_id}"
        );
    }
    ensure!(received.windows(2).all(|w| w[0].0 < w[1].0), "pulled seqs are not strictly ascending");
    let (first_seq, last_seq) = (sent[0].0, sent[sent.len() - 1].0);
    ensure!(
        first_seq == max_seq + 1 && last_seq - first_seq + 1 == args.backlog,
        "sent seqs {first_seq}..={last_seq} do not follow the acked seq {max_seq} without gaps"
    );
    let (unread_after, _) = group_unread(client, reader, group_id).await?;
    ensure!(unread_after == 0, "reader has {unread_after} unread after pulling everything");
    println!(
        "backlog: pulled in {pages} pages in {pull_secs:.1} s, seqs {first_seq}..={last_seq} verified"
    );
    let rate = |secs: f64| thousands((args.backlog as f64 / secs) as u64);
    let max = |h: &Histogram<u64>| h.max() as f64 / 1000.0;
    Ok(format!(
        "offline   user {reader} missed {} messages (sent with {} in flight in {send_secs:.1} s = {} msg/s), unread {} before pulling, 0 after\n\
         \x20         pulled in {pages} pages of <= {} with an ack after each: {pull_secs:.2} s = {} msg/s\n\
         \x20         per page: pull p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms | ack p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms\n\
         \x20         verified: seqs {first_seq}..={last_seq} each received once, in order, with the ids the sends returned: OK",
        thousands(args.backlog),
        args.backlog_concurrency,
        rate(send_secs),
        thousands(unread_before),
        args.page,
        rate(pull_secs),
        ms(&pull, 0.5),
        ms(&pull, 0.99),
        max(&pull),
        ms(&ack, 0.5),
        ms(&ack, 0.99),
        max(&ack),
    ))
}

fn summary(
    args: &GroupArgs,
    groups: [u64; 2],
    add_secs: f64,
    slowest: f64,
    levels: &[Level],
    offline: &str,
    tracked: &Tracked,
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "\n================ notify-bench group: summary ================");
    let _ = writeln!(
        s,
        "members   group {} has {}, group {} has {}: {} AddGroupMembers calls of <= {} in {add_secs:.1} s ({} members/s, slowest call {slowest:.0} ms)",
        groups[0],
        thousands(args.small),
        groups[1],
        thousands(args.big),
        args.big.div_ceil(MEMBER_BATCH as u64),
        thousands(MEMBER_BATCH as u64),
        thousands((args.big as f64 / add_secs) as u64)
    );
    let _ = writeln!(
        s,
        "SendGroupMessage: {} sends per group per level, {} rounds alternating the groups, same home shard",
        thousands(args.sends),
        args.rounds
    );
    for level in levels {
        let small = format!("{:>7} members: {}", thousands(args.small), level.small.line());
        let big = format!("{:>7} members: {}", thousands(args.big), level.big.line());
        let _ = writeln!(s, "  {:>3} in flight  {small}", level.concurrency);
        let _ = writeln!(s, "                 {big}");
        let _ = writeln!(
            s,
            "                 big/small p50 {:.2}  p99 {:.2}  (flat means both <= 1.5: {})",
            level.ratio(0.5),
            level.ratio(0.99),
            verdict(level.flat())
        );
        let _ = writeln!(s, "                 cpu {}", level.cpu.line(tracked.machine_max()));
    }
    let _ = writeln!(s, "{offline}");
    let _ = write!(s, "==============================================================");
    s
}
