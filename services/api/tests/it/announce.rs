//! Announcements to all users: stored once, materialized lazily, exactly once.

use std::time::Duration;

use notify_proto::v1;
use notify_testkit::{TestApp, content, eventually, spawn_app};

use crate::helpers::{badge, inbox_ids, send, wait_for_status};

fn announcement(expire_in: Option<Duration>) -> v1::SendMessageRequest {
    let expire_at = expire_in.map(|d| {
        let at = chrono::Utc::now() + chrono::Duration::from_std(d).unwrap();
        prost_types::Timestamp {
            seconds: at.timestamp(),
            nanos: at.timestamp_subsec_nanos() as i32,
        }
    });
    v1::SendMessageRequest {
        sender: "platform".into(),
        content: Some(content("maintenance")),
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        expire_at,
        ..Default::default()
    }
}

async fn announce(app: &TestApp, expire_in: Option<Duration>) -> u64 {
    let response = app.messages().send_message(announcement(expire_in)).await.unwrap().into_inner();
    assert_eq!(response.status, v1::MessageStatus::Sending as i32);
    response.message_id
}

#[tokio::test]
async fn an_announcement_reaches_existing_and_later_users_lazily() {
    let app = spawn_app().await;
    let direct = send(&app, vec![1, 2]).await;
    wait_for_status(&app, direct, v1::MessageStatus::Completed).await;
    let id = announce(&app, None).await;
    assert_eq!(app.count_items(id).await, 0, "nothing is written per user at send time");

    // Badges count it before anything is materialized, without writing.
    assert_eq!(badge(&app, 1).await, 2);
    assert_eq!(app.count_items(id).await, 0);
    // The first inbox read materializes it.
    assert_eq!(inbox_ids(&app, 1).await, vec![id, direct]);
    assert_eq!(app.count_items(id).await, 1);
    assert_eq!(badge(&app, 1).await, 2, "materializing does not change the badge");

    // A user never seen before (signed up later) gets it too.
    let newcomer = 987_654_321;
    assert_eq!(badge(&app, newcomer).await, 1);
    assert_eq!(inbox_ids(&app, newcomer).await, vec![id]);
    app.inbox()
        .mark_read(v1::MarkReadRequest { user_id: newcomer, message_ids: vec![id] })
        .await
        .unwrap();
    assert_eq!(badge(&app, newcomer).await, 0);

    let progress = app.get_message(id).await.progress.unwrap();
    assert_eq!(progress.delivered, 2, "materialized for two users");
    assert_eq!(progress.read, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn concurrent_reads_materialize_an_announcement_once() {
    let app = spawn_app().await;
    let id = announce(&app, None).await;
    let user = 31;
    let reads = (0..24).map(|i| {
        let app = &app;
        async move {
            if i % 2 == 0 {
                inbox_ids(app, user).await.len() as u64
            } else {
                badge(app, user).await
            }
        }
    });
    let seen = futures::future::join_all(reads).await;
    assert!(seen.iter().all(|n| *n == 1), "every read saw exactly one: {seen:?}");
    assert_eq!(app.item_users(id).await, vec![user]);
    assert_eq!(app.get_message(id).await.progress.unwrap().delivered, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn an_announcement_expires_on_time() {
    let app = spawn_app().await;
    let lifetime = Duration::from_millis(1_500);
    let started = tokio::time::Instant::now();
    let id = announce(&app, Some(lifetime)).await;
    assert_eq!(inbox_ids(&app, 8).await, vec![id]);
    assert_eq!(badge(&app, 8).await, 1);
    assert_eq!(badge(&app, 9).await, 1, "unmaterialized, still counted");
    // The passing of time is the event here.
    tokio::time::sleep_until(started + lifetime + Duration::from_millis(100)).await;
    assert_eq!(badge(&app, 8).await, 0);
    assert_eq!(badge(&app, 9).await, 0);
    assert!(inbox_ids(&app, 8).await.is_empty());
    // And the send ends: the worker's sweeper completes it once it expired.
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_eq!(done.progress.unwrap().delivered, 1, "user 8's copy was materialized");
    app.cleanup().await;
}

#[tokio::test]
async fn cancel_removes_an_announcement_for_everyone() {
    let app = spawn_app().await;
    let id = announce(&app, None).await;
    assert_eq!(inbox_ids(&app, 5).await, vec![id]); // materialized for user 5
    assert_eq!(badge(&app, 5).await, 1);
    assert_eq!(badge(&app, 6).await, 1); // cached, never materialized

    let cancelled =
        app.messages().cancel_message(v1::CancelMessageRequest { message_id: id }).await;
    assert_eq!(cancelled.unwrap().into_inner().status, v1::MessageStatus::Cancelled as i32);
    assert_eq!(badge(&app, 5).await, 0);
    assert_eq!(badge(&app, 6).await, 0);
    assert!(inbox_ids(&app, 5).await.is_empty());
    assert!(inbox_ids(&app, 6).await.is_empty());
    assert_eq!(app.unread_truth(5).await, 0);
    let pause = app.messages().pause_message(v1::PauseMessageRequest { message_id: id }).await;
    assert_eq!(pause.unwrap_err().code(), tonic::Code::FailedPrecondition);
    app.cleanup().await;
}

#[tokio::test]
async fn a_scheduled_announcement_starts_on_time_and_badges_follow() {
    let app = spawn_app().await;
    let mut request = announcement(None);
    let at = chrono::Utc::now() + chrono::Duration::seconds(1);
    request.send_at = Some(prost_types::Timestamp {
        seconds: at.timestamp(),
        nanos: at.timestamp_subsec_nanos() as i32,
    });
    let response = app.messages().send_message(request).await.unwrap().into_inner();
    assert_eq!(response.status, v1::MessageStatus::NotStarted as i32);
    assert_eq!(badge(&app, 3).await, 0, "not live yet (and now cached)");
    wait_for_status(&app, response.message_id, v1::MessageStatus::Sending).await;
    // The scheduler commits SENDING, then retires cached badges (an epoch
    // bump, a few ms later): the cached 0 must go then, not when it expires
    // (`inbox.counter_ttl_secs`, 600 s).
    eventually("starting it retired the cached badge", Duration::from_secs(5), || async {
        (badge(&app, 3).await == 1).then_some(())
    })
    .await;
    app.cleanup().await;
}

#[tokio::test]
async fn badges_match_mysql_after_announcements_direct_sends_and_mark_reads() {
    let app = spawn_app().await;
    let users: Vec<u64> = (1..=40).collect();
    let a = announce(&app, None).await;
    let direct = send(&app, users[..25].to_vec()).await;
    wait_for_status(&app, direct, v1::MessageStatus::Completed).await;
    let b = announce(&app, None).await;
    for user in &users[..10] {
        inbox_ids(&app, *user).await; // materialize both announcements
    }
    for user in &users[5..15] {
        app.inbox()
            .mark_read(v1::MarkReadRequest { user_id: *user, message_ids: vec![a, direct] })
            .await
            .unwrap();
    }
    app.messages().cancel_message(v1::CancelMessageRequest { message_id: b }).await.unwrap();
    for user in &users {
        let cached = badge(&app, *user).await;
        // The truth: materialize, then count unread items in MySQL.
        inbox_ids(&app, *user).await;
        let truth = app.unread_truth(*user).await;
        assert_eq!(cached, truth, "user {user}");
        assert_eq!(badge(&app, *user).await, truth, "user {user} after materializing");
    }
    app.cleanup().await;
}

/// The epoch that retires cached badges never goes back, not even after it
/// is lost (a `DEL` here; an `allkeys-*` eviction policy does the same):
/// counting up again from nothing would reach the epoch a badge was cached
/// under before the loss, and serve it without the announcements since.
#[tokio::test]
async fn a_lost_epoch_does_not_bring_back_badges_cached_before_it() {
    use redis::AsyncCommands;

    let app = spawn_app().await;
    let cache = notify_cache::Cache::connect(&app.settings.redis).await.unwrap();
    let mut conn = cache.connection();
    let user = 31_337;
    announce(&app, None).await;
    assert_eq!(badge(&app, user).await, 1);
    let cached: Option<String> = conn.get(cache.keys().unread(user)).await.unwrap();
    assert!(cached.is_some(), "the badge was not cached");

    let _: () = conn.del(cache.keys().epoch()).await.unwrap();
    announce(&app, None).await;
    assert_eq!(badge(&app, user).await, 2, "a badge cached before the epoch was lost was served");
    app.cleanup().await;
}
