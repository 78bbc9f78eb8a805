//! The event stream: the snapshot, deltas as they happen, a resume by
//! `Last-Event-ID` (on another replica too) with nothing lost, a resync
//! when the position is not held, and the bus reconnecting under it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use notify_proto::v1;
use notify_testkit::{TestApp, spawn_app, spawn_app_with, test_settings};
use serde_json::{Value, json};

use crate::{Edge, ORIGIN, send};

/// One SSE event: its name, data and id (a heartbeat without a position
/// is a comment: no name).
#[derive(Debug, Clone)]
pub struct Frame {
    pub event: String,
    pub data: Value,
    pub id: Option<String>,
}

/// A reader of `/v1/events`.
pub struct Events {
    /// The answer's header fields.
    pub headers: http::HeaderMap,
    body: Incoming,
    buffer: String,
    /// The last id seen (as `EventSource` keeps it).
    pub last_id: Option<String>,
}

impl Events {
    /// Opens the stream as `token`'s user, resuming after `last_id`, on a
    /// connection of its own (the edge answers it without hyper).
    pub async fn open(addr: SocketAddr, token: &str, last_id: Option<&str>) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let request = Self::request(&format!("http://{addr}/v1/events"), token, last_id, None);
        Self::from(client.request(request).await.unwrap(), last_id)
    }

    /// Opens the stream as a page's own `EventSource` does when it opens a
    /// new one: the token and the last id in the query, no header.
    pub async fn open_by_query(addr: SocketAddr, token: &str, last_id: &str) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let uri = format!("http://{addr}/v1/events?access_token={token}&last_event_id={last_id}");
        let request = http::Request::get(uri)
            .header("accept", "text/event-stream")
            .body(Empty::new())
            .unwrap();
        Self::from(client.request(request).await.unwrap(), Some(last_id))
    }

    /// The request for the stream (`uri` absolute or a path), with an
    /// `Origin` when given.
    fn request(
        uri: &str,
        token: &str,
        last_id: Option<&str>,
        origin: Option<&str>,
    ) -> http::Request<Empty<Bytes>> {
        let mut request = http::Request::get(uri)
            .header("authorization", format!("Bearer {token}"))
            .header("accept", "text/event-stream");
        if let Some(id) = last_id {
            request = request.header("last-event-id", id);
        }
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.body(Empty::new()).unwrap()
    }

    /// The stream of an answer to [`Events::request`].
    fn from(response: http::Response<Incoming>, last_id: Option<&str>) -> Self {
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self {
            headers: response.headers().clone(),
            body: response.into_body(),
            buffer: String::new(),
            last_id: last_id.map(str::to_owned),
        }
    }

    /// Waits (20 s at most) for the stream to end cleanly, skipping what
    /// comes before the end.
    pub async fn ended(&mut self) {
        loop {
            let next = tokio::time::timeout(Duration::from_secs(20), self.body.frame()).await;
            match next.expect("the end within 20 s") {
                None => return,
                Some(frame) => drop(frame.expect("a clean end")),
            }
        }
    }

    /// The next frame (heartbeats included), within 20 s.
    pub async fn frame(&mut self) -> Frame {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut frame = Frame { event: String::new(), data: Value::Null, id: None };
                for line in block.lines() {
                    if let Some(name) = line.strip_prefix("event: ") {
                        frame.event = name.to_owned();
                    } else if let Some(data) = line.strip_prefix("data: ") {
                        frame.data = serde_json::from_str(data).unwrap();
                    } else if let Some(id) = line.strip_prefix("id: ") {
                        frame.id = Some(id.to_owned());
                    }
                }
                if let Some(id) = &frame.id {
                    self.last_id = Some(id.clone());
                }
                return frame;
            }
            let next = tokio::time::timeout(Duration::from_secs(20), self.body.frame()).await;
            let frame = next.expect("a frame within 20 s").expect("the stream is open").unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }

    /// The next event named `name` (others skipped).
    pub async fn next(&mut self, name: &str) -> Frame {
        loop {
            let frame = self.frame().await;
            if frame.event == name {
                return frame;
            }
        }
    }

    /// Reads until a heartbeat that carries an id (the stream has every
    /// event up to it): a `heartbeat` event, whose data is `{}`.
    pub async fn settled(&mut self) -> String {
        loop {
            let frame = self.frame().await;
            if let ("heartbeat", Some(id)) = (frame.event.as_str(), frame.id) {
                assert_eq!(frame.data, json!({}));
                return id;
            }
        }
    }

    /// The message ids of `item_delivered` events until each of `wanted`
    /// came (anything else is skipped).
    pub async fn delivered(&mut self, wanted: &[u64]) -> Vec<u64> {
        let mut seen = Vec::new();
        while !wanted.iter().all(|w| seen.contains(w)) {
            let frame = self.next("item_delivered").await;
            seen.push(frame.data["message_id"].as_str().unwrap().parse().unwrap());
        }
        seen
    }
}

async fn delivered_to(app: &TestApp, user: u64) -> u64 {
    let id = app.send(vec![user]).await;
    app.wait_for_status(id, v1::MessageStatus::Completed).await;
    id
}

#[tokio::test]
async fn a_stream_starts_with_a_snapshot_then_follows_deliveries_reads_and_recalls() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let user = 8_300_001;
    let before = delivered_to(&app, user).await;
    let token = edge.token(user);
    let mut events = Events::open(edge.addr, &token, None).await;
    let snapshot = events.next("snapshot").await;
    assert_eq!(snapshot.data["unread"], 1);
    assert_eq!(snapshot.data["latest"]["message_id"], before.to_string());

    let id = delivered_to(&app, user).await;
    let delivered = events.next("item_delivered").await;
    assert_eq!(delivered.data["message_id"], id.to_string());
    assert!(delivered.id.is_some(), "a delivery carries its position");
    assert_eq!(events.next("badge").await.data["unread"], 2);

    let read = json!({ "action": "mark_read", "message_ids": [id.to_string()] });
    assert_eq!(send(&edge, &token, "POST", "/v1/items/update", &read).await.status, 200);
    let updated = events.next("item_updated").await;
    assert_eq!(
        (updated.data["message_id"].clone(), updated.data["read"].clone()),
        (json!(id.to_string()), json!(true))
    );
    assert_eq!(events.next("badge").await.data["unread"], 1);

    app.messages().recall_message(v1::RecallMessageRequest { message_id: before }).await.unwrap();
    assert_eq!(events.next("item_revoked").await.data["message_id"], before.to_string());
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_stream_on_a_connection_of_its_own_and_one_after_another_call_say_the_same() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let user = 8_300_041;
    let token = edge.token(user);
    // A stream as the first request of its connection: answered without
    // hyper. Another after a badge call on one kept-alive connection:
    // answered by hyper.
    let own = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri = format!("http://{}/v1/events", edge.addr);
    let own = own.request(Events::request(&uri, &token, None, Some(ORIGIN))).await.unwrap();
    let mut own = Events::from(own, None);
    let tcp = tokio::net::TcpStream::connect(edge.addr).await.unwrap();
    let (mut shared, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(connection);
    let badge = http::Request::get("/v1/badge")
        .header("host", edge.addr.to_string())
        .header("authorization", format!("Bearer {token}"))
        .body(Empty::new())
        .unwrap();
    let badge = shared.send_request(badge).await.unwrap();
    assert_eq!(badge.status(), 200);
    badge.into_body().collect().await.unwrap();
    let mut request = Events::request("/v1/events", &token, None, Some(ORIGIN));
    request.headers_mut().insert("host", edge.addr.to_string().parse().unwrap());
    let mut after = Events::from(shared.send_request(request).await.unwrap(), None);

    for name in
        ["content-type", "cache-control", "x-accel-buffering", "access-control-allow-origin"]
    {
        assert_eq!(own.headers.get(name), after.headers.get(name), "{name}");
    }
    assert_eq!(own.headers["access-control-allow-origin"], ORIGIN);
    assert!(own.headers.contains_key("date"));
    assert_eq!(own.next("snapshot").await.data, after.next("snapshot").await.data);
    let id = delivered_to(&app, user).await;
    let (mine, theirs) = (own.next("item_delivered").await, after.next("item_delivered").await);
    assert_eq!(mine.data["message_id"], id.to_string());
    assert_eq!((mine.data, mine.id), (theirs.data, theirs.id));
    assert_eq!(own.next("badge").await.data, after.next("badge").await.data);
    let (mine, theirs) = (own.settled().await, after.settled().await);
    assert!(!mine.is_empty() && !theirs.is_empty(), "heartbeats carry positions on both");

    // Draining ends both streams cleanly (their clients resume elsewhere).
    edge.stop().await;
    own.ended().await;
    after.ended().await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_stream_on_its_own_connection_is_chunked_and_ends_when_the_client_sends_more() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let mut tcp = tokio::net::TcpStream::connect(edge.addr).await.unwrap();
    let request = format!(
        "GET /v1/events HTTP/1.1\r\nhost: edge\r\nauthorization: Bearer {}\r\n\r\n",
        edge.token(8_300_051)
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("event: snapshot") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut buf)).await;
        let n = n.expect("the snapshot within 20 s").unwrap();
        assert_ne!(n, 0, "open until the snapshot");
        seen.extend_from_slice(&buf[..n]);
    }
    let seen = String::from_utf8_lossy(&seen).to_lowercase();
    assert!(seen.starts_with("http/1.1 200 ok\r\n"), "{seen}");
    for field in ["transfer-encoding: chunked\r\n", "connection: close\r\n"] {
        assert!(seen.contains(field), "{field} in {seen}");
    }
    // Another request behind the endless answer is never answered: the
    // edge closes the connection (a reset, as it leaves the request unread).
    tcp.write_all(b"GET /v1/badge HTTP/1.1\r\nhost: edge\r\n\r\n").await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut rest)).await;
    match read.expect("closed within 20 s") {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    assert!(!String::from_utf8_lossy(&rest).contains("HTTP/1.1"), "no second answer");
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_stream_resumes_after_its_last_id_on_any_replica_with_nothing_lost() {
    // The first replica is given the id as `Last-Event-ID` (a browser's own
    // reconnect), the second as `last_event_id` (a page's new EventSource).
    let app = spawn_app().await;
    let first = Edge::start(&app).await;
    let second =
        Edge::start_with(crate::edge_settings(&app, &first.keys), crate::Keys::new()).await;
    let user = 8_300_011;
    let token = first.token(user);
    let mut events = Events::open(first.addr, &token, None).await;
    events.next("snapshot").await;
    let seen = delivered_to(&app, user).await;
    events.delivered(&[seen]).await;
    let last = events.settled().await;
    drop(events);

    // Sent while the client was away.
    let missed = [delivered_to(&app, user).await, delivered_to(&app, user).await];
    for (edge, by_query) in [(&first, false), (&second, true)] {
        let mut resumed = if by_query {
            Events::open_by_query(edge.addr, &token, &last).await
        } else {
            Events::open(edge.addr, &token, Some(&last)).await
        };
        let mut got = Vec::new();
        while !missed.iter().all(|m| got.contains(m)) {
            let frame = resumed.frame().await;
            assert_ne!(frame.event, "resync", "resumed from a held position");
            assert_ne!(frame.event, "snapshot", "a resume sends no snapshot");
            if frame.event == "item_delivered" {
                got.push(frame.data["message_id"].as_str().unwrap().parse::<u64>().unwrap());
            }
        }
        assert!(!got.contains(&seen), "nothing before the position comes again");
        // Then the badge as it is now, and live events after.
        assert_eq!(resumed.next("badge").await.data["unread"], 3);
    }
    first.stop().await;
    second.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_position_the_edge_does_not_hold_starts_with_resync_and_a_snapshot() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let user = 8_300_021;
    let token = edge.token(user);
    for last in ["1-1", "not-a-position"] {
        let mut events = Events::open(edge.addr, &token, Some(last)).await;
        let first = events.frame().await;
        assert_eq!(first.event, "resync", "{last}");
        assert_eq!(first.data["reason"], "history");
        events.next("snapshot").await;
    }
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn the_edges_bus_reconnecting_loses_no_event_of_an_open_stream() {
    let mut settings = test_settings();
    let proxies = notify_testkit::faults::route_through_proxies(&mut settings).await;
    let app = spawn_app_with(settings, true).await;
    let edge = Edge::start(&app).await;
    let user = 8_300_031;
    let mut events = Events::open(edge.addr, &edge.token(user), None).await;
    events.next("snapshot").await;
    let before = delivered_to(&app, user).await;
    events.delivered(&[before]).await;
    proxies.rabbitmq.reset_connections().await;
    // The consumer reads on from the offset after its last: every delivery
    // comes, none as a resync.
    let after = [delivered_to(&app, user).await, delivered_to(&app, user).await];
    let mut got = Vec::new();
    while !after.iter().all(|a| got.contains(a)) {
        let frame = events.frame().await;
        assert_ne!(frame.event, "resync");
        if frame.event == "item_delivered" {
            got.push(frame.data["message_id"].as_str().unwrap().parse::<u64>().unwrap());
        }
    }
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_personalized_item_shows_its_own_text_in_the_users_language_in_the_stream_and_the_inbox()
{
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let user = 8_300_101;
    let token = edge.token(user);
    let german = json!({ "locale": "de-CH" });
    assert_eq!(send(&edge, &token, "PUT", "/v1/preferences", &german).await.status, 200);
    let mut events = Events::open(edge.addr, &token, None).await;
    events.next("snapshot").await;

    let mut request = notify_testkit::send_request(Vec::new());
    let content = request.content.as_mut().unwrap();
    content.title = "Hi {{ name }}".to_owned();
    content.body = "{{ amount }} due".to_owned();
    content.template = Some(v1::Template {
        translations: [(
            "de".to_owned(),
            v1::Translation {
                title: "Hallo {{ name }}".into(),
                body: "{{ amount }} fällig".into(),
            },
        )]
        .into(),
        recipient_vars: vec!["name".into(), "amount".into()],
        ..Default::default()
    });
    let vars = [("name".to_owned(), "Eva".to_owned()), ("amount".to_owned(), "CHF 9".to_owned())];
    request.audience = Some(v1::send_message_request::Audience::Users(v1::UserAudience {
        recipients: vec![v1::RecipientVars { user_id: user, vars: vars.into() }],
        ..Default::default()
    }));
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    let delivered = events.next("item_delivered").await;
    assert_eq!(delivered.data["message_id"], id.to_string());
    assert_eq!(delivered.data["title"], "Hallo Eva");
    let page = crate::get(&edge, &token, "/v1/inbox").await;
    let item = &page.body["items"][0];
    assert_eq!(
        (item["title"].clone(), item["body"].clone()),
        (json!("Hallo Eva"), json!("CHF 9 fällig"))
    );
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn an_announcement_shows_its_title_in_the_users_language_live_and_after_a_resume() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let user = 8_300_111;
    let token = edge.token(user);
    let german = json!({ "locale": "de-CH" });
    assert_eq!(send(&edge, &token, "PUT", "/v1/preferences", &german).await.status, 200);
    let announce = |product: &str| {
        let mut request = notify_testkit::send_request(Vec::new());
        request.audience =
            Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {}));
        let content = request.content.as_mut().unwrap();
        content.title = "{{ product }} is out".to_owned();
        content.template = Some(v1::Template {
            vars: [("product".to_owned(), product.to_owned())].into(),
            translations: [(
                "de".to_owned(),
                v1::Translation { title: "{{ product }} ist da".into(), body: String::new() },
            )]
            .into(),
            ..Default::default()
        });
        request
    };
    let title_of = |frame: &Frame, id: u64| {
        assert_eq!(frame.data["message_id"], id.to_string());
        frame.data["title"].as_str().unwrap().to_owned()
    };

    // Live: the language the snapshot read.
    let mut events = Events::open(edge.addr, &token, None).await;
    events.next("snapshot").await;
    let live = app.messages().send_message(announce("Notify 2")).await.unwrap().into_inner();
    let frame = events.next("item_delivered").await;
    assert_eq!(title_of(&frame, live.message_id), "Notify 2 ist da");
    let last = events.settled().await;
    drop(events);

    // Sent while the client was away, replayed on its resume: the language
    // the resume read.
    let missed = app.messages().send_message(announce("Notify 3")).await.unwrap().into_inner();
    let mut resumed = Events::open(edge.addr, &token, Some(&last)).await;
    let frame = loop {
        let frame = resumed.frame().await;
        assert!(!["resync", "snapshot"].contains(&frame.event.as_str()), "{frame:?}");
        if frame.event == "item_delivered" {
            break frame;
        }
    };
    assert_eq!(title_of(&frame, missed.message_id), "Notify 3 ist da");
    edge.stop().await;
    app.cleanup().await;
}
