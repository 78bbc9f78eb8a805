//! Editing a send's content after it went out: the home record takes the
//! new title, body and data (with `edited_at` and the next content
//! version), and the edit is a control operation ([`crate::control`]) that
//! gives every shard's content copy (at most one per shard, never one per
//! recipient) the edit, retires the cached inbox pages that hold the old
//! content (its recipients', or every user's for an announcement or a large
//! send) and tells gateway streams (`ItemUpdated`). The category stays:
//! items are filed (the category filter and its index) and muted by it.

use tracing::{info, instrument};

use crate::context::Context;
use crate::control;
use crate::send::{self, MessageView};
use notify_domain::domain::{Content, MessageId, SendStatus};
use notify_domain::error::{Error, Result};
use notify_store::db::messages::ControlChange;
use notify_store::db::operations::OperationKind;

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
    // Recipients' vars are stored with their items: an edit renders them
    // anew, so it must take the same names.
    let declared = |content: &Content| {
        content.template.as_ref().map(|t| t.recipient_vars.clone()).unwrap_or_default()
    };
    let stored = declared(&row.content());
    if declared(content) != stored {
        let names: Vec<&str> = stored.iter().map(String::as_str).collect();
        return Err(Error::invalid(
            "content.template.recipient_vars",
            &format!(
                "must stay [{}]: the recipients' vars are stored with their items",
                names.join(", ")
            ),
        ));
    }
    let change = ControlChange::Content(content);
    control::begin(ctx, &row, change, OperationKind::Edit, None).await?;
    info!(message_id = %message_id, "message edited");
    let view = send::get_after_change(ctx, message_id).await?;
    Ok(Edited { view, previous_title: row.title })
}
