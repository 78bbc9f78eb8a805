//! `notify-bench badge`: `GetUnreadCount` over gRPC against raw Redis `GET`
//! of the same keys at the same concurrency, and `ListInbox` latency for a
//! user with 1,000 items on a shard holding ~1M items.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use chrono::Utc;
use futures::StreamExt;
use hdrhistogram::Histogram;
use notify_core::Settings;
use notify_core::ids::IdGenerator;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use redis::AsyncCommands;
use secrecy::ExposeSecret;
use sqlx::QueryBuilder;
use sqlx::mysql::MySqlPool;
use tonic::transport::Channel;

use crate::harness::{self, Env, metric_sum, thousands, verdict};
use crate::procstat::{CpuUse, RssSampler, Tracked};

/// Arguments of `notify-bench badge`.
#[derive(Debug, Clone, clap::Args)]
pub struct BadgeArgs {
    /// Users 1..=N that receive one message (a third then mark it read).
    #[arg(long, default_value_t = 10_000)]
    users: u64,
    /// Concurrent requesters, for raw GET and for GetUnreadCount alike.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Measured seconds of each of the two runs.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Unmeasured warm-up seconds before each run.
    #[arg(long, default_value_t = 1)]
    warmup_secs: u64,
    /// gRPC channels (HTTP/2 connections) the requesters share.
    #[arg(long, default_value_t = 4)]
    channels: usize,
    /// Shard databases.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Items of other users seeded on the ListInbox user's shard.
    #[arg(long, default_value_t = 1_000_000)]
    inbox_shard_rows: u64,
    /// Items of the ListInbox user.
    #[arg(long, default_value_t = 1_000)]
    inbox_items: u64,
    /// Timed ListInbox calls.
    #[arg(long, default_value_t = 1_000)]
    inbox_calls: u64,
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
    fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    fn ms(&self, quantile: f64) -> f64 {
        self.hist.value_at_quantile(quantile) as f64 / 1000.0
    }
}

struct Inbox {
    user: u64,
    shard: u32,
    shard_items: u64,
    seeded_rows: u64,
    seed_secs: f64,
    hist: Histogram<u64>,
    sql: Histogram<u64>,
}

fn expected_unread(user: u64) -> u64 {
    u64::from(!user.is_multiple_of(3))
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
    for _ in 0..args.channels {
        channels.push(env.channel().await?);
    }

    let t = Instant::now();
    seed_badges(env, &channels[0], args).await?;
    println!(
        "seeded: 1 message to {} users, a third marked read, cache warmed ({:.1} s)",
        thousands(args.users),
        t.elapsed().as_secs_f64()
    );

    // The api's strategy: one multiplexed connection (ConnectionManager).
    let client = redis::Client::open(env.settings.redis.url.expose_secret())?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(3)));
    let redis_conn = client.get_connection_manager_with_config(config).await?;
    let prefix = env.settings.redis.key_prefix.clone();
    let (key_base, cached) = badge_keys(&redis_conn, &prefix, args.users).await?;
    ensure!(
        cached == args.users,
        "only {cached} of {} badges are cached (under {key_base}<user>) after warming",
        args.users
    );
    println!("badge keys: {key_base}<user_id>, all {} cached", thousands(cached));

    let raw = run_raw(args, &tracked, redis_conn.clone(), &key_base).await?;
    println!(
        "raw redis GET: {} req/s, p50 {:.3} ms, p99 {:.3} ms",
        thousands(raw.rate() as u64),
        raw.ms(0.5),
        raw.ms(0.99)
    );
    let before = env.scrape("notify-api").await;
    let grpc = run_grpc(args, &tracked, &channels).await?;
    let after = env.scrape("notify-api").await;
    println!(
        "GetUnreadCount: {} req/s, p50 {:.3} ms, p99 {:.3} ms",
        thousands(grpc.rate() as u64),
        grpc.ms(0.5),
        grpc.ms(0.99)
    );
    let floor = run_floor(args, &tracked, &channels).await?;
    println!(
        "grpc.health.v1.Health/Check (gRPC floor): {} req/s, p50 {:.3} ms, p99 {:.3} ms",
        thousands(floor.rate() as u64),
        floor.ms(0.5),
        floor.ms(0.99)
    );
    let misses = metric_sum(&after, &["notify_badge_cache_misses_total"])
        - metric_sum(&before, &["notify_badge_cache_misses_total"]);
    let hits = metric_sum(&after, &["notify_badge_cache_hits_total"])
        - metric_sum(&before, &["notify_badge_cache_hits_total"]);
    env.check_children()?;
    let sequential = sequential_badges(args, &channels[0]).await?;
    println!(
        "GetUnreadCount, one call at a time: p50 {:.3} ms, p99 {:.3} ms",
        sequential.value_at_quantile(0.5) as f64 / 1000.0,
        sequential.value_at_quantile(0.99) as f64 / 1000.0
    );

    let inbox = run_inbox(env, args, &channels[0]).await?;
    let peaks = rss.peaks();
    drop(rss);
    Ok(summary(
        args,
        &raw,
        &grpc,
        &floor,
        &sequential,
        hits,
        misses,
        &inbox,
        &peaks,
        tracked.machine_max(),
    ))
}

/// GetUnreadCount with one call in flight: latency without queueing.
async fn sequential_badges(args: &BadgeArgs, channel: &Channel) -> anyhow::Result<Histogram<u64>> {
    let mut client = InboxServiceClient::new(channel.clone());
    let mut hist = new_hist();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    for call in 0..1100 {
        let user = 1 + xorshift(&mut rng) % args.users;
        let started = Instant::now();
        let reply = client.get_unread_count(v1::GetUnreadCountRequest { user_id: user }).await?;
        if call >= 100 {
            hist.saturating_record((started.elapsed().as_nanos() as u64 / 1000).max(1));
        }
        ensure!(reply.into_inner().unread == expected_unread(user), "wrong badge for user {user}");
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
    };
    let message_id = if users.len() <= 100_000 {
        messages
            .send_message(v1::SendMessageRequest {
                sender: "notify-bench".into(),
                content: Some(content),
                audience: Some(v1::send_message_request::Audience::Users(v1::UserAudience {
                    user_ids: users.clone(),
                })),
                ..Default::default()
            })
            .await
            .context("SendMessage")?
            .into_inner()
            .message_id
    } else {
        let id = messages
            .create_message(v1::CreateMessageRequest {
                sender: "notify-bench".into(),
                content: Some(content),
                ..Default::default()
            })
            .await
            .context("CreateMessage")?
            .into_inner()
            .message_id;
        for (index, batch) in users.chunks(100_000).enumerate() {
            messages
                .append_recipients(v1::AppendRecipientsRequest {
                    message_id: id,
                    batch_number: index as u64 + 1,
                    user_ids: batch.to_vec(),
                })
                .await
                .context("AppendRecipients")?;
        }
        messages.start_message(v1::StartMessageRequest { message_id: id }).await?;
        id
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
                count.unread == expected_unread(count.user_id),
                "user {} has unread {}, expected {}",
                count.user_id,
                count.unread,
                expected_unread(count.user_id)
            );
        }
    }
    Ok(())
}

/// Finds the key layout the service caches badges under and counts the
/// cached users. Current layout: `{prefix}unread:{epoch}:{user}` with the
/// epoch in `{prefix}ann:epoch` (absent = 0); older builds used
/// `{prefix}unread:{user}`. Returns the key without the user id.
async fn badge_keys(
    conn: &redis::aio::ConnectionManager,
    prefix: &str,
    users: u64,
) -> anyhow::Result<(String, u64)> {
    let mut conn = conn.clone();
    let epoch: Option<String> = conn.get(format!("{prefix}ann:epoch")).await?;
    let epoch = epoch.unwrap_or_else(|| "0".to_owned());
    let mut best = (String::new(), 0);
    for base in [format!("{prefix}unread:{epoch}:"), format!("{prefix}unread:")] {
        let mut cached = 0;
        let ids: Vec<u64> = (1..=users).collect();
        for batch in ids.chunks(1000) {
            let keys: Vec<String> = batch.iter().map(|u| format!("{base}{u}")).collect();
            let values: Vec<Option<u64>> = conn.mget(&keys).await?;
            cached += values.iter().flatten().count() as u64;
        }
        if cached > best.1 || best.0.is_empty() {
            best = (base, cached);
        }
    }
    Ok(best)
}

/// Common driver: `concurrency` spawned tasks run `call(task, user)` in a
/// loop for warm-up + measured seconds; only calls started inside the
/// measured window are counted.
async fn drive<F, Fut>(args: &BadgeArgs, tracked: &Tracked, call: F) -> anyhow::Result<Load>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<u64>> + Send,
{
    let call = Arc::new(call);
    let measure_from = Instant::now() + Duration::from_secs(args.warmup_secs);
    let end = measure_from + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for task in 0..args.concurrency {
        let call = call.clone();
        let users = args.users;
        tasks.push(tokio::spawn(async move {
            let mut hist = new_hist();
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ ((task as u64 + 1) << 32);
            let (mut ops, mut wrong) = (0u64, 0u64);
            loop {
                let started = Instant::now();
                if started >= end {
                    break;
                }
                let user = 1 + xorshift(&mut rng) % users;
                let value = call(task, user).await?;
                if started >= measure_from {
                    hist.saturating_record((started.elapsed().as_nanos() as u64 / 1000).max(1));
                    ops += 1;
                    if value != expected_unread(user) {
                        wrong += 1;
                    }
                }
            }
            Ok::<_, anyhow::Error>((hist, ops, wrong))
        }));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu0 = tracked.snap();
    tokio::time::sleep_until(end.into()).await;
    let cpu1 = tracked.snap();
    let mut load = Load {
        ops: 0,
        wrong: 0,
        secs: args.seconds as f64,
        hist: new_hist(),
        cpu: tracked.between(&cpu0, &cpu1),
    };
    for task in tasks {
        let (hist, ops, wrong) = task.await??;
        load.hist.add(&hist)?;
        load.ops += ops;
        load.wrong += wrong;
    }
    Ok(load)
}

async fn run_raw(
    args: &BadgeArgs,
    tracked: &Tracked,
    conn: redis::aio::ConnectionManager,
    key_base: &str,
) -> anyhow::Result<Load> {
    let key_base = key_base.to_owned();
    drive(args, tracked, move |_task, user| {
        let mut conn = conn.clone();
        let key = format!("{key_base}{user}");
        async move {
            let value: Option<u64> = conn.get(&key).await?;
            Ok(value.unwrap_or(u64::MAX))
        }
    })
    .await
}

async fn run_grpc(
    args: &BadgeArgs,
    tracked: &Tracked,
    channels: &[Channel],
) -> anyhow::Result<Load> {
    let clients: Vec<InboxServiceClient<Channel>> =
        channels.iter().cloned().map(InboxServiceClient::new).collect();
    drive(args, tracked, move |task, user| {
        let mut client = clients[task % clients.len()].clone();
        async move {
            let reply =
                client.get_unread_count(v1::GetUnreadCountRequest { user_id: user }).await?;
            Ok(reply.into_inner().unread)
        }
    })
    .await
}

/// The same load against the api's health check: what any RPC costs over
/// these channels, with no Redis behind it.
async fn run_floor(
    args: &BadgeArgs,
    tracked: &Tracked,
    channels: &[Channel],
) -> anyhow::Result<Load> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let clients: Vec<HealthClient<Channel>> =
        channels.iter().cloned().map(HealthClient::new).collect();
    drive(args, tracked, move |task, user| {
        let mut client = clients[task % clients.len()].clone();
        async move {
            let reply = client.check(HealthCheckRequest { service: String::new() }).await?;
            // Counted as right when serving.
            Ok(if reply.into_inner().status == ServingStatus::Serving as i32 {
                expected_unread(user)
            } else {
                u64::MAX
            })
        }
    })
    .await
}

async fn run_inbox(env: &mut Env, args: &BadgeArgs, channel: &Channel) -> anyhow::Result<Inbox> {
    ensure!(args.inbox_items > 0, "--inbox-items must be > 0");
    let map = env.settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;
    let user = args.users.max(100_000_000) + 1;
    let shard = map.shard_for_user(user);
    let slot = map.slot_of(shard).context("shard slot")?;
    let pool = harness::shard_pool(&env.settings, slot, 4).await?;
    let started = Instant::now();
    let seeded_rows = seed_inbox_shard(&pool, &map, shard, user, args).await?;
    let seed_secs = started.elapsed().as_secs_f64();
    let shard_items: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM message_items").fetch_one(&pool).await?;
    let sql = inbox_sql_directly(&pool, user, args).await?;
    pool.close().await;
    println!(
        "inbox seed: {} rows on shard {shard} in {seed_secs:.1} s ({} items on the shard)",
        thousands(seeded_rows),
        thousands(shard_items as u64)
    );

    let mut client = InboxServiceClient::new(channel.clone());
    let mut hist = new_hist();
    let mut token = String::new();
    let mut page = 0;
    let warmup = 20;
    for call in 0..warmup + args.inbox_calls {
        let started = Instant::now();
        let reply = client
            .list_inbox(v1::ListInboxRequest {
                user_id: user,
                page_size: 20,
                page_token: std::mem::take(&mut token),
                ..Default::default()
            })
            .await
            .context("ListInbox")?
            .into_inner();
        let micros = (started.elapsed().as_nanos() as u64 / 1000).max(1);
        if call >= warmup {
            hist.saturating_record(micros);
        }
        let expected = 20.min(args.inbox_items.saturating_sub(u64::from(page) * 20)) as usize;
        if reply.items.len() != expected {
            bail!(
                "ListInbox page {page} returned {} items, expected {expected}",
                reply.items.len()
            );
        }
        page += 1;
        if page < args.inbox_pages && !reply.next_page_token.is_empty() {
            token = reply.next_page_token;
        } else {
            page = 0;
        }
    }
    Ok(Inbox {
        user,
        shard: shard.0,
        shard_items: shard_items as u64,
        seeded_rows,
        seed_secs,
        hist,
        sql,
    })
}

/// The api's inbox query (`notify_core::db::items::list`, page_size + 1
/// rows) run directly from here with the same page pattern: the database's
/// share of a ListInbox call.
async fn inbox_sql_directly(
    pool: &MySqlPool,
    user: u64,
    args: &BadgeArgs,
) -> anyhow::Result<Histogram<u64>> {
    use notify_core::db::items::{self, InboxQuery};
    let mut hist = new_hist();
    let mut before = u64::MAX;
    let mut page = 0;
    for call in 0..20 + args.inbox_calls {
        let query = InboxQuery { before, limit: 21, unread_only: false, category: None };
        let started = Instant::now();
        let rows = items::list(pool, user, &query).await?;
        if call >= 20 {
            hist.saturating_record((started.elapsed().as_nanos() as u64 / 1000).max(1));
        }
        page += 1;
        match rows.get(19) {
            Some(row) if page < args.inbox_pages && rows.len() > 20 => before = row.message_id,
            _ => {
                before = u64::MAX;
                page = 0;
            }
        }
    }
    Ok(hist)
}

/// Seeds the user's shard directly in SQL: `inbox_items` messages (content
/// copies), the user's items for all of them, and `inbox_shard_rows` items
/// of other users on the same shard (100 each). Returns rows inserted.
async fn seed_inbox_shard(
    pool: &MySqlPool,
    map: &shard_router::ShardMap,
    shard: shard_router::ShardId,
    user: u64,
    args: &BadgeArgs,
) -> anyhow::Result<u64> {
    let generator = IdGenerator::new();
    let messages: Vec<u64> = (0..args.inbox_items).map(|_| generator.next_id().get()).collect();
    let category = |index: usize| if index.is_multiple_of(2) { "news" } else { "promo" };
    let now = Utc::now().naive_utc();
    for (part, ids) in messages.chunks(500).enumerate() {
        let mut insert = QueryBuilder::new(
            "INSERT INTO message_contents (message_id, title, body, category, data, expire_at, created_at) ",
        );
        insert.push_values(ids.iter().enumerate(), |mut row, (i, id)| {
            let index = part * 500 + i;
            row.push_bind(*id)
                .push_bind(format!("Inbox benchmark message {index}"))
                .push_bind("A body of moderate length, as a notification would have: about a hundred bytes of text.")
                .push_bind(category(index))
                .push_bind(r#"{"link":"app://inbox/bench"}"#)
                .push_bind(None::<chrono::NaiveDateTime>)
                .push_bind(now);
        });
        insert.build().execute(pool).await?;
    }

    let per_user = 100.min(args.inbox_items);
    let stride = (args.inbox_items / per_user).max(1);
    let others: Vec<u64> = (user + 1..)
        .filter(|u| map.shard_for_user(*u) == shard)
        .take((args.inbox_shard_rows / per_user) as usize)
        .collect();
    // (user, message index, read) rows: the other users, then the target user.
    let mut rows: Vec<(u64, usize, bool)> = Vec::new();
    for (k, other) in others.iter().enumerate() {
        for j in 0..per_user {
            let index = ((k as u64 + j * stride) % args.inbox_items) as usize;
            rows.push((*other, index, (k as u64 + j).is_multiple_of(3)));
        }
    }
    for index in 0..args.inbox_items as usize {
        rows.push((user, index, index.is_multiple_of(4)));
    }
    let total = rows.len() as u64;
    let parts: Vec<&[(u64, usize, bool)]> = rows.chunks(rows.len().div_ceil(4).max(1)).collect();
    let inserters = parts.into_iter().map(|part| {
        let messages = &messages;
        async move {
            for statement in part.chunks(1000) {
                let mut insert = QueryBuilder::new(
                    "INSERT INTO message_items (user_id, message_id, is_read, category) ",
                );
                insert.push_values(statement, |mut row, (u, index, read)| {
                    row.push_bind(*u)
                        .push_bind(messages[*index])
                        .push_bind(*read)
                        .push_bind(category(*index));
                });
                insert.build().execute(pool).await?;
            }
            Ok::<_, anyhow::Error>(())
        }
    });
    futures::future::try_join_all(inserters).await?;
    Ok(total)
}

#[allow(clippy::too_many_arguments)]
fn summary(
    args: &BadgeArgs,
    raw: &Load,
    grpc: &Load,
    floor: &Load,
    sequential: &Histogram<u64>,
    hits: f64,
    misses: f64,
    inbox: &Inbox,
    peaks: &[(u64, u64)],
    machine_max: usize,
) -> String {
    let mut s = String::new();
    let ratio = grpc.rate() / raw.rate();
    let _ = writeln!(s, "\n================ notify-bench badge: summary ================");
    let _ = writeln!(
        s,
        "users {} (1 message each, every 3rd read; all badges cached) | concurrency {} | {} s measured after {} s warm-up",
        thousands(args.users),
        args.concurrency,
        args.seconds,
        args.warmup_secs
    );
    let line = |name: &str, load: &Load| {
        format!(
            "{name} {:>9} req/s  p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.1} ms  wrong {}",
            thousands(load.rate() as u64),
            load.ms(0.5),
            load.ms(0.9),
            load.ms(0.99),
            load.ms(0.999),
            load.hist.max() as f64 / 1000.0,
            load.wrong
        )
    };
    let _ = writeln!(s, "{}", line("raw redis GET  (1 shared multiplexed conn)", raw));
    let _ = writeln!(
        s,
        "{}",
        line(&format!("GetUnreadCount ({} gRPC channels)     ", args.channels), grpc)
    );
    let _ = writeln!(s, "{}", line("Health/Check   (gRPC floor, same channels)", floor));
    let _ = writeln!(
        s,
        "ratio          GetUnreadCount/raw GET = {ratio:.2} (target >= 0.5: {}) | p99 {:.3} ms (target < 2 ms: {})",
        verdict(ratio >= 0.5),
        grpc.ms(0.99),
        verdict(grpc.ms(0.99) < 2.0)
    );
    let _ = writeln!(
        s,
        "one at a time  GetUnreadCount with 1 call in flight: p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
        sequential.value_at_quantile(0.5) as f64 / 1000.0,
        sequential.value_at_quantile(0.99) as f64 / 1000.0,
        sequential.max() as f64 / 1000.0
    );
    let _ = writeln!(s, "api cache      during the gRPC run: {hits} hits, {misses} misses");
    let _ = writeln!(s, "cpu (% of one core, machine max {machine_max}%):");
    let _ = writeln!(s, "  raw GET      {}", raw.cpu.line(machine_max));
    let _ = writeln!(s, "  gRPC         {}", grpc.cpu.line(machine_max));
    let _ = writeln!(s, "  gRPC floor   {}", floor.cpu.line(machine_max));
    let _ = writeln!(
        s,
        "               GetUnreadCount/Health.Check = {:.2}: the rest of the gap to raw GET is the gRPC round trip itself",
        grpc.rate() / floor.rate()
    );
    let ms = |q: f64| inbox.hist.value_at_quantile(q) as f64 / 1000.0;
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
        "               {} calls (sequential, page_size 20, {} pages then restart): p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms (target p99 < 10 ms: {})",
        inbox.hist.len(),
        args.inbox_pages,
        ms(0.5),
        ms(0.99),
        inbox.hist.max() as f64 / 1000.0,
        verdict(ms(0.99) < 10.0)
    );
    let sql = |q: f64| inbox.sql.value_at_quantile(q) as f64 / 1000.0;
    let _ = writeln!(
        s,
        "               same SQL (db::items::list) from the bench via sqlx: p50 {:.3} ms  p99 {:.3} ms",
        sql(0.5),
        sql(0.99)
    );
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
