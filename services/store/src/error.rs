//! The store's error type: where sqlx's errors become domain errors. A MySQL
//! error is classified here ([`failure_of`]) into
//! [`notify_domain::Error::Database`], so that no crate above the store sees
//! the driver.

use notify_domain::error::DbFailure;

/// Shorthand for results of the store.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A domain error raised in the store. `?` makes one of a sqlx error or of
/// a [`notify_domain::Error`], and turns it back into the latter in the
/// caller: the type exists because only the store may convert sqlx's
/// errors.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Error(#[from] notify_domain::Error);

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Self(database_error(error))
    }
}

impl From<Error> for notify_domain::Error {
    fn from(error: Error) -> Self {
        error.0
    }
}

/// The domain error inside, for its questions (`is_transient`,
/// `db_failure`, ...).
impl std::ops::Deref for Error {
    type Target = notify_domain::Error;

    fn deref(&self) -> &notify_domain::Error {
        &self.0
    }
}

/// A sqlx error as callers see it: [`notify_domain::Error::Database`], with
/// its classification and message. Every sqlx error leaves the store
/// through here (by `?`, through [`Error`]), and so does one of the few
/// statements `notify-core` runs itself (`.map_err(database_error)`).
pub fn database_error(error: sqlx::Error) -> notify_domain::Error {
    notify_domain::Error::Database { failure: failure_of(&error), message: error.to_string() }
}

/// Classifies a sqlx error by its kind and, for a server error, by MySQL's
/// error number.
pub fn failure_of(error: &sqlx::Error) -> DbFailure {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => {
            DbFailure::ConnectionLost
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Tls(_) => {
            DbFailure::Unavailable
        }
        sqlx::Error::Database(e) => {
            let number = e
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map(sqlx::mysql::MySqlDatabaseError::number);
            match number {
                Some(1213) => DbFailure::Deadlock,
                Some(1205) => DbFailure::LockWaitTimeout,
                // Server shutdown, connection killed, aborted or
                // interrupted, network errors on the server's side.
                Some(1053 | 1077 | 1152 | 1153 | 1158..=1161 | 1317 | 1927 | 2006 | 2013) => {
                    DbFailure::ConnectionLost
                }
                // Too many connections, host blocked, read-only (a
                // failover), statement time limit, out of resources.
                Some(1040 | 1041 | 1129 | 1203 | 1290 | 1836 | 1969 | 3024) => {
                    DbFailure::Unavailable
                }
                _ if e.code().as_deref() == Some("40001") => DbFailure::Deadlock,
                _ => DbFailure::Internal,
            }
        }
        _ => DbFailure::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_errors_keep_their_message_and_class() {
        let lost = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let error = notify_domain::Error::from(Error::from(lost));
        assert_eq!(error.db_failure(), Some(DbFailure::ConnectionLost));
        assert!(error.is_broken_connection() && error.is_transient());
        assert!(error.to_string().starts_with("database: "), "{error}");

        let busy = notify_domain::Error::from(Error::from(sqlx::Error::PoolTimedOut));
        assert_eq!(busy.db_failure(), Some(DbFailure::Unavailable));
        assert_eq!(busy.code_name(), "unavailable");

        let wrong = notify_domain::Error::from(Error::from(sqlx::Error::RowNotFound));
        assert_eq!(wrong.db_failure(), Some(DbFailure::Internal));
        assert!(!wrong.is_transient());
        assert_eq!(wrong.code_name(), "internal");
    }

    #[test]
    fn domain_errors_pass_through_unchanged() {
        let error = notify_domain::Error::from(Error::from(notify_domain::Error::NotFound(
            "message 7".into(),
        )));
        assert!(matches!(error, notify_domain::Error::NotFound(ref what) if what == "message 7"));
    }
}
