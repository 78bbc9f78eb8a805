//! Recalling a group message: a tombstone that keeps its seq, out of the
//! unread counts of the members whose cursor is before it, whether the counts
//! come from Redis or from MySQL; who may recall; and the cached seq state's
//! merge, which no stale write can undo.

use std::collections::HashMap;

use notify_domain::domain::GroupSeq;
use notify_proto::v1;
use notify_proto::v1::admin_service_client::AdminServiceClient;
use notify_proto::v1::group_service_client::GroupServiceClient;
use notify_testkit::{TestApp, authed, content, spawn_app_with, test_settings, with_clients};
use tonic::Code;

use crate::groups::{ack, add, create_group, pull, send, unread, users_on_distinct_shards};

async fn recall(app: &TestApp, group_id: u64, seq: u64) -> v1::RecallGroupMessageResponse {
    app.groups()
        .recall_group_message(v1::RecallGroupMessageRequest { group_id, seq })
        .await
        .unwrap()
        .into_inner()
}

/// Each user's unread in their only group, checked against their badge's
/// group total.
async fn unreads(app: &TestApp, users: &[u64]) -> Vec<u64> {
    let mut counts = Vec::with_capacity(users.len());
    for user_id in users {
        let answer = unread(app, *user_id).await;
        assert_eq!(answer.groups.len(), 1, "user {user_id} is in one group");
        let badge = app
            .inbox()
            .get_unread_count(v1::GetUnreadCountRequest { user_id: *user_id })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(badge.group_unread, answer.total, "user {user_id}: the badge agrees");
        counts.push(answer.groups[0].unread);
    }
    counts
}

/// A group message's stored title and body.
async fn stored_content(app: &TestApp, group_id: u64, seq: u64) -> (String, String) {
    sqlx::query_as("SELECT title, body FROM group_messages WHERE group_id = ? AND seq = ?")
        .bind(group_id)
        .bind(seq)
        .fetch_one(app.ctx.pools.for_group(group_id).value())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_recalled_message_keeps_its_seq_as_a_tombstone_and_leaves_the_unread_behind_it() {
    let app = spawn_app_with(test_settings(), false).await;
    let group = create_group(&app, "recalls").await;
    // On distinct shards: each member's cursor lives on their own.
    let members = users_on_distinct_shards(&app, 4);
    add(&app, group, members.clone(), false).await;
    let mut client = app.groups();
    let mut sent = Vec::new();
    for key in ["one", "two", "three", "four", "five"] {
        sent.push(send(&mut client, group, key).await);
    }
    assert_eq!(sent.iter().map(|(_, seq)| *seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    // Cursors before, at and after the message to recall (seq 3).
    for (member, seq) in [(members[1], 2), (members[2], 3), (members[3], 5)] {
        ack(&app, member, group, seq).await.unwrap();
    }
    assert_eq!(unreads(&app, &members).await, vec![5, 3, 2, 0], "cached now");

    let recalled = recall(&app, group, 3).await;
    assert_eq!(recalled.message_id, sent[2].0);
    assert!(recalled.recalled_now);
    // At once from the cache, and the same from MySQL once it is gone.
    assert_eq!(unreads(&app, &members).await, vec![4, 2, 2, 0], "from the cache");
    app.flush_cache().await;
    assert_eq!(unreads(&app, &members).await, vec![4, 2, 2, 0], "from mysql");

    // Pulls return the tombstone in its place, without content; the stored
    // content is gone too.
    let page = pull(&app, members[0], group, None, 10).await;
    let seqs: Vec<u64> = page.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5], "no gap");
    for message in &page.messages {
        let tombstone = message.seq == 3;
        assert_eq!(message.recalled, tombstone, "seq {}", message.seq);
        assert_eq!(message.content.is_none(), tombstone, "seq {}", message.seq);
        assert_eq!(message.recalled_at.is_some(), tombstone, "seq {}", message.seq);
    }
    assert_eq!(page.messages[2].message_id, sent[2].0);
    assert_eq!(page.messages[2].sender, "tests");
    assert_eq!(stored_content(&app, group, 3).await, (String::new(), String::new()));
    assert_eq!(stored_content(&app, group, 4).await.0, "four");

    // A repeat changes nothing.
    let again = recall(&app, group, 3).await;
    assert_eq!((again.message_id, again.recalled_now), (sent[2].0, false));
    assert_eq!(unreads(&app, &members).await, vec![4, 2, 2, 0]);

    // Later sends count on top of the recall, cached or not; a cursor may
    // rest on the tombstone.
    assert_eq!(send(&mut client, group, "six").await.1, 6);
    assert_eq!(unreads(&app, &members).await, vec![5, 3, 3, 1]);
    assert_eq!(ack(&app, members[0], group, 3).await.unwrap(), 3);
    assert_eq!(unreads(&app, &members).await, vec![3, 3, 3, 1]);
    app.flush_cache().await;
    assert_eq!(unreads(&app, &members).await, vec![3, 3, 3, 1]);
    app.cleanup().await;
}

#[tokio::test]
async fn recalls_take_the_senders_client_or_sends_all_and_bad_input_names_its_field() {
    let mut settings = test_settings();
    let tokens = with_clients(
        &mut settings,
        &[
            ("owner", &["groups.manage", "send", "sends.manage"]),
            ("other", &["sends.manage"]),
            ("operator", &["sends.manage", "sends.all", "admin"]),
        ],
    );
    let app = spawn_app_with(settings, true).await;
    let mut owner = GroupServiceClient::new(authed(app.channel(), &tokens["owner"]));
    let mut other = GroupServiceClient::new(authed(app.channel(), &tokens["other"]));
    let mut operator = GroupServiceClient::new(authed(app.channel(), &tokens["operator"]));
    let group = owner
        .create_group(v1::CreateGroupRequest { group_id: 0, name: "owned".into() })
        .await
        .unwrap()
        .into_inner()
        .group_id;
    let message = |title: &str| v1::SendGroupMessageRequest {
        group_id: group,
        content: Some(content(title)),
        ..Default::default()
    };
    let first = owner.send_group_message(message("first")).await.unwrap().into_inner();
    let second = owner.send_group_message(message("second")).await.unwrap().into_inner();

    // Another client's message needs sends.all; nothing changes meanwhile.
    let refused = other
        .recall_group_message(v1::RecallGroupMessageRequest { group_id: group, seq: first.seq })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("sends.all"), "{refused:?}");
    assert_eq!(stored_content(&app, group, first.seq).await.0, "first");
    let own = owner
        .recall_group_message(v1::RecallGroupMessageRequest { group_id: group, seq: first.seq })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((own.message_id, own.recalled_now), (first.message_id, true));
    let any = operator
        .recall_group_message(v1::RecallGroupMessageRequest { group_id: group, seq: second.seq })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((any.message_id, any.recalled_now), (second.message_id, true));

    // Bad input: the field and the reason.
    let cases = [
        (0, 1, Code::InvalidArgument, "group_id"),
        (group, 0, Code::InvalidArgument, "seq"),
        (group, 3, Code::NotFound, "seq 3"),
        (group + 1, 1, Code::NotFound, "group"),
    ];
    for (group_id, seq, code, names) in cases {
        let status = operator
            .recall_group_message(v1::RecallGroupMessageRequest { group_id, seq })
            .await
            .unwrap_err();
        assert_eq!(status.code(), code, "group {group_id} seq {seq}: {status:?}");
        assert!(status.message().contains(names), "{status:?}");
    }

    // Each recall is audited with who and which message.
    let mut admin = AdminServiceClient::new(authed(app.channel(), &tokens["operator"]));
    let filter = v1::list_audit_records_request::Filter::GroupId(group);
    let request = v1::ListAuditRecordsRequest { filter: Some(filter), ..Default::default() };
    let records = admin.list_audit_records(request).await.unwrap().into_inner().records;
    let recalls: Vec<(String, String, String)> = records
        .into_iter()
        .filter(|r| r.action == "group.message.recall")
        .map(|r| (r.client, r.outcome, r.detail))
        .collect();
    let has = |client: &str, outcome: &str, message_id: u64| {
        recalls.iter().any(|(c, o, d)| {
            c == client && o == outcome && d.contains(&format!("message_id={message_id}"))
        })
    };
    assert!(has("owner", "ok", first.message_id), "{recalls:?}");
    assert!(has("operator", "ok", second.message_id), "{recalls:?}");
    assert!(
        recalls.iter().any(|(c, o, _)| c == "other" && o == "permission_denied"),
        "{recalls:?}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn cached_seq_states_merge_so_no_stale_write_undoes_a_recall() {
    let app = spawn_app_with(test_settings(), false).await;
    let cache = &app.ctx.cache;
    let group = 4_242;
    let whole = |max_seq: u64, recalled: &[u64]| {
        HashMap::from([(group, GroupSeq { max_seq, recalled: recalled.to_vec() })])
    };
    // A send's raise never creates the key: it does not know the recalls.
    cache.raise_cached_max_seq(group, 9, 60).await.unwrap();
    assert_eq!(cache.cached_group_seq(group).await.unwrap(), None);
    // Nor does a recall's merge: only a reader's fill, under its lease.
    cache.raise_group_seqs(&whole(12, &[4]), 60).await.unwrap();
    assert_eq!(cache.cached_group_seq(group).await.unwrap(), None);
    let fill = async |state: HashMap<u64, GroupSeq>| {
        let tokens = cache.take_seq_leases(&[group]).await.unwrap();
        cache.fill_group_seqs(&state, &tokens, 60).await.unwrap();
    };
    fill(whole(12, &[4])).await;
    // A stale fill read before the recall and before the last sends.
    fill(whole(10, &[])).await;
    let held = cache.cached_group_seq(group).await.unwrap();
    assert_eq!(held, Some(GroupSeq { max_seq: 12, recalled: vec![4] }));
    // Another recall and a send, in either order, add up.
    cache.raise_group_seqs(&whole(12, &[9]), 60).await.unwrap();
    cache.raise_cached_max_seq(group, 13, 60).await.unwrap();
    cache.raise_cached_max_seq(group, 11, 60).await.unwrap();
    let held = cache.cached_group_seq(group).await.unwrap();
    assert_eq!(held, Some(GroupSeq { max_seq: 13, recalled: vec![4, 9] }));
    // Seqs too long for a double's digits stay exact.
    let big = 9_007_199_254_740_993;
    cache.raise_group_seqs(&whole(big, &[big - 1]), 60).await.unwrap();
    let held = cache.cached_group_seq(group).await.unwrap().unwrap();
    assert_eq!(held, GroupSeq { max_seq: big, recalled: vec![4, 9, big - 1] });
    app.cleanup().await;
}
