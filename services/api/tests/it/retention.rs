//! Retention: item partitions created ahead and dropped past the horizon
//! (inbox, badges and progress right across a drop, nothing newer touched),
//! hidden (expired) items purged, and the worker's own run at start.

use std::time::Duration;

use chrono::{DateTime, Utc};
use notify_core::retention::{self, partitions};
use notify_domain::ids;
use notify_domain::settings::RetentionSettings;
use notify_proto::v1;
use notify_testkit::{TestApp, eventually, spawn_app_with, test_settings};

use crate::helpers::{badge, get, inbox_ids, send, send_request, wait_for_status};

/// Retention of items only (sends, chunks and audit rows kept).
fn items_only(items_days: u32) -> RetentionSettings {
    RetentionSettings {
        interval_secs: 0,
        items_days,
        months_ahead: 2,
        purge_hidden_after_secs: 3600,
        chunks_days: 0,
        sends_days: 0,
        audit_days: 0,
        group_messages_days: 0,
        purge_batch_rows: 10_000,
    }
}

/// Stores an item (and its content) for `user_id` as if it had been sent at `at`.
async fn item_sent_at(app: &TestApp, user_id: u64, at: DateTime<Utc>, offset: u64) -> u64 {
    let message_id = ids::first_id_at(at.timestamp_millis() as u64) + offset;
    let pool = app.ctx.pools.for_user(user_id).value();
    sqlx::query(
        "INSERT INTO message_contents (message_id, title, body, category, data, created_at) \
         VALUES (?, 'old', 'old', '', '{}', ?)",
    )
    .bind(message_id)
    .bind(at.naive_utc())
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO message_items (user_id, message_id, created_at) VALUES (?, ?, ?)")
        .bind(user_id)
        .bind(message_id)
        .bind(at.naive_utc())
        .execute(pool)
        .await
        .unwrap();
    message_id
}

async fn item_exists(app: &TestApp, user_id: u64, message_id: u64) -> bool {
    let pool = app.ctx.pools.for_user(user_id).value();
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM message_items WHERE user_id = ? AND message_id = ?",
    )
    .bind(user_id)
    .bind(message_id)
    .fetch_one(pool)
    .await
    .unwrap();
    n == 1
}

async fn month_names(app: &TestApp, user_id: u64) -> Vec<String> {
    let pool = app.ctx.pools.for_user(user_id).value();
    partitions::existing(pool).await.unwrap().into_iter().map(|m| m.name).collect()
}

fn month_of(at: DateTime<Utc>) -> String {
    use chrono::Datelike;
    partitions::month(at.year(), at.month()).name
}

#[tokio::test]
async fn months_are_made_ahead_and_dropped_past_the_horizon_with_inbox_badges_and_progress_right() {
    let app = spawn_app_with(test_settings(), true).await;
    let now = Utc::now();
    let settings = items_only(100);
    let user = 42;

    // A run 150 days ago made that month and two more.
    let then = now - chrono::Duration::days(150);
    let report =
        retention::run_once(&app.ctx.pools, &app.ctx.cache, &settings, then).await.unwrap();
    assert_eq!(report.partitions_added.len(), 3 * app.ctx.pools.iter().count());
    assert_eq!(month_names(&app, user).await.first(), Some(&month_of(then)));

    // Items from 170 days ago (past the horizon), from 60 days ago (inside
    // it, in p_future until the next run splits its month off), and a send now.
    let old = item_sent_at(&app, user, now - chrono::Duration::days(170), 1).await;
    let recent = item_sent_at(&app, user, now - chrono::Duration::days(60), 1).await;
    let current = send(&app, vec![user, 43, 44]).await;
    wait_for_status(&app, current, v1::MessageStatus::Completed).await;
    assert_eq!(badge(&app, user).await, 3, "three unread items before the drop (badge cached)");
    assert_eq!(inbox_ids(&app, user).await, vec![current, recent, old]);
    // A reader whose dropped item was read: no badge changes (the drop
    // notes every user of the month all the same), but their cached inbox
    // page shows the item.
    let reader = 45;
    let read_old = item_sent_at(&app, reader, now - chrono::Duration::days(170), 2).await;
    let read = v1::MarkReadRequest { user_id: reader, message_ids: vec![read_old] };
    app.inbox().mark_read(read).await.unwrap();
    assert_eq!(inbox_ids(&app, reader).await, vec![read_old]);

    let report = retention::run_once(&app.ctx.pools, &app.ctx.cache, &settings, now).await.unwrap();
    assert!(report.partitions_dropped.contains(&month_of(then)), "{report:?}");
    assert!(report.badges_invalidated >= 1, "the user with an unread dropped item: {report:?}");
    let months = month_names(&app, user).await;
    for ahead in [now, now + chrono::Duration::days(31), now + chrono::Duration::days(62)] {
        assert!(months.contains(&month_of(ahead)), "{} exists ahead: {months:?}", month_of(ahead));
    }
    assert!(!months.contains(&month_of(then)));

    assert!(!item_exists(&app, user, old).await, "the item past the horizon is gone");
    assert!(item_exists(&app, user, recent).await, "the item inside the horizon is untouched");
    assert_eq!(app.count_items(current).await, 3, "the current send is untouched");
    assert_eq!(badge(&app, user).await, 2, "the cached badge follows the drop");
    assert_eq!(badge(&app, user).await, app.unread_truth(user).await);
    assert_eq!(inbox_ids(&app, user).await, vec![current, recent]);
    assert_eq!(inbox_ids(&app, reader).await, Vec::<u64>::new(), "a cached page outlived the drop");
    let progress = get(&app, current).await.progress.unwrap();
    assert_eq!((progress.total, progress.delivered), (3, 3), "progress is kept");

    for (_, pool) in app.ctx.pools.iter() {
        assert!(partitions::pending_badges(pool, 1).await.unwrap().is_empty(), "all drained");
    }

    // A second run changes nothing.
    let again = retention::run_once(&app.ctx.pools, &app.ctx.cache, &settings, now).await.unwrap();
    assert!(again.partitions_added.is_empty() && again.partitions_dropped.is_empty(), "{again:?}");
    app.cleanup().await;
}

#[tokio::test]
async fn expired_items_are_purged_and_the_rest_kept() {
    let app = spawn_app_with(test_settings(), true).await;
    let users: Vec<u64> = (1..=1_200).collect();
    let now = Utc::now();
    let mut expiring = send_request(users.clone());
    expiring.expire_at = Some(prost_types::Timestamp {
        seconds: (now + chrono::Duration::hours(1)).timestamp(),
        nanos: 0,
    });
    let expiring = app.messages().send_message(expiring).await.unwrap().into_inner().message_id;
    let lasting = send(&app, users.clone()).await;
    wait_for_status(&app, expiring, v1::MessageStatus::Completed).await;
    wait_for_status(&app, lasting, v1::MessageStatus::Completed).await;

    // Two hours on, the first send's items have been expired for an hour.
    let mut settings = items_only(0);
    settings.purge_hidden_after_secs = 1800;
    let later = now + chrono::Duration::hours(2);
    let report =
        retention::run_once(&app.ctx.pools, &app.ctx.cache, &settings, later).await.unwrap();
    assert_eq!(report.hidden_items_purged, 1_200);
    assert_eq!(app.count_items(expiring).await, 0);
    assert_eq!(app.count_items(lasting).await, 1_200, "live items are untouched");
    for (_, pool) in app.ctx.pools.iter() {
        let contents: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM message_contents WHERE message_id = ?")
                .bind(expiring)
                .fetch_one(pool)
                .await
                .unwrap();
        assert_eq!(contents, 0, "the expired send's content rows are gone");
    }
    assert_eq!(inbox_ids(&app, 7).await, vec![lasting]);
    assert_eq!(app.unread_truth(7).await, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn the_worker_makes_the_months_ahead_at_start() {
    let mut settings = test_settings();
    settings.retention.interval_secs = 3600;
    let app = spawn_app_with(settings, true).await;
    let now = Utc::now();
    let wanted = [month_of(now), month_of(now + chrono::Duration::days(31))];
    eventually("the worker's first retention run", Duration::from_secs(30), || {
        let app = &app;
        let wanted = &wanted;
        async move {
            let months = month_names(app, 1).await;
            wanted.iter().all(|month| months.contains(month)).then_some(())
        }
    })
    .await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_cancelled_announcements_items_are_purged() {
    let app = spawn_app_with(test_settings(), true).await;
    let mut request = send_request(Vec::new());
    request.audience =
        Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience::default()));
    let cancelled = app.messages().send_message(request.clone()).await.unwrap().into_inner();
    let kept = app.messages().send_message(request).await.unwrap().into_inner();
    // Reading the inbox makes each reader's items of both.
    let readers = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14];
    for user in readers {
        assert_eq!(inbox_ids(&app, user).await, vec![kept.message_id, cancelled.message_id]);
    }
    assert_eq!(app.count_items(cancelled.message_id).await, readers.len() as u64);
    app.messages()
        .cancel_message(v1::CancelMessageRequest { message_id: cancelled.message_id })
        .await
        .unwrap();

    let mut settings = items_only(0);
    settings.purge_hidden_after_secs = 1800;
    // Batches of 2 rows: readers on one shard take several, which must
    // follow on from each other (a shard's last batch may be short).
    settings.purge_batch_rows = 2;
    let later = Utc::now() + chrono::Duration::hours(1);
    let report =
        retention::run_once(&app.ctx.pools, &app.ctx.cache, &settings, later).await.unwrap();
    assert_eq!(report.hidden_items_purged, readers.len() as u64);
    assert_eq!(app.count_items(cancelled.message_id).await, 0);
    assert_eq!(app.count_items(kept.message_id).await, readers.len() as u64);
    for user in readers {
        assert_eq!(inbox_ids(&app, user).await, vec![kept.message_id]);
        assert_eq!(badge(&app, user).await, app.unread_truth(user).await);
    }
    app.cleanup().await;
}

#[tokio::test]
async fn badges_noted_before_a_drop_are_invalidated_by_the_next_run_when_the_last_one_died() {
    let app = spawn_app_with(test_settings(), true).await;
    let user = 77;
    let message_id = send(&app, vec![user]).await;
    wait_for_status(&app, message_id, v1::MessageStatus::Completed).await;
    assert_eq!(badge(&app, user).await, 1, "cached");
    // What a run leaves when it dies after dropping a month: the items gone,
    // their users noted, the cached badges not yet invalidated. 2,500 other
    // users noted too, so the backlog drains over several pages.
    let pool = app.ctx.pools.for_user(user).value();
    sqlx::query("DELETE FROM message_items WHERE user_id = ?")
        .bind(user)
        .execute(pool)
        .await
        .unwrap();
    let mut noted = sqlx::QueryBuilder::new("INSERT INTO retention_pending_badges (user_id) ");
    noted.push_values((1_000_000..1_002_500u64).chain([user]), |mut row, id| {
        row.push_bind(id);
    });
    noted.build().execute(pool).await.unwrap();
    assert_eq!(badge(&app, user).await, 1, "stale until invalidated");

    let report = retention::run_once(&app.ctx.pools, &app.ctx.cache, &items_only(100), Utc::now())
        .await
        .unwrap();
    assert_eq!(report.badges_invalidated, 2_501, "{report:?}");
    assert!(partitions::pending_badges(pool, 1).await.unwrap().is_empty());
    assert_eq!(badge(&app, user).await, 0);
    assert_eq!(badge(&app, user).await, app.unread_truth(user).await);
    app.cleanup().await;
}

/// Shards holding `message_id`'s idempotency key.
async fn key_shards(app: &TestApp, message_id: u64) -> Vec<shard_router::ShardId> {
    let mut shards = Vec::new();
    for (shard, pool) in app.ctx.pools.iter() {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_keys WHERE message_id = ?")
                .bind(message_id)
                .fetch_one(pool)
                .await
                .unwrap();
        if n > 0 {
            shards.push(shard);
        }
    }
    shards
}

#[tokio::test]
async fn finished_sends_go_past_the_horizon_with_their_idempotency_keys() {
    let app = spawn_app_with(test_settings(), true).await;
    // A send whose key is stored on another shard than its home record.
    let mut attempt = 0;
    let (sent, key_shard) = loop {
        attempt += 1;
        let mut request = send_request(vec![7, 8]);
        request.idempotency_key = format!("old-send-{attempt}");
        let sent = app.messages().send_message(request).await.unwrap().into_inner().message_id;
        let shards = key_shards(&app, sent).await;
        assert_eq!(shards.len(), 1, "one key row");
        if shards[0] != app.ctx.pools.for_message(sent).shard() {
            break (sent, shards[0]);
        }
    };
    wait_for_status(&app, sent, v1::MessageStatus::Completed).await;

    let mut settings = items_only(0);
    settings.sends_days = 1;
    let soon = Utc::now() + chrono::Duration::hours(1);
    let report =
        retention::run_once(&app.ctx.pools, &app.ctx.cache, &settings, soon).await.unwrap();
    assert_eq!(report.sends_deleted, 0, "younger than the horizon");
    assert_eq!(key_shards(&app, sent).await, [key_shard]);

    let later = Utc::now() + chrono::Duration::days(2);
    let report =
        retention::run_once(&app.ctx.pools, &app.ctx.cache, &settings, later).await.unwrap();
    assert!(report.sends_deleted >= 1, "{report:?}");
    assert!(key_shards(&app, sent).await.is_empty(), "the key went with its send");
    let status = app.messages().get_message(v1::GetMessageRequest { message_id: sent }).await;
    assert_eq!(status.unwrap_err().code(), tonic::Code::NotFound);
    app.cleanup().await;
}
