//! `notify-bench`: benchmarks run by hand (not part of the test suite).
//!
//! - `fanout`: a 1,000,000-recipient send across 4 shards, end to end,
//!   against a raw multi-row INSERT baseline of the same rows in the same run.
//! - `badge`: `GetUnreadCount` against raw Redis `GET` at the same
//!   concurrency, plus `ListInbox` latency on a shard holding ~1M items.
//! - `announce`: `SendMessage(all_users)` latency with 1k vs 1M known users,
//!   and the cost of the first inbox read after an announcement.
//! - `group`: `SendGroupMessage` latency in a 10-member vs a 100,000-member
//!   group, and a member pulling a 20,000-message backlog in pages of 200.
//! - `items`: `UpdateItems` with `all` over a 10,000-item inbox, per call
//!   latency and MariaDB statements.
//! - `events`: gateway events of a 100k-recipient send, exactly once.
//! - `edge`: 50,000 event streams on one `notify-edge` (its own process):
//!   memory a stream, CPU at rest, a 100k send's and the mark-reads' events
//!   once each, commit -> client latency.
//! - `recipients`: `ListRecipients` pages of 1,000 by 4 readers for each
//!   filter and `GetRecipientStatus` of 1,000 users, on a 1M-recipient send.
//! - `recall`: `RecallMessage` of a 1M-recipient COMPLETED send against its
//!   own fan-out, then every recipient's badge against MySQL.
//! - `chaos`: a mixed load on two api and two worker processes under random
//!   faults and SIGKILLs, then invariants checked from MySQL.
//!
//! Each run creates its own databases, queues and keys, spawns `notify-api`
//! and `notify-worker` (release binaries next to this one) as children, and
//! removes everything at the end, also on error or Ctrl-C.

mod announce;
mod badge;
mod calls;
mod chaos;
mod config_file;
mod console;
mod control;
mod edge;
mod events;
mod fanout;
mod group;
mod harness;
mod items;
mod metrics;
mod moves;
mod procstat;
mod recall;
mod recipients;
mod wire;

use std::panic::AssertUnwindSafe;

use clap::{Parser, Subcommand};
use futures::FutureExt;

/// Benchmarks of Notify against raw MariaDB and Redis.
#[derive(Debug, Parser)]
#[command(name = "notify-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fan-out of one send to N recipients vs raw multi-row INSERT of the same rows.
    Fanout(fanout::FanoutArgs),
    /// GetUnreadCount vs raw Redis GET, and ListInbox latency on a big shard.
    Badge(badge::BadgeArgs),
    /// SendMessage(all_users) latency with 1k vs 1M known users, first inbox read cost.
    Announce(announce::AnnounceArgs),
    /// SendGroupMessage latency in a 10 vs 100k member group, pulling a 20k backlog.
    Group(group::GroupArgs),
    /// Gateway events of a 100k-recipient send to 10k, then 100k, followed users.
    Events(events::EventsArgs),
    /// 50,000 event streams on one notify-edge: memory, CPU at rest, events of a send.
    Edge(edge::EdgeArgs),
    /// ListRecipients pages by 4 readers per filter, GetRecipientStatus of 1,000 users by 1, then 4.
    Recipients(recipients::RecipientsArgs),
    /// RecallMessage of a 1M-recipient COMPLETED send vs its own fan-out; badges after.
    Recall(recall::RecallArgs),
    /// Mixed load under random faults and SIGKILLs, then invariants from MySQL.
    Chaos(chaos::ChaosArgs),
    /// Cancel and recall of a scheduled 10M send; a small recall's and edit's cached badges.
    Control(control::ControlArgs),
    /// N GetUnreadCount calls against a running api (for profiling it).
    Calls(calls::CallsArgs),
    /// A bucket move under mark-read load vs a raw copy of the same rows.
    Move(moves::MoveArgs),
    /// The console's live updates: api CPU and shard reads with 50 pages open on a send.
    Console(console::ConsoleArgs),
    /// UpdateItems with `all` over a 10,000-item inbox: latency and statements per call.
    Items(items::ItemsArgs),
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Fanout(args) => fanout::run(args).await,
        Command::Badge(args) => badge::run(args).await,
        Command::Announce(args) => announce::run(args).await,
        Command::Group(args) => group::run(args).await,
        Command::Events(args) => events::run(args).await,
        Command::Edge(args) => edge::run(args).await,
        Command::Recipients(args) => recipients::run(args).await,
        Command::Recall(args) => recall::run(args).await,
        Command::Chaos(args) => chaos::run(args).await,
        Command::Control(args) => control::run(args).await,
        Command::Calls(args) => calls::run(args).await,
        Command::Move(args) => moves::run(args).await,
        Command::Console(args) => console::run(args).await,
        Command::Items(args) => items::run(args).await,
    };
    if let Err(e) = result {
        eprintln!("notify-bench: {e:#}");
        std::process::exit(1);
    }
}

/// Runs a benchmark body; a panic or Ctrl-C becomes an error, so the caller
/// always gets to clean up.
pub async fn guarded<T>(body: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let body = AssertUnwindSafe(body).catch_unwind();
    tokio::select! {
        outcome = body => match outcome {
            Ok(result) => result,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                Err(anyhow::anyhow!("benchmark panicked: {what}"))
            }
        },
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    }
}
