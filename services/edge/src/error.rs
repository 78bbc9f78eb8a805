//! Errors as the edge answers them: a status and a JSON body,
//! `{"error": {"code": ..., "message": ..., "field": ...}}`, the field set
//! for bad input. Client mistakes are explained; internal details are
//! logged and never sent.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use notify_domain::Error;
use serde::Serialize;
use tracing::{error, warn};
use utoipa::ToSchema;

use crate::tokens::Refusal;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
    retry_after: Option<Duration>,
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable code: `invalid_argument`, `not_found`, `permission_denied`,
    /// `failed_precondition`, `rate_limited`, `payload_too_large`,
    /// `unavailable`, `internal`, or one of the `token_*` codes of a 401.
    pub code: &'static str,
    /// What to do about it, for a person.
    pub message: String,
    /// The request field at fault (`page_size`, `all.category`), for
    /// `invalid_argument`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: String) -> Self {
        Self {
            status,
            body: ErrorBody { error: ErrorDetail { code, message, field: None } },
            retry_after: None,
        }
    }

    /// 400 naming `field`.
    pub fn invalid(field: &str, reason: &str) -> Self {
        let mut error =
            Self::new(StatusCode::BAD_REQUEST, "invalid_argument", format!("{field}: {reason}"));
        error.body.error.field = Some(field.to_owned());
        error
    }

    /// 401 for a refused token.
    pub fn unauthenticated(refusal: Refusal) -> Self {
        metrics::counter!("notify_edge_auth_failures_total", "reason" => refusal.code())
            .increment(1);
        Self::new(StatusCode::UNAUTHORIZED, refusal.code(), refusal.message().to_owned())
    }

    /// 429, retry after `delay`.
    pub fn rate_limited(message: String, delay: Option<Duration>) -> Self {
        let mut error = Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message);
        error.retry_after = delay;
        error
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is over {limit} bytes (edge.max_request_bytes)"),
        )
    }

    /// 503: this replica cannot serve now; retry (with backoff), not
    /// before `Retry-After` (a second).
    pub fn unavailable(message: &str) -> Self {
        let mut error =
            Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message.to_owned());
        error.retry_after = Some(Duration::from_secs(1));
        error
    }

    /// The code of the answer (tests and logs).
    pub fn code(&self) -> &'static str {
        self.body.error.code
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        match err {
            Error::InvalidArgument { field, reason } => Self::invalid(&field, &reason),
            Error::NotFound(_) => Self::new(StatusCode::NOT_FOUND, "not_found", err.to_string()),
            Error::AlreadyExists(message) => {
                Self::new(StatusCode::CONFLICT, "already_exists", message)
            }
            Error::PermissionDenied(message) => {
                Self::new(StatusCode::FORBIDDEN, "permission_denied", message)
            }
            Error::FailedPrecondition(message) => {
                Self::new(StatusCode::CONFLICT, "failed_precondition", message)
            }
            Error::ResourceExhausted { reason, retry_after } => {
                Self::rate_limited(reason, retry_after)
            }
            err if err.is_transient() => {
                warn!(error = %err, "dependency unavailable");
                Self::unavailable("a dependency is temporarily unavailable, retry later")
            }
            err => {
                error!(error = %err, "internal error");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error".into())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(delay) = self.retry_after {
            // Whole seconds, rounded up: a client retrying sooner is refused.
            let secs = delay.as_millis().div_ceil(1000).max(1);
            if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A handler's result.
pub type ApiResult<T> = Result<T, ApiError>;
