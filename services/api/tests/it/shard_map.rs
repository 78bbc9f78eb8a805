//! The versioned shard map: stored on the directory shard, seeded from the
//! config once, followed by every api and worker replica within seconds.

use std::time::Duration;

use notify_proto::v1;
use notify_store::shard_map;
use notify_testkit::{TestApp, eventually, spawn_app_with, test_settings};

use crate::helpers::{append_and_start, badge, create_draft};
use shard_router::{BUCKETS, BucketSet, ShardId, ShardMap, bucket_of};

fn fast_settings() -> notify_domain::Settings {
    let mut settings = test_settings();
    settings.database.shard_map_refresh_ms = 100;
    settings
}

/// Waits until the api and the worker both report `version` (and `refused`),
/// and this build's schema version, which the contract step waits on.
async fn replicas_report(app: &TestApp, version: u64, refused: u64) {
    let schema = notify_store::db::contract::schema_version();
    let directory = shard_map::directory(&app.ctx.pools).unwrap().clone();
    eventually("both replicas report the version", Duration::from_secs(10), || {
        let directory = directory.clone();
        async move {
            let replicas = shard_map::replicas(&directory).await.unwrap();
            let roles: Vec<&str> = replicas.iter().map(|r| r.role.as_str()).collect();
            let done = replicas.len() == 2
                && roles.contains(&"api")
                && roles.contains(&"worker")
                && replicas.iter().all(|r| {
                    r.version == version && r.refused == refused && r.schema_version == schema
                });
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
    let user = (1..).find(|u| app.ctx.pools.for_user(*u).shard() == ShardId(0)).unwrap();
    let bucket = bucket_of(user);
    let moved = app.ctx.pools.map().with_range(ShardId(1), bucket, bucket).unwrap();
    let version =
        shard_map::append(&app.ctx.pools, 1, &moved, "test: bucket to shard 1").await.unwrap();
    assert_eq!(version, 2);
    replicas_report(&app, 2, 0).await;
    assert_eq!(app.ctx.pools.for_user(user).shard(), ShardId(1));

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
    let owner = app.ctx.pools.for_user(user).shard();
    let bucket = bucket_of(user);
    let foreign = app.ctx.pools.map().with_shard(ShardId(9)).unwrap();
    let foreign = foreign.with_range(ShardId(9), bucket, bucket).unwrap();
    shard_map::append(&app.ctx.pools, 1, &foreign, "test: shard 9 nobody knows").await.unwrap();
    replicas_report(&app, 1, 2).await;
    assert_eq!(app.ctx.pools.version(), 1);
    assert_eq!(app.ctx.pools.for_user(user).shard(), owner, "routing unchanged");

    let message_id = app.send(vec![user]).await;
    app.wait_for_status(message_id, v1::MessageStatus::Completed).await;
    assert_eq!(items_on(&app, owner, user).await, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn the_stored_map_wins_over_the_config_and_shard_add_registers_a_configured_shard() {
    let settings = fast_settings();
    // A store written while the config had three shards...
    notify_store::db::migrate_all(&settings).await.unwrap();
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
    assert_eq!(app.ctx.pools.for_user(user).shard(), ShardId(2), "not shard 3 of an even split");
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

/// Users that `app` routes to `shard`, in id order.
fn users_of(app: &TestApp, shard: ShardId, n: usize) -> Vec<u64> {
    (1..).filter(|u| app.ctx.pools.for_user(*u).shard() == shard).take(n).collect()
}

#[tokio::test]
async fn chunks_planned_by_an_older_map_are_split_to_the_shards_the_new_map_routes_to() {
    let app = spawn_app_with(fast_settings(), true).await;
    replicas_report(&app, 1, 0).await;
    // Three chunks of shard 0's users, stored on shard 0 by version 1.
    let users = users_of(&app, ShardId(0), 1_200);
    // The send's home stays where it is: this test moves no rows, only chunks.
    let mut draft = create_draft(&app, "planned before the map changed").await;
    while bucket_of(draft) < 192 {
        draft = create_draft(&app, "planned before the map changed").await;
    }
    let batch = v1::AppendRecipientsRequest {
        message_id: draft,
        batch_number: 1,
        user_ids: users.clone(),
        ..Default::default()
    };
    app.messages().append_recipients(batch).await.unwrap();
    // Version 2 gives half of shard 0's buckets to shard 1, a quarter to shard 2.
    let map = app.ctx.pools.map().with_range(ShardId(1), 0, 127).unwrap();
    let map = map.with_range(ShardId(2), 128, 191).unwrap();
    shard_map::append(&app.ctx.pools, 1, &map, "test: split shard 0").await.unwrap();
    replicas_report(&app, 2, 0).await;

    app.messages().start_message(v1::StartMessageRequest { message_id: draft }).await.unwrap();
    let done = app.wait_for_status(draft, v1::MessageStatus::Completed).await;
    // Every recipient once, on the shard version 2 routes them to.
    let places = app.item_shards(draft).await;
    assert_eq!(places.keys().copied().collect::<Vec<_>>(), users);
    for (user, shards) in &places {
        assert_eq!(shards, &[map.shard_for_user(*user)], "user {user}'s item");
    }
    let owners: std::collections::BTreeSet<ShardId> = places.values().map(|s| s[0]).collect();
    assert_eq!(owners.into_iter().collect::<Vec<_>>(), [ShardId(0), ShardId(1), ShardId(2)]);
    let progress = done.progress.expect("progress");
    assert_eq!((progress.total, progress.delivered, progress.pending), (1_200, 1_200, 0));
    // The moved recipients went as chunks of their own on their new shards.
    for shard in [ShardId(1), ShardId(2)] {
        let split: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM message_chunks WHERE message_id = ? AND chunk_id >= 1 << 63",
        )
        .bind(draft)
        .fetch_one(app.ctx.pools.get(shard).unwrap())
        .await
        .unwrap();
        assert!(split >= 1, "no split chunk on shard {shard}");
    }
    let moved = *users.iter().find(|u| map.shard_for_user(**u) == ShardId(1)).unwrap();
    assert_eq!(badge(&app, moved).await, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn a_frozen_bucket_holds_writes_until_the_flip_while_reads_go_on() {
    let app = spawn_app_with(fast_settings(), true).await;
    replicas_report(&app, 1, 0).await;
    // The send's draft first, so that the frozen bucket is not its home
    // bucket (1 send in 1,024): its own record's writes would wait too.
    let sent = create_draft(&app, "frozen").await;
    let user = users_of(&app, ShardId(0), 8).into_iter().find(|u| bucket_of(*u) != bucket_of(sent));
    let user = user.expect("a user outside the send's home bucket");
    let bucket = bucket_of(user);
    let before = app.ctx.pools.map();
    let frozen = BucketSet::range(bucket, bucket);
    shard_map::append_frozen(&app.ctx.pools, 1, &before, frozen, "test: freeze").await.unwrap();
    replicas_report(&app, 2, 0).await;

    // Reads answer at once; a send is accepted; a mark-read waits, and so
    // does the worker with the send's chunk.
    assert_eq!(badge(&app, user).await, 0);
    append_and_start(&app, sent, vec![user]).await;
    let mut inbox = app.inbox();
    let mut mark = tokio::spawn(async move {
        inbox.mark_all_read(v1::MarkAllReadRequest { user_id: user, ..Default::default() }).await
    });
    let waited = tokio::time::timeout(Duration::from_secs(1), &mut mark).await;
    assert!(waited.is_err(), "a write to a frozen bucket went ahead");
    let message = app.get_message(sent).await;
    assert_eq!(message.status, v1::MessageStatus::Sending as i32, "delivered into a frozen bucket");
    assert_eq!(items_on(&app, ShardId(0), user).await, 0);

    // The flip: shard 1 owns the bucket, unfrozen. Both writes go there.
    let after = before.with_range(ShardId(1), bucket, bucket).unwrap();
    shard_map::append(&app.ctx.pools, 2, &after, "test: flip").await.unwrap();
    mark.await.unwrap().expect("the mark-read ran after the freeze");
    app.wait_for_status(sent, v1::MessageStatus::Completed).await;
    assert_eq!(items_on(&app, ShardId(1), user).await, 1, "delivered to the new owner");
    assert_eq!(items_on(&app, ShardId(0), user).await, 0, "nothing on the old one");
    assert_eq!(badge(&app, user).await, app.unread_truth(user).await);
    app.cleanup().await;
}
