//! The one place where domain errors become gRPC statuses. Client mistakes
//! are explained; internal details are logged and never sent.

use notify_domain::Error;
use notify_domain::error::DbFailure;

use crate::metrics_layer::current_method;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tracing::{error, warn};

/// Maps a domain error to the status the client sees.
pub fn to_status(err: Error) -> Status {
    match err {
        Error::InvalidArgument { .. } => Status::invalid_argument(err.to_string()),
        Error::NotFound(_) => Status::not_found(err.to_string()),
        Error::AlreadyExists(message) => Status::already_exists(message),
        Error::PermissionDenied(message) => Status::permission_denied(message),
        Error::FailedPrecondition(message) => Status::failed_precondition(message),
        Error::ResourceExhausted { reason, retry_after } => match retry_after {
            // google.rpc.RetryInfo: gRPC clients read the delay from it.
            Some(delay) => Status::with_error_details(
                Code::ResourceExhausted,
                reason,
                ErrorDetails::with_retry_info(Some(delay)),
            ),
            None => Status::resource_exhausted(reason),
        },
        Error::Unavailable(_) | Error::Database { .. } | Error::Broker(_) | Error::Cache(_)
            if err.is_transient() =>
        {
            let kind = err.db_failure().map_or("", DbFailure::name);
            warn!(error = %err, rpc = %current_method(), kind, "dependency unavailable");
            Status::unavailable("a dependency is temporarily unavailable, retry later")
        }
        other => {
            let kind = other.db_failure().map_or("", DbFailure::name);
            error!(error = %other, rpc = %current_method(), kind, "internal error");
            Status::internal("internal error")
        }
    }
}

/// Shorthand for handlers: `result.map_err(to_status)`.
pub trait IntoStatus<T> {
    /// Converts the error side to a [`Status`].
    fn into_status(self) -> Result<T, Status>;
}

impl<T> IntoStatus<T> for Result<T, Error> {
    fn into_status(self) -> Result<T, Status> {
        self.map_err(to_status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_keep_their_message_and_internal_ones_hide_it() {
        let status = to_status(Error::invalid("content.title", "must not be empty"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "content.title: must not be empty");
        assert_eq!(to_status(Error::NotFound("message 7".into())).code(), Code::NotFound);
        let denied = to_status(Error::PermissionDenied("user 1 is not a member".into()));
        assert_eq!(denied.code(), Code::PermissionDenied);
        assert_eq!(denied.message(), "user 1 is not a member");
        let internal = to_status(Error::Internal("secret detail".into()));
        assert_eq!(internal.code(), Code::Internal);
        assert!(!internal.message().contains("secret"));
    }

    #[test]
    fn a_quota_refusal_carries_its_retry_delay() {
        let delay = std::time::Duration::from_millis(1500);
        let status = to_status(Error::ResourceExhausted {
            reason: "client x is over its limit".into(),
            retry_after: Some(delay),
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.get_details_retry_info().unwrap().retry_delay, Some(delay));
    }
}
