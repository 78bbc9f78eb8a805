//! `notify-bench events`: the gateway stream under a large send. Users are
//! followed on a few `Subscribe` streams; one send reaches all of them among
//! many other recipients. Every followed recipient must get exactly one
//! `ItemDelivered`, and the latency from the item's insert (in its chunk's
//! transaction, `message_items.created_at`) to the event's arrival is
//! reported, with the api's CPU and memory. Run with 10,000 and then with
//! 100,000 followed users.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt as _;
use hdrhistogram::Histogram;
use notify_domain::Settings;
use notify_proto::v1;
use notify_proto::v1::event_service_client::EventServiceClient;
use notify_proto::v1::subscribe_response::Event;
use tonic::transport::Channel;

use crate::harness::{self, Env, thousands, verdict};
use crate::{metrics, procstat};

/// Arguments of `notify-bench events`.
#[derive(Debug, Clone, clap::Args)]
pub struct EventsArgs {
    /// Recipients of each send.
    #[arg(long, default_value_t = 100_000)]
    recipients: u64,
    /// Followed users in the first run (every n-th recipient).
    #[arg(long, default_value_t = 10_000)]
    small: u64,
    /// Followed users in the second run.
    #[arg(long, default_value_t = 100_000)]
    large: u64,
    /// Subscribe streams the followed users are spread over.
    #[arg(long, default_value_t = 10)]
    streams: u64,
    /// Longest wait for a send's events.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: EventsArgs) -> anyhow::Result<()> {
    ensure!(
        args.small > 0 && args.large >= args.small && args.recipients >= args.large,
        "need 0 < small <= large <= recipients"
    );
    ensure!(args.streams > 0, "need at least one stream");
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut settings = harness::settings_for(&base, &tag, 4);
    settings.events.max_users_per_stream = args.large.div_ceil(args.streams) as usize + 1;
    let mut env = Env::new(settings)?;
    println!(
        "notify-bench events: tag {tag}, {} recipients, {} then {} followed users on {} streams",
        thousands(args.recipients),
        thousands(args.small),
        thousands(args.large),
        args.streams
    );
    let outcome = crate::guarded(body(&mut env, &args)).await;
    env.finish(outcome).await
}

/// Arrival times of `ItemDelivered` per message and user (recorded for any
/// message: the first events can arrive before `StartMessage` returns).
#[derive(Default)]
struct Arrivals {
    at_ms: HashMap<u64, HashMap<u64, i64>>,
    duplicates: HashMap<u64, u64>,
    snapshots: u64,
}

struct Run {
    followed: u64,
    latency: Histogram<u64>,
    duplicates: u64,
    missing: u64,
    coalesced: u64,
    delivery_secs: f64,
    api_cpu_secs: f64,
    api_rss_kb: u64,
    /// The api's `notify_event_lag_seconds` p50 and p99 (publish to routed).
    api_lag_ms: (f64, f64),
    /// The api's `notify_event_commit_lag_seconds` p50 and p99.
    commit_lag_ms: (f64, f64),
}

async fn body(env: &mut Env, args: &EventsArgs) -> anyhow::Result<String> {
    env.start_services().await?;
    let channel = env.channel().await?;
    let pools = harness::shard_pools(&env.settings, 8).await?;
    let map = env.settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;
    let arrivals = Arc::new(Mutex::new(Arrivals::default()));
    let mut subscriptions = Vec::new();
    for _ in 0..args.streams {
        subscriptions.push(open_stream(channel.clone(), arrivals.clone()).await?);
    }
    let recipients: Vec<u64> = (1..=args.recipients).collect();
    let mut runs = Vec::new();
    let mut followed: Vec<u64> = Vec::new();
    for target in [args.small, args.large] {
        // Follow every (recipients / target)-th recipient, round robin.
        let step = args.recipients / target;
        let wanted: Vec<u64> = recipients.iter().copied().filter(|u| u % step == 0).collect();
        let new: Vec<u64> = wanted.iter().copied().filter(|u| !followed.contains_fast(u)).collect();
        for (index, users) in new.chunks(1000).enumerate() {
            let stream = &subscriptions[index % subscriptions.len()];
            stream
                .send(v1::SubscribeRequest { add_user_ids: users.to_vec(), ..Default::default() })
                .await
                .context("subscribe")?;
        }
        followed = wanted;
        wait_for_snapshots(&arrivals, followed.len() as u64, args.timeout_secs).await?;
        let api = env.pid("notify-api");
        let cpu0 = procstat::cpu_ticks(api).unwrap_or(0);
        let coalesced0 = coalesced(env).await;
        let started = Instant::now();
        let message_id = send(&channel, &recipients).await?;
        let arrived = |arrivals: &Arrivals| arrivals.at_ms.get(&message_id).map_or(0, HashMap::len);
        let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
        while arrived(&arrivals.lock().unwrap()) < followed.len() {
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let delivery_secs = started.elapsed().as_secs_f64();
        // Late duplicates would show up in this second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cpu1 = procstat::cpu_ticks(api).unwrap_or(0);
        let (at_ms, duplicates) = {
            let arrivals = arrivals.lock().unwrap();
            (
                arrivals.at_ms.get(&message_id).cloned().unwrap_or_default(),
                arrivals.duplicates.get(&message_id).copied().unwrap_or(0),
            )
        };
        let inserted = inserted_at(&pools, &map, message_id, &followed).await?;
        let mut latency = Histogram::<u64>::new(3)?;
        for (user, at) in &at_ms {
            if let Some(inserted) = inserted.get(user) {
                latency.record((at - inserted).max(0) as u64)?;
            }
        }
        runs.push(Run {
            followed: followed.len() as u64,
            latency,
            duplicates,
            missing: followed.len() as u64 - at_ms.len() as u64,
            coalesced: coalesced(env).await.saturating_sub(coalesced0),
            delivery_secs,
            api_cpu_secs: (cpu1 - cpu0) as f64 / procstat::clock_ticks_per_sec() as f64,
            api_rss_kb: procstat::rss_kb(api).unwrap_or(0),
            api_lag_ms: lag(env).await,
            commit_lag_ms: commit_lag(env).await,
        });
    }
    let mut report =
        String::from("\n================ notify-bench events: summary ================\n");
    for run in &runs {
        let p50 = run.latency.value_at_quantile(0.5);
        let p99 = run.latency.value_at_quantile(0.99);
        report.push_str(&format!(
            "{} followed of {} recipients: every one exactly once: {} (missing {}, duplicates {}, coalesced {})\n\
             \x20 insert -> event p50 {p50} ms ({}), p99 {p99} ms ({}), max {} ms; all events {:.1} s after SendMessage\n\
             \x20 publish -> routed in the api (notify_event_lag_seconds, rolling) p50 {:.0} ms, p99 {:.0} ms\n\
             \x20 chunk commit -> routed in the api (notify_event_commit_lag_seconds, rolling) p50 {:.0} ms ({}), p99 {:.0} ms ({})\n\
             \x20 api cpu {:.2} s, api rss {} MB\n",
            thousands(run.followed),
            thousands(args.recipients),
            verdict(run.missing == 0 && run.duplicates == 0),
            run.missing,
            run.duplicates,
            run.coalesced,
            verdict(p50 < 20),
            verdict(p99 < 100),
            run.latency.max(),
            run.delivery_secs,
            run.api_lag_ms.0,
            run.api_lag_ms.1,
            run.commit_lag_ms.0,
            verdict(run.commit_lag_ms.0 < 20.0),
            run.commit_lag_ms.1,
            verdict(run.commit_lag_ms.1 < 100.0),
            run.api_cpu_secs,
            run.api_rss_kb / 1024,
        ));
    }
    report.push_str("================================================================");
    drop(subscriptions);
    Ok(report)
}

trait ContainsFast {
    fn contains_fast(&self, value: &u64) -> bool;
}

impl ContainsFast for Vec<u64> {
    /// The vector is sorted.
    fn contains_fast(&self, value: &u64) -> bool {
        self.binary_search(value).is_ok()
    }
}

/// Opens a stream whose events are recorded into `arrivals`; returns the
/// sender of its subscription changes.
async fn open_stream(
    channel: Channel,
    arrivals: Arc<Mutex<Arrivals>>,
) -> anyhow::Result<tokio::sync::mpsc::Sender<v1::SubscribeRequest>> {
    let (changes, rx) = tokio::sync::mpsc::channel(64);
    let mut client = EventServiceClient::new(channel).max_decoding_message_size(16 << 20);
    let mut events = client
        .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .context("Subscribe")?
        .into_inner();
    tokio::spawn(async move {
        while let Some(Ok(response)) = events.next().await {
            let now_ms = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let mut arrivals = arrivals.lock().unwrap();
            match response.event {
                Some(Event::ItemDelivered(item)) => {
                    let users = arrivals.at_ms.entry(item.message_id).or_default();
                    if users.insert(item.user_id, now_ms).is_some() {
                        *arrivals.duplicates.entry(item.message_id).or_default() += 1;
                    }
                }
                Some(Event::Snapshot(_)) => arrivals.snapshots += 1,
                _ => {}
            }
        }
    });
    Ok(changes)
}

async fn wait_for_snapshots(
    arrivals: &Mutex<Arrivals>,
    at_least: u64,
    timeout_secs: u64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(timeout_secs);
    while arrivals.lock().unwrap().snapshots < at_least {
        if Instant::now() > deadline {
            bail!("snapshots of {at_least} users not in within {timeout_secs} s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn send(channel: &Channel, recipients: &[u64]) -> anyhow::Result<u64> {
    let content = v1::Content {
        title: "Benchmark events".into(),
        body: "One send, many followed users.".into(),
        category: "bench".into(),
        data: HashMap::new(),
        ..Default::default()
    };
    harness::send_draft(channel, content, recipients).await
}

/// When each user's item was inserted, ms since the epoch, from their shard.
async fn inserted_at(
    pools: &[sqlx::MySqlPool],
    map: &shard_router::ShardMap,
    message_id: u64,
    users: &[u64],
) -> anyhow::Result<HashMap<u64, i64>> {
    let mut inserted = HashMap::new();
    for (shard, ids) in map.partition_users(users) {
        let pool = &pools[shard.0 as usize];
        for batch in ids.chunks(5_000) {
            let mut query = sqlx::QueryBuilder::new(
                "SELECT user_id, CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) DIV 1000 AS SIGNED) \
                 FROM message_items WHERE message_id = ",
            );
            query.push_bind(message_id).push(" AND user_id IN (");
            let mut list = query.separated(", ");
            for id in batch {
                list.push_bind(*id);
            }
            query.push(")");
            let rows: Vec<(u64, i64)> = query.build_query_as().fetch_all(pool).await?;
            inserted.extend(rows);
        }
    }
    Ok(inserted)
}

async fn coalesced(env: &Env) -> u64 {
    env.scrape("notify-api").await.sum("notify_events_coalesced_total", &[]) as u64
}

async fn lag(env: &Env) -> (f64, f64) {
    let page = env.scrape("notify-api").await;
    let at = |q: f64| {
        metrics::histogram_quantile(&page, "notify_event_lag_seconds", &[], q).unwrap_or(0.0)
            * 1000.0
    };
    (at(0.5), at(0.99))
}

/// The api's `notify_event_commit_lag_seconds` p50 and p99 (chunk commit
/// in the worker to routed in the api).
async fn commit_lag(env: &Env) -> (f64, f64) {
    let page = env.scrape("notify-api").await;
    let at = |q: f64| {
        metrics::histogram_quantile(&page, "notify_event_commit_lag_seconds", &[], q).unwrap_or(0.0)
            * 1000.0
    };
    (at(0.5), at(0.99))
}
