//! The badge cache's writes that delivery depends on, against the real
//! Redis (a single node, or the cluster of the suite's cluster pass).

use notify_core::cache::Cache;
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
