//! `notify-bench calls`: a fixed number of `GetUnreadCount` calls against an
//! api that is already running, from the same lean h2 client the badge
//! benchmark uses, with or without a bearer token.
//!
//! For profiling the api's cost per call with a tool that counts work rather
//! than time (the machines here are noisy; `valgrind --tool=callgrind`
//! counts the same instructions twice in a row). Run the api under the
//! profiler, zero its counters, run `calls`, dump them, and divide by the
//! number of calls:
//!
//! ```text
//! valgrind --tool=callgrind target/release/notify-api &
//! target/release/notify-bench calls --calls 2000          # warm up
//! callgrind_control --zero
//! target/release/notify-bench calls --calls 20000 [--token ntf_...]
//! callgrind_control --dump
//! ```

use std::time::Instant;

use clap::Args;
use futures::StreamExt;
use notify_proto::v1;

use crate::wire::WireChannel;

const GET_UNREAD_COUNT: &str = "/notify.v1.InboxService/GetUnreadCount";

/// Options of `notify-bench calls`.
#[derive(Debug, Args)]
pub struct CallsArgs {
    /// The api's gRPC address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// Bearer token sent with every call (none: auth must be off).
    #[arg(long, env = "NOTIFY_TOKEN")]
    pub token: Option<String>,
    /// Calls to make.
    #[arg(long, default_value_t = 20_000)]
    pub calls: u64,
    /// Calls in flight at once, over one HTTP/2 connection.
    #[arg(long, default_value_t = 32)]
    pub in_flight: usize,
    /// Users asked about, round robin from 1.
    #[arg(long, default_value_t = 1_000)]
    pub users: u64,
}

/// Makes the calls and prints the count, the time and the rate.
pub async fn run(args: CallsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.calls > 0, "--calls must be at least 1");
    anyhow::ensure!(args.in_flight > 0, "--in-flight must be at least 1");
    anyhow::ensure!(args.users > 0, "--users must be at least 1");
    let wire = match &args.token {
        Some(token) => WireChannel::connect_with_token(&args.addr, token).await?,
        None => WireChannel::connect(&args.addr).await?,
    };
    let started = Instant::now();
    let users = args.users;
    let mut replies = futures::stream::iter(0..args.calls)
        .map(|index| {
            let wire = wire.clone();
            async move {
                let request = v1::GetUnreadCountRequest { user_id: index % users + 1 };
                wire.unary::<_, v1::GetUnreadCountResponse>(GET_UNREAD_COUNT, &request).await
            }
        })
        .buffer_unordered(args.in_flight);
    let mut done = 0u64;
    while let Some(reply) = replies.next().await {
        reply?;
        done += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    println!("{done} calls in {secs:.2} s ({:.0} calls/s)", done as f64 / secs);
    Ok(())
}
