//! Moving buckets between shards while the services run: a move under a
//! 200,000-recipient send with mark-reads and group pulls going on, a mover
//! killed mid-copy and resumed, a move whose writes fail midway driven on by
//! its mover, and an abort that leaves everything as it was.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use notify_domain::Settings;
use notify_proto::v1;
use notify_store::shard_map;
use notify_store::shard_move::{self, Ended, MoveRequest, TABLES};
use notify_testkit::{TestApp, content, eventually, send_request, spawn_app_with, test_settings};
use shard_router::{BucketSet, ShardId, bucket_of};
use sqlx::AssertSqlSafe;
use tokio::sync::watch;

use crate::helpers::{badge, create_draft, inbox_ids};

/// Shard 3 owns buckets 768..=1023 in the test map; these move to shard 1.
const FROM: u32 = 768;
const TO: u32 = 831;
const SOURCE: ShardId = ShardId(3);
const TARGET: ShardId = ShardId(1);

fn fast_settings() -> Settings {
    let mut settings = test_settings();
    settings.database.shard_map_refresh_ms = 100;
    settings
}

fn moving(user_id: u64) -> bool {
    (FROM..=TO).contains(&bucket_of(user_id))
}

/// Waits until the api and the worker both report `version` or newer.
async fn replicas_at(app: &TestApp, version: u64) {
    let directory = shard_map::directory(&app.ctx.pools).unwrap().clone();
    eventually("both replicas report the version", Duration::from_secs(10), || {
        let directory = directory.clone();
        async move {
            let replicas = shard_map::replicas(&directory).await.unwrap();
            (replicas.len() == 2 && replicas.iter().all(|r| r.version >= version)).then_some(())
        }
    })
    .await;
}

/// Rows of the moving buckets on `shard`, per moved table.
async fn rows_of_range(app: &TestApp, shard: ShardId) -> BTreeMap<&'static str, i64> {
    let digests = digest_of_range(app, shard).await;
    digests.into_iter().map(|(table, (rows, _))| (table, rows)).collect()
}

/// Per moved table, the moving buckets' rows on `shard` and a checksum of
/// every stored column of them (what a copy must carry exactly).
async fn digest_of_range(app: &TestApp, shard: ShardId) -> BTreeMap<&'static str, (i64, i64)> {
    let pool = app.ctx.pools.get(shard).unwrap();
    let mut digests = BTreeMap::new();
    for table in TABLES {
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(COLUMN_NAME AS CHAR) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND EXTRA NOT LIKE '%GENERATED%'",
        )
        .bind(table.name)
        .fetch_all(pool)
        .await
        .unwrap();
        let row: Vec<String> =
            columns.iter().map(|c| format!("IFNULL(HEX(`{c}`), 'null')")).collect();
        let sql = format!(
            "SELECT COUNT(*), CAST(COALESCE(SUM(CRC32(CONCAT_WS('|', {}))), 0) AS SIGNED) \
             FROM `{}` WHERE bucket BETWEEN ? AND ?",
            row.join(", "),
            table.name
        );
        let digest: (i64, i64) =
            sqlx::query_as(AssertSqlSafe(sql)).bind(FROM).bind(TO).fetch_one(pool).await.unwrap();
        digests.insert(table.name, digest);
    }
    digests
}

/// A group homed in a moving bucket, with `members`.
async fn create_group_with(app: &TestApp, members: Vec<u64>) -> u64 {
    let home = (1_000_000..).find(|g| moving(*g)).unwrap();
    let request = v1::CreateGroupRequest { group_id: home, name: "movers".into() };
    let group_id = app.groups().create_group(request).await.unwrap().into_inner().group_id;
    let request = v1::AddGroupMembersRequest { group_id, user_ids: members, with_history: false };
    app.groups().add_group_members(request).await.unwrap();
    group_id
}

async fn group_send(app: &TestApp, group_id: u64, key: &str) {
    let request = v1::SendGroupMessageRequest {
        group_id,
        sender: "tests".into(),
        idempotency_key: key.into(),
        content: Some(content(key)),
    };
    app.groups().send_group_message(request).await.unwrap();
}

async fn group_unread(app: &TestApp, user_id: u64, group_id: u64) -> u64 {
    let request = v1::GetGroupUnreadRequest { user_id };
    let groups = app.groups().get_group_unread(request).await.unwrap().into_inner().groups;
    groups.iter().find(|g| g.group_id == group_id).map_or(0, |g| g.unread)
}

fn request() -> MoveRequest {
    MoveRequest { from: FROM, to: TO, target: TARGET, batch: 32 }
}

#[tokio::test]
async fn a_move_under_a_running_send_with_mark_reads_and_group_pulls_moves_every_row_once() {
    let app = spawn_app_with(fast_settings(), true).await;
    replicas_at(&app, 1).await;
    let users: Vec<u64> = (1..=200_000).collect();
    let movers: Vec<u64> = users.iter().copied().filter(|u| moving(*u)).take(40).collect();
    assert!(movers.iter().all(|u| app.ctx.pools.for_user(*u).shard() == SOURCE));
    // Rows of every kind in the moving buckets before the move: items and
    // inbox state, a group (members, messages), a send's home record.
    let earlier = app.send(movers.clone()).await;
    app.wait_for_status(earlier, v1::MessageStatus::Completed).await;
    assert_eq!(badge(&app, movers[0]).await, 1);
    let group = create_group_with(&app, movers.clone()).await;
    group_send(&app, group, "before-the-move").await;

    // The big send: two batches of 100,000, started, then the move once
    // it is under way.
    let draft = create_draft(&app, "two hundred thousand").await;
    for (index, batch) in users.chunks(100_000).enumerate() {
        let request = v1::AppendRecipientsRequest {
            message_id: draft,
            batch_number: index as u64 + 1,
            user_ids: batch.to_vec(),
            ..Default::default()
        };
        app.messages().append_recipients(request).await.unwrap();
    }
    app.messages().start_message(v1::StartMessageRequest { message_id: draft }).await.unwrap();

    // Mark-reads and group pulls and acks of moving users go on throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let readers = {
        let (stop, movers, mut inbox, mut groups) =
            (stop.clone(), movers.clone(), app.inbox(), app.groups());
        tokio::spawn(async move {
            let mut rounds = 0u64;
            let mut acked = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                let user_id = movers[rounds as usize % movers.len()];
                let mark = v1::MarkAllReadRequest { user_id, ..Default::default() };
                inbox.mark_all_read(mark).await.expect("mark-read during the move");
                let pull = v1::PullGroupMessagesRequest {
                    user_id,
                    group_id: group,
                    after_seq: None,
                    limit: 10,
                };
                let pulled = groups.pull_group_messages(pull).await.expect("pull").into_inner();
                if let Some(last) = pulled.messages.last() {
                    let ack =
                        v1::AckGroupMessagesRequest { user_id, group_id: group, seq: last.seq };
                    groups.ack_group_messages(ack).await.expect("ack during the move");
                    acked.insert(user_id, last.seq);
                }
                rounds += 1;
            }
            (rounds, acked)
        })
    };
    eventually("the send is under way", Duration::from_secs(60), || async {
        let progress = app.get_message(draft).await.progress.unwrap_or_default();
        (progress.delivered > 0).then_some(())
    })
    .await;

    // The send is paused now, chunks for the moving buckets still pending
    // and planned for the source, and resumed once the first batch is
    // flipped: its chunks are then split onto the target, and the second
    // batch's are applied on the source and copied, or wait out its freeze.
    let pause = v1::PauseMessageRequest { message_id: draft };
    app.messages().pause_message(pause).await.expect("paused while sending");
    let started = shard_move::start(&app.ctx.pools, request()).await.unwrap();
    let mut resumed = None;
    let ended = shard_move::run(&app.settings, &app.ctx.pools, started.move_id, |progress| {
        if progress.state.flipped_to == (FROM + 31) as i32 && resumed.is_none() {
            let mut client = app.messages();
            resumed = Some(tokio::spawn(async move {
                client.resume_message(v1::ResumeMessageRequest { message_id: draft }).await
            }));
        }
    })
    .await;
    assert_eq!(ended.unwrap(), Ended::Done);
    let resumed = resumed.expect("resumed after the first flip");
    resumed.await.unwrap().expect("resumed during the move");
    group_send(&app, group, "after-the-move").await;
    let done = app.wait_for_status(draft, v1::MessageStatus::Completed).await;
    stop.store(true, Ordering::Relaxed);
    let (rounds, acked) = readers.await.unwrap();
    assert!(rounds > 0, "no mark-read ran");

    // Every recipient has exactly one item, on the shard that owns it now.
    let map = app.ctx.pools.map();
    assert!((FROM..=TO).all(|b| map.shard_of_bucket(b) == TARGET));
    let places = app.item_shards(draft).await;
    assert_eq!(places.len(), users.len(), "a recipient has no item");
    for (user, shards) in &places {
        assert_eq!(shards, &[map.shard_for_user(*user)], "user {user}");
    }
    let progress = done.progress.unwrap();
    assert_eq!((progress.total, progress.delivered, progress.pending), (200_000, 200_000, 0));
    // Nothing of the moved buckets is left on the source.
    assert!(rows_of_range(&app, SOURCE).await.values().all(|n| *n == 0));
    let split: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM message_chunks WHERE message_id = ? AND chunk_id >= 1 << 63",
    )
    .bind(draft)
    .fetch_one(app.ctx.pools.get(TARGET).unwrap())
    .await
    .unwrap();
    assert!(split > 0, "no chunk planned for the source was split onto the target");
    let moved = rows_of_range(&app, TARGET).await;
    for table in ["message_items", "group_members", "message_groups", "group_messages"] {
        assert!(moved[table] > 0, "no {table} rows moved");
    }
    // Badges and group unread counts agree with MySQL.
    for user in &movers {
        assert_eq!(badge(&app, *user).await, app.unread_truth(*user).await, "user {user}");
    }
    // The send's read count and readers agree with its items read: reads
    // counted before, during and after the flips (a filtered read's row
    // moves with its user), none twice.
    app.reads_counted().await;
    let mut read_items = 0;
    for (_, pool) in app.ctx.pools.iter() {
        let read: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM message_items WHERE message_id = ? AND is_read = 1",
        )
        .bind(draft)
        .fetch_one(pool)
        .await
        .unwrap();
        read_items += read as u64;
    }
    assert!(read_items > 0, "no item of the send was read during the move");
    assert_eq!(app.get_message(draft).await.progress.unwrap().read, read_items);
    assert_eq!(app.count_reads(draft).await, read_items);
    // Every ack made during the move is on the target.
    assert!(!acked.is_empty(), "no ack ran");
    for (user, seq) in &acked {
        let stored: u64 = sqlx::query_scalar(
            "SELECT last_ack_seq FROM group_members WHERE user_id = ? AND group_id = ?",
        )
        .bind(user)
        .bind(group)
        .fetch_one(app.ctx.pools.get(TARGET).unwrap())
        .await
        .unwrap();
        assert!(stored >= *seq, "user {user}'s ack of {seq} was lost (target has {stored})");
    }
    let member = movers[0];
    let pull = v1::PullGroupMessagesRequest {
        user_id: member,
        group_id: group,
        after_seq: Some(0),
        limit: 10,
    };
    let pulled = app.groups().pull_group_messages(pull).await.unwrap().into_inner();
    assert_eq!(pulled.messages.len(), 2, "both group messages are pulled after the move");
    let last_ack: u64 = sqlx::query_scalar(
        "SELECT last_ack_seq FROM group_members WHERE user_id = ? AND group_id = ?",
    )
    .bind(member)
    .bind(group)
    .fetch_one(app.ctx.pools.get(TARGET).unwrap())
    .await
    .unwrap();
    assert_eq!(group_unread(&app, member, group).await, 2 - last_ack);
    let state = shard_move::get(&app.ctx.pools, started.move_id).await.unwrap();
    assert_eq!(state.state, "done");
    assert!(state.rows_copied > 0 && state.longest_freeze_ms > 0, "{state:?}");
    app.cleanup().await;
}

#[tokio::test]
async fn a_mover_killed_mid_copy_is_resumed_and_a_move_aborted_leaves_everything_as_before() {
    let mut settings = fast_settings();
    settings.groups.max_members = 100;
    let app = spawn_app_with(settings, true).await;
    replicas_at(&app, 1).await;
    let users: Vec<u64> = (1..=20_000).filter(|u| moving(*u)).collect();
    // 60 members in the first buckets copied: their rows are on both shards
    // until the flip, and still count once against the limit of 100.
    let members: Vec<u64> =
        users.iter().copied().filter(|u| bucket_of(*u) < FROM + 8).take(60).collect();
    assert_eq!(members.len(), 60);
    let group = create_group_with(&app, members).await;
    let sent = app.send(users.clone()).await;
    app.wait_for_status(sent, v1::MessageStatus::Completed).await;
    assert!(rows_of_range(&app, SOURCE).await["message_items"] > 0);

    // Killed mid-copy: the task is dropped at its next await once a run
    // past FROM + 9 is copied (runs are eight buckets: FROM + 15).
    let started = shard_move::start(&app.ctx.pools, request()).await.unwrap();
    let (copied, mut seen) = watch::channel(-1);
    let mover = {
        let (settings, pools) = (app.settings.clone(), app.ctx.pools.clone());
        tokio::spawn(async move {
            shard_move::run(&settings, &pools, started.move_id, |progress| {
                copied.send_replace(progress.state.copied_to);
            })
            .await
        })
    };
    seen.wait_for(|bucket| *bucket >= FROM as i32 + 9).await.unwrap();
    mover.abort();
    assert!(mover.await.unwrap_err().is_cancelled());
    let state = shard_move::get(&app.ctx.pools, started.move_id).await.unwrap();
    assert_eq!(state.state, "running");
    assert!(state.flipped_to < FROM as i32, "killed before any flip");
    assert_eq!(app.ctx.pools.map().shard_of_bucket(FROM), SOURCE);
    let copies = rows_of_range(&app, TARGET).await;
    assert_eq!(copies["group_members"], 60, "the members were copied");
    let one_more =
        v1::AddGroupMembersRequest { group_id: group, user_ids: vec![7], with_history: false };
    let added = app.groups().add_group_members(one_more).await.expect("61 of 100 members");
    assert_eq!(added.into_inner().added, 1);
    // What the source has now (the add was audited on the group's home) is
    // what the target must end with.
    let before = digest_of_range(&app, SOURCE).await;

    // Resumed: done, every item once on the target, none on the source.
    let ended = shard_move::run(&app.settings, &app.ctx.pools, started.move_id, |_| {}).await;
    assert_eq!(ended.unwrap(), Ended::Done);
    replicas_at(
        &app,
        shard_map::latest(shard_map::directory(&app.ctx.pools).unwrap())
            .await
            .unwrap()
            .unwrap()
            .version,
    )
    .await;
    let places = app.item_shards(sent).await;
    assert_eq!(places.len(), users.len());
    assert!(places.values().all(|shards| shards == &[TARGET]));
    // Every column of every row, exactly (the rows travel as JSON).
    assert_eq!(digest_of_range(&app, TARGET).await, before, "the target has what the source had");
    assert!(rows_of_range(&app, SOURCE).await.values().all(|n| *n == 0));
    assert_eq!(badge(&app, users[0]).await, 1);

    // Abort, back the other way: paused mid-copy, then aborted. The map,
    // the source (now shard 1) and the other side are as before.
    let back = MoveRequest { target: SOURCE, ..request() };
    let again = shard_move::start(&app.ctx.pools, back).await.unwrap();
    let version = app.ctx.pools.version();
    let pools = app.ctx.pools.clone();
    let ended = shard_move::run(&app.settings, &app.ctx.pools, again.move_id, |progress| {
        if progress.state.copied_to >= FROM as i32 + 4 {
            let pools = pools.clone();
            let id = progress.state.move_id;
            tokio::spawn(async move { shard_move::pause(&pools, id).await });
        }
    })
    .await;
    // The pause is asynchronous: the run ends paused, or done if it raced
    // past every step (it cannot: 64 buckets, paused after the fifth).
    assert_eq!(ended.unwrap(), Ended::Paused);
    assert!(rows_of_range(&app, SOURCE).await["message_items"] > 0, "the copy had begun");
    let aborted = shard_move::abort(&app.settings, &app.ctx.pools, again.move_id).await.unwrap();
    assert_eq!(aborted, Ended::Aborted);
    assert!(rows_of_range(&app, SOURCE).await.values().all(|n| *n == 0), "copies removed");
    assert_eq!(digest_of_range(&app, TARGET).await, before);
    let stored =
        shard_map::latest(shard_map::directory(&app.ctx.pools).unwrap()).await.unwrap().unwrap();
    assert_eq!(stored.version, version, "no map version was written");
    assert_eq!(stored.frozen, BucketSet::EMPTY);
    assert!(shard_move::active(&app.ctx.pools).await.unwrap().is_none());
    assert_eq!(shard_move::get(&app.ctx.pools, again.move_id).await.unwrap().state, "aborted");
    assert_eq!(badge(&app, users[0]).await, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn a_mover_runs_only_while_it_holds_the_lease() {
    let app = spawn_app_with(fast_settings(), false).await;
    let users: Vec<u64> = (1..=2_000).filter(|u| moving(*u)).collect();
    let group = create_group_with(&app, users[..10].to_vec()).await;
    group_send(&app, group, "leased").await;
    let directory = shard_map::directory(&app.ctx.pools).unwrap().clone();
    let started = shard_move::start(&app.ctx.pools, request()).await.unwrap();
    let id = started.move_id;
    // Hands the move to another mover, last seen `age` seconds ago.
    let hand_to = move |mover: &'static str, age: u32| {
        let directory = directory.clone();
        async move {
            sqlx::query(
                "UPDATE shard_moves SET mover = ?, \
                 heartbeat_at = UTC_TIMESTAMP(3) - INTERVAL ? SECOND WHERE move_id = ?",
            )
            .bind(mover)
            .bind(age)
            .bind(id)
            .execute(&directory)
            .await
            .unwrap();
        }
    };

    // Another mover seen a second ago runs it: refused.
    hand_to("elsewhere:1", 1).await;
    let refused = shard_move::run(&app.settings, &app.ctx.pools, id, |_| {}).await.unwrap_err();
    assert!(refused.to_string().contains("is run by elsewhere:1"), "{refused}");

    // Silent for two minutes: taken over. Taken back mid-copy, this run
    // stops at its next step, before any freeze or flip.
    hand_to("elsewhere:1", 120).await;
    let mut stolen = None;
    let lost = shard_move::run(&app.settings, &app.ctx.pools, id, |_| {
        if stolen.is_none() {
            stolen = Some(tokio::spawn(hand_to("elsewhere:2", 0)));
        }
    })
    .await
    .unwrap_err();
    stolen.expect("a copy step reported").await.unwrap();
    assert!(lost.to_string().contains("lost its lease to elsewhere:2"), "{lost}");
    let state = shard_move::get(&app.ctx.pools, id).await.unwrap();
    assert_eq!(state.mover, "elsewhere:2");
    assert!(state.flipped_to < FROM as i32, "{state:?}");
    let stored =
        shard_map::latest(shard_map::directory(&app.ctx.pools).unwrap()).await.unwrap().unwrap();
    assert_eq!((stored.version, stored.frozen), (1, BucketSet::EMPTY), "nothing frozen or flipped");

    // That one dies too; the next run takes over and finishes.
    hand_to("elsewhere:2", 120).await;
    let ended = shard_move::run(&app.settings, &app.ctx.pools, id, |_| {}).await.unwrap();
    assert_eq!(ended, Ended::Done);
    assert!((FROM..=TO).all(|b| app.ctx.pools.map().shard_of_bucket(b) == TARGET));
    assert_eq!(rows_of_range(&app, TARGET).await["group_members"], 10);
    app.cleanup().await;
}

#[tokio::test]
async fn a_move_whose_writes_fail_midway_is_driven_on_to_the_end() {
    let app = spawn_app_with(fast_settings(), true).await;
    replicas_at(&app, 1).await;
    let users: Vec<u64> = (1..=5_000).filter(|u| moving(*u)).collect();
    let sent = app.send(users.clone()).await;
    app.wait_for_status(sent, v1::MessageStatus::Completed).await;
    let before = digest_of_range(&app, SOURCE).await;

    // The moving buckets' items on the target locked: the move's first
    // write of items there waits for the lock.
    let target = app.ctx.pools.get(TARGET).unwrap();
    let database: String = sqlx::query_scalar("SELECT DATABASE()").fetch_one(target).await.unwrap();
    let mut holder = target.begin().await.unwrap();
    sqlx::query("SELECT COUNT(*) FROM message_items WHERE bucket BETWEEN ? AND ? FOR UPDATE")
        .bind(FROM)
        .bind(TO)
        .execute(&mut *holder)
        .await
        .unwrap();
    let started = shard_move::start(&app.ctx.pools, request()).await.unwrap();
    let mover = {
        let (settings, pools) = (app.settings.clone(), app.ctx.pools.clone());
        tokio::spawn(
            async move { shard_move::run(&settings, &pools, started.move_id, |_| {}).await },
        )
    };

    // Its connection killed while it waits, twice: the write is run again
    // at once on another connection, then the move is driven again from
    // its journal. The third time the lock is let go.
    let mut killed: Vec<i64> = Vec::new();
    for round in 0..3 {
        let waiting =
            eventually("the move's write of items waits", Duration::from_secs(30), || {
                let (database, killed) = (database.clone(), killed.clone());
                async move {
                    let ids: Vec<i64> = sqlx::query_scalar(
                        "SELECT ID FROM information_schema.PROCESSLIST \
                     WHERE DB = ? AND INFO LIKE 'INSERT INTO `message_items`%'",
                    )
                    .bind(database)
                    .fetch_all(target)
                    .await
                    .unwrap();
                    ids.into_iter().find(|id| !killed.contains(id))
                }
            })
            .await;
        if round == 2 {
            break;
        }
        sqlx::query(AssertSqlSafe(format!("KILL CONNECTION {waiting}")))
            .execute(target)
            .await
            .unwrap();
        killed.push(waiting);
    }
    holder.commit().await.unwrap();

    let ended = mover.await.unwrap();
    assert_eq!(ended.unwrap(), Ended::Done);
    assert!((FROM..=TO).all(|b| app.ctx.pools.map().shard_of_bucket(b) == TARGET));
    let places = app.item_shards(sent).await;
    assert_eq!(places.len(), users.len());
    assert!(places.values().all(|shards| shards == &[TARGET]), "every item once, on the target");
    assert_eq!(digest_of_range(&app, TARGET).await, before, "the target has what the source had");
    assert!(rows_of_range(&app, SOURCE).await.values().all(|n| *n == 0));
    assert_eq!(badge(&app, users[0]).await, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn a_copy_keeps_a_revocation_the_target_has() {
    let app = spawn_app_with(fast_settings(), true).await;
    replicas_at(&app, 1).await;
    let user = (1..).find(|u| moving(*u)).unwrap();
    let sent = app.send(vec![user]).await;
    app.wait_for_status(sent, v1::MessageStatus::Completed).await;
    // A revocation that reached the target while a copy of the source's
    // older row was on its way there.
    sqlx::query(
        "INSERT INTO message_contents (message_id, title, body, data, created_at, revoked, \
         revoked_at) VALUES (?, 'stale', '', '', UTC_TIMESTAMP(3), 1, UTC_TIMESTAMP(3))",
    )
    .bind(sent)
    .execute(app.ctx.pools.get(TARGET).unwrap())
    .await
    .unwrap();

    let started = shard_move::start(&app.ctx.pools, request()).await.unwrap();
    let ended = shard_move::run(&app.settings, &app.ctx.pools, started.move_id, |_| {}).await;
    assert_eq!(ended.unwrap(), Ended::Done);
    let (title, revoked, revoked_at): (String, bool, Option<chrono::NaiveDateTime>) =
        sqlx::query_as(
            "SELECT title, revoked <> 0, revoked_at FROM message_contents WHERE message_id = ?",
        )
        .bind(sent)
        .fetch_one(app.ctx.pools.get(TARGET).unwrap())
        .await
        .unwrap();
    assert_eq!(title, "hello", "the copy brought the source's row");
    assert!(revoked && revoked_at.is_some(), "the revocation stays");
    app.cleanup().await;
}

/// The bucket stored with a send's idempotency key, and the shards holding it.
async fn key_place(app: &TestApp, message_id: u64) -> (u32, Vec<ShardId>) {
    let (mut bucket, mut shards) = (u32::MAX, Vec::new());
    for (shard, pool) in app.ctx.pools.iter() {
        let found: Option<u16> =
            sqlx::query_scalar("SELECT bucket FROM idempotency_keys WHERE message_id = ?")
                .bind(message_id)
                .fetch_optional(pool)
                .await
                .unwrap();
        if let Some(found) = found {
            bucket = u32::from(found);
            shards.push(shard);
        }
    }
    (bucket, shards)
}

fn announcement(title: &str) -> v1::SendMessageRequest {
    v1::SendMessageRequest {
        sender: "platform".into(),
        content: Some(content(title)),
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        ..Default::default()
    }
}

#[tokio::test]
async fn idempotency_keys_and_announcements_move_with_their_buckets() {
    let app = spawn_app_with(fast_settings(), true).await;
    replicas_at(&app, 1).await;
    let mut moving_users = (1..).filter(|u| moving(*u));
    let (reader, newcomer) = (moving_users.next().unwrap(), moving_users.next().unwrap());
    let outsider = (1..).find(|u| !moving(*u)).unwrap();
    // A send whose idempotency key is in a moving bucket (its recipient
    // is not: only the key moves).
    let mut attempt = 0;
    let (retry, sent) = loop {
        attempt += 1;
        let mut request = send_request(vec![outsider]);
        request.idempotency_key = format!("moving-key-{attempt}");
        let sent =
            app.messages().send_message(request.clone()).await.unwrap().into_inner().message_id;
        if (FROM..=TO).contains(&key_place(&app, sent).await.0) {
            break (request, sent);
        }
    };
    app.wait_for_status(sent, v1::MessageStatus::Completed).await;
    // A live announcement, read by one moving user before the move (its
    // item and watermark are on the source) and not by the other.
    let announced = app.messages().send_message(announcement("before")).await.unwrap();
    let announced = announced.into_inner().message_id;
    assert!(inbox_ids(&app, reader).await.contains(&announced));

    let started = shard_move::start(&app.ctx.pools, request()).await.unwrap();
    let ended = shard_move::run(&app.settings, &app.ctx.pools, started.move_id, |_| {}).await;
    assert_eq!(ended.unwrap(), Ended::Done);
    replicas_at(&app, app.ctx.pools.version()).await;

    // The key moved: on the target alone, and a retry still finds its send.
    assert_eq!(key_place(&app, sent).await.1, [TARGET]);
    let again = app.messages().send_message(retry).await.unwrap().into_inner();
    assert_eq!((again.message_id, again.deduplicated), (sent, true));
    // Each sees the announcement once, with what came after the move.
    let after = app.messages().send_message(announcement("after")).await.unwrap();
    let after = after.into_inner().message_id;
    for user in [reader, newcomer] {
        let ids = inbox_ids(&app, user).await;
        assert_eq!(ids.iter().filter(|id| **id == announced).count(), 1, "user {user}: {ids:?}");
        assert!(ids.contains(&after), "user {user}: {ids:?}");
        assert_eq!(badge(&app, user).await, app.unread_truth(user).await, "user {user}");
    }
    let items: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM message_items WHERE user_id = ?")
        .bind(reader)
        .fetch_one(app.ctx.pools.get(TARGET).unwrap())
        .await
        .unwrap();
    assert_eq!(items, 2, "both announcements, on the target");
    app.cleanup().await;
}

#[tokio::test]
async fn sql_bucket_expression_matches_bucket_of() {
    let app = spawn_app_with(test_settings(), false).await;
    let pool = app.ctx.pools.get(ShardId(0)).unwrap();
    let mut ids: Vec<u64> = (0..5_000).map(shard_router::stable_hash).collect();
    ids.extend([1, 2, 42, 1_000_000, u64::MAX, u64::MAX - 1, 1 << 63]);
    ids.sort_unstable();
    ids.dedup();
    // Tables written per recipient store the bucket, from a DEFAULT (an
    // indexed virtual column is evaluated again on every update and delete);
    // all of them with one expression.
    let columns: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT CAST(TABLE_NAME AS CHAR), CAST(EXTRA AS CHAR), CAST(COLUMN_DEFAULT AS CHAR) \
         FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME = 'bucket'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let stored = [
        "message_items",
        "message_reads",
        "announcement_recipients",
        "user_inbox_state",
        "group_members",
    ];
    let defaults: Vec<&Option<String>> = stored
        .iter()
        .map(|table| {
            let (_, extra, default) = columns.iter().find(|(name, ..)| name == table).unwrap();
            assert!(!extra.contains("GENERATED"), "{table}.bucket is {extra}");
            default
        })
        .collect();
    assert!(defaults[0].as_deref().is_some_and(|d| d.contains("18397679294719823053")));
    assert!(defaults.iter().all(|d| *d == defaults[0]), "{defaults:?}");
    let json = format!("[{}]", ids.iter().map(u64::to_string).collect::<Vec<_>>().join(","));
    for insert in [
        "INSERT IGNORE INTO user_inbox_state (user_id) \
         SELECT id FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j",
        "INSERT IGNORE INTO message_items (user_id, message_id) \
         SELECT id, 1 FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j",
    ] {
        sqlx::query(insert).bind(&json).execute(pool).await.unwrap();
    }
    for table in ["user_inbox_state", "message_items"] {
        let rows: Vec<(u64, u16)> =
            sqlx::query_as(AssertSqlSafe(format!("SELECT user_id, bucket FROM {table}")))
                .fetch_all(pool)
                .await
                .unwrap();
        assert_eq!(rows.len(), ids.len(), "{table}");
        for (id, bucket) in rows {
            assert_eq!(u32::from(bucket), bucket_of(id), "bucket of {id} in {table}");
        }
    }
    app.cleanup().await;
}
