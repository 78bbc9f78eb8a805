//! `notify.v1.GroupService`: group messages stored once per group, pulled by
//! members with seq cursors.

use notify_core::Context;
use notify_core::audit::Target;
use notify_core::groups::{self, MAX_MEMBER_BATCH, MAX_PULL_LIMIT};
use notify_domain::Error;
use notify_domain::domain::{self, UserId};
use notify_proto::v1;
use notify_proto::v1::group_service_server::GroupService;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::audit;
use crate::auth::caller;
use crate::convert;
use crate::status::IntoStatus;

/// Implements `GroupService` over the shared [`Context`].
#[derive(Clone)]
pub struct GroupApi {
    ctx: Context,
}

impl GroupApi {
    /// Creates the service.
    pub fn new(ctx: Context) -> Self {
        Self { ctx }
    }
}

fn group_id(raw: u64) -> Result<u64, Status> {
    groups::validate_group_id(raw, "group_id").into_status()
}

fn user_id(raw: u64) -> Result<UserId, Status> {
    UserId::parse(raw, "user_id").into_status()
}

fn member_ids(raw: &[u64]) -> Result<Vec<u64>, Status> {
    domain::validate_user_ids(raw, MAX_MEMBER_BATCH, "user_ids", "; split it into several calls")
        .into_status()
}

fn group_message(row: groups::GroupMessageRow) -> v1::GroupMessage {
    // A tombstone keeps its seq, id, sender and time, and no content.
    let content = row.recalled_at.is_none().then(|| {
        convert::content_to_proto(domain::Content {
            title: row.title,
            body: row.body,
            category: row.category,
            data: domain::Content::data_from_json(&row.data),
            template: None,
        })
    });
    v1::GroupMessage {
        message_id: row.message_id,
        seq: row.seq,
        content,
        sender: row.sender,
        created_at: Some(convert::timestamp(row.created_at)),
        recalled: row.recalled_at.is_some(),
        recalled_at: row.recalled_at.map(convert::timestamp),
    }
}

#[tonic::async_trait]
impl GroupService for GroupApi {
    #[instrument(skip_all, fields(group_id = request.get_ref().group_id))]
    async fn create_group(
        &self,
        request: Request<v1::CreateGroupRequest>,
    ) -> Result<Response<v1::CreateGroupResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        groups::validate_group_name(&req.name, "name").into_status()?;
        let requested = (req.group_id != 0).then_some(req.group_id);
        let result = groups::create(&self.ctx, requested, &req.name).await;
        let target = Target::Group(*result.as_ref().unwrap_or(&req.group_id));
        audit(&self.ctx, &caller, "group.create", target, &result, String::new()).await;
        Ok(Response::new(v1::CreateGroupResponse { group_id: result.into_status()? }))
    }

    #[instrument(skip_all, fields(group_id = request.get_ref().group_id))]
    async fn add_group_members(
        &self,
        request: Request<v1::AddGroupMembersRequest>,
    ) -> Result<Response<v1::AddGroupMembersResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let group = group_id(req.group_id)?;
        let users = member_ids(&req.user_ids)?;
        let result = groups::add_members(&self.ctx, group, &users, req.with_history).await;
        let detail = format!("users={} with_history={}", users.len(), req.with_history);
        audit(&self.ctx, &caller, "group.members.add", Target::Group(group), &result, detail).await;
        Ok(Response::new(v1::AddGroupMembersResponse { added: result.into_status()? }))
    }

    #[instrument(skip_all, fields(group_id = request.get_ref().group_id))]
    async fn remove_group_members(
        &self,
        request: Request<v1::RemoveGroupMembersRequest>,
    ) -> Result<Response<v1::RemoveGroupMembersResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let group = group_id(req.group_id)?;
        let users = member_ids(&req.user_ids)?;
        let result = groups::remove_members(&self.ctx, group, &users).await;
        let detail = format!("users={}", users.len());
        let target = Target::Group(group);
        audit(&self.ctx, &caller, "group.members.remove", target, &result, detail).await;
        Ok(Response::new(v1::RemoveGroupMembersResponse { removed: result.into_status()? }))
    }

    #[instrument(skip_all, fields(group_id = request.get_ref().group_id))]
    async fn send_group_message(
        &self,
        request: Request<v1::SendGroupMessageRequest>,
    ) -> Result<Response<v1::SendGroupMessageResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let group = group_id(req.group_id)?;
        let sender = convert::sender(&caller, req.sender, "sender").into_status()?;
        domain::validate_idempotency_key(&req.idempotency_key, "idempotency_key").into_status()?;
        let content = convert::content(req.content, "content").into_status()?;
        if content.template.as_ref().is_some_and(|t| t.per_recipient()) {
            return Err(Error::invalid(
                "content.template.recipient_vars",
                "must be empty for a group message: it is stored once and rendered with the \
                 send-wide vars in each member's language",
            ))
            .into_status();
        }
        let message = groups::NewMessage {
            group_id: group,
            sender,
            client: caller.name().to_owned(),
            idempotency_key: (!req.idempotency_key.is_empty()).then_some(req.idempotency_key),
            content,
        };
        let sent = groups::send(&self.ctx, &message).await.into_status()?;
        Ok(Response::new(v1::SendGroupMessageResponse {
            message_id: sent.message_id,
            seq: sent.seq,
        }))
    }

    #[instrument(
        skip_all,
        fields(user_id = request.get_ref().user_id, group_id = request.get_ref().group_id)
    )]
    async fn pull_group_messages(
        &self,
        request: Request<v1::PullGroupMessagesRequest>,
    ) -> Result<Response<v1::PullGroupMessagesResponse>, Status> {
        let req = request.into_inner();
        let user = user_id(req.user_id)?;
        let group = group_id(req.group_id)?;
        let limit = convert::page_limit(req.limit, MAX_PULL_LIMIT, "limit").into_status()?;
        let pulled =
            groups::pull(&self.ctx, user, group, req.after_seq, limit).await.into_status()?;
        Ok(Response::new(v1::PullGroupMessagesResponse {
            messages: pulled.messages.into_iter().map(group_message).collect(),
            has_more: pulled.has_more,
        }))
    }

    #[instrument(
        skip_all,
        fields(user_id = request.get_ref().user_id, group_id = request.get_ref().group_id)
    )]
    async fn ack_group_messages(
        &self,
        request: Request<v1::AckGroupMessagesRequest>,
    ) -> Result<Response<v1::AckGroupMessagesResponse>, Status> {
        let req = request.into_inner();
        let user = user_id(req.user_id)?;
        let group = group_id(req.group_id)?;
        let last_ack_seq = groups::ack(&self.ctx, user, group, req.seq).await.into_status()?;
        Ok(Response::new(v1::AckGroupMessagesResponse { last_ack_seq }))
    }

    #[instrument(skip_all, fields(user_id = request.get_ref().user_id))]
    async fn get_group_unread(
        &self,
        request: Request<v1::GetGroupUnreadRequest>,
    ) -> Result<Response<v1::GetGroupUnreadResponse>, Status> {
        let user = user_id(request.into_inner().user_id)?;
        let summary = groups::unread(&self.ctx, user).await.into_status()?;
        Ok(Response::new(v1::GetGroupUnreadResponse {
            groups: summary
                .groups
                .into_iter()
                .map(|g| v1::GroupUnread {
                    group_id: g.group_id,
                    unread: g.unread,
                    max_seq: g.max_seq,
                    last_ack_seq: g.last_ack_seq,
                    muted: g.muted,
                })
                .collect(),
            total: summary.total,
        }))
    }

    #[instrument(
        skip_all,
        fields(group_id = request.get_ref().group_id, seq = request.get_ref().seq)
    )]
    async fn recall_group_message(
        &self,
        request: Request<v1::RecallGroupMessageRequest>,
    ) -> Result<Response<v1::RecallGroupMessageResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let group = group_id(req.group_id)?;
        let owner = caller.sends_owner_filter();
        let result = groups::recall(&self.ctx, group, req.seq, owner).await;
        let detail = match &result {
            Ok(recalled) => format!(
                "seq={} message_id={}{}",
                req.seq,
                recalled.message_id,
                if recalled.recalled_now { "" } else { " (recalled before)" }
            ),
            Err(_) => format!("seq={}", req.seq),
        };
        let target = Target::Group(group);
        audit(&self.ctx, &caller, "group.message.recall", target, &result, detail).await;
        let recalled = result.into_status()?;
        Ok(Response::new(v1::RecallGroupMessageResponse {
            message_id: recalled.message_id,
            recalled_now: recalled.recalled_now,
        }))
    }
}
