//! `notify-bench recipients`: who got a send and who read it, on a big send.
//! One send to `--recipients` users (the draft flow, batches of 100,000)
//! with 1% of them muting its category (suppressed) and 1% reading it
//! (MarkRead), then a tenth of each shard's chunks stored as failed and a
//! tenth as pending (as a dead-letter and a paused send leave them), so every
//! filter has recipients. Then `ListRecipients` pages of 1,000 by
//! `--readers` concurrent readers for each filter, and `GetRecipientStatus`
//! of 1,000 users (recipients and not) by one caller, then by as many as
//! there are readers. Targets: p99 per page under 20 ms with the readers,
//! per status call (one caller: the call's own time) under 10 ms.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use notify_domain::Settings;
use notify_proto::v1;
use notify_proto::v1::RecipientFilter as F;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use sqlx::MySqlConnection;
use tonic::transport::Channel;

use crate::harness::{self, Env, thousands, verdict};

/// Target p99 of a page of 1,000.
const LIST_TARGET_MS: f64 = 20.0;
/// Target p99 of a status call of 1,000 users.
const STATUS_TARGET_MS: f64 = 10.0;
const CATEGORY: &str = "bench";

/// Arguments of `notify-bench recipients`.
#[derive(Debug, Clone, clap::Args)]
pub struct RecipientsArgs {
    /// Recipients of the send (user ids `1..=N`).
    #[arg(long, default_value_t = 1_000_000)]
    recipients: u64,
    /// Concurrent readers.
    #[arg(long, default_value_t = 4)]
    readers: usize,
    /// Recipients per page.
    #[arg(long, default_value_t = 1000)]
    page_size: u32,
    /// Pages each reader lists per filter (from the first, until the end).
    #[arg(long, default_value_t = 100)]
    pages: u64,
    /// GetRecipientStatus calls per reader (a p99 of 100 calls is their
    /// second slowest: the cold start's first calls, named in the report).
    #[arg(long, default_value_t = 1000)]
    status_calls: u64,
    /// Shard databases.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Longest wait for the send to complete.
    #[arg(long, default_value_t = 1800)]
    timeout_secs: u64,
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
pub async fn run(args: RecipientsArgs) -> anyhow::Result<()> {
    ensure!(args.recipients >= 1000 && args.readers > 0, "--recipients >= 1000, --readers > 0");
    ensure!((1..=1000).contains(&args.page_size), "--page-size must be 1..=1000");
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut env = Env::new(harness::settings_for(&base, &tag, args.shards))?;
    println!(
        "notify-bench recipients: tag {tag}, {} recipients on {} shards, {} readers, pages of {}, loadavg {}",
        thousands(args.recipients),
        args.shards,
        args.readers,
        args.page_size,
        crate::procstat::loadavg()
    );
    println!("{}", crate::procstat::memory_line().await);
    let outcome = crate::guarded(body(&mut env, &args)).await;
    env.finish(outcome).await
}

/// Runs `n` calls of `call(i)` with `concurrency` in flight.
async fn each<Fut>(n: u64, concurrency: usize, call: impl Fn(u64) -> Fut) -> anyhow::Result<()>
where
    Fut: Future<Output = anyhow::Result<()>>,
{
    futures::stream::iter(0..n).map(call).buffer_unordered(concurrency).try_collect::<()>().await
}

async fn body(env: &mut Env, args: &RecipientsArgs) -> anyhow::Result<String> {
    env.start_services().await?;
    let channel = env.channel().await?;
    let inbox = InboxServiceClient::new(channel.clone());
    let n = args.recipients;
    // 1% mute the send's category before it goes (suppressed).
    let started = Instant::now();
    each(n / 100, 16, |i| {
        let mut inbox = inbox.clone();
        async move {
            let preferences =
                v1::Preferences { muted_categories: vec![CATEGORY.into()], ..Default::default() };
            let request = v1::SetPreferencesRequest {
                user_id: 1 + i * 100 + 50,
                preferences: Some(preferences),
            };
            inbox.set_preferences(request).await.context("SetPreferences")?;
            Ok(())
        }
    })
    .await?;
    let users: Vec<u64> = (1..=n).collect();
    let content = v1::Content {
        title: "Recipients benchmark".into(),
        body: "A send whose recipients are listed page by page.".into(),
        category: CATEGORY.into(),
        data: Default::default(),
        ..Default::default()
    };
    let id = harness::send_draft(&channel, content, &users).await?;
    let sent_at = Instant::now();
    harness::watch_until(&channel, id, args.timeout_secs, "COMPLETED", |m| {
        m.status == v1::MessageStatus::Completed as i32
    })
    .await?;
    let fanout_secs = sent_at.elapsed().as_secs_f64();
    println!(
        "send {id} completed in {fanout_secs:.1} s (set-up {:.1} s before)",
        sent_at.duration_since(started).as_secs_f64()
    );
    // 1% read it.
    each(n / 100, 16, |i| {
        let mut inbox = inbox.clone();
        async move {
            let request = v1::MarkReadRequest { user_id: 1 + i * 100, message_ids: vec![id] };
            inbox.mark_read(request).await.context("MarkRead")?;
            Ok(())
        }
    })
    .await?;
    let (failed, pending) = store_chunk_states(&env.settings, id).await?;
    println!("1% read, 1% suppressed, {failed} chunks failed and {pending} pending");
    let mut server = harness::server_connection(&env.settings).await?;
    let (waited, dirty) = harness::quiesce(&mut server, Duration::from_secs(60)).await?;
    println!("quiesce: {waited:.1} s, {dirty} dirty pages left");
    let sizes = harness::pool_and_items(&mut server, &env.settings).await?;
    println!("{sizes}");

    let messages = MessageServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20);
    let mut lines = Vec::new();
    let mut all_ok = true;
    for filter in [
        F::Unspecified,
        F::Delivered,
        F::Read,
        F::Unread,
        F::Failed,
        F::Pending,
        F::Suppressed,
        F::Recalled,
        F::Cancelled,
    ] {
        let (hist, listed, secs) = list_pages(&messages, id, filter, args).await?;
        let ok = ms(&hist, 0.99) < LIST_TARGET_MS;
        all_ok &= ok;
        let line = format!(
            "ListRecipients {:<12} {:>5} pages  {:>9} listed  p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms  {:>6} recipients/s  p99 < {LIST_TARGET_MS} ms: {}",
            filter.as_str_name().trim_start_matches("RECIPIENT_FILTER_").to_lowercase(),
            hist.len(),
            thousands(listed),
            ms(&hist, 0.5),
            ms(&hist, 0.99),
            hist.max() as f64 / 1000.0,
            thousands((listed as f64 / secs.max(1e-9)) as u64),
            verdict(ok)
        );
        println!("{line}");
        lines.push(line);
        env.check_children()?;
    }
    // The target is a call's own time (one caller); with every reader at
    // once it is reported beside it, as load.
    let mut status_ok = true;
    for (callers, target) in [(1, true), (args.readers, false)] {
        // One caller: the pages each call made MariaDB read from disk.
        let server = (callers == 1).then_some(&mut server);
        let (status, slowest, disk) = status_calls(&messages, id, args, callers, server).await?;
        let ok = ms(&status, 0.99) < STATUS_TARGET_MS;
        if target {
            status_ok = ok;
        }
        let line = format!(
            "GetRecipientStatus of 1,000 users (90% recipients), {callers} caller(s)  {:>5} calls  p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms  {}",
            status.len(),
            ms(&status, 0.5),
            ms(&status, 0.99),
            status.max() as f64 / 1000.0,
            if target {
                format!("p99 < {STATUS_TARGET_MS} ms: {}", verdict(ok))
            } else {
                "(load, no target)".to_owned()
            }
        );
        println!("{line}");
        lines.push(line);
        // Which calls the tail is: the first ones (a cold start) or any.
        let slowest: Vec<String> = slowest
            .iter()
            .map(|call| {
                let reads = call.disk_reads.map(|n| format!(", {n} pages from disk"));
                format!(
                    "call {}: {:.2} ms{}",
                    call.index,
                    call.micros as f64 / 1000.0,
                    reads.unwrap_or_default()
                )
            })
            .collect();
        let line = format!("    slowest: {}", slowest.join("; "));
        println!("{line}");
        lines.push(line);
        if let Some(disk) = disk {
            println!("{disk}");
            lines.push(disk);
        }
        env.check_children()?;
    }
    Ok(format!(
        "\n================ notify-bench recipients: summary ================\n\
         send {id}: {} recipients, {} shards, fan-out {fanout_secs:.1} s; {} readers at once\n{sizes}\n{}\n\
         every target: {}\n==================================================================",
        thousands(n),
        args.shards,
        args.readers,
        lines.join("\n"),
        verdict(all_ok && status_ok)
    ))
}

/// Stores a tenth of each shard's chunks as failed and another tenth as
/// pending, as a dead-letter and a paused send leave them; returns how many.
async fn store_chunk_states(settings: &Settings, message_id: u64) -> anyhow::Result<(u64, u64)> {
    let pools = harness::shard_pools(settings, 2).await?;
    let (mut failed, mut pending) = (0, 0);
    for pool in &pools {
        failed += sqlx::query(
            "UPDATE message_chunks SET state = 2 WHERE message_id = ? AND chunk_id % 10 = 3",
        )
        .bind(message_id)
        .execute(pool)
        .await?
        .rows_affected();
        pending += sqlx::query(
            "UPDATE message_chunks SET state = 0 WHERE message_id = ? AND chunk_id % 10 = 7",
        )
        .bind(message_id)
        .execute(pool)
        .await?
        .rows_affected();
    }
    Ok((failed, pending))
}

/// Each reader lists up to `--pages` pages of `filter` from the first;
/// returns the page latencies (µs), recipients listed and wall seconds.
async fn list_pages(
    messages: &MessageServiceClient<Channel>,
    message_id: u64,
    filter: F,
    args: &RecipientsArgs,
) -> anyhow::Result<(Histogram<u64>, u64, f64)> {
    let started = Instant::now();
    let readers = (0..args.readers).map(|_| {
        let mut client = messages.clone();
        async move {
            let mut hist = new_hist();
            let mut listed = 0u64;
            let mut page_token = String::new();
            let mut last_user = 0;
            for _ in 0..args.pages {
                let request = v1::ListRecipientsRequest {
                    message_id,
                    state: filter as i32,
                    page_size: args.page_size,
                    page_token,
                };
                let call = Instant::now();
                let page = client.list_recipients(request).await.context("ListRecipients")?;
                hist.saturating_record(micros(call));
                let page = page.into_inner();
                for recipient in &page.recipients {
                    ensure!(recipient.user_id > last_user, "{filter:?}: out of order");
                    last_user = recipient.user_id;
                }
                listed += page.recipients.len() as u64;
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            anyhow::Ok((hist, listed))
        }
    });
    let mut total = new_hist();
    let mut listed = 0;
    for (hist, count) in futures::future::try_join_all(readers).await? {
        total.add(&hist)?;
        listed += count;
    }
    Ok((total, listed, started.elapsed().as_secs_f64()))
}

/// How many of the slowest status calls are named (by their number in
/// their caller's sequence).
const SLOWEST_NAMED: usize = 5;

/// The first calls of a run, whose pages MariaDB reads from disk are
/// reported apart from the rest's (a cold start).
const FIRST_CALLS: usize = 10;

/// One status call: its number in its caller's sequence (from 0), its time,
/// and (one caller) the pages MariaDB read from disk while it ran.
struct Call {
    index: u64,
    micros: u64,
    disk_reads: Option<u64>,
}

/// `--status-calls` per caller, `callers` at once, each of 1,000 users:
/// 900 spread over the recipients and 100 who are not. Returns every
/// call's time, the slowest calls, and with `server` (one caller) a line
/// saying how many pages the server read from disk per call (its
/// `Innodb_buffer_pool_reads` before and after each call, read outside
/// the call's time), for the first calls and the rest.
async fn status_calls(
    messages: &MessageServiceClient<Channel>,
    message_id: u64,
    args: &RecipientsArgs,
    callers: usize,
    mut server: Option<&mut MySqlConnection>,
) -> anyhow::Result<(Histogram<u64>, Vec<Call>, Option<String>)> {
    let n = args.recipients;
    let readers = (0..callers).map(|reader| {
        let mut client = messages.clone();
        // The first caller takes the connection (there is one caller when
        // there is a connection).
        let mut server = server.take();
        async move {
            let mut hist = new_hist();
            let mut calls = Vec::new();
            for call_index in 0..args.status_calls {
                let seed = (reader as u64) * 1_000_003 + call_index * 7919;
                let mut user_ids: Vec<u64> =
                    (0..900u64).map(|i| 1 + (seed + i * 104_729) % n).collect();
                user_ids.extend((0..100u64).map(|i| n + 1 + seed % 1000 + i));
                let request = v1::GetRecipientStatusRequest { message_id, user_ids };
                let before = disk_reads(server.as_deref_mut()).await?;
                let call = Instant::now();
                let found =
                    client.get_recipient_status(request).await.context("GetRecipientStatus")?;
                let took = micros(call);
                let after = disk_reads(server.as_deref_mut()).await?;
                hist.saturating_record(took);
                let disk_reads = before.zip(after).map(|(a, b)| b.saturating_sub(a));
                calls.push(Call { index: call_index, micros: took, disk_reads });
                ensure!(!found.into_inner().recipients.is_empty(), "no answer");
            }
            anyhow::Ok((hist, calls))
        }
    });
    let mut total = new_hist();
    let mut calls = Vec::new();
    for (hist, caller_calls) in futures::future::try_join_all(readers).await? {
        total.add(&hist)?;
        calls.extend(caller_calls);
    }
    let disk = disk_line(&calls);
    calls.sort_unstable_by_key(|call| std::cmp::Reverse(call.micros));
    calls.truncate(SLOWEST_NAMED);
    Ok((total, calls, disk))
}

/// MariaDB's count of pages read from disk into its buffer pool, with a
/// server connection.
async fn disk_reads(server: Option<&mut MySqlConnection>) -> anyhow::Result<Option<u64>> {
    let Some(conn) = server else { return Ok(None) };
    let (_, value): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_reads'")
            .fetch_one(conn)
            .await?;
    Ok(Some(value.parse()?))
}

/// Pages read from disk per call, the first calls' and the rest's, when
/// they were counted.
fn disk_line(calls: &[Call]) -> Option<String> {
    let per_call = |calls: &[Call]| {
        let reads = calls.iter().map(|call| call.disk_reads).collect::<Option<Vec<u64>>>()?;
        let mean = reads.iter().sum::<u64>() as f64 / reads.len().max(1) as f64;
        let millis = calls.iter().map(|call| call.micros).sum::<u64>() as f64
            / calls.len().max(1) as f64
            / 1000.0;
        Some(format!("{mean:.1} pages a call (mean {millis:.2} ms)"))
    };
    let (first, rest) = calls.split_at(FIRST_CALLS.min(calls.len()));
    Some(format!(
        "    pages MariaDB read from disk: the first {} calls {}, the other {} {}",
        first.len(),
        per_call(first)?,
        rest.len(),
        per_call(rest).unwrap_or_else(|| "none".to_owned())
    ))
}
