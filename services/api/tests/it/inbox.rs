//! Inbox pages, mark-read, and badges that always match MySQL.

use std::collections::HashSet;
use std::time::Duration;

use notify_proto::v1;
use notify_testkit::{TestApp, spawn_app};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::helpers::{badge, send, send_request, wait_for_status};

async fn page(app: &TestApp, user_id: u64, size: u32, token: String) -> v1::ListInboxResponse {
    app.inbox()
        .list_inbox(v1::ListInboxRequest {
            user_id,
            page_size: size,
            page_token: token,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn send_and_wait(app: &TestApp, users: Vec<u64>) -> u64 {
    let id = send(app, users).await;
    wait_for_status(app, id, v1::MessageStatus::Completed).await;
    id
}

#[tokio::test]
async fn paging_while_messages_arrive_shows_every_item_exactly_once() {
    let app = spawn_app().await;
    let user = 7;
    let mut original = Vec::new();
    for _ in 0..25 {
        original.push(send_and_wait(&app, vec![user]).await);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let response = page(&app, user, 6, token).await;
        seen.extend(response.items.iter().map(|item| item.message_id));
        // New messages land between pages.
        send_and_wait(&app, vec![user]).await;
        if response.next_page_token.is_empty() {
            break;
        }
        token = response.next_page_token;
    }
    let unique: HashSet<u64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "an item was shown twice: {seen:?}");
    for id in &original {
        assert!(unique.contains(id), "message {id} was skipped");
    }
    assert!(seen.windows(2).all(|w| w[0] > w[1]), "not newest first: {seen:?}");
    app.cleanup().await;
}

#[tokio::test]
async fn items_carry_content_and_mark_read_is_idempotent_and_reported() {
    let app = spawn_app().await;
    let user = 42;
    let a = send_and_wait(&app, vec![user, 43]).await;
    let b = send_and_wait(&app, vec![user]).await;
    assert_eq!(badge(&app, user).await, 2);

    let listed = page(&app, user, 10, String::new()).await;
    assert_eq!(listed.items.len(), 2);
    let newest = &listed.items[0];
    assert_eq!(newest.message_id, b);
    let content = newest.content.clone().unwrap();
    assert_eq!(content.title, "hello");
    assert_eq!(content.category, "system");
    assert_eq!(content.data.get("link").map(String::as_str), Some("app://inbox"));
    assert!(!newest.read && newest.created_at.is_some());

    let unknown = 999_999;
    let marked = app
        .inbox()
        .mark_read(v1::MarkReadRequest { user_id: user, message_ids: vec![a, unknown] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(marked.marked, 1);
    assert_eq!(marked.unknown_message_ids, vec![unknown]);
    assert_eq!(badge(&app, user).await, 1);
    let again = app
        .inbox()
        .mark_read(v1::MarkReadRequest { user_id: user, message_ids: vec![a] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.marked, 0, "marking twice changes nothing");
    assert_eq!(badge(&app, user).await, 1);
    let progress = app
        .messages()
        .get_message(v1::GetMessageRequest { message_id: a })
        .await
        .unwrap()
        .into_inner()
        .progress
        .unwrap();
    assert_eq!(progress.read, 1, "read stats follow mark-read");

    let unread_only = app
        .inbox()
        .list_inbox(v1::ListInboxRequest {
            user_id: user,
            page_size: 20,
            unread_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unread_only.items.iter().map(|i| i.message_id).collect::<Vec<_>>(), vec![b]);

    let all = app
        .inbox()
        .mark_all_read(v1::MarkAllReadRequest { user_id: user, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.marked, 1);
    assert_eq!(badge(&app, user).await, 0);
    assert_eq!(badge(&app, 43).await, 1, "other users are untouched");
    app.cleanup().await;
}

#[tokio::test]
async fn mark_all_read_honours_category_and_up_to_id() {
    let app = spawn_app().await;
    let user = 5;
    let mut billing = send_request(vec![user]);
    billing.content.as_mut().unwrap().category = "billing".into();
    let first = app.messages().send_message(billing.clone()).await.unwrap().into_inner().message_id;
    wait_for_status(&app, first, v1::MessageStatus::Completed).await;
    let second = app.messages().send_message(billing).await.unwrap().into_inner().message_id;
    wait_for_status(&app, second, v1::MessageStatus::Completed).await;
    let system = send_and_wait(&app, vec![user]).await;
    assert_eq!(badge(&app, user).await, 3);
    let billing_only = app
        .inbox()
        .list_inbox(v1::ListInboxRequest {
            user_id: user,
            page_size: 20,
            category: "billing".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<u64> = billing_only.items.iter().map(|i| i.message_id).collect();
    assert_eq!(listed, vec![second, first], "only the billing messages, newest first");

    let up_to = app
        .inbox()
        .mark_all_read(v1::MarkAllReadRequest {
            user_id: user,
            category: "billing".into(),
            up_to_message_id: first,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(up_to.marked, 1);
    let billing_rest = app
        .inbox()
        .mark_all_read(v1::MarkAllReadRequest {
            user_id: user,
            category: "billing".into(),
            up_to_message_id: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(billing_rest.marked, 1);
    let unread = app
        .inbox()
        .list_inbox(v1::ListInboxRequest {
            user_id: user,
            page_size: 20,
            unread_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unread.items.iter().map(|i| i.message_id).collect::<Vec<_>>(), vec![system]);
    assert_eq!(badge(&app, user).await, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn expired_messages_leave_the_inbox_and_the_badge() {
    let app = spawn_app().await;
    let user = 77;
    let lasting = send_and_wait(&app, vec![user]).await;
    let expire_at = chrono::Utc::now() + chrono::Duration::milliseconds(1_500);
    let mut request = send_request(vec![user]);
    request.expire_at = Some(prost_types::Timestamp {
        seconds: expire_at.timestamp(),
        nanos: expire_at.timestamp_subsec_nanos() as i32,
    });
    let fleeting = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    wait_for_status(&app, fleeting, v1::MessageStatus::Completed).await;
    assert_eq!(badge(&app, user).await, 2, "counted while valid (and now cached)");

    // The passing of time is the event here.
    let remaining = (expire_at - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(remaining + Duration::from_millis(50)).await;
    assert_eq!(badge(&app, user).await, 1, "the cached count expired with the message");
    let listed = page(&app, user, 10, String::new()).await;
    assert_eq!(listed.items.iter().map(|i| i.message_id).collect::<Vec<_>>(), vec![lasting]);
    app.cleanup().await;
}

#[tokio::test]
async fn batch_badges_keep_request_order_and_match_mysql() {
    let app = spawn_app().await;
    send_and_wait(&app, vec![1, 2, 3]).await;
    send_and_wait(&app, vec![2, 3]).await;
    send_and_wait(&app, vec![3]).await;
    let response = app
        .inbox()
        .batch_get_unread_counts(v1::BatchGetUnreadCountsRequest { user_ids: vec![3, 1, 9, 2, 3] })
        .await
        .unwrap()
        .into_inner();
    let counts: Vec<(u64, u64)> = response.counts.iter().map(|c| (c.user_id, c.unread)).collect();
    assert_eq!(counts, vec![(3, 3), (1, 1), (9, 0), (2, 2)]);
    app.cleanup().await;
}

/// A batch of uncached users larger than the counts run at once (the
/// pools' connections): every count rebuilt from MySQL, in request order.
#[tokio::test]
async fn a_batch_of_uncached_badges_larger_than_the_pools_keeps_its_order() {
    let app = spawn_app().await;
    send_and_wait(&app, (1..=400).collect()).await;
    send_and_wait(&app, (1..=400).filter(|u| u % 2 == 0).collect()).await;
    send_and_wait(&app, (1..=400).filter(|u| u % 5 == 0).collect()).await;
    let in_flight = app.settings.database.pool_max as usize * app.settings.database.shards.len();
    // Reversed, with users who have nothing between them.
    let asked: Vec<u64> = (1..=400).rev().flat_map(|u| [u, u + 10_000]).collect();
    assert!(asked.len() > 2 * in_flight, "the batch outruns the counts in flight");
    let response = app
        .inbox()
        .batch_get_unread_counts(v1::BatchGetUnreadCountsRequest { user_ids: asked.clone() })
        .await
        .unwrap()
        .into_inner();
    let counts: Vec<(u64, u64)> = response.counts.iter().map(|c| (c.user_id, c.unread)).collect();
    let expected: Vec<(u64, u64)> = asked
        .iter()
        .map(|&u| (u, if u > 400 { 0 } else { 1 + u64::from(u % 2 == 0) + u64::from(u % 5 == 0) }))
        .collect();
    assert_eq!(counts, expected);
    app.cleanup().await;
}

/// Badge reads in flight together share Redis calls, and each still gets its
/// own user's count (a user in a group too).
#[tokio::test]
async fn concurrent_badges_share_redis_reads_and_each_gets_its_own() {
    let app = spawn_app().await;
    let users: Vec<u64> = (1..=300).collect();
    send_and_wait(&app, users.clone()).await;
    send_and_wait(&app, (1..=150).collect()).await;
    for user_id in (3..=300).step_by(3) {
        let request = v1::MarkAllReadRequest { user_id, ..Default::default() };
        app.inbox().mark_all_read(request).await.unwrap();
    }
    let expected = |user: u64| match (user % 3, user <= 150) {
        (0, _) => 0,
        (_, true) => 2,
        (_, false) => 1,
    };
    let mut groups = app.groups();
    let group = v1::CreateGroupRequest { group_id: 77, name: "badge readers".into() };
    groups.create_group(group).await.unwrap();
    let members =
        v1::AddGroupMembersRequest { group_id: 77, user_ids: vec![7], with_history: false };
    groups.add_group_members(members).await.unwrap();
    let message = v1::SendGroupMessageRequest {
        group_id: 77,
        sender: "tests".into(),
        content: Some(notify_testkit::content("group")),
        ..Default::default()
    };
    groups.send_group_message(message).await.unwrap();

    // Every call in flight at once, from one task.
    let calls = users.iter().map(|&user_id| {
        let mut inbox = app.inbox();
        async move {
            let request = v1::GetUnreadCountRequest { user_id };
            inbox.get_unread_count(request).await.unwrap().into_inner()
        }
    });
    let (reads_before, calls_before) = app.ctx.cache.user_state_read_stats();
    let answers = futures::future::join_all(calls).await;
    for answer in &answers {
        assert_eq!(answer.unread, expected(answer.user_id), "user {}", answer.user_id);
        let group_unread = u64::from(answer.user_id == 7);
        assert_eq!(answer.group_unread, group_unread, "user {}", answer.user_id);
    }
    let (reads_after, calls_after) = app.ctx.cache.user_state_read_stats();
    let (reads, script_calls) = (reads_after - reads_before, calls_after - calls_before);
    assert_eq!(reads, 300);
    assert!(script_calls < reads / 2, "{reads} reads took {script_calls} Redis calls");
    app.cleanup().await;
}

/// Sends, mark-reads, badge reads, cache flushes and a worker crash race each
/// other; once quiet, every badge equals the unread items in MySQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn badges_converge_to_mysql_under_random_interleavings() {
    let mut settings = notify_testkit::test_settings();
    settings.send.chunk_size = 50;
    let mut app = notify_testkit::spawn_app_with(settings, true).await;
    let users: Vec<u64> = (1..=300).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let mut sends = Vec::new();

    for round in 0..6 {
        // A few overlapping sends at once.
        let batch: Vec<Vec<u64>> = (0..3)
            .map(|_| {
                let mut picked = users.clone();
                picked.shuffle(&mut rng);
                picked.truncate(rng.random_range(50..=300));
                picked
            })
            .collect();
        let sending = futures::future::join_all(batch.into_iter().map(|ids| send(&app, ids)));
        // Concurrent readers and markers on random users.
        let readers = futures::future::join_all((0..40).map(|i| {
            let user = users[(i * 7 + round * 13) % users.len()];
            let app = &app;
            async move {
                match i % 4 {
                    0 => {
                        let listed = page(app, user, 5, String::new()).await;
                        let ids: Vec<u64> =
                            listed.items.iter().map(|i| i.message_id).take(2).collect();
                        if !ids.is_empty() {
                            app.inbox()
                                .mark_read(v1::MarkReadRequest { user_id: user, message_ids: ids })
                                .await
                                .unwrap();
                        }
                    }
                    1 => {
                        app.inbox()
                            .mark_all_read(v1::MarkAllReadRequest {
                                user_id: user,
                                ..Default::default()
                            })
                            .await
                            .unwrap();
                    }
                    _ => {
                        badge(app, user).await;
                    }
                }
            }
        }));
        let (ids, ()) = tokio::join!(sending, async {
            readers.await;
        });
        sends.extend(ids);
        match round {
            2 => app.flush_cache().await,
            3 => {
                app.kill_worker().await;
                app.start_worker().await;
            }
            _ => {}
        }
    }
    for id in &sends {
        wait_for_status(&app, *id, v1::MessageStatus::Completed).await;
    }
    let mut wrong = Vec::new();
    for user in &users {
        let (cached, truth) = (badge(&app, *user).await, app.unread_truth(*user).await);
        if cached != truth {
            wrong.push((*user, cached, truth));
        }
    }
    assert!(wrong.is_empty(), "badges (user, badge, mysql) differ: {wrong:?}");
    app.cleanup().await;
}

/// Inbox pages read on connections kept apart from the pool (given back
/// without a ping): one the server killed while idle is replaced without an
/// error, and one whose read was cancelled half-way is closed, not lent
/// again with its replies still on the wire.
#[tokio::test]
async fn inbox_read_connections_survive_a_killed_one_and_drop_a_cancelled_one() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let app = spawn_app().await;
    let user = 4_601;
    send_and_wait(&app, vec![user]).await;
    let pool = app.ctx.pools.for_user(user);
    let direct = app.ctx.direct.as_ref().expect("direct connections").get(pool.shard()).unwrap();
    let connection_id = || crate::helpers::next_lent_id(direct);

    // The one idle connection, killed by the server: the next page is read.
    let idle = connection_id().await;
    assert_eq!(connection_id().await, idle, "an idle connection is lent again");
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL CONNECTION {idle}")))
        .execute(&*pool)
        .await
        .unwrap();
    assert_eq!(page(&app, user, 20, String::new()).await.items.len(), 1);
    let replaced = connection_id().await;
    assert_ne!(replaced, idle);

    // A read cancelled while its query runs: its connection is not reused.
    let cancelled = Arc::new(AtomicU64::new(0));
    let seen = cancelled.clone();
    let slow = async {
        let mut lent = direct.acquire().await.unwrap();
        let id: u64 =
            sqlx::query_scalar("SELECT CONNECTION_ID()").fetch_one(lent.conn()).await.unwrap();
        seen.store(id, Ordering::SeqCst);
        sqlx::query("SELECT SLEEP(5)").execute(lent.conn()).await.unwrap();
        lent.give_back();
    };
    assert!(tokio::time::timeout(Duration::from_millis(300), slow).await.is_err());
    let cancelled = cancelled.load(Ordering::SeqCst);
    assert_ne!(cancelled, 0, "the cancelled read had started");
    for _ in 0..3 {
        assert_ne!(connection_id().await, cancelled, "a cancelled read's connection was lent");
    }
    assert_eq!(page(&app, user, 20, String::new()).await.items.len(), 1);
    app.cleanup().await;
}
