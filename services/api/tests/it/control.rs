//! Control operations (cancel, recall, edit) are finished by the system on
//! every shard whatever fails midway: a shard cut during the call, a
//! deadlock at a shard's step, the api killed between the status change
//! and the shards. Nobody calls again; within a sweep of the shard's return
//! every recipient on every shard is right. And their invalidation is in
//! proportion: a small recall or edit retires only its recipients' badges.

use notify_domain::Settings;
use notify_domain::domain::{Content, MessageId, SendStatus};
use notify_proto::v1;
use notify_store::db::messages::{self, ControlChange};
use notify_store::db::operations::{OperationKind, Retire};
use notify_testkit::faults::{Proxies, route_through_proxies};
use notify_testkit::{TestApp, spawn_app_with, test_settings};
use shard_router::ShardId;

use crate::helpers::{announce, content, inbox_ids, send, wait_for_status};
use crate::items::{served, truth};

/// Settings whose failed drives are tried again soon.
fn quick_retries() -> Settings {
    let mut settings = test_settings();
    settings.control.retry_ms = 100;
    settings
}

/// An app whose shards, Redis and RabbitMQ are reached through proxies.
async fn behind_proxies() -> (TestApp, Proxies) {
    let mut settings = quick_retries();
    let proxies = route_through_proxies(&mut settings).await;
    (spawn_app_with(settings, true).await, proxies)
}

/// `count` users from `first` on, spread over every shard.
fn users(first: u64, count: u64) -> Vec<u64> {
    (first..first + count).collect()
}

/// A shard with recipients among `users` that is not the send's home (whose
/// record the call writes), and its index among the settings' shards.
fn shard_to_cut(app: &TestApp, message_id: u64, users: &[u64]) -> (ShardId, usize) {
    let map = app.settings.shard_map().unwrap();
    let home = map.home_shard_for_message(message_id);
    let (shard, _) = map
        .partition_users(users)
        .into_iter()
        .find(|(shard, _)| *shard != home)
        .expect("recipients on a shard that is not the home");
    let index = app.settings.database.shards.iter().position(|s| s.id == shard).unwrap();
    (shard, index)
}

/// `users` split into those on `shard` and the others.
fn split(app: &TestApp, users: &[u64], shard: ShardId) -> (Vec<u64>, Vec<u64>) {
    let map = app.settings.shard_map().unwrap();
    users.iter().partition(|user| map.shard_for_user(**user) == shard)
}

/// Every one of `users` neither lists `message_id` nor counts it: the list
/// leaves it out and the badge served equals MySQL's count.
async fn assert_gone(app: &TestApp, message_id: u64, users: &[u64]) {
    for user in users {
        assert!(!inbox_ids(app, *user).await.contains(&message_id), "user {user} still lists it");
        let (served, truth) = (served(app, *user).await, truth(app, *user).await);
        assert_eq!(served, truth, "user {user}'s badge");
    }
}

/// Every one of `users` lists `message_id` with `title`.
async fn assert_titled(app: &TestApp, message_id: u64, users: &[u64], title: &str) {
    for user in users {
        let page = app
            .inbox()
            .list_inbox(v1::ListInboxRequest {
                user_id: *user,
                page_size: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let item = page.items.iter().find(|item| item.message_id == message_id);
        let shown = item.and_then(|item| item.content.as_ref()).map(|c| c.title.as_str());
        assert_eq!(shown, Some(title), "user {user}'s item");
    }
}

/// Caches every user's badge (a first read of each).
async fn cache_badges(app: &TestApp, users: &[u64]) {
    for user in users {
        served(app, *user).await;
    }
}

async fn recall(app: &TestApp, message_id: u64) -> v1::Message {
    let request = v1::RecallMessageRequest { message_id };
    app.messages().recall_message(request).await.expect("the recall answers").into_inner()
}

async fn edit(app: &TestApp, message_id: u64, title: &str) -> v1::Message {
    let request = v1::EditMessageRequest { message_id, content: Some(content(title)) };
    app.messages().edit_message(request).await.expect("the edit answers").into_inner()
}

async fn cancel(app: &TestApp, message_id: u64) -> v1::Message {
    let request = v1::CancelMessageRequest { message_id };
    app.messages().cancel_message(request).await.expect("the cancel answers").into_inner()
}

fn pending(message: &v1::Message) -> Vec<v1::ControlOperation> {
    message
        .pending_operations
        .iter()
        .map(|kind| v1::ControlOperation::try_from(*kind).unwrap())
        .collect()
}

#[tokio::test]
async fn a_recall_with_a_shard_cut_during_the_call_is_finished_once_the_shard_is_back() {
    let (app, proxies) = behind_proxies().await;
    let recipients = users(8_100_000, 60);
    let id = send(&app, recipients.clone()).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    cache_badges(&app, &recipients).await;
    let (cut, index) = shard_to_cut(&app, id, &recipients);
    let (on_cut, elsewhere) = split(&app, &recipients, cut);
    proxies.shards[index].down().await;

    // The call answers: the recall is recorded and goes on by itself.
    let answer = recall(&app, id).await;
    assert_eq!(answer.status, v1::MessageStatus::Recalled as i32);
    assert_eq!(pending(&answer), [v1::ControlOperation::Recall]);
    assert!(answer.progress.is_none(), "progress needs every shard: left out, not made up");
    // Everywhere else it is gone at once, badges included.
    assert_gone(&app, id, &elsewhere).await;

    proxies.shards[index].up().await;
    let done = app.wait_for_operations(id).await;
    assert!(done.finished_at.is_some(), "the recall is finished");
    let progress = done.progress.unwrap();
    assert_eq!((progress.delivered, progress.recalled), (60, 60));
    assert_gone(&app, id, &on_cut).await;
    assert_gone(&app, id, &elsewhere).await;
    app.cleanup().await;
}

#[tokio::test]
async fn an_edit_with_a_shard_cut_during_the_call_reaches_that_shard_once_it_is_back() {
    let (app, proxies) = behind_proxies().await;
    let recipients = users(8_200_000, 60);
    let id = send(&app, recipients.clone()).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    // Pages cached with the old title.
    assert_titled(&app, id, &recipients, "hello").await;
    let (cut, index) = shard_to_cut(&app, id, &recipients);
    let (on_cut, elsewhere) = split(&app, &recipients, cut);
    proxies.shards[index].down().await;

    let answer = edit(&app, id, "fixed while a shard was down").await;
    assert_eq!(pending(&answer), [v1::ControlOperation::Edit]);
    assert_titled(&app, id, &elsewhere, "fixed while a shard was down").await;

    proxies.shards[index].up().await;
    app.wait_for_operations(id).await;
    assert_titled(&app, id, &on_cut, "fixed while a shard was down").await;
    assert_titled(&app, id, &elsewhere, "fixed while a shard was down").await;
    app.cleanup().await;
}

#[tokio::test]
async fn an_announcement_cancelled_with_a_shard_cut_leaves_every_inbox_once_it_is_back() {
    let (app, proxies) = behind_proxies().await;
    let id = announce(&app, "to every user").await;
    let readers = users(8_300_000, 40);
    // Materialized into every reader's inbox, badges cached.
    for user in &readers {
        assert_eq!(inbox_ids(&app, *user).await, [id]);
    }
    cache_badges(&app, &readers).await;
    let (cut, index) = shard_to_cut(&app, id, &readers);
    let (on_cut, elsewhere) = split(&app, &readers, cut);
    proxies.shards[index].down().await;

    let answer = cancel(&app, id).await;
    assert_eq!(answer.status, v1::MessageStatus::Cancelled as i32);
    assert_eq!(pending(&answer), [v1::ControlOperation::Cancel]);
    assert_gone(&app, id, &elsewhere).await;

    proxies.shards[index].up().await;
    app.wait_for_operations(id).await;
    assert_gone(&app, id, &on_cut).await;
    // A user who opens the inbox for the first time now never gets it.
    assert_gone(&app, id, &users(8_390_000, 10)).await;
    app.cleanup().await;
}

/// Makes every `UPDATE` of `message_contents` on one shard fail as a
/// deadlock victim, `times` times: what InnoDB answers a transaction it
/// rolled back. The budget lives in a MyISAM table, which the failed
/// statement's rollback does not undo.
async fn inject_deadlocks(app: &TestApp, shard: ShardId, times: u32) {
    let pool = app.ctx.pools.get(shard).unwrap();
    for statement in [
        "CREATE TABLE fault_budget (n INT NOT NULL) ENGINE=MyISAM".to_owned(),
        format!("INSERT INTO fault_budget VALUES ({times})"),
        "CREATE TRIGGER injected_deadlock BEFORE UPDATE ON message_contents FOR EACH ROW \
         BEGIN IF (SELECT n FROM fault_budget) > 0 THEN UPDATE fault_budget SET n = n - 1; \
         SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'Deadlock found (injected)', \
         MYSQL_ERRNO = 1213; END IF; END"
            .to_owned(),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement)).execute(pool).await.unwrap();
    }
}

/// The deadlocks left to inject on `shard`.
async fn deadlocks_left(app: &TestApp, shard: ShardId) -> i32 {
    let pool = app.ctx.pools.get(shard).unwrap();
    sqlx::query_scalar("SELECT n FROM fault_budget").fetch_one(pool).await.unwrap()
}

/// What the tests of the three operations work on: 60 recipients over
/// every shard, two completed sends to them (one to recall, one to edit)
/// and an announcement they all have, every badge cached.
struct Targets {
    recipients: Vec<u64>,
    recalled: u64,
    edited: u64,
    announced: u64,
}

async fn targets(first_user: u64) -> (TestApp, Targets) {
    let app = spawn_app_with(quick_retries(), true).await;
    let recipients = users(first_user, 60);
    let recalled = send(&app, recipients.clone()).await;
    let edited = send(&app, recipients.clone()).await;
    wait_for_status(&app, recalled, v1::MessageStatus::Completed).await;
    wait_for_status(&app, edited, v1::MessageStatus::Completed).await;
    let announced = announce(&app, "to every user").await;
    for user in &recipients {
        assert!(inbox_ids(&app, *user).await.contains(&announced));
    }
    cache_badges(&app, &recipients).await;
    (app, Targets { recipients, recalled, edited, announced })
}

/// More deadlocks than one drive runs its step (5 runs): the call's drive
/// gives up on the shard, a sweeper's drive finishes it.
const DEADLOCKS: u32 = 7;

#[tokio::test]
async fn recall_edit_and_announcement_cancel_finish_through_deadlocks_at_a_shards_step() {
    let (app, Targets { recipients, recalled, edited, announced }) = targets(8_400_000).await;
    let (shard, _) = shard_to_cut(&app, recalled, &recipients);

    for (step, operation) in ["recall", "edit", "cancel"].into_iter().enumerate() {
        inject_deadlocks(&app, shard, DEADLOCKS).await;
        let id = match operation {
            "recall" => recall(&app, recalled).await.message_id,
            "edit" => edit(&app, edited, "edited through deadlocks").await.message_id,
            _ => cancel(&app, announced).await.message_id,
        };
        app.wait_for_operations(id).await;
        assert_eq!(deadlocks_left(&app, shard).await, 0, "step {step}: every deadlock was met");
        let pool = app.ctx.pools.get(shard).unwrap();
        for statement in ["DROP TRIGGER injected_deadlock", "DROP TABLE fault_budget"] {
            sqlx::raw_sql(statement).execute(pool).await.unwrap();
        }
    }
    assert_gone(&app, recalled, &recipients).await;
    assert_gone(&app, announced, &recipients).await;
    assert_titled(&app, edited, &recipients, "edited through deadlocks").await;
    app.cleanup().await;
}

/// Records an operation as the api does at the start of a call, and
/// nothing after: the state an api killed right after its commit leaves
/// (its lease runs out after `lease_ms`).
async fn record_only(
    app: &TestApp,
    message_id: u64,
    change: ControlChange<'_>,
    kind: OperationKind,
) {
    let id = MessageId::from_raw(message_id);
    let home = app.ctx.pools.for_message(message_id);
    let retire = if kind == OperationKind::Cancel { Retire::Everyone } else { Retire::Recipients };
    let recorded =
        messages::change_with_operation(&home, id, change, kind, retire, 1, 300, None).await;
    assert!(recorded.unwrap().is_some(), "the {} is recorded", kind.name());
}

#[tokio::test]
async fn operations_an_api_died_after_recording_are_finished_by_a_sweeper() {
    let (app, Targets { recipients, recalled, edited, announced }) = targets(8_500_000).await;
    let from = SendStatus::RECALLABLE;
    let to_recalled = ControlChange::Status { from: &from, to: SendStatus::Recalled };
    record_only(&app, recalled, to_recalled, OperationKind::Recall).await;
    let new_content = Content {
        title: "edited by a sweeper".into(),
        body: "its body".into(),
        category: "system".into(),
        data: Default::default(),
        template: None,
    };
    record_only(&app, edited, ControlChange::Content(&new_content), OperationKind::Edit).await;
    let from = SendStatus::CANCELLABLE;
    let to_cancelled = ControlChange::Status { from: &from, to: SendStatus::Cancelled };
    record_only(&app, announced, to_cancelled, OperationKind::Cancel).await;

    for id in [recalled, edited, announced] {
        app.wait_for_operations(id).await;
    }
    assert!(app.get_message(recalled).await.finished_at.is_some(), "the recall finished");
    assert_gone(&app, recalled, &recipients).await;
    assert_gone(&app, announced, &recipients).await;
    assert_titled(&app, edited, &recipients, "edited by a sweeper").await;
    app.cleanup().await;
}

/// The badges of `users` cached in Redis now, as stored (`epoch:unread:unseen`),
/// and the announcement epoch: a badge is served from the cache, with no
/// read of MySQL, while its entry is there under the current epoch.
async fn cached_badges(app: &TestApp, users: &[u64]) -> (Option<String>, Vec<Option<String>>) {
    use redis::AsyncCommands as _;
    let cache = &app.ctx.cache;
    let mut conn = cache.connection();
    let epoch: Option<String> = conn.get(cache.keys().epoch()).await.unwrap();
    let mut entries = Vec::with_capacity(users.len());
    for user in users {
        entries.push(conn.get(cache.keys().unread(*user)).await.unwrap());
    }
    (epoch, entries)
}

#[tokio::test]
async fn a_recall_and_an_edit_of_a_two_user_send_retire_no_other_users_badge() {
    let app = spawn_app_with(test_settings(), true).await;
    let others = users(8_600_000, 300);
    let pair = [8_700_001, 8_700_002];
    let wide = send(&app, others.clone()).await;
    let small = send(&app, pair.to_vec()).await;
    wait_for_status(&app, wide, v1::MessageStatus::Completed).await;
    wait_for_status(&app, small, v1::MessageStatus::Completed).await;
    cache_badges(&app, &others).await;
    cache_badges(&app, &pair).await;
    let (epoch, before) = cached_badges(&app, &others).await;
    assert!(before.iter().all(Option::is_some), "precondition: every badge is cached");
    assert!(cached_badges(&app, &pair).await.1.iter().all(Option::is_some));

    edit(&app, small, "a typo fixed").await;
    recall(&app, small).await;
    app.wait_for_operations(small).await;
    // Not one other user's cached badge was retired: same entries, same
    // epoch, so re-reading them all costs no read of MySQL...
    assert_eq!(cached_badges(&app, &others).await, (epoch, before));
    // ...and the two recipients' were, and are right again.
    assert_eq!(cached_badges(&app, &pair).await.1, [None, None]);
    assert_gone(&app, small, &pair).await;
    app.cleanup().await;
}

/// A scheduled send (nothing of it ever delivered) cancelled: its chunks
/// are cancelled a page per transaction behind the answer, every recipient
/// counted cancelled once, and nothing is delivered after.
#[tokio::test]
async fn a_scheduled_send_cancelled_has_every_chunk_cancelled_page_by_page() {
    let mut settings = test_settings();
    settings.send.chunk_size = 10;
    settings.control.cancel_page_chunks = 3;
    let mut app = spawn_app_with(settings, true).await;
    app.stop_worker().await;
    let at = chrono::Utc::now() + chrono::Duration::hours(1);
    let mut request = notify_testkit::send_request(users(8_800_000, 2_000));
    request.send_at = Some(prost_types::Timestamp { seconds: at.timestamp(), nanos: 0 });
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    let answer = cancel(&app, id).await;
    assert_eq!(answer.status, v1::MessageStatus::Cancelled as i32);
    let done = app.wait_for_operations(id).await.progress.unwrap();
    let counted = (done.total, done.cancelled, done.pending, done.pending_chunks);
    assert_eq!(counted, (2_000, 2_000, 0, 0));
    app.start_worker().await;
    assert_eq!(app.count_items(id).await, 0, "nothing of a cancelled send is delivered");
    app.cleanup().await;
}

/// Ten callers sending small sends, ten users marking everything read and
/// reading their inboxes, an announcement sent and cancelled among them,
/// three times over: every call succeeds (a deadlock is run again, not
/// passed on), and once all is done every badge equals MySQL and nobody
/// lists or counts the cancelled announcement.
#[tokio::test]
async fn a_burst_of_sends_mark_reads_and_an_announcement_cancel_fails_no_call() {
    let app = spawn_app_with(test_settings(), true).await;
    let readers = users(8_900_001, 10);
    let mut sent = Vec::new();
    let mut cancelled = Vec::new();
    for round in 0..3u64 {
        let announcement = announce(&app, "to every user").await;
        let senders = (0..10u64).map(|sender| {
            let mut client = app.messages();
            let readers = readers.clone();
            async move {
                let mut ids = Vec::new();
                for i in 0..4u64 {
                    let to: Vec<u64> =
                        readers.iter().copied().filter(|u| (u + sender + i) % 3 != 0).collect();
                    let mut request = notify_testkit::send_request(to);
                    request.idempotency_key = format!("burst-{round}-{sender}-{i}");
                    let reply = client.send_message(request).await.expect("a send in the burst");
                    ids.push(reply.into_inner().message_id);
                }
                ids
            }
        });
        let markers = readers.iter().map(|user_id| {
            let mut inbox = app.inbox();
            async move {
                for _ in 0..4 {
                    let request =
                        v1::MarkAllReadRequest { user_id: *user_id, ..Default::default() };
                    inbox.mark_all_read(request).await.expect("a mark-all-read in the burst");
                    let page = v1::ListInboxRequest {
                        user_id: *user_id,
                        page_size: 20,
                        ..Default::default()
                    };
                    inbox.list_inbox(page).await.expect("a list in the burst");
                }
            }
        });
        let cancelling = async {
            cancel(&app, announcement).await;
        };
        let (ids, (), ()) = futures::join!(
            futures::future::join_all(senders),
            async {
                futures::future::join_all(markers).await;
            },
            cancelling
        );
        sent.extend(ids.into_iter().flatten());
        cancelled.push(announcement);
    }
    for id in &sent {
        wait_for_status(&app, *id, v1::MessageStatus::Completed).await;
    }
    for id in &cancelled {
        app.wait_for_operations(*id).await;
        assert_gone(&app, *id, &readers).await;
    }
    for user in &readers {
        assert_eq!(served(&app, *user).await, truth(&app, *user).await, "user {user}");
    }
    app.cleanup().await;
}
