//! Request builders and waits shared by the tests.

use notify_proto::v1;
use notify_testkit::TestApp;
use tokio_stream::StreamExt;

/// A valid content.
pub fn content(title: &str) -> v1::Content {
    v1::Content {
        title: title.to_owned(),
        body: format!("body of {title}"),
        category: "system".to_owned(),
        data: [("link".to_owned(), "app://inbox".to_owned())].into_iter().collect(),
    }
}

/// A valid SendMessage request to `user_ids`.
pub fn send_request(user_ids: Vec<u64>) -> v1::SendMessageRequest {
    v1::SendMessageRequest {
        sender: "tests".to_owned(),
        idempotency_key: String::new(),
        content: Some(content("hello")),
        audience: Some(v1::send_message_request::Audience::Users(v1::UserAudience { user_ids })),
        send_at: None,
        expire_at: None,
        priority: 0,
    }
}

/// Sends and returns the message id.
pub async fn send(app: &TestApp, user_ids: Vec<u64>) -> u64 {
    app.messages()
        .send_message(send_request(user_ids))
        .await
        .expect("send accepted")
        .into_inner()
        .message_id
}

/// Follows WatchMessage until the send reaches `status`; returns that state.
pub async fn wait_for_status(
    app: &TestApp,
    message_id: u64,
    status: v1::MessageStatus,
) -> v1::Message {
    let request = v1::WatchMessageRequest { message_id, interval_ms: 100 };
    let mut stream = app.messages().watch_message(request).await.expect("watch opens").into_inner();
    let watch = async {
        while let Some(message) = stream.next().await {
            let message = message.expect("watch item");
            if message.status == status as i32 {
                return message;
            }
        }
        panic!("watch ended before message {message_id} reached {status:?}");
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), watch)
        .await
        .unwrap_or_else(|_| panic!("message {message_id} did not reach {status:?} within 60 s"))
}

/// Reads a send's current state.
pub async fn get(app: &TestApp, message_id: u64) -> v1::Message {
    app.messages()
        .get_message(v1::GetMessageRequest { message_id })
        .await
        .expect("get message")
        .into_inner()
}
