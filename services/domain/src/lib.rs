//! Notify's vocabulary, shared by every other crate: ids and domain types
//! (users, messages, content, send states, lanes), the typed settings with
//! their documented defaults (`default.toml`), callers and their scopes, and
//! the error type that one place in the api maps to gRPC statuses, and the
//! reconnect backoff every long-lived connection follows (delays only: the
//! callers sleep).
//!
//! It must not depend on any other Notify crate (the pure `shard-router`
//! aside), nor on the wire format (`notify-proto`), and it does no I/O: it
//! depends on no backend client (sqlx, lapin, redis), whose errors the crates
//! that use them turn into [`Error`]'s variants (`scripts/module-cycles`
//! checks it).

pub mod auth;
pub mod backoff;
pub mod domain;
pub mod error;
pub mod ids;
pub mod limits;
pub mod locale;
pub mod preferences;
pub mod scope;
pub mod settings;
pub mod template;

pub use error::{Error, Result};
pub use settings::Settings;

/// A label-less counter resolved once per call site, for paths every call
/// takes: `metrics::counter!` looks its name up in the registry each time
/// (hashing and comparing the key), which a badge read paid twice per call.
/// Resolve only after the recorder is installed (a handle taken before it
/// counts nowhere); the services install it before serving.
#[macro_export]
macro_rules! hot_counter {
    ($name:literal) => {{
        static COUNTER: std::sync::OnceLock<metrics::Counter> = std::sync::OnceLock::new();
        COUNTER.get_or_init(|| metrics::counter!($name))
    }};
}
