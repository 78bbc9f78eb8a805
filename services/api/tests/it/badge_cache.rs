//! The badge cache's writes that delivery depends on, against the real
//! Redis (a single node, or the cluster of the suite's cluster pass).

use notify_cache::Cache;
use notify_testkit::test_settings;
use redis::AsyncCommands;

/// A delivery's invalidation drops the cached count, the lease and the
/// inbox pages of every user it names, over more users than one `DEL`
/// carries and ids of every length, and leaves every other user's keys alone.
#[tokio::test]
async fn invalidating_counts_drops_each_named_users_count_lease_and_pages_and_nothing_else() {
    let settings = test_settings();
    let cache = Cache::connect(&settings.redis).await.unwrap();
    let keys = cache.keys().clone();
    let mut conn = cache.connection();
    let users: Vec<u64> = (1..=1_200u64).map(|i| i * 997).chain([7, 12_345_678_901]).collect();
    let untouched = [4_242_424u64, 8];
    for user in users.iter().chain(&untouched) {
        let _: () = conn.set(keys.unread(*user), "1:3").await.unwrap();
        let _: () = conn.set(keys.unread_lease(*user), 9).await.unwrap();
        let _: () = conn.hset(keys.inbox_pages(*user), "p:q", "1:2:[]").await.unwrap();
    }

    cache.invalidate_counts(&users).await.unwrap();

    for user in &users {
        let named = [keys.unread(*user), keys.unread_lease(*user), keys.inbox_pages(*user)];
        let left: u64 = conn.exists(&named).await.unwrap();
        assert_eq!(left, 0, "user {user}: {left} of its count, lease and pages left");
    }
    for user in untouched {
        let named = [keys.unread(user), keys.unread_lease(user), keys.inbox_pages(user)];
        let left: u64 = conn.exists(&named).await.unwrap();
        assert_eq!(left, 3, "user {user} was not named but lost a key");
        let _: () = conn.del(&named).await.unwrap();
    }
}

/// A Redis that persists (a restart would reload badges and pages that later
/// writes had invalidated), or that refuses writes once full, is reported:
/// the api and the worker log each problem when they start. One run as a
/// cache is not.
#[tokio::test]
async fn a_redis_configured_against_the_cache_is_reported() {
    let server = notify_testkit::servers::RedisServer::start().await;
    let mut settings = test_settings().redis;
    settings.url = secrecy::SecretString::from(server.url());
    settings.cluster = false;
    let cache = Cache::connect(&settings).await.unwrap();
    let conn = cache.connection();
    let set = |name: &'static str, value: &'static str| {
        let mut conn = conn.clone();
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    // As the suite starts it: no persistence, no memory limit.
    assert_eq!(cache.server_config_problems().await, Vec::<String>::new());

    set("save", "3600 1").await;
    set("maxmemory", "100mb").await;
    let problems = cache.server_config_problems().await;
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("persistence is on (save \"3600 1\""), "{}", problems[0]);
    assert!(problems[1].starts_with("maxmemory 104857600 with maxmemory-policy noeviction"));

    set("save", "").await;
    set("appendonly", "yes").await;
    set("maxmemory-policy", "allkeys-lru").await;
    let problems = cache.server_config_problems().await;
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("appendonly yes"), "{}", problems[0]);

    set("appendonly", "no").await;
    assert_eq!(cache.server_config_problems().await, Vec::<String>::new());
}
