//! `notify-bench fanout`: one send to N recipients through the real api and
//! worker, against a raw multi-row INSERT of the same rows into the same
//! MariaDB, in the same run. With `--muted-percent`, that share of the
//! recipients mute the send's category ([`mutes`]); with `--personalized`,
//! each recipient carries vars of their own for the content's template
//! ([`personal`]), and `ListInbox` pages of such items are timed against
//! plain ones ([`inbox`]).

mod inbox;
mod mutes;
mod personal;
mod preferences;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use chrono::{NaiveDateTime, Utc};
use futures::StreamExt as _;
use notify_core::send::plan::plan_batch;
use notify_domain::Settings;
use notify_domain::ids::IdGenerator;
use notify_proto::v1;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_testkit::metrics::MetricsPage;
use sqlx::MySqlConnection;
use sqlx::QueryBuilder;
use sqlx::mysql::MySqlPool;

use self::mutes::{ChunkCost, MuteReport, Mutes, Reference};
use self::personal::StoredVars;
use crate::harness::{self, Env, mysql_delta, mysql_status, quiesce, thousands, verdict};
use crate::metrics::histogram_quantile;
use crate::procstat::{CpuUse, RssSampler, Tracked};

/// Arguments of `notify-bench fanout`.
#[derive(Debug, Clone, clap::Args)]
pub struct FanoutArgs {
    /// Recipients: user ids 1..=N.
    #[arg(long, default_value_t = 1_000_000)]
    recipients: u64,
    /// Shard databases (one MariaDB server, one database per shard).
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Concurrent transactions: the baseline's inserters, and the worker's
    /// over all shards (`worker.concurrency`, per lane and shard, is this
    /// divided by the shards, rounded up).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Most chunks of one send applied in one transaction
    /// (`worker.chunks_per_transaction`; 1 applies each alone).
    #[arg(long, default_value_t = 8)]
    chunks_per_transaction: usize,
    /// Recipients per AppendRecipients call (the api allows up to
    /// 100,000, and 4 MiB a request): 100,000 ids by default, 25,000 with
    /// `--personalized` (their vars make a request ~2.7 MB).
    #[arg(long)]
    batch_size: Option<usize>,
    /// `AppendRecipients` calls in flight at once (1 sends each batch after
    /// the last one answered), as `notifyctl send` appends.
    #[arg(long, default_value_t = notify_core::send::APPENDS_IN_FLIGHT)]
    appends_in_flight: usize,
    /// Order of the baseline's statements: `worker` = shard by shard, as
    /// the worker receives its tasks; `interleaved` = round-robin over shards.
    #[arg(long, value_enum, default_value_t = Order::Worker)]
    baseline_order: Order,
    /// When the baseline runs: `both` (before and after the send; the ratio
    /// uses their mean, which cancels slow drift of the machine), `before`,
    /// `after`, or `none`.
    #[arg(long, value_enum, default_value_t = When::Both)]
    baseline: When,
    /// Longest wait for COMPLETED, in seconds.
    #[arg(long, default_value_t = 900)]
    timeout_secs: u64,
    /// Longest wait for InnoDB to flush dirty pages before each timed phase.
    #[arg(long, default_value_t = 60)]
    quiesce_secs: u64,
    /// Share of the recipients (0..=100, spread evenly over the ids) that
    /// mute the send's category before it; the baseline inserts only the
    /// rows delivered.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100))]
    muted_percent: u64,
    /// With --muted-percent: the reference send to the same users in a
    /// category nobody mutes, on fresh databases and services, to compare
    /// the cost per chunk: `same` (the muting users' preference rows are
    /// there too), `none` (no user has preferences) or `skip`.
    #[arg(long, value_enum, default_value_t = RefPrefs::Same)]
    reference: RefPrefs,
    /// A personalized send: the content is a template with `zh-Hant` and
    /// `de` translations, each recipient carries ~100 bytes of vars, a
    /// third read `zh-Hant-TW`, a third `de`; the baseline's rows carry
    /// the same vars. Then `ListInbox` pages of personalized items against
    /// plain ones.
    #[arg(long)]
    personalized: bool,
    /// With --personalized: readers of personalized pages, and as many of
    /// plain pages (users above the send's).
    #[arg(long, default_value_t = 200)]
    inbox_readers: u64,
    /// With --personalized: timed `ListInbox` calls of each kind.
    #[arg(long, default_value_t = 5_000)]
    inbox_calls: u64,
}

impl FanoutArgs {
    /// Recipients per `AppendRecipients` call.
    fn batch_size(&self) -> usize {
        self.batch_size.unwrap_or(if self.personalized { 25_000 } else { 100_000 })
    }

    /// The ratio the send must reach against the baseline.
    fn target(&self) -> f64 {
        if self.personalized { 0.85 } else { 0.9 }
    }
}

/// The preferences the reference send of `--muted-percent` runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RefPrefs {
    Same,
    None,
    Skip,
}

/// When the baseline runs, relative to the send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum When {
    Both,
    Before,
    After,
    None,
}

/// Statement order of the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Order {
    Worker,
    Interleaved,
}

/// Rows per chunk / statement, as `send.chunk_size`.
const CHUNK: usize = 500;
const CATEGORY: &str = "bench";
/// The reference send's category, which nobody mutes.
const OPEN_CATEGORY: &str = "bench_open";

struct Phase {
    secs: f64,
    cpu: CpuUse,
    mysql: String,
}

struct Baseline {
    label: &'static str,
    phase: Phase,
    rows: u64,
    /// With --personalized: the vars its rows hold.
    vars: Option<StoredVars>,
}

struct NotifyRun {
    message_id: u64,
    total: Phase,
    create_secs: f64,
    append: Phase,
    batch_secs: Vec<f64>,
    start: Phase,
    delivery: Phase,
    first_delivered_secs: Option<f64>,
    final_progress: v1::Progress,
    /// MariaDB statements (`Questions`) during the delivery phase.
    delivery_statements: u64,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: FanoutArgs) -> anyhow::Result<()> {
    ensure!(args.recipients > 0 && args.shards > 0 && args.concurrency > 0, "flags must be > 0");
    ensure!(args.batch_size() > 0, "--batch-size must be > 0");
    ensure!(args.appends_in_flight > 0, "--appends-in-flight must be > 0");
    ensure!(
        !(args.personalized && args.muted_percent > 0),
        "--personalized and --muted-percent do not run together"
    );
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut settings = harness::settings_for(&base, &tag, args.shards);
    settings.worker.concurrency = args.concurrency.div_ceil(args.shards as usize);
    settings.worker.chunks_per_transaction = args.chunks_per_transaction;
    settings.database.pool_max = settings.database.pool_max.max(args.concurrency as u32 + 4);
    let baseline_settings = harness::settings_for(&base, &format!("{tag}b"), args.shards);
    let mut env = Env::new(settings)?;
    println!(
        "notify-bench fanout{}: tag {tag}, {} recipients, {} shards, concurrency {} \
         (baseline inserters; worker.concurrency {} per shard), pool_max {}, loadavg {}",
        if args.personalized { " --personalized" } else { "" },
        thousands(args.recipients),
        args.shards,
        args.concurrency,
        env.settings.worker.concurrency,
        env.settings.database.pool_max,
        crate::procstat::loadavg()
    );
    let outcome = crate::guarded(body(&mut env, &args, &baseline_settings)).await;
    env.finish(outcome).await
}

async fn body(
    env: &mut Env,
    args: &FanoutArgs,
    baseline_settings: &Settings,
) -> anyhow::Result<String> {
    env.start_services().await?;
    let (tracked, rss) = track_services(env);
    let mut server = harness::server_connection(&env.settings).await?;
    // Whole seconds: DATETIME(3) stores the same value either way.
    let expire_at = (Utc::now() + chrono::Duration::days(30)).naive_utc();
    let expire_at = expire_at
        - chrono::Duration::nanoseconds(i64::from(expire_at.and_utc().timestamp_subsec_nanos()));
    let users: Vec<u64> = (1..=args.recipients).collect();
    let mutes = Mutes { percent: args.muted_percent };
    let delivered = mutes.delivered(&users);
    let ctx = BaselineCtx { settings: baseline_settings, tracked: &tracked, users: &users, mutes };

    let mut baselines = Vec::new();
    if matches!(args.baseline, When::Both | When::Before) {
        baselines.push(run_baseline(env, args, &ctx, &mut server, expire_at, "before").await?);
    }

    let (muting, seed_secs) = if mutes.percent > 0 {
        let (rows, secs) = mutes::seed_preferences(&env.settings, &users, mutes, CATEGORY).await?;
        println!(
            "preferences: {} users mute {CATEGORY:?} ({}%), written in {secs:.2} s",
            thousands(rows),
            mutes.percent
        );
        (rows, secs)
    } else {
        (0, 0.0)
    };
    if args.personalized {
        let (rows, secs) = personal::seed_locales(&env.settings, &users).await?;
        println!(
            "preferences: {} users read zh-Hant-TW or de, written in {secs:.2} s",
            thousands(rows)
        );
    }
    let (waited, dirty) = quiesce(&mut server, Duration::from_secs(args.quiesce_secs)).await?;
    println!("quiesce before notify: {waited:.1} s, {dirty} dirty pages left");
    let notify = run_notify(env, args, &tracked, &mut server, &users, expire_at, CATEGORY).await?;
    println!(
        "notify: {} recipients ({} delivered) in {:.2} s = {} delivered rows/s",
        thousands(args.recipients),
        thousands(notify.final_progress.delivered),
        notify.total.secs,
        thousands((delivered as f64 / notify.total.secs) as u64)
    );

    // Verification, outside the timed section.
    let items = count_items(&env.settings, notify.message_id).await?;
    let peaks = rss.peaks();
    let worker_metrics = env.scrape("notify-worker").await;
    let api_metrics = env.scrape("notify-api").await;
    drop(rss);
    let personal_report = if args.personalized {
        let sent = personal::stored_vars(&env.settings, notify.message_id, &users).await?;
        let pages = inbox::compare(env, args, &send_content(CATEGORY, true)).await?;
        Some((sent, pages))
    } else {
        None
    };

    let mute_report = if mutes.percent > 0 {
        let reference = if args.reference == RefPrefs::Skip {
            None
        } else {
            Some(run_reference(env, args, &mut server, &users, expire_at, mutes).await?)
        };
        Some(MuteReport {
            mutes,
            muting,
            seed_secs,
            muted_cost: ChunkCost::of(&notify, &worker_metrics),
            reference,
        })
    } else {
        None
    };

    if matches!(args.baseline, When::Both | When::After) {
        // Same clean state as before the send: stop the services and drop
        // the send's databases, so the baseline does not share the buffer
        // pool with the send's million rows.
        env.stop_services().await;
        let settings = env.settings.clone();
        env.drop_databases_of(&settings).await?;
        baselines.push(run_baseline(env, args, &ctx, &mut server, expire_at, "after").await?);
    }

    let mut report = summary(
        args,
        &baselines,
        &notify,
        (items, delivered),
        &peaks,
        &worker_metrics,
        &api_metrics,
        tracked.machine_max(),
    );
    let mut lines =
        mute_report.map_or(String::new(), |m| m.lines(args.recipients, notify.total.secs));
    if let Some((sent, pages)) = personal_report {
        lines += &personal_lines(&users, &sent, &baselines);
        lines += &pages.lines();
    }
    let end = report.rfind("\n=====").unwrap_or(report.len());
    report.insert_str(end + 1, &lines);
    Ok(report)
}

/// The report's lines about a personalized send's vars: what the items of
/// the send and of each baseline hold, against what the recipients carry.
fn personal_lines(users: &[u64], sent: &StoredVars, baselines: &[Baseline]) -> String {
    let expected = personal::vars_bytes(users);
    let held: Vec<String> = baselines
        .iter()
        .filter_map(|b| Some(format!("baseline {} {}", b.label, thousands(b.vars?.bytes))))
        .collect();
    let all = std::iter::once(sent).chain(baselines.iter().filter_map(|b| b.vars.as_ref()));
    let same = all.clone().all(|v| v.bytes == expected && v.wrong == 0);
    let (sampled, wrong) = all.fold((0, 0), |(n, w), v| (n + v.sampled, w + v.wrong));
    format!(
        "personal  vars: {} recipients carry {} bytes (mean {:.1}); message_items.vars hold: send {}, \
         {} | {wrong} of {sampled} sampled rows differ from the recipient's vars -> {}\n",
        thousands(users.len() as u64),
        thousands(expected),
        expected as f64 / users.len().max(1) as f64,
        thousands(sent.bytes),
        held.join(", "),
        verdict(same)
    )
}

/// CPU and RSS tracking of the api and worker running now.
fn track_services(env: &Env) -> (Tracked, RssSampler) {
    let api_pid = env.pid("notify-api");
    let worker_pid = env.pid("notify-worker");
    println!(
        "services up: notify-api pid {api_pid} ({}), notify-worker pid {worker_pid}; logs in {}",
        env.settings.api.listen,
        env.dir.display()
    );
    let tracked = Tracked::new(&[("api", api_pid), ("worker", worker_pid)]);
    (tracked, RssSampler::start(vec![api_pid, worker_pid]))
}

/// `COUNT(*)` of the items of `message_id` over all shards.
async fn count_items(settings: &Settings, message_id: u64) -> anyhow::Result<u64> {
    let pools = harness::shard_pools(settings, 2).await?;
    let mut items = 0u64;
    for pool in &pools {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM message_items WHERE message_id = ?")
            .bind(message_id)
            .fetch_one(pool)
            .await?;
        items += n as u64;
    }
    for pool in pools {
        pool.close().await;
    }
    Ok(items)
}

/// The reference of a mutes run: services stopped, the send's databases
/// dropped and its Redis keys deleted, services started again on fresh ones (so both sends start from
/// the same state and each worker's `/metrics` holds its own send only),
/// the same preference rows written again (`--reference same`), then the
/// same send in a category nobody mutes.
async fn run_reference(
    env: &mut Env,
    args: &FanoutArgs,
    server: &mut MySqlConnection,
    users: &[u64],
    expire_at: NaiveDateTime,
    mutes: Mutes,
) -> anyhow::Result<Reference> {
    env.stop_services().await;
    let settings = env.settings.clone();
    env.drop_databases_of(&settings).await?;
    harness::delete_redis_keys(&settings).await?;
    env.start_services().await?;
    let (tracked, rss) = track_services(env);
    let with_rows = args.reference == RefPrefs::Same;
    if with_rows {
        mutes::seed_preferences(&env.settings, users, mutes, CATEGORY).await?;
    }
    let (waited, dirty) = quiesce(server, Duration::from_secs(args.quiesce_secs)).await?;
    println!("quiesce before the reference send: {waited:.1} s, {dirty} dirty pages left");
    let run = run_notify(env, args, &tracked, server, users, expire_at, OPEN_CATEGORY).await?;
    println!(
        "reference: {} recipients in {:.2} s = {} rows/s",
        thousands(args.recipients),
        run.total.secs,
        thousands((args.recipients as f64 / run.total.secs) as u64)
    );
    let items = count_items(&env.settings, run.message_id).await?;
    let worker = env.scrape("notify-worker").await;
    drop(rss);
    let cost = ChunkCost::of(&run, &worker);
    Ok(Reference { run, items, cost, with_rows })
}

/// What every baseline run shares: its databases' settings, the CPU
/// tracking, the recipients, and who of them mutes (their rows are left
/// out of the api's chunks: the baseline inserts the delivered rows only).
struct BaselineCtx<'a> {
    settings: &'a Settings,
    tracked: &'a Tracked,
    users: &'a [u64],
    mutes: Mutes,
}

async fn run_baseline(
    env: &mut Env,
    args: &FanoutArgs,
    ctx: &BaselineCtx<'_>,
    server: &mut MySqlConnection,
    expire_at: NaiveDateTime,
    label: &'static str,
) -> anyhow::Result<Baseline> {
    let BaselineCtx { settings, tracked, users, mutes } = *ctx;
    env.migrate(settings, "baseline.toml").await?;
    let pools = harness::shard_pools(settings, args.concurrency as u32).await?;
    harness::warm_pools(&pools, args.concurrency).await?;
    let map = settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;

    // The same chunks the api plans (same shard function, same 500-row cut
    // per appended batch), in the order the worker receives them; with
    // mutes, each statement without the rows of the recipients who mute.
    let mut per_shard: Vec<Vec<Vec<u64>>> = vec![Vec::new(); settings.database.shards.len()];
    for (index, batch) in users.chunks(args.batch_size()).enumerate() {
        for (shard, chunks) in plan_batch(&map, index as u64 + 1, batch, None, CHUNK)? {
            let slot = map.slot_of(shard).context("shard slot")?;
            let delivered = chunks.into_iter().map(|chunk| {
                chunk.user_ids.into_iter().filter(|u| !mutes.mutes(*u)).collect::<Vec<_>>()
            });
            per_shard[slot].extend(delivered.filter(|ids| !ids.is_empty()));
        }
    }
    let work: Vec<(usize, Vec<u64>)> = match args.baseline_order {
        Order::Worker => per_shard
            .into_iter()
            .enumerate()
            .flat_map(|(slot, chunks)| chunks.into_iter().map(move |c| (slot, c)))
            .collect(),
        Order::Interleaved => {
            let longest = per_shard.iter().map(Vec::len).max().unwrap_or(0);
            let mut iters: Vec<_> = per_shard.into_iter().map(Vec::into_iter).collect();
            let mut work = Vec::new();
            for _ in 0..longest {
                for (slot, iter) in iters.iter_mut().enumerate() {
                    if let Some(chunk) = iter.next() {
                        work.push((slot, chunk));
                    }
                }
            }
            work
        }
    };
    // With --personalized, each row's vars as the api stores them, made
    // before the timed section (as the send's requests are).
    let work: Vec<Statement> = work
        .into_iter()
        .map(|(slot, user_ids)| Statement {
            slot,
            vars: args
                .personalized
                .then(|| user_ids.iter().map(|u| personal::vars_json(*u)).collect()),
            user_ids,
        })
        .collect();
    let message_id = IdGenerator::with_instance(rand::random()).next_id()?.get();

    let (waited, dirty) = quiesce(server, Duration::from_secs(args.quiesce_secs)).await?;
    println!("quiesce before baseline ({label}): {waited:.1} s, {dirty} dirty pages left");
    let cpu0 = tracked.snap();
    let my0 = mysql_status(server).await?;
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let inserters = (0..args.concurrency).map(|_| {
        let (work, pools, next) = (&work, &pools, &next);
        async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(statement) = work.get(index) else {
                    return Ok::<_, anyhow::Error>(());
                };
                insert_items(&pools[statement.slot], message_id, statement, expire_at).await?;
            }
        }
    });
    futures::future::try_join_all(inserters).await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = tracked.between(&cpu0, &tracked.snap());
    let mysql = mysql_delta(&my0, &mysql_status(server).await?);

    let mut rows = 0u64;
    for pool in &pools {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM message_items").fetch_one(pool).await?;
        rows += n as u64;
    }
    for pool in pools {
        pool.close().await;
    }
    let expected = mutes.delivered(users);
    ensure!(rows == expected, "baseline wrote {rows} rows, expected {expected}");
    let vars = match args.personalized {
        true => Some(personal::stored_vars(settings, message_id, users).await?),
        false => None,
    };
    env.drop_databases_of(settings).await?;
    println!(
        "baseline ({label}): {} rows in {secs:.2} s = {} rows/s ({} statements of <= {CHUNK} rows, {} inserters)",
        thousands(rows),
        thousands((rows as f64 / secs) as u64),
        work.len(),
        args.concurrency
    );
    Ok(Baseline { label, phase: Phase { secs, cpu, mysql }, rows, vars })
}

/// One statement of the baseline: a chunk's rows on the shard at `slot`.
struct Statement {
    slot: usize,
    user_ids: Vec<u64>,
    /// With --personalized: each row's vars, aligned with `user_ids`.
    vars: Option<Vec<String>>,
}

async fn insert_items(
    pool: &MySqlPool,
    message_id: u64,
    statement: &Statement,
    expire_at: NaiveDateTime,
) -> anyhow::Result<()> {
    let columns = match statement.vars {
        None => "user_id, message_id, category, expire_at",
        Some(_) => "user_id, message_id, category, expire_at, vars",
    };
    let mut insert = QueryBuilder::new(format!("INSERT INTO message_items ({columns}) "));
    insert.push_values(statement.user_ids.iter().enumerate(), |mut row, (index, user_id)| {
        row.push_bind(*user_id)
            .push_bind(message_id)
            .push_bind(CATEGORY)
            .push_bind(Some(expire_at));
        if let Some(vars) = &statement.vars {
            row.push_bind(vars[index].as_str());
        }
    });
    insert.build().execute(pool).await?;
    Ok(())
}

/// The send's content in `category`; personalized ([`personal`]) or plain.
fn send_content(category: &str, personalized: bool) -> v1::Content {
    let mut content = v1::Content {
        title: "Benchmark fan-out".into(),
        body: "One message to a million users, end to end through notify-api and notify-worker."
            .into(),
        category: category.into(),
        data: [("source".to_owned(), "notify-bench".to_owned())].into(),
        ..Default::default()
    };
    if personalized {
        personal::personalize(&mut content);
    }
    content
}

#[allow(clippy::too_many_arguments)]
async fn run_notify(
    env: &mut Env,
    args: &FanoutArgs,
    tracked: &Tracked,
    server: &mut MySqlConnection,
    users: &[u64],
    expire_at: NaiveDateTime,
    category: &str,
) -> anyhow::Result<NotifyRun> {
    let channel = env.channel().await?;
    let mut client = MessageServiceClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    // Every request made before the timed section; its message id is set
    // once CreateMessage answered.
    let batches: Vec<v1::AppendRecipientsRequest> = users
        .chunks(args.batch_size())
        .enumerate()
        .map(|(index, ids)| {
            let mut request = v1::AppendRecipientsRequest {
                batch_number: index as u64 + 1,
                ..Default::default()
            };
            match args.personalized {
                true => request.recipients = personal::recipients(ids),
                false => request.user_ids = ids.to_vec(),
            }
            request
        })
        .collect();
    let content = send_content(category, args.personalized);
    let expire = prost_types::Timestamp { seconds: expire_at.and_utc().timestamp(), nanos: 0 };

    let cpu0 = tracked.snap();
    let my0 = mysql_status(server).await?;
    let t0 = Instant::now();
    // ---- timed: first RPC ... COMPLETED ----
    let created = client
        .create_message(v1::CreateMessageRequest {
            sender: "notify-bench".into(),
            idempotency_key: String::new(),
            content: Some(content),
            send_at: None,
            expire_at: Some(expire),
            priority: v1::Priority::Normal as i32,
            critical: false,
        })
        .await
        .context("CreateMessage")?
        .into_inner();
    let message_id = created.message_id;
    let create_secs = t0.elapsed().as_secs_f64();
    // The batches go as a client with many recipients sends them: up to
    // --appends-in-flight at once, each as soon as a slot is free.
    let mut batch_secs = vec![0.0; batches.len()];
    let mut appends =
        futures::stream::iter(batches.into_iter().enumerate().map(|(index, mut request)| {
            let mut client = client.clone();
            async move {
                let sent = (request.user_ids.len() + request.recipients.len()) as u64;
                request.message_id = message_id;
                let t = Instant::now();
                let reply = client
                    .append_recipients(request)
                    .await
                    .with_context(|| format!("AppendRecipients batch {}", index + 1))?
                    .into_inner();
                ensure!(
                    reply.accepted == sent,
                    "batch {} accepted {} of {sent}",
                    index + 1,
                    reply.accepted
                );
                anyhow::Ok((index, t.elapsed().as_secs_f64()))
            }
        }))
        .buffer_unordered(args.appends_in_flight);
    while let Some(appended) = appends.next().await {
        let (index, secs) = appended?;
        batch_secs[index] = secs;
    }
    drop(appends);
    let t_appended = t0.elapsed().as_secs_f64();
    let cpu1 = tracked.snap();
    let my1 = mysql_status(server).await?;
    client.start_message(v1::StartMessageRequest { message_id }).await.context("StartMessage")?;
    let t_started = t0.elapsed().as_secs_f64();
    let cpu2 = tracked.snap();
    let my2 = mysql_status(server).await?;
    let mut stream = client
        .watch_message(v1::WatchMessageRequest { message_id, interval_ms: 100 })
        .await
        .context("WatchMessage")?
        .into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut first_delivered_secs = None;
    let mut last_print = t_started;
    let final_progress = loop {
        let message = match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => bail!("send not COMPLETED within {} s", args.timeout_secs),
            Ok(Err(status)) => bail!("WatchMessage: {status}"),
            Ok(Ok(None)) => bail!("WatchMessage ended before COMPLETED"),
            Ok(Ok(Some(message))) => message,
        };
        let now = t0.elapsed().as_secs_f64();
        let progress = message.progress.unwrap_or_default();
        if first_delivered_secs.is_none() && progress.delivered > 0 {
            first_delivered_secs = Some(now - t_started);
        }
        let status = message.status;
        if status == v1::MessageStatus::Completed as i32 {
            break progress;
        }
        if status == v1::MessageStatus::Cancelled as i32
            || status == v1::MessageStatus::Paused as i32
        {
            bail!("send went to status {status} before COMPLETED: {progress:?}");
        }
        if now - last_print >= 10.0 {
            last_print = now;
            env.check_children()?;
            let rss_mb = |name| crate::procstat::rss_kb(env.pid(name)).unwrap_or(0) as f64 / 1024.0;
            println!(
                "  +{now:5.1} s  delivered {:>9}  pending chunks {:>5}  failed {}  \
                 RSS api {:.1} MB worker {:.1} MB",
                thousands(progress.delivered),
                progress.pending_chunks,
                progress.failed,
                rss_mb("notify-api"),
                rss_mb("notify-worker")
            );
        }
    };
    let t_done = t0.elapsed().as_secs_f64();
    // ---- end of timed section ----
    let cpu3 = tracked.snap();
    let my3 = mysql_status(server).await?;
    drop(stream);

    Ok(NotifyRun {
        message_id,
        total: Phase {
            secs: t_done,
            cpu: tracked.between(&cpu0, &cpu3),
            mysql: mysql_delta(&my0, &my3),
        },
        create_secs,
        append: Phase {
            secs: t_appended,
            cpu: tracked.between(&cpu0, &cpu1),
            mysql: mysql_delta(&my0, &my1),
        },
        batch_secs,
        start: Phase {
            secs: t_started - t_appended,
            cpu: tracked.between(&cpu1, &cpu2),
            mysql: mysql_delta(&my1, &my2),
        },
        delivery: Phase {
            secs: t_done - t_started,
            cpu: tracked.between(&cpu2, &cpu3),
            mysql: mysql_delta(&my2, &my3),
        },
        first_delivered_secs,
        final_progress,
        delivery_statements: my3
            .get("Questions")
            .copied()
            .unwrap_or(0)
            .saturating_sub(my2.get("Questions").copied().unwrap_or(0)),
    })
}

#[allow(clippy::too_many_arguments)]
fn summary(
    args: &FanoutArgs,
    baselines: &[Baseline],
    notify: &NotifyRun,
    (items, delivered): (u64, u64),
    peaks: &[(u64, u64)],
    worker_metrics: &MetricsPage,
    api_metrics: &MetricsPage,
    machine_max: usize,
) -> String {
    let n = args.recipients;
    // Rows written: the recipients who do not mute the send's category.
    let rate = |secs: f64| delivered as f64 / secs;
    let mut s = String::new();
    let _ = writeln!(s, "\n================ notify-bench fanout: summary ================");
    let _ = writeln!(
        s,
        "recipients {} over {} shards | concurrency {} (worker bulk lane = baseline inserters) | \
         chunk {CHUNK} | {}% mute the category: {} rows delivered",
        thousands(n),
        args.shards,
        args.concurrency,
        args.muted_percent,
        thousands(delivered)
    );
    let notify_rate = rate(notify.total.secs);
    if !baselines.is_empty() {
        let order = match args.baseline_order {
            Order::Worker => "worker",
            Order::Interleaved => "interleaved",
        };
        let rates: Vec<f64> = baselines.iter().map(|b| b.rows as f64 / b.phase.secs).collect();
        for (b, r) in baselines.iter().zip(&rates) {
            let _ = writeln!(
                s,
                "baseline  raw INSERT, {:<6} the send ({order} order)            {:>7.2} s  {:>9} rows/s",
                b.label,
                b.phase.secs,
                thousands(*r as u64)
            );
        }
        let base_rate = rates.iter().sum::<f64>() / rates.len() as f64;
        let ratio = notify_rate / base_rate;
        let _ = writeln!(
            s,
            "notify    end to end (CreateMessage -> COMPLETED)          {:>7.2} s  {:>9} rows/s",
            notify.total.secs,
            thousands(notify_rate as u64)
        );
        let per: Vec<String> = baselines
            .iter()
            .zip(&rates)
            .map(|(b, r)| format!("vs {} {:.2}", b.label, notify_rate / r))
            .collect();
        let _ = writeln!(
            s,
            "ratio     notify/baseline = {ratio:.2} (mean of {} baseline run(s): {})  target >= {}: {}, goal 1.0: {}",
            rates.len(),
            per.join(", "),
            args.target(),
            verdict(ratio >= args.target()),
            verdict(ratio >= 1.0)
        );
        let _ = writeln!(
            s,
            "          delivery phase alone / baseline = {:.2}",
            rate(notify.delivery.secs) / base_rate
        );
    } else {
        let _ = writeln!(
            s,
            "notify    end to end (CreateMessage -> COMPLETED)  {:.2} s  {} rows/s (no baseline)",
            notify.total.secs,
            thousands(notify_rate as u64)
        );
    }
    let mb = |kb: u64| kb as f64 / 1024.0;
    let (api, worker) =
        (peaks.first().copied().unwrap_or_default(), peaks.get(1).copied().unwrap_or_default());
    let _ = writeln!(
        s,
        "memory    peak RSS (VmHWM): api {:.1} MB, worker {:.1} MB  (target < 64 MB: {}; \
         max sampled VmRSS api {:.1} MB, worker {:.1} MB)",
        mb(api.1),
        mb(worker.1),
        verdict(api.1.max(worker.1) < 64 * 1024),
        mb(api.0),
        mb(worker.0)
    );
    let batches = &notify.batch_secs;
    let (min, max) =
        batches.iter().fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    let _ = writeln!(
        s,
        "breakdown create {:.3} s | append {} x AppendRecipients {:.2} s (per batch {:.2}..{:.2} s) \
         | start+publish {:.2} s | delivery {:.2} s ({} rows/s; first item after {})",
        notify.create_secs,
        batches.len(),
        notify.append.secs - notify.create_secs,
        min,
        max,
        notify.start.secs,
        notify.delivery.secs,
        thousands(rate(notify.delivery.secs) as u64),
        notify.first_delivered_secs.map_or("?".into(), |t| format!("{:.2} s", t)),
    );
    let p = &notify.final_progress;
    let _ = writeln!(
        s,
        "verify    progress total {} delivered {} suppressed {} failed {} pending {} | COUNT(*) \
         message_items {} -> {}",
        p.total,
        p.delivered,
        p.suppressed,
        p.failed,
        p.pending,
        items,
        verdict(p.delivered == delivered && items == delivered && p.suppressed == n - delivered)
    );
    let chunks_of = |outcome| worker_metrics.sum("notify_chunks_total", &[("outcome", outcome)]);
    let delivered_chunks = chunks_of("delivered");
    let already = chunks_of("already_done");
    let skipped = chunks_of("skipped");
    let republished = worker_metrics.sum("notify_chunks_republished_total", &[]);
    let q = |quantile: f64| {
        histogram_quantile(
            worker_metrics,
            "notify_chunk_apply_seconds",
            &[("lane", "bulk")],
            quantile,
        )
        .map_or("?".into(), |v| format!("{:.1} ms", v * 1000.0))
    };
    let chunks = delivered_chunks + already + skipped;
    let per_chunk = notify.delivery_statements as f64 / chunks.max(1.0);
    let groups = worker_metrics.sum("notify_chunk_group_size_count", &[]);
    let grouped = worker_metrics.sum("notify_chunk_group_size_sum", &[]);
    let _ = writeln!(
        s,
        "stmts     {} MariaDB statements during delivery for {chunks} chunks = {per_chunk:.2} per chunk \
         (target <= 3: {}) | {} chunks in {} groups (mean {:.1} a transaction), {} alone",
        notify.delivery_statements,
        verdict(per_chunk <= 3.0),
        grouped,
        groups,
        grouped / groups.max(1.0),
        chunks - grouped,
    );
    let _ = writeln!(
        s,
        "worker    chunks delivered {delivered_chunks} already_done {already} skipped {skipped} \
         republished-by-sweeper {republished} | chunk apply p50 {} p99 {} (from buckets)",
        q(0.5),
        q(0.99),
    );
    let append_q = |quantile: f64| {
        histogram_quantile(
            api_metrics,
            "notify_grpc_request_duration_seconds",
            &[("method", "/notify.v1.MessageService/AppendRecipients")],
            quantile,
        )
        .map_or("?".into(), |v| format!("{:.3} s", v))
    };
    let _ = writeln!(
        s,
        "api       AppendRecipients server time p50 {} p99 {} (from buckets)",
        append_q(0.5),
        append_q(0.99)
    );
    let _ = writeln!(s, "cpu (% of one core, machine max {machine_max}%):");
    for b in baselines {
        let _ = writeln!(
            s,
            "  {:<15} {}",
            format!("baseline {}", b.label),
            b.phase.cpu.line(machine_max)
        );
    }
    let _ = writeln!(s, "  {:<15} {}", "append", notify.append.cpu.line(machine_max));
    let _ = writeln!(s, "  {:<15} {}", "start", notify.start.cpu.line(machine_max));
    let _ = writeln!(s, "  {:<15} {}", "delivery", notify.delivery.cpu.line(machine_max));
    let _ = writeln!(s, "  {:<15} {}", "total", notify.total.cpu.line(machine_max));
    let _ = writeln!(s, "mariadb:");
    for b in baselines {
        let _ = writeln!(s, "  {:<15} {}", format!("baseline {}", b.label), b.phase.mysql);
    }
    let _ = writeln!(s, "  {:<15} {}", "append", notify.append.mysql);
    let _ = writeln!(s, "  {:<15} {}", "start", notify.start.mysql);
    let _ = writeln!(s, "  {:<15} {}", "delivery", notify.delivery.mysql);
    let _ = writeln!(s, "  {:<15} {}", "total", notify.total.mysql);
    let _ = write!(s, "==============================================================");
    s
}
