//! `notify-bench chaos --minutes N`: a mixed load on two api and two worker
//! processes while faults are injected at random, then invariants checked
//! from MySQL.
//!
//! Every backend connection of the four processes goes through its own
//! fault proxy (`notify_testkit::faults`): each shard, Redis and RabbitMQ.
//! The injector takes a shard, Redis or RabbitMQ down for 2-6 s, resets
//! their connections, and SIGKILLs `api-2` or `worker-2` (restarted 1-3 s
//! later). `api-1` and `worker-1` are never killed: they are the witnesses
//! whose memory is compared over the second half of the run.
//!
//! The load: sends of 1 to 200,000 recipients (ranges of user ids, retried
//! with their idempotency key until accepted; every third one personalized:
//! a template filled with each recipient's own var), announcements, group sends
//! (retried with their key), inbox reads, mark-reads (by ids, and by filter:
//! read and unread), group pulls and acks, badge reads, and a controller
//! that cancels, recalls and edits sends and cancels announcements (each
//! call repeated until it answers, none repeated to make it right). Calls
//! fail while faults last; that is expected and counted.
//!
//! At the end, with every fault healed and every send finished:
//! - every completed send has exactly one item per recipient, and its
//!   progress total equals its recipients;
//! - every item of a completed personalized send carries its own
//!   recipient's vars, and a sample of them reads rendered for their user;
//! - every group's seqs are 1..=max with no gap or repeat;
//! - every touched user's badge and group unread count equal MySQL, and so
//!   does their first inbox page (items and read states);
//! - no pending or unsettled chunk is left under a completed or cancelled send;
//! - no control operation is left, and a recalled send or a cancelled
//!   announcement is listed and counted by nobody: every shard's content
//!   copy is revoked, no item of it is read by anyone since, and a recall
//!   took back every item delivered;
//! - every shard's content copy of an edited send has its last edit;
//! - once the reads waiting to be counted are, every send's read count and
//!   readers equal its items read;
//! - every reader was reported to the `item.read` endpoint (a receiver in
//!   this process, the one webhook of the client `local` every call runs
//!   as), once the read feed is empty: at least once through the faults;
//! - the witnesses' RSS grew by at most 20% over the second half.
//!
//! It prints the faults injected and the invariants checked, and fails on
//! any violation.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use notify_domain::Settings;
use notify_domain::domain::SendStatus;
use notify_domain::settings::{ClientSettings, WebhookEndpoint};
use notify_proto::v1;
use notify_proto::v1::group_service_client::GroupServiceClient;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_testkit::faults::{FaultProxy, Proxies, route_through_proxies};
use notify_testkit::servers::free_port;
use rand::Rng;
use tokio::process::{Child, Command};
use tonic::transport::Channel;

use crate::config_file;
use crate::harness::{self, Binaries, Env, thousands};
use crate::procstat;

/// Arguments of `notify-bench chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// Minutes of load and faults.
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// Users the sends pick their recipient ranges from.
    #[arg(long, default_value_t = 1_000_000)]
    users: u64,
    /// Groups (50 members each).
    #[arg(long, default_value_t = 8)]
    groups: u64,
    /// Touched users whose badges and first inbox pages are checked at the
    /// end (a sample).
    #[arg(long, default_value_t = 3_000)]
    badge_checks: usize,
}

/// Runs the soak and exits non-zero on a violated invariant.
pub async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let base = Settings::defaults().map_err(|e| anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut settings = harness::settings_for(&base, &tag, 4);
    settings.worker.sweep_timeout_secs = 5;
    settings.worker.operation_timeout_secs = 10;
    let hooks = ReadHooks::start().await?;
    settings.auth.clients = vec![hooks.client()];
    let direct = settings.clone();
    let mut env = Env::new(settings.clone())?;
    env.migrate(&direct, "direct.toml").await?;
    let outcome = crate::guarded(soak(&args, &mut env, direct, settings, &hooks)).await;
    let failed = outcome.as_ref().map_or(true, |report| !report.ok);
    let text = outcome.map(|report| report.text);
    if failed {
        env.set_failed();
    }
    env.finish(text).await?;
    if failed {
        bail!("chaos: an invariant was violated (see above)");
    }
    Ok(())
}

struct Report {
    text: String,
    ok: bool,
}

/// One of the four processes under test.
struct Proc {
    name: &'static str,
    bin: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// The api's gRPC address (`None` for a worker).
    grpc: Option<SocketAddr>,
}

impl Proc {
    fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut cmd = Command::new(&self.bin);
        harness::child_env(&mut cmd, &self.config);
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
        self.child = Some(cmd.spawn().with_context(|| format!("spawn {}", self.name))?);
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    fn rss_kb(&self) -> Option<u64> {
        self.pid().and_then(procstat::rss_kb)
    }
}

/// What the load did, and what it must find at the end.
#[derive(Default)]
struct Ledger {
    /// Accepted sends: message id -> recipients (a range, so distinct).
    sends: BTreeMap<u64, (u64, u64)>,
    /// Those of them that are personalized ([`content_for`]).
    personalized: BTreeSet<u64>,
    announcements: Vec<u64>,
    /// Sends cancelled, recalled, and edited (with their last title), and
    /// announcements cancelled, by the controller.
    cancelled: BTreeSet<u64>,
    recalled: BTreeSet<u64>,
    edited: BTreeMap<u64, String>,
    touched: BTreeSet<u64>,
    calls: u64,
    failed_calls: u64,
    given_up: u64,
}

type Shared = Arc<Mutex<Ledger>>;

fn ledger(shared: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

fn note<T>(shared: &Shared, result: &Result<T, tonic::Status>) {
    let mut ledger = ledger(shared);
    ledger.calls += 1;
    if result.is_err() {
        ledger.failed_calls += 1;
    }
}

/// Faults injected, by kind.
type Faults = Arc<Mutex<BTreeMap<&'static str, u64>>>;

async fn soak(
    args: &ChaosArgs,
    env: &mut Env,
    direct: Settings,
    mut proxied: Settings,
    hooks: &ReadHooks,
) -> anyhow::Result<Report> {
    let proxies = Arc::new(route_through_proxies(&mut proxied).await);
    let bins = Binaries::locate()?;
    let mut procs = Vec::new();
    for (name, is_api) in
        [("api-1", true), ("api-2", true), ("worker-1", false), ("worker-2", false)]
    {
        let mut settings = proxied.clone();
        let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        settings.api.listen = grpc.to_string();
        settings.api.metrics_listen = format!("127.0.0.1:{}", free_port());
        settings.worker.metrics_listen = format!("127.0.0.1:{}", free_port());
        // Each api its own console port (two on the default would collide).
        settings.console.listen = format!("127.0.0.1:{}", free_port());
        let config = env.dir.join(format!("{name}.toml"));
        std::fs::write(&config, config_file::to_toml(&settings))?;
        let bin = if is_api { bins.api.clone() } else { bins.worker.clone() };
        let log = env.dir.join(format!("{name}.log"));
        let mut proc = Proc { name, bin, config, log, child: None, grpc: is_api.then_some(grpc) };
        proc.start()?;
        procs.push(proc);
    }
    let mut channels = Vec::new();
    for proc in procs.iter().filter(|p| p.grpc.is_some()) {
        let uri = format!("http://{}", proc.grpc.unwrap_or_else(|| unreachable!()));
        // Lazy: a killed api is reconnected to by the channel itself.
        let channel = Channel::from_shared(uri)?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(15))
            .connect_lazy();
        channels.push(channel);
    }
    wait_serving(&channels[0]).await?;
    wait_serving(&channels[1]).await?;
    println!(
        "chaos: {} min, 2 api + 2 worker processes behind fault proxies, logs in {}",
        args.minutes,
        env.dir.display()
    );

    let shared: Shared = Arc::default();
    let groups = create_groups(&channels[0], args.groups, &shared).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    for worker in 0..2 {
        load.spawn(senders(channels.clone(), args.users, shared.clone(), stop.clone(), worker));
    }
    load.spawn(announcer(channels.clone(), shared.clone(), stop.clone()));
    load.spawn(controller(channels.clone(), shared.clone(), stop.clone()));
    load.spawn(group_senders(channels.clone(), groups.clone(), shared.clone(), stop.clone()));
    for _ in 0..2 {
        load.spawn(readers(channels.clone(), groups.clone(), shared.clone(), stop.clone()));
    }

    let faults: Faults = Arc::default();
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    let started = Instant::now();
    let mut rss_mid: Option<(u64, u64)> = None;
    let mut rss_end = (0, 0);
    let mut rss_samples = Vec::new();
    let mut rng = rand::rng();
    while started.elapsed() < duration {
        let pause = Duration::from_millis(rng.random_range(3_000..8_000));
        tokio::time::sleep(pause).await;
        if rss_mid.is_none() && started.elapsed() >= duration / 2 {
            rss_mid = Some(witness_rss(&procs));
        }
        rss_end = witness_rss(&procs);
        rss_samples.push((started.elapsed().as_secs(), rss_end));
        inject(&mut rng, &proxies, &mut procs, &faults).await?;
    }
    stop.store(true, Ordering::Relaxed);
    while load.join_next().await.is_some() {}
    heal_all(&proxies).await;
    for proc in &mut procs {
        if proc.child.is_none() {
            proc.start()?;
        }
    }
    let rss_mid = rss_mid.unwrap_or(rss_end);

    println!("chaos: load stopped; waiting for every send to finish");
    let ctx = notify_core::Context::connect(direct.clone()).await.map_err(|e| anyhow!("{e}"))?;
    let finished = wait_finished(&ctx, &shared, Duration::from_secs(600)).await;
    let mut checks = Checks::default();
    checks.record("every accepted send completed within 10 min", finished);
    let mut messages = MessageServiceClient::new(channels[0].clone());
    checks.record(
        "completed sends: one item per recipient",
        exactly_once(&ctx, &shared, &mut messages).await,
    );
    checks.record("group seqs: 1..=max, no gap or repeat", group_seqs(&ctx, &groups).await);
    let mut inbox = InboxServiceClient::new(channels[0].clone());
    checks.record(
        "personalized sends: each item its own vars, read rendered",
        personalized(&ctx, &shared, &mut inbox, args.badge_checks).await,
    );
    checks.record(
        "badges and group unread equal MySQL",
        badges(&ctx, &shared, &mut inbox, args.badge_checks).await,
    );
    checks.record(
        "first inbox pages equal MySQL",
        first_pages(&ctx, &shared, &mut inbox, args.badge_checks).await,
    );
    checks.record("no pending chunk under a finished send", leftover_chunks(&ctx, &shared).await);
    checks.record(
        "cancelled and recalled: listed and counted by nobody",
        withdrawn(&ctx, &shared, &mut messages).await,
    );
    checks.record("edits: every shard's copy has the last", edits(&ctx, &shared).await);
    checks.record(
        "read counts and readers equal items read",
        read_counts(&ctx, Duration::from_secs(60)).await,
    );
    checks.record(
        "every reader reported to item.read",
        reads_reported(&ctx, hooks, Duration::from_secs(120)).await,
    );
    let growth = |mid: u64, end: u64| end as f64 / mid.max(1) as f64;
    let (api_growth, worker_growth) = (growth(rss_mid.0, rss_end.0), growth(rss_mid.1, rss_end.1));
    let measured = [rss_mid.0, rss_mid.1, rss_end.0, rss_end.1].iter().all(|kb| *kb > 0);
    let rss_ok = measured && api_growth <= 1.2 && worker_growth <= 1.2;
    checks.record(
        "witness RSS growth over the second half <= 20%",
        if rss_ok {
            Ok(2)
        } else if !measured {
            Err(anyhow!("no RSS reading of a witness"))
        } else {
            Err(anyhow!("api x{api_growth:.2}, worker x{worker_growth:.2}"))
        },
    );
    for proc in &mut procs {
        proc.kill().await;
    }
    drop(ctx);

    let ledger = ledger(&shared);
    let mut text = String::new();
    text.push_str("\nfaults injected\n");
    for (kind, count) in faults.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        text.push_str(&format!("  {kind:<34} {count:>6}\n"));
    }
    text.push_str(&format!(
        "\nload: {} calls ({} failed while faults lasted), {} sends accepted ({} recipients), \
         {} given up, {} announcements, {} users touched\n",
        thousands(ledger.calls),
        thousands(ledger.failed_calls),
        ledger.sends.len(),
        thousands(ledger.sends.values().map(|(_, size)| size).sum()),
        ledger.given_up,
        ledger.announcements.len(),
        thousands(ledger.touched.len() as u64)
    ));
    let (calls, reported) = hooks.tally();
    text.push_str(&format!(
        "item.read: {} calls reporting {} (message, reader) pairs\n",
        thousands(calls),
        thousands(reported)
    ));
    text.push_str(&format!(
        "witness RSS: api {} -> {} kB (x{api_growth:.2}), worker {} -> {} kB (x{worker_growth:.2})\n",
        thousands(rss_mid.0),
        thousands(rss_end.0),
        thousands(rss_mid.1),
        thousands(rss_end.1)
    ));
    text.push_str("witness RSS over time (s: api / worker MB):");
    for (at, (api, worker)) in rss_samples.iter().step_by((rss_samples.len() / 12).max(1)) {
        text.push_str(&format!(" {at}: {} / {}", api / 1024, worker / 1024));
    }
    text.push('\n');
    text.push_str("\ninvariants\n");
    text.push_str(&checks.table());
    Ok(Report { text, ok: checks.ok() })
}

#[derive(Default)]
struct Checks {
    rows: Vec<(String, String, bool)>,
}

impl Checks {
    fn record(&mut self, what: &str, outcome: anyhow::Result<u64>) {
        let (detail, ok) = match outcome {
            Ok(checked) => (format!("OK   ({} checked)", thousands(checked)), true),
            Err(e) => (format!("FAIL {e:#}"), false),
        };
        self.rows.push((what.to_owned(), detail, ok));
    }

    fn ok(&self) -> bool {
        self.rows.iter().all(|(_, _, ok)| *ok)
    }

    fn table(&self) -> String {
        self.rows.iter().map(|(what, detail, _)| format!("  {what:<50} {detail}\n")).collect()
    }
}

async fn wait_serving(channel: &Channel) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut inbox = InboxServiceClient::new(channel.clone());
    loop {
        match inbox.get_unread_count(v1::GetUnreadCountRequest { user_id: 1 }).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => bail!("the api does not answer: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn witness_rss(procs: &[Proc]) -> (u64, u64) {
    let rss =
        |name: &str| procs.iter().find(|p| p.name == name).and_then(Proc::rss_kb).unwrap_or(0);
    (rss("api-1"), rss("worker-1"))
}

async fn inject(
    rng: &mut impl Rng,
    proxies: &Proxies,
    procs: &mut [Proc],
    faults: &Faults,
) -> anyhow::Result<()> {
    let outage = Duration::from_millis(rng.random_range(2_000..6_000));
    let shard = rng.random_range(0..proxies.shards.len());
    let kind: &'static str = match rng.random_range(0..8) {
        0 => {
            outage_of(&proxies.shards[shard], outage).await;
            "shard down 2-6 s"
        }
        1 => {
            proxies.shards[shard].reset_connections().await;
            "shard connections reset"
        }
        2 => {
            outage_of(&proxies.redis, outage).await;
            "redis down 2-6 s"
        }
        3 => {
            proxies.redis.reset_connections().await;
            "redis connections reset"
        }
        4 => {
            outage_of(&proxies.rabbitmq, outage).await;
            "rabbitmq down 2-6 s"
        }
        5 => {
            proxies.rabbitmq.reset_connections().await;
            "rabbitmq connections reset"
        }
        6 => {
            restart_after_kill(procs, "api-2", rng).await?;
            "api-2 SIGKILL + restart"
        }
        _ => {
            restart_after_kill(procs, "worker-2", rng).await?;
            "worker-2 SIGKILL + restart"
        }
    };
    *faults.lock().unwrap_or_else(|e| e.into_inner()).entry(kind).or_default() += 1;
    Ok(())
}

async fn outage_of(proxy: &FaultProxy, outage: Duration) {
    proxy.down().await;
    tokio::time::sleep(outage).await;
    proxy.up().await;
}

async fn restart_after_kill(
    procs: &mut [Proc],
    name: &str,
    rng: &mut impl Rng,
) -> anyhow::Result<()> {
    let down = Duration::from_millis(rng.random_range(1_000..3_000));
    let proc = procs.iter_mut().find(|p| p.name == name).ok_or_else(|| anyhow!("no {name}"))?;
    proc.kill().await;
    tokio::time::sleep(down).await;
    proc.start()
}

async fn heal_all(proxies: &Proxies) {
    for proxy in proxies.shards.iter().chain([&proxies.redis, &proxies.rabbitmq]) {
        proxy.heal().await;
    }
}

fn content(title: String) -> v1::Content {
    v1::Content { title, body: "chaos".into(), ..Default::default() }
}

/// A send's content: a personalized one's title is a template that ends
/// with each recipient's own `n` (their user id).
fn content_for(title: String, personalized: bool) -> v1::Content {
    let mut content = content(title);
    if personalized {
        content.title.push_str(" {{ n }}");
        content.template =
            Some(v1::Template { recipient_vars: vec!["n".into()], ..Default::default() });
    }
    content
}

/// Users `range` as a send lists them: bare ids, or each with their `n`.
fn audience_of(
    range: std::ops::Range<u64>,
    personalized: bool,
) -> (Vec<u64>, Vec<v1::RecipientVars>) {
    if !personalized {
        return (range.collect(), Vec::new());
    }
    let recipients = range
        .map(|user_id| v1::RecipientVars {
            user_id,
            vars: [("n".to_owned(), user_id.to_string())].into(),
        })
        .collect();
    (Vec::new(), recipients)
}

/// Calls `call` until it succeeds (alternating apis), at most `tries` times.
async fn retried<T, F, Fut>(
    channels: &[Channel],
    shared: &Shared,
    tries: u32,
    mut call: F,
) -> Option<T>
where
    F: FnMut(Channel) -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    for attempt in 0..tries {
        let result = call(channels[attempt as usize % channels.len()].clone()).await;
        note(shared, &result);
        if let Ok(value) = result {
            return Some(value);
        }
        tokio::time::sleep(Duration::from_millis(300 + 200 * u64::from(attempt))).await;
    }
    ledger(shared).given_up += 1;
    None
}

async fn senders(
    channels: Vec<Channel>,
    users: u64,
    shared: Shared,
    stop: Arc<AtomicBool>,
    worker: u32,
) {
    let mut serial = 0u64;
    while !stop.load(Ordering::Relaxed) {
        serial += 1;
        let size = if serial == 1 {
            // The biggest kind first: the processes reach the memory a
            // 200,000-recipient send takes in the first half, so the second
            // half's growth is growth, not warm-up.
            200_000
        } else {
            let mut rng = rand::rng();
            // About 5,000 recipients per send on average; with two
            // senders pausing a second, ~9,000 recipients/s: what this
            // 2-core machine delivers while the faults keep hitting it.
            match rng.random_range(0..100) {
                0..30 => 1,
                30..60 => 100,
                60..87 => 2_000,
                87..99 => 20_000,
                _ => 200_000,
            }
        };
        let first = rand::rng().random_range(1..=users - size);
        let key = format!("chaos-{worker}-{serial}");
        let personalized = serial.is_multiple_of(3);
        let id = if size > 50_000 {
            big_send(&channels, &shared, &key, first, size, personalized).await
        } else {
            let (user_ids, recipients) = audience_of(first..first + size, personalized);
            let request = v1::SendMessageRequest {
                sender: "chaos".into(),
                idempotency_key: key.clone(),
                content: Some(content_for(key.clone(), personalized)),
                audience: Some(v1::send_message_request::Audience::Users(v1::UserAudience {
                    user_ids,
                    recipients,
                })),
                ..Default::default()
            };
            retried(&channels, &shared, 30, |channel| {
                let request = request.clone();
                async move {
                    let mut client =
                        MessageServiceClient::new(channel).max_encoding_message_size(64 << 20);
                    client.send_message(request).await.map(|r| r.into_inner().message_id)
                }
            })
            .await
        };
        if let Some(id) = id {
            let mut ledger = ledger(&shared);
            ledger.sends.insert(id, (first, size));
            if personalized {
                ledger.personalized.insert(id);
            }
            ledger.touched.extend(first..first + size.min(20));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A send too big for one call: a draft filled in numbered batches (each
/// retried; a repeated batch adds nothing) and started.
async fn big_send(
    channels: &[Channel],
    shared: &Shared,
    key: &str,
    first: u64,
    size: u64,
    personalized: bool,
) -> Option<u64> {
    let request = v1::CreateMessageRequest {
        sender: "chaos".into(),
        idempotency_key: key.to_owned(),
        content: Some(content_for(key.to_owned(), personalized)),
        ..Default::default()
    };
    let id = retried(channels, shared, 30, |channel| {
        let request = request.clone();
        async move {
            let mut client = MessageServiceClient::new(channel);
            client.create_message(request).await.map(|r| r.into_inner().message_id)
        }
    })
    .await?;
    for (index, start) in (first..first + size).step_by(50_000).enumerate() {
        let (user_ids, recipients) =
            audience_of(start..(start + 50_000).min(first + size), personalized);
        let batch = v1::AppendRecipientsRequest {
            message_id: id,
            batch_number: index as u64 + 1,
            user_ids,
            recipients,
        };
        retried(channels, shared, 30, |channel| {
            let batch = batch.clone();
            async move {
                let mut client =
                    MessageServiceClient::new(channel).max_encoding_message_size(64 << 20);
                client.append_recipients(batch).await.map(|_| ())
            }
        })
        .await?;
    }
    retried(channels, shared, 30, |channel| async move {
        let mut client = MessageServiceClient::new(channel);
        match client.start_message(v1::StartMessageRequest { message_id: id }).await {
            Ok(_) => Ok(()),
            // A retry of a start that went through.
            Err(e)
                if e.code() == tonic::Code::FailedPrecondition
                    && e.message().contains("already") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    })
    .await?;
    Some(id)
}

async fn announcer(channels: Vec<Channel>, shared: Shared, stop: Arc<AtomicBool>) {
    let mut serial = 0;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_secs(20)).await;
        serial += 1;
        let key = format!("chaos-announcement-{serial}");
        let request = v1::SendMessageRequest {
            sender: "chaos".into(),
            idempotency_key: key.clone(),
            content: Some(content(key)),
            audience: Some(v1::send_message_request::Audience::AllUsers(
                v1::AllUsersAudience::default(),
            )),
            ..Default::default()
        };
        let sent = retried(&channels, &shared, 30, |channel| {
            let request = request.clone();
            async move {
                let mut client = MessageServiceClient::new(channel);
                client.send_message(request).await.map(|r| r.into_inner().message_id)
            }
        })
        .await;
        if let Some(id) = sent {
            ledger(&shared).announcements.push(id);
        }
    }
}

/// Groups of 50 members: group `g` has users `g * 1_000 + 1 ..= g * 1_000 + 50`.
async fn create_groups(
    channel: &Channel,
    groups: u64,
    shared: &Shared,
) -> anyhow::Result<Vec<u64>> {
    let mut client = GroupServiceClient::new(channel.clone());
    let mut ids = Vec::new();
    for g in 1..=groups {
        let id = client
            .create_group(v1::CreateGroupRequest { group_id: 0, name: format!("chaos-{g}") })
            .await?
            .into_inner()
            .group_id;
        let members: Vec<u64> = (g * 1_000 + 1..=g * 1_000 + 50).collect();
        client
            .add_group_members(v1::AddGroupMembersRequest {
                group_id: id,
                user_ids: members.clone(),
                with_history: false,
            })
            .await?;
        ledger(shared).touched.extend(members);
        ids.push(id);
    }
    Ok(ids)
}

async fn group_senders(
    channels: Vec<Channel>,
    groups: Vec<u64>,
    shared: Shared,
    stop: Arc<AtomicBool>,
) {
    let mut serial = 0;
    while !stop.load(Ordering::Relaxed) {
        serial += 1;
        let group_id = groups[rand::rng().random_range(0..groups.len())];
        let key = format!("chaos-group-{serial}");
        let request = v1::SendGroupMessageRequest {
            group_id,
            sender: "chaos".into(),
            idempotency_key: key.clone(),
            content: Some(content(key)),
        };
        retried(&channels, &shared, 30, |channel| {
            let request = request.clone();
            async move {
                let mut client = GroupServiceClient::new(channel);
                client.send_group_message(request).await.map(|_| ())
            }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn readers(channels: Vec<Channel>, groups: Vec<u64>, shared: Shared, stop: Arc<AtomicBool>) {
    let mut turn = 0usize;
    while !stop.load(Ordering::Relaxed) {
        turn += 1;
        let channel = channels[turn % channels.len()].clone();
        let user = {
            let ledger = ledger(&shared);
            let index = rand::rng().random_range(0..ledger.touched.len().max(1));
            ledger.touched.iter().nth(index).copied().unwrap_or(1)
        };
        let mut inbox = InboxServiceClient::new(channel.clone());
        let badge = inbox.get_unread_count(v1::GetUnreadCountRequest { user_id: user }).await;
        note(&shared, &badge);
        let page = inbox
            .list_inbox(v1::ListInboxRequest { user_id: user, page_size: 20, ..Default::default() })
            .await;
        note(&shared, &page);
        if let Ok(page) = page {
            let unread: Vec<u64> =
                page.into_inner().items.iter().filter(|i| !i.read).map(|i| i.message_id).collect();
            if !unread.is_empty() && turn.is_multiple_of(2) {
                let marked = inbox
                    .mark_read(v1::MarkReadRequest { user_id: user, message_ids: unread })
                    .await;
                note(&shared, &marked);
            }
        }
        // Filtered reads and unreads, whose sends' counts follow from a
        // backlog row (a killed api leaves it to the workers).
        if turn.is_multiple_of(5) {
            let action = if turn.is_multiple_of(3) {
                v1::ItemAction::MarkUnread
            } else {
                v1::ItemAction::MarkRead
            };
            let request = v1::UpdateItemsRequest {
                user_id: user,
                action: action as i32,
                message_ids: Vec::new(),
                all: Some(v1::ItemFilter { view: v1::InboxView::All as i32, ..Default::default() }),
            };
            let updated = inbox.update_items(request).await;
            note(&shared, &updated);
        }
        // A group member pulls a page and acks it.
        let g = rand::rng().random_range(0..groups.len());
        let member = (g as u64 + 1) * 1_000 + rand::rng().random_range(1..=50);
        let mut group = GroupServiceClient::new(channel);
        let pulled = group
            .pull_group_messages(v1::PullGroupMessagesRequest {
                user_id: member,
                group_id: groups[g],
                after_seq: None,
                limit: 50,
            })
            .await;
        note(&shared, &pulled);
        if let Some(last) = pulled.ok().and_then(|p| p.into_inner().messages.last().map(|m| m.seq))
        {
            let acked = group
                .ack_group_messages(v1::AckGroupMessagesRequest {
                    user_id: member,
                    group_id: groups[g],
                    seq: last,
                })
                .await;
            note(&shared, &acked);
        }
    }
}

/// Status of a send on its home shard.
async fn status_of(ctx: &notify_core::Context, message_id: u64) -> anyhow::Result<Option<u8>> {
    let home = ctx.pools.for_message(message_id).value();
    Ok(sqlx::query_scalar("SELECT status FROM messages WHERE message_id = ?")
        .bind(message_id)
        .fetch_optional(home)
        .await?)
}

async fn wait_finished(
    ctx: &notify_core::Context,
    shared: &Shared,
    within: Duration,
) -> anyhow::Result<u64> {
    let ids: Vec<u64> = ledger(shared).sends.keys().copied().collect();
    let deadline = Instant::now() + within;
    for id in &ids {
        let id = *id;
        // Completed, or cancelled or recalled by the controller.
        loop {
            let status = status_of(ctx, id).await?;
            let done = [SendStatus::Completed, SendStatus::Cancelled, SendStatus::Recalled];
            if status.is_some_and(|s| done.iter().any(|d| *d as u8 == s)) {
                break;
            }
            if Instant::now() > deadline {
                bail!("send {id} did not finish: status {status:?} (0 draft, 1 sending)");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // And every control operation is through, on every shard.
    loop {
        let mut left = 0;
        for (_, pool) in ctx.pools.iter() {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM message_operations")
                .fetch_one(pool)
                .await?;
            left += n;
        }
        if left == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{left} control operations not finished");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(ids.len() as u64)
}

/// Every `4-8 s`, cancels, recalls or edits one of the accepted sends, and
/// now and then cancels an announcement: each call repeated while it fails
/// on a fault, until it answers (a refusal for the send's state is an
/// answer: a cancel of a completed send, an edit of a recalled one).
async fn controller(channels: Vec<Channel>, shared: Shared, stop: Arc<AtomicBool>) {
    let mut serial = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let pause = Duration::from_millis(rand::rng().random_range(4_000..8_000));
        tokio::time::sleep(pause).await;
        serial += 1;
        let (send, announcement, personalized) = {
            let ledger = ledger(&shared);
            let index = rand::rng().random_range(0..ledger.sends.len().max(1));
            let send = ledger.sends.keys().nth(index).copied();
            let live = ledger.announcements.iter().rev().find(|a| !ledger.cancelled.contains(a));
            let personalized = send.is_some_and(|id| ledger.personalized.contains(&id));
            (send, live.copied(), personalized)
        };
        let kind = serial % 4;
        let target = if kind == 3 { announcement } else { send };
        let Some(id) = target else { continue };
        // A personalized send's edit keeps its template's recipient vars.
        let edited = content_for(format!("edited-{serial}"), personalized && kind != 3);
        let title = edited.title.clone();
        let answered = retried(&channels, &shared, 30, |channel| {
            let edited = edited.clone();
            async move {
                let mut client = MessageServiceClient::new(channel);
                let call = match kind {
                    0 | 3 => {
                        client.cancel_message(v1::CancelMessageRequest { message_id: id }).await
                    }
                    1 => client.recall_message(v1::RecallMessageRequest { message_id: id }).await,
                    _ => {
                        let request =
                            v1::EditMessageRequest { message_id: id, content: Some(edited) };
                        client.edit_message(request).await
                    }
                };
                match call {
                    Ok(_) => Ok(true),
                    Err(e) if e.code() == tonic::Code::FailedPrecondition => Ok(false),
                    Err(e) => Err(e),
                }
            }
        })
        .await;
        if answered == Some(true) {
            let mut ledger = ledger(&shared);
            match kind {
                0 | 3 => ledger.cancelled.insert(id),
                1 => ledger.recalled.insert(id),
                _ => ledger.edited.insert(id, title).is_none(),
            };
        }
    }
}

/// Recalled sends and cancelled announcements: on every shard, the content
/// copy (where there is one) is revoked, so no list or count shows them;
/// no item of theirs is read but by a reader before the withdrawal counted
/// in a recall; and a recall took back every item delivered.
async fn withdrawn(
    ctx: &notify_core::Context,
    shared: &Shared,
    messages: &mut MessageServiceClient<Channel>,
) -> anyhow::Result<u64> {
    let (recalled, cancelled, announcements) = {
        let ledger = ledger(shared);
        (ledger.recalled.clone(), ledger.cancelled.clone(), ledger.announcements.clone())
    };
    let withdrawn: Vec<u64> = recalled
        .iter()
        .copied()
        .chain(announcements.iter().copied().filter(|a| cancelled.contains(a)))
        .collect();
    for id in &withdrawn {
        for (shard, pool) in ctx.pools.iter() {
            let shown: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM message_contents WHERE message_id = ? AND revoked = 0",
            )
            .bind(id)
            .fetch_one(pool)
            .await?;
            if shown > 0 {
                bail!("message {id}: shard {shard}'s content copy is not revoked");
            }
        }
    }
    for id in &recalled {
        let message = messages.get_message(v1::GetMessageRequest { message_id: *id }).await?;
        let message = message.into_inner();
        let progress = message.progress.unwrap_or_default();
        if message.finished_at.is_none() || progress.recalled != progress.delivered {
            bail!("send {id}: recall not finished or partial: {progress:?}");
        }
    }
    Ok(withdrawn.len() as u64)
}

/// Every shard's content copy of each edited (and not recalled) send has
/// its last edit's title.
async fn edits(ctx: &notify_core::Context, shared: &Shared) -> anyhow::Result<u64> {
    let edited = ledger(shared).edited.clone();
    let mut checked = 0;
    for (id, title) in &edited {
        for (shard, pool) in ctx.pools.iter() {
            let titles: Vec<String> =
                sqlx::query_scalar("SELECT title FROM message_contents WHERE message_id = ?")
                    .bind(id)
                    .fetch_all(pool)
                    .await?;
            if let Some(other) = titles.iter().find(|shown| *shown != title) {
                bail!("send {id}: shard {shard}'s copy shows {other:?}, the last edit {title:?}");
            }
        }
        checked += 1;
    }
    Ok(checked)
}

async fn exactly_once(
    ctx: &notify_core::Context,
    shared: &Shared,
    messages: &mut MessageServiceClient<Channel>,
) -> anyhow::Result<u64> {
    let sends: BTreeMap<u64, (u64, u64)> = ledger(shared).sends.clone();
    // One scan per shard (items are keyed by user): per send, its items and
    // the lowest and highest recipient. With the primary key (user, send)
    // ruling out repeats, `size` items between `first` and `first + size - 1`
    // are exactly the range.
    let mut found: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    for (_, pool) in ctx.pools.iter() {
        let rows: Vec<(u64, i64, u64, u64)> = sqlx::query_as(
            "SELECT message_id, COUNT(*), MIN(user_id), MAX(user_id) FROM message_items \
             GROUP BY message_id",
        )
        .fetch_all(pool)
        .await?;
        for (id, n, low, high) in rows {
            let entry = found.entry(id).or_insert((0, u64::MAX, 0));
            entry.0 += n as u64;
            entry.1 = entry.1.min(low);
            entry.2 = entry.2.max(high);
        }
    }
    let mut checked = 0;
    for (id, (first, size)) in sends {
        if status_of(ctx, id).await? != Some(SendStatus::Completed as u8) {
            continue;
        }
        let (items, low, high) = found.get(&id).copied().unwrap_or((0, 0, 0));
        if items != size || low < first || high >= first + size {
            bail!(
                "send {id}: {items} items of users {low}..={high} for the {size} users from {first}"
            );
        }
        let total = messages
            .get_message(v1::GetMessageRequest { message_id: id })
            .await?
            .into_inner()
            .progress
            .map_or(0, |p| p.total);
        if total != size {
            bail!("send {id}: progress total {total} for {size} recipients");
        }
        checked += 1;
    }
    Ok(checked)
}

/// Every item of each completed personalized send carries its own
/// recipient's vars (`{"n":"<user id>"}`), on every shard; and for a sample
/// of them, the user's ListInbox shows the title rendered with their id
/// (worker kills, redeliveries and splits notwithstanding).
async fn personalized(
    ctx: &notify_core::Context,
    shared: &Shared,
    inbox: &mut InboxServiceClient<Channel>,
    sample: usize,
) -> anyhow::Result<u64> {
    let (sends, recalled) = {
        let ledger = ledger(shared);
        let sends: Vec<(u64, (u64, u64))> =
            ledger.personalized.iter().map(|id| (*id, ledger.sends[id])).collect();
        (sends, ledger.recalled.clone())
    };
    let mut checked = 0;
    let mut sampled = 0;
    for (id, (first, size)) in sends {
        if status_of(ctx, id).await? != Some(SendStatus::Completed as u8) {
            continue;
        }
        for (shard, pool) in ctx.pools.iter() {
            // Its recipients' range of the primary key (user_id,
            // message_id): no index leads with message_id, and a scan of a
            // shard's every item per send kept the check of a 20-minute
            // soak running for over half an hour.
            let wrong: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM message_items WHERE user_id >= ? AND user_id < ? \
                 AND message_id = ? \
                 AND (vars IS NULL OR vars <> CONCAT('{\"n\":\"', user_id, '\"}'))",
            )
            .bind(first)
            .bind(first + size)
            .bind(id)
            .fetch_one(pool)
            .await?;
            if wrong > 0 {
                bail!("send {id}: {wrong} items on shard {shard} without their own vars");
            }
        }
        checked += 1;
        if sampled < sample && !recalled.contains(&id) {
            let user = first + rand::rng().random_range(0..size);
            let request =
                v1::ListInboxRequest { user_id: user, page_size: 100, ..Default::default() };
            let page = inbox.list_inbox(request).await?.into_inner();
            let shown = page.items.iter().find(|item| item.message_id == id);
            if let Some(title) = shown.and_then(|item| item.content.as_ref()).map(|c| &c.title)
                && !title.ends_with(&format!(" {user}"))
            {
                bail!("send {id}: user {user} reads {title:?}, not rendered with their id");
            }
            sampled += 1;
        }
    }
    Ok(checked)
}

async fn group_seqs(ctx: &notify_core::Context, groups: &[u64]) -> anyhow::Result<u64> {
    let mut messages = 0;
    for group_id in groups {
        let home = ctx.pools.for_group(*group_id).value();
        let max_seq: u64 = sqlx::query_scalar("SELECT max_seq FROM group_seqs WHERE group_id = ?")
            .bind(group_id)
            .fetch_optional(home)
            .await?
            .unwrap_or(0);
        let (count, low, high): (i64, Option<u64>, Option<u64>) = sqlx::query_as(
            "SELECT COUNT(*), MIN(seq), MAX(seq) FROM group_messages WHERE group_id = ?",
        )
        .bind(group_id)
        .fetch_one(home)
        .await?;
        // The primary key (group_id, seq) rules out repeats; a count equal
        // to max_seq with seqs from 1 to max_seq rules out gaps.
        if count as u64 != max_seq || (max_seq > 0 && (low != Some(1) || high != Some(max_seq))) {
            bail!("group {group_id}: {count} messages, seqs {low:?}..={high:?}, max_seq {max_seq}");
        }
        messages += max_seq;
    }
    Ok(messages)
}

/// About `sample` of the touched users, spread over them.
fn sampled_users(shared: &Shared, sample: usize) -> Vec<u64> {
    let ledger = ledger(shared);
    let step = (ledger.touched.len() / sample.max(1)).max(1);
    ledger.touched.iter().step_by(step).copied().collect()
}

async fn badges(
    ctx: &notify_core::Context,
    shared: &Shared,
    inbox: &mut InboxServiceClient<Channel>,
    sample: usize,
) -> anyhow::Result<u64> {
    let users = sampled_users(shared, sample);
    let live = notify_core::announce::active(ctx).await.map_err(|e| anyhow!("{e}"))?;
    let live_ids: Vec<u64> = live.iter().map(|a| a.message_id).collect();
    let mut checked = 0;
    for user in users {
        let pool = ctx.pools.for_user(user).value();
        let state = notify_store::db::items::badge_state(pool, user, &live_ids)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let pending = live
            .iter()
            .filter(|a| !state.present.contains(&a.message_id))
            .filter(|a| !state.suppression.holds_back(a.message_id, &a.category, a.critical))
            .count() as u64;
        // The items' counts by the bench's own query, not the badge's.
        let (items_unread, items_unseen): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), CAST(COALESCE(SUM(i.is_seen = 0), 0) AS SIGNED) \
             FROM message_items i JOIN message_contents c ON c.message_id = i.message_id \
             WHERE i.user_id = ? AND i.is_read = 0 AND i.is_archived = 0 \
             AND i.is_deleted = 0 AND c.revoked = 0 \
             AND (i.expire_at IS NULL OR i.expire_at > UTC_TIMESTAMP(3))",
        )
        .bind(user)
        .fetch_one(pool)
        .await?;
        let (items_unread, items_unseen) = (items_unread as u64, items_unseen as u64);
        if (state.truth.unread, state.truth.unseen) != (items_unread, items_unseen) {
            bail!(
                "user {user}: the badge's count of items {}/{} (unread/unseen), the bench's \
                 {items_unread}/{items_unseen}",
                state.truth.unread,
                state.truth.unseen
            );
        }
        let (unread, unseen) = (items_unread + pending, items_unseen + pending);
        let mut group_unread = 0;
        let memberships =
            notify_store::db::groups::memberships(pool, user).await.map_err(|e| anyhow!("{e}"))?;
        for membership in memberships.iter().filter(|m| !m.muted) {
            let home = ctx.pools.for_group(membership.group_id).value();
            let max_seq: u64 =
                sqlx::query_scalar("SELECT max_seq FROM group_seqs WHERE group_id = ?")
                    .bind(membership.group_id)
                    .fetch_optional(home)
                    .await?
                    .unwrap_or(0);
            group_unread += max_seq.saturating_sub(membership.last_ack_seq);
        }
        let served = inbox.get_unread_count(v1::GetUnreadCountRequest { user_id: user }).await?;
        let served = served.into_inner();
        if (served.unread, served.unseen, served.group_unread) != (unread, unseen, group_unread) {
            bail!(
                "user {user}: served {}/{}/{} (unread/unseen/group), MySQL \
                 {unread}/{unseen}/{group_unread}",
                served.unread,
                served.unseen,
                served.group_unread
            );
        }
        checked += 1;
    }
    Ok(checked)
}

/// Each sampled user's first inbox page as served (from the page cache
/// where the load left it cached, through every fault) against the same
/// page read from MySQL after it: the same items, read states and next-page
/// token. (The served read comes first: it materializes announcements.)
async fn first_pages(
    ctx: &notify_core::Context,
    shared: &Shared,
    inbox: &mut InboxServiceClient<Channel>,
    sample: usize,
) -> anyhow::Result<u64> {
    let mut checked = 0;
    for user in sampled_users(shared, sample) {
        let request = v1::ListInboxRequest { user_id: user, page_size: 20, ..Default::default() };
        let served = inbox.list_inbox(request).await?.into_inner();
        let served_items: Vec<(u64, bool, bool, bool)> = served
            .items
            .iter()
            .map(|item| (item.message_id, item.read, item.seen, item.archived))
            .collect();
        let query = notify_store::db::items::InboxQuery {
            before: u64::MAX,
            limit: 21,
            filter: Default::default(),
        };
        let pool = ctx.pools.for_user(user).value();
        let rows =
            notify_store::db::items::list(pool, user, &query).await.map_err(|e| anyhow!("{e}"))?;
        let truth: Vec<(u64, bool, bool, bool)> = rows
            .iter()
            .take(20)
            .map(|row| (row.message_id, row.is_read, row.is_seen, row.is_archived))
            .collect();
        if served_items != truth || served.next_page_token.is_empty() == (rows.len() > 20) {
            bail!(
                "user {user}: served {served_items:?} (next page: {}), MySQL {truth:?} ({} rows)",
                !served.next_page_token.is_empty(),
                rows.len()
            );
        }
        checked += 1;
    }
    Ok(checked)
}

/// Once every read waiting to be counted is (within `limit`): each send's
/// read count (its stats over every shard) and its readers (`message_reads`)
/// equal its items read, for every send with either. Returns the sends.
async fn read_counts(ctx: &notify_core::Context, limit: Duration) -> anyhow::Result<u64> {
    let deadline = Instant::now() + limit;
    loop {
        let mut waiting = 0;
        for (_, pool) in ctx.pools.iter() {
            waiting += notify_store::db::read_backlog::count(pool).await?;
        }
        if waiting == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{waiting} read backlog rows still waiting after {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // message id -> (items read, read count, readers)
    let mut sends: BTreeMap<u64, (i64, i64, i64)> = BTreeMap::new();
    for (_, pool) in ctx.pools.iter() {
        let tallies = [
            // A recall takes its items' reads out of the counts.
            "SELECT message_id, COUNT(*) FROM message_items WHERE is_read = 1 AND recalled = 0 \
             GROUP BY message_id",
            "SELECT message_id, CAST(SUM(read_count) AS SIGNED) FROM message_shard_stats \
             GROUP BY message_id",
            "SELECT message_id, COUNT(*) FROM message_reads GROUP BY message_id",
        ];
        for (column, tally) in tallies.into_iter().enumerate() {
            let rows: Vec<(u64, i64)> = sqlx::query_as(tally).fetch_all(pool).await?;
            for (id, n) in rows {
                let entry = sends.entry(id).or_default();
                match column {
                    0 => entry.0 += n,
                    1 => entry.1 += n,
                    _ => entry.2 += n,
                }
            }
        }
        let stray: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM message_reads r LEFT JOIN message_items i \
             ON i.user_id = r.user_id AND i.message_id = r.message_id AND i.is_read = 1 \
             AND i.recalled = 0 WHERE i.user_id IS NULL OR r.delivered_at <> i.created_at",
        )
        .fetch_one(pool)
        .await?;
        if stray > 0 {
            bail!(
                "{stray} readers recorded for items that are not read, or delivered at another time"
            );
        }
    }
    for (id, (read, count, readers)) in &sends {
        if (read, read) != (count, readers) {
            bail!("send {id}: {read} items read, read count {count}, {readers} readers");
        }
    }
    Ok(sends.len() as u64)
}

/// The `item.read` endpoint of the soak: an HTTP server on 127.0.0.1 that
/// answers 200 and keeps every `(message, reader)` it was told of.
struct ReadHooks {
    url: String,
    heard: Arc<Mutex<Heard>>,
}

#[derive(Default)]
struct Heard {
    calls: u64,
    reads: std::collections::HashSet<(u64, u64)>,
}

impl ReadHooks {
    async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hooks", listener.local_addr()?);
        let heard: Arc<Mutex<Heard>> = Arc::default();
        let app = axum::Router::new()
            .route("/hooks", axum::routing::post(Self::receive))
            .with_state(heard.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { url, heard })
    }

    async fn receive(
        axum::extract::State(heard): axum::extract::State<Arc<Mutex<Heard>>>,
        body: String,
    ) -> http::StatusCode {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&body) else {
            return http::StatusCode::BAD_REQUEST;
        };
        let id = |value: &serde_json::Value| value.as_str().and_then(|id| id.parse::<u64>().ok());
        let data = &event["data"];
        let (Some(message_id), Some(users)) =
            (id(&data["message_id"]), data["user_ids"].as_array())
        else {
            return http::StatusCode::BAD_REQUEST;
        };
        let mut heard = heard.lock().unwrap_or_else(|e| e.into_inner());
        heard.calls += 1;
        heard.reads.extend(users.iter().filter_map(id).map(|user| (message_id, user)));
        http::StatusCode::OK
    }

    /// The client every call runs as (auth is off), with this endpoint.
    fn client(&self) -> ClientSettings {
        ClientSettings {
            name: "local".to_owned(),
            // Never presented: auth is off. Configured clients need one.
            token_sha256: vec!["0".repeat(64)],
            cert_names: Vec::new(),
            scopes: Vec::new(),
            senders: Vec::new(),
            requests_per_second: 0,
            burst: 0,
            recipients_per_minute: 0,
            announcements_per_hour: 0,
            webhooks: vec![WebhookEndpoint {
                url: self.url.clone(),
                secret: "whsec_Y2hhb3Mtc29hay1pdGVtLXJlYWQtc2VjcmV0".to_owned().into(),
                secret_file: String::new(),
                events: vec!["item.read".to_owned()],
            }],
        }
    }

    /// Calls received, and distinct pairs reported.
    fn tally(&self) -> (u64, u64) {
        let heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        (heard.calls, heard.reads.len() as u64)
    }
}

/// Waits until no read waits to be counted or queued and every reader row
/// (`message_reads`, on every shard) was reported; fails after `limit`
/// naming what is missing.
async fn reads_reported(
    ctx: &notify_core::Context,
    hooks: &ReadHooks,
    limit: Duration,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + limit;
    loop {
        let mut waiting = 0;
        let mut readers = Vec::new();
        for (_, pool) in ctx.pools.iter() {
            waiting += notify_store::db::read_backlog::count(pool).await?;
            waiting += notify_store::db::read_feed::count(pool).await?;
            let rows: Vec<(u64, u64)> =
                sqlx::query_as("SELECT message_id, user_id FROM message_reads")
                    .fetch_all(pool)
                    .await?;
            readers.extend(rows);
        }
        let missing = {
            let heard = hooks.heard.lock().unwrap_or_else(|e| e.into_inner());
            readers.iter().filter(|pair| !heard.reads.contains(pair)).count()
        };
        if waiting == 0 && missing == 0 {
            return Ok(readers.len() as u64);
        }
        if Instant::now() > deadline {
            bail!(
                "{missing} of {} readers never reported, {waiting} reads still waiting, after {} s",
                readers.len(),
                limit.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn leftover_chunks(ctx: &notify_core::Context, shared: &Shared) -> anyhow::Result<u64> {
    let mut open = BTreeSet::new();
    for (_, pool) in ctx.pools.iter() {
        let ids: Vec<u64> = sqlx::query_scalar(
            "SELECT DISTINCT message_id FROM message_chunks WHERE state IN (0, 4)",
        )
        .fetch_all(pool)
        .await?;
        open.extend(ids);
    }
    let sends: Vec<u64> = ledger(shared).sends.keys().copied().collect();
    let mut checked = 0;
    for id in sends {
        let status = status_of(ctx, id).await?;
        let finished = status
            .is_some_and(|s| s == SendStatus::Completed as u8 || s == SendStatus::Cancelled as u8);
        if finished {
            if open.contains(&id) {
                bail!("send {id} is finished ({status:?}) with a pending or unsettled chunk");
            }
            checked += 1;
        }
    }
    Ok(checked)
}
