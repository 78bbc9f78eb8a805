//! The ListInbox half of `notify-bench badge`: a user with 1,000 items on a
//! shard holding ~1M items, paged through the api one call at a time and by
//! 16 readers at once, and the same query run directly over sqlx, alone and
//! by 16 connections at once (the database's share of a call, and the floor
//! of the concurrent run).

use std::time::Instant;

use anyhow::{Context as _, bail, ensure};
use chrono::Utc;
use hdrhistogram::Histogram;
use notify_domain::ids::IdGenerator;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_store::db::items::{self, InboxQuery, InboxRow};
use sqlx::QueryBuilder;
use sqlx::mysql::MySqlPool;
use tonic::transport::Channel;

use super::{BadgeArgs, new_hist};
use crate::harness::{self, Env, thousands};
use crate::procstat::{CpuUse, Tracked};
use crate::wire::WireChannel;

const LIST_INBOX: &str = "/notify.v1.InboxService/ListInbox";

/// What the ListInbox run measured.
pub(super) struct Inbox {
    pub(super) user: u64,
    pub(super) shard: u32,
    pub(super) shard_items: u64,
    pub(super) seeded_rows: u64,
    pub(super) seed_secs: f64,
    pub(super) hist: Histogram<u64>,
    /// The same calls by [`READERS`] readers at once, and where the CPU
    /// went meanwhile.
    pub(super) concurrent: Histogram<u64>,
    pub(super) concurrent_cpu: CpuUse,
    pub(super) concurrent_secs: f64,
    /// The api's page cache hits and misses over the concurrent run, and
    /// its ttl (0: off).
    pub(super) page_ttl_secs: u64,
    pub(super) page_hits: u64,
    pub(super) page_misses: u64,
    pub(super) readers: usize,
    pub(super) sql: Histogram<u64>,
    /// The SQL by [`READERS`] connections at once, and its CPU.
    pub(super) sql_concurrent: Histogram<u64>,
    pub(super) sql_concurrent_cpu: CpuUse,
    pub(super) sql_concurrent_secs: f64,
    /// The same through the pool, a connection per query.
    pub(super) sql_pooled: Histogram<u64>,
    pub(super) sql_pooled_cpu: CpuUse,
    pub(super) sql_pooled_secs: f64,
}

/// Concurrent ListInbox readers (list pages of many users at once).
const READERS: usize = 16;

/// Seeds the shard, then times `--inbox-calls` ListInbox calls.
pub(super) async fn run_inbox(
    env: &mut Env,
    args: &BadgeArgs,
    (channel, api_addr): (&Channel, &str),
    tracked: &Tracked,
) -> anyhow::Result<Inbox> {
    ensure!(args.inbox_items > 0, "--inbox-items must be > 0");
    let map = env.settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;
    let user = args.users.max(100_000_000) + 1;
    let shard = map.shard_for_user(user);
    let slot = map.slot_of(shard).context("shard slot")?;
    let pool = harness::shard_pool(&env.settings, slot, READERS as u32).await?;
    let started = Instant::now();
    let seeded_rows = seed_inbox_shard(&pool, &map, shard, user, args).await?;
    let seed_secs = started.elapsed().as_secs_f64();
    let shard_items: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM message_items").fetch_one(&pool).await?;
    let sql = inbox_sql_on_connection(&pool, user, args, args.inbox_calls).await?;
    let per_reader = args.inbox_concurrent_calls.div_ceil(READERS as u64);
    let (sql_concurrent, sql_concurrent_cpu, sql_concurrent_secs) =
        readers_at_once(tracked, || inbox_sql_on_connection(&pool, user, args, per_reader)).await?;
    // The same through the pool (a connection taken and given back per
    // query, as the api did): what the pool itself costs.
    let (sql_pooled, sql_pooled_cpu, sql_pooled_secs) =
        readers_at_once(tracked, || inbox_sql_through_pool(&pool, user, args, per_reader)).await?;
    pool.close().await;
    println!(
        "inbox seed: {} rows on shard {shard} in {seed_secs:.1} s ({} items on the shard)",
        thousands(seeded_rows),
        thousands(shard_items as u64)
    );

    let mut client = InboxServiceClient::new(channel.clone());
    let tonic_call =
        async |request| Ok(client.list_inbox(request).await.context("ListInbox")?.into_inner());
    let hist = read_pages(tonic_call, user, args, args.inbox_calls).await?;
    // The same pages by READERS readers at once, each its own share, on the
    // lean h2 client (as GetUnreadCount's load), over one connection.
    let wire = WireChannel::connect(api_addr).await?;
    let before = env.scrape("notify-api").await;
    let (concurrent, concurrent_cpu, concurrent_secs) = readers_at_once(tracked, || {
        let wire = wire.clone();
        let wire_call = async move |request| wire.unary(LIST_INBOX, &request).await;
        read_pages(wire_call, user, args, per_reader)
    })
    .await?;
    let after = env.scrape("notify-api").await;
    let counted = |name: &str| (after.sum(name, &[]) - before.sum(name, &[])) as u64;
    Ok(Inbox {
        user,
        shard: shard.0,
        shard_items: shard_items as u64,
        seeded_rows,
        seed_secs,
        hist,
        concurrent,
        concurrent_cpu,
        concurrent_secs,
        page_ttl_secs: env.settings.inbox.page_cache_ttl_secs,
        page_hits: counted("notify_inbox_page_cache_hits_total"),
        page_misses: counted("notify_inbox_page_cache_misses_total"),
        readers: READERS,
        sql,
        sql_concurrent,
        sql_concurrent_cpu,
        sql_concurrent_secs,
        sql_pooled,
        sql_pooled_cpu,
        sql_pooled_secs,
    })
}

/// Runs [`READERS`] readers made by `reader` at once; returns their merged
/// latencies, the CPU used meanwhile and the seconds it took.
async fn readers_at_once<F>(
    tracked: &Tracked,
    reader: impl Fn() -> F,
) -> anyhow::Result<(Histogram<u64>, CpuUse, f64)>
where
    F: Future<Output = anyhow::Result<Histogram<u64>>>,
{
    let (cpu0, started) = (tracked.snap(), Instant::now());
    let mut merged = new_hist();
    for hist in futures::future::try_join_all((0..READERS).map(|_| reader())).await? {
        merged.add(&hist)?;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok((merged, tracked.between(&cpu0, &tracked.snap()), secs))
}

/// `calls` ListInbox calls made by `call` (after 20 unmeasured), one at a
/// time, paging through the user's first `--inbox-pages` pages of 20 and
/// starting over.
async fn read_pages(
    mut call: impl AsyncFnMut(v1::ListInboxRequest) -> anyhow::Result<v1::ListInboxResponse>,
    user: u64,
    args: &BadgeArgs,
    calls: u64,
) -> anyhow::Result<Histogram<u64>> {
    let mut hist = new_hist();
    let mut token = String::new();
    let mut page = 0;
    let warmup = 20;
    for call_index in 0..warmup + calls {
        let started = Instant::now();
        let reply = call(v1::ListInboxRequest {
            user_id: user,
            page_size: 20,
            page_token: std::mem::take(&mut token),
            ..Default::default()
        })
        .await?;
        let micros = (started.elapsed().as_nanos() as u64 / 1000).max(1);
        if call_index >= warmup {
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
    Ok(hist)
}

/// The api's inbox query (`notify_store::db::items::list`, page_size + 1
/// rows) run `calls` times (after 20 unmeasured) by `run`, with the same
/// page pattern: the database's share of a ListInbox call.
async fn inbox_sql(
    args: &BadgeArgs,
    calls: u64,
    mut run: impl AsyncFnMut(InboxQuery<'static>) -> notify_store::Result<Vec<InboxRow>>,
) -> anyhow::Result<Histogram<u64>> {
    let mut hist = new_hist();
    let mut before = u64::MAX;
    let mut page = 0;
    for call in 0..20 + calls {
        let query = InboxQuery { before, limit: 21, filter: Default::default() };
        let started = Instant::now();
        let rows = run(query).await?;
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

/// [`inbox_sql`] on one connection held throughout (no pool in the way).
async fn inbox_sql_on_connection(
    pool: &MySqlPool,
    user: u64,
    args: &BadgeArgs,
    calls: u64,
) -> anyhow::Result<Histogram<u64>> {
    let mut conn = pool.acquire().await?;
    inbox_sql(args, calls, async |query| items::list(&mut *conn, user, &query).await).await
}

/// [`inbox_sql`] taking a pool connection for each query, as the api does.
async fn inbox_sql_through_pool(
    pool: &MySqlPool,
    user: u64,
    args: &BadgeArgs,
    calls: u64,
) -> anyhow::Result<Histogram<u64>> {
    inbox_sql(args, calls, async |query| items::list(pool, user, &query).await).await
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
    let generator = IdGenerator::with_instance(rand::random());
    let messages: Vec<u64> =
        (0..args.inbox_items).map(|_| generator.next_id().expect("unleased ids").get()).collect();
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
