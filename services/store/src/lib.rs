//! Notify's system of record: the MySQL shards. One pool per shard routed
//! by the shard map, database creation and migrations, the repositories of
//! every table (chunks, items, messages, groups, audit), the versioned
//! bucket -> shard map that every replica follows, online bucket moves, and
//! the leases of message id instances.
//!
//! It depends on `notify-domain` and `shard-router` only: it never talks to
//! Redis or RabbitMQ (keeping caches and queues right around a write is the
//! engine's job, in `notify-core`), and knows nothing of the wire format.

pub mod db;
pub mod error;
pub mod instance_lease;
pub mod shard_map;
pub mod shard_move;

pub use error::{Error, Result};
