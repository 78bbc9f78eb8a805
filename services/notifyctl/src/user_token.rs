//! `notifyctl user-token`: signs a user token for `notify-edge` with an
//! HS256 key of the configuration, as an app's backend signs them
//! (docs/edge.md#signing-user-tokens). For development and for trying the
//! edge by hand: production tokens come from the app's own backend.

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use notify_core::user_tokens::{self, SignError};

/// Arguments of `notifyctl user-token`.
#[derive(Debug, Args)]
pub struct UserTokenArgs {
    /// The user the token is for (its `sub`).
    #[arg(long)]
    user: u64,
    /// Seconds it is valid for (at most `edge.tokens.max_lifetime_secs`).
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
    /// The key to sign with, by kid; default: the first HS256 key of
    /// `edge.tokens.keys`, else of `edge.tokens.jwks_file`.
    #[arg(long)]
    kid: Option<String>,
}

/// Prints a token of `args.user`, signed with an HS256 key of the
/// configuration.
pub fn user_token(args: UserTokenArgs) -> anyhow::Result<()> {
    let settings = notify_domain::Settings::load()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let token =
        user_tokens::sign(&settings.edge.tokens, args.user, args.ttl, args.kid.as_deref(), now)
            .map_err(|e| match e {
                SignError::Lifetime { .. } => anyhow::anyhow!("--ttl: {e}"),
                SignError::UnknownKid(_) => anyhow::anyhow!("--kid: {e}"),
                SignError::NoKey | SignError::Key(_) => anyhow::anyhow!(e),
            })?;
    println!("{token}");
    Ok(())
}
