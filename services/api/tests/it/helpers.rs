//! Short names for the harness helpers used by every test module.

use std::collections::BTreeMap;

use notify_proto::v1;
use notify_store::db::chunks;
use notify_testkit::TestApp;

pub use notify_testkit::{content, send_request};

/// Sends and returns the message id.
pub async fn send(app: &TestApp, user_ids: Vec<u64>) -> u64 {
    app.send(user_ids).await
}

/// Sends an announcement (every user, no expiry) titled `title`; returns
/// its id.
pub async fn announce(app: &TestApp, title: &str) -> u64 {
    let request = v1::SendMessageRequest {
        sender: "tests".into(),
        content: Some(content(title)),
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        ..Default::default()
    };
    app.messages().send_message(request).await.unwrap().into_inner().message_id
}

/// Follows WatchMessage until the send reaches `status`.
pub async fn wait_for_status(
    app: &TestApp,
    message_id: u64,
    status: v1::MessageStatus,
) -> v1::Message {
    app.wait_for_status(message_id, status).await
}

/// Reads a send's current state.
pub async fn get(app: &TestApp, message_id: u64) -> v1::Message {
    app.get_message(message_id).await
}

/// A user's badge.
pub async fn badge(app: &TestApp, user_id: u64) -> u64 {
    counts(app, user_id).await.unread
}

/// A user's whole badge answer (unread, unseen, group unread).
pub async fn counts(app: &TestApp, user_id: u64) -> v1::GetUnreadCountResponse {
    app.inbox().get_unread_count(v1::GetUnreadCountRequest { user_id }).await.unwrap().into_inner()
}

/// The message ids of a user's first inbox page (up to 100), newest first.
pub async fn inbox_ids(app: &TestApp, user_id: u64) -> Vec<u64> {
    let page = app
        .inbox()
        .list_inbox(v1::ListInboxRequest { user_id, page_size: 100, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    page.items.iter().map(|item| item.message_id).collect()
}

/// Creates a draft send from sender "tests"; returns its id.
pub async fn create_draft(app: &TestApp, title: &str) -> u64 {
    app.messages()
        .create_message(v1::CreateMessageRequest {
            sender: "tests".into(),
            content: Some(content(title)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .message_id
}

/// A draft of `content` (a template with recipient vars) holding
/// `recipients` as batch 1.
pub async fn personalized_draft(
    app: &TestApp,
    content: v1::Content,
    recipients: Vec<v1::RecipientVars>,
) -> u64 {
    let request = v1::CreateMessageRequest {
        sender: "tests".into(),
        content: Some(content),
        ..Default::default()
    };
    let draft = app.messages().create_message(request).await.unwrap().into_inner().message_id;
    let batch = v1::AppendRecipientsRequest {
        message_id: draft,
        batch_number: 1,
        recipients,
        ..Default::default()
    };
    app.messages().append_recipients(batch).await.unwrap();
    draft
}

/// Appends `user_ids` to a draft as batch 1 and starts it.
pub async fn append_and_start(app: &TestApp, message_id: u64, user_ids: Vec<u64>) {
    let mut client = app.messages();
    let batch =
        v1::AppendRecipientsRequest { message_id, batch_number: 1, user_ids, ..Default::default() };
    client.append_recipients(batch).await.unwrap();
    client.start_message(v1::StartMessageRequest { message_id }).await.unwrap();
}

/// Opens a `Subscribe` stream, then (the stream open, its headers received)
/// sends a change naming user 0; returns the status the stream ends with,
/// which the server sends in its trailers.
pub async fn subscribe_then_fail(channel: tonic::transport::Channel) -> tonic::Status {
    use tokio_stream::StreamExt as _;
    let (changes, rx) = tokio::sync::mpsc::channel(1);
    let mut events = v1::event_service_client::EventServiceClient::new(channel)
        .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("the stream opens")
        .into_inner();
    let bad = v1::SubscribeRequest { add_user_ids: vec![0], ..Default::default() };
    changes.send(bad).await.expect("change sent");
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(15), events.next()).await {
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(status))) => return status,
            other => panic!("the stream ended without an error: {other:?}"),
        }
    }
}

/// The server's id of the connection a direct set lends next, given back
/// again.
pub async fn next_lent_id(set: &notify_store::db::direct::DirectConnections) -> u64 {
    let mut lent = set.acquire().await.unwrap();
    let id = sqlx::query_scalar("SELECT CONNECTION_ID()").fetch_one(lent.conn()).await.unwrap();
    lent.give_back();
    id
}

/// The server's ids of every connection idle in a direct set (each lent,
/// then given back, so the set holds the same ones after).
pub async fn idle_ids(set: &notify_store::db::direct::DirectConnections) -> Vec<u64> {
    let mut idle = Vec::new();
    for _ in 0..set.idle_count() {
        idle.push(set.acquire().await.unwrap());
    }
    let mut ids = Vec::new();
    for mut lent in idle {
        ids.push(
            sqlx::query_scalar("SELECT CONNECTION_ID()").fetch_one(lent.conn()).await.unwrap(),
        );
        lent.give_back();
    }
    ids
}

/// Each recipient's own vars as the send's chunks hold them, over every
/// shard (a chunk applied or cancelled holds none).
pub async fn chunk_vars(app: &TestApp, message_id: u64) -> BTreeMap<u64, String> {
    let mut held = BTreeMap::new();
    for (_, pool) in app.ctx.pools.iter() {
        let rows: Vec<(Vec<u8>, Option<Vec<u8>>)> =
            sqlx::query_as("SELECT user_ids, vars FROM message_chunks WHERE message_id = ?")
                .bind(message_id)
                .fetch_all(pool)
                .await
                .unwrap();
        for (user_ids, vars) in rows {
            let Some(vars) = vars else { continue };
            let user_ids = chunks::decode_user_ids(&user_ids).unwrap();
            held.extend(user_ids.into_iter().zip(chunks::decode_vars(&vars).unwrap()));
        }
    }
    held
}
