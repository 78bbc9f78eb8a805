//! A test's shard databases, made from a migrated template.
//!
//! `migrate_all` replays every migration (eighteen files, ALTERs among them)
//! on each of a test's four databases: about 3 s of DDL per test on the
//! 2-core machine, most of what `spawn_app` costs. Instead each MariaDB
//! server keeps one template per set of migrations,
//! `notifytest_schema_<hash>`, migrated once, under a lock held on the
//! server so that test processes starting together do not race. A test's
//! database is then `CREATE TABLE ... LIKE` of each template table (indexes,
//! partitions, generated columns and defaults come along) plus the
//! template's `_sqlx_migrations` and `_notify_contract_migrations` rows,
//! which the migrators read as every migration applied (the contract step's
//! too): one round trip per shard, the shards at once.
//!
//! The migrations themselves stay tested: the tests of migrating call
//! `migrate_all`, and so does this when a database exists already (a test
//! that migrated before it spawned). A template of another set of
//! migrations (an older checkout's) is dropped when this one is made.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use notify_domain::Settings;
use notify_store::db::contract::{CONTRACT, CONTRACT_TABLE};
use notify_store::db::{DATABASE_OPTIONS, MIGRATOR, server_options};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::OnceCell;
use tokio::task::JoinSet;

/// Template databases' names start with this (and so never with the
/// `notify_t` of the tests' own, which the reaper drops after an hour).
const PREFIX: &str = "notifytest_schema_";

/// A migrated template on one server: its name and tables.
struct Template {
    name: String,
    tables: Vec<String>,
}

/// Templates by server url, each made once per process.
type Templates = Mutex<BTreeMap<String, Arc<OnceCell<Arc<Template>>>>>;
static TEMPLATES: Templates = Mutex::new(BTreeMap::new());

/// Creates the settings' shard databases, migrated; `migrate_all` when one of
/// them exists already.
pub async fn create_shards(settings: &Settings) {
    let mut creates = JoinSet::new();
    for shard in &settings.database.shards {
        let options = server_options(settings, shard).expect("shard's server options");
        // Made here, not in the task: the migrator's future is not `Send`
        // for every lifetime, as a spawned task must be.
        let template = template(&settings.shard_server_url(shard), &options)
            .await
            .unwrap_or_else(|e| panic!("template database: {e:#}"));
        let database = shard.database.clone();
        creates.spawn(async move { create_shard(&template, &options, &database).await });
    }
    let mut exists = false;
    while let Some(created) = creates.join_next().await {
        match created.expect("shard creation ran") {
            Ok(created) => exists |= !created,
            Err(e) => panic!("shard database from the template: {e:#}"),
        }
    }
    if exists {
        notify_store::db::migrate_all(settings).await.expect("shards migrate");
    }
}

/// Creates `database` from the server's template; false when it exists.
async fn create_shard(
    template: &Template,
    options: &MySqlConnectOptions,
    database: &str,
) -> anyhow::Result<bool> {
    let mut conn = MySqlConnection::connect_with(options).await?;
    let found: Option<String> = sqlx::query_scalar(
        "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
    )
    .bind(database)
    .fetch_optional(&mut conn)
    .await?;
    if found.is_some() {
        conn.close().await?;
        return Ok(false);
    }
    // Names are [A-Za-z0-9_] (the settings validate shard databases; the
    // template's and its tables' come from this module and the migrations).
    let from = &template.name;
    let mut statements = format!("CREATE DATABASE `{database}` {DATABASE_OPTIONS};");
    for table in &template.tables {
        statements
            .push_str(&format!("CREATE TABLE `{database}`.`{table}` LIKE `{from}`.`{table}`;"));
    }
    for applied in ["_sqlx_migrations", CONTRACT_TABLE] {
        statements.push_str(&format!(
            "INSERT INTO `{database}`.`{applied}` SELECT * FROM `{from}`.`{applied}`;"
        ));
    }
    sqlx::raw_sql(AssertSqlSafe(statements)).execute(&mut conn).await?;
    conn.close().await?;
    Ok(true)
}

/// The server's template, made (or checked) once per process.
async fn template(server: &str, options: &MySqlConnectOptions) -> anyhow::Result<Arc<Template>> {
    let cell =
        TEMPLATES.lock().expect("templates lock").entry(server.to_owned()).or_default().clone();
    cell.get_or_try_init(|| async { make_template(options).await.map(Arc::new) }).await.cloned()
}

/// Migrates the template of this set of migrations on the server (a no-op
/// when another process did) under the server-wide lock `notifytest_schema`,
/// and drops the templates of other sets.
async fn make_template(options: &MySqlConnectOptions) -> anyhow::Result<Template> {
    let name = format!("{PREFIX}{:016x}", migrations_hash());
    let mut conn = MySqlConnection::connect_with(options).await?;
    let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK('notifytest_schema', 300)")
        .fetch_one(&mut conn)
        .await?;
    anyhow::ensure!(locked == Some(1), "GET_LOCK('notifytest_schema') timed out after 300 s");
    let made = migrate_template(&mut conn, options, &name).await;
    sqlx::query("DO RELEASE_LOCK('notifytest_schema')").execute(&mut conn).await?;
    conn.close().await?;
    let tables = made?;
    Ok(Template { name, tables })
}

async fn migrate_template(
    conn: &mut MySqlConnection,
    options: &MySqlConnectOptions,
    name: &str,
) -> anyhow::Result<Vec<String>> {
    let create = format!("CREATE DATABASE IF NOT EXISTS `{name}` {DATABASE_OPTIONS}");
    sqlx::raw_sql(AssertSqlSafe(create.clone())).execute(&mut *conn).await?;
    let template = options.clone().database(name);
    let mut migrating = MySqlConnection::connect_with(&template).await?;
    // Expand and contract both: no replica of an older build uses a test's
    // databases.
    if migrate(&mut migrating).await.is_err() {
        // A process killed while it migrated left a migration half-applied
        // (dirty): start the template over.
        migrating.close().await?;
        let drop = format!("DROP DATABASE `{name}`");
        sqlx::raw_sql(AssertSqlSafe(drop)).execute(&mut *conn).await?;
        sqlx::raw_sql(AssertSqlSafe(create)).execute(&mut *conn).await?;
        migrating = MySqlConnection::connect_with(&template).await?;
        migrate(&mut migrating).await?;
    }
    migrating.close().await?;
    let stale: Vec<String> = sqlx::query_scalar(
        "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA \
         WHERE SCHEMA_NAME LIKE 'notifytest\\_schema\\_%' AND SCHEMA_NAME <> ?",
    )
    .bind(name)
    .fetch_all(&mut *conn)
    .await?;
    for database in stale {
        let drop = format!("DROP DATABASE IF EXISTS `{database}`");
        sqlx::raw_sql(AssertSqlSafe(drop)).execute(&mut *conn).await?;
    }
    let tables = sqlx::query_scalar(
        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? ORDER BY TABLE_NAME",
    )
    .bind(name)
    .fetch_all(&mut *conn)
    .await?;
    Ok(tables)
}

async fn migrate(conn: &mut MySqlConnection) -> anyhow::Result<()> {
    MIGRATOR.run(&mut *conn).await?;
    CONTRACT.run(&mut *conn).await?;
    Ok(())
}

/// FNV-1a over every migration's version and checksum (expand, then contract): the same for the same
/// migrations in any build, another when one is added or changed.
fn migrations_hash() -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for migration in MIGRATOR.iter().chain(CONTRACT.iter()) {
        for byte in migration.version.to_le_bytes().iter().chain(migration.checksum.iter()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}
