//! Notify's engine: what happens to a message. Sending to user lists (plan,
//! chunks, lifecycle, progress), delivering chunks in the worker, platform
//! announcements, the inbox read side with its badges and page cache
//! protocol, group messages, the event bus that feeds gateway streams, the
//! RabbitMQ topology and publisher, audit, retention, and the runtime every
//! service shares (the [`Context`] of connected backends, health, telemetry).
//!
//! It builds on `notify-domain` (types and settings), `notify-store` (the
//! MySQL shards) and `notify-cache` (Redis); it must not depend on the wire
//! format (`notify-proto`) nor on the services that serve it: the api, the
//! worker and `notifyctl` depend on it, never the other way round.

pub mod announce;
pub mod audit;
pub mod broker;
pub mod context;
pub mod control;
pub mod deliver;
pub mod edit;
pub mod erase;
pub mod events;
pub mod groups;
pub mod health;
pub mod inbox;
pub mod lookups;
pub mod preferences;
pub mod queue;
pub mod recall;
pub mod recipients;
pub mod render;
pub mod repair;
pub mod retention;
pub mod send;
pub mod shard_map;
pub mod status;
pub mod sweeper;
pub mod telemetry;
pub mod user_tokens;
pub mod webhooks;

pub use context::Context;
