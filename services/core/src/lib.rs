//! Notify's domain and storage: settings, ids, the shard schema and its
//! repositories, the RabbitMQ topology, the Redis cache, and the send,
//! delivery and inbox logic shared by `notify-api`, `notify-worker` and
//! `notifyctl`.

pub mod announce;
pub mod audit;
pub mod auth;
pub mod cache;
pub mod context;
pub mod db;
pub mod deliver;
pub mod domain;
pub mod error;
pub mod events;
pub mod groups;
pub mod health;
pub mod ids;
pub mod inbox;
pub mod queue;
pub mod quota;
pub mod retention;
pub mod send;
pub mod settings;
pub mod shard_map;
pub mod shard_move;
pub mod telemetry;

pub use context::Context;
pub use error::{Error, Result};
pub use settings::Settings;
