//! The audit log: every lifecycle and admin action, with the client that
//! acted, the target, the time and the outcome, as a row on the target's home
//! shard and as a structured log line (target `audit`).
//!
//! A record is written after the action, whatever its outcome, so refused
//! attempts are on record too. If the shard cannot take the row the log
//! line still carries it and `notify_audit_write_errors_total` counts it;
//! the action's own result is unchanged (it has happened).

use chrono::Utc;
use shard_router::Key;
use tracing::{info, warn};

use crate::context::Context;
use notify_domain::error::{Error, Result};
use notify_store::db::audit;

pub use notify_store::db::audit::AuditRow;

/// What an action was done to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Nothing in particular (or not known, as for a refused create).
    None,
    /// A send or announcement.
    Message(u64),
    /// A group.
    Group(u64),
    /// A user (their erasure: the record keeps the id and nothing else).
    User(u64),
}

impl Target {
    /// Returns the stored kind and id.
    pub fn parts(self) -> (&'static str, u64) {
        match self {
            Target::None => ("", 0),
            Target::Message(id) => ("message", id),
            Target::Group(id) => ("group", id),
            Target::User(id) => ("user", id),
        }
    }
}

/// One action about to be recorded.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    /// The client that acted.
    pub client: &'a str,
    /// What it did, dotted (`message.pause`).
    pub action: &'a str,
    /// What it did it to.
    pub target: Target,
    /// `ok` or the gRPC code name of the failure.
    pub outcome: &'a str,
    /// Sizes, reasons; at most 512 bytes are kept.
    pub detail: String,
}

/// Returns the outcome name of a result: `ok` or the error's gRPC code name.
pub fn outcome_of<T>(result: &Result<T>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.code_name(),
    }
}

/// Writes an entry to its target's home shard and to the log.
pub async fn record(ctx: &Context, entry: Entry<'_>) {
    let (kind, id) = entry.target.parts();
    info!(
        target: "audit",
        client = entry.client,
        action = entry.action,
        target_kind = kind,
        target_id = id,
        outcome = entry.outcome,
        detail = %entry.detail,
        "audit"
    );
    let key = match entry.target {
        Target::Message(id) => Key::Message(id),
        Target::Group(id) => Key::Group(id),
        Target::User(id) => Key::User(id),
        Target::None => Key::Str(entry.client),
    };
    let pool = match ctx.writable(key).await {
        Ok(pool) => pool,
        Err(e) => {
            metrics::counter!("notify_audit_write_errors_total").increment(1);
            warn!(error = %e, action = entry.action, client = entry.client, "could not store an audit record");
            return;
        }
    };
    let mut detail = entry.detail;
    if detail.len() > 512 {
        let mut end = 512;
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        detail.truncate(end);
    }
    let audit_id = match ctx.ids.next_id() {
        Ok(id) => id.get(),
        Err(e) => {
            metrics::counter!("notify_audit_write_errors_total").increment(1);
            warn!(error = %e, action = entry.action, client = entry.client, "could not store an audit record");
            return;
        }
    };
    let row = AuditRow {
        audit_id,
        at: Utc::now().naive_utc(),
        client: entry.client.to_owned(),
        action: entry.action.to_owned(),
        target_kind: kind.to_owned(),
        target_id: id,
        outcome: entry.outcome.to_owned(),
        detail,
    };
    if let Err(e) = audit::insert(&pool, &row).await {
        metrics::counter!("notify_audit_write_errors_total").increment(1);
        warn!(error = %e, action = %row.action, client = %row.client, "could not store an audit record");
    }
}

/// Which records to list.
#[derive(Debug, Clone, Copy)]
pub enum Filter<'a> {
    /// The history of one target.
    Target(Target),
    /// Everything one client did.
    Client(&'a str),
}

/// Lists records newest first, with ids below `before` (0: from the newest).
pub async fn list(
    ctx: &Context,
    filter: Filter<'_>,
    before: u64,
    limit: u32,
) -> Result<Vec<AuditRow>> {
    let before = if before == 0 { u64::MAX } else { before };
    match filter {
        Filter::Target(Target::None) => {
            Err(Error::invalid("target", "must name a message, a group or a user"))
        }
        Filter::Target(target) => {
            let (kind, id) = target.parts();
            let pool = match target {
                Target::Group(id) => ctx.pools.for_group(id),
                Target::User(id) => ctx.pools.for_user(id),
                _ => ctx.pools.for_message(id),
            };
            Ok(audit::by_target(&pool, kind, id, before, limit).await?)
        }
        Filter::Client(client) => {
            // A record of a message or group moves with its home's bucket
            // and is on two shards during the move: count the routed one.
            let routes = ctx.pools.snapshot();
            let pages = ctx.pools.iter().map(|(shard, pool)| async move {
                Ok::<_, Error>((shard, audit::by_client(pool, client, before, limit).await?))
            });
            let mut rows: Vec<AuditRow> = futures::future::try_join_all(pages)
                .await?
                .into_iter()
                .flat_map(|(shard, rows)| rows.into_iter().map(move |row| (shard, row)))
                .filter(|(shard, row)| match row.target_kind.as_str() {
                    "message" => routes.of(Key::Message(row.target_id)).0 == *shard,
                    "group" => routes.of(Key::Group(row.target_id)).0 == *shard,
                    _ => true,
                })
                .map(|(_, row)| row)
                .collect();
            rows.sort_unstable_by_key(|row| std::cmp::Reverse(row.audit_id));
            rows.truncate(limit as usize);
            Ok(rows)
        }
    }
}
