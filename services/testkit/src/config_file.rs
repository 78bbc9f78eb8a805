//! The config file a service started as a child process reads
//! (`NOTIFY_CONFIG`): the settings a test changes from the defaults,
//! serialized with `toml`, so every value is quoted and escaped as TOML
//! wants.

use notify_domain::Settings;
use serde::Serialize;

#[derive(Serialize)]
struct ConfigFile<'a> {
    worker: Worker,
    console: Console,
    database: Database<'a>,
    rabbitmq: Rabbit<'a>,
    redis: Redis<'a>,
    retention: Retention,
    log: Log<'a>,
}

#[derive(Serialize)]
struct Worker {
    /// A port of its own: the test's in-process worker may hold another.
    metrics_listen: &'static str,
    scheduler_interval_ms: u64,
    sweep_interval_secs: u64,
    sweep_timeout_secs: u64,
    retry_base_ms: u64,
}

#[derive(Serialize)]
struct Console {
    /// A port of its own, as the metrics listener.
    listen: &'static str,
}

#[derive(Serialize)]
struct Database<'a> {
    pool_max: u32,
    shards: Vec<Shard<'a>>,
}

#[derive(Serialize)]
struct Shard<'a> {
    id: u32,
    database: &'a str,
}

#[derive(Serialize)]
struct Rabbit<'a> {
    prefix: &'a str,
}

#[derive(Serialize)]
struct Redis<'a> {
    key_prefix: &'a str,
}

#[derive(Serialize)]
struct Retention {
    interval_secs: u64,
}

#[derive(Serialize)]
struct Log<'a> {
    filter: &'a str,
}

/// The TOML text of `settings`' test-specific values.
pub(crate) fn to_toml(s: &Settings) -> String {
    let file = ConfigFile {
        worker: Worker {
            metrics_listen: "127.0.0.1:0",
            scheduler_interval_ms: s.worker.scheduler_interval_ms,
            sweep_interval_secs: s.worker.sweep_interval_secs,
            sweep_timeout_secs: s.worker.sweep_timeout_secs,
            retry_base_ms: s.worker.retry_base_ms,
        },
        console: Console { listen: "127.0.0.1:0" },
        database: Database {
            pool_max: s.database.pool_max,
            shards: s
                .database
                .shards
                .iter()
                .map(|shard| Shard { id: shard.id.0, database: &shard.database })
                .collect(),
        },
        rabbitmq: Rabbit { prefix: &s.rabbitmq.prefix },
        redis: Redis { key_prefix: &s.redis.key_prefix },
        retention: Retention { interval_secs: s.retention.interval_secs },
        log: Log { filter: &s.log.filter },
    };
    toml::to_string(&file).expect("settings serialize as TOML")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_reads_back_as_the_settings_it_was_written_from() {
        let mut settings = crate::test_settings();
        settings.log.filter = r#"warn,notify="debug\path""#.to_owned();
        let text = to_toml(&settings);
        let read: toml::Table = text.parse().expect("valid TOML");
        assert_eq!(read["log"]["filter"].as_str(), Some(settings.log.filter.as_str()));
        assert_eq!(read["rabbitmq"]["prefix"].as_str(), Some(settings.rabbitmq.prefix.as_str()));
        let shards = read["database"]["shards"].as_array().unwrap();
        assert_eq!(shards.len(), settings.database.shards.len());
        assert_eq!(
            shards[1]["database"].as_str(),
            Some(settings.database.shards[1].database.as_str())
        );
    }
}
