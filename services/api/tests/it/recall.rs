//! Recalling a send whatever its state, and editing one: every item taken
//! back exactly once with both counts exact, every shard's copy edited.

use std::time::Duration;

use notify_proto::v1;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_testkit::{TestApp, authed, spawn_app, spawn_app_with, test_settings, with_clients};
use tonic::Code;

use crate::helpers::{content, send_request, wait_for_status};
use crate::items::{served, truth};

/// Items of a send in MySQL, on every shard, and of those the ones a
/// recall took back (they stay, hidden, until retention purges them).
async fn items_of(app: &TestApp, message_id: u64) -> (u64, u64) {
    (app.count_items(message_id).await, app.count_recalled_items(message_id).await)
}

/// Runs retention as if `purge_hidden_after_secs` had passed since the
/// recalls; returns the hidden items it purged.
async fn purge_hidden(app: &TestApp) -> u64 {
    let settings = &app.settings.retention;
    let later = chrono::Utc::now()
        + chrono::Duration::seconds(settings.purge_hidden_after_secs as i64 + 60);
    let report = notify_core::retention::run_once(&app.ctx.pools, &app.ctx.cache, settings, later)
        .await
        .unwrap();
    report.hidden_items_purged
}

async fn recall(app: &TestApp, message_id: u64) -> v1::Message {
    app.messages()
        .recall_message(v1::RecallMessageRequest { message_id })
        .await
        .unwrap()
        .into_inner()
}

/// Follows a recall until it is finished (WatchMessage ends then).
async fn recalled(app: &TestApp, message_id: u64) -> v1::Message {
    let mut stream = app
        .messages()
        .watch_message(v1::WatchMessageRequest { message_id, interval_ms: 100 })
        .await
        .unwrap()
        .into_inner();
    let mut last = None;
    let watching = async {
        while let Some(message) = stream.message().await.unwrap() {
            last = Some(message);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), watching).await.expect("the recall finishes");
    let last = last.expect("one state at least");
    assert_eq!(last.status, v1::MessageStatus::Recalled as i32);
    assert!(last.finished_at.is_some(), "the watch ended on a finished recall");
    last
}

fn users(from: u64, count: u64) -> Vec<u64> {
    (from..from + count).collect()
}

#[tokio::test]
async fn a_completed_send_is_taken_back_from_every_inbox_also_where_it_was_read() {
    let app = spawn_app().await;
    let recipients = users(9_100_000, 1_200);
    let id = app.send(recipients.clone()).await;
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let delivered = done.progress.unwrap().delivered;
    assert_eq!(delivered, 1_200);
    let other = app.send(vec![recipients[0]]).await;
    wait_for_status(&app, other, v1::MessageStatus::Completed).await;
    // Some read it; every badge cached.
    for user in &recipients[..7] {
        let read = v1::MarkReadRequest { user_id: *user, message_ids: vec![id] };
        app.inbox().mark_read(read).await.unwrap();
    }
    // One read it and marked it unread again (no read recorded); one read
    // it and deleted it (still read, and recorded, behind the tombstone).
    let (unread_again, deleted) = (recipients[5], recipients[6]);
    crate::items::update(&app, unread_again, v1::ItemAction::MarkUnread, vec![id], None).await;
    crate::items::update(&app, deleted, v1::ItemAction::Delete, vec![id], None).await;
    assert_eq!(app.count_reads(id).await, 6);
    for user in &recipients[..20] {
        served(&app, *user).await;
    }

    let first = recall(&app, id).await;
    assert_eq!(first.status, v1::MessageStatus::Recalled as i32);
    // Gone from lists and counts when the call returns, before the workers
    // took every item back.
    for user in &recipients[..20] {
        assert!(!crate::helpers::inbox_ids(&app, *user).await.contains(&id));
        assert_eq!(served(&app, *user).await, truth(&app, *user).await, "user {user}");
    }
    let last = recalled(&app, id).await;
    let progress = last.progress.unwrap();
    assert_eq!(progress.recalled, delivered, "every item taken back once");
    assert_eq!(progress.pending_chunks, 0);
    assert_eq!(progress.read, 0, "no item is read any more");
    assert_eq!(items_of(&app, id).await, (delivered, delivered), "each marked, left for retention");
    assert_eq!(app.count_reads(id).await, 0, "no read recorded any more");
    assert_eq!(crate::helpers::inbox_ids(&app, recipients[0]).await, [other], "others stay");
    for user in &recipients[..20] {
        assert_eq!(served(&app, *user).await, truth(&app, *user).await, "user {user}");
    }
    // A repeat is harmless; another recall counts nothing twice.
    let again = recall(&app, id).await;
    assert_eq!(again.progress.unwrap().recalled, delivered);

    // Retention's purge of hidden items takes the rows out; nothing shows.
    assert_eq!(purge_hidden(&app).await, delivered);
    assert_eq!(items_of(&app, id).await, (0, 0));
    assert_eq!(crate::helpers::inbox_ids(&app, recipients[0]).await, [other]);
    for user in &recipients[..20] {
        assert_eq!(served(&app, *user).await, truth(&app, *user).await, "user {user}");
    }
    assert_eq!(recalled(&app, id).await.progress.unwrap().recalled, delivered);
    app.cleanup().await;
}

/// A recipient in two batches of a send (two chunks on their shard) has one
/// item, delivered once and taken back once: the recall counts exactly the
/// items delivered, whichever chunk comes first.
#[tokio::test]
async fn a_recipient_in_two_chunks_is_taken_back_once() {
    let mut settings = test_settings();
    settings.send.chunk_size = 100;
    let app = spawn_app_with(settings, true).await;
    let id = crate::helpers::create_draft(&app, "twice").await;
    let mut client = app.messages();
    for (batch_number, user_ids) in [(1, users(9_150_000, 600)), (2, users(9_150_400, 600))] {
        let batch = v1::AppendRecipientsRequest {
            message_id: id,
            batch_number,
            user_ids,
            ..Default::default()
        };
        client.append_recipients(batch).await.unwrap();
    }
    client.start_message(v1::StartMessageRequest { message_id: id }).await.unwrap();
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_eq!(done.progress.unwrap().delivered, 1_000, "200 recipients in both batches");
    assert_eq!(items_of(&app, id).await, (1_000, 0));

    recall(&app, id).await;
    let progress = recalled(&app, id).await.progress.unwrap();
    assert_eq!((progress.delivered, progress.recalled), (1_000, 1_000), "{progress:?}");
    assert_eq!(items_of(&app, id).await, (1_000, 1_000));
    app.cleanup().await;
}

#[tokio::test]
async fn a_sending_or_paused_send_stops_delivering_and_what_was_delivered_goes_back() {
    let mut settings = test_settings();
    settings.send.chunk_size = 100;
    settings.send.small_send_threshold = 10;
    // A worker whose every MySQL answer comes 30 ms late, applying one chunk
    // at a time in a transaction of its own: each of the 30 chunks takes
    // several of those answers, so the send lasts seconds and the pause and
    // the recall land half-way on any machine.
    let mut slow = settings.clone();
    slow.worker.concurrency = 1;
    slow.worker.chunks_per_transaction = 1;
    let _proxies = notify_testkit::faults::slow_shards(&mut slow, 30).await;
    let mut app = spawn_app_with(settings, false).await;
    app.start_worker_with(slow).await;

    // Paused half-way: pending chunks never deliver, delivered ones go back.
    let paused = app.send(users(9_200_000, 3_000)).await;
    notify_testkit::eventually("some delivered", Duration::from_secs(30), || async {
        let delivered = app.get_message(paused).await.progress.unwrap().delivered;
        (delivered > 0).then_some(())
    })
    .await;
    app.messages().pause_message(v1::PauseMessageRequest { message_id: paused }).await.unwrap();
    let at_pause = app.get_message(paused).await.progress.unwrap();
    recall(&app, paused).await;
    let last = recalled(&app, paused).await.progress.unwrap();
    assert!(at_pause.delivered < 3_000, "the pause came too late to test anything");
    assert_eq!(last.recalled, last.delivered);
    assert_eq!(last.delivered + last.cancelled, 3_000, "{last:?}");
    assert_eq!(items_of(&app, paused).await, (last.delivered, last.delivered));

    // Sending: recalled while its chunks are being applied.
    let sending = app.send(users(9_300_000, 3_000)).await;
    notify_testkit::eventually("some delivered", Duration::from_secs(30), || async {
        let delivered = app.get_message(sending).await.progress.unwrap().delivered;
        (delivered > 0).then_some(())
    })
    .await;
    let at_recall = recall(&app, sending).await;
    assert_eq!(at_recall.status, v1::MessageStatus::Recalled as i32);
    assert!(at_recall.progress.unwrap().delivered < 3_000, "the recall came too late");
    let last = recalled(&app, sending).await.progress.unwrap();
    assert_eq!(last.recalled, last.delivered);
    assert_eq!(last.delivered + last.cancelled, 3_000, "{last:?}");
    assert_eq!(items_of(&app, sending).await, (last.delivered, last.delivered));
    app.cleanup().await;
}

#[tokio::test]
async fn an_announcement_is_recalled_for_everyone_at_once() {
    let app = spawn_app().await;
    let request = v1::SendMessageRequest {
        sender: "tests".into(),
        content: Some(content("to all")),
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        ..Default::default()
    };
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    for user in [9_400_001, 9_400_002] {
        assert_eq!(crate::helpers::inbox_ids(&app, user).await, [id]);
    }
    let recalled = recall(&app, id).await;
    assert!(recalled.finished_at.is_some(), "nothing is left for the workers");
    assert_eq!(recalled.progress.unwrap().recalled, 2);
    for user in [9_400_001, 9_400_002, 9_400_003] {
        assert!(crate::helpers::inbox_ids(&app, user).await.is_empty());
        assert_eq!(served(&app, user).await, (0, 0));
    }
    app.cleanup().await;
}

#[tokio::test]
async fn an_edit_changes_every_shards_copy_once_and_items_show_it() {
    let app = spawn_app().await;
    let recipients = users(9_500_000, 400);
    let id = app.send(recipients.clone()).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let new_content = v1::Content {
        title: "fixed title".into(),
        body: "fixed body".into(),
        category: "system".into(),
        data: [("link".to_owned(), "app://fixed".to_owned())].into_iter().collect(),
        ..Default::default()
    };
    let edited = app
        .messages()
        .edit_message(v1::EditMessageRequest { message_id: id, content: Some(new_content.clone()) })
        .await
        .unwrap()
        .into_inner();
    assert!(edited.edited_at.is_some());
    assert_eq!(edited.content.unwrap().title, "fixed title");
    // Every shard's copy, not one row per recipient.
    let mut copies = 0;
    for (_, pool) in app.ctx.pools.iter() {
        let rows: Vec<(String, bool)> = sqlx::query_as(
            "SELECT title, edited_at IS NOT NULL FROM message_contents WHERE message_id = ?",
        )
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap();
        for (title, stamped) in rows {
            assert_eq!((title.as_str(), stamped), ("fixed title", true));
            copies += 1;
        }
    }
    assert_eq!(copies, app.ctx.pools.iter().count(), "one copy per shard with recipients");
    let page = app
        .inbox()
        .list_inbox(v1::ListInboxRequest {
            user_id: recipients[7],
            page_size: 5,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let item = &page.items[0];
    assert_eq!(item.content.as_ref().unwrap().title, "fixed title");
    assert!(item.edited_at.is_some());

    // The category stays; a recalled send and a draft cannot be edited.
    let mut moved = new_content.clone();
    moved.category = "billing".into();
    let status = app
        .messages()
        .edit_message(v1::EditMessageRequest { message_id: id, content: Some(moved) })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("content.category: "), "{}", status.message());
    let draft = crate::helpers::create_draft(&app, "draft").await;
    let status = app
        .messages()
        .edit_message(v1::EditMessageRequest {
            message_id: draft,
            content: Some(new_content.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    recall(&app, id).await;
    let status = app
        .messages()
        .edit_message(v1::EditMessageRequest { message_id: id, content: Some(new_content) })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);

    // The audit keeps the title it replaced.
    let records = v1::admin_service_client::AdminServiceClient::new(app.channel())
        .list_audit_records(v1::ListAuditRecordsRequest {
            filter: Some(v1::list_audit_records_request::Filter::MessageId(id)),
            page_size: 10,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .records;
    let edit = records.iter().find(|r| r.action == "message.edit" && r.outcome == "ok").unwrap();
    assert_eq!(edit.detail, "previous title: \"hello\"");
    assert!(records.iter().any(|r| r.action == "message.recall" && r.outcome == "ok"));
    app.cleanup().await;
}

#[tokio::test]
async fn recall_and_edit_of_unknown_or_others_sends_are_not_found() {
    let mut settings = test_settings();
    let tokens = with_clients(
        &mut settings,
        &[("owner", &["send", "sends.manage", "sends.read"]), ("other", &["sends.manage"])],
    );
    let app = spawn_app_with(settings, true).await;
    let mut owner = MessageServiceClient::new(authed(app.channel(), &tokens["owner"]));
    let mut request = send_request(vec![9_600_001]);
    request.sender = String::new();
    let id = owner.send_message(request).await.unwrap().into_inner().message_id;
    let mut other = MessageServiceClient::new(authed(app.channel(), &tokens["other"]));
    for message_id in [id, 123_456_789] {
        let status =
            other.recall_message(v1::RecallMessageRequest { message_id }).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{message_id}");
        let edit = v1::EditMessageRequest { message_id, content: Some(content("x")) };
        assert_eq!(other.edit_message(edit).await.unwrap_err().code(), Code::NotFound);
    }
    let status =
        owner.recall_message(v1::RecallMessageRequest { message_id: 0 }).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    owner.recall_message(v1::RecallMessageRequest { message_id: id }).await.unwrap();
    app.cleanup().await;
}

#[tokio::test]
async fn recall_tasks_invalidate_badges_unless_the_call_retired_them() {
    let mut app = spawn_app_with(test_settings(), false).await;
    app.start_worker().await;
    let recipients = users(9_600_000, 1_200);
    let id = app.send(recipients.clone()).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    // No worker from here on: the call's recall tasks wait in the queue,
    // and this test applies the chunks itself, some as the call's tasks
    // (the badges retired) and some as the sweeper's (not known to be).
    app.stop_worker().await;
    recall(&app, id).await;
    let places = app.item_shards(id).await;
    let on = |shard: shard_router::ShardId| -> Vec<u64> {
        places.iter().filter(|(_, at)| at.contains(&shard)).map(|(u, _)| *u).take(10).collect()
    };
    let shards: Vec<shard_router::ShardId> = app.ctx.pools.iter().map(|(shard, _)| shard).collect();
    let (swept, retired) = (shards[0], shards[1]);
    let (swept_users, retired_users) = (on(swept), on(retired));
    assert!(!swept_users.is_empty() && !retired_users.is_empty(), "both shards hold recipients");
    // Cached now, after the call: every one of them already without the item.
    for user in swept_users.iter().chain(&retired_users) {
        assert_eq!(served(&app, *user).await, truth(&app, *user).await, "user {user}");
    }
    let mut redis = app.ctx.cache.connection();
    let cached =
        |users: &[u64]| users.iter().map(|u| app.ctx.cache.keys().unread(*u)).collect::<Vec<_>>();
    for (shard, badges_retired) in [(swept, false), (retired, true)] {
        let pool = app.ctx.pools.get(shard).unwrap();
        let chunks = notify_store::db::recall::delivered_page(
            pool,
            notify_domain::domain::MessageId::from_raw(id),
            0,
            1_000,
        )
        .await
        .unwrap();
        assert!(!chunks.is_empty());
        let message_id = notify_domain::domain::MessageId::from_raw(id);
        notify_core::recall::apply_group(&app.ctx, shard, message_id, &chunks, badges_retired)
            .await
            .unwrap();
        let states: Vec<u8> =
            sqlx::query_scalar("SELECT DISTINCT state FROM message_chunks WHERE message_id = ?")
                .bind(id)
                .fetch_all(pool)
                .await
                .unwrap();
        assert_eq!(states, [5], "shard {shard}: every chunk recalled and settled");
    }
    let present: usize =
        redis::cmd("EXISTS").arg(cached(&swept_users)).query_async(&mut redis).await.unwrap();
    assert_eq!(present, 0, "the sweeper's tasks invalidate their recipients' badges");
    let present: usize =
        redis::cmd("EXISTS").arg(cached(&retired_users)).query_async(&mut redis).await.unwrap();
    assert_eq!(present, retired_users.len(), "the call's tasks leave retired badges alone");
    // The queued tasks of those chunks change nothing; the rest are taken
    // back, every item once.
    app.start_worker().await;
    let last = recalled(&app, id).await.progress.unwrap();
    assert_eq!(last.recalled, 1_200, "{last:?}");
    assert_eq!(items_of(&app, id).await, (1_200, 1_200));
    for user in swept_users.iter().chain(&retired_users) {
        assert_eq!(served(&app, *user).await, truth(&app, *user).await, "user {user}");
    }
    app.cleanup().await;
}

/// A caller that hangs up mid-recall (its deadline passes while an api
/// whose every MySQL answer comes 40 ms late is half-way through) does not
/// cut the recall short: the transition runs to its end in a task of its
/// own, with its audit record, and the workers take every item back.
#[tokio::test]
async fn a_recall_whose_caller_hangs_up_mid_call_still_finishes_and_is_audited() {
    let mut settings = test_settings();
    let scopes: &[&str] = &["send", "sends.read", "sends.manage", "admin"];
    let tokens = with_clients(&mut settings, &[("ops", scopes)]);
    settings.auth.clients[0].senders = vec!["*".to_owned()];
    let app = spawn_app_with(settings, true).await;
    let mut messages = MessageServiceClient::new(authed(app.channel(), &tokens["ops"]));
    let id = messages.send_message(send_request(users(9_400_000, 1_000))).await.unwrap();
    let id = id.into_inner().message_id;
    // Polled with the caller's token (the test kit's waits carry none).
    let reaches = |status: v1::MessageStatus, recalled: u64| {
        let messages = messages.clone();
        notify_testkit::eventually("the send's status", Duration::from_secs(60), move || {
            let mut messages = messages.clone();
            async move {
                let request = v1::GetMessageRequest { message_id: id };
                let message = messages.get_message(request).await.ok()?.into_inner();
                let progress = message.progress?;
                (message.status == status as i32 && progress.recalled == recalled)
                    .then_some(message)
            }
        })
    };
    reaches(v1::MessageStatus::Completed, 0).await;

    let mut slow = app.settings.clone();
    let _proxies = notify_testkit::faults::slow_shards(&mut slow, 40).await;
    let replica = app.spawn_api_replica_with(slow).await;
    let mut request = tonic::Request::new(v1::RecallMessageRequest { message_id: id });
    request.set_timeout(Duration::from_millis(150));
    let hung_up = MessageServiceClient::new(authed(replica.channel(), &tokens["ops"]))
        .recall_message(request)
        .await
        .expect_err("a recall of many 40 ms round trips outlasts 150 ms");
    assert!(matches!(hung_up.code(), Code::DeadlineExceeded | Code::Cancelled), "{hung_up:?}");

    reaches(v1::MessageStatus::Recalled, 1_000).await;
    assert_eq!(items_of(&app, id).await, (1_000, 1_000));
    let admin =
        v1::admin_service_client::AdminServiceClient::new(authed(app.channel(), &tokens["ops"]));
    let filter = v1::list_audit_records_request::Filter::MessageId(id);
    let record =
        notify_testkit::eventually("the recall on record", Duration::from_secs(30), || {
            let mut admin = admin.clone();
            let request =
                v1::ListAuditRecordsRequest { filter: Some(filter.clone()), ..Default::default() };
            async move {
                let records = admin.list_audit_records(request).await.ok()?.into_inner().records;
                records.into_iter().find(|r| r.action == "message.recall")
            }
        })
        .await;
    assert_eq!((record.client.as_str(), record.outcome.as_str()), ("ops", "ok"));
    replica.stop().await;
    app.cleanup().await;
}
