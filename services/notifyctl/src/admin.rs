//! `token`, `audit` and `health`: credentials for new clients, the audit
//! log, and the api's health as an exit code.

use std::io::Read;

use clap::{ArgGroup, Args, Subcommand};
use notify_domain::auth::{Scope, new_token, token_sha256_hex};
use notify_proto::v1;
use notify_proto::v1::admin_service_client::AdminServiceClient;
use notify_proto::v1::list_audit_records_request::Filter;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::connect::Api;
use crate::inbox::rfc3339;

/// `notifyctl token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Prints a new token for client NAME and the config lines that admit it.
    New {
        /// The client's name ([a-z0-9_.-]).
        name: String,
        /// Scopes to put in the config lines, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "send,sends.read,sends.manage")]
        scopes: Vec<String>,
    },
    /// Reads a token on stdin and prints the digest `token_sha256` holds.
    Hash,
}

/// Runs a token command (no api needed: tokens never reach the server).
pub fn token(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::New { name, scopes } => {
            anyhow::ensure!(
                notify_domain::settings::valid_client_name(&name),
                "NAME must be 1..=64 of [a-z0-9_.-]"
            );
            for scope in &scopes {
                scope.parse::<Scope>().map_err(|e| {
                    anyhow::anyhow!("--scopes: {e}; known: {}", Scope::names().join(", "))
                })?;
            }
            let token = new_token();
            let scopes: Vec<String> = scopes.iter().map(|s| format!("{s:?}")).collect();
            println!("token (give it to the client; it is not stored anywhere):");
            println!("  {token}");
            println!();
            println!("config (auth.clients in the api's config file; a second digest in");
            println!("token_sha256 keeps an old token valid during a rotation):");
            println!("[[auth.clients]]");
            println!("name = {name:?}");
            println!("token_sha256 = [{:?}]", token_sha256_hex(&token));
            println!("scopes = [{}]", scopes.join(", "));
            Ok(())
        }
        TokenCommand::Hash => {
            let mut token = String::new();
            std::io::stdin().read_to_string(&mut token)?;
            let token = token.trim();
            anyhow::ensure!(!token.is_empty(), "no token on stdin");
            println!("{}", token_sha256_hex(token));
            Ok(())
        }
    }
}

/// Arguments of `notifyctl audit`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("filter").required(true).args(["message", "group", "client", "user"])))]
pub struct AuditArgs {
    /// The history of one send.
    #[arg(long)]
    message: Option<u64>,
    /// The history of one group.
    #[arg(long)]
    group: Option<u64>,
    /// Everything one client did.
    #[arg(long)]
    client: Option<String>,
    /// A user's erasure.
    #[arg(long)]
    user: Option<u64>,
    /// Records per page (1..=1000).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Page token from a previous page.
    #[arg(long, default_value = "")]
    page_token: String,
}

/// Prints audit records, newest first (needs the admin scope).
pub async fn audit(api: Api, args: AuditArgs) -> anyhow::Result<()> {
    let filter = match (args.message, args.group, args.client, args.user) {
        (Some(id), _, _, _) => Filter::MessageId(id),
        (_, Some(id), _, _) => Filter::GroupId(id),
        (_, _, Some(client), _) => Filter::Client(client),
        (_, _, _, Some(id)) => Filter::UserId(id),
        _ => anyhow::bail!("give --message, --group, --client or --user"),
    };
    let page = AdminServiceClient::new(api)
        .list_audit_records(v1::ListAuditRecordsRequest {
            filter: Some(filter),
            page_size: args.limit,
            page_token: args.page_token,
        })
        .await?
        .into_inner();
    for record in &page.records {
        let target = if record.target_kind.is_empty() {
            "-".to_owned()
        } else {
            format!("{} {}", record.target_kind, record.target_id)
        };
        println!(
            "{}  {:<12} {:<22} {:<24} {:<20} {}",
            rfc3339(record.at),
            record.client,
            record.action,
            target,
            record.outcome,
            record.detail
        );
    }
    if !page.next_page_token.is_empty() {
        println!("next page: --page-token {}", page.next_page_token);
    }
    Ok(())
}

/// Checks the api's gRPC health: exit 0 when SERVING, 1 otherwise.
pub async fn health(api: Api, service: String) -> anyhow::Result<bool> {
    let status = HealthClient::new(api)
        .check(HealthCheckRequest { service: service.clone() })
        .await?
        .into_inner()
        .status;
    let name = ServingStatus::try_from(status).map_or("UNKNOWN", |s| s.as_str_name());
    let what = if service.is_empty() { "notify-api".to_owned() } else { service };
    println!("{what}: {name}");
    Ok(status == ServingStatus::Serving as i32)
}

/// `notifyctl user ...`.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Erases a user everywhere (admin scope): items, preferences, group
    /// memberships, cached counts; sends already queued skip them.
    Erase {
        /// User id.
        user_id: u64,
    },
}

/// Runs a `user` command.
pub async fn user(api: Api, command: UserCommand) -> anyhow::Result<()> {
    match command {
        UserCommand::Erase { user_id } => {
            let erased = AdminServiceClient::new(api)
                .erase_user(v1::EraseUserRequest { user_id })
                .await?
                .into_inner();
            println!(
                "user {user_id} erased: {} items, {} group memberships",
                erased.items, erased.memberships
            );
            Ok(())
        }
    }
}
