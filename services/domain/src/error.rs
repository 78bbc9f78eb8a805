//! The error type of the domain and storage layers. The api maps it to a gRPC
//! status in exactly one place; internal details are logged, never sent.

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong below the gRPC layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing or out of range.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// Request field, dotted (`content.title`).
        field: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The addressed entity does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The entity exists already, with different attributes.
    #[error("{0}")]
    AlreadyExists(String),
    /// The caller may not do this (a non-member pulling a group, say).
    #[error("{0}")]
    PermissionDenied(String),
    /// The operation is illegal in the entity's current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A limit of the caller was reached; `retry_after` says when the
    /// same call may pass (none: it never will, as is).
    #[error("{reason}")]
    ResourceExhausted {
        /// Which limit, and by how much.
        reason: String,
        /// When to retry.
        retry_after: Option<std::time::Duration>,
    },
    /// A dependency is down; the caller may retry.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A MySQL error.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A RabbitMQ error.
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
    /// A Redis error.
    #[error("cache: {0}")]
    Cache(#[from] redis::RedisError),
    /// A broken invariant.
    #[error("internal: {0}")]
    Internal(String),
}

impl Error {
    /// Builds an `InvalidArgument` error for `field`.
    pub fn invalid(field: &str, reason: &str) -> Self {
        Self::InvalidArgument { field: field.to_owned(), reason: reason.to_owned() }
    }

    /// Returns the gRPC code name (`not_found`, ...) a client sees for this
    /// error, as audit records and metrics name outcomes.
    pub fn code_name(&self) -> &'static str {
        match self {
            Self::InvalidArgument { .. } => "invalid_argument",
            Self::NotFound(_) => "not_found",
            Self::AlreadyExists(_) => "already_exists",
            Self::PermissionDenied(_) => "permission_denied",
            Self::FailedPrecondition(_) => "failed_precondition",
            Self::ResourceExhausted { .. } => "resource_exhausted",
            e if e.is_transient() => "unavailable",
            _ => "internal",
        }
    }

    /// Returns true when InnoDB rolled the transaction back as a deadlock
    /// victim (SQLSTATE 40001): running it again is the documented remedy.
    pub fn is_deadlock(&self) -> bool {
        matches!(self, Self::Database(sqlx::Error::Database(e)) if e.code().as_deref() == Some("40001"))
    }

    /// Returns true when the MySQL connection itself failed (closed or
    /// reset under the statement): a read may be run again at once, on
    /// another connection (the pool closes a broken one on its release).
    pub fn is_broken_connection(&self) -> bool {
        matches!(self, Self::Database(sqlx::Error::Io(_)))
    }

    /// Returns true when retrying the same operation later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database(e) => !matches!(
                e,
                sqlx::Error::RowNotFound
                    | sqlx::Error::ColumnDecode { .. }
                    | sqlx::Error::Decode(_)
                    | sqlx::Error::TypeNotFound { .. }
            ),
            Self::Broker(_) | Self::Cache(_) | Self::Unavailable(_) => true,
            _ => false,
        }
    }
}
