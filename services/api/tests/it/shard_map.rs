//! The versioned shard map: stored on the directory shard, seeded from the
//! config once, followed by every api and worker replica within seconds.

use std::time::Duration;

use notify_core::shard_map;
use notify_proto::v1;
use notify_testkit::{TestApp, eventually, spawn_app_with, test_settings};

use crate::helpers::badge;
use shard_router::{BUCKETS, ShardId, ShardMap, bucket_of};

fn fast_settings() -> notify_core::Settings {
    let mut settings = test_settings();
    settings.database.shard_map_refresh_ms = 100;
    settings
}

/// Waits until the api and the worker both report `version` (and `refused`).
async fn replicas_report(app: &TestApp, version: u64, refused: u64) {
    let directory = shard_map::directory(&app.ctx.pools).unwrap().clone();
    eventually("both replicas report the version", Duration::from_secs(10), || {
        let directory = directory.clone();
        async move {
            let replicas = shard_map::replicas(&directory).await.unwrap();
            let roles: Vec<&str> = replicas.iter().map(|r| r.role.as_str()).collect();
            let done = replicas.len() == 2
                && roles.contains(&"api")
                && roles.contains(&"worker")
                && replicas.iter().all(|r| r.version == version && r.refused == refused);
            done.then_some(())
        }
    })
    .await;
}

async fn items_on(app: &TestApp, shard: ShardId, user_id: u64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM message_items WHERE user_id = ?")
        .bind(user_id)
        .fetch_one(app.ctx.pools.get(shard).unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn replicas_follow_a_new_version_within_seconds_and_route_by_it() {
    let app = spawn_app_with(fast_settings(), true).await;
    replicas_report(&app, 1, 0).await;
    // A user of shard 0 whose bucket (no data yet) is given to shard 1.
    let user = (1..).find(|u| app.ctx.pools.for_user(*u).0 == ShardId(0)).unwrap();
    let bucket = bucket_of(user);
    let moved = app.ctx.pools.map().with_range(ShardId(1), bucket, bucket).unwrap();
    let version =
        shard_map::append(&app.ctx.pools, 1, &moved, "test: bucket to shard 1").await.unwrap();
    assert_eq!(version, 2);
    replicas_report(&app, 2, 0).await;
    assert_eq!(app.ctx.pools.for_user(user).0, ShardId(1));

    let message_id = app.send(vec![user]).await;
    app.wait_for_status(message_id, v1::MessageStatus::Completed).await;
    assert_eq!(items_on(&app, ShardId(1), user).await, 1, "delivered to the new owner");
    assert_eq!(items_on(&app, ShardId(0), user).await, 0, "nothing on the old one");
    assert_eq!(badge(&app, user).await, 1);

    // A stale writer is refused: the version after 1 exists.
    let error = shard_map::append(&app.ctx.pools, 1, &moved, "late").await.unwrap_err();
    assert!(error.to_string().contains("changed since version 1"), "{error}");
    app.cleanup().await;
}

#[tokio::test]
async fn a_version_naming_an_unconfigured_shard_is_refused_and_reported() {
    let app = spawn_app_with(fast_settings(), true).await;
    replicas_report(&app, 1, 0).await;
    let user = 42;
    let owner = app.ctx.pools.for_user(user).0;
    let bucket = bucket_of(user);
    let foreign = app.ctx.pools.map().with_shard(ShardId(9)).unwrap();
    let foreign = foreign.with_range(ShardId(9), bucket, bucket).unwrap();
    shard_map::append(&app.ctx.pools, 1, &foreign, "test: shard 9 nobody knows").await.unwrap();
    replicas_report(&app, 1, 2).await;
    assert_eq!(app.ctx.pools.version(), 1);
    assert_eq!(app.ctx.pools.for_user(user).0, owner, "routing unchanged");

    let message_id = app.send(vec![user]).await;
    app.wait_for_status(message_id, v1::MessageStatus::Completed).await;
    assert_eq!(items_on(&app, owner, user).await, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn the_stored_map_wins_over_the_config_and_shard_add_registers_a_configured_shard() {
    let settings = fast_settings();
    // A store written while the config had three shards...
    notify_core::db::migrate_all(&settings).await.unwrap();
    let three = ShardMap::even(&[ShardId(0), ShardId(1), ShardId(2)]).unwrap();
    let directory = sqlx::MySqlPool::connect(&format!(
        "{}/{}",
        settings.shard_server_url(&settings.database.shards[0]),
        settings.database.shards[0].database
    ))
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO shard_map_versions (version, shard_map, reason) VALUES (1, ?, 'three')",
    )
    .bind(three.to_string())
    .execute(&directory)
    .await
    .unwrap();
    // ...then a fourth shard in the config, whose even split would move
    // three quarters of the buckets. The stored map is what routes.
    let app = spawn_app_with(settings, true).await;
    assert_eq!(app.ctx.pools.map().to_string(), three.to_string());
    let user = (1..).find(|u| bucket_of(*u) >= BUCKETS * 3 / 4).unwrap();
    assert_eq!(app.ctx.pools.for_user(user).0, ShardId(2), "not shard 3 of an even split");
    let message_id = app.send(vec![user]).await;
    app.wait_for_status(message_id, v1::MessageStatus::Completed).await;
    assert_eq!(items_on(&app, ShardId(2), user).await, 1);

    let added = shard_map::add_shard(&app.settings, &app.ctx.pools, ShardId(3)).await.unwrap();
    assert_eq!(added, 2);
    replicas_report(&app, 2, 0).await;
    let map = app.ctx.pools.map();
    assert_eq!(map.shards(), [ShardId(0), ShardId(1), ShardId(2), ShardId(3)]);
    assert!(map.ranges().iter().all(|r| r.shard != ShardId(3)), "owns nothing yet");
    let again = shard_map::add_shard(&app.settings, &app.ctx.pools, ShardId(3)).await.unwrap_err();
    assert!(again.to_string().contains("already in the shard map"), "{again}");
    let unknown =
        shard_map::add_shard(&app.settings, &app.ctx.pools, ShardId(7)).await.unwrap_err();
    assert!(unknown.to_string().contains("shard 7 is not in database.shards"), "{unknown}");
    directory.close().await;
    app.cleanup().await;
}
