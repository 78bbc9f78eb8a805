//! The sends' read counts and readers behind filtered reads: a filtered
//! read or unread writes one row of `read_backlog` in the user's
//! transaction, and the counts follow from it a moment later, exactly once,
//! whatever races it (ids updates, other filtered updates, a crash, an
//! erasure).

use std::collections::BTreeSet;

use notify_proto::v1;
use notify_proto::v1::admin_service_client::AdminServiceClient;
use notify_testkit::TestApp;
use notify_testkit::spawn_app;

use crate::helpers::{announce, inbox_ids};
use crate::items::{deliver, update};

/// Each send's read count (as `GetMessage` answers) and readers (as
/// recorded by message) against its items, read independently.
async fn assert_counts_agree(app: &TestApp, sends: &[u64]) {
    for id in sends {
        let mut read_items = BTreeSet::new();
        let mut readers = BTreeSet::new();
        for (_, pool) in app.ctx.pools.iter() {
            let items: Vec<u64> = sqlx::query_scalar(
                "SELECT user_id FROM message_items WHERE message_id = ? AND is_read = 1",
            )
            .bind(id)
            .fetch_all(pool)
            .await
            .unwrap();
            read_items.extend(items);
            let recorded: Vec<u64> =
                sqlx::query_scalar("SELECT user_id FROM message_reads WHERE message_id = ?")
                    .bind(id)
                    .fetch_all(pool)
                    .await
                    .unwrap();
            readers.extend(recorded);
        }
        let progress = app.get_message(*id).await.progress.unwrap();
        assert_eq!(progress.read, read_items.len() as u64, "send {id}'s read count");
        assert_eq!(readers, read_items, "send {id}'s readers");
    }
}

/// Each send's `progress.read`, as `GetMessage` answers.
async fn read_counts(app: &TestApp, sends: &[u64]) -> Vec<u64> {
    let mut read = Vec::with_capacity(sends.len());
    for id in sends {
        read.push(app.get_message(*id).await.progress.unwrap().read);
    }
    read
}

fn everything() -> Option<v1::ItemFilter> {
    Some(v1::ItemFilter { view: v1::InboxView::All as i32, ..Default::default() })
}

#[tokio::test]
async fn a_filtered_read_is_counted_for_its_sends_once_the_backlog_drains() {
    let app = spawn_app().await;
    let (user, other) = (5_700_001, 5_700_002);
    let mut sends = Vec::new();
    for category in ["billing", "promo", "billing", "news"] {
        sends.push(deliver(&app, &[user, other], category).await);
    }

    let reply = update(&app, user, v1::ItemAction::MarkRead, vec![], everything()).await;
    assert_eq!((reply.changed, reply.unread), (4, 0), "the user's own counts are immediate");
    app.reads_counted().await;
    assert_eq!(read_counts(&app, &sends).await, [1; 4]);
    for id in &sends {
        assert_eq!(app.count_reads(*id).await, 1, "send {id}");
    }

    // By ids: counted in the call itself.
    update(&app, user, v1::ItemAction::MarkUnread, vec![sends[0]], None).await;
    assert_eq!(app.get_message(sends[0]).await.progress.unwrap().read, 0);
    assert_eq!(app.count_reads(sends[0]).await, 0);

    // Unread by a category: only that category's sends lose the read.
    let billing = v1::ItemFilter { category: "billing".to_owned(), ..everything().unwrap() };
    let reply = update(&app, user, v1::ItemAction::MarkUnread, vec![], Some(billing)).await;
    assert_eq!(reply.changed, 1, "sends[0] was unread already");
    app.reads_counted().await;
    assert_eq!(read_counts(&app, &sends).await, [0, 1, 0, 1]);
    assert_counts_agree(&app, &sends).await;

    // Filters and ids back to back, nothing awaited between them.
    update(&app, user, v1::ItemAction::MarkRead, vec![], everything()).await;
    update(&app, user, v1::ItemAction::MarkUnread, vec![sends[1]], None).await;
    update(&app, other, v1::ItemAction::MarkRead, vec![], everything()).await;
    update(&app, user, v1::ItemAction::MarkUnread, vec![], everything()).await;
    update(&app, user, v1::ItemAction::MarkRead, vec![sends[2], sends[3]], None).await;
    app.reads_counted().await;
    assert_counts_agree(&app, &sends).await;
    let read = read_counts(&app, &sends).await;
    assert_eq!(read, [1, 1, 2, 2], "the other user read all four, the user two");
    app.cleanup().await;
}

#[tokio::test]
async fn reads_racing_by_filter_and_by_ids_leave_counts_and_readers_exact() {
    let app = spawn_app().await;
    let users: Vec<u64> = (0..4).map(|i| 5_710_000 + i * 7_919).collect();
    let mut sends = Vec::new();
    for category in ["billing", "promo", "billing", "news", "promo", "billing"] {
        sends.push(deliver(&app, &users, category).await);
    }
    let mut tasks = Vec::new();
    for (index, user) in users.iter().copied().enumerate() {
        let mut inbox = app.inbox();
        let sends = sends.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..24usize {
                let step = (round * 7 + index * 3) % 6;
                let (action, message_ids, all) = match step {
                    0 => (v1::ItemAction::MarkRead, vec![], everything()),
                    1 => (v1::ItemAction::MarkUnread, vec![sends[round % 6]], None),
                    2 => {
                        let filter = v1::ItemFilter {
                            category: "billing".to_owned(),
                            ..everything().unwrap()
                        };
                        (v1::ItemAction::MarkUnread, vec![], Some(filter))
                    }
                    3 => (v1::ItemAction::MarkRead, vec![sends[(round + 1) % 6], sends[3]], None),
                    4 => (v1::ItemAction::MarkUnread, vec![], everything()),
                    _ => {
                        let filter = v1::ItemFilter {
                            category: "promo".to_owned(),
                            ..everything().unwrap()
                        };
                        (v1::ItemAction::MarkRead, vec![], Some(filter))
                    }
                };
                let request = v1::UpdateItemsRequest {
                    user_id: user,
                    action: action as i32,
                    message_ids,
                    all,
                };
                inbox.update_items(request).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    app.reads_counted().await;
    assert_counts_agree(&app, &sends).await;
    app.cleanup().await;
}

#[tokio::test]
async fn an_item_expiring_between_a_filtered_reads_statements_is_read_and_counted_or_neither() {
    let app = spawn_app().await;
    let user = 5_700_101;
    let sends = [deliver(&app, &[user], "billing").await, deliver(&app, &[user], "billing").await];
    let pool = app.ctx.pools.for_user(user);
    let pool = pool.value();
    sqlx::query(
        "UPDATE message_items SET expire_at = UTC_TIMESTAMP(3) + INTERVAL 5 SECOND \
         WHERE user_id = ? AND message_id = ?",
    )
    .bind(user)
    .bind(sends[1])
    .execute(pool)
    .await
    .unwrap();
    // The clock of the session writing the backlog row jumps 10 s as the
    // row is written (this test's shard only): the statements after it in
    // the update's script see the second item expired, as they would if
    // it expired between them.
    sqlx::query(
        "CREATE TRIGGER test_clock_jumps BEFORE INSERT ON read_backlog FOR EACH ROW \
         SET @@session.timestamp = UNIX_TIMESTAMP(NOW(6)) + 10",
    )
    .execute(pool)
    .await
    .unwrap();

    let reply = update(&app, user, v1::ItemAction::MarkRead, vec![], everything()).await;
    sqlx::query("DROP TRIGGER test_clock_jumps").execute(pool).await.unwrap();
    assert_eq!(reply.changed, 2, "both items were in the inbox as the update began");
    app.reads_counted().await;
    assert_counts_agree(&app, &sends).await;
    assert_eq!(read_counts(&app, &sends).await, [1, 1]);
    app.cleanup().await;
}

/// What a process killed right after a filtered read's commit leaves: the
/// items read and the row waiting, nobody to count it at once. The row's
/// ids are a JSON array, as the update's `GROUP_CONCAT` between brackets
/// writes them.
async fn read_and_leave_waiting(app: &TestApp, user_id: u64) {
    let pool = app.ctx.pools.for_user(user_id);
    let mut tx = pool.value().begin().await.unwrap();
    sqlx::query(
        "INSERT INTO read_backlog (user_id, delta, message_ids) \
         SELECT user_id, 1, CONCAT('[', GROUP_CONCAT(message_id), ']') FROM message_items \
         WHERE user_id = ? AND is_read = 0 GROUP BY user_id",
    )
    .bind(user_id)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE message_items SET is_read = 1, is_seen = 1, read_time = UTC_TIMESTAMP(3) \
         WHERE user_id = ? AND is_read = 0",
    )
    .bind(user_id)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn reads_a_crash_left_waiting_are_counted_by_the_workers_and_an_erasure_keeps_none() {
    let app = spawn_app().await;
    let (reader, erased) = (5_720_001, 5_720_002);
    let sends = [
        deliver(&app, &[reader, erased], "billing").await,
        deliver(&app, &[reader, erased], "promo").await,
    ];
    read_and_leave_waiting(&app, reader).await;
    // Counted by the workers' settler, once the row is older than it waits.
    app.reads_counted().await;
    assert_counts_agree(&app, &sends).await;
    assert_eq!(read_counts(&app, &sends).await, [1, 1]);

    // An erased user's waiting reads keep counting for the sends (as reads
    // counted before do), and nothing of theirs is left.
    read_and_leave_waiting(&app, erased).await;
    AdminServiceClient::new(app.channel())
        .erase_user(v1::EraseUserRequest { user_id: erased })
        .await
        .unwrap();
    app.reads_counted().await;
    for id in sends {
        assert_eq!(app.get_message(id).await.progress.unwrap().read, 2, "send {id}");
        assert_eq!(app.count_reads(id).await, 1, "the erased user is no reader");
    }
    for (_, pool) in app.ctx.pools.iter() {
        let left: i64 = sqlx::query_scalar(
            "SELECT (SELECT COUNT(*) FROM read_backlog WHERE user_id = ?) \
             + (SELECT COUNT(*) FROM message_reads WHERE user_id = ?)",
        )
        .bind(erased)
        .bind(erased)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(left, 0);
    }
    app.cleanup().await;
}

/// A cancelled announcement takes no read back: reads counted after its
/// cancel keep their readers as those counted before do (a recall is
/// what takes reads back, and writes no reader for its items).
#[tokio::test]
async fn reads_of_a_cancelled_announcement_counted_after_the_cancel_keep_their_readers() {
    let app = spawn_app().await;
    let (early, late) = (5_730_001, 5_730_002);
    let id = announce(&app, "counted either side of a cancel").await;
    for user in [early, late] {
        assert_eq!(inbox_ids(&app, user).await, [id], "materialized by the first read");
    }
    read_and_leave_waiting(&app, early).await;
    app.reads_counted().await;
    read_and_leave_waiting(&app, late).await;
    app.messages().cancel_message(v1::CancelMessageRequest { message_id: id }).await.unwrap();
    app.wait_for_operations(id).await;
    app.reads_counted().await;
    assert_counts_agree(&app, &[id]).await;
    assert_eq!(app.count_reads(id).await, 2, "both readers, counted before and after the cancel");
    app.cleanup().await;
}
