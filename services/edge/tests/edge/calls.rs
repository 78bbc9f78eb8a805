//! Every REST call answers what the gRPC api answers for the same user.

use notify_proto::v1;
use notify_testkit::{TestApp, spawn_app};
use serde_json::{Value, json};

use crate::{Edge, get, send};

fn ids(values: &Value) -> Vec<u64> {
    values.as_array().unwrap().iter().map(|v| v.as_str().unwrap().parse().unwrap()).collect()
}

async fn grpc_page(
    app: &TestApp,
    user: u64,
    request: v1::ListInboxRequest,
) -> v1::ListInboxResponse {
    let request = v1::ListInboxRequest { user_id: user, ..request };
    app.inbox().list_inbox(request).await.unwrap().into_inner()
}

async fn grpc_badge(app: &TestApp, user: u64) -> v1::GetUnreadCountResponse {
    let request = v1::GetUnreadCountRequest { user_id: user };
    app.inbox().get_unread_count(request).await.unwrap().into_inner()
}

#[tokio::test]
async fn the_inbox_badge_and_updates_answer_as_grpc_does() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let user = 8_200_001;
    let mut sent = Vec::new();
    for _ in 0..3 {
        let id = app.send(vec![user]).await;
        app.wait_for_status(id, v1::MessageStatus::Completed).await;
        sent.push(id);
    }
    let token = edge.token(user);

    // Pages: the same items, states and content, the same cursor chain.
    let page = get(&edge, &token, "/v1/inbox?page_size=2").await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    let grpc =
        grpc_page(&app, user, v1::ListInboxRequest { page_size: 2, ..Default::default() }).await;
    let items = page.body["items"].as_array().unwrap();
    assert_eq!(items.len(), grpc.items.len());
    for (json, proto) in items.iter().zip(&grpc.items) {
        let content = proto.content.as_ref().unwrap();
        assert_eq!(json["message_id"], proto.message_id.to_string());
        assert_eq!(json["title"], content.title);
        assert_eq!(json["body"], content.body);
        assert_eq!(json["category"], content.category);
        assert_eq!(json["data"]["link"], content.data["link"]);
        assert_eq!(
            (json["read"].as_bool(), json["seen"].as_bool()),
            (Some(proto.read), Some(proto.seen))
        );
    }
    assert_eq!(page.body["next_cursor"], grpc.next_page_token);
    let next =
        get(&edge, &token, &format!("/v1/inbox?page_size=2&cursor={}", grpc.next_page_token)).await;
    let grpc_next = grpc_page(
        &app,
        user,
        v1::ListInboxRequest {
            page_size: 2,
            page_token: grpc.next_page_token.clone(),
            ..Default::default()
        },
    )
    .await;
    let next_ids: Vec<u64> = next.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["message_id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(next_ids, grpc_next.items.iter().map(|i| i.message_id).collect::<Vec<_>>());
    assert!(next.body.get("next_cursor").is_none(), "the last page has no cursor");

    let badge = get(&edge, &token, "/v1/badge").await;
    let grpc = grpc_badge(&app, user).await;
    assert_eq!(
        badge.body,
        json!({ "unread": grpc.unread, "unseen": grpc.unseen, "group_unread": grpc.group_unread,
                "group_unread_unknown": grpc.group_unread_unknown })
    );
    assert_eq!(grpc.unread, 3);

    // An update by ids, then one over a filter: the answer's counts are the
    // badge's after it, and the states are what gRPC lists.
    let read_one = json!({ "action": "mark_read", "message_ids": [sent[0].to_string(), "99"] });
    let answer = send(&edge, &token, "POST", "/v1/items/update", &read_one).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.body["changed"], 1);
    assert_eq!(ids(&answer.body["unknown_message_ids"]), [99]);
    let grpc = grpc_badge(&app, user).await;
    assert_eq!(
        (answer.body["unread"].as_u64(), answer.body["unseen"].as_u64()),
        (Some(grpc.unread), Some(grpc.unseen))
    );
    let archive_rest =
        json!({ "action": "archive", "all": { "view": "inbox", "read_only": true } });
    let answer = send(&edge, &token, "POST", "/v1/items/update", &archive_rest).await;
    assert_eq!(answer.body["changed"], 1);
    let archived = get(&edge, &token, "/v1/inbox?view=archive").await;
    let grpc = grpc_page(
        &app,
        user,
        v1::ListInboxRequest {
            view: v1::InboxView::Archive as i32,
            page_size: 20,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(archived.body["items"].as_array().unwrap().len(), grpc.items.len());
    assert_eq!(archived.body["items"][0]["message_id"], sent[0].to_string());
    assert_eq!(archived.body["items"][0]["archived"], true);
    assert!(archived.body["items"][0]["archived_at"].is_string());
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn preferences_and_groups_answer_as_grpc_does() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let user = 8_200_011;
    let token = edge.token(user);
    let mut groups = app.groups();
    let group = groups
        .create_group(v1::CreateGroupRequest { name: "team".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .group_id;
    groups
        .add_group_members(v1::AddGroupMembersRequest {
            group_id: group,
            user_ids: vec![user],
            ..Default::default()
        })
        .await
        .unwrap();
    for n in 0..3 {
        let request = v1::SendGroupMessageRequest {
            group_id: group,
            sender: "tests".into(),
            content: Some(notify_testkit::content(&format!("group {n}"))),
            ..Default::default()
        };
        groups.send_group_message(request).await.unwrap();
    }

    let muted =
        json!({ "muted_categories": ["promo"], "muted_group_ids": [], "locale": "zh_hans" });
    let put = send(&edge, &token, "PUT", "/v1/preferences", &muted).await;
    assert_eq!(put.status, 200, "{:?}", put.body);
    assert_eq!(put.body["locale"], "zh-Hans", "answered canonical");
    let bad = json!({ "locale": "not a tag" });
    let refused = send(&edge, &token, "PUT", "/v1/preferences", &bad).await;
    assert_eq!((refused.status, refused.field()), (400, "locale"), "{:?}", refused.body);
    let grpc = app
        .inbox()
        .get_preferences(v1::GetPreferencesRequest { user_id: user })
        .await
        .unwrap()
        .into_inner()
        .preferences
        .unwrap();
    assert_eq!(
        (grpc.muted_categories, grpc.locale.as_str()),
        (vec!["promo".to_owned()], "zh-Hans")
    );
    assert_eq!(get(&edge, &token, "/v1/preferences").await.body, put.body);

    let listed = get(&edge, &token, "/v1/groups").await;
    let grpc = groups
        .get_group_unread(v1::GetGroupUnreadRequest { user_id: user })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.body["total"], grpc.total);
    assert_eq!(listed.body["groups"][0]["group_id"], group.to_string());
    assert_eq!(listed.body["groups"][0]["unread"], grpc.groups[0].unread);
    assert_eq!(grpc.total, 3);

    let pulled = get(&edge, &token, &format!("/v1/groups/{group}/messages?limit=2")).await;
    let grpc = groups
        .pull_group_messages(v1::PullGroupMessagesRequest {
            user_id: user,
            group_id: group,
            after_seq: None,
            limit: 2,
        })
        .await
        .unwrap()
        .into_inner();
    let seqs: Vec<u64> = pulled.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, grpc.messages.iter().map(|m| m.seq).collect::<Vec<_>>());
    assert_eq!(pulled.body["messages"][0]["title"], "group 0");
    assert_eq!(pulled.body["has_more"], grpc.has_more);

    let acked =
        send(&edge, &token, "POST", &format!("/v1/groups/{group}/ack"), &json!({ "seq": 2 })).await;
    assert_eq!(acked.body["last_ack_seq"], 2);
    let grpc = groups
        .get_group_unread(v1::GetGroupUnreadRequest { user_id: user })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc.total, 1, "the ack moved the cursor the api reads");
    let badge = get(&edge, &token, "/v1/badge").await;
    assert_eq!(badge.body["group_unread"], 1);
    edge.stop().await;
    app.cleanup().await;
}
