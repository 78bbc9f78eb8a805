//! Faults through per-test proxies (`notify_testkit::faults`): a shard down
//! in the middle of a send, RabbitMQ connections reset during delivery, Redis
//! down in the middle of a send, a shard down under other users' inbox reads.
//! Each send's test ends by checking MySQL: exactly one item per recipient,
//! and badges equal to MySQL.

use std::time::Duration;

use notify_domain::Settings;
use notify_proto::v1;
use notify_testkit::faults::{Proxies, route_through_proxies};
use notify_testkit::{TestApp, eventually, spawn_app_with, test_settings};
use shard_router::ShardId;

use crate::helpers::{badge, send, wait_for_status};

/// An app whose shards, Redis and RabbitMQ are reached through proxies, and
/// settings that reach the same databases directly (for checks while a
/// proxy is down).
async fn spawn_behind_proxies() -> (TestApp, Proxies, Settings) {
    spawn_behind_proxies_with(test_settings()).await
}

async fn spawn_behind_proxies_with(mut settings: Settings) -> (TestApp, Proxies, Settings) {
    let direct = settings.clone();
    let proxies = route_through_proxies(&mut settings).await;
    (spawn_app_with(settings, true).await, proxies, direct)
}

/// Items of `message_id` on one shard, read directly.
async fn items_on(direct: &notify_store::db::ShardPools, shard: ShardId, message_id: u64) -> u64 {
    let pool = direct.get(shard).expect("shard");
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM message_items WHERE message_id = ?")
        .bind(message_id)
        .fetch_one(pool)
        .await
        .expect("count");
    n as u64
}

/// Waits (60 s at most) until every shard but `except` holds all of its
/// recipients' items of `message_id`, read directly.
async fn all_items_but_on(
    direct: &notify_store::db::ShardPools,
    parts: &[(ShardId, Vec<u64>)],
    except: ShardId,
    message_id: u64,
    what: &str,
) {
    eventually(what, Duration::from_secs(60), || async {
        for (shard, ids) in parts.iter().filter(|(shard, _)| *shard != except) {
            if items_on(direct, *shard, message_id).await != ids.len() as u64 {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Every recipient has exactly one item.
async fn assert_exactly_once(app: &TestApp, message_id: u64, users: &[u64]) {
    let got = app.item_users(message_id).await;
    assert_eq!(got.len(), users.len(), "items of {} recipients", users.len());
    assert_eq!(got, users, "each recipient exactly once");
}

#[tokio::test]
async fn a_shard_down_mid_send_holds_back_only_its_own_chunks() {
    let (app, proxies, direct) = spawn_behind_proxies().await;
    let direct_pools = notify_store::db::connect(&direct).await.unwrap();
    let users: Vec<u64> = (1..=20_000).collect();
    let map = app.settings.shard_map().unwrap();
    // The recipients are stored with every shard up; the shard answers
    // 400 ms late from the start on and goes down right after it, so none
    // of its chunks (several round trips each) can be applied before the
    // outage, however fast delivery is (a start needs every shard up). Not
    // later than that: a start that needs a new connection to the shard
    // makes its handshake (about five round trips) within the 5 s connect
    // timeout; at 1 s a round trip it sometimes did not.
    let id = crate::helpers::create_draft(&app, "a shard down mid send").await;
    let batch = v1::AppendRecipientsRequest {
        message_id: id,
        batch_number: 1,
        user_ids: users.clone(),
        ..Default::default()
    };
    app.messages().append_recipients(batch).await.unwrap();
    // Take down a shard that is not the send's home (whose status every
    // chunk reads): its own chunks wait, the others' must not.
    let home = map.home_shard_for_message(id);
    let down = map.partition_users(&users).into_iter().find(|(shard, _)| *shard != home).unwrap();
    let index = app.settings.database.shards.iter().position(|s| s.id == down.0).unwrap();
    proxies.shards[index].latency(400).await;
    app.messages().start_message(v1::StartMessageRequest { message_id: id }).await.unwrap();
    proxies.shards[index].down().await;
    let went_down = tokio::time::Instant::now();

    // Every other shard gets all its items while this one is down.
    let parts = map.partition_users(&users);
    let pools = &direct_pools;
    all_items_but_on(pools, &parts, down.0, id, "the other shards' items while one is down").await;
    assert!(items_on(pools, down.0, id).await < down.1.len() as u64, "the down shard got items");
    // Badges of users on other shards keep answering.
    let elsewhere = map.partition_users(&users).into_iter().find(|(s, _)| *s != down.0).unwrap();
    assert_eq!(badge(&app, elsewhere.1[0]).await, 1);

    let remaining = Duration::from_secs(5).saturating_sub(went_down.elapsed());
    tokio::time::sleep(remaining).await; // the outage lasts at least 5 s
    proxies.shards[index].heal().await;
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let progress = done.progress.unwrap();
    assert_eq!((progress.delivered, progress.failed), (20_000, 0));
    assert_exactly_once(&app, id, &users).await;
    for user in [down.1[0], elsewhere.1[0]] {
        assert_eq!(badge(&app, user).await, app.unread_truth(user).await);
    }
    app.cleanup().await;
}

/// One shard answering 200 ms late on every round trip: the other shards'
/// chunks (their own queues, their own consumer slots) finish while it has
/// done at most half of its own; it then finishes, slow as it is, exactly
/// once.
#[tokio::test]
async fn a_slow_shard_does_not_hold_back_the_other_shards() {
    let (app, proxies, direct) = spawn_behind_proxies().await;
    let direct_pools = notify_store::db::connect(&direct).await.unwrap();
    let users: Vec<u64> = (1..=20_000).collect();
    let map = app.settings.shard_map().unwrap();
    let parts = map.partition_users(&users);
    // Draft first, so the latency is there before the first chunk runs;
    // the slow shard is not the send's home (every chunk reads its status).
    let id = crate::helpers::create_draft(&app, "slow shard").await;
    let home = map.home_shard_for_message(id);
    let slow = parts.iter().find(|(shard, _)| *shard != home).unwrap().clone();
    let index = app.settings.database.shards.iter().position(|s| s.id == slow.0).unwrap();
    proxies.shards[index].latency(200).await;
    crate::helpers::append_and_start(&app, id, users.clone()).await;

    let pools = &direct_pools;
    all_items_but_on(pools, &parts, slow.0, id, "the other shards' items beside a slow one").await;
    let slow_done = items_on(pools, slow.0, id).await;
    assert!(
        slow_done * 2 <= slow.1.len() as u64,
        "the other shards waited for the slow one: it had {slow_done} of {} items",
        slow.1.len()
    );
    // It finishes while still slow.
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_eq!(done.progress.unwrap().delivered, 20_000);
    assert_exactly_once(&app, id, &users).await;
    app.cleanup().await;
}

/// One shard black-holed (it accepts connections and never answers) in the
/// middle of a send: the other shards finish, calls that need it fail within
/// their deadlines instead of hanging, nothing is marked failed, and once the
/// path is restored the send completes exactly once. Restoring resets the
/// proxied connections: noxious drops the bytes a black hole swallowed (TCP
/// would retransmit them), so those connections are dead either way.
#[tokio::test]
async fn a_black_holed_shard_hangs_nothing_fails_nothing_and_heals() {
    let mut settings = test_settings();
    settings.worker.operation_timeout_secs = 3;
    settings.api.max_deadline_secs = 3;
    let (app, proxies, direct) = spawn_behind_proxies_with(settings).await;
    let direct_pools = notify_store::db::connect(&direct).await.unwrap();
    let users: Vec<u64> = (1..=20_000).collect();
    let map = app.settings.shard_map().unwrap();
    let parts = map.partition_users(&users);
    let id = crate::helpers::create_draft(&app, "black hole").await;
    let home = map.home_shard_for_message(id);
    // Not the home shard, nor the first (which holds the id leases).
    let first = app.settings.database.shards[0].id;
    let hole = parts.iter().find(|(shard, _)| *shard != home && *shard != first).unwrap().clone();
    let index = app.settings.database.shards.iter().position(|s| s.id == hole.0).unwrap();
    crate::helpers::append_and_start(&app, id, users.clone()).await;
    proxies.shards[index].black_hole().await;

    let pools = &direct_pools;
    all_items_but_on(pools, &parts, hole.0, id, "the other shards' items beside a black hole")
        .await;
    // A badge that needs the black-holed shard fails within its deadline;
    // one elsewhere answers.
    let mut inbox = app.inbox();
    let stuck = tokio::time::timeout(
        Duration::from_secs(15),
        inbox.get_unread_count(v1::GetUnreadCountRequest { user_id: hole.1[0] }),
    )
    .await
    .expect("a badge call hung on the black-holed shard");
    assert!(stuck.is_err(), "a badge was answered from a black-holed shard");
    let user = parts.iter().find(|(shard, _)| *shard != hole.0).unwrap().1[0];
    assert_eq!(badge(&app, user).await, 1);

    proxies.shards[index].heal().await;
    proxies.shards[index].reset_connections().await;
    // Calls touching the restored shard may fail once on a reset connection.
    let done = eventually("the send completes after the heal", Duration::from_secs(90), || async {
        let message = app
            .messages()
            .get_message(v1::GetMessageRequest { message_id: id })
            .await
            .ok()?
            .into_inner();
        (message.status == v1::MessageStatus::Completed as i32).then_some(message)
    })
    .await;
    let progress = done.progress.unwrap();
    assert_eq!((progress.delivered, progress.failed), (20_000, 0), "{progress:?}");
    assert_exactly_once(&app, id, &users).await;
    app.cleanup().await;
}

#[tokio::test]
async fn rabbitmq_connections_reset_during_delivery_lose_and_double_nothing() {
    let (app, proxies, _) = spawn_behind_proxies().await;
    let users: Vec<u64> = (1..=20_000).collect();
    let id = send(&app, users.clone()).await;
    for _ in 0..3 {
        eventually("some progress before a reset", Duration::from_secs(60), || async {
            let message = app.get_message(id).await;
            let delivered = message.progress.map(|p| p.delivered).unwrap_or(0);
            (delivered > 0 || message.status == v1::MessageStatus::Completed as i32).then_some(())
        })
        .await;
        proxies.rabbitmq.reset_connections().await;
    }
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_exactly_once(&app, id, &users).await;
    // A send after the resets is delivered too: the consumers came back.
    let after = send(&app, vec![7]).await;
    wait_for_status(&app, after, v1::MessageStatus::Completed).await;
    assert_eq!(app.count_items(after).await, 1);
    app.cleanup().await;
}

/// Redis goes away in the middle of a send, with badges cached before:
/// delivery goes on, badges are counted in MySQL meanwhile, mark-reads are
/// refused with nothing written (the cache could not be told), and once
/// Redis is back no badge cached before the outage is served: chunks applied
/// while it was away stay unsettled, holding back completion, until a
/// worker's settler has invalidated their recipients.
/// RabbitMQ connections reset again and again while `StartMessage` publishes
/// 200 chunk tasks: the start either succeeds, or fails and is retried, and
/// either way every chunk is applied exactly once in the end.
#[tokio::test]
async fn rabbitmq_connections_reset_during_the_starts_publishes_lose_and_double_nothing() {
    let mut settings = test_settings();
    settings.send.chunk_size = 100;
    let (app, proxies, _) = spawn_behind_proxies_with(settings).await;
    let users: Vec<u64> = (1..=20_000).collect();
    let id = crate::helpers::create_draft(&app, "resets during start").await;
    let batch = v1::AppendRecipientsRequest {
        message_id: id,
        batch_number: 1,
        user_ids: users.clone(),
        ..Default::default()
    };
    app.messages().append_recipients(batch).await.unwrap();
    let mut client = app.messages();
    let mut starting = tokio::spawn(async move {
        client.start_message(v1::StartMessageRequest { message_id: id }).await
    });
    // Reset at once, then every 5 ms until the start returns.
    let started = loop {
        proxies.rabbitmq.reset_connections().await;
        tokio::select! {
            started = &mut starting => break started.unwrap(),
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    };
    if let Err(status) = started {
        // A failed start left the send as it was, or started it and left
        // the publishes to the sweeper: retrying is safe either way. The
        // resets have stopped, but a retry may still meet a connection
        // that died in the last one and answer Unavailable: a caller
        // retries that, as this one does.
        eventually("a retried start is taken", Duration::from_secs(30), || async {
            let retried =
                app.messages().start_message(v1::StartMessageRequest { message_id: id }).await;
            match retried {
                Ok(_) => Some(()),
                Err(again) if again.code() == tonic::Code::Unavailable => None,
                Err(again) => {
                    assert_eq!(
                        again.code(),
                        tonic::Code::FailedPrecondition,
                        "{status:?} then {again:?}"
                    );
                    Some(())
                }
            }
        })
        .await;
    }
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_eq!(done.progress.unwrap().delivered, 20_000);
    assert_exactly_once(&app, id, &users).await;
    app.cleanup().await;
}

#[tokio::test]
async fn redis_down_mid_send_delivery_goes_on_and_no_stale_badge_is_served_after() {
    let (app, proxies, direct) = spawn_behind_proxies().await;
    let direct_pools = notify_store::db::connect(&direct).await.unwrap();
    let first = send(&app, vec![1, 2, 3, 2_500, 5_000]).await;
    wait_for_status(&app, first, v1::MessageStatus::Completed).await;
    for user in [1, 2, 3, 2_500, 5_000] {
        assert_eq!(badge(&app, user).await, 1); // cached now
    }
    let users: Vec<u64> = (1..=5_000).collect();
    // Stored before the outage and started during it, so that no chunk can
    // be applied and settled before Redis goes away, however fast delivery is.
    let id = crate::helpers::create_draft(&app, "redis down mid send").await;
    let batch = v1::AppendRecipientsRequest {
        message_id: id,
        batch_number: 1,
        user_ids: users.clone(),
        ..Default::default()
    };
    app.messages().append_recipients(batch).await.unwrap();
    proxies.redis.down().await;
    // The api's near cache serves its copies until it notices the outage
    // (at once on a closed connection, within redis.near_cache_max_lag_ms on
    // a silent one): then it has dropped them all.
    eventually("the near cache lets go of Redis", Duration::from_secs(10), || async {
        (app.ctx.cache.near_cache_held() == (0, 0)).then_some(())
    })
    .await;
    app.messages().start_message(v1::StartMessageRequest { message_id: id }).await.unwrap();
    // Badges answer from MySQL while Redis is away. Delivery goes on
    // meanwhile and only adds unread items, so MySQL's count just before and
    // just after the call bound the answer.
    for user in [1, 2, 4_999] {
        let before = app.unread_truth(user).await;
        let answered = badge(&app, user).await;
        let after = app.unread_truth(user).await;
        assert!(
            (before..=after).contains(&answered),
            "user {user}: {answered} not in {before}..={after}"
        );
    }
    // A mark-read goes through: Redis is a cache.
    app.inbox()
        .mark_read(v1::MarkReadRequest { user_id: 3, message_ids: vec![first] })
        .await
        .expect("a mark-read while Redis is away");
    // Delivery goes on: chunks are applied while Redis is still away, and
    // left unsettled.
    let pools = &direct_pools;
    eventually("chunks applied during the outage", Duration::from_secs(60), || async {
        (unsettled_chunks(pools, id).await > 0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // an outage of some length
    proxies.redis.up().await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_eq!(unsettled_chunks(pools, id).await, 0, "completed with unsettled chunks");
    assert_exactly_once(&app, id, &users).await;
    // No badge cached before the outage is served stale after it.
    for user in [1, 2, 3, 2_500, 5_000] {
        assert_eq!(badge(&app, user).await, app.unread_truth(user).await, "user {user}");
    }
    // Mark-reads go on, and their badges follow.
    app.inbox()
        .mark_read(v1::MarkReadRequest { user_id: 3, message_ids: vec![first, id] })
        .await
        .unwrap();
    assert_eq!(badge(&app, 3).await, 0);
    app.cleanup().await;
}

/// An announcement started while Redis is away: its api cannot retire the
/// cached badges (bump the epoch they are counted under), so its event
/// waits for a worker's relay, which retires them once Redis answers. No
/// badge cached before the outage goes on without the announcement (until
/// its ttl, inbox.counter_ttl_secs).
#[tokio::test]
async fn an_announcement_started_while_redis_is_away_retires_every_cached_badge_after() {
    let mut settings = test_settings();
    settings.events.outbox_retry_ms = 300;
    let (app, proxies, direct) = spawn_behind_proxies_with(settings).await;
    let redis = notify_cache::Cache::connect(&direct.redis).await.unwrap();
    let epoch = || {
        let (mut conn, key) = (redis.connection(), redis.keys().epoch());
        async move { redis::AsyncCommands::get::<_, Option<u64>>(&mut conn, key).await.unwrap() }
    };
    let users = [11, 2_600, 5_100];
    let first = send(&app, users.to_vec()).await;
    wait_for_status(&app, first, v1::MessageStatus::Completed).await;
    for user in users {
        assert_eq!(badge(&app, user).await, 1); // cached now
    }
    let before = epoch().await;
    proxies.redis.down().await;
    eventually("the near cache lets go of Redis", Duration::from_secs(10), || async {
        (app.ctx.cache.near_cache_held() == (0, 0)).then_some(())
    })
    .await;
    let announcement = v1::SendMessageRequest {
        sender: "tests".into(),
        content: Some(crate::helpers::content("for all, during the outage")),
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        ..Default::default()
    };
    app.messages().send_message(announcement).await.expect("an announcement while Redis is away");
    assert_eq!(epoch().await, before, "the api reached Redis through the proxy");
    // Recorded events left on every shard (as by an api that died): the
    // relay publishes them while the announcement waits for Redis.
    let direct_pools = notify_store::db::connect(&direct).await.unwrap();
    for (_, pool) in direct_pools.iter() {
        let mut conn = pool.acquire().await.unwrap();
        let body = br#"{"t":"badges","u":[11]}"#;
        notify_store::db::event_outbox::record(&mut conn, body).await.unwrap();
    }
    let pools = &direct_pools;
    let waiting = || async move {
        let (mut others, mut announced) = (0, 0);
        for (_, pool) in pools.iter() {
            let (all, starts): (i64, i64) = sqlx::query_as(
                r#"SELECT COUNT(*), CAST(COALESCE(SUM(body LIKE '{"t":"announced"%'), 0) AS SIGNED)
                   FROM event_outbox"#,
            )
            .fetch_one(pool)
            .await
            .unwrap();
            (others, announced) = (others + all - starts, announced + starts);
        }
        (others, announced)
    };
    eventually("the other recorded events relayed", Duration::from_secs(20), || async {
        (waiting().await.0 == 0).then_some(())
    })
    .await;
    assert_eq!(waiting().await, (0, 1), "the announcement's event waits for Redis");
    assert_eq!(epoch().await, before);
    proxies.redis.up().await;
    eventually("the relay retires the cached badges", Duration::from_secs(20), || async {
        (epoch().await != before).then_some(())
    })
    .await;
    eventually("the announcement's event relayed", Duration::from_secs(20), || async {
        (waiting().await == (0, 0)).then_some(())
    })
    .await;
    for user in users {
        assert_eq!(badge(&app, user).await, 2, "user {user}");
    }
    app.cleanup().await;
}

/// Users recorded for a repair of their cached state, over every shard.
async fn badge_repairs(direct: &notify_store::db::ShardPools) -> u64 {
    let mut waiting = 0;
    for (_, pool) in direct.iter() {
        waiting += notify_store::db::badge_repairs::count(pool).await.unwrap();
    }
    waiting
}

/// 1,000 inbox writes (mark-reads by ids, reads and archives over a
/// filter, seen, a preference change, acks) while Redis is away all
/// succeed, and once it is back every badge served equals MySQL, though
/// Redis kept every badge cached before the outage.
#[tokio::test]
async fn inbox_writes_during_a_redis_outage_succeed_and_every_badge_is_exact_after() {
    let (app, proxies, direct) = spawn_behind_proxies().await;
    let direct_pools = notify_store::db::connect(&direct).await.unwrap();
    let users: Vec<u64> = (6_200_001..=6_200_050).collect();
    let mut sends = Vec::new();
    for _ in 0..10 {
        sends.push(send(&app, users.clone()).await);
    }
    for id in &sends {
        wait_for_status(&app, *id, v1::MessageStatus::Completed).await;
    }
    for user in &users {
        assert_eq!(badge(&app, *user).await, 10); // cached now
    }
    proxies.redis.down().await;
    eventually("the near cache lets go of Redis", Duration::from_secs(10), || async {
        (app.ctx.cache.near_cache_held() == (0, 0)).then_some(())
    })
    .await;

    let mut inbox = app.inbox();
    let mut writes = 0;
    for round in 0..20 {
        for (index, user) in users.iter().enumerate() {
            let user_id = *user;
            let ids = vec![sends[(round + index) % sends.len()]];
            let update = |action: v1::ItemAction, message_ids: Vec<u64>, all| {
                v1::UpdateItemsRequest { user_id, action: action as i32, message_ids, all }
            };
            let done = match (round + index) % 5 {
                0 => inbox
                    .mark_read(v1::MarkReadRequest { user_id, message_ids: ids })
                    .await
                    .map(drop),
                1 => inbox
                    .update_items(update(v1::ItemAction::MarkUnread, ids, None))
                    .await
                    .map(drop),
                2 => inbox.update_items(update(v1::ItemAction::Archive, ids, None)).await.map(drop),
                3 => {
                    let every = Some(v1::ItemFilter {
                        view: v1::InboxView::All as i32,
                        ..Default::default()
                    });
                    inbox
                        .update_items(update(v1::ItemAction::Unarchive, Vec::new(), every))
                        .await
                        .map(drop)
                }
                _ => {
                    let unread = Some(v1::ItemFilter { unread_only: true, ..Default::default() });
                    inbox
                        .update_items(update(v1::ItemAction::MarkRead, Vec::new(), unread))
                        .await
                        .map(drop)
                }
            };
            done.unwrap_or_else(|status| panic!("write {writes} while Redis is away: {status:?}"));
            writes += 1;
        }
    }
    assert_eq!(writes, 1_000);
    assert!(badge_repairs(&direct_pools).await > 0, "the writes recorded their users");

    proxies.redis.up().await;
    let pools = &direct_pools;
    eventually("every user's cached state retired", Duration::from_secs(30), || async {
        (badge_repairs(pools).await == 0).then_some(())
    })
    .await;
    for user in &users {
        assert_eq!(badge(&app, *user).await, app.unread_truth(*user).await, "user {user}");
    }
    app.cleanup().await;
}

/// Chunks of `message_id` applied but not settled, over every shard.
async fn unsettled_chunks(direct: &notify_store::db::ShardPools, message_id: u64) -> i64 {
    let mut total = 0;
    for (_, pool) in direct.iter() {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM message_chunks WHERE message_id = ? AND state = 4",
        )
        .bind(message_id)
        .fetch_one(pool)
        .await
        .expect("count");
        total += n;
    }
    total
}

#[tokio::test]
async fn a_task_with_no_queue_comes_back_and_is_published_again_after_redeclaring() {
    use notify_domain::domain::Lane;
    let mut app = spawn_app_with(test_settings(), false).await;
    // The high lane's queues disappear under the running api (an operator's
    // mistake, a broker that lost its definitions).
    let conn = notify_core::queue::connect(&app.settings.rabbitmq, "test-delete").await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    let topology = notify_core::queue::Topology::new(&app.settings);
    for shard in topology.shards() {
        let options = lapin::options::QueueDeleteOptions::default();
        channel.queue_delete(topology.queue(Lane::High, *shard).into(), options).await.unwrap();
    }
    let _ = channel.close(200, "done".into()).await;
    let _ = conn.close(200, "done".into()).await;

    let before = returned(&app).await;
    let id = send(&app, vec![1, 2, 3]).await;
    // Mandatory publishing saw the task come back, and the publisher's new
    // channel declared the queue again before publishing it once more.
    assert!(returned(&app).await > before, "the unroutable task was confirmed and dropped");
    app.start_worker().await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_exactly_once(&app, id, &[1, 2, 3]).await;
    app.cleanup().await;
}

async fn returned(app: &TestApp) -> f64 {
    let page = notify_testkit::http_get(app.metrics_addr, "/metrics").await.1;
    notify_testkit::metric_sum(&page, "notify_tasks_returned_total")
}

/// An api process whose RabbitMQ is reached through `broker` (a proxy address).
struct ApiProcess(notify_testkit::child::ApiChild);

impl ApiProcess {
    async fn start(app: &TestApp, broker: std::net::SocketAddr) -> Self {
        let config = app.write_config_file();
        let binary = notify_testkit::bin(env!("CARGO_BIN_EXE_notify-api"));
        Self(
            notify_testkit::child::ApiChild::start(&binary, |command| {
                command
                    .env("NOTIFY_CONFIG", &config)
                    .env("NOTIFY_RABBITMQ__URL", format!("amqp://guest:guest@{broker}/%2f"));
            })
            .await,
        )
    }

    fn messages(
        &self,
    ) -> v1::message_service_client::MessageServiceClient<tonic::transport::Channel> {
        v1::message_service_client::MessageServiceClient::new(self.0.channel.clone())
    }

    /// SIGKILL: no drain, no cleanup.
    async fn kill(self) {
        self.0.kill().await;
    }
}

/// The api killed between two `AppendRecipients` batches, and a second api
/// killed after `StartMessage` committed and before its publishes got through
/// (RabbitMQ black-holed, so the publishes hang): the client appends the
/// rest on a new api, and the sweeper publishes what the dead api could not.
/// Every recipient gets the item exactly once.
#[tokio::test]
async fn the_api_killed_between_batches_and_after_the_starts_commit_loses_and_doubles_nothing() {
    let mut app = spawn_app_with(test_settings(), false).await;
    let broker = notify_testkit::faults::FaultProxy::start("rabbitmq", "127.0.0.1:5672").await;
    let first = ApiProcess::start(&app, broker.addr()).await;
    let id = first
        .messages()
        .create_message(v1::CreateMessageRequest {
            sender: "tests".into(),
            content: Some(notify_testkit::content("killed api")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .message_id;
    let batch = |number: u64, users: std::ops::RangeInclusive<u64>| v1::AppendRecipientsRequest {
        message_id: id,
        batch_number: number,
        user_ids: users.collect(),
        ..Default::default()
    };
    first.messages().append_recipients(batch(1, 1..=5_000)).await.unwrap();
    first.kill().await;

    // The client does not know whether batch 1 landed: it appends it again.
    let second = ApiProcess::start(&app, broker.addr()).await;
    let again = second.messages().append_recipients(batch(1, 1..=5_000)).await.unwrap();
    assert!(again.into_inner().duplicate_batch);
    second.messages().append_recipients(batch(2, 4_001..=9_000)).await.unwrap();

    broker.black_hole().await;
    let mut client = second.messages();
    let starting = tokio::spawn(async move {
        client.start_message(v1::StartMessageRequest { message_id: id }).await
    });
    let home = app.ctx.pools.for_message(id).value();
    eventually("the start committed", Duration::from_secs(30), || async {
        let status: u8 = sqlx::query_scalar("SELECT status FROM messages WHERE message_id = ?")
            .bind(id)
            .fetch_one(home)
            .await
            .unwrap();
        (status == notify_domain::domain::SendStatus::Sending as u8).then_some(())
    })
    .await;
    second.kill().await;
    assert!(starting.await.unwrap().is_err(), "the start returned although its api was killed");
    assert_eq!(app.count_items(id).await, 0);

    broker.heal().await;
    app.start_worker().await;
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let progress = done.progress.unwrap();
    assert_eq!((progress.total, progress.delivered, progress.failed), (9_000, 9_000, 0));
    assert_exactly_once(&app, id, &(1..=9_000).collect::<Vec<u64>>()).await;
    app.cleanup().await;
}

/// The directory shard (the first, which holds the shard map) black-holed:
/// the map follower's look into it is abandoned at shutdown instead of
/// holding the process until TCP gives up (many minutes).
#[tokio::test]
async fn a_black_holed_directory_shard_does_not_hold_the_map_follower_at_shutdown() {
    let mut settings = test_settings();
    settings.database.shard_map_refresh_ms = 50;
    let (app, proxies, _) = spawn_behind_proxies_with(settings).await;
    proxies.shards[0].black_hole().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let replica = notify_store::shard_map::Replica::new("test");
    let follower = tokio::spawn(notify_store::shard_map::follow(
        app.ctx.pools.clone(),
        app.ctx.settings.database.clone(),
        replica,
        stop.clone(),
    ));
    // This runtime has one thread: the follower runs until its first look
    // waits on the black hole.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), follower)
        .await
        .expect("the follower stopped within 5 s of shutdown")
        .unwrap();
    proxies.shards[0].heal().await;
    proxies.shards[0].reset_connections().await;
    app.cleanup().await;
}

/// The directory shard down: a replica that cannot report its map version
/// for longer than `database.replica_lease_secs` may be routing by a map a
/// move has since left behind (a mover counts it gone after twice that), so
/// its writes wait, and fail UNAVAILABLE after `database.freeze_wait_ms`
/// (the log names the lease), while reads go on; once it reports again, a
/// write that was waiting goes on.
#[tokio::test]
async fn a_replica_cut_off_from_the_directory_writes_nothing_once_its_lease_lapses() {
    let mut settings = test_settings();
    settings.database.shard_map_refresh_ms = 100;
    settings.database.replica_lease_secs = 1;
    settings.database.freeze_wait_ms = 3_000;
    let (app, proxies, _) = spawn_behind_proxies_with(settings).await;
    let user = (1..).find(|u| app.ctx.pools.for_user(*u).shard() != ShardId(0)).unwrap();
    let sent = send(&app, vec![user]).await;
    wait_for_status(&app, sent, v1::MessageStatus::Completed).await;
    assert!(!app.ctx.pools.lease_lapsed(), "the lease lapsed while the directory answered");

    proxies.shards[0].down().await;
    eventually("the write lease lapses", Duration::from_secs(10), || async {
        app.ctx.pools.lease_lapsed().then_some(())
    })
    .await;
    // Reads go on (the user's shard answers); a write waits, then is refused.
    assert_eq!(badge(&app, user).await, 1);
    let mark_all = v1::MarkAllReadRequest { user_id: user, ..Default::default() };
    let refused = app.inbox().mark_all_read(mark_all.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(app.unread_truth(user).await, 1, "a refused write changed MySQL");

    // A write waiting when the directory comes back goes on.
    let mut inbox = app.inbox();
    let mut waiting = tokio::spawn(async move { inbox.mark_all_read(mark_all).await });
    let early = tokio::time::timeout(Duration::from_millis(300), &mut waiting).await;
    assert!(early.is_err(), "a write went ahead on a lapsed lease");
    proxies.shards[0].up().await;
    let marked = waiting.await.unwrap().expect("the waiting write went on once reported");
    assert_eq!(marked.into_inner().marked, 1);
    assert!(!app.ctx.pools.lease_lapsed());
    assert_eq!(app.unread_truth(user).await, 0);
    assert_eq!(badge(&app, user).await, 0);
    app.cleanup().await;
}

/// With an announcement live, a user's cached inbox page needs no database
/// at all: it is served while the user's shard is black-holed. (A read that
/// checked the announcement was materialized, as every read did before the
/// page cache, would wait on the shard past its deadline, as an uncached
/// page does.)
#[tokio::test]
async fn a_cached_inbox_page_is_served_while_the_users_shard_is_black_holed() {
    let mut settings = test_settings();
    settings.api.max_deadline_secs = 3;
    let (app, proxies, _) = spawn_behind_proxies_with(settings).await;
    let map = app.settings.shard_map().unwrap();
    // Not on the first shard, which holds the id leases.
    let first = app.settings.database.shards[0].id;
    let user = (1..).find(|user| map.shard_for_user(*user) != first).unwrap();
    let sent = send(&app, vec![user]).await;
    wait_for_status(&app, sent, v1::MessageStatus::Completed).await;
    let mut request = crate::helpers::send_request(Vec::new());
    request.audience = Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {}));
    let announced = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    let list = |page_size| {
        let mut inbox = app.inbox();
        async move {
            let request = v1::ListInboxRequest { user_id: user, page_size, ..Default::default() };
            let listed = tokio::time::timeout(Duration::from_secs(15), inbox.list_inbox(request));
            let listed = listed.await.expect("ListInbox hung on a black-holed shard");
            listed.map(|reply| reply.into_inner().items.iter().map(|i| i.message_id).collect())
        }
    };
    let ids: Vec<u64> = list(10).await.unwrap();
    assert_eq!(ids, [announced, sent]);

    let shard = map.shard_for_user(user);
    let index = app.settings.database.shards.iter().position(|s| s.id == shard).unwrap();
    proxies.shards[index].black_hole().await;
    let served: Result<Vec<u64>, _> = list(10).await;
    assert_eq!(served.expect("the cached page was not served"), [announced, sent]);
    let uncached: Result<Vec<u64>, _> = list(5).await;
    assert!(uncached.is_err(), "an uncached page was read from a black-holed shard");

    proxies.shards[index].heal().await;
    proxies.shards[index].reset_connections().await;
    app.cleanup().await;
}

/// A shard that cannot be read leaves its live announcements out of the
/// list: inbox reads go on without them, and a page read so is not cached
/// (it was built without an announcement of the current epoch). Once the
/// shard is back, the first read shows the announcement, with no new epoch
/// to retire a page had one been stored.
#[tokio::test]
async fn a_page_read_while_an_announcements_shard_is_down_is_not_cached() {
    let (app, proxies, _) = spawn_behind_proxies().await;
    let map = app.settings.shard_map().unwrap();
    let shards = &app.settings.database.shards;
    let cache = notify_cache::Cache::connect(&app.settings.redis).await.unwrap();
    let announce = || {
        let mut messages = app.messages();
        async move {
            let mut request = crate::helpers::send_request(Vec::new());
            request.audience =
                Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {}));
            messages.send_message(request).await.unwrap().into_inner().message_id
        }
    };
    // Homed off the first shard, which holds the id leases: announcements
    // homed there are cancelled and sent again (a quarter of them are).
    let first = shards[0].id;
    let mut announced = announce().await;
    for _ in 0..32 {
        if map.home_shard_for_message(announced) != first {
            break;
        }
        let cancel = v1::CancelMessageRequest { message_id: announced };
        app.messages().cancel_message(cancel).await.unwrap();
        announced = announce().await;
    }
    let home = map.home_shard_for_message(announced);
    assert_ne!(home, first, "32 announcements in a row homed on the first shard");
    let user = (1..).find(|user| map.shard_for_user(*user) != home).unwrap();
    let sent = send(&app, vec![user]).await;
    wait_for_status(&app, sent, v1::MessageStatus::Completed).await;
    let list = || {
        let mut inbox = app.inbox();
        async move {
            let request =
                v1::ListInboxRequest { user_id: user, page_size: 10, ..Default::default() };
            let reply = inbox.list_inbox(request).await.expect("ListInbox");
            reply.into_inner().items.iter().map(|i| i.message_id).collect::<Vec<u64>>()
        }
    };
    let pages_stored = || {
        let mut conn = cache.connection();
        let key = cache.keys().inbox_pages(user);
        async move { redis::AsyncCommands::exists::<_, bool>(&mut conn, key).await.unwrap() }
    };

    let index = shards.iter().position(|s| s.id == home).unwrap();
    proxies.shards[index].down().await;
    assert_eq!(list().await, [sent], "the read goes on without the down shard's announcement");
    assert!(!pages_stored().await, "a page without a live announcement was cached");

    // After the heal a probe finds the shard back (connections the outage
    // broke are found: pinged when idle, else read again on another one),
    // and the next read lists its announcement: a page stored before would
    // have hidden it.
    proxies.shards[index].heal().await;
    let complete = || async {
        let listed = list().await;
        (listed.len() == 2).then_some(listed)
    };
    let listed =
        eventually("the announcement once its shard is back", Duration::from_secs(10), complete)
            .await;
    assert_eq!(listed, [sent, announced]);
    assert!(pages_stored().await, "a complete read caches its page");
    app.cleanup().await;
}

/// Pooled connections that broke while idle (the shard restarted, a network
/// cut) fail no call: one idle for a second or more is pinged before it is
/// handed out, and a broken one is replaced. (Busy connections are not
/// pinged: the chunk path would pay a round trip per statement.)
#[tokio::test]
async fn pooled_connections_broken_while_idle_fail_no_call() {
    calls_after_every_shard_connection_broke(Duration::from_millis(1_500)).await;
}

/// Pooled connections used a moment before they broke (a shard restarted
/// right under the calls) fail no call either: the call that meets the
/// first broken one runs again, once, on a connection checked to answer,
/// since every one released before the loss is pinged before it is handed
/// out again.
#[tokio::test]
async fn pooled_connections_broken_right_after_use_fail_no_call() {
    calls_after_every_shard_connection_broke(Duration::ZERO).await;
}

/// 200 inbox reads on the pools' connections, every shard connection cut
/// `idle` after them, then 200 more reads: none fails.
async fn calls_after_every_shard_connection_broke(idle: Duration) {
    let mut settings = test_settings();
    // Inbox pages read from MySQL on the pool's own connections.
    settings.inbox.page_cache_ttl_secs = 0;
    settings.database.read_connections = 0;
    let (app, proxies, _) = spawn_behind_proxies_with(settings).await;
    let map = app.settings.shard_map().unwrap();
    let users: Vec<u64> = (1..=200).collect();
    let sent = send(&app, users.clone()).await;
    wait_for_status(&app, sent, v1::MessageStatus::Completed).await;
    let list = |user_id| {
        let mut inbox = app.inbox();
        async move {
            let request = v1::ListInboxRequest { user_id, page_size: 10, ..Default::default() };
            inbox.list_inbox(request).await.map(|reply| reply.into_inner().items.len())
        }
    };
    // Several connections of every shard in the pools.
    let reads = users.iter().map(|user| list(*user));
    for read in futures::future::join_all(reads).await {
        assert_eq!(read.expect("ListInbox before the cut"), 1);
    }
    // Idle that long (the condition under test, not a wait for an event),
    // then every shard connection is cut.
    tokio::time::sleep(idle).await;
    for proxy in &proxies.shards {
        proxy.reset_connections().await;
    }

    let reads = users.iter().map(|user| list(*user));
    let failed: Vec<String> = futures::future::join_all(reads)
        .await
        .into_iter()
        .zip(&users)
        .filter_map(|(read, user)| {
            let shard = map.shard_for_user(*user).0;
            read.err().map(|status| format!("user {user} (shard {shard}): {}", status.message()))
        })
        .collect();
    assert!(failed.is_empty(), "{} calls failed on broken connections: {failed:?}", failed.len());
    app.cleanup().await;
}

/// Group sends and a recall whose writes to the cached seq state fail
/// (Redis away right after their commits) are counted once Redis answers
/// again: the api raises the state again from MySQL, without waiting for
/// the key's TTL or the group's next send.
#[tokio::test]
async fn group_seqs_written_during_a_redis_outage_are_counted_once_it_is_back() {
    let mut settings = test_settings();
    settings.groups.seq_cache_ttl_secs = 3_600; // nothing here waits for it
    let (app, proxies, _) = spawn_behind_proxies_with(settings).await;
    let user = 6_100_001;
    let group = crate::groups::create_group(&app, "outage").await;
    crate::groups::add(&app, group, vec![user], false).await;
    let mut groups = app.groups();
    let (_, first_seq) = crate::groups::send(&mut groups, group, "before-1").await;
    crate::groups::send(&mut groups, group, "before-2").await;
    let group_unread = async || crate::groups::unread(&app, user).await.total;
    assert_eq!(group_unread().await, 2, "the seq state is cached now");

    proxies.redis.down().await;
    eventually("the near cache lets go of Redis", Duration::from_secs(10), || async {
        (app.ctx.cache.near_cache_held() == (0, 0)).then_some(())
    })
    .await;
    crate::groups::send(&mut groups, group, "during-1").await;
    crate::groups::send(&mut groups, group, "during-2").await;
    groups
        .recall_group_message(v1::RecallGroupMessageRequest { group_id: group, seq: first_seq })
        .await
        .unwrap();
    proxies.redis.up().await;

    // Four seqs, one recalled. Left stale, the key would say 2 until its
    // TTL; with only the sends' raises repaired, 4.
    eventually("the group's cached seq state repaired", Duration::from_secs(20), || async {
        (group_unread().await == 3).then_some(())
    })
    .await;
    let badge = crate::helpers::counts(&app, user).await;
    assert_eq!(badge.group_unread, 3, "the badge carries it too");
    app.cleanup().await;
}

/// With the home shard of a user's group down, the badge still answers the
/// inbox counts and says its group part is unknown, never a wrong 0; once
/// the shard is back, the group count is there again.
#[tokio::test]
async fn a_group_whose_home_shard_is_down_makes_the_group_unread_unknown_not_zero() {
    let (app, proxies, _) = spawn_behind_proxies().await;
    let map = app.settings.shard_map().unwrap();
    // A group whose home shard is not the user's: the inbox still answers.
    let user = (6_400_001..).find(|u| map.shard_for_user(*u) == map.shards()[0]).unwrap();
    let group = loop {
        let id = crate::groups::create_group(&app, "home down").await;
        if map.shard_for_user(id) != map.shards()[0] {
            break id;
        }
    };
    crate::groups::add(&app, group, vec![user], false).await;
    crate::groups::send(&mut app.groups(), group, "while-up").await;
    let sent = send(&app, vec![user]).await;
    wait_for_status(&app, sent, v1::MessageStatus::Completed).await;
    let counts = crate::helpers::counts(&app, user).await;
    assert_eq!((counts.unread, counts.group_unread, counts.group_unread_unknown), (1, 1, false));

    let home = map.shard_for_user(group); // a group id hashes as a user id
    let index = app.settings.database.shards.iter().position(|s| s.id == home).unwrap();
    proxies.shards[index].down().await;
    app.flush_cache().await; // what Redis held of the group must be read again
    let counts = crate::helpers::counts(&app, user).await;
    assert_eq!(counts.unread, 1, "the inbox badge answers");
    assert!(counts.group_unread_unknown, "the group part is unknown: {counts:?}");

    proxies.shards[index].up().await;
    let counts = crate::helpers::counts(&app, user).await;
    assert_eq!((counts.group_unread, counts.group_unread_unknown), (1, false));
    app.cleanup().await;
}

#[tokio::test]
async fn a_shard_down_holds_other_users_inbox_reads_up_once_and_its_announcements_come_back() {
    let (app, proxies, _) = spawn_behind_proxies().await;
    let map = app.settings.shard_map().unwrap();
    // An announcement homed on a shard that is not the first (which holds
    // the id leases): that shard goes down. Those homed on the first are
    // cancelled, so that the badges count only this one.
    let first = app.settings.database.shards[0].id;
    let mut announced = crate::helpers::announce(&app, "homed on the cut shard").await;
    while map.home_shard_for_message(announced) == first {
        let cancel = v1::CancelMessageRequest { message_id: announced };
        app.messages().cancel_message(cancel).await.unwrap();
        announced = crate::helpers::announce(&app, "homed on the cut shard").await;
    }
    let cut = map.home_shard_for_message(announced);
    let index = app.settings.database.shards.iter().position(|s| s.id == cut).unwrap();
    // Users of the other shards who have not read their inbox yet.
    let readers: Vec<u64> =
        (9_100_000..).filter(|user| map.shard_for_user(*user) != cut).take(20).collect();
    proxies.shards[index].down().await;
    // The list of live announcements cached before is retired: the next
    // read gathers it from every shard.
    app.ctx.cache.bump_announcement_epoch().await.unwrap();

    // The first read finds the shard down (at most its 2 s read timeout);
    // the reads after it leave the shard out at once, without its
    // announcement.
    let lists = |user: u64| crate::helpers::inbox_ids(&app, user);
    assert!(!lists(readers[0]).await.contains(&announced));
    for user in &readers[1..] {
        let started = std::time::Instant::now();
        assert!(!lists(*user).await.contains(&announced), "user {user}");
        assert_eq!(badge(&app, *user).await, 0, "user {user}");
        // Waiting for the shard, each of the two would take its 2 s.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "user {user}'s inbox and badge took {took:?}");
    }

    // Back: a probe finds it, and the next reads count its announcement
    // (no badge counted without it was cached) and list it.
    proxies.shards[index].up().await;
    for user in &readers {
        let counted = || async { (badge(&app, *user).await == 1).then_some(()) };
        eventually(
            "the cut shard's announcement is counted again",
            Duration::from_secs(30),
            counted,
        )
        .await;
    }
    for user in &readers {
        let back = || async { lists(*user).await.contains(&announced).then_some(()) };
        eventually("the cut shard's announcement is listed again", Duration::from_secs(30), back)
            .await;
        assert_eq!(badge(&app, *user).await, 1, "user {user}");
    }
    app.cleanup().await;
}
