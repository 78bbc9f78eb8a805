//! The config file the children read (`NOTIFY_CONFIG`): every setting the
//! bench changes, plus the server urls, so the file is the whole story.
//! Serialized with `toml`, so every value is quoted and escaped as TOML
//! wants (a password with a quote in a url, say).

use notify_domain::Settings;
use secrecy::ExposeSecret;
use serde::Serialize;

#[derive(Serialize)]
struct ConfigFile<'a> {
    api: Api<'a>,
    worker: Worker<'a>,
    database: Database<'a>,
    rabbitmq: Rabbit<'a>,
    redis: Redis<'a>,
    inbox: Inbox,
    console: Console<'a>,
    log: Log<'a>,
}

#[derive(Serialize)]
struct Api<'a> {
    listen: &'a str,
    metrics_listen: &'a str,
    worker_threads: usize,
}

#[derive(Serialize)]
struct Worker<'a> {
    metrics_listen: &'a str,
    concurrency: usize,
    chunks_per_transaction: usize,
    sweep_timeout_secs: u64,
    operation_timeout_secs: u64,
}

#[derive(Serialize)]
struct Database<'a> {
    url: &'a str,
    pool_max: u32,
    read_connections: usize,
    shards: Vec<Shard<'a>>,
    /// Always empty: the shards split the buckets evenly.
    bucket_ranges: &'static [u32],
}

#[derive(Serialize)]
struct Shard<'a> {
    id: u32,
    database: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<&'a str>,
}

#[derive(Serialize)]
struct Rabbit<'a> {
    url: &'a str,
    prefix: &'a str,
}

#[derive(Serialize)]
struct Redis<'a> {
    url: &'a str,
    key_prefix: &'a str,
    near_cache_users: usize,
    near_cache_max_lag_ms: u64,
}

#[derive(Serialize)]
struct Inbox {
    page_cache_ttl_secs: u64,
}

#[derive(Serialize)]
struct Console<'a> {
    listen: &'a str,
    update_interval_ms: u64,
}

#[derive(Serialize)]
struct Log<'a> {
    filter: &'a str,
}

/// The TOML text of the config file for `s`.
pub fn to_toml(s: &Settings) -> String {
    let file = ConfigFile {
        api: Api {
            listen: &s.api.listen,
            metrics_listen: &s.api.metrics_listen,
            worker_threads: s.api.worker_threads,
        },
        worker: Worker {
            metrics_listen: &s.worker.metrics_listen,
            concurrency: s.worker.concurrency,
            chunks_per_transaction: s.worker.chunks_per_transaction,
            sweep_timeout_secs: s.worker.sweep_timeout_secs,
            operation_timeout_secs: s.worker.operation_timeout_secs,
        },
        database: Database {
            url: s.database.url.expose_secret(),
            pool_max: s.database.pool_max,
            read_connections: s.database.read_connections,
            shards: s
                .database
                .shards
                .iter()
                .map(|shard| Shard {
                    id: shard.id.0,
                    database: &shard.database,
                    url: shard.url.as_ref().map(|url| url.expose_secret()),
                })
                .collect(),
            bucket_ranges: &[],
        },
        rabbitmq: Rabbit { url: s.rabbitmq.url.expose_secret(), prefix: &s.rabbitmq.prefix },
        redis: Redis {
            url: s.redis.url.expose_secret(),
            key_prefix: &s.redis.key_prefix,
            near_cache_users: s.redis.near_cache_users,
            near_cache_max_lag_ms: s.redis.near_cache_max_lag_ms,
        },
        inbox: Inbox { page_cache_ttl_secs: s.inbox.page_cache_ttl_secs },
        console: Console {
            listen: &s.console.listen,
            update_interval_ms: s.console.update_interval_ms,
        },
        log: Log { filter: &s.log.filter },
    };
    toml::to_string(&file).expect("settings serialize as TOML")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_and_read_back_as_written() {
        let mut settings = Settings::defaults().unwrap();
        settings.database.url = r#"mysql://notify:pa"ss\word@127.0.0.1:3306"#.to_owned().into();
        settings.database.shards[1].url = Some("mysql://other@127.0.0.1:3307".to_owned().into());
        let read: toml::Table = to_toml(&settings).parse().expect("valid TOML");
        let url = read["database"]["url"].as_str();
        assert_eq!(url, Some(settings.database.url.expose_secret()));
        let shards = read["database"]["shards"].as_array().unwrap();
        assert_eq!(shards.len(), settings.database.shards.len());
        assert!(shards[0].get("url").is_none());
        assert_eq!(shards[1]["url"].as_str(), Some("mysql://other@127.0.0.1:3307"));
        assert_eq!(read["database"]["bucket_ranges"].as_array().map(Vec::len), Some(0));
        assert_eq!(read["log"]["filter"].as_str(), Some(settings.log.filter.as_str()));
    }
}
