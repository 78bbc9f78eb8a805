//! Faults lose nothing and duplicate nothing.

use std::process::Stdio;
use std::time::Duration;

use notify_core::deliver::{self, TaskOutcome};
use notify_core::queue::ChunkTask;
use notify_domain::domain::{Lane, MessageId};
use notify_proto::v1;
use notify_store::db::chunks;
use notify_testkit::{TestApp, eventually, spawn_app, spawn_app_with, test_settings};
use shard_router::ShardId;

async fn send(app: &TestApp, user_ids: Vec<u64>) -> u64 {
    app.send(user_ids).await
}

async fn get(app: &TestApp, message_id: u64) -> v1::Message {
    app.get_message(message_id).await
}

async fn wait_completed(app: &TestApp, message_id: u64) -> v1::Message {
    app.wait_for_status(message_id, v1::MessageStatus::Completed).await
}

fn spawn_worker_process(app: &TestApp) -> tokio::process::Child {
    tokio::process::Command::new(notify_testkit::bin(env!("CARGO_BIN_EXE_notify-worker")))
        .env("NOTIFY_CONFIG", app.write_config_file())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("worker binary starts")
}

/// An api with small chunks (bulk lane) and no worker in process: the
/// tests run the worker as a process they can kill.
async fn app_for_a_worker_process() -> TestApp {
    let mut settings = test_settings();
    settings.send.chunk_size = 200;
    settings.send.small_send_threshold = 10;
    spawn_app_with(settings, false).await
}

/// Waits until `worker` delivered some of send `id`'s `total` recipients,
/// SIGKILLs it (no graceful shutdown: in-flight chunks are cut off) and
/// starts a replacement, checking the kill came while the send went on.
async fn kill_mid_send(
    app: &TestApp,
    mut worker: tokio::process::Child,
    id: u64,
    total: u64,
) -> tokio::process::Child {
    eventually("some chunks delivered", Duration::from_secs(60), || async {
        let delivered = get(app, id).await.progress.unwrap().delivered;
        (delivered > 0).then_some(())
    })
    .await;
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    let at_kill = get(app, id).await;
    assert_eq!(at_kill.status, v1::MessageStatus::Sending as i32);
    assert!(at_kill.progress.unwrap().delivered < total, "the kill came too late to test anything");
    spawn_worker_process(app)
}

#[tokio::test]
async fn worker_killed_mid_send_loses_and_doubles_nothing() {
    let app = app_for_a_worker_process().await;
    let total = 30_000u64;
    let worker = spawn_worker_process(&app);
    let id = send(&app, (1..=total).collect()).await;
    let mut replacement = kill_mid_send(&app, worker, id, total).await;
    let done = wait_completed(&app, id).await;
    let progress = done.progress.unwrap();
    assert_eq!(progress.delivered, total);
    assert_eq!(progress.total, total);
    assert_eq!(app.item_users(id).await, (1..=total).collect::<Vec<u64>>());
    replacement.start_kill().unwrap();
    replacement.wait().await.unwrap();
    app.cleanup().await;
}

#[tokio::test]
async fn worker_killed_mid_personalized_send_leaves_every_item_rendered_once_and_right() {
    let app = app_for_a_worker_process().await;
    let total = 20_000u64;
    let worker = spawn_worker_process(&app);
    let name = |user: u64| format!("user-{user}");
    let recipients = (1..=total)
        .map(|user_id| v1::RecipientVars {
            user_id,
            vars: [("name".to_owned(), name(user_id))].into(),
        })
        .collect();
    let mut request = notify_testkit::send_request(Vec::new());
    let content = request.content.as_mut().unwrap();
    content.title = "Hi {{ name }}".to_owned();
    content.template =
        Some(v1::Template { recipient_vars: vec!["name".to_owned()], ..Default::default() });
    request.audience = Some(v1::send_message_request::Audience::Users(v1::UserAudience {
        recipients,
        ..Default::default()
    }));
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    let mut replacement = kill_mid_send(&app, worker, id, total).await;
    let done = wait_completed(&app, id).await;
    assert_eq!(done.progress.unwrap().delivered, total);
    // Every recipient has one item (the key is user and message), with
    // their own vars.
    let mut items: Vec<(u64, Option<String>)> = Vec::new();
    for (_, pool) in app.ctx.pools.iter() {
        let rows: Vec<(u64, Option<String>)> =
            sqlx::query_as("SELECT user_id, vars FROM message_items WHERE message_id = ?")
                .bind(id)
                .fetch_all(pool)
                .await
                .unwrap();
        items.extend(rows);
    }
    items.sort();
    assert_eq!(items.len() as u64, total);
    for (user, vars) in &items {
        let expected = format!("{{\"name\":\"{}\"}}", name(*user));
        assert_eq!(vars.as_deref(), Some(expected.as_str()), "user {user}");
    }
    for user in [1, total / 2, total] {
        let request = v1::ListInboxRequest { user_id: user, page_size: 5, ..Default::default() };
        let page = app.inbox().list_inbox(request).await.unwrap().into_inner();
        assert_eq!(page.items[0].content.as_ref().unwrap().title, format!("Hi {}", name(user)));
    }
    replacement.start_kill().unwrap();
    replacement.wait().await.unwrap();
    app.cleanup().await;
}

#[tokio::test]
async fn redelivered_tasks_are_no_ops() {
    let app = spawn_app().await;
    let id = send(&app, (1..=2_000).collect()).await;
    wait_completed(&app, id).await;
    let before = get(&app, id).await.progress.unwrap();

    // Apply every chunk again, directly and through the broker.
    let mut tasks = Vec::new();
    for (shard, pool) in app.ctx.pools.iter() {
        let ids: Vec<u64> =
            sqlx::query_scalar("SELECT chunk_id FROM message_chunks WHERE message_id = ?")
                .bind(id)
                .fetch_all(pool)
                .await
                .unwrap();
        tasks.extend(ids.into_iter().map(|chunk_id| ChunkTask::deliver(id, chunk_id, shard.0)));
    }
    assert!(!tasks.is_empty());
    for task in &tasks {
        let (shard, send) = (ShardId(task.shard), MessageId::from_raw(task.message_id));
        let outcomes = deliver::apply_group(&app.ctx, shard, send, &[task.chunk_id], true).await;
        assert_eq!(outcomes.unwrap(), [TaskOutcome::AlreadyDone]);
    }
    app.ctx.publisher.publish(Lane::High, &tasks).await.unwrap();
    app.ctx.publisher.publish(Lane::Bulk, &tasks).await.unwrap();
    // A fresh send queued behind the duplicates tells us when they are consumed.
    let marker = send(&app, vec![5_000_000]).await;
    wait_completed(&app, marker).await;

    let after = get(&app, id).await.progress.unwrap();
    assert_eq!(after, before);
    assert_eq!(app.count_items(id).await, 2_000);
    app.cleanup().await;
}

#[tokio::test]
async fn sweeper_republishes_chunks_whose_publish_was_lost() {
    let mut app = spawn_app_with(test_settings(), false).await;
    let id = send(&app, (1..=1_500).collect()).await;
    // Lose every published task, as if RabbitMQ had dropped them.
    let conn = notify_core::queue::connect(&app.settings.rabbitmq, "test-purge").await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    let topology = notify_core::queue::Topology::new(&app.settings);
    for queue in topology.queues() {
        channel
            .queue_purge(queue.into(), lapin::options::QueuePurgeOptions::default())
            .await
            .unwrap();
    }
    let _ = channel.close(200, "done".into()).await;
    let _ = conn.close(200, "done".into()).await;
    let stuck = get(&app, id).await;
    assert_eq!(stuck.status, v1::MessageStatus::Sending as i32);
    assert!(stuck.progress.unwrap().pending_chunks > 0);

    app.start_worker().await;
    let done = wait_completed(&app, id).await;
    assert_eq!(done.progress.unwrap().delivered, 1_500);
    assert_eq!(app.count_items(id).await, 1_500);
    app.cleanup().await;
}

#[tokio::test]
async fn two_sweepers_claim_each_stale_chunk_once() {
    let app = spawn_app_with(test_settings(), false).await;
    let id = send(&app, (1..=6_000).collect()).await;
    let mut expected = 0;
    let mut pools = Vec::new();
    for (_, pool) in app.ctx.pools.iter() {
        // As if every publish of this send had been lost an hour ago.
        let aged = sqlx::query(
            "UPDATE message_chunks SET updated_at = updated_at - INTERVAL 1 HOUR \
             WHERE message_id = ? AND state = 0",
        )
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
        expected += aged.rows_affected();
        pools.push(pool.clone());
    }
    assert!(expected >= 12, "{expected} chunks");
    let claims = pools.iter().flat_map(|pool| {
        // Two sweepers at once on each shard, in small batches.
        (0..2).map(move |_| async move {
            let mut mine = Vec::new();
            loop {
                let claimed = chunks::claim_stale(pool, 60, 2).await.unwrap();
                if claimed.is_empty() {
                    return mine;
                }
                mine.extend(claimed);
            }
        })
    });
    let claimed: Vec<(u64, u64)> = futures::future::join_all(claims).await.concat();
    let distinct: std::collections::HashSet<(u64, u64)> = claimed.iter().copied().collect();
    assert_eq!(distinct.len(), claimed.len(), "a chunk was claimed twice");
    assert_eq!(claimed.len() as u64, expected, "every stale chunk was claimed");
    app.cleanup().await;
}

#[tokio::test]
async fn a_poison_chunk_is_dead_lettered_counted_as_failed_and_redrivable() {
    let mut app = spawn_app_with(test_settings(), false).await;
    let id = send(&app, (1..=1_000).collect()).await;
    // Corrupt one chunk's recipient list so applying it fails for good.
    let (shard, pool) = app.ctx.pools.iter().next().map(|(s, p)| (s, p.clone())).unwrap();
    let pool = &pool;
    let (chunk_id, packed): (u64, Vec<u8>) = sqlx::query_as(
        "SELECT chunk_id, user_ids FROM message_chunks WHERE message_id = ? ORDER BY chunk_id LIMIT 1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    let poisoned_recipients = (packed.len() / 8) as u64;
    sqlx::query("UPDATE message_chunks SET user_ids = ? WHERE message_id = ? AND chunk_id = ?")
        .bind(vec![1u8, 2, 3])
        .bind(id)
        .bind(chunk_id)
        .execute(pool)
        .await
        .unwrap();

    app.start_worker().await;
    let done = wait_completed(&app, id).await;
    let progress = done.progress.unwrap();
    assert_eq!(progress.failed, poisoned_recipients);
    assert_eq!(progress.delivered, 1_000 - poisoned_recipients);
    assert_eq!(progress.pending, 0);
    let state: u8 = sqlx::query_scalar(
        "SELECT state FROM message_chunks WHERE message_id = ? AND chunk_id = ?",
    )
    .bind(id)
    .bind(chunk_id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(state, chunks::state::FAILED, "chunk {chunk_id} on shard {shard}");

    // Repair the data and re-drive: the failed recipients are delivered.
    sqlx::query("UPDATE message_chunks SET user_ids = ? WHERE message_id = ? AND chunk_id = ?")
        .bind(packed)
        .bind(id)
        .bind(chunk_id)
        .execute(pool)
        .await
        .unwrap();
    let redriven =
        app.messages().redrive_message(v1::RedriveMessageRequest { message_id: id }).await.unwrap();
    // The reply shows the state right after re-publishing: the worker may
    // have applied the chunk and completed the send already.
    let status = redriven.into_inner().status;
    let reopened = [v1::MessageStatus::Sending as i32, v1::MessageStatus::Completed as i32];
    assert!(reopened.contains(&status), "status after redrive: {status}");
    let done = wait_completed(&app, id).await;
    let progress = done.progress.unwrap();
    assert_eq!(progress.failed, 0);
    assert_eq!(progress.delivered, 1_000);
    assert_eq!(app.item_users(id).await, (1..=1_000).collect::<Vec<u64>>());
    app.cleanup().await;
}

#[tokio::test]
async fn a_chunk_that_keeps_killing_workers_is_recorded_as_failed() {
    let app = spawn_app_with(test_settings(), false).await;
    let id = send(&app, (1..=600).collect()).await;
    // As if workers had died on this chunk poison_attempts times already.
    let (shard, pool) = app.ctx.pools.iter().next().map(|(s, p)| (s, p.clone())).unwrap();
    let (chunk_id, recipients): (u64, u16) = sqlx::query_as(
        "SELECT chunk_id, recipients FROM message_chunks WHERE message_id = ? ORDER BY chunk_id LIMIT 1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE message_chunks SET attempts = ? WHERE message_id = ? AND chunk_id = ?")
        .bind(app.settings.worker.poison_attempts)
        .bind(id)
        .bind(chunk_id)
        .execute(&pool)
        .await
        .unwrap();
    let outcomes =
        deliver::apply_group(&app.ctx, shard, MessageId::from_raw(id), &[chunk_id], true).await;
    assert_eq!(outcomes.unwrap(), [TaskOutcome::Failed]);
    let progress = get(&app, id).await.progress.unwrap();
    assert_eq!(progress.failed, u64::from(recipients));
    app.cleanup().await;
}

/// MySQL connections killed (`KILL`, as a failover or an operator would) while
/// they hold an open chunk transaction: each such chunk rolls back and is
/// applied again, and every recipient gets the item exactly once.
#[tokio::test]
async fn mysql_connections_killed_mid_chunk_transaction_lose_and_double_nothing() {
    let mut settings = test_settings();
    settings.send.chunk_size = 200;
    let app = spawn_app_with(settings, true).await;
    // The account the scripts make: it sees the server's transactions
    // (PROCESS) and may kill its own connections, the services' too.
    let account = app.settings.shard_server_url(&app.settings.database.shards[0]);
    let admin = sqlx::MySqlPool::connect(&account).await.unwrap();
    let databases: Vec<String> =
        app.settings.database.shards.iter().map(|s| s.database.clone()).collect();
    let total = 20_000u64;
    let id = send(&app, (1..=total).collect()).await;
    let mut killed = 0;
    loop {
        let message = get(&app, id).await;
        if message.status == v1::MessageStatus::Completed as i32 {
            break;
        }
        // Connections of this test's shards in a transaction holding row
        // locks now (a chunk's, which locks its chunk row first; the test's
        // own progress reads lock nothing).
        let in_transaction: Vec<u64> = sqlx::query_scalar(
            "SELECT t.trx_mysql_thread_id FROM information_schema.INNODB_TRX t \
             JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
             WHERE p.DB IN (?, ?, ?, ?) AND t.trx_rows_locked > 0",
        )
        .bind(&databases[0])
        .bind(&databases[1])
        .bind(&databases[2])
        .bind(&databases[3])
        .fetch_all(&admin)
        .await
        .unwrap();
        for thread in in_transaction.into_iter().take(2) {
            // It may have finished meanwhile: then there is nothing to kill.
            if sqlx::query(sqlx::AssertSqlSafe(format!("KILL {thread}")))
                .execute(&admin)
                .await
                .is_ok()
            {
                killed += 1;
            }
        }
        if killed >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await; // pacing, not waiting
    }
    assert!(killed > 0, "the send completed before any transaction could be killed");
    let done = wait_completed(&app, id).await;
    let progress = done.progress.unwrap();
    assert_eq!((progress.total, progress.delivered, progress.failed), (total, total, 0));
    assert_eq!(app.item_users(id).await, (1..=total).collect::<Vec<u64>>());
    admin.close().await;
    app.cleanup().await;
}

#[tokio::test]
async fn worker_killed_mid_recall_takes_every_item_back_once() {
    let mut settings = test_settings();
    settings.send.chunk_size = 100;
    settings.send.small_send_threshold = 10;
    // One chunk per transaction, one at a time per shard: a recall goes in
    // grouped transactions otherwise, and a few of them take back a whole
    // test-sized send in the time between seeing its first item recalled
    // and the kill landing.
    settings.worker.concurrency = 1;
    settings.worker.chunks_per_transaction = 1;
    let app = spawn_app_with(settings, false).await;
    let total = 30_000u64;
    let mut worker = spawn_worker_process(&app);
    let id = send(&app, (1..=total).collect()).await;
    let delivered = wait_completed(&app, id).await.progress.unwrap().delivered;
    assert_eq!(delivered, total);

    app.messages().recall_message(v1::RecallMessageRequest { message_id: id }).await.unwrap();
    eventually("some items taken back", Duration::from_secs(60), || async {
        let recalled = get(&app, id).await.progress.unwrap().recalled;
        (recalled > 0).then_some(())
    })
    .await;
    // SIGKILL mid-recall: chunk transactions cut off, tasks unacked.
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    let at_kill = get(&app, id).await;
    assert!(at_kill.finished_at.is_none(), "the kill came too late to test anything");
    assert!(at_kill.progress.unwrap().recalled < total);

    let mut replacement = spawn_worker_process(&app);
    let done = eventually("the recall finishes", Duration::from_secs(120), || async {
        let message = get(&app, id).await;
        message.finished_at.is_some().then_some(message)
    })
    .await;
    let progress = done.progress.unwrap();
    assert_eq!(progress.recalled, total, "every item taken back exactly once");
    assert_eq!(progress.pending_chunks, 0);
    let items = (app.count_items(id).await, app.count_recalled_items(id).await);
    assert_eq!(items, (total, total), "each item marked once, left for retention's purge");
    replacement.start_kill().unwrap();
    replacement.wait().await.unwrap();
    app.cleanup().await;
}
