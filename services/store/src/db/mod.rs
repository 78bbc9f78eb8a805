//! MySQL shards: one pool per shard, database creation and migrations.

// First: their macros are SQL for the modules below.
#[macro_use]
pub mod item_times;
#[macro_use]
pub mod states;
#[macro_use]
pub mod preferences;

pub mod audit;
pub mod badge_repairs;
pub mod chunks;
pub mod contract;
pub mod direct;
pub mod erasure;
pub mod event_outbox;
pub mod groups;
pub mod item_updates;
pub mod items;
pub mod lookups;
pub mod messages;
pub mod operations;
pub mod read_backlog;
pub mod read_feed;
pub mod recall;
pub mod recipients;
pub mod script;
pub mod webhook_outbox;

use std::str::FromStr;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shard_router::{ShardId, Shards};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlSslMode};
use sqlx::{ConnectOptions, Connection, MySqlConnection};
use tracing::{info, instrument};

use crate::error::Result;
use notify_domain::Error;
use notify_domain::backoff::Reconnect;
use notify_domain::error::DbFailure;
use notify_domain::settings::{MySqlTlsMode, Settings, ShardSettings};

/// `ids` as a JSON array of numbers, for a `JSON_TABLE` (one statement text
/// whatever their number, where an `IN` list is a new one per length).
pub(crate) fn json_ids(ids: &[u64]) -> String {
    let mut json = String::with_capacity(ids.len() * 12 + 2);
    json.push('[');
    for (index, id) in ids.iter().enumerate() {
        if index > 0 {
            json.push(',');
        }
        json.push_str(&id.to_string());
    }
    json.push(']');
    json
}

/// Binds `ids` as a comma-separated list (the inside of an `IN (...)`).
pub fn push_ids(query: &mut sqlx::QueryBuilder<sqlx::MySql>, ids: &[u64]) {
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
}

/// Every shard's connection pool, routed by the shard map.
pub type ShardPools = Shards<MySqlPool>;

/// The shard schema, embedded from `migrations/` at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// What `migrate` did on one shard.
#[derive(Debug, Clone)]
pub struct MigrationReport {
    /// The shard.
    pub shard: ShardId,
    /// Its database name.
    pub database: String,
    /// True when the database did not exist and was created.
    pub created_database: bool,
    /// Versions applied by this run (empty when already up to date).
    pub applied: Vec<i64>,
}

/// How a shard database is created: its character set and collation, which
/// its tables take unless they name their own.
pub const DATABASE_OPTIONS: &str = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

/// Options of a shard's server (no database selected), with the TLS settings.
pub fn server_options(settings: &Settings, shard: &ShardSettings) -> Result<MySqlConnectOptions> {
    let url = settings.shard_server_url(shard);
    let options = MySqlConnectOptions::from_str(&url).map_err(|e| {
        Error::Internal(format!("database.shards[{}].url: not a mysql url ({e})", shard.id))
    })?;
    let database = &settings.database;
    let options = options.ssl_mode(match database.tls_mode {
        MySqlTlsMode::Disabled => MySqlSslMode::Disabled,
        MySqlTlsMode::Preferred => MySqlSslMode::Preferred,
        MySqlTlsMode::Required => MySqlSslMode::Required,
        MySqlTlsMode::VerifyCa => MySqlSslMode::VerifyCa,
        MySqlTlsMode::VerifyIdentity => MySqlSslMode::VerifyIdentity,
    });
    Ok(if database.tls_ca_file.is_empty() {
        options
    } else {
        options.ssl_ca(&database.tls_ca_file)
    })
}

pub(crate) fn shard_options(
    settings: &Settings,
    shard: &ShardSettings,
) -> Result<MySqlConnectOptions> {
    Ok(server_options(settings, shard)?
        .database(&shard.database)
        .charset("utf8mb4")
        .log_statements(tracing::log::LevelFilter::Trace)
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_millis(500)))
}

/// How long a pooled connection may sit idle before it is pinged on its
/// way out of the pool (and a direct one before a write, [`direct`]).
const IDLE_PING_AFTER: Duration = Duration::from_secs(1);

/// Connects a pool to every shard and checks that each one answers.
///
/// The error names the shard's setting, so an unreachable MySQL fails the
/// process at start with one clear line.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn connect(settings: &Settings) -> Result<ShardPools> {
    let map = settings.shard_map().map_err(|e| Error::Internal(e.to_string()))?;
    let mut pools = Vec::new();
    for (index, shard) in settings.database.shards.iter().enumerate() {
        let options = shard_options(settings, shard)?;
        let idle_transaction_timeout = settings.database.idle_transaction_timeout_secs;
        let pool = MySqlPoolOptions::new()
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if idle_transaction_timeout > 0 {
                        // MariaDB only; a server without the variable keeps
                        // its own behaviour.
                        let set = format!(
                            "SET SESSION idle_transaction_timeout = {idle_transaction_timeout}"
                        );
                        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(set)).execute(conn).await {
                            tracing::debug!(error = %e, "idle_transaction_timeout not set");
                        }
                    }
                    Ok(())
                })
            })
            .max_connections(settings.database.pool_max)
            .min_connections(1)
            // A broken connection fails its query, which is retried; pinging
            // on every acquire doubled the round trips of the chunk path.
            .test_before_acquire(false)
            // Except one idle for a while: after an outage (a restart, a
            // network cut) each idle connection would fail one call, so one
            // idle for IDLE_PING_AFTER is pinged first, and a broken one is
            // replaced. Busy connections come back within milliseconds; once
            // one was found broken, those released before it are pinged too
            // (they may have broken with it), so a statement run again after
            // a lost connection gets one that answers ([`retrying`]).
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= IDLE_PING_AFTER || released_before_a_loss(meta.idle_for) {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .acquire_timeout(Duration::from_secs(settings.database.connect_timeout_secs))
            .connect_with(options)
            .await
            .map_err(|e| {
                Error::Unavailable(format!(
                    "database.shards[{index}] (shard {}, database {}): cannot connect: {e}",
                    shard.id, shard.database
                ))
            })?;
        pools.push((shard.id, pool));
    }
    // Version 0 until [`crate::shard_map::adopt`] installs the stored map.
    Shards::with_members(pools, map, 0).map_err(|e| Error::Internal(e.to_string()).into())
}

/// Direct connections per shard for inbox pages, item updates and
/// recipients' reads (`database.read_connections`; none when 0: those calls
/// then take the pool's connections).
pub fn connect_direct(settings: &Settings) -> Result<Option<direct::ShardConnections>> {
    let max = settings.database.read_connections;
    if max == 0 {
        return Ok(None);
    }
    let timeout = Duration::from_secs(settings.database.connect_timeout_secs);
    let keep_warm = Duration::from_secs(settings.database.read_keep_warm_secs);
    let mut shards = Vec::new();
    for shard in &settings.database.shards {
        let options = shard_options(settings, shard)?;
        shards.push(direct::DirectConnections::new(shard.id, options, max, timeout, keep_warm));
    }
    Ok(Some(direct::ShardConnections::new(shards)))
}

/// Creates every shard database that does not exist and applies pending
/// migrations to each. Idempotent: a second run applies nothing.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn migrate_all(settings: &Settings) -> Result<Vec<MigrationReport>> {
    let mut reports = Vec::new();
    for (index, shard) in settings.database.shards.iter().enumerate() {
        let created_database = create_database(settings, shard, index).await?;
        let options = shard_options(settings, shard)?;
        let mut conn = MySqlConnection::connect_with(&options).await?;
        let before = applied_versions(&mut conn).await;
        // A shard a development build migrated before the schema was one
        // file: nothing was released on it, and sqlx would refuse it with
        // a line that does not say what to do.
        if let Some(unknown) = before.iter().find(|v| MIGRATOR.iter().all(|m| m.version != **v)) {
            return Err(Error::Internal(format!(
                "shard {} (database {}) holds migration {unknown}, which this build does not \
                 know: it was migrated by a development build from before the schema was one \
                 file; drop that database and run notifyctl migrate again",
                shard.id, shard.database
            ))
            .into());
        }
        MIGRATOR
            .run(&mut conn)
            .await
            .map_err(|e| Error::Internal(format!("shard {} migration failed: {e}", shard.id)))?;
        let after = applied_versions(&mut conn).await;
        conn.close().await?;
        let applied = after.into_iter().filter(|v| !before.contains(v)).collect();
        let report = MigrationReport {
            shard: shard.id,
            database: shard.database.clone(),
            created_database,
            applied,
        };
        info!(shard = %report.shard, database = %report.database, created = report.created_database, applied = ?report.applied, "shard migrated");
        reports.push(report);
    }
    Ok(reports)
}

async fn create_database(settings: &Settings, shard: &ShardSettings, index: usize) -> Result<bool> {
    let options = server_options(settings, shard)?;
    let mut conn = MySqlConnection::connect_with(&options).await.map_err(|e| {
        Error::Unavailable(format!(
            "database.shards[{index}] (shard {}): cannot connect: {e}",
            shard.id
        ))
    })?;
    let exists: Option<(String,)> =
        sqlx::query_as("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?")
            .bind(&shard.database)
            .fetch_optional(&mut conn)
            .await?;
    if exists.is_none() {
        // The name was validated as [A-Za-z0-9_] with the settings.
        let statement =
            format!("CREATE DATABASE IF NOT EXISTS `{}` {DATABASE_OPTIONS}", shard.database);
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement)).execute(&mut conn).await?;
    }
    conn.close().await?;
    Ok(exists.is_none())
}

/// Drops every shard database. Used by tests and benchmarks to clean up.
#[instrument(level = "debug", skip_all, fields(db.system = "mysql"))]
pub async fn drop_all(settings: &Settings) -> Result<()> {
    for shard in &settings.database.shards {
        let options = server_options(settings, shard)?;
        let mut conn = MySqlConnection::connect_with(&options).await?;
        let statement = format!("DROP DATABASE IF EXISTS `{}`", shard.database);
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement)).execute(&mut conn).await?;
        conn.close().await?;
    }
    Ok(())
}

async fn applied_versions(conn: &mut MySqlConnection) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = TRUE")
        .fetch_all(conn)
        .await
        .unwrap_or_default()
}

/// Runs `attempt`, a read, again when its pooled connection turned out
/// broken: the same as [`retrying`] (a read is idempotent), named for the
/// calls that only read.
pub async fn retry_read_on_broken_connection<T, E, F, Fut>(attempt: F) -> notify_domain::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<Error>,
{
    retrying("read", attempt).await
}

/// Most runs of one unit of work that InnoDB keeps rolling back as a
/// deadlock victim or for a lock wait timeout.
const LOCK_CONFLICT_ATTEMPTS: usize = 5;

/// The wait before the first run again after a lock conflict; it doubles,
/// jittered, up to [`LOCK_CONFLICT_MAX_WAIT`].
const LOCK_CONFLICT_MIN_WAIT: Duration = Duration::from_millis(5);
const LOCK_CONFLICT_MAX_WAIT: Duration = Duration::from_millis(250);

/// Runs `attempt` (one transaction, or a read, or a sequence of statements
/// each of which is a no-op when run again) and runs it again where the
/// database asks for it:
/// - a deadlock (1213) or a lock wait timeout (1205): the whole of
///   `attempt` again, up to [`LOCK_CONFLICT_ATTEMPTS`] runs in all, after
///   a jittered, doubling wait (two transactions that deadlocked must not
///   meet again in the same instant). A failed transaction is rolled back
///   when `attempt`'s future drops it, so each run starts clean;
/// - a lost connection (reset, closed, killed, the server restarted): once,
///   at once. Every pooled connection released before the loss is pinged
///   before it is handed out again ([`connect`]), so the run again gets a
///   connection that answers. `attempt` must be idempotent for this: a
///   connection lost while a `COMMIT` was on its way leaves the outcome
///   unknown, and the run again must find the work done (every write here
///   moves a row from a state and only from it, or sets a value).
///
/// Every other error is returned as it is: the first time. Each failure is
/// counted in `notify_db_errors_total` by kind, `op` and whether it was
/// run again, so a deterministic failure shows up at once as the bug it is.
pub async fn retrying<T, E, F, Fut>(op: &'static str, mut attempt: F) -> notify_domain::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<Error>,
{
    let mut waits = Reconnect::new(LOCK_CONFLICT_MIN_WAIT, LOCK_CONFLICT_MAX_WAIT);
    let (mut conflicts, mut reconnected) = (0, false);
    loop {
        let result = attempt().await.map_err(Into::into);
        let Some(failure) = result.as_ref().err().and_then(Error::db_failure) else {
            return result;
        };
        let wait = match failure {
            DbFailure::Deadlock | DbFailure::LockWaitTimeout
                if conflicts + 1 < LOCK_CONFLICT_ATTEMPTS =>
            {
                conflicts += 1;
                Some(waits.next_delay())
            }
            DbFailure::ConnectionLost if !reconnected => {
                reconnected = true;
                note_connection_loss();
                Some(Duration::ZERO)
            }
            _ => None,
        };
        let outcome = if wait.is_some() { "retried" } else { "returned" };
        metrics::counter!("notify_db_errors_total", "kind" => failure.name(), "op" => op, "outcome" => outcome)
            .increment(1);
        match wait {
            Some(wait) if !wait.is_zero() => tokio::time::sleep(wait).await,
            Some(_) => {}
            None => return result,
        }
    }
}

/// When a connection was last found broken, in ms since [`CLOCK`] began
/// (0: never).
static LAST_CONNECTION_LOSS_MS: AtomicU64 = AtomicU64::new(0);

/// The process's clock for [`LAST_CONNECTION_LOSS_MS`].
static CLOCK: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Records that a connection was found broken now: every pooled connection
/// released before it is pinged before it is handed out again.
pub(crate) fn note_connection_loss() {
    let now = CLOCK.elapsed().as_millis() as u64;
    LAST_CONNECTION_LOSS_MS.fetch_max(now.max(1), Ordering::Relaxed);
}

/// True when a pooled connection idle for `idle_for` was released before
/// the last connection loss (it may have broken with the others).
fn released_before_a_loss(idle_for: Duration) -> bool {
    let lost = LAST_CONNECTION_LOSS_MS.load(Ordering::Relaxed);
    if lost == 0 {
        return false;
    }
    let released = CLOCK.elapsed().saturating_sub(idle_for).as_millis() as u64;
    released <= lost
}
