//! RabbitMQ's errors as callers see them. Every lapin error leaves the queue
//! and bus code (the publisher and topology of [`crate::queue`], the webhook
//! topology, the api's event bus, the worker's consumers) through
//! [`broker_error`], so that no crate above names lapin's error type.

use notify_domain::Error;

/// A lapin error as [`Error::Broker`], which is transient: the broker is
/// away or refused the work, and the call may run again.
pub fn broker_error(error: lapin::Error) -> Error {
    Error::Broker(error.to_string())
}
