//! The gRPC service implementations.

pub mod admin;
pub mod events;
pub mod group;
pub mod inbox;
pub mod message;
pub mod recipients;

use notify_core::Context;
use notify_core::audit::{self, Entry, Target};
use notify_domain::auth::Caller;

/// Writes the audit record of a lifecycle action with its outcome.
pub(crate) async fn audit<T>(
    ctx: &Context,
    caller: &Caller,
    action: &str,
    target: Target,
    result: &notify_domain::Result<T>,
    detail: String,
) {
    let entry =
        Entry { client: caller.name(), action, target, outcome: audit::outcome_of(result), detail };
    audit::record(ctx, entry).await;
}
