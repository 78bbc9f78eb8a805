//! `notify.v1.AdminService`: the audit log and user erasure, for operators
//! (scope `admin`).

use notify_core::audit::{self, Filter, Target};
use notify_core::{Context, erase, inbox};
use notify_domain::Error;
use notify_domain::domain::UserId;
use notify_domain::settings::valid_client_name;
use notify_proto::v1;
use notify_proto::v1::admin_service_server::AdminService;
use notify_proto::v1::list_audit_records_request::Filter as RequestFilter;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::audit as record;
use crate::auth::caller;
use crate::convert;
use crate::status::IntoStatus;

const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

/// Implements `AdminService` over the shared [`Context`].
#[derive(Clone)]
pub struct AdminApi {
    ctx: Context,
}

impl AdminApi {
    /// Creates the service.
    pub fn new(ctx: Context) -> Self {
        Self { ctx }
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    #[instrument(skip_all)]
    async fn list_audit_records(
        &self,
        request: Request<v1::ListAuditRecordsRequest>,
    ) -> Result<Response<v1::ListAuditRecordsResponse>, Status> {
        let req = request.into_inner();
        let filter = match &req.filter {
            Some(RequestFilter::MessageId(0)) => {
                return Err(Error::invalid("message_id", "message id must not be 0")).into_status();
            }
            Some(RequestFilter::GroupId(0)) => {
                return Err(Error::invalid("group_id", "group id must not be 0")).into_status();
            }
            Some(RequestFilter::UserId(0)) => {
                return Err(Error::invalid("user_id", "user id must not be 0")).into_status();
            }
            Some(RequestFilter::MessageId(id)) => Filter::Target(Target::Message(*id)),
            Some(RequestFilter::GroupId(id)) => Filter::Target(Target::Group(*id)),
            Some(RequestFilter::UserId(id)) => Filter::Target(Target::User(*id)),
            Some(RequestFilter::Client(name)) if valid_client_name(name) => Filter::Client(name),
            Some(RequestFilter::Client(_)) => {
                return Err(Error::invalid("client", "must be 1..=64 of [a-z0-9_.-]"))
                    .into_status();
            }
            None => {
                return Err(Error::invalid(
                    "filter",
                    "set message_id, group_id, user_id or client",
                ))
                .into_status();
            }
        };
        let page_size = match req.page_size {
            0 => DEFAULT_PAGE,
            n => convert::page_limit(n, MAX_PAGE, "page_size").into_status()?,
        };
        let before = inbox::decode_cursor(&req.page_token, "page_token").into_status()?;
        let before = if req.page_token.is_empty() { 0 } else { before };
        let rows = audit::list(&self.ctx, filter, before, page_size + 1).await.into_status()?;
        let has_more = rows.len() > page_size as usize;
        let records: Vec<v1::AuditRecord> = rows
            .into_iter()
            .take(page_size as usize)
            .map(|row| v1::AuditRecord {
                audit_id: row.audit_id,
                at: Some(convert::timestamp(row.at)),
                client: row.client,
                action: row.action,
                target_kind: row.target_kind,
                target_id: row.target_id,
                outcome: row.outcome,
                detail: row.detail,
            })
            .collect();
        let next_page_token = match records.last() {
            Some(last) if has_more => inbox::encode_cursor(last.audit_id),
            _ => String::new(),
        };
        Ok(Response::new(v1::ListAuditRecordsResponse { records, next_page_token }))
    }

    #[instrument(skip_all, fields(user_id = request.get_ref().user_id))]
    async fn erase_user(
        &self,
        request: Request<v1::EraseUserRequest>,
    ) -> Result<Response<v1::EraseUserResponse>, Status> {
        let caller = caller(&request)?;
        let user = UserId::parse(request.get_ref().user_id, "user_id").into_status()?;
        let result = erase::erase_user(&self.ctx, user).await;
        // The record names the user by id and holds nothing else of theirs.
        let detail = result.as_ref().map_or_else(
            |_| String::new(),
            |erased| format!("items={} memberships={}", erased.items, erased.memberships),
        );
        record(&self.ctx, &caller, "user.erase", Target::User(user.get()), &result, detail).await;
        let erased = result.into_status()?;
        Ok(Response::new(v1::EraseUserResponse {
            items: erased.items,
            memberships: erased.memberships,
        }))
    }
}
