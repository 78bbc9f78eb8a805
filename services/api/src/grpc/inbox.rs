//! `notify.v1.InboxService`: a user's inbox, mark-read and unread badges.

use notify_core::Context;
use notify_core::inbox::{self, MAX_BATCH_IDS, MAX_PAGE_SIZE};
use notify_domain::domain::{self, UserId};
use notify_store::db::items::InboxQuery;

use crate::convert::WirePages;
use notify_domain::Error;
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
        if !req.category.is_empty() {
            domain::validate_category(&req.category, "category").into_status()?;
        }
        let query = InboxQuery {
            before,
            limit,
            unread_only: req.unread_only,
            category: (!req.category.is_empty()).then_some(req.category.as_str()),
        };
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
        let (marked, unknown) = inbox::mark_read(&self.ctx, user, &ids).await.into_status()?;
        Ok(Response::new(v1::MarkReadResponse {
            marked: marked.len() as u64,
            unknown_message_ids: unknown,
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
        let marked = inbox::mark_all_read(&self.ctx, user, category, up_to).await.into_status()?;
        Ok(Response::new(v1::MarkAllReadResponse { marked }))
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
            group_unread: badge.group_unread,
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
        let counts = inbox::unread_counts(&self.ctx, &ids).await.into_status()?;
        Ok(Response::new(v1::BatchGetUnreadCountsResponse {
            counts: ids
                .into_iter()
                .zip(counts)
                .map(|(user_id, unread)| v1::UnreadCount { user_id, unread })
                .collect(),
        }))
    }
}
