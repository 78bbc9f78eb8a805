//! The load generator's event streams: one `GET /v1/events` per user, each
//! its own TCP connection from one of several loopback source addresses
//! (a source address has only the ephemeral port range to give), read with
//! [`http1`](super::http1) and parsed as Server-Sent Events. What each
//! stream receives is kept in its user's [`Record`], which the phases read.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context as _, bail};
use serde::Deserialize;
use tokio::net::TcpSocket;
use tokio::sync::OwnedSemaphorePermit;

use super::http1::{self, Conn};

/// What one user's stream received.
#[derive(Debug)]
pub struct Record {
    /// `snapshot` events.
    pub snapshots: AtomicU32,
    /// `resync` events.
    pub resyncs: AtomicU32,
    /// `item_delivered` of the send.
    pub delivered: AtomicU32,
    /// When the first of them arrived, ms since the epoch.
    pub delivered_ms: AtomicI64,
    /// Its `created_at`, ms since the epoch.
    pub created_ms: AtomicI64,
    /// A snapshot after a resync showed the send's item as the newest.
    pub covered_delivery: AtomicBool,
    /// `item_updated` of the send's item with `read: true`.
    pub updated: AtomicU32,
    /// When the first of them arrived.
    pub updated_ms: AtomicI64,
    /// A snapshot after a resync, after the mark-read was sent, showed
    /// nothing unread.
    pub covered_read: AtomicBool,
    /// When the user's mark-read call was sent (0: not yet).
    pub read_sent_ms: AtomicI64,
    /// `unread` of the last `badge` or `snapshot` (-1: none yet).
    pub unread: AtomicI64,
    /// `badge` events.
    pub badges: AtomicU32,
    /// The stream answered 200 and has not ended.
    pub open: AtomicBool,
}

impl Default for Record {
    fn default() -> Self {
        Self {
            snapshots: AtomicU32::new(0),
            resyncs: AtomicU32::new(0),
            delivered: AtomicU32::new(0),
            delivered_ms: AtomicI64::new(0),
            created_ms: AtomicI64::new(0),
            covered_delivery: AtomicBool::new(false),
            updated: AtomicU32::new(0),
            updated_ms: AtomicI64::new(0),
            covered_read: AtomicBool::new(false),
            read_sent_ms: AtomicI64::new(0),
            unread: AtomicI64::new(-1),
            badges: AtomicU32::new(0),
            open: AtomicBool::new(false),
        }
    }
}

/// Everything the streams share with the phases.
#[derive(Debug)]
pub struct Shared {
    /// One per connection, in the order the users were given.
    pub records: Vec<Record>,
    /// The send's message id (0 before it is created).
    pub target: AtomicU64,
    /// Heartbeats (SSE comments) over every stream.
    pub heartbeats: AtomicU64,
    /// Events of other kinds, or of other messages.
    pub others: AtomicU64,
    /// Streams that could not open.
    pub failures: AtomicU64,
    /// Streams that ended after they opened.
    pub ended: AtomicU64,
    /// The first failure or end, said.
    pub first_problem: Mutex<Option<String>>,
}

impl Shared {
    /// Records for `connections` streams.
    pub fn new(connections: usize) -> Self {
        Self {
            records: (0..connections).map(|_| Record::default()).collect(),
            target: AtomicU64::new(0),
            heartbeats: AtomicU64::new(0),
            others: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            first_problem: Mutex::new(None),
        }
    }

    fn problem(&self, what: String) {
        let mut first = self.first_problem.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(what);
    }
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Where one stream connects from and to, and as whom.
pub struct Target {
    /// The record's index.
    pub index: usize,
    /// The user.
    pub user: u64,
    /// The loopback source address.
    pub source: Ipv4Addr,
    /// The edge.
    pub edge: SocketAddr,
    /// The user's token.
    pub token: String,
}

/// Opens one user's stream and reads it until it ends; `permit` is given
/// back once the first snapshot came (the stream is held), so that the
/// caller bounds the streams still opening.
pub async fn hold(target: Target, shared: Arc<Shared>, permit: OwnedSemaphorePermit) {
    let record = &shared.records[target.index];
    let mut permit = Some(permit);
    let outcome = read_stream(&target, &shared, record, &mut permit).await;
    let held = record.open.swap(false, Ordering::AcqRel);
    if held {
        shared.ended.fetch_add(1, Ordering::Relaxed);
    } else {
        shared.failures.fetch_add(1, Ordering::Relaxed);
    }
    let what = match outcome {
        Ok(()) => "the stream ended".to_owned(),
        Err(e) => format!("{e:#}"),
    };
    shared.problem(format!("user {} from {}: {what}", target.user, target.source));
}

async fn read_stream(
    target: &Target,
    shared: &Shared,
    record: &Record,
    permit: &mut Option<OwnedSemaphorePermit>,
) -> anyhow::Result<()> {
    let socket = TcpSocket::new_v4().context("socket")?;
    socket.bind(SocketAddr::new(IpAddr::V4(target.source), 0)).context("bind")?;
    let stream = socket.connect(target.edge).await.context("connect")?;
    let mut conn = Conn::new(stream);
    let request = format!(
        "GET /v1/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Accept: text/event-stream\r\n\r\n",
        target.edge, target.token
    );
    conn.send(request.as_bytes()).await.context("write the request")?;
    let head = conn.head().await?;
    if head.status != 200 {
        let body = conn.body(&head).await.unwrap_or_default();
        bail!("answered {}: {}", head.status, String::from_utf8_lossy(&body));
    }
    if !head.chunked {
        bail!("a 200 that is not chunked");
    }
    record.open.store(true, Ordering::Release);
    let mut text = Vec::new();
    let mut reader = Reader { shared, record, after_resync: false };
    while conn.chunks(&mut text).await? {
        let mut parsed = 0;
        while let Some(end) = http1::find(&text[parsed..], b"\n\n") {
            reader.block(&text[parsed..parsed + end]);
            parsed += end + 2;
        }
        text.drain(..parsed);
        if text.is_empty() && text.capacity() > 1024 {
            text = Vec::new();
        }
        if permit.is_some() && record.snapshots.load(Ordering::Relaxed) > 0 {
            drop(permit.take());
        }
    }
    Ok(())
}

/// The fields of an event's data the bench looks at.
#[derive(Debug, Default, Deserialize)]
struct Data {
    #[serde(default)]
    message_id: Option<String>,
    #[serde(default)]
    created_at: Option<String>,
    #[serde(default)]
    read: Option<bool>,
    #[serde(default)]
    unread: Option<i64>,
    #[serde(default)]
    latest: Option<Latest>,
}

#[derive(Debug, Deserialize)]
struct Latest {
    message_id: String,
}

/// Applies one stream's events to its record.
struct Reader<'a> {
    shared: &'a Shared,
    record: &'a Record,
    /// A resync came; the next snapshot says what it covers.
    after_resync: bool,
}

impl Reader<'_> {
    /// One SSE block (the lines of one event, without the blank line).
    fn block(&mut self, block: &[u8]) {
        let mut event: &[u8] = b"";
        let mut data: &[u8] = b"";
        for line in block.split(|b| *b == b'\n') {
            if let Some(value) = field(line, b"event") {
                event = value;
            } else if let Some(value) = field(line, b"data") {
                data = value;
            }
        }
        let now = now_ms();
        let (shared, record) = (self.shared, self.record);
        // A heartbeat: a comment, or an event with its position.
        if event == b"heartbeat" || event.is_empty() && data.is_empty() {
            shared.heartbeats.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if event.is_empty() {
            shared.others.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let data: Data = serde_json::from_slice(data).unwrap_or_default();
        let target = shared.target.load(Ordering::Acquire);
        let about_target = target != 0
            && data.message_id.as_deref().and_then(|id| id.parse().ok()) == Some(target);
        match event {
            b"snapshot" => {
                record.snapshots.fetch_add(1, Ordering::Relaxed);
                if let Some(unread) = data.unread {
                    record.unread.store(unread, Ordering::Relaxed);
                }
                if std::mem::take(&mut self.after_resync) && target != 0 {
                    let latest = data.latest.as_ref().and_then(|l| l.message_id.parse().ok());
                    if latest == Some(target) {
                        record.covered_delivery.store(true, Ordering::Relaxed);
                    }
                    let read_sent = record.read_sent_ms.load(Ordering::Relaxed) != 0;
                    if read_sent && data.unread == Some(0) {
                        record.covered_read.store(true, Ordering::Relaxed);
                    }
                }
            }
            b"resync" => {
                record.resyncs.fetch_add(1, Ordering::Relaxed);
                self.after_resync = true;
            }
            b"item_delivered" if about_target => {
                if record.delivered.fetch_add(1, Ordering::Relaxed) == 0 {
                    record.delivered_ms.store(now, Ordering::Relaxed);
                    let created = data.created_at.as_deref().and_then(|at| {
                        chrono::DateTime::parse_from_rfc3339(at).ok().map(|t| t.timestamp_millis())
                    });
                    record.created_ms.store(created.unwrap_or(0), Ordering::Relaxed);
                }
            }
            b"item_updated" if about_target && data.read == Some(true) => {
                if record.updated.fetch_add(1, Ordering::Relaxed) == 0 {
                    record.updated_ms.store(now, Ordering::Relaxed);
                }
            }
            b"badge" => {
                record.badges.fetch_add(1, Ordering::Relaxed);
                if let Some(unread) = data.unread {
                    record.unread.store(unread, Ordering::Relaxed);
                }
            }
            _ => {
                shared.others.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The value of an SSE line `name: value` (the space after the colon is
/// optional).
fn field<'a>(line: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let rest = line.strip_prefix(name)?.strip_prefix(b":")?;
    Some(rest.strip_prefix(b" ").unwrap_or(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(shared: &Shared, blocks: &[&str]) {
        let mut reader = Reader { shared, record: &shared.records[0], after_resync: false };
        for block in blocks {
            reader.block(block.as_bytes());
        }
    }

    #[test]
    fn events_of_the_send_are_counted_per_user_and_heartbeats_apart() {
        let shared = Shared::new(1);
        shared.target.store(42, Ordering::Release);
        apply(
            &shared,
            &[
                "event: snapshot\ndata: {\"unread\":0,\"unseen\":0,\"group_unread\":0}",
                ":",
                "event: heartbeat\ndata: {}\nid: 7-1700000000000",
                "event: item_delivered\nid: 8-1\ndata: {\"message_id\":\"42\",\"title\":\"t\",\
                 \"category\":\"bench\",\"created_at\":\"2026-12-06T09:30:00.123Z\"}",
                "event: item_delivered\ndata: {\"message_id\":\"41\"}",
                "event: badge\ndata: {\"unread\":1,\"unseen\":1}",
                "event: item_updated\ndata: {\"message_id\":\"42\",\"action\":\"mark_read\",\
                 \"seen\":true,\"read\":true}",
                "event: badge\ndata: {\"unread\":0,\"unseen\":0}",
            ],
        );
        let record = &shared.records[0];
        assert_eq!(record.snapshots.load(Ordering::Relaxed), 1);
        assert_eq!(record.delivered.load(Ordering::Relaxed), 1);
        assert_eq!(record.created_ms.load(Ordering::Relaxed), 1_796_549_400_123);
        assert_eq!(record.updated.load(Ordering::Relaxed), 1);
        assert_eq!(
            (record.badges.load(Ordering::Relaxed), record.unread.load(Ordering::Relaxed)),
            (2, 0)
        );
        assert_eq!(shared.heartbeats.load(Ordering::Relaxed), 2);
        assert_eq!(shared.others.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_snapshot_after_a_resync_covers_what_it_shows() {
        let shared = Shared::new(1);
        shared.target.store(42, Ordering::Release);
        shared.records[0].read_sent_ms.store(1, Ordering::Relaxed);
        apply(
            &shared,
            &[
                "event: resync\ndata: {\"reason\":\"lost\"}",
                "event: snapshot\ndata: {\"unread\":0,\"latest\":{\"message_id\":\"42\"}}",
            ],
        );
        let record = &shared.records[0];
        assert!(record.covered_delivery.load(Ordering::Relaxed));
        assert!(record.covered_read.load(Ordering::Relaxed));
        assert_eq!(record.delivered.load(Ordering::Relaxed), 0);
    }
}
