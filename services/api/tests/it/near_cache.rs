//! The api's near cache of badge keys (`redis.near_cache_users`): badges
//! answered without a Redis round trip, dropped when another process
//! changes a key (a Redis invalidation push), never served past the lag
//! after its connection goes quiet, and bounded in size.

use std::time::Duration;

use notify_cache::Cache;
use notify_domain::Settings;
use notify_testkit::faults::route_through_proxies;
use notify_testkit::{TestApp, eventually, spawn_app_with, test_settings};

use crate::helpers::{badge, send, wait_for_status};
use notify_proto::v1;

/// Badge reads that went to Redis (through the batching reader) so far.
fn redis_reads(app: &TestApp) -> u64 {
    app.ctx.cache.user_state_read_stats().0
}

/// Reads `user`'s badge until one is answered from the near cache (its
/// connection tracks once it is up); returns that badge.
async fn badge_from_near_cache(app: &TestApp, user: u64) -> u64 {
    eventually("a badge answered from the near cache", Duration::from_secs(10), || async {
        let before = redis_reads(app);
        let unread = badge(app, user).await;
        (redis_reads(app) == before).then_some(unread)
    })
    .await
}

/// What a writer in another process does to a badge: the change in MySQL,
/// then the invalidation in Redis (as a worker's delivery does).
async fn mark_read_elsewhere(app: &TestApp, elsewhere: &Cache, user: u64) {
    sqlx::query(
        "UPDATE message_items SET is_read = 1, read_time = UTC_TIMESTAMP(3) WHERE user_id = ?",
    )
    .bind(user)
    .execute(&*app.ctx.pools.for_user(user))
    .await
    .unwrap();
    elsewhere.invalidate_counts(&[user]).await.unwrap();
}

/// A user with one delivered, unread item.
async fn user_with_one_item(app: &TestApp, user: u64) {
    let sent = send(app, vec![user]).await;
    wait_for_status(app, sent, v1::MessageStatus::Completed).await;
}

/// An app whose Redis is reached through a proxy, a cache of "another
/// process" reaching Redis directly, and `user` with one unread item whose
/// badge the api's near cache holds.
async fn proxied_app_holding_a_badge(
    mut settings: Settings,
    user: u64,
) -> (TestApp, notify_testkit::faults::Proxies, Cache) {
    let direct: Settings = settings.clone();
    let proxies = route_through_proxies(&mut settings).await;
    let app = spawn_app_with(settings, true).await;
    let elsewhere = Cache::connect(&direct.redis).await.unwrap();
    user_with_one_item(&app, user).await;
    assert_eq!(badge_from_near_cache(&app, user).await, 1);
    (app, proxies, elsewhere)
}

#[tokio::test]
async fn badges_are_answered_from_the_near_cache_until_another_process_changes_them() {
    let settings = test_settings();
    let app = spawn_app_with(settings.clone(), true).await;
    let elsewhere = Cache::connect(&settings.redis).await.unwrap();
    let user = 4_401;
    user_with_one_item(&app, user).await;
    assert_eq!(badge_from_near_cache(&app, user).await, 1);
    let before = redis_reads(&app);
    for _ in 0..20 {
        assert_eq!(badge(&app, user).await, 1);
    }
    assert_eq!(redis_reads(&app), before, "repeated badges went to Redis");

    // Another process marks it read: once the api has synced with Redis,
    // its copy is gone and the badge is the new truth.
    mark_read_elsewhere(&app, &elsewhere, user).await;
    app.ctx.cache.sync_near_cache().await;
    assert_eq!(badge(&app, user).await, 0);
    assert_eq!(app.unread_truth(user).await, 0);
    // The new count is cached again, in Redis and here.
    assert_eq!(badge_from_near_cache(&app, user).await, 0);

    // Without a sync, the push alone drops the copy (no read is needed).
    let sent = send(&app, vec![user]).await;
    wait_for_status(&app, sent, v1::MessageStatus::Completed).await;
    eventually("the delivery's invalidation reaches the api", Duration::from_secs(5), || async {
        (badge(&app, user).await == 1).then_some(())
    })
    .await;
    // This api's own writes are seen at once (mark-read goes through it).
    let mut inbox = app.inbox();
    inbox
        .mark_all_read(v1::MarkAllReadRequest { user_id: user, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(badge(&app, user).await, 0);
    app.cleanup().await;
}

/// Redis black-holed for the api only: no push and no heartbeat reach it,
/// so the copy it holds stops being served within the lag, and badges are
/// counted in MySQL meanwhile.
#[tokio::test]
async fn a_near_cache_that_stops_hearing_from_redis_stops_serving_within_its_lag() {
    let mut settings = test_settings();
    settings.redis.near_cache_max_lag_ms = 300;
    let user = 4_402;
    let (app, proxies, elsewhere) = proxied_app_holding_a_badge(settings, user).await;

    proxies.redis.black_hole().await;
    mark_read_elsewhere(&app, &elsewhere, user).await;
    eventually("the stale copy stops being served", Duration::from_secs(15), || async {
        (badge(&app, user).await == 0).then_some(())
    })
    .await;
    proxies.redis.heal().await;
    proxies.redis.reset_connections().await;
    // Back in sync: served from the copy again, and right.
    assert_eq!(badge_from_near_cache(&app, user).await, 0);
    app.cleanup().await;
}

/// The tracking connection lost (Redis restarting): everything held is
/// dropped, changes made meanwhile are read, and the copy refills.
#[tokio::test]
async fn a_lost_tracking_connection_drops_every_copy() {
    let user = 4_403;
    let (app, proxies, elsewhere) = proxied_app_holding_a_badge(test_settings(), user).await;
    assert!(app.ctx.cache.near_cache_held().0 >= 1);

    proxies.redis.down().await;
    eventually("the copy is dropped with its connection", Duration::from_secs(10), || async {
        (app.ctx.cache.near_cache_held() == (0, 0)).then_some(())
    })
    .await;
    mark_read_elsewhere(&app, &elsewhere, user).await;
    proxies.redis.up().await;
    assert_eq!(badge_from_near_cache(&app, user).await, 0);
    app.cleanup().await;
}

#[tokio::test]
async fn the_near_cache_holds_at_most_its_capacity_and_answers_right_beyond_it() {
    let mut settings = test_settings();
    settings.redis.near_cache_users = 8;
    let app = spawn_app_with(settings, true).await;
    let users: Vec<u64> = (4_500..4_540).collect();
    let sent = send(&app, users.clone()).await;
    wait_for_status(&app, sent, v1::MessageStatus::Completed).await;
    badge_from_near_cache(&app, users[0]).await;
    for user in &users {
        assert_eq!(badge(&app, *user).await, 1);
    }
    let (held, _) = app.ctx.cache.near_cache_held();
    assert!(held <= 8, "{held} users held, capacity 8");
    app.cleanup().await;
}
