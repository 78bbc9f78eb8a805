//! Private instances of Redis, MariaDB and RabbitMQ for tests that need a
//! server of their own: one with TLS on, or one a test may stop without
//! touching the shared servers other tests use. Each runs from the
//! Debian-packaged binaries on free loopback ports, in a temporary
//! directory, in its own process group, and is killed (group and all) and
//! removed when its handle drops.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::pki::TestPki;

/// Returns a loopback port that was free a moment ago, never the same one
/// twice in a process, and below the kernel's ephemeral range: a proxy or
/// server that stops and listens again on its port must not find it taken
/// by some client's outgoing connection (those get ephemeral ports) or by
/// another test.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    // Read by hand: procfs has no reader for this sysctl, and the file is
    // two numbers.
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (ephemeral_low.saturating_sub(12_000).max(1024), ephemeral_low);
    let mut handed_out = HANDED_OUT.lock().expect("port set");
    for _ in 0..10_000 {
        let port = low + rand::random::<u16>() % (high - low);
        if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free port in {low}..{high}");
}

/// A server process with its directory.
struct Process {
    child: Child,
    dir: TempDir,
    name: &'static str,
}

impl Process {
    fn spawn(name: &'static str, command: &mut Command, dir: TempDir) -> Self {
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{name} does not start: {e}"));
        Self { child, dir, name }
    }

    /// Waits until `port` accepts connections; panics with the server's log
    /// if it exits or takes longer than `within`.
    async fn wait_for_port(&mut self, port: u16, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited with {status}:\n{}", self.name, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "{} not up in {within:?}:\n{}",
                self.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn kill(&mut self) {
        // The whole group: wrapper scripts (RabbitMQ's) start the real server
        // as a child.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // The directory goes after, with the TempDir.
        self.kill();
    }
}

fn temp_dir(kind: &str) -> TempDir {
    tempfile::Builder::new().prefix(&format!("notify-{kind}-")).tempdir().expect("server directory")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A private `redis-server`.
pub struct RedisServer {
    process: Process,
    /// Its port (TLS only when started with TLS).
    pub port: u16,
    tls: bool,
}

impl RedisServer {
    /// Starts a plain Redis.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Starts a Redis that speaks only TLS, with a certificate of `pki`.
    pub async fn start_tls(pki: &TestPki) -> Self {
        Self::start_with(Some(pki)).await
    }

    async fn start_with(pki: Option<&TestPki>) -> Self {
        let dir = temp_dir("redis");
        let port = free_port();
        let mut command = Command::new("redis-server");
        command.args([
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            path(dir.path()),
        ]);
        match pki {
            Some(pki) => {
                let server = pki.server("redis");
                command.args(["--port", "0", "--tls-port", &port.to_string()]);
                command.args(["--tls-cert-file", path(&server.cert)]);
                command.args(["--tls-key-file", path(&server.key)]);
                command.args(["--tls-ca-cert-file", path(&pki.ca), "--tls-auth-clients", "no"]);
            }
            None => {
                command.args(["--port", &port.to_string()]);
            }
        }
        let mut process = Process::spawn("redis-server", &mut command, dir);
        process.wait_for_port(port, Duration::from_secs(20)).await;
        Self { process, port, tls: pki.is_some() }
    }

    /// The url to reach it.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://localhost:{}", self.port)
    }

    /// Kills it (like a crash); the handle may start it again.
    pub fn stop(&mut self) {
        self.process.kill();
    }
}

/// A private `mariadbd` with TLS required, root without a password over TCP.
pub struct MariaDbServer {
    _process: Process,
    /// Its port.
    pub port: u16,
}

impl MariaDbServer {
    /// Initializes a data directory and starts a server that refuses any
    /// connection without TLS (`require_secure_transport`).
    pub async fn start_tls(pki: &TestPki) -> Self {
        let dir = temp_dir("mariadb");
        let data = dir.path().join("data");
        let installed = tokio::process::Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                &format!("--datadir={}", path(&data)),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .expect("mariadb-install-db runs");
        assert!(installed.success(), "mariadb-install-db failed");
        let server = pki.server("mariadb");
        let port = free_port();
        let mut command = Command::new("mariadbd");
        command.args([
            "--no-defaults",
            &format!("--datadir={}", path(&data)),
            &format!("--port={port}"),
            "--bind-address=127.0.0.1",
            &format!("--socket={}", path(&dir.path().join("mysqld.sock"))),
            &format!("--pid-file={}", path(&dir.path().join("mysqld.pid"))),
            "--user=root",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=32M",
            &format!("--ssl-ca={}", path(&pki.ca)),
            &format!("--ssl-cert={}", path(&server.cert)),
            &format!("--ssl-key={}", path(&server.key)),
            "--require-secure-transport=ON",
        ]);
        let mut process = Process::spawn("mariadbd", &mut command, dir);
        process.wait_for_port(port, Duration::from_secs(60)).await;
        Self { _process: process, port }
    }

    /// The server url (no database), as `database.url` takes it.
    pub fn url(&self) -> String {
        format!("mysql://root@localhost:{}", self.port)
    }
}

/// A private RabbitMQ node that speaks only AMQPS.
pub struct RabbitMqServer {
    _process: Process,
    /// Its AMQPS port.
    pub port: u16,
}

impl RabbitMqServer {
    /// Starts a node (its own name, ports and data) with a TLS listener
    /// and no plain one. Takes 10-20 s: the Erlang VM boots.
    pub async fn start_tls(pki: &TestPki) -> Self {
        let dir = temp_dir("rabbitmq");
        let server = pki.server("rabbitmq");
        let port = free_port();
        let config = dir.path().join("rabbitmq.conf");
        std::fs::write(
            &config,
            format!(
                "listeners.tcp = none\nlisteners.ssl.default = {port}\n\
                 ssl_options.cacertfile = {}\nssl_options.certfile = {}\nssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n",
                path(&pki.ca),
                path(&server.cert),
                path(&server.key)
            ),
        )
        .expect("rabbitmq.conf");
        let node = format!("notify-test-{:08x}@localhost", rand::random::<u32>());
        let mut command = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
        command
            .env("RABBITMQ_NODENAME", node)
            .env("RABBITMQ_NODE_PORT", free_port().to_string())
            .env("RABBITMQ_DIST_PORT", free_port().to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.path().join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.path().join("log"))
            .env("RABBITMQ_CONFIG_FILE", &config)
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.path().join("enabled_plugins"))
            .env("RABBITMQ_ENABLED_PLUGINS", "")
            .env("RABBITMQ_PID_FILE", dir.path().join("rabbitmq.pid"));
        let mut process = Process::spawn("rabbitmq-server", &mut command, dir);
        process.wait_for_port(port, Duration::from_secs(120)).await;
        Self { _process: process, port }
    }

    /// The AMQPS url (guest may log in over loopback).
    pub fn url(&self) -> String {
        format!("amqps://guest:guest@localhost:{}/%2f", self.port)
    }
}
