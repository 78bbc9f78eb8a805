//! `notify-bench console`: what the console's live updates cost the api.
//!
//! One send is paused part-way, so its page has nothing new to show: the
//! state the on-call engineer leaves a tab open on. The api's CPU is read
//! over the same span twice in one run, with no page open (the baseline)
//! and with `--pages` pages following the send over Server-Sent Events;
//! the console's own counters say how many statements its pollers sent to
//! the shards. Then the send is resumed with every page still open, and
//! the same counters are read while it delivers, until every stream has
//! received the final state and ended.
//!
//! Targets (issue 35): at rest, the open pages cost under 5% of one core;
//! never more than one read per shard per `console.update_interval_ms`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use notify_domain::Settings;
use notify_proto::v1;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_testkit::console::{ConsoleClient, EventStream};
use tonic::transport::Channel;

use crate::harness::{self, Env, thousands, verdict};
use crate::procstat;

/// Arguments of `notify-bench console`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsoleArgs {
    /// Pages open on the send.
    #[arg(long, default_value_t = 50)]
    pages: usize,
    /// Recipients of the send (enough that a pause lands before it completes).
    #[arg(long, default_value_t = 100_000)]
    recipients: u64,
    /// Seconds each at-rest measurement lasts.
    #[arg(long, default_value_t = 30)]
    rest_secs: u64,
    /// Shards.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Longest wait for the resumed send to complete.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: ConsoleArgs) -> anyhow::Result<()> {
    ensure!(args.pages > 0, "--pages must be at least 1");
    ensure!(args.rest_secs > 0, "--rest-secs must be at least 1");
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let settings = harness::settings_for(&base, &tag, args.shards);
    let mut env = Env::new(settings)?;
    println!(
        "notify-bench console: tag {tag}, {} pages on one send of {} recipients, {} shards, \
         updates every {} ms",
        args.pages,
        thousands(args.recipients),
        args.shards,
        env.settings.console.update_interval_ms
    );
    let outcome = crate::guarded(body(&mut env, &args)).await;
    env.finish(outcome).await
}

/// The api's CPU and the console's counters over one span.
struct Span {
    secs: f64,
    /// The api's CPU, in cores (1.0 = one core busy).
    cores: f64,
    polls: f64,
    reads: f64,
    updates: f64,
}

impl Span {
    /// Update intervals the span covered.
    fn intervals(&self, interval: Duration) -> f64 {
        self.secs / interval.as_secs_f64()
    }
}

async fn measure(env: &Env, api: u32, length: Duration) -> anyhow::Result<Span> {
    let counters = |page: &notify_testkit::metrics::MetricsPage| {
        (
            page.sum("notify_console_live_polls_total", &[]),
            page.sum("notify_console_live_reads_total", &[("by", "poller")]),
            page.sum("notify_console_live_updates_total", &[]),
        )
    };
    let before = counters(&env.scrape("notify-api").await);
    let cpu0 = procstat::cpu_ticks(api).context("the api's CPU time")?;
    let started = Instant::now();
    tokio::time::sleep(length).await;
    let cpu1 = procstat::cpu_ticks(api).context("the api's CPU time")?;
    let secs = started.elapsed().as_secs_f64();
    let after = counters(&env.scrape("notify-api").await);
    Ok(Span {
        secs,
        cores: (cpu1 - cpu0) as f64 / procstat::clock_ticks_per_sec() as f64 / secs,
        polls: after.0 - before.0,
        reads: after.1 - before.1,
        updates: after.2 - before.2,
    })
}

/// Events a page received, and whether its stream ended after a final one.
#[derive(Default)]
struct PageCounts {
    events: AtomicU64,
    finished: AtomicU64,
}

/// Follows one page's stream until the server ends it.
async fn follow(mut stream: EventStream, counts: Arc<PageCounts>) {
    while let Some(event) = stream.next().await {
        counts.events.fetch_add(1, Ordering::Relaxed);
        if event.data.contains("\"finished\":true") {
            counts.finished.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn body(env: &mut Env, args: &ConsoleArgs) -> anyhow::Result<String> {
    env.start_services().await?;
    let channel = env.channel().await?;
    let id = paused_send(&channel, args.recipients).await?;
    let progress = settled_progress(&channel, id).await?;
    let interval = Duration::from_millis(env.settings.console.update_interval_ms);
    let shards = f64::from(args.shards);
    let api = env.pid("notify-api");
    let rest = Duration::from_secs(args.rest_secs);

    let addr = env.settings.console.listen.parse().context("console.listen")?;
    let client = ConsoleClient::logged_in(addr, "notify-bench").await;
    // Log in and load the page once, so both spans start from a warm api.
    let page = client.get(&format!("/console/sends/{id}")).await;
    ensure!(page.status == 200, "the send's page answered {}", page.status);

    let idle = measure(env, api, rest).await?;

    let counts = Arc::new(PageCounts::default());
    let mut followers = Vec::new();
    for _ in 0..args.pages {
        let mut stream = client.events(&format!("/console/sends/{id}/live")).await;
        // Each page gets the current state at once.
        let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .context("a page's first update")?;
        ensure!(first.is_some(), "a page's stream ended before its first update");
        counts.events.fetch_add(1, Ordering::Relaxed);
        followers.push(tokio::spawn(follow(stream, counts.clone())));
    }
    let opened_events = counts.events.load(Ordering::Relaxed);
    let open = measure(env, api, rest).await?;
    let rest_events = counts.events.load(Ordering::Relaxed) - opened_events;

    // Resume with every page open: the pages follow the delivery to its end.
    let delivering_from = {
        let page = env.scrape("notify-api").await;
        (
            page.sum("notify_console_live_polls_total", &[]),
            page.sum("notify_console_live_reads_total", &[("by", "poller")]),
            page.sum("notify_console_live_updates_total", &[]),
        )
    };
    let resumed = Instant::now();
    MessageServiceClient::new(channel.clone())
        .resume_message(v1::ResumeMessageRequest { message_id: id })
        .await
        .context("ResumeMessage")?;
    let deadline = Duration::from_secs(args.timeout_secs);
    for follower in followers {
        let left = deadline.saturating_sub(resumed.elapsed());
        tokio::time::timeout(left, follower)
            .await
            .context("a page's stream did not end after the send completed")??;
    }
    let delivering_secs = resumed.elapsed().as_secs_f64();
    let delivering = {
        let page = env.scrape("notify-api").await;
        Span {
            secs: delivering_secs,
            cores: 0.0,
            polls: page.sum("notify_console_live_polls_total", &[]) - delivering_from.0,
            reads: page.sum("notify_console_live_reads_total", &[("by", "poller")])
                - delivering_from.1,
            updates: page.sum("notify_console_live_updates_total", &[]) - delivering_from.2,
        }
    };
    let finished = counts.finished.load(Ordering::Relaxed);
    env.check_children()?;

    let added = open.cores - idle.cores;
    let rest_reads = open.reads / open.intervals(interval);
    let delivering_reads = delivering.reads / delivering.intervals(interval);
    let cpu_ok = added < 0.05;
    // One poll may straddle a span's edge: allow one interval's reads over.
    let rest_ok = open.reads <= shards * (open.intervals(interval).ceil() + 1.0);
    let delivering_ok = delivering.reads <= shards * (delivering.intervals(interval).ceil() + 1.0);
    let pages = args.pages as u64;
    Ok(format!(
        "send {id}: paused at {} of {} delivered\n\
         at rest, {:.0} s each, api CPU: no page {:.2}% of a core, {pages} pages {:.2}% \
         (+{:.2}% of a core; target < 5%) {}\n\
         at rest: {} polls, {} shard reads = {rest_reads:.2} per interval for {shards} shards \
         (target <= {shards}) {}; {} updates published, {rest_events} events received by \
         {pages} pages (no change, nothing sent)\n\
         idle baseline: {} polls, {} reads (no page open, no poller)\n\
         delivering {:.1} s with {pages} pages: {} polls, {} reads = {delivering_reads:.2} \
         per interval (target <= {shards}) {}; {} updates published, each page got {:.1} \
         events; {finished} of {pages} pages got the final state and their stream ended {}",
        thousands(progress.delivered),
        thousands(progress.total),
        open.secs,
        idle.cores * 100.0,
        open.cores * 100.0,
        added * 100.0,
        verdict(cpu_ok),
        open.polls,
        open.reads,
        verdict(rest_ok),
        open.updates,
        idle.polls,
        idle.reads,
        delivering.secs,
        delivering.polls,
        delivering.reads,
        verdict(delivering_ok),
        delivering.updates,
        (counts.events.load(Ordering::Relaxed) - opened_events - rest_events) as f64
            / args.pages as f64,
        verdict(finished == pages),
    ))
}

/// Sends to `recipients` users and pauses the send at once; fails if it
/// completed first.
async fn paused_send(channel: &Channel, recipients: u64) -> anyhow::Result<u64> {
    let users: Vec<u64> = (1..=recipients).collect();
    let content = v1::Content {
        title: "notify-bench console".into(),
        body: "a send left paused with pages open on it".into(),
        ..Default::default()
    };
    let id = harness::send_draft(channel, content, &users).await?;
    let paused = MessageServiceClient::new(channel.clone())
        .pause_message(v1::PauseMessageRequest { message_id: id })
        .await;
    if let Err(status) = paused {
        bail!(
            "could not pause the send before it completed ({}): raise --recipients",
            status.message()
        );
    }
    Ok(id)
}

/// The send's progress once chunks already taken by workers have landed
/// (unchanged over two seconds).
async fn settled_progress(channel: &Channel, id: u64) -> anyhow::Result<v1::Progress> {
    let mut messages = MessageServiceClient::new(channel.clone());
    let mut last: Option<v1::Progress> = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let message = messages
            .get_message(v1::GetMessageRequest { message_id: id })
            .await
            .context("GetMessage")?
            .into_inner();
        let progress = message.progress.unwrap_or_default();
        if last.as_ref() == Some(&progress) {
            return Ok(progress);
        }
        ensure!(Instant::now() < deadline, "the paused send's progress never settled");
        last = Some(progress);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
