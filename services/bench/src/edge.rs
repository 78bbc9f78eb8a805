//! `notify-bench edge`: one `notify-edge` holding N Server-Sent Events
//! streams, each a user's own connection, from a load generator on the
//! same machine.
//!
//! The edge runs as its own process (the release binary, beside the api
//! and the worker), so its memory and CPU are its own. The streams connect
//! from several loopback source addresses (127.0.0.2, 127.0.0.3, ...: one
//! address has only the ephemeral port range to give), each a raw HTTP/1.1
//! request read by a minimal chunked and SSE parser ([`streams`]). Then:
//!
//! 1. the edge's CPU over `--rest-secs` with no stream, and its RSS;
//! 2. N streams opened, each until its `snapshot`; the edge's CPU over
//!    `--rest-secs` again (heartbeats only) and its RSS: (RSS with them -
//!    RSS before) / N is a stream's memory;
//! 3. a send through the api to `--recipients` users, every connected user
//!    among them: each stream must get exactly one `item_delivered` of it
//!    (or a `resync` whose snapshot shows it) and a `badge`; commit ->
//!    client latency from the commit time the worker's event carries
//!    ([`commits`]) to the event's arrival (one clock, one machine);
//! 4. each connected user marks the item read through the edge
//!    (`POST /v1/items/update` with the user's token, [`reads`]): each
//!    stream must get one `item_updated` (or a covering resync) and a
//!    `badge` with nothing unread.
//!
//! Targets (the design's edge): 50,000 streams on one edge, <= 16 KB of RSS
//! each, < 5% of a core at rest, every event delivered once or covered by
//! a resync, commit -> client p99 < 250 ms.

mod commits;
mod http1;
mod reads;
mod report;
mod setup;
mod streams;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use hdrhistogram::Histogram;
use notify_domain::Settings;
use notify_proto::v1;
use notify_testkit::servers::free_port;
use tokio::sync::Semaphore;
use tonic::transport::Channel;

use crate::harness::{self, Env, thousands};
use crate::{metrics, procstat};
use commits::Commits;
use report::{Delivery, Figures, Reading, Rest, quantiles};
use setup::{EdgeConfig, Signer};
use streams::{Record, Shared, Target};

/// Arguments of `notify-bench edge`.
#[derive(Debug, Clone, clap::Args)]
pub struct EdgeArgs {
    /// Event streams held open on the edge, one user each.
    #[arg(long, default_value_t = 50_000)]
    connections: usize,
    /// Recipients of the send (users `1..=N`; every connected user is one).
    #[arg(long, default_value_t = 100_000)]
    recipients: u64,
    /// Most streams from one loopback source address (below the ephemeral
    /// port range's size).
    #[arg(long, default_value_t = 20_000)]
    per_source: usize,
    /// Streams opening at once (each until its snapshot).
    #[arg(long, default_value_t = 512)]
    connect_concurrency: usize,
    /// Seconds of each at-rest CPU measurement.
    #[arg(long, default_value_t = 30)]
    rest_secs: u64,
    /// `edge.heartbeat_secs`.
    #[arg(long, default_value_t = 15)]
    heartbeat_secs: u64,
    /// `edge.worker_threads` (0: one per core).
    #[arg(long, default_value_t = 0)]
    edge_threads: usize,
    /// Connected users who mark the item read (default: all of them).
    #[arg(long)]
    mark_reads: Option<usize>,
    /// Keep-alive connections the mark-reads are sent over.
    #[arg(long, default_value_t = 16)]
    read_connections: usize,
    /// Shards.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Longest wait of each phase.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: EdgeArgs) -> anyhow::Result<()> {
    ensure!(args.connections > 0, "--connections must be at least 1");
    ensure!(
        args.recipients >= args.connections as u64,
        "--recipients must cover every connected user (at least --connections)"
    );
    ensure!(args.heartbeat_secs > 0, "--heartbeat-secs must be at least 1");
    ensure!(
        args.rest_secs >= args.heartbeat_secs,
        "--rest-secs must hold a heartbeat of every stream (at least --heartbeat-secs)"
    );
    let ports = setup::ephemeral_ports()? as usize;
    let per_source = args.per_source.min(ports.saturating_sub(1_000).max(1));
    let sources = setup::sources(args.connections, per_source);
    // The bench and the edge each hold a descriptor per stream; the
    // children inherit the limit.
    let files = setup::raise_open_files(args.connections as u64 + setup::SPARE_FILES)?;
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let settings = harness::settings_for(&base, &tag, args.shards);
    let mut env = Env::new(settings)?;
    println!(
        "notify-bench edge: tag {tag}, {} streams from {} source addresses ({} to {}, \
         {} ephemeral ports each), a send to {} users, open files {files}, load {}",
        thousands(args.connections as u64),
        sources.len(),
        sources[0],
        sources[sources.len() - 1],
        thousands(ports as u64),
        thousands(args.recipients),
        procstat::loadavg()
    );
    let outcome = crate::guarded(body(&mut env, &args, sources)).await;
    env.finish(outcome).await
}

/// The edge's CPU over `length`, in percent of one core, with the
/// machine's line.
async fn rest(tracked: &procstat::Tracked, edge: u32, length: Duration) -> anyhow::Result<Rest> {
    let (snap, cpu0) = (tracked.snap(), procstat::cpu_ticks(edge).context("the edge's CPU")?);
    let started = Instant::now();
    tokio::time::sleep(length).await;
    let cpu1 = procstat::cpu_ticks(edge).context("the edge's CPU")?;
    let secs = started.elapsed().as_secs_f64();
    let percent = (cpu1 - cpu0) as f64 / procstat::clock_ticks_per_sec() as f64 / secs * 100.0;
    let line = tracked.between(&snap, &tracked.snap()).line(tracked.machine_max());
    Ok(Rest { percent, line })
}

/// CPU seconds of `pid` since `ticks` (a `procstat::cpu_ticks` reading).
fn cpu_secs_since(pid: u32, ticks: u64) -> f64 {
    procstat::cpu_ticks(pid).unwrap_or(0).saturating_sub(ticks) as f64
        / procstat::clock_ticks_per_sec() as f64
}

/// Waits until `done` holds for every record of `indexes` (or the
/// deadline); returns how many it holds for.
async fn wait_all(
    shared: &Shared,
    indexes: &[usize],
    timeout: Duration,
    done: impl Fn(&Record) -> bool,
) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let count = indexes.iter().filter(|i| done(&shared.records[**i])).count();
        if count == indexes.len() || Instant::now() > deadline {
            return count;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Of `indexes`: exactly once, covered by a resync (none came), more than
/// once, and neither.
fn tally(
    shared: &Shared,
    indexes: &[usize],
    count: impl Fn(&Record) -> u32,
    covered: impl Fn(&Record) -> bool,
) -> [u64; 4] {
    let mut tally = [0u64; 4];
    for record in indexes.iter().map(|i| &shared.records[*i]) {
        let slot = match count(record) {
            1 => 0,
            0 if covered(record) => 1,
            0 => 3,
            _ => 2,
        };
        tally[slot] += 1;
    }
    tally
}

fn first_problem(shared: &Shared) -> String {
    let first = shared.first_problem.lock().unwrap_or_else(|e| e.into_inner());
    first.as_ref().map(|p| format!("; first problem: {p}")).unwrap_or_default()
}

/// What the whole run shares.
struct Run<'a> {
    args: &'a EdgeArgs,
    channel: Channel,
    signer: Arc<Signer>,
    edge: u32,
    listen: SocketAddr,
    metrics: String,
    tracked: procstat::Tracked,
    commits: Commits,
    shared: Arc<Shared>,
    /// The connected users, by record.
    users: Vec<u64>,
    timeout: Duration,
}

async fn body(env: &mut Env, args: &EdgeArgs, sources: Vec<Ipv4Addr>) -> anyhow::Result<String> {
    env.start_services().await?;
    let signer = Arc::new(Signer::random());
    let config = EdgeConfig {
        listen: format!("127.0.0.1:{}", free_port()).parse()?,
        metrics: format!("127.0.0.1:{}", free_port()).parse()?,
        worker_threads: args.edge_threads,
        heartbeat_secs: args.heartbeat_secs,
    };
    let edge = env.start_edge(&config.toml(&signer), config.metrics).await?;
    let n = args.connections;
    let step = args.recipients / n as u64;
    let run = Run {
        args,
        channel: env.channel().await?,
        signer,
        edge,
        listen: config.listen,
        metrics: config.metrics.to_string(),
        tracked: procstat::Tracked::new(&[
            ("edge", edge),
            ("api", env.pid("notify-api")),
            ("worker", env.pid("notify-worker")),
        ]),
        commits: Commits::start(&env.settings).await?,
        shared: Arc::new(Shared::new(n)),
        users: (1..=n as u64).map(|i| i * step).collect(),
        timeout: Duration::from_secs(args.timeout_secs),
    };
    let rss = procstat::RssSampler::start(vec![edge]);
    let rest_for = Duration::from_secs(args.rest_secs);

    // The edge with no stream.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = rest(&run.tracked, edge, rest_for).await?;
    let rss_before = procstat::rss_kb(edge).unwrap_or(0);
    println!(
        "edge with no stream: cpu {:.2}% of a core over {} s, rss {:.1} MB\n  cpu: {}",
        idle.percent,
        args.rest_secs,
        rss_before as f64 / 1024.0,
        idle.line
    );

    let (held, open_secs) = open_streams(&run, &sources).await?;

    // Every stream open and quiet: heartbeats only.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let beats_before = run.shared.heartbeats.load(Ordering::Relaxed);
    let at_rest = rest(&run.tracked, edge, rest_for).await?;
    let heartbeats = run.shared.heartbeats.load(Ordering::Relaxed) - beats_before;
    let rss_with = procstat::rss_kb(edge).unwrap_or(0);
    let edge_streams = metrics::scrape(&run.metrics).await.sum("notify_edge_streams", &[]);
    println!(
        "at rest with {} streams: cpu {:.2}% of a core, {} heartbeats in {} s, rss {:.1} MB \
         ({:.1} KB a stream), the edge counts {edge_streams} open\n  cpu: {}",
        thousands(held.len() as u64),
        at_rest.percent,
        thousands(heartbeats),
        args.rest_secs,
        rss_with as f64 / 1024.0,
        rss_with.saturating_sub(rss_before) as f64 / held.len() as f64,
        at_rest.line
    );

    let delivery = deliver(&run, &held).await?;
    let reading = mark_reads(&run, &held, delivery.message_id).await?;

    // The end: what is still open, what else came.
    let records = &run.shared.records;
    let figures = Figures {
        connections: n,
        held: held.len(),
        still_open: held.iter().filter(|i| records[**i].open.load(Ordering::Acquire)).count(),
        failed: run.shared.failures.load(Ordering::Relaxed),
        edge_streams,
        open_secs,
        rss_before,
        rss_with,
        rss_peaks: rss.peaks()[0],
        bench_rss: procstat::rss_kb(std::process::id()).unwrap_or(0),
        idle,
        at_rest,
        heartbeats,
        delivery,
        reading,
        others: run.shared.others.load(Ordering::Relaxed),
        resyncs: held.iter().map(|i| u64::from(records[*i].resyncs.load(Ordering::Relaxed))).sum(),
        edge_resyncs: metrics::scrape(&run.metrics).await.sum("notify_edge_resyncs_total", &[]),
    };
    Ok(report::summary(args, &figures))
}

/// Opens every stream, `--connect-concurrency` at a time, each until its
/// snapshot; returns the records of those held and the time it took.
async fn open_streams(run: &Run<'_>, sources: &[Ipv4Addr]) -> anyhow::Result<(Vec<usize>, f64)> {
    let concurrency = run.args.connect_concurrency.max(1);
    let opening = Arc::new(Semaphore::new(concurrency));
    let started = Instant::now();
    for (index, user) in run.users.iter().copied().enumerate() {
        let permit = opening.clone().acquire_owned().await?;
        let target = Target {
            index,
            user,
            source: sources[index % sources.len()],
            edge: run.listen,
            token: run.signer.token(user),
        };
        tokio::spawn(streams::hold(target, run.shared.clone(), permit));
    }
    tokio::time::timeout(run.timeout, opening.acquire_many(u32::try_from(concurrency)?))
        .await
        .context("streams still opening at the timeout")??
        .forget();
    let secs = started.elapsed().as_secs_f64();
    let records = &run.shared.records;
    let held: Vec<usize> = (0..records.len())
        .filter(|i| {
            records[*i].open.load(Ordering::Acquire)
                && records[*i].snapshots.load(Ordering::Relaxed) > 0
        })
        .collect();
    println!(
        "{} streams held ({} failed) in {secs:.1} s, {:.0} a second{}",
        thousands(held.len() as u64),
        thousands(run.shared.failures.load(Ordering::Relaxed)),
        held.len() as f64 / secs,
        first_problem(&run.shared)
    );
    if held.is_empty() {
        bail!("no stream opened{}", first_problem(&run.shared));
    }
    Ok((held, secs))
}

/// The send to every recipient, each held stream's user among them: its
/// events tallied and timed from each chunk's commit.
async fn deliver(run: &Run<'_>, held: &[usize]) -> anyhow::Result<Delivery> {
    let (shared, tracked) = (&run.shared, &run.tracked);
    let content = v1::Content {
        title: "Benchmark edge".into(),
        body: "One send, every connected user among its recipients.".into(),
        category: "bench".into(),
        data: HashMap::new(),
        ..Default::default()
    };
    let recipients: Vec<u64> = (1..=run.args.recipients).collect();
    let message_id = harness::draft(&run.channel, content, &recipients).await?;
    shared.target.store(message_id, Ordering::Release);
    let (snap, cpu0) = (tracked.snap(), procstat::cpu_ticks(run.edge).unwrap_or(0));
    let started = Instant::now();
    harness::start_message(&run.channel, message_id).await?;
    wait_all(shared, held, run.timeout, |r| {
        r.delivered.load(Ordering::Relaxed) > 0 || r.covered_delivery.load(Ordering::Relaxed)
    })
    .await;
    let secs = started.elapsed().as_secs_f64();
    let badged =
        wait_all(shared, held, run.timeout, |r| r.unread.load(Ordering::Relaxed) == 1).await;
    let badge_secs = started.elapsed().as_secs_f64();
    // Late duplicates would come within this second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let edge_cpu_secs = cpu_secs_since(run.edge, cpu0);
    let cpu_line = tracked.between(&snap, &tracked.snap()).line(tracked.machine_max());
    let committed = run.commits.of(message_id);
    let mut delivery = Delivery {
        message_id,
        tally: tally(
            shared,
            held,
            |r| r.delivered.load(Ordering::Relaxed),
            |r| r.covered_delivery.load(Ordering::Relaxed),
        ),
        badged,
        commit: Histogram::new(3)?,
        to_publish: Histogram::new(3)?,
        from_publish: Histogram::new(3)?,
        from_created: Histogram::new(3)?,
        gaps: run.commits.gaps(message_id)?,
        without_commit: 0,
        routed: String::new(),
        received: String::new(),
        secs,
        edge_cpu_secs,
    };
    for index in held {
        let record = &shared.records[*index];
        let arrived = record.delivered_ms.load(Ordering::Relaxed);
        if arrived == 0 {
            continue;
        }
        match committed.get(&run.users[*index]) {
            Some(item) => {
                delivery.commit.record((arrived - item.at).max(0) as u64)?;
                if item.published > 0 {
                    delivery.to_publish.record((item.published - item.at).max(0) as u64)?;
                    delivery.from_publish.record((arrived - item.published).max(0) as u64)?;
                }
            }
            None => delivery.without_commit += 1,
        }
        let created = record.created_ms.load(Ordering::Relaxed);
        if created > 0 {
            delivery.from_created.record((arrived - created).max(0) as u64)?;
        }
    }
    let page = metrics::scrape(&run.metrics).await;
    let edge_quantiles = |name| {
        let at = |q| {
            metrics::histogram_quantile(&page, name, &[], q)
                .map_or("-".to_owned(), |s| format!("{:.0}", s * 1000.0))
        };
        format!("p50 {} ms, p99 {} ms", at(0.5), at(0.99))
    };
    delivery.routed = edge_quantiles("notify_event_commit_lag_seconds");
    delivery.received = edge_quantiles("notify_event_lag_seconds");
    println!(
        "send {message_id}: every stream's item_delivered in {secs:.1} s, badges in \
         {badge_secs:.1} s after StartMessage; commit -> client {}\n  cpu: {cpu_line}",
        quantiles(&delivery.commit)
    );
    Ok(delivery)
}

/// Every held stream's user (or `--mark-reads` of them) marks the send's
/// item read through the edge: their `item_updated` and `badge` events.
async fn mark_reads(run: &Run<'_>, held: &[usize], message_id: u64) -> anyhow::Result<Reading> {
    let shared = &run.shared;
    let readers: Vec<usize> =
        held.iter().copied().take(run.args.mark_reads.unwrap_or(usize::MAX)).collect();
    let pairs = Arc::new(readers.iter().map(|i| (*i, run.users[*i])).collect::<Vec<_>>());
    let cpu0 = procstat::cpu_ticks(run.edge).unwrap_or(0);
    let calls = reads::mark_read(
        run.listen,
        pairs,
        message_id,
        run.signer.clone(),
        shared.clone(),
        run.args.read_connections,
    )
    .await?;
    wait_all(shared, &readers, run.timeout, |r| {
        r.updated.load(Ordering::Relaxed) > 0 || r.covered_read.load(Ordering::Relaxed)
    })
    .await;
    let unbadged =
        wait_all(shared, &readers, run.timeout, |r| r.unread.load(Ordering::Relaxed) == 0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut latency = Histogram::<u64>::new(3)?;
    for record in readers.iter().map(|i| &shared.records[*i]) {
        let sent = record.read_sent_ms.load(Ordering::Relaxed);
        let arrived = record.updated_ms.load(Ordering::Relaxed);
        if sent > 0 && arrived > 0 {
            latency.record((arrived - sent).max(0) as u64)?;
        }
    }
    Ok(Reading {
        tally: tally(
            shared,
            &readers,
            |r| r.updated.load(Ordering::Relaxed),
            |r| r.covered_read.load(Ordering::Relaxed),
        ),
        readers: readers.len(),
        unbadged,
        latency,
        edge_cpu_secs: cpu_secs_since(run.edge, cpu0),
        calls,
    })
}
