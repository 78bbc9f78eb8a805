//! `notify-bench items`: `UpdateItems` with `all` over one user's inbox of
//! 10,000 items (each item from a send of its own), timed call by call, with
//! the round trips each call makes to each shard (counted by a proxy in
//! front of each shard, [`counting`]: every command in the call's window,
//! and apart those in it on the connections that carried the updates'
//! scripts; those connections' commands between the calls, the keepalive's
//! pings, are reported beside). After each read and unread, it
//! waits (untimed) until the sends' read counts followed (the backlog of
//! `notify_store::db::read_backlog` is empty) and reports that time and
//! its round trips apart: the next call starts on a quiet shard.

mod counting;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use chrono::Utc;
use hdrhistogram::Histogram;
use notify_domain::Settings;
use notify_domain::ids::IdGenerator;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use secrecy::{ExposeSecret, SecretString};
use sqlx::QueryBuilder;
use sqlx::mysql::MySqlPool;
use tonic::transport::Channel;

use self::counting::CountingProxy;
use crate::harness::{self, Env, quiesce, thousands, verdict};
use crate::procstat::{CpuUse, Tracked};

/// Arguments of `notify-bench items`.
#[derive(Debug, Clone, clap::Args)]
pub struct ItemsArgs {
    /// Items of the user (each from a send of its own).
    #[arg(long, default_value_t = 10_000)]
    items: u64,
    /// Timed calls per pair of actions (read/unread, archive/unarchive),
    /// alternating so that each call changes every item.
    #[arg(long, default_value_t = 20)]
    calls: u32,
    /// Shard databases (the user's items are on one of them).
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// The user whose inbox is updated.
    #[arg(long, default_value_t = 42)]
    user: u64,
    /// Reads by ids (of 10 items, then unread again) per arm of the read
    /// feed's A/B: without and with `item.read`, taking turns.
    #[arg(long, default_value_t = 200)]
    feed_rounds: u32,
}

/// Most milliseconds a call may take (issue 33).
const TARGET_MS: f64 = 50.0;
/// Categories the sends spread over.
const CATEGORIES: [&str; 4] = ["billing", "social", "security", "news"];

/// Runs the benchmark and prints its report.
pub async fn run(args: ItemsArgs) -> anyhow::Result<()> {
    ensure!(args.items > 0 && args.calls > 0 && args.shards > 0, "flags must be > 0");
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut settings = harness::settings_for(&base, &tag, args.shards);
    // The services reach each shard through a proxy of its own that counts
    // their round trips; the bench's own connections go direct.
    let server_url = settings.database.url.expose_secret().to_owned();
    let upstream = counting::upstream_of(&server_url);
    let mut proxies = Vec::new();
    for shard in &mut settings.database.shards {
        let proxy = CountingProxy::start(upstream.clone()).await?;
        shard.url = Some(SecretString::from(counting::url_via(&server_url, proxy.addr())));
        proxies.push(proxy);
    }
    let mut env = Env::new(settings)?;
    println!(
        "notify-bench items: tag {tag}, user {} with {} items, {} calls per action pair, loadavg {}",
        args.user,
        thousands(args.items),
        args.calls,
        crate::procstat::loadavg()
    );
    println!("{}", crate::procstat::memory_line().await);
    let outcome = crate::guarded(body(&mut env, &args, &proxies)).await;
    env.finish(outcome).await
}

/// One action's calls.
struct Timed {
    action: v1::ItemAction,
    /// The actions that took turns with it (their statements are counted
    /// together).
    group: String,
    hist: Histogram<u64>,
    /// Round trips per call to each shard, net of the services' own
    /// background rate (over an idle window as long as the run, after it).
    per_call: Vec<f64>,
    /// Commands per call to each shard on the connections that carried
    /// the updates' scripts, in the calls' windows (the update's own round
    /// trips and its connection's pings, exactly, when nothing else uses
    /// those connections).
    on_updates: Vec<f64>,
    /// Of those, pings per call (all shards): a connection not known open
    /// within the second is pinged before an update.
    pings_on_updates: f64,
    /// Commands on those connections outside the calls' windows, over the
    /// run and the idle window after it (all shards; the direct
    /// connections' keepalive pings), and how many seconds that was.
    between_calls: (u64, f64),
    /// Read and unread: from the answer until the sends' read counts
    /// followed (the user's `read_backlog` empty), and the round trips of
    /// that counting per call on each shard.
    counting: Option<(Histogram<u64>, Vec<f64>)>,
    /// Each call's latency in microseconds, in the order they ran (the
    /// slowest are named by their number), with the pause before it in
    /// milliseconds: since the answer to the call before (or the run's
    /// untimed round), the bench's wait for the read counts included.
    calls: Vec<(u64, u64)>,
    cpu: CpuUse,
}

async fn body(
    env: &mut Env,
    args: &ItemsArgs,
    proxies: &[CountingProxy],
) -> anyhow::Result<String> {
    env.start_services().await?;
    let api_pid = env.pid("notify-api");
    let worker_pid = env.pid("notify-worker");
    let tracked = Tracked::new(&[("api", api_pid), ("worker", worker_pid)]);
    let map = env.settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;
    let shard = map.shard_for_user(args.user);
    let slot = map.slot_of(shard).context("shard slot")?;
    let pool = harness::shard_pool(&env.settings, slot, 4).await?;
    let started = Instant::now();
    seed(&pool, args).await?;
    println!(
        "seeded: {} items of user {} (one send each, {} categories) on shard {} in {:.1} s",
        thousands(args.items),
        args.user,
        CATEGORIES.len(),
        shard.0,
        started.elapsed().as_secs_f64()
    );
    let mut client = InboxServiceClient::new(env.channel().await?);
    let badge = client
        .get_unread_count(v1::GetUnreadCountRequest { user_id: args.user })
        .await
        .context("GetUnreadCount")?
        .into_inner();
    ensure!(
        badge.unread == args.items && badge.unseen == args.items,
        "seeded user has unread {} unseen {}, expected {} of each",
        badge.unread,
        badge.unseen,
        args.items
    );
    let mut server = harness::server_connection(&env.settings).await?;
    let (waited, dirty) = quiesce(&mut server, Duration::from_secs(30)).await?;
    println!("quiesce: {waited:.1} s, {dirty} dirty pages left");
    // Unmeasured: the api's connections, statements and caches warmed
    // (archive and back leave the items unseen, for the timed MARK_SEEN).
    let mut state = ItemState::default();
    for action in [v1::ItemAction::Archive, v1::ItemAction::Unarchive] {
        update_all(&mut client, args, &mut state, action).await?;
    }

    let last_answer = Instant::now();
    let mut run = Run { args, tracked: &tracked, state, proxies, shard: &pool, last_answer };
    let mut timed = Vec::new();
    // Unread items are still unseen: one call marks every item seen.
    timed.append(&mut run.actions(&mut client, &[v1::ItemAction::MarkSeen], 1).await?);
    let pairs = [
        [v1::ItemAction::MarkRead, v1::ItemAction::MarkUnread],
        [v1::ItemAction::Archive, v1::ItemAction::Unarchive],
    ];
    for pair in pairs {
        let mut both = run.actions(&mut client, &pair, args.calls).await?;
        timed.append(&mut both);
    }
    let feed = feed_cost(&pool, args).await?;
    // Last: nothing comes back from a delete.
    timed.append(&mut run.actions(&mut client, &[v1::ItemAction::Delete], 1).await?);
    pool.close().await;
    env.check_children()?;
    let mut report = summary(args, slot, &timed, tracked.machine_max());
    report.push_str(&feed);
    Ok(report)
}

/// What recording reads for `item.read` costs a read by ids: the update of
/// `notify_store::db::item_updates` run straight on the user's shard (the
/// api's part is the same either way, one round trip) over 10 of the
/// user's items, without the feed and with it, taking turns, each read
/// undone by an unread (untimed). The worker drains the feed meanwhile
/// (the items' sends have no owner with an endpoint: dropped).
async fn feed_cost(pool: &MySqlPool, args: &ItemsArgs) -> anyhow::Result<String> {
    use notify_store::db::item_updates::{Action, Target, update};
    let ids: Vec<u64> = sqlx::query_scalar(
        "SELECT message_id FROM message_items WHERE user_id = ? AND is_deleted = 0 \
         ORDER BY message_id DESC LIMIT 10",
    )
    .bind(args.user)
    .fetch_all(pool)
    .await?;
    ensure!(ids.len() == 10, "the user has {} items, 10 needed", ids.len());
    let mut arms = [new_hist(), new_hist()];
    for round in 0..args.feed_rounds * 2 {
        let feed = round % 2 == 1;
        let started = Instant::now();
        let read = update(
            pool,
            None,
            args.user,
            Action::MarkRead,
            Target::Ids(&ids),
            &[],
            feed,
            false,
            None,
        )
        .await?;
        arms[usize::from(feed)].record(started.elapsed().as_micros() as u64)?;
        ensure!(read.changed == 10, "a read by ids changed {} of 10 items", read.changed);
        update(
            pool,
            None,
            args.user,
            Action::MarkUnread,
            Target::Ids(&ids),
            &[],
            false,
            false,
            None,
        )
        .await?;
    }
    let ms = |hist: &Histogram<u64>, q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let [off, on] = &arms;
    Ok(format!(
        "\nread feed: a read by ids of 10 items, {} calls per arm taking turns, on the shard: \
         without p50 {:.2} ms p99 {:.2} ms, with item.read p50 {:.2} ms p99 {:.2} ms, \
         with / without p50 {:.2}\n",
        args.feed_rounds,
        ms(off, 0.5),
        ms(off, 0.99),
        ms(on, 0.5),
        ms(on, 0.99),
        ms(on, 0.5) / ms(off, 0.5).max(0.001)
    ))
}

/// Writes the user's items straight into the shard: `args.items` sends of
/// one item each (a content copy per send, as the worker leaves them),
/// their categories taking turns, all unread and unseen.
async fn seed(pool: &MySqlPool, args: &ItemsArgs) -> anyhow::Result<()> {
    let generator = IdGenerator::with_instance(rand::random());
    let messages: Vec<u64> =
        (0..args.items).map(|_| generator.next_id().expect("unleased ids").get()).collect();
    let category = |index: usize| CATEGORIES[index % CATEGORIES.len()];
    let now = Utc::now().naive_utc();
    for (part, ids) in messages.chunks(1000).enumerate() {
        let mut insert = QueryBuilder::new(
            "INSERT INTO message_contents (message_id, title, body, category, data, created_at) ",
        );
        insert.push_values(ids.iter().enumerate(), |mut row, (i, id)| {
            let index = part * 1000 + i;
            row.push_bind(*id)
                .push_bind(format!("Items benchmark message {index}"))
                .push_bind("A body of moderate length, as a notification would have.")
                .push_bind(category(index))
                .push_bind(r#"{"link":"app://inbox/bench"}"#)
                .push_bind(now);
        });
        insert.build().execute(pool).await?;
        let mut insert =
            QueryBuilder::new("INSERT INTO message_items (user_id, message_id, category) ");
        insert.push_values(ids.iter().enumerate(), |mut row, (i, id)| {
            row.push_bind(args.user).push_bind(*id).push_bind(category(part * 1000 + i));
        });
        insert.build().execute(pool).await?;
    }
    Ok(())
}

/// The state every item of the user is in (they all change together).
#[derive(Debug, Clone, Copy, Default)]
struct ItemState {
    seen: bool,
    read: bool,
    archived: bool,
    deleted: bool,
}

impl ItemState {
    /// The state after `action`, and whether the action changes an item.
    fn after(self, action: v1::ItemAction) -> (Self, bool) {
        use v1::ItemAction as A;
        let mut next = self;
        match action {
            A::MarkSeen => next.seen = true,
            A::MarkRead => (next.read, next.seen) = (true, true),
            A::MarkUnread => next.read = false,
            A::Archive => next.archived = true,
            A::Unarchive => next.archived = false,
            A::Delete => next.deleted = true,
            A::Unspecified => {}
        }
        // Seen is `seen OR read`; a deleted item never changes again.
        let changed = !self.deleted
            && (next.read != self.read
                || (next.seen || next.read) != (self.seen || self.read)
                || next.archived != self.archived
                || next.deleted);
        (next, changed)
    }

    /// Unread and unseen of `n` items in this state.
    fn counts(self, n: u64) -> (u64, u64) {
        if self.archived || self.deleted || self.read {
            return (0, 0);
        }
        (n, if self.seen { 0 } else { n })
    }
}

/// One `UpdateItems(action, all)` of every item in every view; checks that
/// it changed every item and the counts it answers. Returns its latency in
/// microseconds.
async fn update_all(
    client: &mut InboxServiceClient<Channel>,
    args: &ItemsArgs,
    state: &mut ItemState,
    action: v1::ItemAction,
) -> anyhow::Result<u64> {
    let started = Instant::now();
    let reply = client
        .update_items(v1::UpdateItemsRequest {
            user_id: args.user,
            action: action as i32,
            message_ids: Vec::new(),
            all: Some(v1::ItemFilter { view: v1::InboxView::All as i32, ..Default::default() }),
        })
        .await
        .with_context(|| format!("UpdateItems({})", action.as_str_name()))?
        .into_inner();
    let took = (started.elapsed().as_nanos() as u64 / 1000).max(1);
    let (next, changes) = state.after(action);
    *state = next;
    let n = if changes { args.items } else { 0 };
    let (unread, unseen) = next.counts(args.items);
    ensure!(
        reply.changed == n && reply.unread == unread && reply.unseen == unseen,
        "UpdateItems({}) changed {} with unread {} unseen {}; expected {n}, {unread}, {unseen}",
        action.as_str_name(),
        reply.changed,
        reply.unread,
        reply.unseen
    );
    Ok(took)
}

/// The timed part, with what it needs.
struct Run<'a> {
    args: &'a ItemsArgs,
    tracked: &'a Tracked,
    state: ItemState,
    proxies: &'a [CountingProxy],
    /// The user's shard, direct (not through its proxy).
    shard: &'a MySqlPool,
    /// When the last call, timed or not, was answered.
    last_answer: Instant,
}

impl Run<'_> {
    /// `calls` calls of each of `actions`, taking turns; one [`Timed`] per
    /// action (the statements counted over all of them, split evenly).
    async fn actions(
        &mut self,
        client: &mut InboxServiceClient<Channel>,
        actions: &[v1::ItemAction],
        calls: u32,
    ) -> anyhow::Result<Vec<Timed>> {
        let counts = || self.proxies.iter().map(CountingProxy::commands).collect::<Vec<_>>();
        let update_counts =
            || self.proxies.iter().map(CountingProxy::update_commands).collect::<Vec<_>>();
        let update_pings = || self.proxies.iter().map(CountingProxy::update_pings).sum::<u64>();
        let mut counting_hists: Vec<Histogram<u64>> = actions.iter().map(|_| new_hist()).collect();
        let mut each: Vec<Vec<(u64, u64)>> = actions.iter().map(|_| Vec::new()).collect();
        let shards = self.proxies.len();
        // Commands in the calls' windows (request to answer) and in the
        // countings' (answer to the backlog empty), and how long those were.
        let (mut in_calls, mut in_counting) = (vec![0u64; shards], vec![0u64; shards]);
        let (mut call_secs, mut counting_secs) = (0.0, 0.0);
        // Commands on the updates' connections in the calls' windows, and
        // the pings among them.
        let (mut updates_in_calls, mut pings_in_calls) = (vec![0u64; shards], 0);
        // A pair leaves the items as it found them: one untimed round first,
        // after the idle window that ended the run before (each call's
        // pause is reported with the slowest ones).
        if actions.len() > 1 {
            for action in actions {
                update_all(client, self.args, &mut self.state, *action).await?;
                self.last_answer = Instant::now();
                if matches!(action, v1::ItemAction::MarkRead | v1::ItemAction::MarkUnread) {
                    backlog_drained(self.shard).await?;
                }
            }
        }
        let updates_before = update_counts();
        let cpu0 = self.tracked.snap();
        let started = Instant::now();
        for _ in 0..calls {
            for ((action, counting), each) in actions.iter().zip(&mut counting_hists).zip(&mut each)
            {
                let (before, updates, pings) = (counts(), update_counts(), update_pings());
                let call = Instant::now();
                let pause = call.duration_since(self.last_answer).as_millis() as u64;
                let took = update_all(client, self.args, &mut self.state, *action).await?;
                self.last_answer = Instant::now();
                each.push((took, pause));
                call_secs += call.elapsed().as_secs_f64();
                let answered = counts();
                add_between(&mut in_calls, &before, &answered);
                add_between(&mut updates_in_calls, &updates, &update_counts());
                pings_in_calls += update_pings() - pings;
                if matches!(action, v1::ItemAction::MarkRead | v1::ItemAction::MarkUnread) {
                    let since = Instant::now();
                    backlog_drained(self.shard).await?;
                    counting.saturating_record((since.elapsed().as_nanos() as u64 / 1000).max(1));
                    counting_secs += since.elapsed().as_secs_f64();
                    add_between(&mut in_counting, &answered, &counts());
                }
            }
        }
        let secs = started.elapsed().as_secs_f64();
        let cpu = self.tracked.between(&cpu0, &self.tracked.snap());
        // The services' own round trips (their background loops, which
        // come in bursts) over an idle window as long as the run (at least
        // 2 s) right after it, per shard.
        let idle = Duration::from_secs_f64(secs.max(2.0));
        let count1 = counts();
        tokio::time::sleep(idle).await;
        let background: Vec<f64> = counts()
            .iter()
            .zip(&count1)
            .map(|(b, a)| (b - a) as f64 / idle.as_secs_f64())
            .collect();
        let total_calls = f64::from(calls) * actions.len() as f64;
        let on_updates: Vec<f64> =
            updates_in_calls.iter().map(|n| *n as f64 / total_calls).collect();
        let pings_on_updates = pings_in_calls as f64 / total_calls;
        let on_updates_all: u64 =
            update_counts().iter().zip(&updates_before).map(|(after, before)| after - before).sum();
        let between_calls = (
            on_updates_all - updates_in_calls.iter().sum::<u64>(),
            secs - call_secs + idle.as_secs_f64(),
        );
        ensure!(
            on_updates.iter().sum::<f64>() >= 1.0,
            "no command was seen carrying an item update: has the script's UPDATE changed? \
             (items/counting.rs, UPDATE_MARK)"
        );
        let group: Vec<&str> = actions.iter().map(|a| a.as_str_name()).collect();
        let group = group.join(" + ");
        let net = |made: &[u64], window: f64| -> Vec<f64> {
            (0..shards)
                .map(|shard| {
                    (made[shard] as f64 - background[shard] * window).max(0.0) / total_calls
                })
                .collect()
        };
        let per_call = net(&in_calls, call_secs);
        let counting_trips = net(&in_counting, counting_secs);
        Ok(actions
            .iter()
            .zip(counting_hists)
            .zip(each)
            .map(|((action, counting_hist), calls)| Timed {
                action: *action,
                group: group.clone(),
                hist: latencies(&calls),
                per_call: per_call.clone(),
                on_updates: on_updates.clone(),
                pings_on_updates,
                between_calls,
                counting: (!counting_hist.is_empty())
                    .then(|| (counting_hist, counting_trips.clone())),
                calls,
                cpu: cpu.clone(),
            })
            .collect())
    }
}

/// The slowest calls of a run of several, by number (1 = the first),
/// latency and the pause before them, slowest first: whether a tail is
/// spread over the run or follows a pause (which costs this machine's
/// memory, [`crate::procstat::memory_after_pause`]).
fn slowest(calls: &[(u64, u64)]) -> String {
    if calls.len() < 2 {
        return String::new();
    }
    let mut by_time: Vec<(usize, (u64, u64))> = calls.iter().copied().enumerate().collect();
    by_time.sort_unstable_by_key(|(_, (took, _))| std::cmp::Reverse(*took));
    let named: Vec<String> = by_time
        .iter()
        .take(3)
        .map(|(at, (took, pause))| {
            format!(
                "#{} {:.1} ms ({pause} ms after the answer before)",
                at + 1,
                *took as f64 / 1000.0
            )
        })
        .collect();
    format!("\n{:<24} slowest calls: {}", "", named.join(", "))
}

/// Adds each shard's commands between two counts.
fn add_between(sum: &mut [u64], before: &[u64], after: &[u64]) {
    for ((sum, before), after) in sum.iter_mut().zip(before).zip(after) {
        *sum += after - before;
    }
}

/// Waits until the shard has no read waiting to be counted (polled every
/// millisecond: the counting normally ends within a few).
async fn backlog_drained(pool: &MySqlPool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (waiting,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM read_backlog").fetch_one(pool).await?;
        if waiting == 0 {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "reads still waiting to be counted after 30 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The histogram of calls' latencies (microseconds, as [`Timed::calls`]).
fn latencies(calls: &[(u64, u64)]) -> Histogram<u64> {
    let mut hist = new_hist();
    for (took, _) in calls {
        hist.saturating_record(*took);
    }
    hist
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn summary(args: &ItemsArgs, user_slot: usize, timed: &[Timed], machine_max: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n================ notify-bench items: summary ================");
    let _ = writeln!(
        s,
        "UpdateItems(all, view ALL) over user {}'s {} items (one send each, all on shard slot \
         {user_slot}); each call changes every item; client-side latency, one call at a time; the \
         api reaches each shard through a counting proxy (one more loopback hop per round trip)",
        args.user,
        thousands(args.items)
    );
    for t in timed {
        let ms = |q: f64| t.hist.value_at_quantile(q) as f64 / 1000.0;
        // A shard is touched when a call makes at least half a round trip
        // on it on the updates' connections. Those count the call's own
        // commands and nothing of the services' other work, one call or
        // many: judged. The window's count is not: it takes in the read
        // counting that starts as a read commits and the services' bursty
        // background loops, whose rate is only estimated.
        let touched = t.on_updates.iter().filter(|n| **n >= 0.5).count().max(1);
        let own: f64 = t.on_updates.iter().sum();
        let trips: f64 = t.per_call.iter().sum();
        let counting = t.counting.as_ref().map_or(String::new(), |(hist, trips)| {
            let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
            format!(
                "\n{:<24} read counts followed the answer in p50 {:>6.1} ms  p99 {:>6.1} ms, {:.1} \
                 round trips a call (in the background)",
                "",
                ms(0.5),
                ms(0.99),
                trips.iter().sum::<f64>()
            )
        });
        let _ = writeln!(
            s,
            "{:<24} {:>3} calls  p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms (target < {TARGET_MS} \
             ms: {}) | {own:.2} round trips a call on the updates' connections ({:.2} of them pings) over \
             {touched} shard(s) touched (target 1 per shard touched: {}); all commands in the calls' windows, \
             net of the services' estimated rate: {trips:.1}{counting}{}",
            t.action.as_str_name(),
            t.hist.len(),
            ms(0.5),
            ms(0.99),
            t.hist.max() as f64 / 1000.0,
            verdict(ms(0.99) < TARGET_MS),
            t.pings_on_updates,
            verdict(own <= touched as f64 + 0.05),
            slowest(&t.calls)
        );
    }
    let _ = writeln!(
        s,
        "round trips per call by shard slot (MySQL commands counted by each shard's proxy over the \
         run, net of the services' rate over an idle window as long as the run, right after it; \
         then those on the connections that carried the updates' scripts, in the calls' windows; \
         and those connections' commands outside the calls, over the run and that window, all \
         shards: the keepalive's pings; the user's shard is slot {user_slot}):"
    );
    let mut groups: Vec<&str> = Vec::new();
    for t in timed {
        if groups.contains(&t.group.as_str()) {
            continue;
        }
        groups.push(&t.group);
        let by_slot = |counts: &[f64]| {
            let counts: Vec<String> =
                counts.iter().enumerate().map(|(slot, n)| format!("{slot}: {n:.2}")).collect();
            counts.join(", ")
        };
        let (between, between_secs) = t.between_calls;
        let _ = writeln!(
            s,
            "  {}: {} | on the updates' connections: {} | outside the calls: {between} in {:.1} s",
            t.group,
            by_slot(&t.per_call),
            by_slot(&t.on_updates),
            between_secs
        );
        let _ = writeln!(s, "    cpu: {}", t.cpu.line(machine_max));
    }
    let _ = write!(s, "==============================================================");
    s
}
