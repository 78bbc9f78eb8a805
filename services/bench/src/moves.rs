//! `notify-bench move`: moves a range of buckets between two shards while
//! the api and worker run and callers keep marking the moving users' items
//! read, and compares its copy rate with a raw copy of the same item rows
//! (read 500 at a time from the source, written 500 at a time to a scratch
//! table on the target) in the same run. Prints rows/s, the longest write
//! freeze of a batch, and the slowest mark-read during the move.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::TryStreamExt as _;
use notify_domain::Settings;
use notify_proto::v1;
use notify_store::shard_map;
use notify_store::shard_move::{self, Ended, MoveRequest};
use shard_router::{ShardId, bucket_of};
use sqlx::MySqlPool;

use crate::harness::{self, Env, thousands, verdict};

/// Arguments of `notify-bench move`.
#[derive(Debug, Clone, clap::Args)]
pub struct MoveArgs {
    /// Recipients of the send that fills the shards.
    #[arg(long, default_value_t = 1_000_000)]
    recipients: u64,
    /// First bucket moved.
    #[arg(long, default_value_t = 768)]
    from: u32,
    /// Last bucket moved.
    #[arg(long, default_value_t = 895)]
    to: u32,
    /// The shard they move to.
    #[arg(long, default_value_t = 2)]
    target: u32,
    /// Buckets per freeze.
    #[arg(long, default_value_t = 16)]
    batch: u32,
    /// Callers marking moving users' items read during the move.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Shard databases.
    #[arg(long, default_value_t = 4)]
    shards: u32,
}

/// Runs the benchmark.
pub async fn run(args: MoveArgs) -> anyhow::Result<()> {
    ensure!(args.from <= args.to && args.to < 1024, "--from..--to must be a bucket range");
    ensure!(args.recipients > 0 && args.batch > 0, "--recipients and --batch must be > 0");
    let base = Settings::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tag = harness::fresh_tag();
    let mut settings = harness::settings_for(&base, &tag, args.shards);
    settings.database.shard_map_refresh_ms = 200;
    let mut env = Env::new(settings)?;
    println!(
        "notify-bench move: tag {tag}, {} recipients, buckets {}..={} to shard {}, {} per freeze, {} writers, loadavg {}",
        thousands(args.recipients),
        args.from,
        args.to,
        args.target,
        args.batch,
        args.writers,
        crate::procstat::loadavg()
    );
    let outcome = crate::guarded(body(&mut env, &args)).await;
    env.finish(outcome).await
}

async fn body(env: &mut Env, args: &MoveArgs) -> anyhow::Result<String> {
    env.start_services().await?;
    let channel = env.channel().await?;
    let users: Vec<u64> = (1..=args.recipients).collect();
    let started = Instant::now();
    let content =
        v1::Content { title: "move bench".into(), body: "b".into(), ..Default::default() };
    let message_id = harness::send_draft(&channel, content, &users).await?;
    let mut messages = v1::message_service_client::MessageServiceClient::new(channel.clone());
    loop {
        let request = v1::GetMessageRequest { message_id };
        let message = messages.get_message(request).await?.into_inner();
        if message.status == v1::MessageStatus::Completed as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "filled: {} items in {:.1} s",
        thousands(args.recipients),
        started.elapsed().as_secs_f64()
    );

    let settings = env.settings.clone();
    let pools = notify_store::db::connect(&settings).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    shard_map::adopt(&settings, &pools).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let map = pools.map();
    let target = ShardId(args.target);
    let source = map.shard_of_bucket(args.from);
    ensure!(
        (args.from..=args.to).all(|b| map.shard_of_bucket(b) == source) && source != target,
        "buckets {}..={} must all be on one shard other than {target}",
        args.from,
        args.to
    );
    let source_pool = pools.get(source).context("source pool")?.clone();
    let target_pool = pools.get(target).context("target pool")?.clone();

    // Baseline: the same item rows, read and written 500 at a time.
    let (baseline_rows, baseline_secs) = raw_copy(&source_pool, &target_pool, args).await?;
    let baseline = baseline_rows as f64 / baseline_secs;
    println!(
        "raw copy: {} item rows in {baseline_secs:.2} s = {} rows/s",
        thousands(baseline_rows),
        thousands(baseline as u64)
    );

    // Writers: mark-reads of moving users, timed, through the move.
    let moving: Vec<u64> =
        users.iter().copied().filter(|u| (args.from..=args.to).contains(&bucket_of(*u))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let slowest_us = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for index in 0..args.writers {
        let mut inbox = v1::inbox_service_client::InboxServiceClient::new(channel.clone());
        let (stop, slowest_us, moving) = (stop.clone(), slowest_us.clone(), moving.clone());
        writers.push(tokio::spawn(async move {
            let mut calls = 0u64;
            let mut position = index;
            while !stop.load(Ordering::Relaxed) {
                let user_id = moving[position % moving.len()];
                position += 7919;
                let began = Instant::now();
                let request = v1::MarkAllReadRequest { user_id, ..Default::default() };
                inbox.mark_all_read(request).await?;
                slowest_us.fetch_max(began.elapsed().as_micros() as u64, Ordering::Relaxed);
                calls += 1;
            }
            anyhow::Ok(calls)
        }));
    }

    let request = MoveRequest { from: args.from, to: args.to, target, batch: args.batch };
    let started = Instant::now();
    let record = shard_move::start(&pools, request).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut copied = None;
    let last = args.to as i32;
    let ended = shard_move::run(&settings, &pools, record.move_id, |progress| {
        if progress.state.copied_to == last && copied.is_none() {
            copied = Some((started.elapsed().as_secs_f64(), progress.state.rows_copied));
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let move_secs = started.elapsed().as_secs_f64();
    let (copy_secs, first_rows) = copied.unwrap_or((move_secs, 0));
    let batches = (args.to - args.from + 1).div_ceil(args.batch);
    println!(
        "phases: first copy {copy_secs:.2} s, {batches} batches (catch up, freeze, sync, flip, clean) {:.2} s",
        move_secs - copy_secs
    );
    stop.store(true, Ordering::Relaxed);
    let mut calls = 0;
    for writer in writers {
        calls += writer.await??;
    }
    ensure!(ended == Ended::Done, "the move ended {ended:?}");
    let done = shard_move::get(&pools, record.move_id).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let items: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM message_items WHERE bucket BETWEEN ? AND ? AND message_id = ?",
    )
    .bind(args.from)
    .bind(args.to)
    .bind(message_id)
    .fetch_one(&target_pool)
    .await?;
    ensure!(items as usize == moving.len(), "{items} items moved, {} expected", moving.len());
    let copy_rate = first_rows as f64 / copy_secs;
    let ratio = copy_rate / baseline;
    let slowest_ms = slowest_us.load(Ordering::Relaxed) as f64 / 1000.0;
    Ok(format!(
        "move: first copy {} rows/s, {ratio:.2} of the raw copy; whole move ({} rows written, \
         {batches} batches) {move_secs:.1} s = {} rows/s; longest write freeze {} ms {} (target < 5,000 per \
         batch of {}); {} mark-reads during the move, slowest {slowest_ms:.0} ms, none failed",
        thousands(copy_rate as u64),
        thousands(done.rows_copied),
        thousands((done.rows_copied as f64 / move_secs) as u64),
        thousands(done.longest_freeze_ms),
        verdict(done.longest_freeze_ms < 5_000),
        args.batch,
        thousands(calls)
    ))
}

/// Copies the range's item rows from `source` to a scratch table on
/// `target`, 500 rows per statement; returns (rows, seconds).
async fn raw_copy(
    source: &MySqlPool,
    target: &MySqlPool,
    args: &MoveArgs,
) -> anyhow::Result<(u64, f64)> {
    sqlx::query("CREATE TABLE bench_raw_copy LIKE message_items").execute(target).await?;
    let started = Instant::now();
    let mut rows = sqlx::query_as::<_, (String,)>(
        "SELECT JSON_ARRAY(user_id, message_id, is_read, category, created_at, read_time, expire_at) \
         FROM message_items WHERE bucket BETWEEN ? AND ?",
    )
    .bind(args.from)
    .bind(args.to)
    .fetch(source);
    let mut page = Vec::with_capacity(500);
    let mut copied = 0;
    let insert = "INSERT INTO bench_raw_copy (user_id, message_id, is_read, category, created_at, read_time, expire_at) \
         SELECT * FROM JSON_TABLE(?, '$[*]' COLUMNS (user_id BIGINT UNSIGNED PATH '$[0]', \
         message_id BIGINT UNSIGNED PATH '$[1]', is_read TINYINT PATH '$[2]', category VARCHAR(64) PATH '$[3]', \
         created_at DATETIME(3) PATH '$[4]', read_time DATETIME(3) PATH '$[5]', expire_at DATETIME(3) PATH '$[6]')) AS j";
    while let Some((row,)) = rows.try_next().await? {
        page.push(row);
        if page.len() == 500 {
            sqlx::query(insert).bind(format!("[{}]", page.join(","))).execute(target).await?;
            copied += page.len() as u64;
            page.clear();
        }
    }
    if !page.is_empty() {
        sqlx::query(insert).bind(format!("[{}]", page.join(","))).execute(target).await?;
        copied += page.len() as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    sqlx::query("DROP TABLE bench_raw_copy").execute(target).await?;
    Ok((copied, secs))
}
