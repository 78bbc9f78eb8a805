//! The REST calls: each is a `notify.v1` call of the api's own service
//! implementation for the token's user, in process (a transcoding, as
//! grpc-gateway does), so the edge answers exactly what the gRPC api
//! answers, with the same validation; then the reply as JSON.

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use notify_domain::domain::UserId;
use notify_proto::v1;
use notify_proto::v1::group_service_server::GroupService;
use notify_proto::v1::inbox_service_server::InboxService;
use serde::de::DeserializeOwned;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

use crate::Edge;
use crate::error::{ApiError, ApiResult};
use crate::json::{
    AckRequest, AckResponse, Badge, GroupMessages, Groups, Id, InboxPage, Preferences,
    UpdateRequest, UpdateResponse, View,
};

/// The user a request's token names, admitted by the per-user rate limit.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    /// Whose data the request reaches.
    pub user: UserId,
}

impl FromRequestParts<Edge> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, edge: &Edge) -> ApiResult<Self> {
        let user = authenticate(&parts.headers, edge)?;
        let settings = &edge.ctx.settings.edge;
        edge.quotas
            .admit_user(user.get(), settings.requests_per_second, settings.burst)
            .await
            .map_err(ApiError::from)?;
        Ok(Self { user })
    }
}

/// The user of a request's token.
pub fn authenticate(headers: &HeaderMap, edge: &Edge) -> ApiResult<UserId> {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok());
    let verified = edge.tokens.verify(authorization).map_err(ApiError::unauthenticated)?;
    Ok(verified.user)
}

/// A gRPC status of the api's service as the edge answers it.
pub fn from_status(status: Status) -> ApiError {
    renamed(status, &[])
}

/// [`from_status`], naming a field as the REST call does: each `(grpc,
/// rest)` pair renames a field or a prefix of one (`page_token` is
/// `cursor`; `preferences.` is the body itself).
fn renamed(status: Status, names: &[(&str, &str)]) -> ApiError {
    let message = status.message();
    match status.code() {
        // The api words every InvalidArgument "<field>: <reason>".
        Code::InvalidArgument => match message.split_once(": ") {
            Some((field, reason)) => {
                let field = names
                    .iter()
                    .find_map(|(grpc, rest)| {
                        field.strip_prefix(grpc).map(|tail| format!("{rest}{tail}"))
                    })
                    .unwrap_or_else(|| field.to_owned());
                ApiError::invalid(&field, reason)
            }
            None => ApiError::invalid("request", message),
        },
        Code::ResourceExhausted => {
            let delay = status.get_details_retry_info().and_then(|info| info.retry_delay);
            ApiError::rate_limited(message.to_owned(), delay)
        }
        Code::NotFound => {
            notify_domain::Error::NotFound(message.trim_end_matches(" not found").to_owned()).into()
        }
        Code::PermissionDenied => notify_domain::Error::PermissionDenied(message.to_owned()).into(),
        Code::FailedPrecondition | Code::AlreadyExists => {
            notify_domain::Error::FailedPrecondition(message.to_owned()).into()
        }
        Code::Unavailable | Code::DeadlineExceeded => ApiError::unavailable(message),
        _ => notify_domain::Error::Internal(message.to_owned()).into(),
    }
}

/// Calls one of the api's service methods and answers its reply as JSON.
async fn call<Req, Rep, F, Fut, Out>(request: Req, method: F) -> ApiResult<Json<Out>>
where
    F: FnOnce(Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Rep>, Status>>,
    Out: From<Rep>,
{
    let reply = method(Request::new(request)).await.map_err(from_status)?;
    Ok(Json(Out::from(reply.into_inner())))
}

/// A JSON body, refused with 400 naming the field at fault (or 413 over
/// `edge.max_request_bytes`).
pub struct Body<T>(pub T);

impl<T: DeserializeOwned> axum::extract::FromRequest<Edge> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, edge: &Edge) -> ApiResult<Self> {
        let limit = edge.ctx.settings.edge.max_request_bytes;
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/json"));
        if !json {
            return Err(ApiError::invalid("Content-Type", "must be application/json"));
        }
        let bytes = axum::body::to_bytes(request.into_body(), limit)
            .await
            .map_err(|_| ApiError::too_large(limit))?;
        let mut parser = serde_json::Deserializer::from_slice(&bytes);
        serde_path_to_error::deserialize(&mut parser).map(Body).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "body".to_owned() } else { path };
            ApiError::invalid(&field, &e.into_inner().to_string())
        })
    }
}

/// Query parameters, each read by name with its error naming it.
pub struct Query(Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for Query {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> ApiResult<Self> {
        let query = parts.uri.query().unwrap_or_default();
        Ok(Self(form_urlencoded::parse(query.as_bytes()).into_owned().collect()))
    }
}

impl Query {
    fn text(&self, name: &str) -> Option<&str> {
        self.0.iter().rev().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// Refuses parameters other than `known`.
    pub fn only(&self, known: &[&str]) -> ApiResult<()> {
        match self.0.iter().find(|(key, _)| !known.contains(&key.as_str())) {
            Some((key, _)) => Err(ApiError::invalid(
                key,
                &format!("is not a parameter; known: {}", known.join(", ")),
            )),
            None => Ok(()),
        }
    }

    /// A number, or none when absent.
    pub fn number<T: std::str::FromStr>(&self, name: &str) -> ApiResult<Option<T>> {
        self.text(name)
            .map(|text| text.parse().map_err(|_| ApiError::invalid(name, "must be a whole number")))
            .transpose()
    }

    /// `true` or `false`; false when absent.
    pub fn flag(&self, name: &str) -> ApiResult<bool> {
        match self.text(name) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(_) => Err(ApiError::invalid(name, "must be true or false")),
        }
    }

    /// A string, empty when absent.
    pub fn string(&self, name: &str) -> String {
        self.text(name).unwrap_or_default().to_owned()
    }
}

/// Items of an inbox page, or messages of a group's page, when the call
/// does not say.
const DEFAULT_PAGE: u32 = 20;

/// `GET /v1/inbox`: a page of the user's inbox, newest first.
#[utoipa::path(get, path = "/v1/inbox", tag = "inbox",
    params(
        ("view" = Option<View>, Query, description = "inbox (default), archive or all"),
        ("unread_only" = Option<bool>, Query, description = "only unread items"),
        ("read_only" = Option<bool>, Query, description = "only read items"),
        ("category" = Option<String>, Query, description = "only this category"),
        ("page_size" = Option<u32>, Query, description = "1 to 100; default 20"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the page before"),
    ),
    responses((status = 200, body = InboxPage), (status = 400, body = crate::error::ErrorBody)),
    security(("user_token" = [])))]
pub async fn inbox(
    State(edge): State<Edge>,
    caller: Caller,
    query: Query,
) -> ApiResult<Json<InboxPage>> {
    query.only(&["view", "unread_only", "read_only", "category", "page_size", "cursor"])?;
    let view = match query.text("view") {
        None | Some("inbox") => View::Inbox,
        Some("archive") => View::Archive,
        Some("all") => View::All,
        Some(_) => return Err(ApiError::invalid("view", "must be inbox, archive or all")),
    };
    let request = v1::ListInboxRequest {
        user_id: caller.user.get(),
        page_size: query.number("page_size")?.unwrap_or(DEFAULT_PAGE),
        page_token: query.string("cursor"),
        unread_only: query.flag("unread_only")?,
        read_only: query.flag("read_only")?,
        category: query.string("category"),
        view: view.to_proto() as i32,
    };
    let reply = edge.inbox.list_inbox(Request::new(request)).await;
    let reply = reply.map_err(|status| renamed(status, &[("page_token", "cursor")]))?;
    Ok(Json(reply.into_inner().into()))
}

/// `GET /v1/badge`: the user's unread and unseen counts.
#[utoipa::path(get, path = "/v1/badge", tag = "inbox",
    responses((status = 200, body = Badge)), security(("user_token" = [])))]
pub async fn badge(State(edge): State<Edge>, caller: Caller) -> ApiResult<Json<Badge>> {
    let request = v1::GetUnreadCountRequest { user_id: caller.user.get() };
    let reply = edge.inbox.get_unread_count(Request::new(request)).await.map_err(from_status)?;
    Ok(Json(Badge::from(reply.get_ref())))
}

/// `POST /v1/items/update`: seen, read, unread, archive, unarchive or
/// delete listed items, or every item a filter selects.
#[utoipa::path(post, path = "/v1/items/update", tag = "inbox", request_body = UpdateRequest,
    responses((status = 200, body = UpdateResponse), (status = 400, body = crate::error::ErrorBody)),
    security(("user_token" = [])))]
pub async fn update_items(
    State(edge): State<Edge>,
    caller: Caller,
    Body(update): Body<UpdateRequest>,
) -> ApiResult<Json<UpdateResponse>> {
    let request = v1::UpdateItemsRequest {
        user_id: caller.user.get(),
        action: update.action.to_proto() as i32,
        message_ids: update.message_ids.iter().map(|id| id.0).collect(),
        all: update.all.as_ref().map(crate::json::ItemFilter::to_proto),
    };
    call(request, |r| edge.inbox.update_items(r)).await
}

/// `GET /v1/preferences`: what the user mutes.
#[utoipa::path(get, path = "/v1/preferences", tag = "preferences",
    responses((status = 200, body = Preferences)), security(("user_token" = [])))]
pub async fn get_preferences(
    State(edge): State<Edge>,
    caller: Caller,
) -> ApiResult<Json<Preferences>> {
    let request = v1::GetPreferencesRequest { user_id: caller.user.get() };
    let reply = edge.inbox.get_preferences(Request::new(request)).await.map_err(from_status)?;
    Ok(Json(reply.into_inner().preferences.unwrap_or_default().into()))
}

/// `PUT /v1/preferences`: replaces what the user mutes and their locale;
/// answers what is stored.
#[utoipa::path(put, path = "/v1/preferences", tag = "preferences", request_body = Preferences,
    responses((status = 200, body = Preferences), (status = 400, body = crate::error::ErrorBody)),
    security(("user_token" = [])))]
pub async fn set_preferences(
    State(edge): State<Edge>,
    caller: Caller,
    Body(preferences): Body<Preferences>,
) -> ApiResult<Json<Preferences>> {
    let request = v1::SetPreferencesRequest {
        user_id: caller.user.get(),
        preferences: Some(v1::Preferences {
            muted_categories: preferences.muted_categories,
            muted_group_ids: preferences.muted_group_ids.iter().map(|id| id.0).collect(),
            locale: preferences.locale,
        }),
    };
    let reply = edge.inbox.set_preferences(Request::new(request)).await;
    let reply = reply.map_err(|status| renamed(status, &[("preferences.", "")]))?;
    Ok(Json(reply.into_inner().preferences.unwrap_or_default().into()))
}

/// `GET /v1/groups`: the user's groups with their unread counts.
#[utoipa::path(get, path = "/v1/groups", tag = "groups",
    responses((status = 200, body = Groups)), security(("user_token" = [])))]
pub async fn groups(State(edge): State<Edge>, caller: Caller) -> ApiResult<Json<Groups>> {
    let request = v1::GetGroupUnreadRequest { user_id: caller.user.get() };
    call(request, |r| edge.groups.get_group_unread(r)).await
}

/// `GET /v1/groups/{group_id}/messages`: a group's messages after a seq
/// (default: the user's cursor), ascending.
#[utoipa::path(get, path = "/v1/groups/{group_id}/messages", tag = "groups",
    params(
        ("group_id" = String, Path, description = "the group"),
        ("after_seq" = Option<u64>, Query, description = "default: the user's cursor"),
        ("limit" = Option<u32>, Query, description = "1 to 1000; default 20"),
    ),
    responses((status = 200, body = GroupMessages), (status = 403, body = crate::error::ErrorBody)),
    security(("user_token" = [])))]
pub async fn group_messages(
    State(edge): State<Edge>,
    caller: Caller,
    Path(group_id): Path<String>,
    query: Query,
) -> ApiResult<Json<GroupMessages>> {
    query.only(&["after_seq", "limit"])?;
    let request = v1::PullGroupMessagesRequest {
        user_id: caller.user.get(),
        group_id: path_id(&group_id, "group_id")?,
        after_seq: query.number("after_seq")?,
        limit: query.number("limit")?.unwrap_or(DEFAULT_PAGE),
    };
    call(request, |r| edge.groups.pull_group_messages(r)).await
}

/// `POST /v1/groups/{group_id}/ack`: everything up to a seq is read.
#[utoipa::path(post, path = "/v1/groups/{group_id}/ack", tag = "groups", request_body = AckRequest,
    params(("group_id" = String, Path, description = "the group")),
    responses((status = 200, body = AckResponse), (status = 400, body = crate::error::ErrorBody)),
    security(("user_token" = [])))]
pub async fn group_ack(
    State(edge): State<Edge>,
    caller: Caller,
    Path(group_id): Path<String>,
    Body(ack): Body<AckRequest>,
) -> ApiResult<Json<AckResponse>> {
    let request = v1::AckGroupMessagesRequest {
        user_id: caller.user.get(),
        group_id: path_id(&group_id, "group_id")?,
        seq: ack.seq,
    };
    let reply = edge.groups.ack_group_messages(Request::new(request)).await.map_err(from_status)?;
    Ok(Json(AckResponse { last_ack_seq: reply.into_inner().last_ack_seq }))
}

fn path_id(text: &str, field: &str) -> ApiResult<u64> {
    text.parse::<Id>()
        .map(|id| id.0)
        .map_err(|_| ApiError::invalid(field, "must be a 64-bit unsigned id"))
}

impl std::str::FromStr for Id {
    type Err = std::num::ParseIntError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(Id)
    }
}
