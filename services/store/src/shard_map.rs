//! The bucket -> shard map as versioned data that every replica follows.
//!
//! The map lives in `shard_map_versions` on the directory shard (the first of
//! `database.shards`, which also holds the id instance leases). The config's
//! `database.bucket_ranges` is only its initial value: the first process to
//! start stores it as version 1, and from then on the stored map wins (so a
//! shard added to the config, which would change an even split, moves
//! nothing by itself). Changes append a version and never edit one:
//! `notifyctl shard add` registers a configured, migrated shard that owns no
//! bucket yet.
//!
//! Every api and worker replica reads the newest version at start and again
//! every `database.shard_map_refresh_ms`, installs it in its routing
//! ([`shard_router::Shards::install`]) and reports the version it routes by
//! in `shard_map_replicas`. A replica cannot serve a map naming a shard it has
//! no connection settings for: it keeps its map, logs why, and reports the
//! refused version, so an operator (and a bucket mover waiting for every live
//! replica to run a version) sees who is behind and why.
//!
//! A version may freeze buckets for writes (`frozen`): writers to them wait
//! for the version that ends the freeze, reads go on. The version a replica
//! reports is the oldest one a route it still holds was taken under, so once
//! every live replica reports version V, nothing anywhere writes by a map
//! older than V: what a move needs before its last copy (V freezes the
//! moving buckets) and before it cleans the source (V flips them).

use std::fmt;
use std::time::Duration;

use shard_router::{BucketSet, ShardId, ShardMap};
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::db::ShardPools;
use crate::error::Result;
use notify_domain::Error;
use notify_domain::settings::{DatabaseSettings, Settings};

/// A version of the map as stored.
#[derive(Debug, Clone)]
pub struct StoredMap {
    /// Its version, from 1.
    pub version: u64,
    /// The map.
    pub map: ShardMap,
    /// The buckets it freezes for writes (a move's last copy).
    pub frozen: BucketSet,
    /// Why it was written.
    pub reason: String,
    /// When, UTC.
    pub created_at: chrono::NaiveDateTime,
}

/// What a replica reported, as `notifyctl shard map` shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReplicaState {
    /// `role host:pid:token`.
    pub replica: String,
    /// `api` or `worker`.
    pub role: String,
    /// The version it routes by.
    pub version: u64,
    /// The newest version it could not serve, 0 if none.
    pub refused: u64,
    /// The newest expand migration of its build (0: a build before
    /// replicas reported it); see [`crate::db::contract`].
    pub schema_version: i64,
    /// Seconds since it last reported.
    pub age_secs: f64,
}

impl ReplicaState {
    /// A replica silent this long is shown as possibly gone.
    pub const STALE_SECS: f64 = 30.0;

    /// What an operator should notice about it, against the map's
    /// `current` version: `behind`, `refused version N`, `older build`
    /// (its schema version is older than this build's: it holds the
    /// contract step back), `gone?`.
    pub fn notes(&self, current: u64) -> Vec<String> {
        let mut notes = Vec::new();
        if self.version < current {
            notes.push("behind".to_owned());
        }
        if self.refused > 0 {
            notes.push(format!("refused version {}", self.refused));
        }
        if self.schema_version < crate::db::contract::schema_version() {
            notes.push("older build".to_owned());
        }
        if self.age_secs > Self::STALE_SECS {
            notes.push("gone?".to_owned());
        }
        notes
    }
}

/// How a replica is known in `shard_map_replicas`.
#[derive(Debug, Clone)]
pub struct Replica {
    name: String,
    role: &'static str,
}

impl Replica {
    /// A name for this process in `role` (`api`, `worker`).
    pub fn new(role: &'static str) -> Self {
        let host = notify_domain::ids::hostname();
        let name = format!("{role} {host}:{}:{:08x}", std::process::id(), rand::random::<u32>());
        Self { name, role }
    }
}

impl fmt::Display for Replica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// The shard that holds the map: the first of `database.shards`.
pub fn directory(pools: &ShardPools) -> notify_domain::Result<&MySqlPool> {
    pools
        .iter()
        .next()
        .map(|(_, pool)| pool)
        .ok_or_else(|| Error::Internal("database.shards: no shard holds the shard map".to_owned()))
}

fn parse<T: std::str::FromStr<Err: fmt::Display>>(
    version: u64,
    text: &str,
) -> notify_domain::Result<T> {
    text.parse().map_err(|e| {
        Error::Internal(format!("shard_map_versions version {version} does not parse: {e}"))
    })
}

/// Reads the newest version, if any was stored.
pub async fn latest(directory: &MySqlPool) -> Result<Option<StoredMap>> {
    let row: Option<(u64, String, String, String, chrono::NaiveDateTime)> = sqlx::query_as(
        "SELECT version, shard_map, frozen, reason, created_at FROM shard_map_versions \
         ORDER BY version DESC LIMIT 1",
    )
    .fetch_optional(directory)
    .await?;
    row.map(|(version, map, frozen, reason, created_at)| {
        let (map, frozen) = (parse(version, &map)?, parse(version, &frozen)?);
        Ok(StoredMap { version, map, frozen, reason, created_at })
    })
    .transpose()
}

/// The buckets that changed owner between consecutive stored versions from
/// `from` on: what [`shard_router::Shards::install_with_history`] needs to
/// know of the versions a process did not install itself (a send's chunks
/// stay on the shard they were cut for, so a status lookup tests a user of
/// such a bucket on every shard). A handful of rows: the map changes by
/// operators' moves.
pub async fn moves_since(directory: &MySqlPool, from: u64) -> Result<BucketSet> {
    let rows: Vec<(u64, String)> = sqlx::query_as(
        "SELECT version, shard_map FROM shard_map_versions WHERE version >= ? ORDER BY version",
    )
    .bind(from)
    .fetch_all(directory)
    .await?;
    let mut moved = BucketSet::EMPTY;
    let mut before: Option<ShardMap> = None;
    for (version, text) in rows {
        let map: ShardMap = parse(version, &text)?;
        if let Some(before) = &before {
            moved = moved.union(map.moved_from(before));
        }
        before = Some(map);
    }
    Ok(moved)
}

/// Stores the config's map as version 1 unless a version exists, then
/// routes `pools` by the newest version. Called once at start; a newest
/// version this process cannot serve fails the start with a line saying
/// which shard its config lacks.
pub async fn adopt(settings: &Settings, pools: &ShardPools) -> Result<u64> {
    let directory = directory(pools)?;
    let initial = settings.shard_map().map_err(|e| Error::Internal(e.to_string()))?;
    sqlx::query(
        "INSERT IGNORE INTO shard_map_versions (version, shard_map, reason) \
         VALUES (1, ?, 'initial: database.bucket_ranges')",
    )
    .bind(initial.to_string())
    .execute(directory)
    .await?;
    let stored = latest(directory)
        .await?
        .ok_or_else(|| Error::Internal("shard_map_versions is empty after seeding".to_owned()))?;
    if stored.map.to_string() != initial.to_string() {
        info!(
            version = stored.version,
            stored = %stored.map,
            config = %initial,
            "routing by the stored shard map; database.bucket_ranges only seeds an empty store"
        );
    }
    let history = moves_since(directory, 1).await?;
    pools.install_with_history(stored.map, stored.frozen, stored.version, history).map_err(
        |e| {
            Error::Internal(format!(
                "shard map version {}: {e}: add it there first",
                stored.version
            ))
        },
    )?;
    metrics::gauge!("notify_shard_map_version").set(stored.version as f64);
    Ok(stored.version)
}

/// Reports the version this process routes by, then looks for a newer one
/// once more (installing and reporting it): a version a mover appended
/// before the report is installed now, and one appended after it waits for
/// this replica, so a process that just started cannot write by a map a
/// move has left behind unseen. Called by api and worker before serving;
/// from then on, the process writes only while its reports go through
/// (`database.replica_lease_secs`).
pub async fn join(
    pools: &ShardPools,
    database: &DatabaseSettings,
    replica: &Replica,
) -> Result<u64> {
    let lease = Duration::from_secs(database.replica_lease_secs);
    report(pools, replica, 0, lease).await?;
    refresh(pools, replica, &mut 0, lease).await
}

/// Appends `map` as the version after `after`; fails with
/// FAILED_PRECONDITION when another change got there first.
pub async fn append(pools: &ShardPools, after: u64, map: &ShardMap, reason: &str) -> Result<u64> {
    append_frozen(pools, after, map, BucketSet::EMPTY, reason).await
}

/// Appends `map` with `frozen` buckets frozen for writes as the version
/// after `after`, like [`append`].
pub async fn append_frozen(
    pools: &ShardPools,
    after: u64,
    map: &ShardMap,
    frozen: BucketSet,
    reason: &str,
) -> Result<u64> {
    let version = after + 1;
    let inserted = sqlx::query(
        "INSERT IGNORE INTO shard_map_versions (version, shard_map, frozen, reason) \
         VALUES (?, ?, ?, ?)",
    )
    .bind(version)
    .bind(map.to_string())
    .bind(frozen.to_string())
    .bind(reason)
    .execute(directory(pools)?)
    .await?;
    if inserted.rows_affected() == 0 {
        return Err(Error::FailedPrecondition(format!(
            "the shard map changed since version {after}; read it again and retry"
        ))
        .into());
    }
    info!(version, map = %map, frozen = %frozen, reason, "shard map version appended");
    Ok(version)
}

/// Registers `shard`, which must be in `database.shards` (and migrated),
/// in a new version of the map, owning no bucket yet. Returns the version.
pub async fn add_shard(settings: &Settings, pools: &ShardPools, shard: ShardId) -> Result<u64> {
    if !settings.database.shards.iter().any(|s| s.id == shard) {
        return Err(Error::invalid(
            "shard",
            &format!(
                "shard {shard} is not in database.shards: add its url and database there first"
            ),
        )
        .into());
    }
    let current = latest(directory(pools)?)
        .await?
        .ok_or_else(|| Error::FailedPrecondition("no shard map is stored yet".to_owned()))?;
    if current.map.shards().contains(&shard) {
        return Err(Error::FailedPrecondition(format!(
            "shard {shard} is already in the shard map (version {})",
            current.version
        ))
        .into());
    }
    let map = current.map.with_shard(shard).map_err(|e| Error::Internal(e.to_string()))?;
    append(pools, current.version, &map, &format!("shard add {shard}")).await
}

/// Every replica that reported, newest first.
pub async fn replicas(directory: &MySqlPool) -> Result<Vec<ReplicaState>> {
    Ok(sqlx::query_as(
        "SELECT replica, role, version, refused, CAST(schema_version AS SIGNED) AS schema_version, \
         CAST(TIMESTAMPDIFF(MICROSECOND, seen_at, UTC_TIMESTAMP(3)) / 1e6 AS DOUBLE) AS age_secs \
         FROM shard_map_replicas ORDER BY seen_at DESC",
    )
    .fetch_all(directory)
    .await?)
}

/// Reports the version this replica routes by: the oldest one a route still
/// held was taken under, so a version is reported only once nothing in this
/// process writes by an older one (see [`shard_router::Shards::oldest_in_use`]).
/// Each report renews this process's write lease for `lease` from when it
/// was sent ([`shard_router::Shards::renew_lease`]).
/// With it goes the schema version of this build, which the contract step
/// waits on ([`crate::db::contract`]).
async fn report(
    pools: &ShardPools,
    replica: &Replica,
    refused: u64,
    lease: Duration,
) -> Result<()> {
    let sent_at = std::time::Instant::now();
    sqlx::query(
        "INSERT INTO shard_map_replicas (replica, role, version, refused, schema_version, seen_at) \
         VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(3)) ON DUPLICATE KEY UPDATE \
         version = VALUES(version), refused = VALUES(refused), \
         schema_version = VALUES(schema_version), seen_at = VALUES(seen_at)",
    )
    .bind(&replica.name)
    .bind(replica.role)
    .bind(pools.oldest_in_use())
    .bind(refused)
    .bind(crate::db::contract::schema_version())
    .execute(directory(pools)?)
    .await?;
    pools.renew_lease(sent_at + lease);
    Ok(())
}

/// Looks for a new version once: installs it when this process can serve
/// it, then reports. Returns the version routed by.
async fn refresh(
    pools: &ShardPools,
    replica: &Replica,
    refused: &mut u64,
    lease: Duration,
) -> Result<u64> {
    let directory = directory(pools)?;
    let newest: Option<u64> = sqlx::query_scalar("SELECT MAX(version) FROM shard_map_versions")
        .fetch_one(directory)
        .await?;
    let newer = newest.is_some_and(|v| v > pools.version() && v != *refused);
    if newer && let Some(stored) = latest(directory).await? {
        let version = stored.version;
        let history = moves_since(directory, pools.version().max(1)).await?;
        match pools.install_with_history(stored.map, stored.frozen, version, history) {
            Ok(_) => {
                info!(version, frozen = %stored.frozen, reason = %stored.reason, "routing by a new shard map version");
                metrics::gauge!("notify_shard_map_version").set(version as f64);
            }
            Err(e) => {
                error!(version, error = %e, "cannot route by this shard map version; keeping {}", pools.version());
                metrics::counter!("notify_shard_map_refused_total").increment(1);
                *refused = version;
            }
        }
    }
    report(pools, replica, *refused, lease).await?;
    Ok(pools.version())
}

/// Follows the stored map every `database.shard_map_refresh_ms` until
/// `drained`, then removes this replica's report: cancel it only once this
/// process writes nothing more (its calls and consumers have stopped), as a
/// move waits for reported replicas only.
pub async fn follow(
    pools: ShardPools,
    database: DatabaseSettings,
    replica: Replica,
    drained: CancellationToken,
) {
    let shutdown = drained;
    let pools = &pools;
    let mut tick = tokio::time::interval(Duration::from_millis(database.shard_map_refresh_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A directory shard that stops answering must hold up neither the next
    // look nor the process's shutdown.
    let patience =
        Duration::from_millis(database.shard_map_refresh_ms * 5).max(Duration::from_secs(5));
    let mut refused = 0;
    let lease = Duration::from_secs(database.replica_lease_secs);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let refreshed = tokio::select! {
            () = shutdown.cancelled() => break,
            refreshed = tokio::time::timeout(patience, refresh(pools, &replica, &mut refused, lease)) => refreshed,
        };
        let failed = match refreshed {
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer from the directory shard in {} ms", patience.as_millis()),
        };
        warn!(error = %failed, "shard map refresh failed; routing by version {}", pools.version());
    }
    if let Ok(directory) = directory(pools) {
        let gone = sqlx::query("DELETE FROM shard_map_replicas WHERE replica = ?")
            .bind(&replica.name)
            .execute(directory);
        match tokio::time::timeout(Duration::from_secs(2), gone).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                warn!(error = %e, "could not remove this replica from shard_map_replicas")
            }
            Err(_) => warn!("could not remove this replica from shard_map_replicas in 2 s"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReplicaState;
    use crate::db::contract::schema_version;

    fn replica(version: u64, schema_version: i64, age_secs: f64) -> ReplicaState {
        ReplicaState {
            replica: "api host:1:a".to_owned(),
            role: "api".to_owned(),
            version,
            refused: 0,
            schema_version,
            age_secs,
        }
    }

    #[test]
    fn notes_name_what_an_operator_should_notice() {
        assert!(replica(3, schema_version(), 1.0).notes(3).is_empty());
        assert_eq!(replica(2, schema_version(), 1.0).notes(3), ["behind"]);
        assert_eq!(replica(3, 0, 1.0).notes(3), ["older build"]);
        assert_eq!(replica(3, schema_version() - 1, 99.0).notes(3), ["older build", "gone?"]);
    }
}
