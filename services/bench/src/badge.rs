//! `notify-bench badge`: `GetUnreadCount` over gRPC against raw Redis `GET`
//! of the same keys at the same concurrency, and `ListInbox` latency for a
//! user with 1,000 items on a shard holding ~1M items (in [`inbox`]).

mod auth;
mod inbox;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use hdrhistogram::Histogram;
use notify_cache::Keys;
use notify_domain::Settings;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use redis::AsyncCommands;
use secrecy::ExposeSecret;
use tonic::transport::Channel;

use self::inbox::{Inbox, run_inbox};
use crate::harness::{self, Env, thousands, verdict};
use crate::procstat::{CpuUse, RssSampler, Tracked};
use crate::wire::WireChannel;

const GET_UNREAD_COUNT: &str = "/notify.v1.InboxService/GetUnreadCount";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const BATCH_GET_UNREAD_COUNTS: &str = "/notify.v1.InboxService/BatchGetUnreadCounts";
/// Users per BatchGetUnreadCounts call (a gateway's or list page's batch).
const BATCH_USERS: u64 = 100;

/// Arguments of `notify-bench badge`.
#[derive(Debug, Clone, clap::Args)]
pub struct BadgeArgs {
    /// Users 1..=N that receive one message (a third then mark it read).
    #[arg(long, default_value_t = 10_000)]
    users: u64,
    /// Concurrent requesters, for raw GET and for GetUnreadCount alike.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Measured seconds of each run (raw GET and GetUnreadCount: over all
    /// rounds together).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Unmeasured warm-up seconds before each run (and each round).
    #[arg(long, default_value_t = 1)]
    warmup_secs: u64,
    /// Rounds that raw GET and GetUnreadCount take turns in, so that a
    /// burst of CPU steal on a shared machine hits both sides alike.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// gRPC channels (HTTP/2 connections) the requesters share.
    #[arg(long, default_value_t = 4)]
    channels: usize,
    /// Threads of the load generator; raw GET and GetUnreadCount run once
    /// with each count and the ratio takes each side's best run.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2])]
    driver_threads: Vec<usize>,
    /// Shard databases.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Items of other users seeded on the ListInbox user's shard.
    #[arg(long, default_value_t = 1_000_000)]
    inbox_shard_rows: u64,
    /// Items of the ListInbox user.
    #[arg(long, default_value_t = 1_000)]
    inbox_items: u64,
    /// Timed ListInbox calls, one at a time.
    #[arg(long, default_value_t = 1_000)]
    inbox_calls: u64,
    /// Timed ListInbox calls by the 16 concurrent readers (and as many
    /// direct SQL queries by 16 connections).
    #[arg(long, default_value_t = 16_000)]
    inbox_concurrent_calls: u64,
    /// Pages followed by cursor before restarting from the first page.
    #[arg(long, default_value_t = 5)]
    inbox_pages: u32,
}

struct Load {
    ops: u64,
    wrong: u64,
    secs: f64,
    hist: Histogram<u64>,
    cpu: CpuUse,
}

impl Load {
    /// Adds another round of the same load.
    fn merge(&mut self, round: Load) -> anyhow::Result<()> {
        self.ops += round.ops;
        self.wrong += round.wrong;
        self.secs += round.secs;
        self.hist.add(&round.hist)?;
        self.cpu =
            CpuUse::mean(&[self.cpu.clone(), round.cpu], &[self.secs - round.secs, round.secs]);
        Ok(())
    }

    fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    fn ms(&self, quantile: f64) -> f64 {
        self.hist.value_at_quantile(quantile) as f64 / 1000.0
    }
}

/// A user's unread: every third user read their message.
fn expected_unread(user: u64) -> u64 {
    u64::from(!user.is_multiple_of(3))
}

/// A user's unseen: of the unread, every fifth user saw theirs (the bell
/// opened, the item not read), so unseen differs from unread for them.
fn expected_unseen(user: u64) -> u64 {
    expected_unread(user) * u64::from(!user.is_multiple_of(5))
}

/// Unread and unseen as the one number a requester checks.
fn badge(unread: u64, unseen: u64) -> u64 {
    (unread << 32) | unseen.min(u64::from(u32::MAX))
}

/// The badge every answer for `user` must carry.
fn expected_badge(user: u64) -> u64 {
    badge(expected_unread(user), expected_unseen(user))
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Runs the benchmark and prints its report.
pub async fn run(args: BadgeArgs) -> anyhow::Result<()> {
    ensure!(args.users > 0 && args.concurrency > 0 && args.channels > 0, "flags must be > 0");
    ensure!(
        !args.driver_threads.is_empty() && !args.driver_threads.contains(&0),
        "--driver-threads needs thread counts of at least 1"
    );
    ensure!(
        args.rounds > 0 && args.seconds * 1000 / u64::from(args.rounds) >= 100,
        "--rounds must be at least 1, with at least 100 ms of --seconds per round"
    );
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let settings = harness::settings_for(&base, &tag, args.shards);
    let mut env = Env::new(settings)?;
    println!(
        "notify-bench badge: tag {tag}, {} users, concurrency {}, {} s per run, {} gRPC channels, loadavg {}",
        thousands(args.users),
        args.concurrency,
        args.seconds,
        args.channels,
        crate::procstat::loadavg()
    );
    let outcome = crate::guarded(body(&mut env, &args)).await;
    env.finish(outcome).await
}

async fn body(env: &mut Env, args: &BadgeArgs) -> anyhow::Result<String> {
    env.start_services().await?;
    let api_pid = env.pid("notify-api");
    let worker_pid = env.pid("notify-worker");
    println!(
        "services up: notify-api pid {api_pid} ({}), notify-worker pid {worker_pid}; logs in {}",
        env.settings.api.listen,
        env.dir.display()
    );
    let tracked = Tracked::new(&[("api", api_pid), ("worker", worker_pid)]);
    let rss = RssSampler::start(vec![api_pid, worker_pid]);
    let mut channels = Vec::new();
    let mut wires = Vec::new();
    for _ in 0..args.channels {
        channels.push(env.channel().await?);
        wires.push(WireChannel::connect(&env.settings.api.listen).await?);
    }

    let t = Instant::now();
    seed_badges(env, &channels[0], args).await?;
    warm_badges(args, &wires).await?;
    println!(
        "seeded: 1 message to {} users, a third marked read, badges and group cursors cached ({:.1} s)",
        thousands(args.users),
        t.elapsed().as_secs_f64()
    );

    // The api's strategy: one multiplexed connection (ConnectionManager).
    let client = redis::Client::open(env.settings.redis.url.expose_secret())?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(3)));
    let redis_conn = client.get_connection_manager_with_config(config).await?;
    let keys = Keys::new(&env.settings.redis.key_prefix);
    let cached = cached_badges(&redis_conn, &keys, args.users).await?;
    ensure!(
        cached == args.users,
        "only {cached} of {} badges are cached (under {}) after warming",
        args.users,
        keys.unread(1)
    );
    println!("badge keys: {}, all {} cached", keys.unread(1), thousands(cached));

    let report = |name: &str, load: &Load| {
        println!(
            "{name}: {} req/s, p50 {:.3} ms, p99 {:.3} ms",
            thousands(load.rate() as u64),
            load.ms(0.5),
            load.ms(0.99)
        );
    };
    let url = env.settings.redis.url.expose_secret().to_owned();
    let addr = env.settings.api.listen.clone();
    // Raw GET and GetUnreadCount take turns, round after round, so drift
    // and bursts of CPU steal of a shared machine hit both sides alike.
    let whole = Duration::from_secs(args.seconds);
    let round = whole / args.rounds;
    // The no-op gRPC floor (Health/Check) takes its turns in the same
    // rounds, right before or after GetUnreadCount (alternating), so the
    // floor ratio compares loads that saw the same machine.
    let (mut raw, mut grpc, mut floor): (Vec<PerThreads>, Vec<PerThreads>, Vec<PerThreads>) =
        (Vec::new(), Vec::new(), Vec::new());
    let (mut badge_hits, mut badge_misses, mut read_batch, mut read_batches) = (0.0, 0.0, 0.0, 0.0);
    for index in 0..args.rounds as usize {
        for (slot, &threads) in args.driver_threads.iter().enumerate() {
            let load = run_raw(args, &tracked, (threads, round), url.clone(), &keys).await?;
            merge_round(&mut raw, index, slot, threads, load)?;
            let target = (addr.as_str(), None);
            for path in grpc_turns(index) {
                if path == HEALTH_CHECK {
                    let load = run_wire(args, &tracked, (threads, round), target, path).await?;
                    merge_round(&mut floor, index, slot, threads, load)?;
                    continue;
                }
                let before = env.scrape("notify-api").await;
                let load = run_wire(args, &tracked, (threads, round), target, path).await?;
                merge_round(&mut grpc, index, slot, threads, load)?;
                let after = env.scrape("notify-api").await;
                let counted = |name: &str| after.sum(name, &[]) - before.sum(name, &[]);
                badge_hits += counted("notify_badge_cache_hits_total");
                badge_misses += counted("notify_badge_cache_misses_total");
                read_batch += counted("notify_badge_read_batch_size_sum");
                read_batches += counted("notify_badge_read_batch_size_count");
            }
        }
        println!("round {} of {} done", index + 1, args.rounds);
    }
    for (((threads, raw), (_, grpc)), (_, floor)) in raw.iter().zip(&grpc).zip(&floor) {
        report(&format!("raw redis GET ({threads}-thread load)"), raw);
        report(&format!("GetUnreadCount ({threads}-thread h2 load)"), grpc);
        report(
            &format!("grpc.health.v1.Health/Check (gRPC floor, {threads}-thread h2 load)"),
            floor,
        );
    }
    let batched =
        run_wire(args, &tracked, (1, whole), (&addr, None), BATCH_GET_UNREAD_COUNTS).await?;
    report("BatchGetUnreadCounts, 100 users a call (1-thread h2 load)", &batched);
    let tonic = run_tonic(args, &tracked, (2, whole), &addr).await?;
    report("GetUnreadCount (2-thread tonic load)", &tonic);
    env.check_children()?;
    let sequential = sequential_badges(args, &wires[0]).await?;
    println!(
        "GetUnreadCount, one call at a time: p50 {:.3} ms, p99 {:.3} ms",
        sequential.value_at_quantile(0.5) as f64 / 1000.0,
        sequential.value_at_quantile(0.99) as f64 / 1000.0
    );

    let inbox = run_inbox(env, args, (&channels[0], &addr), &tracked).await?;
    let peaks = rss.peaks();
    drop(rss);
    let auth = auth::overhead(env, args).await?;
    let runs = Runs { raw, grpc, floor, tonic, batch: batched, sequential };
    let cache = CacheUse {
        hits: badge_hits,
        misses: badge_misses,
        mean_batch: read_batch / read_batches.max(1.0),
    };
    let mut report = summary(args, &runs, &cache, &inbox, &peaks, tracked.machine_max());
    report.push_str(&auth);
    Ok(report)
}

/// The gRPC paths of round `index`, in turn: GetUnreadCount first in even
/// rounds, the floor first in odd ones.
fn grpc_turns(index: usize) -> [&'static str; 2] {
    if index.is_multiple_of(2) {
        [GET_UNREAD_COUNT, HEALTH_CHECK]
    } else {
        [HEALTH_CHECK, GET_UNREAD_COUNT]
    }
}

/// A run and the load generator's thread count.
type PerThreads = (usize, Load);

/// Adds a round's load to the run of its driver thread count (`slot`).
fn merge_round(
    runs: &mut Vec<PerThreads>,
    round: usize,
    slot: usize,
    threads: usize,
    load: Load,
) -> anyhow::Result<()> {
    if round == 0 {
        runs.push((threads, load));
        return Ok(());
    }
    runs[slot].1.merge(load)
}

/// Every badge run, for the summary; raw and gRPC per driver thread count.
struct Runs {
    raw: Vec<(usize, Load)>,
    grpc: Vec<(usize, Load)>,
    /// Health/Check per driver thread count, in the same rounds as `grpc`.
    floor: Vec<(usize, Load)>,
    tonic: Load,
    /// BatchGetUnreadCounts of [`BATCH_USERS`] users a call.
    batch: Load,
    sequential: Histogram<u64>,
}

/// The api's badge cache during the h2-client GetUnreadCount runs.
struct CacheUse {
    hits: f64,
    misses: f64,
    mean_batch: f64,
}

/// One GetUnreadCount per user (32 at a time), checking every answer: this
/// also caches each user's group cursors, which BatchGetUnreadCounts (the
/// inbox badge alone) does not read.
async fn warm_badges(args: &BadgeArgs, wires: &[WireChannel]) -> anyhow::Result<()> {
    let answers = futures::stream::iter(1..=args.users)
        .map(|user_id| {
            let wire = wires[user_id as usize % wires.len()].clone();
            async move {
                let request = v1::GetUnreadCountRequest { user_id };
                let reply: v1::GetUnreadCountResponse =
                    wire.unary(GET_UNREAD_COUNT, &request).await?;
                Ok::<_, anyhow::Error>((user_id, reply.unread, reply.unseen))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    for answer in answers {
        let (user, unread, unseen) = answer?;
        ensure!(
            badge(unread, unseen) == expected_badge(user),
            "user {user} has unread {unread} unseen {unseen} while warming"
        );
    }
    Ok(())
}

/// GetUnreadCount with one call in flight: latency without queueing.
async fn sequential_badges(args: &BadgeArgs, wire: &WireChannel) -> anyhow::Result<Histogram<u64>> {
    let mut hist = new_hist();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    for call in 0..1100 {
        let user = 1 + xorshift(&mut rng) % args.users;
        let started = Instant::now();
        let request = v1::GetUnreadCountRequest { user_id: user };
        let reply: v1::GetUnreadCountResponse = wire.unary(GET_UNREAD_COUNT, &request).await?;
        if call >= 100 {
            hist.saturating_record((started.elapsed().as_nanos() as u64 / 1000).max(1));
        }
        ensure!(
            badge(reply.unread, reply.unseen) == expected_badge(user),
            "wrong badge for user {user}"
        );
    }
    Ok(hist)
}

async fn seed_badges(env: &mut Env, channel: &Channel, args: &BadgeArgs) -> anyhow::Result<()> {
    let mut messages = MessageServiceClient::new(channel.clone())
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let users: Vec<u64> = (1..=args.users).collect();
    let content = v1::Content {
        title: "Badge benchmark".into(),
        body: "Seed message of notify-bench badge.".into(),
        category: "bench".into(),
        data: Default::default(),
        ..Default::default()
    };
    let message_id = if users.len() <= 100_000 {
        messages
            .send_message(v1::SendMessageRequest {
                sender: "notify-bench".into(),
                content: Some(content),
                audience: Some(v1::send_message_request::Audience::Users(v1::UserAudience {
                    user_ids: users.clone(),
                    ..Default::default()
                })),
                ..Default::default()
            })
            .await
            .context("SendMessage")?
            .into_inner()
            .message_id
    } else {
        harness::send_draft(channel, content, &users).await?
    };
    let mut stream = messages
        .watch_message(v1::WatchMessageRequest { message_id, interval_ms: 100 })
        .await?
        .into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    loop {
        let message = tokio::time::timeout_at(deadline, stream.message())
            .await
            .context("seed send did not complete within 600 s")??
            .context("WatchMessage ended before COMPLETED")?;
        if message.status == v1::MessageStatus::Completed as i32 {
            let delivered = message.progress.unwrap_or_default().delivered;
            ensure!(delivered == args.users, "seed send delivered {delivered} of {}", args.users);
            break;
        }
    }
    drop(stream);
    env.check_children()?;

    // A third of the users read their message.
    let inbox = InboxServiceClient::new(channel.clone());
    let marks = futures::stream::iter((1..=args.users).filter(|u| u % 3 == 0))
        .map(|user_id| {
            let mut inbox = inbox.clone();
            async move {
                inbox
                    .mark_all_read(v1::MarkAllReadRequest { user_id, ..Default::default() })
                    .await
                    .map(|r| r.into_inner().marked)
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for marked in marks {
        ensure!(marked.context("MarkAllRead")? == 1, "MarkAllRead marked an unexpected count");
    }
    // Every fifth of the others saw theirs (the bell opened, not read):
    // unseen then differs from unread, and every answer is checked for both.
    let seen = futures::stream::iter((1..=args.users).filter(|u| expected_unseen(*u) == 0))
        .filter(|u| std::future::ready(expected_unread(*u) == 1))
        .map(|user_id| {
            let mut inbox = inbox.clone();
            async move {
                let all = v1::ItemFilter::default();
                inbox
                    .update_items(v1::UpdateItemsRequest {
                        user_id,
                        action: v1::ItemAction::MarkSeen as i32,
                        message_ids: Vec::new(),
                        all: Some(all),
                    })
                    .await
                    .map(|r| r.into_inner())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for reply in seen {
        let reply = reply.context("UpdateItems(MARK_SEEN, all)")?;
        ensure!(
            reply.changed == 1 && reply.unread == 1 && reply.unseen == 0,
            "UpdateItems(MARK_SEEN, all) answered {reply:?}"
        );
    }

    // Warm the cache in one pass and check every count.
    let mut inbox = inbox;
    let ids: Vec<u64> = (1..=args.users).collect();
    for batch in ids.chunks(1000) {
        let counts = inbox
            .batch_get_unread_counts(v1::BatchGetUnreadCountsRequest { user_ids: batch.to_vec() })
            .await
            .context("BatchGetUnreadCounts")?
            .into_inner()
            .counts;
        ensure!(
            counts.len() == batch.len(),
            "BatchGetUnreadCounts returned {} counts",
            counts.len()
        );
        for count in counts {
            ensure!(
                badge(count.unread, count.unseen) == expected_badge(count.user_id),
                "user {} has unread {} unseen {}, expected {} and {}",
                count.user_id,
                count.unread,
                count.unseen,
                expected_unread(count.user_id),
                expected_unseen(count.user_id)
            );
        }
    }
    Ok(())
}

/// Counts the users whose badge is cached (under the service's own key
/// names, [`Keys::unread`]).
async fn cached_badges(
    conn: &redis::aio::ConnectionManager,
    keys: &Keys,
    users: u64,
) -> anyhow::Result<u64> {
    let mut conn = conn.clone();
    let mut cached = 0;
    let ids: Vec<u64> = (1..=users).collect();
    for batch in ids.chunks(1000) {
        let names: Vec<String> = batch.iter().map(|user| keys.unread(*user)).collect();
        let values: Vec<Option<String>> = conn.mget(&names).await?;
        cached += values.iter().flatten().count() as u64;
    }
    Ok(cached)
}

/// Common driver. The load runs on a runtime of its own with `threads`
/// threads. With one (as `redis-benchmark` and `h2load` run), one thread
/// drives every connection: the load generator pays no cross-thread
/// wake-ups and its CPU cost per call stays small next to the servers' (on
/// a 2-core machine it shares the CPU with them); with more, it can keep more
/// calls moving when a server is quick. `connect` runs on that runtime, so
/// the connections it opens are driven there too; it returns the call. Then
/// `concurrency` tasks run `call(task, user)` in a loop for warm-up +
/// measured seconds; only calls started inside the measured window count.
async fn drive<C, CFut, F, Fut>(
    args: &BadgeArgs,
    tracked: &Tracked,
    threads: usize,
    measured: Duration,
    connect: C,
) -> anyhow::Result<Load>
where
    C: FnOnce() -> CFut + Send + 'static,
    CFut: Future<Output = anyhow::Result<F>>,
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<u64>> + Send + 'static,
{
    let (concurrency, users) = (args.concurrency, args.users);
    let warmup = Duration::from_secs(args.warmup_secs);
    let (window_tx, window_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let load = async move {
            let call = Arc::new(connect().await?);
            let measure_from = Instant::now() + warmup;
            let end = measure_from + measured;
            let _ = window_tx.send((measure_from, end));
            let tasks: Vec<_> = (0..concurrency)
                .map(|task| tokio::spawn(requester(call.clone(), task, users, measure_from, end)))
                .collect();
            let mut total = (new_hist(), 0u64, 0u64);
            for task in tasks {
                let (hist, ops, wrong) = task.await??;
                total.0.add(&hist)?;
                total.1 += ops;
                total.2 += wrong;
            }
            Ok::<_, anyhow::Error>(total)
        };
        let mut runtime = if threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads);
            builder
        };
        let result = runtime
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|runtime| runtime.block_on(load));
        let _ = done_tx.send(result);
    });
    let Ok((measure_from, end)) = window_rx.await else {
        // The load thread failed before it started: report why.
        return Err(done_rx
            .await
            .context("load thread died")?
            .err()
            .context("load thread died")?);
    };
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu0 = tracked.snap();
    tokio::time::sleep_until(end.into()).await;
    let cpu1 = tracked.snap();
    let (hist, ops, wrong) = done_rx.await.context("load thread died")??;
    let secs = measured.as_secs_f64();
    Ok(Load { ops, wrong, secs, hist, cpu: tracked.between(&cpu0, &cpu1) })
}

/// One requester of [`drive`]: random users, one call at a time.
async fn requester<F, Fut>(
    call: Arc<F>,
    task: usize,
    users: u64,
    measure_from: Instant,
    end: Instant,
) -> anyhow::Result<(Histogram<u64>, u64, u64)>
where
    F: Fn(usize, u64) -> Fut,
    Fut: Future<Output = anyhow::Result<u64>>,
{
    let mut hist = new_hist();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ ((task as u64 + 1) << 32);
    let (mut ops, mut wrong) = (0u64, 0u64);
    loop {
        let started = Instant::now();
        if started >= end {
            return Ok((hist, ops, wrong));
        }
        let user = 1 + xorshift(&mut rng) % users;
        let value = call(task, user).await?;
        if started >= measure_from {
            hist.saturating_record((started.elapsed().as_nanos() as u64 / 1000).max(1));
            ops += 1;
            if value != expected_badge(user) {
                wrong += 1;
            }
        }
    }
}

/// Raw GET over one multiplexed connection (the api's own strategy).
async fn run_raw(
    args: &BadgeArgs,
    tracked: &Tracked,
    (threads, measured): (usize, Duration),
    url: String,
    keys: &Keys,
) -> anyhow::Result<Load> {
    let keys = keys.clone();
    drive(args, tracked, threads, measured, move || async move {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(Duration::from_secs(3)));
        let conn = client.get_connection_manager_with_config(config).await?;
        Ok(move |_task, user| {
            let mut conn = conn.clone();
            let key = keys.unread(user);
            async move {
                // `epoch:unread:unseen`, as the api reads it.
                let value: Option<String> = conn.get(&key).await?;
                let counts = value.as_deref().and_then(|v| {
                    let mut parts = v.split(':').skip(1).map(str::parse::<u64>);
                    Some(badge(parts.next()?.ok()?, parts.next()?.ok()?))
                });
                Ok(counts.unwrap_or(u64::MAX))
            }
        })
    })
    .await
}

/// GetUnreadCount through tonic clients: what a Rust service calling the
/// api sees, client costs included.
async fn run_tonic(
    args: &BadgeArgs,
    tracked: &Tracked,
    (threads, measured): (usize, Duration),
    addr: &str,
) -> anyhow::Result<Load> {
    let (uri, connections) = (format!("http://{addr}"), args.channels);
    drive(args, tracked, threads, measured, move || async move {
        let mut clients = Vec::new();
        for _ in 0..connections {
            let channel = Channel::from_shared(uri.clone())?.tcp_nodelay(true).connect().await?;
            clients.push(InboxServiceClient::new(channel));
        }
        Ok(move |task: usize, user| {
            let mut client = clients[task % clients.len()].clone();
            async move {
                let reply =
                    client.get_unread_count(v1::GetUnreadCountRequest { user_id: user }).await?;
                let reply = reply.into_inner();
                Ok(badge(reply.unread, reply.unseen))
            }
        })
    })
    .await
}

/// GetUnreadCount, or the api's health check (what any RPC costs, with no
/// Redis behind it), through the lean h2 client.
///
/// `target` is the api's address and the bearer token to send, if any.
async fn run_wire(
    args: &BadgeArgs,
    tracked: &Tracked,
    (threads, measured): (usize, Duration),
    (addr, token): (&str, Option<&str>),
    path: &'static str,
) -> anyhow::Result<Load> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
    let (addr, connections, users) = (addr.to_owned(), args.channels, args.users);
    let token = token.map(str::to_owned);
    drive(args, tracked, threads, measured, move || async move {
        let mut wires = Vec::new();
        for _ in 0..connections {
            wires.push(match &token {
                Some(token) => WireChannel::connect_with_token(&addr, token).await?,
                None => WireChannel::connect(&addr).await?,
            });
        }
        Ok(move |task: usize, user| {
            let wire = wires[task % wires.len()].clone();
            async move {
                if path == HEALTH_CHECK {
                    let request = HealthCheckRequest { service: String::new() };
                    let reply: HealthCheckResponse = wire.unary(path, &request).await?;
                    // Counted as right when serving.
                    let serving = reply.status == ServingStatus::Serving as i32;
                    return Ok(if serving { expected_badge(user) } else { u64::MAX });
                }
                if path == BATCH_GET_UNREAD_COUNTS {
                    // BATCH_USERS consecutive users from `user` (kept in range).
                    let first = user.min(users.saturating_sub(BATCH_USERS - 1)).max(1);
                    let user_ids: Vec<u64> = (first..first + BATCH_USERS).collect();
                    let request = v1::BatchGetUnreadCountsRequest { user_ids };
                    let reply: v1::BatchGetUnreadCountsResponse =
                        wire.unary(path, &request).await?;
                    // Counted as right when every user's count is.
                    let right = reply.counts.len() as u64 == BATCH_USERS.min(users)
                        && reply
                            .counts
                            .iter()
                            .all(|c| badge(c.unread, c.unseen) == expected_badge(c.user_id));
                    return Ok(if right { expected_badge(user) } else { u64::MAX });
                }
                let request = v1::GetUnreadCountRequest { user_id: user };
                let reply: v1::GetUnreadCountResponse = wire.unary(path, &request).await?;
                Ok(badge(reply.unread, reply.unseen))
            }
        })
    })
    .await
}

fn summary<'a>(
    args: &BadgeArgs,
    runs: &'a Runs,
    cache: &CacheUse,
    inbox: &Inbox,
    peaks: &[(u64, u64)],
    machine_max: usize,
) -> String {
    let Runs { raw, grpc, floor, tonic, batch, sequential } = runs;
    let best = |runs: &'a [(usize, Load)]| -> Option<&'a (usize, Load)> {
        runs.iter().max_by(|a, b| a.1.rate().total_cmp(&b.1.rate()))
    };
    let (Some((raw_threads, best_raw)), Some((grpc_threads, best_grpc))) = (best(raw), best(grpc))
    else {
        return "no runs: --driver-threads is empty".to_owned();
    };
    let Some((floor_threads, best_floor)) = best(floor) else {
        return "no floor runs: --driver-threads is empty".to_owned();
    };
    let mut s = String::new();
    let ratio = best_grpc.rate() / best_raw.rate();
    let _ = writeln!(s, "\n================ notify-bench badge: summary ================");
    let _ = writeln!(
        s,
        "users {} (1 message each, every 3rd read, every 5th of the others seen; all badges cached) | concurrency {} | {} s measured per run (raw GET, GetUnreadCount and Health/Check in {} alternating rounds), {} s warm-up each",
        thousands(args.users),
        args.concurrency,
        args.seconds,
        args.rounds,
        args.warmup_secs
    );
    let line = |name: &str, load: &Load| {
        format!(
            "{name:<46} {:>9} req/s  p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.1} ms  wrong {}",
            thousands(load.rate() as u64),
            load.ms(0.5),
            load.ms(0.9),
            load.ms(0.99),
            load.ms(0.999),
            load.hist.max() as f64 / 1000.0,
            load.wrong
        )
    };
    let connections = args.channels;
    for (((threads, raw), (_, grpc)), (_, floor)) in raw.iter().zip(grpc).zip(floor) {
        let _ = writeln!(
            s,
            "{}",
            line(&format!("raw redis GET  ({threads}-thread load, 1 conn)"), raw)
        );
        let _ = writeln!(
            s,
            "{}",
            line(&format!("GetUnreadCount ({threads}-thread h2 load, {connections} conns)"), grpc)
        );
        let _ = writeln!(
            s,
            "{}",
            line(&format!("Health/Check   ({threads}-thread h2 load, {connections} conns)"), floor)
        );
    }
    let _ = writeln!(
        s,
        "{}",
        line(&format!("GetUnreadCount (2-thread tonic, {connections} channels)"), tonic)
    );
    let _ = writeln!(
        s,
        "ratio          best GetUnreadCount ({grpc_threads}-thread) / best raw GET ({raw_threads}-thread) = {ratio:.2} (target >= 0.5: {}) | its p99 {:.3} ms (target < 2 ms: {})",
        verdict(ratio >= 0.5),
        best_grpc.ms(0.99),
        verdict(best_grpc.ms(0.99) < 2.0)
    );
    let floor_ratio = best_grpc.rate() / best_floor.rate();
    let per_threads: Vec<String> = grpc
        .iter()
        .zip(floor)
        .map(|((threads, grpc), (_, floor))| {
            format!("{threads}-thread {:.2}", grpc.rate() / floor.rate())
        })
        .collect();
    let _ = writeln!(
        s,
        "floor          best GetUnreadCount with unseen ({grpc_threads}-thread) / best Health.Check ({floor_threads}-thread; the no-op gRPC floor, same rounds) = {floor_ratio:.2} (target >= 0.9: {}; same load: {}) | p99 {:.3} ms (target < 1 ms: {})",
        verdict(floor_ratio >= 0.9),
        per_threads.join(", "),
        best_grpc.ms(0.99),
        verdict(best_grpc.ms(0.99) < 1.0)
    );
    let batch_users = batch.rate() * BATCH_USERS as f64;
    let _ = writeln!(
        s,
        "batch          {}: {} users/s vs best raw GET {} keys/s = {:.2} (target >= 1.0: {})",
        line("BatchGetUnreadCounts (100 users a call)", batch).trim_end(),
        thousands(batch_users as u64),
        thousands(best_raw.rate() as u64),
        batch_users / best_raw.rate(),
        verdict(batch_users >= best_raw.rate())
    );
    let _ = writeln!(
        s,
        "               with tonic clients: {:.2} of the best raw GET (the client's own CPU is in the cpu lines)",
        tonic.rate() / best_raw.rate()
    );
    let _ = writeln!(
        s,
        "one at a time  GetUnreadCount with 1 call in flight: p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
        sequential.value_at_quantile(0.5) as f64 / 1000.0,
        sequential.value_at_quantile(0.99) as f64 / 1000.0,
        sequential.max() as f64 / 1000.0
    );
    let _ = writeln!(
        s,
        "api cache      during the h2 GetUnreadCount runs: {} hits, {} misses, {:.1} users per Redis read",
        cache.hits, cache.misses, cache.mean_batch
    );
    let _ = writeln!(s, "cpu (% of one core, machine max {machine_max}%):");
    for (((threads, raw), (_, grpc)), (_, floor)) in raw.iter().zip(grpc).zip(floor) {
        let _ = writeln!(s, "  raw GET {threads}t   {}", raw.cpu.line(machine_max));
        let _ = writeln!(s, "  gRPC h2 {threads}t   {}", grpc.cpu.line(machine_max));
        let _ = writeln!(s, "  floor   {threads}t   {}", floor.cpu.line(machine_max));
    }
    let _ = writeln!(s, "  gRPC tonic   {}", tonic.cpu.line(machine_max));
    let _ = writeln!(
        s,
        "               GetUnreadCount / Health.Check at the same load = {}: the rest of the gap to raw GET is the gRPC round trip itself",
        per_threads.join(", ")
    );
    let _ = writeln!(
        s,
        "ListInbox      user {} ({} items) on shard {} holding {} items (seeded {} rows in {:.1} s)",
        inbox.user,
        thousands(args.inbox_items),
        inbox.shard,
        thousands(inbox.shard_items),
        thousands(inbox.seeded_rows),
        inbox.seed_secs
    );
    let _ = writeln!(
        s,
        "               {} calls (sequential, page_size 20, {} pages then restart): {}",
        inbox.hist.len(),
        args.inbox_pages,
        latency_against(&inbox.hist, 10.0)
    );
    let _ = writeln!(
        s,
        "               {} calls by {} concurrent readers (same pages, lean h2 client), {} calls/s: {}",
        inbox.concurrent.len(),
        inbox.readers,
        thousands((inbox.concurrent.len() as f64 / inbox.concurrent_secs) as u64),
        latency_against(&inbox.concurrent, 2.0)
    );
    let _ = writeln!(s, "               cpu: {}", inbox.concurrent_cpu.line(machine_max));
    let _ = writeln!(
        s,
        "               page cache (inbox.page_cache_ttl_secs = {}): {} hits, {} misses",
        inbox.page_ttl_secs,
        thousands(inbox.page_hits),
        thousands(inbox.page_misses)
    );
    let sql = |q: f64| inbox.sql.value_at_quantile(q) as f64 / 1000.0;
    let _ = writeln!(
        s,
        "               same SQL (db::items::list) from the bench via sqlx: p50 {:.3} ms  p99 {:.3} ms",
        sql(0.5),
        sql(0.99)
    );
    let sql16 = |q: f64| inbox.sql_concurrent.value_at_quantile(q) as f64 / 1000.0;
    let _ = writeln!(
        s,
        "               same SQL by {} connections at once, each its own, {} queries/s: p50 {:.3} ms  \
         p99 {:.3} ms (the database's floor for the concurrent run)",
        inbox.readers,
        thousands((inbox.sql_concurrent.len() as f64 / inbox.sql_concurrent_secs) as u64),
        sql16(0.5),
        sql16(0.99)
    );
    let _ = writeln!(s, "               cpu: {}", inbox.sql_concurrent_cpu.line(machine_max));
    let pooled = |q: f64| inbox.sql_pooled.value_at_quantile(q) as f64 / 1000.0;
    let _ = writeln!(
        s,
        "               same SQL by {} readers through a pool (a connection per query), {} queries/s: \
         p50 {:.3} ms  p99 {:.3} ms",
        inbox.readers,
        thousands((inbox.sql_pooled.len() as f64 / inbox.sql_pooled_secs) as u64),
        pooled(0.5),
        pooled(0.99)
    );
    let _ = writeln!(s, "               cpu: {}", inbox.sql_pooled_cpu.line(machine_max));
    let mb = |kb: u64| kb as f64 / 1024.0;
    let (api, worker) =
        (peaks.first().copied().unwrap_or_default(), peaks.get(1).copied().unwrap_or_default());
    let _ = writeln!(
        s,
        "memory         peak RSS (VmHWM): api {:.1} MB, worker {:.1} MB",
        mb(api.1),
        mb(worker.1)
    );
    let _ = write!(s, "==============================================================");
    s
}

/// "p50 .. ms  p99 .. ms  max .. ms (target p99 < N ms: OK|MISS)" of µs samples.
fn latency_against(hist: &Histogram<u64>, p99_target_ms: f64) -> String {
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    format!(
        "p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms (target p99 < {p99_target_ms} ms: {})",
        ms(0.5),
        ms(0.99),
        hist.max() as f64 / 1000.0,
        verdict(ms(0.99) < p99_target_ms)
    )
}
