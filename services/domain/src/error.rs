//! The error type of the domain and storage layers. The api maps it to a gRPC
//! status in exactly one place; internal details are logged, never sent.
//!
//! A backend's error arrives here already classified, by the crate that
//! talks to the backend: `notify-store` for MySQL ([`Error::Database`],
//! with its [`DbFailure`]), `notify-cache` for Redis ([`Error::Cache`]) and
//! the queue and bus code of `notify-core` for RabbitMQ ([`Error::Broker`]).

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
    /// A MySQL error, classified by `notify-store` where it left the
    /// driver.
    #[error("database: {message}")]
    Database {
        /// What the failure means for whoever ran the statement.
        failure: DbFailure,
        /// The driver's description of it.
        message: String,
    },
    /// A RabbitMQ error (the broker is down or refused the work: the
    /// caller may retry).
    #[error("broker: {0}")]
    Broker(String),
    /// A Redis error (the cache is down or refused the work: the caller
    /// may retry).
    #[error("cache: {0}")]
    Cache(String),
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

    /// Says what kind of database failure this is, for a database error:
    /// what the system does about it ([`DbFailure`]).
    pub fn db_failure(&self) -> Option<DbFailure> {
        match self {
            Self::Database { failure, .. } => Some(*failure),
            _ => None,
        }
    }

    /// Returns true when InnoDB rolled the work back as a deadlock victim
    /// or gave up waiting for a lock: running the whole transaction again
    /// is the documented remedy.
    pub fn is_lock_conflict(&self) -> bool {
        matches!(self.db_failure(), Some(DbFailure::Deadlock | DbFailure::LockWaitTimeout))
    }

    /// Returns true when the MySQL connection itself failed (closed or
    /// reset under the statement): the work may be run again at once, on
    /// another connection (the pool closes a broken one on its release).
    pub fn is_broken_connection(&self) -> bool {
        self.db_failure() == Some(DbFailure::ConnectionLost)
    }

    /// Returns true when retrying the same operation later may succeed: a
    /// dependency is down or busy. A database error that says the request
    /// itself is wrong (a constraint, a value too long, a bad statement) is
    /// not: retrying it fails the same way, and it surfaces as INTERNAL.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database { failure, .. } => failure.is_transient(),
            Self::Broker(_) | Self::Cache(_) | Self::Unavailable(_) => true,
            _ => false,
        }
    }
}

/// What a database error means for whoever ran the statement. The store
/// classifies MySQL's errors (`notify_store::error::failure_of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DbFailure {
    /// InnoDB picked the transaction as a deadlock victim (1213) and rolled
    /// it back: run it again.
    Deadlock,
    /// A lock was not granted within `innodb_lock_wait_timeout` (1205):
    /// run the whole transaction again.
    LockWaitTimeout,
    /// The connection broke under the statement (reset, closed, killed,
    /// the server went away: 2006, 2013, 1927, 1053): a read or an
    /// idempotent write may run again on a fresh connection.
    ConnectionLost,
    /// The server cannot take the work now (no connection in time, too
    /// many connections, read-only during a failover, a statement over its
    /// time limit): a dependency is down, the caller may retry later.
    Unavailable,
    /// Anything else (a constraint, data too long, an unknown column, a
    /// value that does not decode): the request or the code is wrong, and
    /// running it again fails the same way.
    Internal,
}

impl DbFailure {
    /// Returns true for the failures that may pass when tried again later.
    pub fn is_transient(self) -> bool {
        self != Self::Internal
    }

    /// A short name for metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Deadlock => "deadlock",
            Self::LockWaitTimeout => "lock_wait_timeout",
            Self::ConnectionLost => "connection_lost",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }
}
