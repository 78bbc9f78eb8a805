//! The contract step: migrations that remove what older builds still use.
//!
//! Migrations in `migrations/` expand (the pre-upgrade hook runs them while
//! the old pods serve, so they must work with the build before). Those in
//! `migrations/contract/` contract: drop an index or column, rebuild a
//! table. A contract migration may run only once no live replica was built
//! without what it finishes, so its version names the expand migration it
//! waits for: `migrations/contract/V_x.sql` runs once every live replica
//! reports a schema version (the newest expand migration of its build,
//! [`schema_version`], renewed in `shard_map_replicas` with its shard map
//! version) of V or later. A replica not seen for twice
//! `database.replica_lease_secs` is gone, as for a bucket move.
//!
//! `notifyctl migrate --contract` (the chart's contract Job, beside each
//! rollout) runs [`contract_all`]: expand first, then every
//! contract migration the live replicas allow, waiting up to a patience for
//! the rest, which are deferred (reported, not an error) to the next run.
//! Contract migrations are tracked in `_notify_contract_migrations` on each
//! shard, beside sqlx's `_sqlx_migrations` for the expand ones.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use sqlx::migrate::{Migration, Migrator};
use sqlx::{Connection, MySqlConnection};
use tracing::{info, instrument, warn};

use super::{MIGRATOR, MigrationReport, migrate_all, shard_options};
use crate::error::Result;
use notify_domain::Error;
use notify_domain::settings::Settings;

/// Where each shard records the contract migrations applied.
pub const CONTRACT_TABLE: &str = "_notify_contract_migrations";

/// The contract migrations, embedded from `migrations/contract/`.
pub static CONTRACT: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrator = sqlx::migrate!("../../migrations/contract");
    migrator.dangerous_set_table_name(CONTRACT_TABLE);
    migrator
});

/// The newest expand migration this build was made with: what its
/// replicas report, and what a contract migration's version is compared to.
pub fn schema_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// A live replica that holds contract migrations back.
#[derive(Debug, Clone)]
pub struct Holding {
    /// `role host:pid:token`.
    pub replica: String,
    /// The schema version it reports (0: a build before replicas reported one).
    pub schema_version: i64,
}

/// What [`contract_all`] did.
#[derive(Debug, Clone)]
pub struct ContractReport {
    /// The expand migrations, run first.
    pub expand: Vec<MigrationReport>,
    /// Contract migrations applied by this run, per shard (shards in
    /// configuration order; empty when nothing was pending there).
    pub applied: Vec<(MigrationReport, Vec<i64>)>,
    /// Contract migrations not applied on every shard yet, which a live
    /// replica holds back: version and description.
    pub deferred: Vec<(i64, String)>,
    /// The live replicas of builds older than a deferred migration.
    pub holding: Vec<Holding>,
}

/// Migrates every shard (expand), then applies each contract migration
/// once no live replica is older than its version, waiting up to
/// `patience` for replicas to go. What is still held back then is
/// reported in [`ContractReport::deferred`], not failed: the schema works
/// for both builds until it runs.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn contract_all(settings: &Settings, patience: Duration) -> Result<ContractReport> {
    contract_with(settings, &CONTRACT, patience).await
}

/// [`contract_all`] with the contract migrations of `contract` (the
/// build's are [`CONTRACT`]; a test brings its own).
pub async fn contract_with(
    settings: &Settings,
    contract: &Migrator,
    patience: Duration,
) -> Result<ContractReport> {
    let expand = migrate_all(settings).await?;
    let mut pending = not_applied(settings, contract).await?;
    let started = Instant::now();
    let mut holding = holding_back(settings, &pending).await?;
    while !holding.is_empty() && started.elapsed() < patience {
        tokio::time::sleep(Duration::from_secs(1).min(patience)).await;
        pending = not_applied(settings, contract).await?;
        holding = holding_back(settings, &pending).await?;
    }
    let floor = holding.iter().map(|h| h.schema_version).min();
    let allowed: Vec<Migration> =
        contract.iter().filter(|m| floor.is_none_or(|floor| m.version <= floor)).cloned().collect();
    let mut applied = Vec::new();
    for (shard, report) in settings.database.shards.iter().zip(&expand) {
        let mut conn = MySqlConnection::connect_with(&shard_options(settings, shard)?).await?;
        let before = applied_versions(&mut conn).await;
        let mut migrator = Migrator::with_migrations(allowed.clone());
        migrator.dangerous_set_table_name(CONTRACT_TABLE);
        // A version applied by a newer run (before a rollback) is not an
        // error: it is done.
        migrator.set_ignore_missing(true);
        migrator.run(&mut conn).await.map_err(|e| {
            Error::Internal(format!("shard {} contract migration failed: {e}", shard.id))
        })?;
        let after = applied_versions(&mut conn).await;
        conn.close().await?;
        let new: Vec<i64> = after.into_iter().filter(|v| !before.contains(v)).collect();
        info!(shard = %shard.id, applied = ?new, "shard contracted");
        applied.push((report.clone(), new));
    }
    let deferred: Vec<(i64, String)> = pending
        .into_iter()
        .filter(|(version, _)| floor.is_some_and(|floor| *version > floor))
        .collect();
    if !deferred.is_empty() {
        warn!(deferred = ?deferred, holding = ?holding, "contract migrations deferred");
    }
    Ok(ContractReport { expand, applied, deferred, holding })
}

/// Contract migrations not applied on every shard: version, description.
async fn not_applied(settings: &Settings, contract: &Migrator) -> Result<Vec<(i64, String)>> {
    let mut done: Option<Vec<i64>> = None;
    for shard in &settings.database.shards {
        let mut conn = MySqlConnection::connect_with(&shard_options(settings, shard)?).await?;
        let here = applied_versions(&mut conn).await;
        conn.close().await?;
        done = Some(match done {
            None => here,
            Some(done) => done.into_iter().filter(|v| here.contains(v)).collect(),
        });
    }
    let done = done.unwrap_or_default();
    Ok(contract
        .iter()
        .filter(|m| !done.contains(&m.version))
        .map(|m| (m.version, m.description.to_string()))
        .collect())
}

/// The live replicas older than a pending contract migration. Its own
/// query, not `shard_map::replicas` (a layer above), with the same rule for
/// gone as a bucket move's wait: silent for twice the lease.
async fn holding_back(settings: &Settings, pending: &[(i64, String)]) -> Result<Vec<Holding>> {
    let Some(newest) = pending.iter().map(|(version, _)| *version).max() else {
        return Ok(Vec::new());
    };
    let directory = settings.database.shards.first().ok_or_else(|| {
        Error::Internal("database.shards: no shard holds the replicas".to_owned())
    })?;
    let mut conn = MySqlConnection::connect_with(&shard_options(settings, directory)?).await?;
    let gone_after = 2 * settings.database.replica_lease_secs;
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT replica, CAST(schema_version AS SIGNED) FROM shard_map_replicas \
         WHERE seen_at > UTC_TIMESTAMP(3) - INTERVAL ? SECOND AND schema_version < ? \
         ORDER BY schema_version, replica",
    )
    .bind(gone_after)
    .bind(newest)
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    Ok(rows
        .into_iter()
        .map(|(replica, schema_version)| Holding { replica, schema_version })
        .collect())
}

async fn applied_versions(conn: &mut MySqlConnection) -> Vec<i64> {
    let select = format!("SELECT version FROM {CONTRACT_TABLE} WHERE success = TRUE");
    sqlx::query_scalar(sqlx::AssertSqlSafe(select)).fetch_all(conn).await.unwrap_or_default()
}
