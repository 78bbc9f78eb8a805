//! A `notify-api` binary run as a child process, for the tests that kill,
//! signal or trace a real process rather than the in-process api.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tonic::transport::Channel;

/// How long a child has to start serving. Generous: the suite runs its
/// binaries unoptimized, two hundred tests at a time, beside a release build.
const STARTS_WITHIN: Duration = Duration::from_secs(90);

/// Attempts at a start: a child that exits before it serves (a port picked
/// free was taken by another connection before the child bound it) is
/// started again on new ports.
const ATTEMPTS: u32 = 3;

/// A running `notify-api` child on loopback ports of its own, killed when
/// dropped.
pub struct ApiChild {
    /// The process.
    pub child: Child,
    /// Its gRPC address.
    pub addr: SocketAddr,
    /// A channel to it, connected.
    pub channel: Channel,
}

impl ApiChild {
    /// Starts `binary` (a `notify-api`) with `NOTIFY_API__LISTEN` and
    /// `NOTIFY_API__METRICS_LISTEN` on free loopback ports, plus what
    /// `configure` adds (its config file, more settings), and waits until it
    /// accepts calls. Its stderr is the test's; its stdout is dropped.
    pub async fn start(binary: &Path, configure: impl Fn(&mut Command)) -> Self {
        for attempt in 1..=ATTEMPTS {
            let addr = free_port();
            let mut command = Command::new(binary);
            command
                .env("NOTIFY_API__LISTEN", addr.to_string())
                .env("NOTIFY_API__METRICS_LISTEN", free_port().to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .kill_on_drop(true);
            configure(&mut command);
            let mut child = command
                .spawn()
                .unwrap_or_else(|e| panic!("{} does not start: {e}", binary.display()));
            let deadline = tokio::time::Instant::now() + STARTS_WITHIN;
            loop {
                if let Some(status) = child.try_wait().expect("the child's status") {
                    assert!(attempt < ATTEMPTS, "the api child exited before serving: {status}");
                    break;
                }
                let uri = format!("http://{addr}");
                if let Ok(channel) = Channel::from_shared(uri).unwrap().connect().await {
                    return Self { child, addr, channel };
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the api child did not serve within {STARTS_WITHIN:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// SIGKILL: no drain, no cleanup.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("the child is killed");
        self.child.wait().await.expect("the killed child is reaped");
    }
}

/// A loopback address free now, for a child process to bind: its port is
/// below the kernel's ephemeral range (see [`crate::servers::free_port`]),
/// so no outgoing connection of the child's can take it before it binds.
pub fn free_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], crate::servers::free_port()))
}
