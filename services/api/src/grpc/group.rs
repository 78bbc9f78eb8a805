//! `notify.v1.GroupService`: group messages with seq cursors (not built yet;
//! every RPC answers UNIMPLEMENTED until the group issue lands).

use notify_proto::v1;
use notify_proto::v1::group_service_server::GroupService;
use tonic::{Request, Response, Status};

/// Placeholder implementation of `GroupService`.
#[derive(Clone, Default)]
pub struct GroupApi;

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("group messages are not implemented yet"))
}

#[tonic::async_trait]
impl GroupService for GroupApi {
    async fn create_group(
        &self,
        _request: Request<v1::CreateGroupRequest>,
    ) -> Result<Response<v1::CreateGroupResponse>, Status> {
        unimplemented()
    }

    async fn add_group_members(
        &self,
        _request: Request<v1::AddGroupMembersRequest>,
    ) -> Result<Response<v1::AddGroupMembersResponse>, Status> {
        unimplemented()
    }

    async fn remove_group_members(
        &self,
        _request: Request<v1::RemoveGroupMembersRequest>,
    ) -> Result<Response<v1::RemoveGroupMembersResponse>, Status> {
        unimplemented()
    }

    async fn send_group_message(
        &self,
        _request: Request<v1::SendGroupMessageRequest>,
    ) -> Result<Response<v1::SendGroupMessageResponse>, Status> {
        unimplemented()
    }

    async fn pull_group_messages(
        &self,
        _request: Request<v1::PullGroupMessagesRequest>,
    ) -> Result<Response<v1::PullGroupMessagesResponse>, Status> {
        unimplemented()
    }

    async fn ack_group_messages(
        &self,
        _request: Request<v1::AckGroupMessagesRequest>,
    ) -> Result<Response<v1::AckGroupMessagesResponse>, Status> {
        unimplemented()
    }

    async fn get_group_unread(
        &self,
        _request: Request<v1::GetGroupUnreadRequest>,
    ) -> Result<Response<v1::GetGroupUnreadResponse>, Status> {
        unimplemented()
    }
}
