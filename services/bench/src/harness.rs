//! Shared set-up and tear-down: fresh names, a config file, `notifyctl
//! migrate`, `notify-worker` and `notify-api` as child processes, MariaDB
//! helpers, and best-effort cleanup of everything created.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use notify_core::queue::{self, Topology};
use notify_domain::Settings;
use notify_domain::settings::ShardSettings;
use notify_proto::v1;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_testkit::metrics::MetricsPage;
use notify_testkit::servers::free_port;
use redis::AsyncCommands;
use secrecy::ExposeSecret;
use shard_router::ShardId;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection, MySqlConnection};
use tokio::process::{Child, Command};
use tonic::transport::Channel;

use crate::{config_file, metrics};

/// A fresh tag for database, queue and key names: `bench{8 hex}`.
pub fn fresh_tag() -> String {
    format!("bench{:08x}", rand::random::<u32>())
}

/// `base` with fresh names under `tag` and `shards` shards (even split).
pub fn settings_for(base: &Settings, tag: &str, shards: u32) -> Settings {
    let mut s = base.clone();
    s.database.shards = (0..shards)
        .map(|i| ShardSettings {
            id: ShardId(i),
            database: format!("notify_{tag}_{i}"),
            url: None,
            url_file: None,
        })
        .collect();
    s.database.bucket_ranges = Vec::new();
    s.rabbitmq.prefix = format!("notify_{tag}");
    s.redis.key_prefix = format!("notify_{tag}:");
    s.log.filter = "warn".into();
    s
}

/// The release binaries next to this one.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub(crate) api: PathBuf,
    pub(crate) worker: PathBuf,
    ctl: PathBuf,
}

impl Binaries {
    /// Finds `notify-api`, `notify-worker` and `notifyctl` in the directory
    /// of the running executable.
    pub fn locate() -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("current_exe")?;
        let dir = exe.parent().ok_or_else(|| anyhow!("{exe:?} has no directory"))?;
        let bins = Self {
            api: dir.join("notify-api"),
            worker: dir.join("notify-worker"),
            ctl: dir.join("notifyctl"),
        };
        for bin in [&bins.api, &bins.worker, &bins.ctl] {
            if !bin.is_file() {
                bail!(
                    "{} not found next to {}; build them together: \
                     cargo build --release -p notify-bench -p notify-api -p notify-worker -p notifyctl",
                    bin.display(),
                    exe.display()
                );
            }
        }
        if !dir.ends_with("release") {
            eprintln!("warning: {} is not a release build directory", dir.display());
        }
        Ok(bins)
    }
}

/// A child process with its log file.
struct ChildProc {
    name: &'static str,
    pid: u32,
    child: Child,
    log: PathBuf,
}

/// Everything one benchmark run owns; [`Env::cleanup`] removes it all.
pub struct Env {
    /// Settings of the services under test (fresh names).
    pub settings: Settings,
    /// Working directory (config files, child logs).
    pub dir: PathBuf,
    /// Removes `dir` when dropped; kept (taken out) after a failed run.
    temp: Option<tempfile::TempDir>,
    bins: Binaries,
    config: PathBuf,
    children: Vec<ChildProc>,
    /// Settings whose shard databases may exist and must be dropped.
    databases: Vec<Settings>,
    /// Settings whose broker topology and redis keys must be removed.
    brokers: Vec<Settings>,
    failed: bool,
}

impl Env {
    /// Picks ports, writes the config file. Creates nothing on the servers yet.
    pub fn new(mut settings: Settings) -> anyhow::Result<Self> {
        let bins = Binaries::locate()?;
        settings.api.listen = format!("127.0.0.1:{}", free_port());
        settings.api.metrics_listen = format!("127.0.0.1:{}", free_port());
        settings.worker.metrics_listen = format!("127.0.0.1:{}", free_port());
        settings.console.listen = format!("127.0.0.1:{}", free_port());
        settings.validate().map_err(|e| anyhow!("bench settings: {e}"))?;
        let temp = tempfile::Builder::new()
            .prefix(&format!("notify-bench-{}-", settings.rabbitmq.prefix))
            .tempdir()
            .context("create the run's directory")?;
        let dir = temp.path().to_owned();
        let config = dir.join("notify.toml");
        std::fs::write(&config, config_file::to_toml(&settings))?;
        Ok(Self {
            databases: vec![settings.clone()],
            brokers: vec![settings.clone()],
            settings,
            dir,
            temp: Some(temp),
            bins,
            config,
            children: Vec::new(),
            failed: false,
        })
    }

    /// Cleans up after a run and prints its report; a failed run keeps its logs.
    pub async fn finish(&mut self, outcome: anyhow::Result<String>) -> anyhow::Result<()> {
        if outcome.is_err() {
            self.set_failed();
        }
        self.cleanup().await;
        println!("{}", outcome?);
        Ok(())
    }

    /// Marks the run failed: logs are kept.
    pub fn set_failed(&mut self) {
        self.failed = true;
    }

    /// Runs `notifyctl migrate --contract` for `settings` (creating its databases);
    /// the databases are dropped at cleanup.
    pub async fn migrate(&mut self, settings: &Settings, file_name: &str) -> anyhow::Result<()> {
        let path = if db_names(settings) == db_names(&self.settings) {
            self.config.clone()
        } else {
            let path = self.dir.join(file_name);
            std::fs::write(&path, config_file::to_toml(settings))?;
            path
        };
        if !self.databases.iter().any(|s| db_names(s) == db_names(settings)) {
            self.databases.push(settings.clone());
        }
        let mut cmd = Command::new(&self.bins.ctl);
        // Contract too: the schema a deployment has once its rollout ended.
        cmd.args(["migrate", "--contract"]);
        child_env(&mut cmd, &path);
        let out = cmd.output().await.context("run notifyctl migrate")?;
        if !out.status.success() {
            bail!(
                "notifyctl migrate failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Migrates the service databases, starts the worker then the api, and
    /// waits until both listen.
    pub async fn start_services(&mut self) -> anyhow::Result<()> {
        let settings = self.settings.clone();
        self.migrate(&settings, "notify.toml").await?;
        let worker = self.spawn("notify-worker", self.bins.worker.clone())?;
        self.children.push(worker);
        let worker_metrics: SocketAddr = self.settings.worker.metrics_listen.parse()?;
        self.wait_port("notify-worker", worker_metrics).await?;
        let api = self.spawn("notify-api", self.bins.api.clone())?;
        self.children.push(api);
        let api_addr: SocketAddr = self.settings.api.listen.parse()?;
        self.wait_port("notify-api", api_addr).await?;
        // The port is bound before tonic serves; make sure a channel works.
        self.channel().await?;
        for name in ["notify-api", "notify-worker"] {
            self.ensure_optimized(name).await?;
        }
        Ok(())
    }

    /// Refuses a service built with debug assertions: `scripts/test` builds
    /// the workspace's binaries unoptimized into `target/release`, where a
    /// release build left them, and a run on those measures a build several
    /// times slower than the one users run.
    async fn ensure_optimized(&self, name: &str) -> anyhow::Result<()> {
        ensure_release(name, &self.scrape(name).await)
    }

    /// Starts `notify-edge` (the release binary next to this one) over the
    /// same databases, queues and keys, its `[edge]` section (`edge_toml`,
    /// with `listen` and `metrics_listen`) appended to the config; waits
    /// until its `/readyz` answers 200 (the events stream is read) and
    /// refuses a build with debug assertions. Returns its pid.
    pub async fn start_edge(
        &mut self,
        edge_toml: &str,
        metrics: SocketAddr,
    ) -> anyhow::Result<u32> {
        let bin = self.bins.api.with_file_name("notify-edge");
        if !bin.is_file() {
            bail!(
                "{} not found next to notify-bench; build them together: cargo build --release \
                 -p notify-bench -p notify-api -p notify-worker -p notify-edge -p notifyctl",
                bin.display()
            );
        }
        let config = self.dir.join("notify-edge.toml");
        std::fs::write(&config, format!("{}\n{edge_toml}", config_file::to_toml(&self.settings)))?;
        let child = self.spawn_with("notify-edge", bin, &config)?;
        let pid = child.pid;
        self.children.push(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = notify_testkit::try_http_get(metrics, "/readyz").await;
            if ready.is_ok_and(|(status, _)| status == 200) {
                break;
            }
            self.check_children()?;
            if Instant::now() > deadline {
                bail!("notify-edge not ready on {metrics} within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let page = metrics::scrape(&metrics.to_string()).await;
        ensure_release("notify-edge", &page)?;
        Ok(pid)
    }

    /// Starts one more api over the same databases, queues and keys, with
    /// its own ports and `extra` TOML appended to its config (an `[auth]`
    /// section, say); waits until it listens. Returns its address and pid.
    pub async fn start_extra_api(
        &mut self,
        name: &'static str,
        extra: &str,
    ) -> anyhow::Result<(String, u32)> {
        self.start_extra_api_tuned(name, |_| {}, extra).await
    }

    /// [`Self::start_extra_api`] with its settings changed by `tune` first
    /// (the page cache off, say: a setting the shared sections hold, which
    /// `extra` cannot name a second time).
    pub async fn start_extra_api_tuned(
        &mut self,
        name: &'static str,
        tune: impl FnOnce(&mut Settings),
        extra: &str,
    ) -> anyhow::Result<(String, u32)> {
        let mut settings = self.settings.clone();
        tune(&mut settings);
        settings.api.listen = format!("127.0.0.1:{}", free_port());
        settings.api.metrics_listen = format!("127.0.0.1:{}", free_port());
        settings.worker.metrics_listen = format!("127.0.0.1:{}", free_port());
        settings.console.listen = format!("127.0.0.1:{}", free_port());
        let config = self.dir.join(format!("{name}.toml"));
        std::fs::write(&config, format!("{}\n{extra}", config_file::to_toml(&settings)))?;
        let child = self.spawn_with(name, self.bins.api.clone(), &config)?;
        let pid = child.pid;
        self.children.push(child);
        self.wait_port(name, settings.api.listen.parse()?).await?;
        Ok((settings.api.listen, pid))
    }

    fn spawn(&self, name: &'static str, bin: PathBuf) -> anyhow::Result<ChildProc> {
        self.spawn_with(name, bin, &self.config)
    }

    fn spawn_with(
        &self,
        name: &'static str,
        bin: PathBuf,
        config: &Path,
    ) -> anyhow::Result<ChildProc> {
        let log = self.dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(&bin);
        child_env(&mut cmd, config);
        cmd.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file).kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("spawn {}", bin.display()))?;
        let pid = child.id().ok_or_else(|| anyhow!("{name} exited at once"))?;
        Ok(ChildProc { name, pid, child, log })
    }

    async fn wait_port(&mut self, name: &str, addr: SocketAddr) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(());
            }
            for child in &mut self.children {
                if let Ok(Some(status)) = child.child.try_wait() {
                    bail!("{} exited ({status}):\n{}", child.name, tail(&child.log, 20));
                }
            }
            if Instant::now() > deadline {
                bail!("{name} did not listen on {addr} within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A new gRPC channel (one HTTP/2 connection) to the api.
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        let uri = format!("http://{}", self.settings.api.listen);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match Channel::from_shared(uri.clone())?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .connect()
                .await
            {
                Ok(channel) => return Ok(channel),
                Err(e) if Instant::now() > deadline => {
                    bail!("cannot connect to notify-api at {uri}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Pid of a running child (`notify-api` / `notify-worker`).
    pub fn pid(&self, name: &str) -> u32 {
        self.children.iter().find(|c| c.name == name).map_or(0, |c| c.pid)
    }

    /// Fails if a child has exited.
    pub fn check_children(&mut self) -> anyhow::Result<()> {
        for child in &mut self.children {
            if let Ok(Some(status)) = child.child.try_wait() {
                bail!("{} exited ({status}):\n{}", child.name, tail(&child.log, 20));
            }
        }
        Ok(())
    }

    /// `GET /metrics` of the api or the worker (empty when it does not
    /// answer).
    pub async fn scrape(&self, name: &str) -> MetricsPage {
        let addr = if name == "notify-api" {
            &self.settings.api.metrics_listen
        } else {
            &self.settings.worker.metrics_listen
        };
        metrics::scrape(addr).await
    }

    /// SIGTERM to every child, then waits (SIGKILL after 20 s).
    pub async fn stop_services(&mut self) {
        // Api first: nothing new gets published while the worker drains.
        for mut child in self.children.drain(..).rev() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.pid.to_string()])
                .stderr(Stdio::null())
                .status();
            match tokio::time::timeout(Duration::from_secs(20), child.child.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    eprintln!("{} did not stop within 20 s after SIGTERM; killing", child.name);
                    let _ = child.child.kill().await;
                }
            }
        }
    }

    /// Drops `settings`' shard databases now (and forgets them).
    pub async fn drop_databases_of(&mut self, settings: &Settings) -> anyhow::Result<()> {
        drop_databases(settings).await?;
        self.databases.retain(|s| db_names(s) != db_names(settings));
        Ok(())
    }

    /// Stops the children and removes every database, queue, exchange and
    /// redis key created. Best effort: failures are printed, not returned.
    pub async fn cleanup(&mut self) {
        self.stop_services().await;
        let mut problems = Vec::new();
        for settings in std::mem::take(&mut self.databases) {
            let step = tokio::time::timeout(Duration::from_secs(120), drop_databases(&settings));
            match step.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => problems.push(format!("drop databases: {e:#}")),
                Err(_) => problems.push("drop databases: timed out".into()),
            }
        }
        for settings in std::mem::take(&mut self.brokers) {
            let step = tokio::time::timeout(Duration::from_secs(30), delete_topology(&settings));
            if let Ok(Err(e)) | Err(e) = step.await.map_err(anyhow::Error::from) {
                problems.push(format!("delete rabbitmq topology: {e:#}"));
            }
            let step = tokio::time::timeout(Duration::from_secs(120), delete_redis_keys(&settings));
            if let Ok(Err(e)) | Err(e) = step.await.map_err(anyhow::Error::from) {
                problems.push(format!("delete redis keys: {e:#}"));
            }
        }
        if problems.is_empty() && !self.failed {
            drop(self.temp.take());
            eprintln!("cleanup: children stopped, databases, queues and redis keys removed");
        } else {
            for problem in &problems {
                eprintln!("cleanup: {problem}");
            }
            if let Some(temp) = self.temp.take() {
                let _kept = temp.keep();
            }
            eprintln!("cleanup: config and child logs kept in {}", self.dir.display());
        }
    }
}

/// Fails unless `page` (a service's `/metrics`) says a build without debug
/// assertions serves (`notify_build_info`).
fn ensure_release(name: &str, page: &MetricsPage) -> anyhow::Result<()> {
    if page.sum("notify_build_info", &[("debug_assertions", "false")]) >= 1.0 {
        return Ok(());
    }
    let test_build = page.sum("notify_build_info", &[("debug_assertions", "true")]) >= 1.0;
    bail!(
        "{name} is {} (notify_build_info): rebuild before measuring: cargo build --release \
         -p notify-bench -p notify-api -p notify-worker -p notify-edge -p notifyctl",
        if test_build {
            "a test build, unoptimized with debug assertions (scripts/test builds one into \
             target/release)"
        } else {
            "of no known build: its /metrics has no notify_build_info"
        }
    )
}

fn db_names(settings: &Settings) -> Vec<&str> {
    settings.database.shards.iter().map(|s| s.database.as_str()).collect()
}

/// Points a child at `config`, dropping inherited `NOTIFY_*` overrides.
pub(crate) fn child_env(cmd: &mut Command, config: &Path) {
    // The file is the whole configuration: no inherited overrides.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("NOTIFY_") || k == "RUST_LOG") {
            cmd.env_remove(key);
        }
    }
    cmd.env("NOTIFY_CONFIG", config);
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn server_options(settings: &Settings) -> anyhow::Result<MySqlConnectOptions> {
    Ok(MySqlConnectOptions::from_str(settings.database.url.expose_secret())?.charset("utf8mb4"))
}

/// A pool on one shard database of `settings`.
pub async fn shard_pool(settings: &Settings, index: usize, max: u32) -> anyhow::Result<MySqlPool> {
    let shard = &settings.database.shards[index];
    let options = server_options(settings)?.database(&shard.database);
    MySqlPoolOptions::new()
        .max_connections(max)
        .min_connections(0)
        // As the services' pools (no ping before each acquire).
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .with_context(|| format!("connect to {}", shard.database))
}

/// One pool per shard of `settings`, in shard order.
pub async fn shard_pools(settings: &Settings, max: u32) -> anyhow::Result<Vec<MySqlPool>> {
    let mut pools = Vec::new();
    for index in 0..settings.database.shards.len() {
        pools.push(shard_pool(settings, index, max).await?);
    }
    Ok(pools)
}

/// Opens `n` connections on each pool (so connecting is not timed).
pub async fn warm_pools(pools: &[MySqlPool], n: usize) -> anyhow::Result<()> {
    for pool in pools {
        let mut held = Vec::new();
        for _ in 0..n {
            held.push(pool.acquire().await?);
        }
    }
    Ok(())
}

async fn drop_databases(settings: &Settings) -> anyhow::Result<()> {
    let mut conn = MySqlConnection::connect_with(&server_options(settings)?).await?;
    let mut errors = Vec::new();
    for shard in &settings.database.shards {
        // Names are [A-Za-z0-9_] (validated with the settings).
        let statement = format!("DROP DATABASE IF EXISTS `{}`", shard.database);
        if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(statement)).execute(&mut conn).await {
            errors.push(format!("{}: {e}", shard.database));
        }
    }
    let _ = conn.close().await;
    if errors.is_empty() { Ok(()) } else { bail!("{}", errors.join("; ")) }
}

async fn delete_topology(settings: &Settings) -> anyhow::Result<()> {
    let connection = queue::connect(&settings.rabbitmq, "notify-bench-cleanup").await?;
    let channel = connection.create_channel().await?;
    let result = Topology::new(settings).delete(&channel).await;
    let _ = connection.close(200, "done".into()).await;
    Ok(result?)
}

/// Deletes every Redis key under `settings`' key prefix.
pub async fn delete_redis_keys(settings: &Settings) -> anyhow::Result<()> {
    let client = redis::Client::open(settings.redis.url.expose_secret())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    // SCAN, not KEYS: a run leaves millions of keys (three per user of a
    // 1M send), and KEYS blocks the server while it lists them all; UNLINK
    // frees them off Redis's main thread.
    let pattern = format!("{}*", settings.redis.key_prefix);
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            conn.unlink::<_, ()>(keys).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// A connection to the MariaDB server (no database) for global status.
pub async fn server_connection(settings: &Settings) -> anyhow::Result<MySqlConnection> {
    Ok(MySqlConnection::connect_with(&server_options(settings)?).await?)
}

/// `SHOW GLOBAL STATUS` as numbers.
pub async fn mysql_status(conn: &mut MySqlConnection) -> anyhow::Result<HashMap<String, u64>> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SHOW GLOBAL STATUS").fetch_all(&mut *conn).await?;
    Ok(rows.into_iter().filter_map(|(k, v)| Some((k, v.parse().ok()?))).collect())
}

/// MariaDB's buffer pool against the shards' `message_items` (rows and
/// indexes, as InnoDB reports them), in MB: whether the items a run reads
/// can all be cached, or some are a page read from disk away.
pub async fn pool_and_items(
    conn: &mut MySqlConnection,
    settings: &Settings,
) -> anyhow::Result<String> {
    let pool: u64 =
        sqlx::query_scalar("SELECT @@innodb_buffer_pool_size").fetch_one(&mut *conn).await?;
    let mut items = 0u64;
    for database in db_names(settings) {
        let (data, index): (u64, u64) = sqlx::query_as(
            "SELECT CAST(COALESCE(SUM(data_length), 0) AS UNSIGNED), \
             CAST(COALESCE(SUM(index_length), 0) AS UNSIGNED) FROM information_schema.TABLES \
             WHERE table_schema = ? AND table_name = 'message_items'",
        )
        .bind(database)
        .fetch_one(&mut *conn)
        .await?;
        items += data + index;
    }
    let mb = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    Ok(format!(
        "MariaDB buffer pool {:.0} MB; the shards' message_items {:.0} MB (rows and indexes)",
        mb(pool),
        mb(items)
    ))
}

/// Summary of MariaDB work between two status snapshots.
pub fn mysql_delta(a: &HashMap<String, u64>, b: &HashMap<String, u64>) -> String {
    let d = |k: &str| b.get(k).copied().unwrap_or(0).saturating_sub(a.get(k).copied().unwrap_or(0));
    format!(
        "stmts {} (insert {}, select {}, update {}, commit {}), rows written {}, index reads {}, \
         pings {}, row lock waits {} ({} ms), log writes {}, fsyncs {}, redo {} MB, pages flushed {}",
        d("Questions"),
        d("Com_insert"),
        d("Com_select"),
        d("Com_update"),
        d("Com_commit"),
        d("Handler_write"),
        d("Handler_read_key") + d("Handler_read_next"),
        d("Com_admin_commands"),
        d("Innodb_row_lock_waits"),
        d("Innodb_row_lock_time"),
        d("Innodb_log_writes"),
        d("Innodb_data_fsyncs"),
        d("Innodb_lsn_current") / 1_000_000,
        d("Innodb_buffer_pool_pages_flushed"),
    )
}

/// Waits (bounded) until InnoDB has flushed most dirty pages, or stops
/// making progress, so a phase pays less for the previous one's writes.
/// Returns seconds waited and dirty pages left.
pub async fn quiesce(conn: &mut MySqlConnection, max: Duration) -> anyhow::Result<(f64, u64)> {
    let started = Instant::now();
    let mut history: Vec<u64> = Vec::new();
    loop {
        let status = mysql_status(conn).await?;
        let dirty = status.get("Innodb_buffer_pool_pages_dirty").copied().unwrap_or(0);
        let total = status.get("Innodb_buffer_pool_pages_total").copied().unwrap_or(1);
        history.push(dirty);
        // Stalled: no decrease over the last 5 s (10 polls).
        let stalled = history.len() > 10 && history[history.len() - 11] <= dirty;
        if dirty <= (total / 100).max(64) || stalled || started.elapsed() >= max {
            return Ok((started.elapsed().as_secs_f64(), dirty));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Formats `n` with thousands separators.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `OK` / `MISS` against a target.
pub fn verdict(ok: bool) -> &'static str {
    if ok { "OK" } else { "MISS" }
}

/// Sends `content` to `users` through the draft flow (CreateMessage, numbered
/// AppendRecipients batches of up to 100,000 ids, StartMessage); returns the
/// message id.
pub async fn send_draft(
    channel: &Channel,
    content: v1::Content,
    users: &[u64],
) -> anyhow::Result<u64> {
    let id = draft(channel, content, users).await?;
    start_message(channel, id).await?;
    Ok(id)
}

/// Starts a draft (`StartMessage`).
pub async fn start_message(channel: &Channel, message_id: u64) -> anyhow::Result<()> {
    MessageServiceClient::new(channel.clone())
        .start_message(v1::StartMessageRequest { message_id })
        .await
        .context("StartMessage")?;
    Ok(())
}

/// A draft of `content` to `users` (CreateMessage, numbered AppendRecipients
/// batches of up to 100,000 ids), not started; returns the message id.
pub async fn draft(channel: &Channel, content: v1::Content, users: &[u64]) -> anyhow::Result<u64> {
    let mut messages = MessageServiceClient::new(channel.clone())
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let id = messages
        .create_message(v1::CreateMessageRequest {
            sender: "notify-bench".into(),
            content: Some(content),
            ..Default::default()
        })
        .await
        .context("CreateMessage")?
        .into_inner()
        .message_id;
    for (index, batch) in users.chunks(100_000).enumerate() {
        messages
            .append_recipients(v1::AppendRecipientsRequest {
                message_id: id,
                batch_number: index as u64 + 1,
                user_ids: batch.to_vec(),
                ..Default::default()
            })
            .await
            .context("AppendRecipients")?;
    }
    Ok(id)
}

/// Follows a send (`WatchMessage`, every 500 ms) until `done` holds for its
/// state, which it returns; `what` names that state in the errors.
pub async fn watch_until(
    channel: &Channel,
    message_id: u64,
    timeout_secs: u64,
    what: &str,
    done: impl Fn(&v1::Message) -> bool,
) -> anyhow::Result<v1::Message> {
    let mut client = MessageServiceClient::new(channel.clone());
    let mut stream = client
        .watch_message(v1::WatchMessageRequest { message_id, interval_ms: 500 })
        .await
        .context("WatchMessage")?
        .into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout_secs);
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => anyhow::bail!("send not {what} within {timeout_secs} s"),
            Ok(Err(status)) => anyhow::bail!("WatchMessage: {status}"),
            Ok(Ok(None)) => anyhow::bail!("WatchMessage ended before {what}"),
            Ok(Ok(Some(message))) if done(&message) => return Ok(message),
            Ok(Ok(Some(_))) => {}
        }
    }
}
