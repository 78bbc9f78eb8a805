//! `notifyctl shard`: the stored, versioned shard map (read and changed in
//! the directory shard directly, like `migrate`, with the services' config).

use clap::Subcommand;
use notify_core::shard_map;
use shard_router::ShardId;

/// A replica that has not reported for this long is shown as gone.
const STALE_SECS: f64 = 30.0;

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
}

/// Runs a shard command.
pub async fn run(command: ShardCommand) -> anyhow::Result<()> {
    let settings = notify_core::Settings::load()?;
    if let ShardCommand::Add { .. } = command {
        notify_core::db::migrate_all(&settings).await?;
    }
    let pools = notify_core::db::connect(&settings).await?;
    shard_map::adopt(&settings, &pools).await?;
    match command {
        ShardCommand::Map => show(&pools).await,
        ShardCommand::Add { id } => {
            let version = shard_map::add_shard(&settings, &pools, ShardId(id)).await?;
            println!("shard {id} registered: shard map version {version}");
            show(&pools).await
        }
    }
}

async fn show(pools: &notify_core::db::ShardPools) -> anyhow::Result<()> {
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
        let mut notes = Vec::new();
        if replica.version < stored.version {
            notes.push("behind".to_owned());
        }
        if replica.refused > 0 {
            notes.push(format!("refused version {}", replica.refused));
        }
        if replica.age_secs > STALE_SECS {
            notes.push("gone?".to_owned());
        }
        println!(
            "  {:<48} version {:>4}  seen {:>6.1} s ago  {}",
            replica.replica,
            replica.version,
            replica.age_secs,
            notes.join(", ")
        );
    }
    Ok(())
}
