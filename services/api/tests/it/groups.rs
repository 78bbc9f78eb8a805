//! Group messages: gapless seqs under concurrent senders on two replicas,
//! offline pulls in pages with acks, unread counts, membership and bad input.

use std::collections::{BTreeMap, HashSet};

use futures::StreamExt;
use notify_proto::v1;
use notify_proto::v1::group_service_client::GroupServiceClient;
use notify_store::db::groups as store;
use notify_testkit::{TestApp, content, spawn_app_with, test_settings};
use tonic::Code;
use tonic::transport::Channel;

async fn spawn() -> TestApp {
    spawn_app_with(test_settings(), false).await
}

pub(crate) async fn create_group(app: &TestApp, name: &str) -> u64 {
    let request = v1::CreateGroupRequest { group_id: 0, name: name.into() };
    app.groups().create_group(request).await.unwrap().into_inner().group_id
}

pub(crate) async fn add(
    app: &TestApp,
    group_id: u64,
    user_ids: Vec<u64>,
    with_history: bool,
) -> u64 {
    let request = v1::AddGroupMembersRequest { group_id, user_ids, with_history };
    app.groups().add_group_members(request).await.unwrap().into_inner().added
}

pub(crate) fn send_request(group_id: u64, title: &str, key: &str) -> v1::SendGroupMessageRequest {
    v1::SendGroupMessageRequest {
        group_id,
        sender: "tests".into(),
        idempotency_key: key.into(),
        content: Some(content(title)),
    }
}

pub(crate) async fn send(
    client: &mut GroupServiceClient<Channel>,
    group_id: u64,
    key: &str,
) -> (u64, u64) {
    let sent =
        client.send_group_message(send_request(group_id, key, key)).await.unwrap().into_inner();
    (sent.message_id, sent.seq)
}

fn pull_request(
    user_id: u64,
    group_id: u64,
    after: Option<u64>,
    limit: u32,
) -> v1::PullGroupMessagesRequest {
    v1::PullGroupMessagesRequest { user_id, group_id, after_seq: after, limit }
}

pub(crate) async fn pull(
    app: &TestApp,
    user_id: u64,
    group_id: u64,
    after: Option<u64>,
    limit: u32,
) -> v1::PullGroupMessagesResponse {
    app.groups()
        .pull_group_messages(pull_request(user_id, group_id, after, limit))
        .await
        .unwrap()
        .into_inner()
}

pub(crate) async fn ack(
    app: &TestApp,
    user_id: u64,
    group_id: u64,
    seq: u64,
) -> Result<u64, tonic::Status> {
    let request = v1::AckGroupMessagesRequest { user_id, group_id, seq };
    app.groups().ack_group_messages(request).await.map(|r| r.into_inner().last_ack_seq)
}

pub(crate) async fn unread(app: &TestApp, user_id: u64) -> v1::GetGroupUnreadResponse {
    let request = v1::GetGroupUnreadRequest { user_id };
    app.groups().get_group_unread(request).await.unwrap().into_inner()
}

/// `group -> (max_seq, last_ack_seq)` for a user, read from MySQL.
async fn truth(app: &TestApp, user_id: u64) -> BTreeMap<u64, (u64, u64)> {
    let pools = &app.ctx.pools;
    let memberships = store::memberships(pools.for_user(user_id).value(), user_id).await.unwrap();
    let mut truth = BTreeMap::new();
    for membership in memberships {
        let group_id = membership.group_id;
        let max_seq =
            store::max_seq(pools.for_group(group_id).value(), group_id).await.unwrap().unwrap();
        truth.insert(group_id, (max_seq, membership.last_ack_seq));
    }
    truth
}

#[tokio::test]
async fn concurrent_senders_on_two_replicas_get_a_gapless_seq() {
    let app = spawn().await;
    let replica = app.spawn_api_replica().await;
    let group = create_group(&app, "gapless").await;
    add(&app, group, vec![7], true).await;

    let channels = [app.channel(), replica.channel()];
    let senders = (0..8).map(|task| {
        let mut client = GroupServiceClient::new(channels[task % 2].clone());
        async move {
            let mut sent = Vec::new();
            for i in 0..40 {
                let key = format!("s{task}-{i}");
                let first = send(&mut client, group, &key).await;
                if i % 10 == 0 {
                    // A retried request: same key, same message and seq.
                    assert_eq!(send(&mut client, group, &key).await, first, "retry of {key}");
                }
                sent.push(first);
            }
            sent
        }
    });
    let sent: Vec<(u64, u64)> = futures::future::join_all(senders).await.concat();

    let mut seqs: Vec<u64> = sent.iter().map(|(_, seq)| *seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=320).collect::<Vec<_>>(), "seqs are 1..=320 without gaps or repeats");
    let ids: HashSet<u64> = sent.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), 320);

    let page = pull(&app, 7, group, None, 1000).await;
    assert!(!page.has_more);
    let pulled: Vec<(u64, u64)> = page.messages.iter().map(|m| (m.message_id, m.seq)).collect();
    let mut expected = sent.clone();
    expected.sort_unstable_by_key(|(_, seq)| *seq);
    assert_eq!(pulled, expected, "members see every message once, in seq order");
    assert_eq!(unread(&app, 7).await.total, 320);

    replica.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn offline_member_pulls_twenty_thousand_messages_in_pages() {
    let app = spawn().await;
    let group = create_group(&app, "offline").await;
    add(&app, group, vec![42], false).await;
    let client = app.groups();
    let sent: Vec<(u64, u64)> = futures::stream::iter(0..20_000)
        .map(|i| {
            let mut client = client.clone();
            async move { send(&mut client, group, &format!("m{i}")).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert_eq!(sent.iter().map(|(_, seq)| *seq).max(), Some(20_000));
    assert_eq!(unread(&app, 42).await.total, 20_000);

    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = pull(&app, 42, group, None, 200).await;
        if pages == 37 {
            // The client crashes before acking: the next pull from the
            // cursor returns the very same page (same ids, to dedup by).
            let again = pull(&app, 42, group, None, 200).await;
            assert_eq!(again, page, "an unacked page is delivered again unchanged");
        }
        pages += 1;
        let last = page.messages.last().expect("a page while unread remain").seq;
        seen.extend(page.messages.iter().map(|m| (m.message_id, m.seq)));
        assert_eq!(ack(&app, 42, group, last).await.unwrap(), last);
        if pages % 25 == 0 {
            assert_eq!(unread(&app, 42).await.total, 20_000 - last);
        }
        if !page.has_more {
            break;
        }
    }
    assert_eq!(pages, 100, "20,000 messages in pages of 200");
    let mut expected = sent;
    expected.sort_unstable_by_key(|(_, seq)| *seq);
    assert_eq!(seen, expected, "every message exactly once, in order");
    assert_eq!(unread(&app, 42).await.total, 0);
    assert!(pull(&app, 42, group, None, 200).await.messages.is_empty());
    app.cleanup().await;
}

#[tokio::test]
async fn unread_counts_match_max_seq_minus_ack_under_concurrent_sends_and_acks() {
    let app = spawn().await;
    let groups = [create_group(&app, "a").await, create_group(&app, "b").await];
    let users: Vec<u64> = (1..=24).collect();
    for group in groups {
        add(&app, group, users.clone(), false).await;
    }
    let channel = app.channel();
    let senders = groups.into_iter().flat_map(|group| {
        let channel = channel.clone();
        (0..3).map(move |task| {
            let mut client = GroupServiceClient::new(channel.clone());
            async move {
                for i in 0..60 {
                    send(&mut client, group, &format!("{task}-{i}")).await;
                }
            }
        })
    });
    let readers = users.iter().map(|user| {
        let app = &app;
        async move {
            for round in 0..8u64 {
                let group = groups[((user + round) % 2) as usize];
                let page = pull(app, *user, group, None, 1 + (user * 7 + round) as u32 % 40).await;
                if let Some(last) = page.messages.last() {
                    ack(app, *user, group, last.seq).await.unwrap();
                }
                unread(app, *user).await;
                if *user == 1 && round == 4 {
                    app.flush_cache().await;
                }
            }
        }
    });
    futures::future::join(futures::future::join_all(senders), futures::future::join_all(readers))
        .await;

    for user in users {
        let truth = truth(&app, user).await;
        let answer = unread(&app, user).await;
        let got: BTreeMap<u64, (u64, u64)> =
            answer.groups.iter().map(|g| (g.group_id, (g.max_seq, g.last_ack_seq))).collect();
        assert_eq!(got, truth, "user {user}: cached seqs and cursors equal mysql");
        let expected: u64 = truth.values().map(|(max, ack)| max - ack).sum();
        assert_eq!(answer.total, expected, "user {user}");
        for g in &answer.groups {
            assert_eq!(g.unread, g.max_seq - g.last_ack_seq);
        }
        let badge = crate::helpers::counts(&app, user).await;
        assert_eq!(badge.group_unread, expected, "GetUnreadCount carries the group total");
    }
    app.cleanup().await;
}

#[tokio::test]
async fn members_start_at_the_current_seq_and_removed_members_cannot_pull() {
    let app = spawn().await;
    let group = create_group(&app, "joiners").await;
    let mut client = app.groups();
    for i in 0..5 {
        send(&mut client, group, &format!("early-{i}")).await;
    }
    assert_eq!(add(&app, group, vec![1], false).await, 1);
    assert_eq!(add(&app, group, vec![2], true).await, 1);
    assert_eq!(add(&app, group, vec![1, 2], true).await, 0, "members keep their cursor");
    assert!(pull(&app, 1, group, None, 10).await.messages.is_empty(), "no history flood");
    assert!(pull(&app, 1, group, Some(0), 10).await.messages.is_empty(), "not even when asked");
    assert_eq!(pull(&app, 2, group, None, 10).await.messages.len(), 5, "history was asked for");
    assert_eq!(unread(&app, 1).await.total, 0);
    assert_eq!(unread(&app, 2).await.total, 5);

    let (id, seq) = send(&mut client, group, "late").await;
    let page = pull(&app, 1, group, None, 10).await;
    assert_eq!(page.messages.iter().map(|m| (m.message_id, m.seq)).collect::<Vec<_>>(), [(id, 6)]);
    assert_eq!(seq, 6);
    assert_eq!(unread(&app, 1).await.total, 1);

    let remove = v1::RemoveGroupMembersRequest { group_id: group, user_ids: vec![1, 99] };
    assert_eq!(client.remove_group_members(remove).await.unwrap().into_inner().removed, 1);
    let denied = client.pull_group_messages(pull_request(1, group, None, 10)).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert_eq!(ack(&app, 1, group, 6).await.unwrap_err().code(), Code::PermissionDenied);
    assert!(unread(&app, 1).await.groups.is_empty(), "a removed member has no group unread");

    assert_eq!(add(&app, group, vec![1], false).await, 1);
    assert_eq!(unread(&app, 1).await.total, 0, "back at the current seq");

    // Removed and added again with history: the cursor moves back, and the
    // cached cursor (just read above) must not hide it.
    let remove = v1::RemoveGroupMembersRequest { group_id: group, user_ids: vec![1] };
    client.remove_group_members(remove).await.unwrap();
    assert_eq!(add(&app, group, vec![1], true).await, 1);
    assert_eq!(unread(&app, 1).await.total, 6);
    assert_eq!(pull(&app, 1, group, None, 10).await.messages.len(), 6);
    app.cleanup().await;
}

#[tokio::test]
async fn acks_only_move_forward_and_never_past_the_max_seq() {
    let app = spawn().await;
    let group = create_group(&app, "acks").await;
    add(&app, group, vec![5], true).await;
    let mut client = app.groups();
    for i in 0..4 {
        send(&mut client, group, &format!("m{i}")).await;
    }
    assert_eq!(ack(&app, 5, group, 3).await.unwrap(), 3);
    assert_eq!(ack(&app, 5, group, 2).await.unwrap(), 3, "an older ack is a no-op");
    let beyond = ack(&app, 5, group, 5).await.unwrap_err();
    assert_eq!(beyond.code(), Code::InvalidArgument);
    assert!(beyond.message().starts_with("seq: is 5, beyond the group's max seq 4"), "{beyond:?}");
    assert_eq!(truth(&app, 5).await[&group], (4, 3), "the rejected ack changed nothing");
    assert_eq!(ack(&app, 5, group, 4).await.unwrap(), 4);
    assert_eq!(pull(&app, 5, group, None, 10).await.messages.len(), 0);

    // The ack invalidated the cursor cache; the next read caches it again,
    // also for a user without groups (whose badge must not hit MySQL).
    assert_eq!(app.ctx.cache.cached_user_state(5).await.unwrap().groups, None);
    assert_eq!(unread(&app, 5).await.total, 0);
    let mut inbox = app.inbox();
    let badge = inbox.get_unread_count(v1::GetUnreadCountRequest { user_id: 6 }).await.unwrap();
    assert_eq!(badge.into_inner().group_unread, 0);
    for (user, expected) in [(5, vec![(group, 4, Some(4))]), (6, vec![])] {
        let cached = app.ctx.cache.cached_user_state(user).await.unwrap().groups.unwrap();
        let cached: Vec<_> = cached
            .iter()
            .map(|g| (g.group_id, g.last_ack_seq, g.seq.as_ref().map(|s| s.max_seq)))
            .collect();
        assert_eq!(cached, expected, "user {user}'s cursors are cached");
    }
    app.cleanup().await;
}

#[tokio::test]
async fn bad_group_input_is_rejected_cleanly() {
    let mut settings = test_settings();
    settings.groups.max_members = 3;
    let app = spawn_app_with(settings, false).await;
    let group = create_group(&app, "strict").await;
    add(&app, group, vec![1], false).await;
    let mut client = app.groups();
    let unknown = group + 1;

    let status = client.send_group_message(send_request(unknown, "x", "")).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::NotFound, &*format!("group {unknown} not found"))
    );
    let status = client.pull_group_messages(pull_request(1, unknown, None, 10)).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let status = client
        .add_group_members(v1::AddGroupMembersRequest {
            group_id: unknown,
            user_ids: vec![2],
            with_history: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(truth(&app, 2).await.is_empty(), "nothing written for an unknown group");

    let status = client.pull_group_messages(pull_request(2, group, None, 10)).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(status.message(), format!("user 2 is not a member of group {group}"));

    let invalid = [
        (pull_request(1, group, None, 1001), "limit: is 1001, the maximum is 1000"),
        (pull_request(1, group, None, 0), "limit: must be at least 1"),
        (pull_request(0, group, None, 10), "user_id: "),
        (pull_request(1, 0, None, 10), "group_id: group id must not be 0"),
    ];
    for (request, message) in invalid {
        let status = client.pull_group_messages(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with(message), "{status:?} should start with {message}");
    }

    let zero =
        v1::AddGroupMembersRequest { group_id: group, user_ids: vec![2, 0], with_history: false };
    let status = client.add_group_members(zero).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "user_ids[1]: user id must not be 0")
    );
    let many = v1::AddGroupMembersRequest {
        group_id: group,
        user_ids: (1..=10_001).collect(),
        with_history: false,
    };
    let status = client.add_group_members(many).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("user_ids: has 10001 ids, the limit is 10000"));
    let over = v1::AddGroupMembersRequest {
        group_id: group,
        user_ids: vec![1, 2, 3, 4],
        with_history: false,
    };
    let status = client.add_group_members(over).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    for user in [2, 3, 4] {
        assert!(truth(&app, user).await.is_empty(), "a refused add writes nothing");
    }
    assert_eq!(add(&app, group, vec![1, 2, 3], false).await, 2, "up to the limit is fine");

    let mut no_title = send_request(group, "x", "");
    no_title.content.as_mut().unwrap().title.clear();
    let status = client.send_group_message(no_title).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "content.title: must not be empty")
    );
    let mut bad_sender = send_request(group, "x", "");
    bad_sender.sender = "two words".into();
    let status = client.send_group_message(bad_sender).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "sender: must be printable ASCII without spaces")
    );
    assert_eq!(unread(&app, 1).await.groups[0].max_seq, 0, "rejected sends take no seq");

    let status = client
        .create_group(v1::CreateGroupRequest { group_id: 9, name: " ".into() })
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "name: must not be empty")
    );
    let same = v1::CreateGroupRequest { group_id: group, name: "strict".into() };
    assert_eq!(
        client.create_group(same).await.unwrap().into_inner().group_id,
        group,
        "a retried create"
    );
    let other = v1::CreateGroupRequest { group_id: group, name: "other".into() };
    assert_eq!(client.create_group(other).await.unwrap_err().code(), Code::AlreadyExists);
    app.cleanup().await;
}

#[tokio::test]
async fn concurrent_retries_of_one_send_store_it_once() {
    let app = spawn().await;
    let group = create_group(&app, "retries").await;
    let attempts = (0..8).map(|_| {
        let mut client = app.groups();
        async move { send(&mut client, group, "same-key").await }
    });
    let results = futures::future::join_all(attempts).await;
    assert!(results.iter().all(|r| *r == results[0]), "{results:?}");
    assert_eq!(results[0].1, 1);
    let home = app.ctx.pools.for_group(group).value();
    assert_eq!(store::max_seq(home, group).await.unwrap(), Some(1), "no seq was used twice");
    app.cleanup().await;
}

/// Returns `n` user ids that live on `n` different shards.
pub(crate) fn users_on_distinct_shards(app: &TestApp, n: usize) -> Vec<u64> {
    let map = app.ctx.pools.map();
    let mut shards = HashSet::new();
    (1..).filter(|user| shards.insert(map.shard_for_user(*user))).take(n).collect()
}

#[tokio::test]
async fn the_member_limit_counts_members_on_every_shard() {
    let mut settings = test_settings();
    settings.groups.max_members = 2;
    let app = spawn_app_with(settings, false).await;
    let group = create_group(&app, "small").await;
    let users = users_on_distinct_shards(&app, 3);
    assert_eq!(add(&app, group, vec![users[0]], false).await, 1);
    assert_eq!(add(&app, group, vec![users[1]], false).await, 1);
    let request = v1::AddGroupMembersRequest {
        group_id: group,
        user_ids: vec![users[2]],
        with_history: false,
    };
    let status = app.groups().add_group_members(request).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        status.message(),
        format!("group {group} has 2 members; adding 1 would pass the limit of 2")
    );
    assert!(truth(&app, users[2]).await.is_empty());
    app.cleanup().await;
}

#[tokio::test]
async fn a_group_shard_down_leaves_the_inbox_badge_answering() {
    let app = spawn().await;
    let group = create_group(&app, "far away").await;
    let group_shard = app.ctx.pools.for_group(group).shard();
    let user = (1..).find(|u| app.ctx.pools.for_user(*u).shard() != group_shard).unwrap();
    add(&app, group, vec![user], false).await;
    send(&mut app.groups(), group, "m").await;
    assert_eq!(unread(&app, user).await.total, 1);

    let mut inbox = app.inbox();
    let request = v1::GetUnreadCountRequest { user_id: user };
    assert_eq!(inbox.get_unread_count(request).await.unwrap().into_inner().group_unread, 1);

    // The group's home shard goes away and Redis forgets the group's seq.
    let seq_key = app.ctx.cache.keys().group_seq(group);
    let mut redis = app.ctx.cache.connection();
    redis::cmd("DEL").arg(&seq_key).query_async::<()>(&mut redis).await.unwrap();
    app.ctx.pools.for_group(group).value().close().await;
    let badge = inbox.get_unread_count(request).await;
    let badge = badge.expect("the inbox badge does not depend on the group's shard").into_inner();
    assert_eq!((badge.unread, badge.group_unread), (0, 0));
    let status = app
        .groups()
        .get_group_unread(v1::GetGroupUnreadRequest { user_id: user })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    app.cleanup().await;
}

#[tokio::test]
async fn messages_past_retention_go_and_members_behind_them_move_past_them() {
    let app = spawn().await;
    let group_id = create_group(&app, "retention").await;
    // Members on different shards: one caught up, one half-way, one offline.
    let members = users_on_distinct_shards(&app, 3);
    let (current, halfway, offline) = (members[0], members[1], members[2]);
    add(&app, group_id, members.clone(), false).await;
    let mut client = app.groups();
    for key in ["old-1", "old-2", "old-3", "recent"] {
        send(&mut client, group_id, key).await;
    }
    ack(&app, current, group_id, 3).await.unwrap();
    ack(&app, halfway, group_id, 1).await.unwrap();
    // Seqs 1-3 were sent 200 days ago (ids are time-ordered).
    let home = app.ctx.pools.for_group(group_id).value();
    let long_ago = chrono::Utc::now() - chrono::Duration::days(200);
    for seq in 1..=3u64 {
        let id = notify_domain::ids::first_id_at(long_ago.timestamp_millis() as u64) + seq;
        sqlx::query("UPDATE group_messages SET message_id = ? WHERE group_id = ? AND seq = ?")
            .bind(id)
            .bind(group_id)
            .bind(seq)
            .execute(home)
            .await
            .unwrap();
    }
    // Seq 2 was recalled: a tombstone that goes with its neighbours.
    let recall = v1::RecallGroupMessageRequest { group_id, seq: 2 };
    app.groups().recall_group_message(recall).await.unwrap();
    assert_eq!(unread(&app, offline).await.total, 3, "cached before the run");
    assert_eq!(unread(&app, halfway).await.total, 2);

    let mut settings = app.settings.retention.clone();
    settings.group_messages_days = 100;
    let run = || {
        notify_core::retention::run_once(
            &app.ctx.pools,
            &app.ctx.cache,
            &settings,
            chrono::Utc::now(),
        )
    };
    let report = run().await.unwrap();
    assert_eq!(report.group_messages_deleted, 3, "{report:?}");
    assert_eq!(report.group_cursors_advanced, 2, "the two members behind seq 3: {report:?}");
    for (user, ack) in [(current, 3), (halfway, 3), (offline, 3)] {
        assert_eq!(truth(&app, user).await.get(&group_id), Some(&(4, ack)), "user {user}");
        assert_eq!(unread(&app, user).await.total, 1, "user {user}: only the recent message");
    }
    let pulled = pull(&app, offline, group_id, None, 10).await;
    let seqs: Vec<u64> = pulled.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![4], "what is left to pull");
    let kept: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM group_messages WHERE group_id = ?")
        .bind(group_id)
        .fetch_one(home)
        .await
        .unwrap();
    assert_eq!(kept, 1);
    // Every cursor passed the recalled seq: the group's row forgets it.
    let recalled: Option<String> =
        sqlx::query_scalar("SELECT recalled_seqs FROM group_seqs WHERE group_id = ?")
            .bind(group_id)
            .fetch_one(home)
            .await
            .unwrap();
    assert_eq!(recalled, None);
    app.flush_cache().await;
    assert_eq!(unread(&app, offline).await.total, 1, "from mysql too");

    let again = run().await.unwrap();
    assert_eq!((again.group_messages_deleted, again.group_cursors_advanced), (0, 0));
    // A member added with history starts before the oldest message kept.
    let newcomer = (1..).find(|u| !members.contains(u)).unwrap();
    add(&app, group_id, vec![newcomer], true).await;
    assert_eq!(unread(&app, newcomer).await.total, 1);
    assert_eq!(truth(&app, newcomer).await.get(&group_id), Some(&(4, 3)));
    app.cleanup().await;
}

/// A reader filling an uncached group's seq state from MySQL while a send
/// commits does not cache the state it read before that send: the send's
/// raise, finding the group uncached, ends the reader's lease, and the next
/// reader fills the state again. (Before, the older state stayed cached,
/// one message short, until the key's TTL or the group's next send.)
#[tokio::test]
async fn a_fill_read_before_a_send_does_not_cache_a_state_without_it() {
    let mut settings = test_settings();
    settings.groups.seq_cache_ttl_secs = 3_600; // nothing here waits for it
    let app = spawn_app_with(settings, false).await;
    let user = 6_200_001;
    let group = create_group(&app, "fill race").await;
    add(&app, group, vec![user], false).await;
    let mut client = app.groups();
    send(&mut client, group, "one").await;
    assert_eq!(app.ctx.cache.cached_group_seq(group).await.unwrap(), None, "not cached yet");

    // The reader: leases, then reads MySQL (max 1) ...
    let tokens = app.ctx.cache.take_seq_leases(&[group]).await.unwrap();
    let home = app.ctx.pools.for_group(group);
    let read_before = store::seq_states(home.value(), &[group]).await.unwrap();
    assert_eq!(read_before[0].1.max_seq, 1);
    // ... a send commits (max 2) and raises the uncached group ...
    send(&mut client, group, "two").await;
    // ... and only then does the reader store what it read.
    let ttl = app.settings.groups.seq_cache_ttl_secs;
    let read_before = read_before.into_iter().collect();
    app.ctx.cache.fill_group_seqs(&read_before, &tokens, ttl).await.unwrap();
    assert_eq!(
        app.ctx.cache.cached_group_seq(group).await.unwrap(),
        None,
        "a state read before the send was cached"
    );
    assert_eq!(unread(&app, user).await.total, 2);
    let cached = app.ctx.cache.cached_group_seq(group).await.unwrap();
    assert_eq!(cached.map(|seq| seq.max_seq), Some(2), "the next reader filled it");

    // Under a lease nobody ended, a fill is cached.
    let other = create_group(&app, "no race").await;
    send(&mut client, other, "one").await;
    let tokens = app.ctx.cache.take_seq_leases(&[other]).await.unwrap();
    let home = app.ctx.pools.for_group(other);
    let read = store::seq_states(home.value(), &[other]).await.unwrap().into_iter().collect();
    app.ctx.cache.fill_group_seqs(&read, &tokens, ttl).await.unwrap();
    let cached = app.ctx.cache.cached_group_seq(other).await.unwrap();
    assert_eq!(cached.map(|seq| seq.max_seq), Some(1));
    app.cleanup().await;
}
