//! `notifyctl`: the operator CLI. Migrates shards directly; everything else
//! goes through the api over gRPC.

mod admin;
mod connect;
mod groups;
mod inbox;
mod recipient_states;
mod recipients;
mod sends;
mod shards;
mod tail;
mod user_token;

use clap::{Parser, Subcommand};

use crate::connect::ConnectArgs;

/// Operator CLI for Notify.
#[derive(Debug, Parser)]
#[command(name = "notifyctl", version, about)]
struct Cli {
    #[command(flatten)]
    connect: ConnectArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Creates missing shard databases and applies pending migrations to every shard
    /// (reads the same configuration as the services). Expand only: run it
    /// before the new version starts.
    Migrate {
        /// Then the contract step (migrations/contract/): each of its
        /// migrations once no live replica of an older build runs (run it
        /// after a rollout; what replicas still hold back is deferred to
        /// the next run, and said).
        #[arg(long)]
        contract: bool,
        /// With --contract: wait up to this many seconds for older
        /// replicas to go before deferring.
        #[arg(long, default_value_t = 0, requires = "contract")]
        wait: u64,
    },
    /// Runs retention once on every shard (as the workers do every
    /// `retention.interval_secs`): adds the months of item partitions ahead,
    /// drops those past `retention.items_days`, purges hidden items, deletes
    /// old sends, chunks and audit rows. Reads the same configuration as the
    /// services.
    Retention,
    /// Sends a message to users: ids from a range (1..1000000), a file, or stdin.
    Send(sends::SendArgs),
    /// Sends a platform announcement to all users (stored once).
    Announce(sends::AnnounceArgs),
    /// Shows a send's status and progress; --watch follows it with a progress bar.
    Status {
        /// Message id.
        message_id: u64,
        /// Follow until the send ends.
        #[arg(long)]
        watch: bool,
    },
    /// Pauses a send.
    Pause {
        /// Message id.
        message_id: u64,
    },
    /// Resumes a paused send.
    Resume {
        /// Message id.
        message_id: u64,
    },
    /// Cancels a send.
    Cancel {
        /// Message id.
        message_id: u64,
    },
    /// Takes a send back from every inbox (whatever its state); --watch
    /// follows the workers until every item is taken back.
    Recall {
        /// Message id.
        message_id: u64,
        /// Show a progress bar until the recall is finished.
        #[arg(long)]
        watch: bool,
    },
    /// Lists a send's recipients in user order with their state, delivery
    /// and read times: a page, or every page with --all.
    Recipients(recipient_states::RecipientsArgs),
    /// Shows where a send stands for each of the users (up to 1,000).
    Recipient {
        /// Message id.
        message_id: u64,
        /// User ids.
        #[arg(required = true)]
        user_ids: Vec<u64>,
    },
    /// Replaces a sent message's title and/or body (the category stays).
    Edit {
        /// Message id.
        message_id: u64,
        /// New title.
        #[arg(long)]
        title: Option<String>,
        /// New body.
        #[arg(long)]
        body: Option<String>,
    },
    /// Delivers a send's failed (dead-lettered) chunks again.
    Redrive {
        /// Message id.
        message_id: u64,
    },
    /// Lists a sender's sends, newest first.
    List {
        /// Sender name (default: the calling client's own).
        #[arg(long, default_value = "")]
        sender: String,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Shows a user's inbox (or archive), newest first: `*` unread, `+`
    /// unseen, `A` archived.
    Inbox(inbox::InboxArgs),
    /// Marks a user's items seen, read or unread, archives, unarchives or
    /// deletes them: listed ids, or --all with the inbox's filters.
    Items(inbox::ItemsArgs),
    /// Shows a user's preferences, muting or unmuting categories and groups.
    Prefs(inbox::PrefsArgs),
    /// Users: erase one everywhere (admin scope).
    #[command(subcommand)]
    User(admin::UserCommand),
    /// Group messages: create, add/remove members, send, recall, pull, ack,
    /// unread.
    #[command(subcommand)]
    Group(groups::GroupCommand),
    /// Shows users' unread and unseen badge counts.
    Badge {
        /// User ids.
        #[arg(required = true)]
        user_ids: Vec<u64>,
    },
    /// Follows users on the gateway event stream and prints each event live.
    Tail {
        /// User ids, comma separated.
        #[arg(long, required = true, value_delimiter = ',')]
        users: Vec<u64>,
    },
    /// Makes client tokens (offline: nothing is sent to the api).
    #[command(subcommand)]
    Token(admin::TokenCommand),
    /// Prints a user token for notify-edge, signed with an HS256 key of
    /// the configuration (offline; for development and trying the edge:
    /// production tokens come from the app's backend).
    UserToken(user_token::UserTokenArgs),
    /// Shows and changes the versioned shard map (directly on the directory
    /// shard, with the services' configuration).
    #[command(subcommand)]
    Shard(shards::ShardCommand),
    /// Shows audit records of a send, a group, a user or a client (admin
    /// scope).
    Audit(admin::AuditArgs),
    /// Checks the api's health: exit code 0 when SERVING, 1 when not, 2
    /// when it cannot be asked.
    Health {
        /// A service name; empty means the whole api.
        #[arg(long, default_value = "")]
        service: String,
    },
}

#[tokio::main]
async fn main() {
    // Output into a pipe whose reader left (`notifyctl tail | head`) ends
    // the process quietly, as it ends `cat`, instead of panicking in
    // `println!`.
    sigpipe::reset();
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("notifyctl: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let command = match cli.command {
        Command::Migrate { contract, wait } => return migrate(contract, wait).await,
        Command::Retention => return retention().await,
        Command::Token(command) => return admin::token(command),
        Command::UserToken(args) => return user_token::user_token(args),
        Command::Shard(command) => return shards::run(command).await,
        Command::Health { service } => {
            // The exit code is the answer: 1 for not serving, 2 for no answer.
            let serving = match cli.connect.connect().await {
                Ok(channel) => admin::health(channel, service).await,
                Err(e) => Err(e),
            };
            match serving {
                Ok(true) => return Ok(()),
                Ok(false) => std::process::exit(1),
                Err(e) => {
                    eprintln!("notifyctl: {e:#}");
                    std::process::exit(2);
                }
            }
        }
        command => command,
    };
    let channel = cli.connect.connect().await?;
    match command {
        Command::Migrate { .. }
        | Command::Retention
        | Command::Token(_)
        | Command::UserToken(_)
        | Command::Shard(_)
        | Command::Health { .. } => {
            unreachable!("handled above")
        }
        Command::Audit(args) => admin::audit(channel, args).await,
        Command::Send(args) => sends::send(channel, args).await,
        Command::Announce(args) => sends::announce(channel, args).await,
        Command::Status { message_id, watch } => sends::status(channel, message_id, watch).await,
        Command::Pause { message_id } => sends::pause(channel, message_id).await,
        Command::Resume { message_id } => sends::resume(channel, message_id).await,
        Command::Cancel { message_id } => sends::cancel(channel, message_id).await,
        Command::Redrive { message_id } => sends::redrive(channel, message_id).await,
        Command::Recall { message_id, watch } => sends::recall(channel, message_id, watch).await,
        Command::Recipients(args) => recipient_states::recipients(channel, args).await,
        Command::Recipient { message_id, user_ids } => {
            recipient_states::recipient(channel, message_id, user_ids).await
        }
        Command::Edit { message_id, title, body } => {
            sends::edit(channel, message_id, title, body).await
        }
        Command::List { sender, limit } => sends::list(channel, sender, limit).await,
        Command::Inbox(args) => inbox::inbox(channel, args).await,
        Command::Items(args) => inbox::items(channel, args).await,
        Command::Prefs(args) => inbox::prefs(channel, args).await,
        Command::User(command) => admin::user(channel, command).await,
        Command::Badge { user_ids } => inbox::badge(channel, user_ids).await,
        Command::Tail { users } => tail::tail(channel, users).await,
        Command::Group(command) => groups::run(channel, command).await,
    }
}

async fn retention() -> anyhow::Result<()> {
    let settings = notify_domain::Settings::load()?;
    let pools = notify_store::db::connect(&settings).await?;
    notify_store::shard_map::adopt(&settings, &pools).await?;
    let cache = notify_cache::Cache::connect(&settings.redis).await?;
    let report =
        notify_core::retention::run_once(&pools, &cache, &settings.retention, chrono::Utc::now())
            .await?;
    let listed =
        |names: &[String]| if names.is_empty() { "none".to_owned() } else { names.join(" ") };
    println!("partitions added:   {}", listed(&report.partitions_added));
    println!("partitions dropped: {}", listed(&report.partitions_dropped));
    println!("badges invalidated: {}", report.badges_invalidated);
    println!("hidden items purged: {}", report.hidden_items_purged);
    println!("chunks deleted:     {}", report.chunks_deleted);
    println!("sends deleted:      {}", report.sends_deleted);
    println!("audit rows deleted: {}", report.audit_rows_deleted);
    println!("group messages deleted: {}", report.group_messages_deleted);
    println!("group cursors moved past them: {}", report.group_cursors_advanced);
    if report.shards_busy > 0 {
        println!("shards skipped (another run holds them): {}", report.shards_busy);
    }
    Ok(())
}

async fn migrate(contract: bool, wait: u64) -> anyhow::Result<()> {
    let settings = notify_domain::Settings::load()?;
    if contract {
        let patience = std::time::Duration::from_secs(wait);
        let report = notify_store::db::contract::contract_all(&settings, patience).await?;
        print_migrated(report.expand);
        for (shard, applied) in &report.applied {
            if applied.is_empty() {
                println!("shard {} {}: nothing to contract", shard.shard, shard.database);
            } else {
                println!("shard {} {}: contracted {applied:?}", shard.shard, shard.database);
            }
        }
        if report.deferred.is_empty() {
            println!("contract: done, nothing deferred");
        } else {
            let deferred: Vec<String> =
                report.deferred.iter().map(|(v, d)| format!("{v} ({d})")).collect();
            println!("contract: deferred {}", deferred.join(", "));
            for holding in &report.holding {
                println!("  held back by {} (schema {})", holding.replica, holding.schema_version);
            }
            println!("  run `notifyctl migrate --contract` again once those replicas are gone");
        }
        return Ok(());
    }
    print_migrated(notify_store::db::migrate_all(&settings).await?);
    Ok(())
}

fn print_migrated(reports: Vec<notify_store::db::MigrationReport>) {
    for report in reports {
        let created = if report.created_database { " (database created)" } else { "" };
        if report.applied.is_empty() {
            println!("shard {} {}: up to date{created}", report.shard, report.database);
        } else {
            println!(
                "shard {} {}: applied {:?}{created}",
                report.shard, report.database, report.applied
            );
        }
    }
}
