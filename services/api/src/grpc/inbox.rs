//! `notify.v1.InboxService`: a user's inbox, item states, badge and
//! preferences.

use notify_core::inbox::{self, InboxQuery, MAX_BATCH_IDS, MAX_PAGE_SIZE, Target};
use notify_core::{Context, preferences};
use notify_domain::Error;
use notify_domain::domain::{self, UserId};
use notify_domain::preferences::Preferences;

use crate::convert::WirePages;
use notify_proto::v1;
use notify_proto::v1::inbox_service_server::InboxService;
use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::convert;
use crate::status::IntoStatus;

/// Implements `InboxService` over the shared [`Context`].
#[derive(Clone)]
pub struct InboxApi {
    ctx: Context,
}

impl InboxApi {
    /// Creates the service.
    pub fn new(ctx: Context) -> Self {
        Self { ctx }
    }
}

fn user_id(raw: u64) -> Result<UserId, Status> {
    UserId::parse(raw, "user_id").into_status()
}

fn message_ids(raw: &[u64]) -> Result<Vec<u64>, Status> {
    if raw.is_empty() {
        return Err(Error::invalid("message_ids", "must contain at least one id")).into_status();
    }
    listed_ids(raw)
}

/// Validates listed ids (at most [`MAX_BATCH_IDS`], none zero): sorted,
/// without repeats.
fn listed_ids(raw: &[u64]) -> Result<Vec<u64>, Status> {
    if raw.len() > MAX_BATCH_IDS {
        return Err(Error::invalid(
            "message_ids",
            &format!("has {} ids, the limit is {MAX_BATCH_IDS}", raw.len()),
        ))
        .into_status();
    }
    if let Some(index) = raw.iter().position(|id| *id == 0) {
        return Err(Error::invalid(&format!("message_ids[{index}]"), "message id must not be 0"))
            .into_status();
    }
    let mut ids = raw.to_vec();
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

#[tonic::async_trait]
impl InboxService for InboxApi {
    #[instrument(skip_all, fields(user_id = request.get_ref().user_id))]
    async fn list_inbox(
        &self,
        request: Request<v1::ListInboxRequest>,
    ) -> Result<Response<v1::ListInboxResponse>, Status> {
        let req = request.into_inner();
        let user = user_id(req.user_id)?;
        let limit = convert::page_limit(req.page_size, MAX_PAGE_SIZE, "page_size").into_status()?;
        let before = inbox::decode_cursor(&req.page_token, "page_token").into_status()?;
        let filter =
            convert::item_filter(req.view, &req.category, req.unread_only, req.read_only, 0, "")
                .into_status()?;
        let query = InboxQuery { before, limit, filter };
        Ok(Response::new(inbox::list::<WirePages>(&self.ctx, user, &query).await.into_status()?))
    }

    #[instrument(skip_all, fields(user_id = request.get_ref().user_id))]
    async fn mark_read(
        &self,
        request: Request<v1::MarkReadRequest>,
    ) -> Result<Response<v1::MarkReadResponse>, Status> {
        let req = request.into_inner();
        let user = user_id(req.user_id)?;
        let ids = message_ids(&req.message_ids)?;
        let changed = inbox::mark_read(&self.ctx, user, &ids).await.into_status()?;
        Ok(Response::new(v1::MarkReadResponse {
            marked: changed.changed,
            unknown_message_ids: changed.unknown,
        }))
    }

    #[instrument(skip_all, fields(user_id = request.get_ref().user_id))]
    async fn mark_all_read(
        &self,
        request: Request<v1::MarkAllReadRequest>,
    ) -> Result<Response<v1::MarkAllReadResponse>, Status> {
        let req = request.into_inner();
        let user = user_id(req.user_id)?;
        if !req.category.is_empty() {
            domain::validate_category(&req.category, "category").into_status()?;
        }
        let category = (!req.category.is_empty()).then_some(req.category.as_str());
        let up_to = (req.up_to_message_id != 0).then_some(req.up_to_message_id);
        let changed = inbox::mark_all_read(&self.ctx, user, category, up_to).await.into_status()?;
        Ok(Response::new(v1::MarkAllReadResponse { marked: changed.changed }))
    }

    #[instrument(skip_all, fields(user_id = request.get_ref().user_id, action = request.get_ref().action))]
    async fn update_items(
        &self,
        request: Request<v1::UpdateItemsRequest>,
    ) -> Result<Response<v1::UpdateItemsResponse>, Status> {
        let req = request.into_inner();
        let user = user_id(req.user_id)?;
        let action = convert::action(req.action, "action").into_status()?;
        let ids;
        let target = match (&req.all, req.message_ids.is_empty()) {
            (Some(_), false) | (None, true) => {
                return Err(Error::invalid(
                    "message_ids",
                    "exactly one of message_ids and all is required",
                ))
                .into_status();
            }
            (None, false) => {
                ids = listed_ids(&req.message_ids)?;
                Target::Ids(&ids)
            }
            (Some(all), true) => Target::All(
                convert::item_filter(
                    all.view,
                    &all.category,
                    all.unread_only,
                    all.read_only,
                    all.up_to_message_id,
                    "all.",
                )
                .into_status()?,
            ),
        };
        let changed = inbox::update_items(&self.ctx, user, action, target).await.into_status()?;
        Ok(Response::new(v1::UpdateItemsResponse {
            changed: changed.changed,
            unknown_message_ids: changed.unknown,
            unread: changed.counts.unread,
            unseen: changed.counts.unseen,
        }))
    }

    #[instrument(skip_all, fields(user_id = request.get_ref().user_id))]
    async fn set_preferences(
        &self,
        request: Request<v1::SetPreferencesRequest>,
    ) -> Result<Response<v1::SetPreferencesResponse>, Status> {
        let req = request.into_inner();
        let user = user_id(req.user_id)?;
        let wanted = req.preferences.unwrap_or_default();
        let wanted = Preferences::parse(
            wanted.muted_categories,
            wanted.muted_group_ids,
            &wanted.locale,
            "preferences",
        )
        .into_status()?;
        let stored = preferences::set(&self.ctx, user, &wanted).await.into_status()?;
        Ok(Response::new(v1::SetPreferencesResponse { preferences: Some(to_proto(stored)) }))
    }

    #[instrument(skip_all, fields(user_id = request.get_ref().user_id))]
    async fn get_preferences(
        &self,
        request: Request<v1::GetPreferencesRequest>,
    ) -> Result<Response<v1::GetPreferencesResponse>, Status> {
        let user = user_id(request.into_inner().user_id)?;
        let stored = preferences::get(&self.ctx, user).await.into_status()?;
        Ok(Response::new(v1::GetPreferencesResponse { preferences: Some(to_proto(stored)) }))
    }

    #[instrument(skip_all, fields(user_id = request.get_ref().user_id))]
    async fn get_unread_count(
        &self,
        request: Request<v1::GetUnreadCountRequest>,
    ) -> Result<Response<v1::GetUnreadCountResponse>, Status> {
        let user = user_id(request.into_inner().user_id)?;
        let badge = inbox::badge(&self.ctx, user).await.into_status()?;
        Ok(Response::new(v1::GetUnreadCountResponse {
            user_id: user.get(),
            unread: badge.unread,
            group_unread: badge.group_unread.unwrap_or(0),
            group_unread_unknown: badge.group_unread.is_none(),
            unseen: badge.unseen,
        }))
    }

    #[instrument(skip_all, fields(users = request.get_ref().user_ids.len()))]
    async fn batch_get_unread_counts(
        &self,
        request: Request<v1::BatchGetUnreadCountsRequest>,
    ) -> Result<Response<v1::BatchGetUnreadCountsResponse>, Status> {
        let req = request.into_inner();
        domain::validate_user_ids(&req.user_ids, MAX_BATCH_IDS, "user_ids", "").into_status()?;
        // Keep request order, one entry per distinct id.
        let mut seen = std::collections::HashSet::new();
        let ids: Vec<u64> = req.user_ids.iter().copied().filter(|id| seen.insert(*id)).collect();
        let counts = inbox::counts(&self.ctx, &ids).await.into_status()?;
        Ok(Response::new(v1::BatchGetUnreadCountsResponse {
            counts: ids
                .into_iter()
                .zip(counts)
                .map(|(user_id, counts)| v1::UnreadCount {
                    user_id,
                    unread: counts.unread,
                    unseen: counts.unseen,
                })
                .collect(),
        }))
    }
}

fn to_proto(preferences: Preferences) -> v1::Preferences {
    v1::Preferences {
        muted_categories: preferences.muted_categories,
        muted_group_ids: preferences.muted_group_ids,
        locale: preferences.locale.map(|locale| locale.as_str().to_owned()).unwrap_or_default(),
    }
}
