//! Lifecycle: pause, resume, cancel, schedule, illegal transitions.

use std::time::Duration;

use notify_domain::domain::Lane;
use notify_proto::v1;
use notify_testkit::{TestApp, eventually, spawn_app_with, test_settings};

use crate::helpers::{get, send, send_request, wait_for_status};

/// A send slow enough to interrupt: many chunks, few workers.
async fn slow_app() -> TestApp {
    let mut settings = test_settings();
    settings.worker.concurrency = 1;
    settings.send.chunk_size = 100;
    settings.send.small_send_threshold = 10;
    spawn_app_with(settings, true).await
}

/// Tasks waiting in a lane's queues (ready, not yet delivered to a consumer).
async fn queued(app: &TestApp, lane: Lane) -> u32 {
    let conn = notify_core::queue::connect(&app.settings.rabbitmq, "test-probe").await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    let topology = notify_core::queue::Topology::new(&app.settings);
    let mut waiting = 0;
    for shard in topology.shards() {
        let declared = channel
            .queue_declare(
                topology.queue(lane, *shard).into(),
                lapin::options::QueueDeclareOptions { passive: true, ..Default::default() },
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        waiting += declared.message_count();
    }
    let _ = channel.close(200, "probe done".into()).await;
    let _ = conn.close(200, "probe done".into()).await;
    waiting
}

async fn delivered(app: &TestApp, id: u64) -> u64 {
    get(app, id).await.progress.unwrap().delivered
}

/// The most items that may commit after a pause or cancel returned: what
/// was already in a transaction then, per shard `concurrency` groups of up
/// to `chunks_per_transaction` chunks of 100.
fn in_flight(app: &TestApp) -> u64 {
    let worker = &app.settings.worker;
    let shards = app.settings.database.shards.len() as u64;
    shards * worker.concurrency as u64 * worker.chunks_per_transaction as u64 * 100
}

/// Starts a slow send and returns once its first chunks are delivered.
async fn send_under_way(app: &TestApp, total: u64) -> u64 {
    let id = send(app, (1..=total).collect()).await;
    eventually("first chunks delivered", Duration::from_secs(30), || async {
        (delivered(app, id).await > 0).then_some(())
    })
    .await;
    id
}

#[tokio::test]
async fn pause_stops_delivery_and_resume_finishes_with_the_exact_total() {
    let app = slow_app().await;
    let total = 20_000u64;
    let id = send_under_way(&app, total).await;

    let paused = app.messages().pause_message(v1::PauseMessageRequest { message_id: id }).await;
    let paused = paused.unwrap().into_inner();
    assert_eq!(paused.status, v1::MessageStatus::Paused as i32);
    let at_pause = app.count_items(id).await;
    // Every queued task is taken and skipped; the chunks stay pending.
    eventually("queue drained", Duration::from_secs(30), || async {
        (queued(&app, Lane::Bulk).await == 0).then_some(())
    })
    .await;
    let after_drain = app.count_items(id).await;
    assert!(
        after_drain - at_pause <= in_flight(&app),
        "{} items were delivered after the pause returned",
        after_drain - at_pause
    );
    let still_paused = get(&app, id).await;
    assert_eq!(still_paused.status, v1::MessageStatus::Paused as i32);
    let progress = still_paused.progress.unwrap();
    assert!(progress.pending_chunks > 0, "the pause came too late to test anything");
    assert_eq!(progress.delivered, after_drain, "progress agrees with the rows");
    // Nothing moves while paused, however often the sweeper runs.
    app.messages().get_message(v1::GetMessageRequest { message_id: id }).await.unwrap();
    assert_eq!(app.count_items(id).await, after_drain);

    let resumed = app.messages().resume_message(v1::ResumeMessageRequest { message_id: id }).await;
    assert_eq!(resumed.unwrap().into_inner().status, v1::MessageStatus::Sending as i32);
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_eq!(done.progress.unwrap().delivered, total);
    assert_eq!(app.item_users(id).await, (1..=total).collect::<Vec<u64>>());
    app.cleanup().await;
}

#[tokio::test]
async fn cancel_leaves_the_rest_undelivered() {
    let app = slow_app().await;
    let total = 20_000u64;
    let id = send_under_way(&app, total).await;

    let cancelled =
        app.messages().cancel_message(v1::CancelMessageRequest { message_id: id }).await;
    let cancelled = cancelled.unwrap().into_inner();
    assert_eq!(cancelled.status, v1::MessageStatus::Cancelled as i32);
    // No chunk starts after the call returns (the workers read the status
    // it cached); what was already in a transaction may commit, as after
    // a pause.
    let at_cancel = app.count_items(id).await;
    eventually("queue drained", Duration::from_secs(30), || async {
        (queued(&app, Lane::Bulk).await == 0).then_some(())
    })
    .await;
    // A drained queue still leaves the chunks a worker holds (prefetched,
    // in a transaction): they settle, delivered or cancelled.
    let progress =
        eventually("the chunks in flight to settle", Duration::from_secs(30), || async {
            let progress = app.wait_for_operations(id).await.progress?;
            (progress.pending_chunks == 0).then_some(progress)
        })
        .await;
    let after = app.count_items(id).await;
    assert!(
        after - at_cancel <= in_flight(&app),
        "{} items were delivered after the cancel returned",
        after - at_cancel
    );
    assert!(progress.cancelled > 0, "the cancel came too late to test anything");
    assert_eq!(progress.delivered, after);
    assert_eq!(progress.delivered + progress.cancelled, total);
    assert_eq!(progress.pending, 0);
    assert_eq!(progress.pending_chunks, 0);

    // Cancelled is final.
    let resume = app.messages().resume_message(v1::ResumeMessageRequest { message_id: id }).await;
    assert_eq!(resume.unwrap_err().code(), tonic::Code::FailedPrecondition);
    app.cleanup().await;
}

#[tokio::test]
async fn scheduled_send_waits_for_send_at_and_starts_on_time() {
    let app = notify_testkit::spawn_app().await;
    let send_at = chrono::Utc::now() + chrono::Duration::seconds(2);
    let mut request = send_request((1..=300).collect());
    request.send_at = Some(prost_types::Timestamp {
        seconds: send_at.timestamp(),
        nanos: send_at.timestamp_subsec_nanos() as i32,
    });
    let response = app.messages().send_message(request).await.unwrap().into_inner();
    assert_eq!(response.status, v1::MessageStatus::NotStarted as i32);
    assert_eq!(app.count_items(response.message_id).await, 0);

    let done = wait_for_status(&app, response.message_id, v1::MessageStatus::Completed).await;
    let started = done.started_at.expect("started_at set");
    let started_ms = started.seconds * 1000 + i64::from(started.nanos) / 1_000_000;
    let late_ms = started_ms - send_at.timestamp_millis();
    assert!(late_ms >= 0, "started {} ms early", -late_ms);
    assert!(late_ms < 1_500, "started {late_ms} ms late");
    assert_eq!(done.progress.unwrap().delivered, 300);
    app.cleanup().await;
}

#[tokio::test]
async fn illegal_transitions_are_failed_precondition_and_unknown_ids_not_found() {
    let app = notify_testkit::spawn_app().await;
    let id = send(&app, vec![1, 2, 3]).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let mut client = app.messages();

    let resume =
        client.resume_message(v1::ResumeMessageRequest { message_id: id }).await.unwrap_err();
    assert_eq!(resume.code(), tonic::Code::FailedPrecondition);
    assert_eq!(resume.message(), format!("cannot resume message {id}: it is completed"));
    let pause = client.pause_message(v1::PauseMessageRequest { message_id: id }).await.unwrap_err();
    assert_eq!(pause.code(), tonic::Code::FailedPrecondition);
    let cancel =
        client.cancel_message(v1::CancelMessageRequest { message_id: id }).await.unwrap_err();
    assert_eq!(cancel.code(), tonic::Code::FailedPrecondition);
    let start = client.start_message(v1::StartMessageRequest { message_id: id }).await.unwrap_err();
    assert_eq!(start.code(), tonic::Code::FailedPrecondition);

    let missing = 12_345_678;
    for status in [
        client.get_message(v1::GetMessageRequest { message_id: missing }).await.unwrap_err(),
        client.pause_message(v1::PauseMessageRequest { message_id: missing }).await.unwrap_err(),
        client.start_message(v1::StartMessageRequest { message_id: missing }).await.unwrap_err(),
        client
            .append_recipients(v1::AppendRecipientsRequest {
                message_id: missing,
                batch_number: 1,
                user_ids: vec![1],
                ..Default::default()
            })
            .await
            .unwrap_err(),
    ] {
        assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
        assert_eq!(status.message(), format!("message {missing} not found"));
    }
    // A draft without recipients cannot start.
    let draft = crate::helpers::create_draft(&app, "empty").await;
    let empty =
        client.start_message(v1::StartMessageRequest { message_id: draft }).await.unwrap_err();
    assert_eq!(empty.code(), tonic::Code::FailedPrecondition);
    app.cleanup().await;
}

#[tokio::test]
async fn a_late_write_of_an_older_status_never_overwrites_a_newer_one() {
    let app = notify_testkit::spawn_app().await;
    let cache = &app.ctx.cache;
    let id = 4_242;
    cache.write_status(id, 5, 2, 60).await.unwrap(); // v5 PAUSED
    cache.write_status(id, 4, 1, 60).await.unwrap(); // a delayed v4 SENDING
    assert_eq!(cache.cached_status(id).await.unwrap(), Some(2));
    cache.write_status(id, 6, 1, 60).await.unwrap(); // v6 SENDING (a resume)
    assert_eq!(cache.cached_status(id).await.unwrap(), Some(1));
    app.cleanup().await;
}

#[tokio::test]
async fn a_half_appended_batch_blocks_start_until_it_is_appended_again() {
    let app = notify_testkit::spawn_app().await;
    let mut client = app.messages();
    let id = crate::helpers::create_draft(&app, "draft").await;
    let batch = v1::AppendRecipientsRequest {
        message_id: id,
        batch_number: 1,
        user_ids: (1..=800).collect(),
        ..Default::default()
    };
    client.append_recipients(batch.clone()).await.unwrap();
    // As if the api had died after storing the chunks but before recording
    // the batch.
    let home = app.ctx.pools.for_message(id).value();
    sqlx::query("DELETE FROM message_batches WHERE message_id = ?")
        .bind(id)
        .execute(home)
        .await
        .unwrap();
    let refused =
        client.start_message(v1::StartMessageRequest { message_id: id }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(refused.message().contains("append it again"), "{}", refused.message());

    let again = client.append_recipients(batch).await.unwrap().into_inner();
    assert!(!again.duplicate_batch);
    client.start_message(v1::StartMessageRequest { message_id: id }).await.unwrap();
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_eq!(done.progress.unwrap().delivered, 800, "the re-appended batch added nobody twice");
    app.cleanup().await;
}

/// A recipient in two batches who got the item from the first counts once
/// when the second's chunk is cancelled: as delivered, not also as cancelled.
#[tokio::test]
async fn a_cancelled_chunks_recipient_delivered_by_another_batch_counts_once() {
    use notify_core::deliver::{self, TaskOutcome};
    use notify_domain::domain::MessageId;
    let app = spawn_app_with(test_settings(), false).await;
    let id = crate::helpers::create_draft(&app, "overlap").await;
    let mut client = app.messages();
    for (batch_number, users) in [(1, 1..=10u64), (2, 5..=15u64)] {
        let batch = v1::AppendRecipientsRequest {
            message_id: id,
            batch_number,
            user_ids: users.collect(),
            ..Default::default()
        };
        client.append_recipients(batch).await.unwrap();
    }
    client.start_message(v1::StartMessageRequest { message_id: id }).await.unwrap();
    // Batch 1's chunks are applied (no worker runs: by hand), batch 2's not.
    for (shard, pool) in app.ctx.pools.iter() {
        let chunk_ids: Vec<u64> =
            sqlx::query_scalar("SELECT chunk_id FROM message_chunks WHERE message_id = ?")
                .bind(id)
                .fetch_all(pool)
                .await
                .unwrap();
        let batch_of = |chunk_id: u64| chunk_id >> notify_core::send::plan::SEQUENCE_BITS;
        for chunk_id in chunk_ids.into_iter().filter(|c| batch_of(*c) == 1) {
            let send = MessageId::from_raw(id);
            let outcomes =
                deliver::apply_group(&app.ctx, shard, send, &[chunk_id], false).await.unwrap();
            assert!(matches!(outcomes[..], [TaskOutcome::Delivered { .. }]), "{outcomes:?}");
        }
    }
    client.cancel_message(v1::CancelMessageRequest { message_id: id }).await.unwrap();
    let progress = app.wait_for_operations(id).await.progress.unwrap();
    assert_eq!(
        (progress.total, progress.delivered, progress.cancelled, progress.pending),
        (15, 10, 5, 0),
        "{progress:?}"
    );
    app.cleanup().await;
}

/// A send whose chunks outnumber the publish window many times over: 1,000
/// recipients in chunks of 10 (~25 chunks a shard) with a window of 3, so
/// pages of 12.
async fn windowed_app() -> TestApp {
    let mut settings = test_settings();
    settings.send.chunk_size = 10;
    settings.send.small_send_threshold = 10;
    settings.rabbitmq.publish_window = 3;
    settings.control.cancel_page_chunks = 7;
    let mut app = spawn_app_with(settings, true).await;
    // Tasks stay in the queues, where they can be counted.
    app.stop_worker().await;
    app
}

#[tokio::test]
async fn starting_a_send_publishes_each_chunk_once_a_window_at_a_time() {
    let mut app = windowed_app().await;
    let id = send(&app, (1..=1_000).collect()).await;
    let chunks = app.count_chunks(id).await;
    assert!(chunks >= 100, "precondition: 100 chunks of 10 ({chunks})");
    // The pending ids were read 12 at a time and published with at most 3
    // awaiting their confirm: one task per chunk, none lost at a page's
    // edge and none twice.
    assert_eq!(u64::from(queued(&app, Lane::Bulk).await), chunks);

    app.start_worker().await;
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_eq!(done.progress.unwrap().delivered, 1_000);
    assert_eq!(app.item_users(id).await, (1..=1_000).collect::<Vec<u64>>());
    app.cleanup().await;
}

#[tokio::test]
async fn cancel_walks_every_pending_chunk_a_page_at_a_time() {
    let mut app = windowed_app().await;
    let id = send(&app, (1..=1_000).collect()).await;
    let cancelled =
        app.messages().cancel_message(v1::CancelMessageRequest { message_id: id }).await;
    let answer = cancelled.unwrap().into_inner();
    assert_eq!(answer.status, v1::MessageStatus::Cancelled as i32);
    // The call recorded the cancel; the operation cancels every chunk, 7
    // per transaction, behind it.
    let cancelled = app.wait_for_operations(id).await;
    let progress = cancelled.progress.unwrap();
    assert_eq!((progress.cancelled, progress.pending, progress.pending_chunks), (1_000, 0, 0));

    // The queued tasks find nothing to deliver.
    app.start_worker().await;
    eventually("queue drained", Duration::from_secs(30), || async {
        (queued(&app, Lane::Bulk).await == 0).then_some(())
    })
    .await;
    assert_eq!(app.count_items(id).await, 0);
    app.cleanup().await;
}
