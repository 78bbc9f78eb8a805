//! Moving buckets between shards while sends, reads and mark-reads go on.
//!
//! A move of buckets `from..=to` to a target shard (registered with
//! `notifyctl shard add`) is a row of `shard_moves` on the directory shard,
//! driven by one mover process (`notifyctl shard move`), which can pause it,
//! die and be resumed, or abort it:
//!
//! 1. **Copy.** Every bucket of the range not on the target yet is copied
//!    (eight at a time)
//!    from its owner to the target, table by table ([`TABLES`]: the rows
//!    keyed by a user, a message or group home, an idempotency key), found
//!    by their `bucket` column. Sends, reads and writes go on at the source.
//! 2. **Per batch of `batch` buckets:** copy again (catching up what
//!    changed meanwhile); publish a map version that **freezes** the batch
//!    (writers to it wait, reads go on) and wait until every live replica
//!    reports it, which means none still writes by an older map
//!    ([`crate::shard_map`]); copy the last changes (a sync: rows the source
//!    no longer has are deleted on the target too); publish the **flipped**
//!    map, the batch on the target and unfrozen; once every live replica
//!    reports that, **clean**: delete the batch's rows from every other
//!    shard. The freeze lasts from the freeze version to the flip version
//!    and is recorded (the longest one of the move).
//!
//! Each copy is a sync of one bucket of one table: the target's rows of the
//! bucket are read into memory (a bucket is 1/1024 of a shard's rows), the
//! source's rows streamed past them, and only rows that differ are written,
//! so running it again changes nothing, and a mover that dies anywhere is
//! resumed by running the move again (`notifyctl shard move --resume`).
//! Rows travel as JSON arrays (`JSON_ARRAY` out, `JSON_TABLE` in), which
//! keeps every type exact and one statement per 500 rows. Content copies
//! (`message_contents`) the moved items need are copied along; chunks and
//! per-shard stats stay where they are: a chunk planned for the old owner
//! is split onto the new one when applied (`notify_core::deliver`).
//!
//! Aborting deletes the target's copies of the buckets not flipped yet and
//! ends a freeze: those buckets are as they were. Buckets already flipped
//! stay on the target (their move is complete; a move back moves them).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::TryStreamExt as _;
use shard_router::{BUCKETS, BucketSet, ShardId, ShardMap, bucket_of_key};
use sqlx::{AssertSqlSafe, MySqlPool};
use tracing::{info, warn};

use crate::db::{ShardPools, retrying};
use crate::error::Result;
use crate::shard_map::{self, StoredMap};
use notify_domain::Error;
use notify_domain::backoff::Reconnect;
use notify_domain::error::DbFailure;
use notify_domain::settings::Settings;

/// A table whose rows move with their bucket, and its primary key.
#[derive(Debug, Clone, Copy)]
pub struct MovedTable {
    /// The table.
    pub name: &'static str,
    /// Its primary key columns.
    pub key: &'static [&'static str],
}

/// Every table with a `bucket` column, in the order they are copied (a
/// message home before the items that show it is not needed: reads join
/// only content copies, which go first).
pub const TABLES: [MovedTable; 14] = [
    MovedTable { name: "messages", key: &["message_id"] },
    MovedTable { name: "message_batches", key: &["message_id", "batch_number"] },
    MovedTable { name: "idempotency_keys", key: &["client", "sender", "idempotency_key"] },
    MovedTable { name: "message_groups", key: &["group_id"] },
    MovedTable { name: "group_seqs", key: &["group_id"] },
    MovedTable { name: "group_messages", key: &["group_id", "seq"] },
    MovedTable { name: "audit_log", key: &["audit_id"] },
    MovedTable { name: "user_inbox_state", key: &["user_id"] },
    MovedTable { name: "user_preferences", key: &["user_id"] },
    MovedTable { name: "group_members", key: &["user_id", "group_id"] },
    MovedTable { name: "message_items", key: &["user_id", "message_id"] },
    MovedTable { name: "message_reads", key: &["message_id", "user_id"] },
    MovedTable { name: "read_backlog", key: &["user_id", "backlog_id"] },
    MovedTable { name: "announcement_recipients", key: &["message_id", "user_id"] },
];

/// Rows per statement when writing or deleting.
const PAGE: usize = 500;

/// Buckets synced by one read of each side (the target's rows of a run are
/// held in memory while the source's stream past them: 8/1024 of a shard).
const RUN: u32 = 8;

/// A mover silent for this long can be taken over by another.
const LEASE_SECS: f64 = 60.0;

/// Most times in a row a run drives a move again after a failure that may
/// pass (a deadlock, a lost connection, a shard that does not answer) with
/// no step done between them.
const SETBACKS: u32 = 8;

/// The wait before driving a move again after such a failure; it doubles,
/// jittered, up to [`SETBACK_MAX_WAIT`] (eight in a row wait 11 to 21 s).
const SETBACK_MIN_WAIT: Duration = Duration::from_millis(100);
const SETBACK_MAX_WAIT: Duration = Duration::from_secs(5);

/// What to move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveRequest {
    /// First bucket.
    pub from: u32,
    /// Last bucket, inclusive.
    pub to: u32,
    /// The shard that gets them.
    pub target: ShardId,
    /// Buckets frozen and flipped together (the longer a freeze may be,
    /// the fewer map versions a move needs).
    pub batch: u32,
}

/// A move as its journal row says.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Move {
    /// Its id.
    pub move_id: u64,
    /// First bucket.
    pub from_bucket: u16,
    /// Last bucket.
    pub to_bucket: u16,
    /// The target shard.
    pub target: u32,
    /// Buckets per freeze.
    pub batch: u16,
    /// `running`, `paused`, `aborting`, `done` or `aborted`.
    pub state: String,
    /// Last bucket of the first copy pass (-1: none yet).
    pub copied_to: i32,
    /// Last bucket flipped to the target and cleaned from its source.
    pub flipped_to: i32,
    /// Last bucket removed from its source.
    pub cleaned_to: i32,
    /// Rows written to the target so far.
    pub rows_copied: u64,
    /// The longest write freeze of a batch so far.
    pub longest_freeze_ms: u64,
    /// The process that runs it, `host:pid`.
    pub mover: String,
    /// Seconds since its mover last showed life.
    pub heartbeat_age_secs: Option<f64>,
    /// Last error or note.
    pub detail: String,
}

impl Move {
    fn buckets(&self) -> u32 {
        u32::from(self.to_bucket) - u32::from(self.from_bucket) + 1
    }

    /// Steps done of the move's 2 x buckets (copy, then flip), for a bar.
    pub fn steps_done(&self) -> u64 {
        let from = i64::from(self.from_bucket);
        let copied = (i64::from(self.copied_to) - from + 1).max(0);
        let flipped = (i64::from(self.flipped_to) - from + 1).max(0);
        (copied + flipped) as u64
    }

    /// The move's steps: every bucket copied once, then flipped.
    pub fn steps(&self) -> u64 {
        2 * u64::from(self.buckets())
    }

    fn is_live(&self) -> bool {
        matches!(self.state.as_str(), "running" | "paused" | "aborting")
    }

    fn mover_alive(&self) -> bool {
        self.heartbeat_age_secs.is_some_and(|age| age < LEASE_SECS)
    }
}

/// How a run of the mover ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Every bucket is on the target.
    Done,
    /// Paused by `--pause`; `--resume` goes on.
    Paused,
    /// Aborted: the buckets not flipped are as before.
    Aborted,
}

const SELECT_MOVE: &str = "SELECT move_id, from_bucket, to_bucket, target, batch, state, \
     copied_to, flipped_to, cleaned_to, rows_copied, longest_freeze_ms, mover, \
     CAST(TIMESTAMPDIFF(MICROSECOND, heartbeat_at, UTC_TIMESTAMP(3)) / 1e6 AS DOUBLE) \
     AS heartbeat_age_secs, detail FROM shard_moves";

/// The move not finished yet, if any (there is at most one).
pub async fn active(pools: &ShardPools) -> Result<Option<Move>> {
    let sql = format!("{SELECT_MOVE} WHERE state IN ('running', 'paused', 'aborting') LIMIT 1");
    Ok(sqlx::query_as(AssertSqlSafe(sql)).fetch_optional(shard_map::directory(pools)?).await?)
}

/// A move by id.
pub async fn get(pools: &ShardPools, move_id: u64) -> Result<Move> {
    let sql = format!("{SELECT_MOVE} WHERE move_id = ?");
    sqlx::query_as(AssertSqlSafe(sql))
        .bind(move_id)
        .fetch_optional(shard_map::directory(pools)?)
        .await?
        .ok_or_else(|| Error::NotFound(format!("shard move {move_id}")).into())
}

/// Records a new move, checked against the map in force. Fails when a move
/// is active, the target is not registered, or the range is on it already.
pub async fn start(pools: &ShardPools, request: MoveRequest) -> Result<Move> {
    let MoveRequest { from, to, target, batch } = request;
    if from > to || to >= BUCKETS {
        return Err(Error::invalid(
            "buckets",
            &format!("{from}..={to} must satisfy from <= to < {BUCKETS}"),
        )
        .into());
    }
    if batch == 0 || batch > BUCKETS {
        return Err(Error::invalid("batch", &format!("must be 1..={BUCKETS}, not {batch}")).into());
    }
    let directory = shard_map::directory(pools)?;
    let stored = latest(pools).await?;
    if !stored.map.shards().contains(&target) {
        return Err(Error::FailedPrecondition(format!(
            "shard {target} is not in the shard map: `notifyctl shard add --id {target}` first"
        ))
        .into());
    }
    if (from..=to).all(|bucket| stored.map.shard_of_bucket(bucket) == target) {
        return Err(Error::FailedPrecondition(format!(
            "buckets {from}..={to} are on shard {target} already"
        ))
        .into());
    }
    if let Some(current) = active(pools).await? {
        return Err(Error::FailedPrecondition(format!(
            "shard move {} ({}..={} to shard {}) is {}: resume or abort it first",
            current.move_id, current.from_bucket, current.to_bucket, current.target, current.state
        ))
        .into());
    }
    let created = sqlx::query(
        "INSERT INTO shard_moves (from_bucket, to_bucket, target, batch, state, copied_to, \
         flipped_to, cleaned_to) VALUES (?, ?, ?, ?, 'running', ?, ?, ?)",
    )
    .bind(from)
    .bind(to)
    .bind(target.0)
    .bind(batch)
    .bind(i64::from(from) - 1)
    .bind(i64::from(from) - 1)
    .bind(i64::from(from) - 1)
    .execute(directory)
    .await?;
    info!(move_id = created.last_insert_id(), from, to, %target, batch, "shard move recorded");
    get(pools, created.last_insert_id()).await
}

/// Asks the running mover to pause at its next step (between buckets or
/// batches, never inside a freeze).
pub async fn pause(pools: &ShardPools, move_id: u64) -> Result<()> {
    set_state(pools, move_id, &["running"], "paused", "paused by an operator").await
}

/// Aborts a move: a running mover aborts at its next step; with none
/// running, this does it now. Buckets not flipped end as they were before
/// the move; a freeze ends.
pub async fn abort(settings: &Settings, pools: &ShardPools, move_id: u64) -> Result<Ended> {
    let current = get(pools, move_id).await?;
    if !current.is_live() {
        return Err(Error::FailedPrecondition(format!(
            "shard move {move_id} is {} already",
            current.state
        ))
        .into());
    }
    if current.state == "running" && current.mover_alive() {
        set_state(pools, move_id, &["running"], "aborting", "abort requested").await?;
        return Ok(Ended::Paused);
    }
    let mut mover = Mover::new(settings, pools, current).await?;
    mover.abort().await?;
    Ok(Ended::Aborted)
}

async fn set_state(
    pools: &ShardPools,
    move_id: u64,
    from: &[&str],
    to: &str,
    detail: &str,
) -> Result<()> {
    let changed = sqlx::query(
        "UPDATE shard_moves SET state = ?, detail = ? WHERE move_id = ? AND FIND_IN_SET(state, ?)",
    )
    .bind(to)
    .bind(detail)
    .bind(move_id)
    .bind(from.join(","))
    .execute(shard_map::directory(pools)?)
    .await?;
    if changed.rows_affected() == 0 {
        let current = get(pools, move_id).await?;
        return Err(Error::FailedPrecondition(format!(
            "shard move {move_id} is {}, not {}",
            current.state,
            from.join(" or ")
        ))
        .into());
    }
    Ok(())
}

async fn latest(pools: &ShardPools) -> Result<StoredMap> {
    shard_map::latest(shard_map::directory(pools)?)
        .await?
        .ok_or_else(|| Error::FailedPrecondition("no shard map is stored yet".to_owned()).into())
}

/// What the mover reports as it goes.
#[derive(Debug, Clone)]
pub struct Progress {
    /// The journal row after the step.
    pub state: Move,
    /// What the step was.
    pub step: String,
}

/// Runs (or resumes) a move until it is done, paused or aborted, calling
/// `progress` after every step. Safe to call again after any failure or a
/// crash: every step can be repeated.
pub async fn run(
    settings: &Settings,
    pools: &ShardPools,
    move_id: u64,
    mut progress: impl FnMut(&Progress),
) -> Result<Ended> {
    let current = get(pools, move_id).await?;
    if !current.is_live() {
        return Err(Error::FailedPrecondition(format!(
            "shard move {move_id} is {}",
            current.state
        ))
        .into());
    }
    let mut mover = Mover::new(settings, pools, current).await?;
    mover.take_lease().await?;
    if mover.journal.state == "paused" {
        set_state(pools, move_id, &["paused"], "running", "resumed").await?;
    }
    // The lease is renewed in the background too, so that a long copy of
    // a run of buckets does not let another mover take over a live one.
    let heartbeat =
        tokio::spawn(keep_lease(shard_map::directory(pools)?.clone(), move_id, mover.name.clone()));
    let ended = mover.drive_through_setbacks(&mut progress).await;
    heartbeat.abort();
    if let Err(e) = &ended {
        let _ = mover.note(&e.to_string()).await;
    }
    ended
}

fn lease_lost(journal: &Move, mover: &str) -> Error {
    Error::FailedPrecondition(format!(
        "shard move {}: this mover ({mover}) lost its lease to {}",
        journal.move_id, journal.mover
    ))
}

/// Renews `mover`'s lease on a move; false when another mover holds it.
async fn renew_lease(directory: &MySqlPool, move_id: u64, mover: &str) -> Result<bool> {
    let renewed = sqlx::query(
        "UPDATE shard_moves SET heartbeat_at = UTC_TIMESTAMP(3) WHERE move_id = ? AND mover = ?",
    )
    .bind(move_id)
    .bind(mover)
    .execute(directory)
    .await?;
    Ok(renewed.rows_affected() == 1)
}

/// Renews the lease every tenth of [`LEASE_SECS`] until aborted or lost.
async fn keep_lease(directory: MySqlPool, move_id: u64, mover: String) {
    let mut every = tokio::time::interval(Duration::from_secs_f64(LEASE_SECS / 10.0));
    loop {
        every.tick().await;
        match renew_lease(&directory, move_id, &mover).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => warn!(error = %e, move_id, "could not renew the shard move lease"),
        }
    }
}

/// One table's columns, as the target describes them.
#[derive(Debug, Clone)]
struct Columns {
    table: MovedTable,
    /// Every stored column (not generated), with its SQL type.
    columns: Vec<(String, String)>,
}

impl Columns {
    fn list(&self) -> String {
        self.columns.iter().map(|(name, _)| format!("`{name}`")).collect::<Vec<_>>().join(", ")
    }

    fn json_of(&self, names: &[String]) -> String {
        let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
        format!("JSON_ARRAY({})", names.join(", "))
    }

    fn key_names(&self) -> Vec<String> {
        self.table.key.iter().map(|k| (*k).to_owned()).collect()
    }

    fn all_names(&self) -> Vec<String> {
        self.columns.iter().map(|(name, _)| name.clone()).collect()
    }

    /// `JSON_TABLE` columns reading `names` from arrays in that order.
    fn json_table(&self, names: &[String]) -> String {
        let columns: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(index, name)| {
                let kind = self.columns.iter().find(|(n, _)| n == name).map_or("text", |(_, t)| t);
                format!("`{name}` {kind} PATH '$[{index}]'")
            })
            .collect();
        format!("JSON_TABLE(?, '$[*]' COLUMNS ({})) AS j", columns.join(", "))
    }

    fn select_bucket(&self) -> String {
        format!(
            "SELECT {} AS k, {} AS v FROM `{}` WHERE bucket BETWEEN ? AND ?",
            self.json_of(&self.key_names()),
            self.json_of(&self.all_names()),
            self.table.name
        )
    }

    fn upsert(&self) -> String {
        let all = self.all_names();
        let updates: Vec<String> = all
            .iter()
            .filter(|name| !self.table.key.contains(&name.as_str()))
            .map(|name| match name.as_str() {
                // A revocation made on the target while a copy of the
                // unrevoked row was in flight stays: revoking is one-way.
                "revoked" => format!(
                    "`revoked` = GREATEST(`{0}`.`revoked`, VALUES(`revoked`))",
                    self.table.name
                ),
                "revoked_at" => format!(
                    "`revoked_at` = COALESCE(`{0}`.`revoked_at`, VALUES(`revoked_at`))",
                    self.table.name
                ),
                _ => format!("`{name}` = VALUES(`{name}`)"),
            })
            .collect();
        let list = self.list();
        format!(
            "INSERT INTO `{}` ({list}) SELECT {list} FROM {} ON DUPLICATE KEY UPDATE {}",
            self.table.name,
            self.json_table(&all),
            updates.join(", ")
        )
    }

    fn delete(&self) -> String {
        let keys = self.key_names();
        let on: Vec<String> = keys.iter().map(|k| format!("t.`{k}` = j.`{k}`")).collect();
        format!(
            "DELETE t FROM `{}` AS t JOIN {} ON {}",
            self.table.name,
            self.json_table(&keys),
            on.join(" AND ")
        )
    }
}

async fn describe(pool: &MySqlPool, table: MovedTable) -> Result<Columns> {
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(COLUMN_NAME AS CHAR), CAST(COLUMN_TYPE AS CHAR) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND EXTRA NOT LIKE '%GENERATED%' \
         ORDER BY ORDINAL_POSITION",
    )
    .bind(table.name)
    .fetch_all(pool)
    .await?;
    if columns.is_empty() {
        return Err(Error::Internal(format!(
            "table {} not found: migrate every shard",
            table.name
        ))
        .into());
    }
    Ok(Columns { table, columns })
}

/// Writes `rows` (JSON arrays) with `sql`, [`PAGE`] at a time.
async fn write_json(pool: &MySqlPool, sql: &str, rows: &[String]) -> Result<()> {
    for page in rows.chunks(PAGE) {
        let json = format!("[{}]", page.join(","));
        // An upsert or a delete of given rows: the same when run again.
        retrying("shard_move::write", || async {
            sqlx::query(AssertSqlSafe(sql.to_owned())).bind(json.as_str()).execute(pool).await?;
            Ok::<_, crate::error::Error>(())
        })
        .await?;
    }
    Ok(())
}

/// Makes the target's rows of buckets `first..=last` in one table equal
/// the source's; returns the rows written or deleted.
async fn sync_buckets(
    source: &MySqlPool,
    target: &MySqlPool,
    columns: &Columns,
    (first, last): (u32, u32),
) -> Result<u64> {
    let select = columns.select_bucket();
    let mut present: HashMap<String, String> = sqlx::query_as(AssertSqlSafe(select.clone()))
        .bind(first)
        .bind(last)
        .fetch_all(target)
        .await?
        .into_iter()
        .collect();
    let mut changed = Vec::new();
    let mut rows = sqlx::query_as::<_, (String, String)>(AssertSqlSafe(select))
        .bind(first)
        .bind(last)
        .fetch(source);
    while let Some((key, row)) = rows.try_next().await? {
        if present.remove(&key).as_ref() != Some(&row) {
            changed.push(row);
        }
    }
    drop(rows);
    write_json(target, &columns.upsert(), &changed).await?;
    let gone: Vec<String> = present.into_keys().collect();
    write_json(target, &columns.delete(), &gone).await?;
    Ok((changed.len() + gone.len()) as u64)
}

/// Copies (or refreshes) the content copies of `message_ids` from the
/// source to the target.
async fn sync_contents(
    source: &MySqlPool,
    target: &MySqlPool,
    contents: &Columns,
    message_ids: &[u64],
) -> Result<()> {
    let json = contents.json_of(&contents.all_names());
    for page in message_ids.chunks(PAGE) {
        let ids = serde_json::to_string(page).map_err(|e| Error::Internal(e.to_string()))?;
        let sql = format!(
            "SELECT {json} FROM message_contents WHERE message_id IN \
             (SELECT id FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS ids)"
        );
        let rows: Vec<String> =
            sqlx::query_scalar(AssertSqlSafe(sql)).bind(ids).fetch_all(source).await?;
        write_json(target, &contents.upsert(), &rows).await?;
    }
    Ok(())
}

/// Fills in the bucket of idempotency keys stored before it was kept.
async fn backfill_key_buckets(pool: &MySqlPool) -> Result<()> {
    loop {
        let keys: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT client, sender, idempotency_key FROM idempotency_keys \
             WHERE bucket IS NULL LIMIT 500",
        )
        .fetch_all(pool)
        .await?;
        if keys.is_empty() {
            return Ok(());
        }
        let rows: Vec<serde_json::Value> = keys
            .iter()
            .map(|(client, sender, key)| {
                let bucket =
                    bucket_of_key(&crate::db::messages::idempotency_route(client, sender, key));
                serde_json::json!([client, sender, key, bucket])
            })
            .collect();
        sqlx::query(
            "UPDATE idempotency_keys AS k JOIN JSON_TABLE(?, '$[*]' COLUMNS ( \
             client VARCHAR(64) PATH '$[0]', sender VARCHAR(64) PATH '$[1]', \
             idempotency_key VARCHAR(128) PATH '$[2]', bucket SMALLINT UNSIGNED PATH '$[3]')) AS j \
             ON k.client = j.client AND k.sender = j.sender AND k.idempotency_key = j.idempotency_key \
             SET k.bucket = j.bucket",
        )
        .bind(serde_json::Value::Array(rows).to_string())
        .execute(pool)
        .await?;
    }
}

struct Mover<'p> {
    settings: &'p Settings,
    pools: &'p ShardPools,
    journal: Move,
    name: String,
    tables: Vec<Columns>,
    contents: Columns,
}

impl<'p> Mover<'p> {
    async fn new(settings: &'p Settings, pools: &'p ShardPools, journal: Move) -> Result<Self> {
        let target = pools.get(ShardId(journal.target)).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "shard {} is not in database.shards of this config",
                journal.target
            ))
        })?;
        let mut tables = Vec::with_capacity(TABLES.len());
        for table in TABLES {
            tables.push(describe(target, table).await?);
        }
        let contents =
            describe(target, MovedTable { name: "message_contents", key: &["message_id"] }).await?;
        let name = format!("{}:{}", notify_domain::ids::hostname(), std::process::id());
        Ok(Self { settings, pools, journal, name, tables, contents })
    }

    fn target(&self) -> ShardId {
        ShardId(self.journal.target)
    }

    fn pool(&self, shard: ShardId) -> notify_domain::Result<&'p MySqlPool> {
        self.pools.get(shard).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "shard {shard} is not in database.shards of this config"
            ))
        })
    }

    fn directory(&self) -> notify_domain::Result<&'p MySqlPool> {
        shard_map::directory(self.pools)
    }

    /// Takes the move over unless another live mover runs it.
    async fn take_lease(&mut self) -> Result<()> {
        let taken = sqlx::query(
            "UPDATE shard_moves SET mover = ?, heartbeat_at = UTC_TIMESTAMP(3) WHERE move_id = ? \
             AND (mover = ? OR heartbeat_at IS NULL \
                  OR heartbeat_at < UTC_TIMESTAMP(3) - INTERVAL ? SECOND)",
        )
        .bind(&self.name)
        .bind(self.journal.move_id)
        .bind(&self.name)
        .bind(LEASE_SECS)
        .execute(self.directory()?)
        .await?;
        if taken.rows_affected() == 0 {
            return Err(Error::FailedPrecondition(format!(
                "shard move {} is run by {} (seen {:.0} s ago)",
                self.journal.move_id,
                self.journal.mover,
                self.journal.heartbeat_age_secs.unwrap_or_default()
            ))
            .into());
        }
        Ok(())
    }

    /// Saves progress, renews the lease and reads the state an operator
    /// may have changed. Fails when another mover took the move over.
    async fn checkpoint(&mut self) -> Result<()> {
        let saved = sqlx::query(
            "UPDATE shard_moves SET copied_to = ?, flipped_to = ?, cleaned_to = ?, \
             rows_copied = ?, longest_freeze_ms = ?, heartbeat_at = UTC_TIMESTAMP(3) \
             WHERE move_id = ? AND mover = ?",
        )
        .bind(self.journal.copied_to)
        .bind(self.journal.flipped_to)
        .bind(self.journal.cleaned_to)
        .bind(self.journal.rows_copied)
        .bind(self.journal.longest_freeze_ms)
        .bind(self.journal.move_id)
        .bind(&self.name)
        .execute(self.directory()?)
        .await?;
        self.journal = get(self.pools, self.journal.move_id).await?;
        if saved.rows_affected() == 0 {
            return Err(lease_lost(&self.journal, &self.name).into());
        }
        Ok(())
    }

    /// Fails unless this mover still holds the lease (renewing it): asked
    /// before every write to a shard or the map, so that a mover taken
    /// over while it hung cannot undo its successor's work.
    async fn hold_lease(&self) -> Result<()> {
        if renew_lease(self.directory()?, self.journal.move_id, &self.name).await? {
            return Ok(());
        }
        Err(lease_lost(&get(self.pools, self.journal.move_id).await?, &self.name).into())
    }

    async fn note(&self, detail: &str) -> Result<()> {
        let detail: String = detail.chars().take(500).collect();
        sqlx::query("UPDATE shard_moves SET detail = ? WHERE move_id = ?")
            .bind(detail)
            .bind(self.journal.move_id)
            .execute(self.directory()?)
            .await?;
        Ok(())
    }

    async fn finish(&mut self, state: &str, detail: &str) -> Result<()> {
        sqlx::query("UPDATE shard_moves SET state = ?, detail = ? WHERE move_id = ?")
            .bind(state)
            .bind(detail)
            .bind(self.journal.move_id)
            .execute(self.directory()?)
            .await?;
        self.journal = get(self.pools, self.journal.move_id).await?;
        Ok(())
    }

    /// Ends a run early when an operator paused or aborted the move.
    async fn interrupted(&mut self) -> Result<Option<Ended>> {
        match self.journal.state.as_str() {
            "paused" => Ok(Some(Ended::Paused)),
            "aborting" => {
                self.abort().await?;
                Ok(Some(Ended::Aborted))
            }
            _ => Ok(None),
        }
    }

    /// Drives the move, and drives it again from its journal (as
    /// `--resume` would) after a database failure that may pass: a
    /// deadlock, a lock wait timeout, a lost connection, a shard that does
    /// not answer. Every step may run again, so a failure midway costs only
    /// the step it hit. Drives it again at most [`SETBACKS`] times in a row
    /// with no step done between them, then the move is left to `--resume`.
    async fn drive_through_setbacks(
        &mut self,
        progress: &mut impl FnMut(&Progress),
    ) -> Result<Ended> {
        let mut waits = Reconnect::new(SETBACK_MIN_WAIT, SETBACK_MAX_WAIT);
        let (move_id, mut setbacks) = (self.journal.move_id, 0);
        loop {
            let before = self.journal.steps_done();
            let error = match self.drive(progress).await {
                Err(e) if e.db_failure().is_some_and(DbFailure::is_transient) => e,
                ended => return ended,
            };
            if self.journal.steps_done() > before {
                setbacks = 0;
                waits.reset();
            }
            setbacks += 1;
            if setbacks > SETBACKS {
                return Err(error);
            }
            warn!(move_id, %error, setbacks, "a shard move step failed; driving it again");
            let _ = self.note(&format!("driven again after: {error}")).await;
            tokio::time::sleep(waits.next_delay()).await;
            // The journal as stored, with what an operator changed meanwhile
            // (left as it was when the directory does not answer: the next
            // drive's first write fails the same way).
            if let Ok(journal) = get(self.pools, move_id).await {
                self.journal = journal;
            }
            match self.journal.state.as_str() {
                "running" | "aborting" => {}
                "paused" => return Ok(Ended::Paused),
                state => {
                    let refused = format!("shard move {move_id} is {state}");
                    return Err(Error::FailedPrecondition(refused).into());
                }
            }
        }
    }

    async fn drive(&mut self, progress: &mut impl FnMut(&Progress)) -> Result<Ended> {
        for shard in self.pools.iter().map(|(shard, _)| shard).collect::<Vec<_>>() {
            backfill_key_buckets(self.pool(shard)?).await?;
        }
        let (from, to) = (u32::from(self.journal.from_bucket), u32::from(self.journal.to_bucket));
        self.copy_announcements(from, to).await?;
        // 1. The first copy, RUN buckets at a time, writes going on.
        while self.journal.copied_to < to as i32 {
            let first = (self.journal.copied_to + 1) as u32;
            let last = (first + RUN - 1).min(to);
            let map = latest(self.pools).await?.map;
            let rows = self.copy(&map, first, last).await?;
            self.journal.copied_to = last as i32;
            self.journal.rows_copied += rows;
            self.checkpoint().await?;
            let step = format!("copied buckets {first}..={last}");
            progress(&Progress { state: self.journal.clone(), step });
            if let Some(ended) = self.interrupted().await? {
                return Ok(ended);
            }
        }
        // 2. Batch by batch: catch up, freeze, last copy, flip, clean.
        let batch = u32::from(self.journal.batch);
        while self.journal.flipped_to < to as i32 {
            let first = (self.journal.flipped_to + 1) as u32;
            let last = (first + batch - 1).min(to);
            self.move_batch(first, last).await?;
            progress(&Progress {
                state: self.journal.clone(),
                step: format!("moved buckets {first}..={last}"),
            });
            if let Some(ended) = self.interrupted().await? {
                return Ok(ended);
            }
        }
        let detail = format!(
            "buckets {from}..={to} on shard {}; {} rows copied; longest freeze {} ms",
            self.target(),
            self.journal.rows_copied,
            self.journal.longest_freeze_ms
        );
        self.finish("done", &detail).await?;
        info!(move_id = self.journal.move_id, %detail, "shard move done");
        Ok(Ended::Done)
    }

    /// Copies the content copies of every announcement from the shards
    /// the range moves away from: announcements are stored once per shard,
    /// and a target added later needs them for the users it takes over.
    async fn copy_announcements(&self, from: u32, to: u32) -> Result<()> {
        let mut ids = Vec::new();
        for (_, pool) in self.pools.iter() {
            let found: Vec<u64> = sqlx::query_scalar(concat!(
                "SELECT message_id FROM messages WHERE audience = ",
                crate::audience!(ALL_USERS)
            ))
            .fetch_all(pool)
            .await?;
            ids.extend(found);
        }
        let map = latest(self.pools).await?.map;
        let mut sources: Vec<ShardId> = (from..=to).map(|b| map.shard_of_bucket(b)).collect();
        sources.sort_unstable();
        sources.dedup();
        let target = self.pool(self.target())?;
        for source in sources.into_iter().filter(|s| *s != self.target()) {
            sync_contents(self.pool(source)?, target, &self.contents, &ids).await?;
        }
        Ok(())
    }

    /// Syncs buckets `first..=last` that `map` does not put on the target
    /// from their owners to the target, [`RUN`] buckets of one owner per
    /// statement at most; returns the rows written. A run the stored map
    /// has given to the target meanwhile is left alone (a sync from its
    /// cleaned source would delete the target's rows).
    async fn copy(&self, map: &ShardMap, first: u32, last: u32) -> Result<u64> {
        let target = self.pool(self.target())?;
        let mut written = 0;
        let mut bucket = first;
        while bucket <= last {
            let owner = map.shard_of_bucket(bucket);
            let mut end = bucket;
            while end < last && end + 1 - bucket < RUN && map.shard_of_bucket(end + 1) == owner {
                end += 1;
            }
            let run = (bucket, end);
            bucket = end + 1;
            if owner == self.target() {
                continue;
            }
            self.hold_lease().await?;
            let now = latest(self.pools).await?.map;
            if (run.0..=run.1).any(|b| now.shard_of_bucket(b) == self.target()) {
                warn!(
                    move_id = self.journal.move_id,
                    ?run,
                    "buckets flipped meanwhile, not copied"
                );
                continue;
            }
            let source = self.pool(owner)?;
            let needed: Vec<u64> = sqlx::query_scalar(
                "SELECT DISTINCT message_id FROM message_items WHERE bucket BETWEEN ? AND ? \
                 UNION SELECT message_id FROM messages WHERE bucket BETWEEN ? AND ?",
            )
            .bind(run.0)
            .bind(run.1)
            .bind(run.0)
            .bind(run.1)
            .fetch_all(source)
            .await?;
            sync_contents(source, target, &self.contents, &needed).await?;
            for columns in &self.tables {
                written += sync_buckets(source, target, columns, run).await?;
            }
        }
        Ok(written)
    }

    async fn move_batch(&mut self, first: u32, last: u32) -> Result<()> {
        let stored = latest(self.pools).await?;
        let frozen = BucketSet::range(first, last);
        let flipped = stored
            .map
            .with_range(self.target(), first, last)
            .map_err(|e| Error::Internal(e.to_string()))?;
        let needs_flip = (first..=last).any(|b| stored.map.shard_of_bucket(b) != self.target());
        if needs_flip {
            let map = &stored.map;
            let mut version = stored.version;
            // After a mover died during this batch's freeze, go on from it.
            if stored.frozen != frozen {
                // Catch up while writes go on, so the freeze copies little.
                self.journal.rows_copied += self.copy(map, first, last).await?;
                self.checkpoint().await?;
                let reason =
                    format!("shard move {}: freeze {first}..={last}", self.journal.move_id);
                version =
                    shard_map::append_frozen(self.pools, version, map, frozen, &reason).await?;
            }
            let frozen_at = Instant::now();
            if let Err(e) = self.wait_for_replicas(version).await {
                // Do not leave writers waiting on a freeze nobody finishes.
                let reason = format!("shard move {}: freeze ended, {e}", self.journal.move_id);
                shard_map::append(self.pools, version, map, &reason).await?;
                return Err(e);
            }
            self.journal.rows_copied += self.copy(map, first, last).await?;
            let reason = format!(
                "shard move {}: buckets {first}..={last} to shard {}",
                self.journal.move_id,
                self.target()
            );
            let flip = shard_map::append(self.pools, version, &flipped, &reason).await?;
            let freeze_ms = frozen_at.elapsed().as_millis() as u64;
            info!(move_id = self.journal.move_id, first, last, freeze_ms, "buckets flipped");
            metrics::histogram!("notify_shard_move_freeze_seconds").record(freeze_ms as f64 / 1e3);
            self.journal.longest_freeze_ms = self.journal.longest_freeze_ms.max(freeze_ms);
            self.wait_for_replicas(flip).await?;
        } else {
            // Flipped by a run that died (or gave up waiting) before its
            // clean: replicas may still write by the older map.
            self.wait_for_replicas(stored.version).await?;
        }
        // Nothing routes to the old owners now: remove the batch there (and
        // anywhere else but the target, after a crash of an earlier run).
        self.hold_lease().await?;
        for (shard, pool) in self.pools.iter() {
            if shard != self.target() {
                self.clean(pool, first, last).await?;
            }
        }
        self.journal.flipped_to = last as i32;
        self.journal.cleaned_to = last as i32;
        self.journal.copied_to = self.journal.copied_to.max(last as i32);
        self.checkpoint().await
    }

    /// Deletes every moved table's rows of buckets `first..=last` on `pool`.
    async fn clean(&self, pool: &MySqlPool, first: u32, last: u32) -> Result<()> {
        for columns in self.tables.iter().rev() {
            let sql = format!(
                "DELETE FROM `{}` WHERE bucket BETWEEN ? AND ? LIMIT 5000",
                columns.table.name
            );
            let delete = || async {
                let query = sqlx::query(AssertSqlSafe(sql.clone())).bind(first).bind(last);
                Ok::<_, crate::error::Error>(query.execute(pool).await?.rows_affected())
            };
            while retrying("shard_move::clean", delete).await? > 0 {}
        }
        Ok(())
    }

    /// Waits until every live replica reports `version` or newer. A
    /// replica not seen for twice `database.replica_lease_secs` is gone:
    /// its writes have waited for a report for as long again by then.
    async fn wait_for_replicas(&mut self, version: u64) -> Result<()> {
        let refresh = Duration::from_millis(self.settings.database.shard_map_refresh_ms);
        let gone_after = 2.0 * self.settings.database.replica_lease_secs as f64;
        let patience = Duration::from_secs(self.settings.database.shard_move_wait_secs);
        let started = Instant::now();
        let poll = refresh.min(Duration::from_millis(100));
        loop {
            let replicas = shard_map::replicas(self.directory()?).await?;
            let behind: Vec<_> = replicas
                .iter()
                .filter(|r| r.age_secs < gone_after && r.version < version)
                .collect();
            if behind.is_empty() {
                return Ok(());
            }
            if started.elapsed() > patience {
                let names: Vec<String> =
                    behind.iter().map(|r| format!("{} (at {})", r.replica, r.version)).collect();
                warn!(version, behind = ?names, "replicas did not take a shard map version");
                return Err(Error::Unavailable(format!(
                    "replicas still behind shard map version {version} after \
                     database.shard_move_wait_secs ({} s): {}",
                    patience.as_secs(),
                    names.join(", ")
                ))
                .into());
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Ends a freeze and removes the target's copies of every bucket not
    /// flipped; the move ends `aborted`.
    async fn abort(&mut self) -> Result<()> {
        let stored = latest(self.pools).await?;
        if !stored.frozen.is_empty() {
            let reason = format!("shard move {}: aborted, freeze ended", self.journal.move_id);
            shard_map::append(self.pools, stored.version, &stored.map, &reason).await?;
        }
        let target = self.pool(self.target())?;
        let first = (self.journal.flipped_to + 1).max(i32::from(self.journal.from_bucket)) as u32;
        let last = u32::from(self.journal.to_bucket);
        if (first..=last).any(|bucket| stored.map.shard_of_bucket(bucket) == self.target()) {
            // Sources of buckets flipped by a mover that died are cleaned
            // below: only once no replica writes by an older map.
            self.wait_for_replicas(stored.version).await?;
        }
        for bucket in first..=last {
            if stored.map.shard_of_bucket(bucket) != self.target() {
                self.clean(target, bucket, bucket).await?;
                continue;
            }
            // Flipped by a mover that died before it cleaned: finish that.
            for (shard, pool) in self.pools.iter() {
                if shard != self.target() {
                    self.clean(pool, bucket, bucket).await?;
                }
            }
        }
        let detail = format!("aborted; buckets {first}..={last} not flipped are on their shards");
        self.finish("aborted", &detail).await?;
        info!(move_id = self.journal.move_id, %detail, "shard move aborted");
        Ok(())
    }
}
