//! `notifyctl shard`: the stored, versioned shard map (read and changed in
//! the directory shard directly, like `migrate`, with the services' config).

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use notify_store::shard_map;
use notify_store::shard_move::{self, Ended, MoveRequest};
use shard_router::ShardId;

/// `notifyctl shard ...`.
#[derive(Debug, Subcommand)]
pub enum ShardCommand {
    /// Shows the shard map in force (its version and ranges) and the version
    /// each api and worker replica routes by.
    Map,
    /// Migrates a shard that is in database.shards and registers it in a new
    /// version of the map, owning no bucket yet.
    Add {
        /// The shard's id, as in database.shards.
        #[arg(long)]
        id: u32,
    },
    /// Moves buckets to a shard while the services run (copy, catch up, a
    /// short write freeze per batch, flip, clean the source), with a
    /// progress bar; or pauses, resumes or aborts the move in progress.
    Move(MoveArgs),
}

/// `notifyctl shard move`.
#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The buckets, `from..=to` (0..=1023), or one bucket.
    #[arg(long, required_unless_present_any = ["resume", "pause", "abort", "status"])]
    buckets: Option<String>,
    /// The shard that gets them (registered with `shard add`).
    #[arg(long, required_unless_present_any = ["resume", "pause", "abort", "status"])]
    to: Option<u32>,
    /// Buckets frozen and flipped together.
    #[arg(long, default_value_t = 16)]
    batch: u32,
    /// Runs the move in progress again, after a pause or a crash.
    #[arg(long, conflicts_with_all = ["buckets", "pause", "abort", "status"])]
    resume: bool,
    /// Asks the running mover to pause at its next step.
    #[arg(long, conflicts_with_all = ["buckets", "abort", "status"])]
    pause: bool,
    /// Aborts the move in progress: buckets not flipped stay where they are.
    #[arg(long, conflicts_with_all = ["buckets", "status"])]
    abort: bool,
    /// Shows the move in progress (or the last one).
    #[arg(long, conflicts_with = "buckets")]
    status: bool,
}

/// Parses `from..=to`, `from..to+1`, `from-to` or one bucket.
fn parse_buckets(text: &str) -> anyhow::Result<(u32, u32)> {
    let number = |part: &str| {
        part.trim()
            .parse::<u32>()
            .map_err(|_| anyhow::anyhow!("--buckets {text:?}: {part:?} is not a bucket number"))
    };
    if let Some((from, to)) = text.split_once("..=") {
        return Ok((number(from)?, number(to)?));
    }
    if let Some((from, to)) = text.split_once("..") {
        let to = number(to)?;
        anyhow::ensure!(to > 0, "--buckets {text:?}: the range is empty");
        return Ok((number(from)?, to - 1));
    }
    if let Some((from, to)) = text.split_once('-') {
        return Ok((number(from)?, number(to)?));
    }
    let bucket = number(text)?;
    Ok((bucket, bucket))
}

/// Runs a shard command.
pub async fn run(command: ShardCommand) -> anyhow::Result<()> {
    let settings = notify_domain::Settings::load()?;
    if let ShardCommand::Add { .. } = command {
        // The new shard gets the contract migrations the others have,
        // unless a replica of an older build still runs (then it waits for
        // the next `notifyctl migrate --contract`, as they did).
        let report =
            notify_store::db::contract::contract_all(&settings, std::time::Duration::ZERO).await?;
        for (version, description) in &report.deferred {
            println!("contract migration {version} ({description}) deferred: an older build runs");
        }
    }
    let pools = notify_store::db::connect(&settings).await?;
    shard_map::adopt(&settings, &pools).await?;
    match command {
        ShardCommand::Map => show(&pools).await,
        ShardCommand::Add { id } => {
            let version = shard_map::add_shard(&settings, &pools, ShardId(id)).await?;
            println!("shard {id} registered: shard map version {version}");
            show(&pools).await
        }
        ShardCommand::Move(args) => move_buckets(&settings, &pools, args).await,
    }
}

async fn move_buckets(
    settings: &notify_domain::Settings,
    pools: &notify_store::db::ShardPools,
    args: MoveArgs,
) -> anyhow::Result<()> {
    let active = shard_move::active(pools).await?;
    let current = || active.clone().ok_or_else(|| anyhow::anyhow!("no shard move is in progress"));
    if args.status {
        print_move(&current()?);
        return Ok(());
    }
    if args.pause {
        let current = current()?;
        shard_move::pause(pools, current.move_id).await?;
        println!("shard move {}: the mover pauses at its next step", current.move_id);
        return Ok(());
    }
    if args.abort {
        let current = current()?;
        match shard_move::abort(settings, pools, current.move_id).await? {
            Ended::Aborted => println!("shard move {} aborted", current.move_id),
            _ => println!(
                "shard move {}: its running mover aborts at its next step",
                current.move_id
            ),
        }
        return Ok(());
    }
    let started = if args.resume {
        current()?
    } else {
        let (from, to) = parse_buckets(args.buckets.as_deref().unwrap_or_default())?;
        let target = ShardId(args.to.unwrap_or_default());
        let request = MoveRequest { from, to, target, batch: args.batch };
        shard_move::start(pools, request).await?
    };
    println!(
        "shard move {}: buckets {}..={} to shard {}, {} per freeze",
        started.move_id, started.from_bucket, started.to_bucket, started.target, started.batch
    );
    let bar = ProgressBar::new(started.steps());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:<32} [{elapsed_precise}] {wide_bar} {pos}/{len} steps (eta {eta})",
    ) {
        bar.set_style(style);
    }
    bar.set_position(started.steps_done());
    let ended = shard_move::run(settings, pools, started.move_id, |progress| {
        bar.set_position(progress.state.steps_done());
        bar.set_message(progress.step.clone());
    })
    .await;
    bar.finish_and_clear();
    let state = shard_move::get(pools, started.move_id).await?;
    print_move(&state);
    match ended? {
        Ended::Done => Ok(()),
        Ended::Paused => {
            println!("paused: `notifyctl shard move --resume` goes on");
            Ok(())
        }
        Ended::Aborted => Ok(()),
    }
}

fn print_move(state: &shard_move::Move) {
    println!(
        "shard move {}: buckets {}..={} to shard {}: {}; copied to bucket {}, flipped to {}; \
         {} rows copied; longest write freeze {} ms{}",
        state.move_id,
        state.from_bucket,
        state.to_bucket,
        state.target,
        state.state,
        state.copied_to,
        state.flipped_to,
        state.rows_copied,
        state.longest_freeze_ms,
        if state.detail.is_empty() { String::new() } else { format!(" ({})", state.detail) }
    );
}

async fn show(pools: &notify_store::db::ShardPools) -> anyhow::Result<()> {
    let directory = shard_map::directory(pools)?;
    let stored = shard_map::latest(directory)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no shard map is stored yet"))?;
    println!(
        "shard map version {} ({}, {} UTC)",
        stored.version,
        stored.reason,
        stored.created_at.format("%Y-%m-%d %H:%M:%S")
    );
    let ranges = stored.map.ranges();
    for shard in stored.map.shards() {
        let owned: Vec<String> = ranges
            .iter()
            .filter(|r| r.shard == *shard)
            .map(|r| format!("{}..={}", r.from, r.to))
            .collect();
        let buckets: u32 =
            ranges.iter().filter(|r| r.shard == *shard).map(|r| r.to - r.from + 1).sum();
        let owned = if owned.is_empty() { "none".to_owned() } else { owned.join(", ") };
        println!("  shard {shard}: {buckets:>4} buckets  {owned}");
    }
    let replicas = shard_map::replicas(directory).await?;
    println!("replicas ({}):", replicas.len());
    for replica in replicas {
        let notes = replica.notes(stored.version);
        println!(
            "  {:<48} version {:>4}  schema {:>14}  seen {:>6.1} s ago  {}",
            replica.replica,
            replica.version,
            replica.schema_version,
            replica.age_secs,
            notes.join(", ")
        );
    }
    Ok(())
}
