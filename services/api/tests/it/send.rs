//! Sending to user lists: exactly one item per recipient.

use notify_proto::v1;
use notify_testkit::spawn_app;

use crate::helpers::{get, send, send_request, wait_for_status};

#[tokio::test]
async fn every_recipient_gets_exactly_one_item_and_progress_adds_up() {
    let app = spawn_app().await;
    // 2,400 ids with 400 duplicates: 2,000 distinct recipients over 4 shards.
    let mut ids: Vec<u64> = (1..=2_000).collect();
    ids.extend(1..=400);
    let message_id = send(&app, ids).await;

    let done = wait_for_status(&app, message_id, v1::MessageStatus::Completed).await;
    let progress = done.progress.expect("progress");
    assert_eq!(progress.total, 2_000);
    assert_eq!(progress.delivered, 2_000);
    assert_eq!(progress.pending, 0);
    assert_eq!(progress.failed, 0);
    assert_eq!(progress.pending_chunks, 0);
    assert_eq!(app.item_users(message_id).await, (1..=2_000).collect::<Vec<u64>>());
    app.cleanup().await;
}

#[tokio::test]
async fn draft_flow_appends_batches_once_and_starts() {
    let app = spawn_app().await;
    let mut client = app.messages();
    let id = crate::helpers::create_draft(&app, "draft").await;
    for batch in 1..=3u64 {
        let user_ids: Vec<u64> = ((batch - 1) * 1000 + 1..=batch * 1000).collect();
        let request = v1::AppendRecipientsRequest {
            message_id: id,
            batch_number: batch,
            user_ids,
            ..Default::default()
        };
        let first = client.append_recipients(request.clone()).await.unwrap().into_inner();
        assert!(!first.duplicate_batch);
        assert_eq!(first.accepted, 1000);
        // A retried batch is recognised and adds nothing.
        let retry = client.append_recipients(request).await.unwrap().into_inner();
        assert!(retry.duplicate_batch);
    }
    // Overlapping batch: 500 already appended users and 500 new ones.
    let overlap = v1::AppendRecipientsRequest {
        message_id: id,
        batch_number: 4,
        user_ids: (2_501..=3_500).collect(),
        ..Default::default()
    };
    client.append_recipients(overlap).await.unwrap();

    let draft = get(&app, id).await;
    assert_eq!(draft.status, v1::MessageStatus::NotStarted as i32);
    assert_eq!(app.count_items(id).await, 0, "a draft delivers nothing");

    client.start_message(v1::StartMessageRequest { message_id: id }).await.unwrap();
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let progress = done.progress.unwrap();
    assert_eq!(progress.total, 3_500);
    assert_eq!(progress.delivered, 3_500);
    assert_eq!(app.item_users(id).await, (1..=3_500).collect::<Vec<u64>>());

    // A started send takes no more recipients.
    let late = client
        .append_recipients(v1::AppendRecipientsRequest {
            message_id: id,
            batch_number: 9,
            user_ids: vec![7],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(late.code(), tonic::Code::FailedPrecondition);
    app.cleanup().await;
}

#[tokio::test]
async fn idempotency_key_returns_the_first_send_and_creates_nothing() {
    let app = spawn_app().await;
    let mut request = send_request((1..=50).collect());
    request.idempotency_key = "order-42".into();
    let mut client = app.messages();
    let first = client.send_message(request.clone()).await.unwrap().into_inner();
    let again = client.send_message(request.clone()).await.unwrap().into_inner();
    assert!(!first.deduplicated);
    assert!(again.deduplicated);
    assert_eq!(first.message_id, again.message_id);

    wait_for_status(&app, first.message_id, v1::MessageStatus::Completed).await;
    assert_eq!(app.count_items(first.message_id).await, 50);
    let listed = client
        .list_messages(v1::ListMessagesRequest { sender: "tests".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.messages.len(), 1, "the retry created no second send");

    // Another sender may use the same key.
    request.sender = "billing".into();
    let other = client.send_message(request).await.unwrap().into_inner();
    assert_ne!(other.message_id, first.message_id);
    app.cleanup().await;
}

#[tokio::test]
async fn a_small_send_completes_promptly_while_a_large_send_runs() {
    let mut settings = notify_testkit::test_settings();
    settings.send.small_send_threshold = 100;
    settings.worker.concurrency = 2;
    let app = notify_testkit::spawn_app_with(settings, true).await;
    let large = send(&app, (1..=60_000).collect()).await;
    let small = send(&app, vec![999_999]).await;

    let done = wait_for_status(&app, small, v1::MessageStatus::Completed).await;
    assert_eq!(done.progress.unwrap().delivered, 1);
    // By the sends' own finish times: when the watch reports the small one
    // on a loaded machine, the large one may be done too by then.
    let large_done = wait_for_status(&app, large, v1::MessageStatus::Completed).await;
    let finished = |message: &v1::Message| {
        let at = message.finished_at.expect("finished_at");
        (at.seconds, at.nanos)
    };
    assert!(
        finished(&done) < finished(&large_done),
        "the small send finished while the large one still ran"
    );
    app.cleanup().await;
}

/// Tasks waiting together are applied as groups of one send's chunks, one
/// transaction each (`worker.chunks_per_transaction`), and every recipient
/// still gets exactly one item with progress adding up. A group bumps ONE
/// stats slot by its chunk count, while a chunk applied alone bumps its own
/// slot by one; with at most 7 chunks a shard (consecutive chunk ids, so
/// distinct slots of the 7), a slot above one shows a group went in one
/// transaction.
#[tokio::test]
async fn tasks_waiting_together_are_applied_in_groups_exactly_once() {
    let mut app = notify_testkit::spawn_app_with(notify_testkit::test_settings(), true).await;
    app.stop_worker().await;
    // Duplicates in the list count once.
    let mut ids: Vec<u64> = (1..=5_000).collect();
    ids.extend(1..=300);
    let message_id = send(&app, ids).await;
    for (shard, pool) in app.ctx.pools.iter() {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM message_chunks WHERE message_id = ?")
            .bind(message_id)
            .fetch_one(pool)
            .await
            .unwrap();
        assert!((2..=7).contains(&n), "precondition: 2 to 7 chunks on shard {shard:?} ({n})");
    }

    // The tasks wait in the queues; the worker takes them together.
    app.start_worker().await;
    let done = wait_for_status(&app, message_id, v1::MessageStatus::Completed).await;
    assert_eq!(app.item_users(message_id).await, (1..=5_000).collect::<Vec<u64>>());
    let progress = done.progress.unwrap();
    assert_eq!((progress.total, progress.delivered, progress.pending), (5_000, 5_000, 0));
    let mut largest_slot = 0;
    for (_, pool) in app.ctx.pools.iter() {
        let most: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(done_chunks) FROM message_shard_stats WHERE message_id = ? AND slot > 0",
        )
        .bind(message_id)
        .fetch_one(pool)
        .await
        .unwrap();
        largest_slot = largest_slot.max(most.unwrap_or(0));
    }
    assert!(largest_slot >= 2, "some chunks of a shard went in one transaction");
    app.cleanup().await;
}
