//! Bad input: INVALID_ARGUMENT naming the field, and nothing left behind.

use notify_proto::v1;
use notify_testkit::{TestApp, spawn_app};
use tonic::Code;

use crate::helpers::send_request;

async fn rejected(app: &TestApp, request: v1::SendMessageRequest) -> tonic::Status {
    app.messages().send_message(request).await.expect_err("request must be rejected")
}

async fn stored_messages(app: &TestApp) -> i64 {
    let mut total = 0;
    for (_, pool) in app.ctx.pools.iter() {
        let n: i64 = sqlx::query_scalar(
            "SELECT (SELECT COUNT(*) FROM messages) + (SELECT COUNT(*) FROM message_chunks) \
             + (SELECT COUNT(*) FROM idempotency_keys)",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        total += n;
    }
    total
}

#[tokio::test]
async fn send_message_rejects_each_bad_field_by_name_and_writes_nothing() {
    let app = spawn_app().await;
    let now = chrono::Utc::now().timestamp();
    let mut cases: Vec<(v1::SendMessageRequest, &str)> = Vec::new();

    let mut r = send_request(vec![1]);
    r.content.as_mut().unwrap().title = String::new();
    cases.push((r, "content.title: must not be empty"));
    let mut r = send_request(vec![1]);
    r.content.as_mut().unwrap().body = "x".repeat(16 * 1024 + 1);
    cases.push((r, "content.body: is 16385 bytes, the limit is 16384"));
    let mut r = send_request(vec![1]);
    r.content = None;
    cases.push((r, "content: is required"));
    let mut r = send_request(vec![1]);
    r.content.as_mut().unwrap().category = "Has Spaces".into();
    cases.push((r, "content.category: may only contain a-z, 0-9, '_', '.' and '-'"));
    cases.push((send_request(vec![4, 0]), "audience.users.user_ids[1]: user id must not be 0"));
    cases
        .push((send_request(vec![]), "audience.users.user_ids: must contain at least one user id"));
    cases.push((
        send_request((1..=100_001).collect()),
        "audience.users.user_ids: has 100001 ids, the limit is 100000; use CreateMessage, AppendRecipients and StartMessage for larger sends",
    ));
    let mut r = send_request(vec![1]);
    r.audience = None;
    cases.push((r, "audience: must be set to users or all_users"));
    let mut r = send_request(vec![1]);
    r.sender = "has space".into();
    cases.push((r, "sender: must be printable ASCII without spaces"));
    let mut r = send_request(vec![1]);
    r.send_at = Some(prost_types::Timestamp { seconds: now - 3_600, nanos: 0 });
    cases.push((r, "send_at: is more than 300 s in the past"));
    let mut r = send_request(vec![1]);
    r.expire_at = Some(prost_types::Timestamp { seconds: now - 10, nanos: 0 });
    cases.push((r, "expire_at: must be in the future"));
    let mut r = send_request(vec![1]);
    r.priority = 42;
    cases.push((r, "priority: unknown value 42"));
    let mut r = send_request(vec![1]);
    r.idempotency_key = "has space".into();
    cases.push((r, "idempotency_key: must be printable ASCII without spaces"));

    for (request, expected) in cases {
        let status = rejected(&app, request).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{expected}");
        assert_eq!(status.message(), expected);
    }
    assert_eq!(stored_messages(&app).await, 0, "a rejected call left rows behind");
    app.cleanup().await;
}

#[tokio::test]
async fn other_rpcs_reject_bad_input_by_field() {
    let app = spawn_app().await;
    let mut messages = app.messages();
    let mut inbox = app.inbox();

    let zero_id = messages.get_message(v1::GetMessageRequest { message_id: 0 }).await.unwrap_err();
    assert_eq!(zero_id.message(), "message_id: message id must not be 0");
    let batch = messages
        .append_recipients(v1::AppendRecipientsRequest {
            message_id: 1,
            batch_number: 0,
            user_ids: vec![1],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(batch.code(), Code::InvalidArgument);
    assert!(batch.message().starts_with("batch_number: must be in 1..="), "{}", batch.message());
    let watch = messages
        .watch_message(v1::WatchMessageRequest { message_id: 1, interval_ms: 5 })
        .await
        .unwrap_err();
    assert_eq!(watch.message(), "interval_ms: must be 0 (default) or in 100..=60000");

    let user = inbox.get_unread_count(v1::GetUnreadCountRequest { user_id: 0 }).await.unwrap_err();
    assert_eq!(
        (user.code(), user.message()),
        (Code::InvalidArgument, "user_id: user id must not be 0")
    );
    let page = inbox
        .list_inbox(v1::ListInboxRequest { user_id: 1, page_size: 101, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(page.message(), "page_size: is 101, the maximum is 100");
    let zero = inbox
        .list_inbox(v1::ListInboxRequest { user_id: 1, page_size: 0, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(zero.message(), "page_size: must be at least 1");
    let token = inbox
        .list_inbox(v1::ListInboxRequest {
            user_id: 1,
            page_size: 10,
            page_token: "garbage!".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(token.message(), "page_token: is not a page token returned by this service");
    let many = inbox
        .batch_get_unread_counts(v1::BatchGetUnreadCountsRequest {
            user_ids: (1..=1_001).collect(),
        })
        .await
        .unwrap_err();
    assert_eq!(many.message(), "user_ids: has 1001 ids, the limit is 1000");
    let mark =
        inbox.mark_read(v1::MarkReadRequest { user_id: 1, message_ids: vec![] }).await.unwrap_err();
    assert_eq!(mark.message(), "message_ids: must contain at least one id");
    app.cleanup().await;
}
