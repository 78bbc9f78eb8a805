//! Integration tests of `notify-api` (with an in-process worker) against the
//! real MariaDB, RabbitMQ and Redis.

mod announce;
mod auth;
mod badge_cache;
mod console;
mod control;
mod erase;
mod events;
mod faults;
mod group_recall;
mod groups;
mod helpers;
mod ids;
mod inbox;
mod items;
mod keepalive;
mod lifecycle;
mod near_cache;
mod page_cache;
mod preferences;
mod read_counts;
mod recall;
mod recipients;
mod retention;
mod send;
mod server;
mod shard_map;
mod shard_move;
mod states;
mod templates;
mod tls;
mod traces;
mod validation;
