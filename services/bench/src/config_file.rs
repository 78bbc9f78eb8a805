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
    #[serde(skip_serializing_if = "Option::is_none")]
    auth: Option<Auth<'a>>,
    webhooks: Webhooks,
}

/// Only when clients are defined: their names, token digests and
/// endpoints (the chaos soak's `item.read` receiver).
#[derive(Serialize)]
struct Auth<'a> {
    enabled: bool,
    clients: Vec<Client<'a>>,
}

#[derive(Serialize)]
struct Client<'a> {
    name: &'a str,
    token_sha256: &'a [String],
    webhooks: Vec<Endpoint<'a>>,
}

#[derive(Serialize)]
struct Endpoint<'a> {
    url: &'a str,
    secret: &'a str,
    events: &'a [String],
}

#[derive(Serialize)]
struct Webhooks {
    read_flush_ms: u64,
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
    read_keep_warm_secs: u64,
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
            read_keep_warm_secs: s.database.read_keep_warm_secs,
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
        auth: (!s.auth.clients.is_empty()).then(|| Auth {
            enabled: s.auth.enabled,
            clients: s
                .auth
                .clients
                .iter()
                .map(|client| Client {
                    name: &client.name,
                    token_sha256: &client.token_sha256,
                    webhooks: client
                        .webhooks
                        .iter()
                        .map(|endpoint| Endpoint {
                            url: &endpoint.url,
                            secret: endpoint.secret.expose_secret(),
                            events: &endpoint.events,
                        })
                        .collect(),
                })
                .collect(),
        }),
        webhooks: Webhooks { read_flush_ms: s.webhooks.read_flush_ms },
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
        assert!(read.get("auth").is_none(), "no clients, no auth section");
    }

    #[test]
    fn a_client_and_its_endpoint_read_back_as_settings() {
        let mut settings = Settings::defaults().unwrap();
        let client: notify_domain::settings::ClientSettings = toml::from_str(&format!(
            "name = \"local\"\ntoken_sha256 = [\"{}\"]\n\
             [[webhooks]]\nurl = \"http://127.0.0.1:9/h\"\nsecret = \"whsec_c2VjcmV0\"\n\
             events = [\"item.read\"]\n",
            "0".repeat(64)
        ))
        .unwrap();
        settings.auth.clients = vec![client];
        let read: toml::Table = to_toml(&settings).parse().expect("valid TOML");
        let client = &read["auth"]["clients"].as_array().unwrap()[0];
        assert_eq!(client["name"].as_str(), Some("local"));
        let endpoint = &client["webhooks"].as_array().unwrap()[0];
        assert_eq!(endpoint["url"].as_str(), Some("http://127.0.0.1:9/h"));
        assert_eq!(endpoint["secret"].as_str(), Some("whsec_c2VjcmV0"));
        assert_eq!(endpoint["events"].as_array().unwrap()[0].as_str(), Some("item.read"));
    }
}
