//! Editing a send's content after it went out: the home record and every
//! shard's content copy (at most one per shard, never one per recipient)
//! take the new title, body and data, and items show `edited_at`. The
//! category stays: items are filed (the category filter and its index) and
//! muted by it. Cached inbox pages hold the old content, so the edit retires
//! them (the announcement epoch), and gateway streams get `ItemUpdated`.

use chrono::Utc;
use shard_router::Key;
use tracing::{info, instrument, warn};

use crate::context::Context;
use crate::events::{self, BusEvent};
use crate::send::{self, MessageView};
use notify_domain::domain::{Content, MessageId, SendStatus};
use notify_domain::error::{Error, Result};
use notify_store::db::{chunks, messages};

/// What an edit did.
#[derive(Debug, Clone)]
pub struct Edited {
    /// The send after the edit.
    pub view: MessageView,
    /// Its title before (for the audit record).
    pub previous_title: String,
}

/// Replaces a send's (or an announcement's) title, body and data. A draft
/// (not started) or a recalled send cannot be edited; a new category is
/// refused.
#[instrument(skip_all, fields(message_id = %message_id))]
pub async fn edit(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
    content: &Content,
) -> Result<Edited> {
    let row = send::fetch_visible(ctx, message_id, owner).await?;
    match row.status()? {
        SendStatus::Recalled => {
            return Err(Error::FailedPrecondition(format!(
                "cannot edit message {message_id}: it was recalled"
            )));
        }
        SendStatus::NotStarted => {
            return Err(Error::FailedPrecondition(format!(
                "cannot edit message {message_id}: it has not started (a draft or scheduled \
                 send is changed by creating it again)"
            )));
        }
        _ => {}
    }
    if content.category != row.category {
        return Err(Error::invalid(
            "content.category",
            &format!("must stay {:?}: items are filed and muted by it", row.category),
        ));
    }
    let home = ctx.writable(Key::Message(message_id.get())).await?;
    messages::edit(&home, message_id, content).await?;
    drop(home);
    for (_, pool) in ctx.pools.iter() {
        chunks::edit_content(pool, message_id, content).await?;
    }
    if let Err(e) = ctx.cache.bump_announcement_epoch().await {
        // Cached pages show the old content until they expire.
        warn!(error = %e, message_id = %message_id, "could not retire cached inbox pages");
    }
    let event = BusEvent::Edited {
        message_id: message_id.get(),
        title: content.title.clone(),
        edited_at_ms: Utc::now().timestamp_millis(),
    };
    events::publish_best_effort(ctx, &event).await;
    info!(message_id = %message_id, "message edited");
    let view = send::get(ctx, message_id, None).await?;
    Ok(Edited { view, previous_title: row.title })
}
