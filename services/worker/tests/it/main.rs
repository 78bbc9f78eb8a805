//! Fault tests of `notify-worker` against the real MariaDB, RabbitMQ and
//! Redis: a worker killed mid-send, redelivered tasks, lost publishes,
//! poison chunks and re-drive; webhooks against real HTTP endpoints.

mod broker;
mod faults;
mod preferences;
mod probes;
mod webhooks;
