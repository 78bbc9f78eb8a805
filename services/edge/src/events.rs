//! `GET /v1/events`: the user's live stream, as Server-Sent Events.
//!
//! On connect the stream sends a `snapshot` (the badge and the newest
//! item), then deltas (`item_delivered`, `item_updated`, `item_revoked`,
//! `group_message`, `badge`). Each event whose place in the events stream
//! is known carries it as its SSE `id`, and so does each heartbeat (a
//! comment, every `edge.heartbeat_secs`): the browser's `EventSource`
//! sends the last one back as `Last-Event-ID` when it reconnects, to any
//! edge replica, and the stream goes on after it with nothing missing
//! (what comes twice is harmless). When the events since are no longer
//! held, or the reader fell behind, the stream sends `resync` and a fresh
//! `snapshot`: reload the first page. An id is sent only while the stream
//! has every event up to it, so a resume never skips one.
//!
//! The guarantee is the gRPC `Subscribe`'s: no change after the snapshot
//! is lost. Every tab and device has its own stream, up to
//! `edge.max_streams_per_user` per user and replica.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use notify_api::events::{Gap, Hub, Position, Queued, Start};
use notify_domain::domain::UserId;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Edge;
use crate::error::{ApiError, ApiResult};
use crate::json::{Resync, StreamEvent};
use crate::routes::{Query, authenticate};

/// The shutdown token: streams end when the edge drains (their clients
/// reconnect to another replica and resume).
#[derive(Clone)]
pub struct Draining(pub CancellationToken);

/// Open streams per user on this replica.
#[derive(Clone, Default)]
pub struct StreamCounts(Arc<Mutex<HashMap<u64, usize>>>);

/// One open stream of a user, counted until dropped.
struct Slot {
    counts: StreamCounts,
    user: u64,
}

impl StreamCounts {
    fn acquire(&self, user: u64, most: usize) -> Option<Slot> {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let open = counts.entry(user).or_default();
        if *open >= most {
            return None;
        }
        *open += 1;
        Some(Slot { counts: self.clone(), user })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = counts.get_mut(&self.user) {
            *open -= 1;
            if *open == 0 {
                counts.remove(&self.user);
            }
        }
    }
}

/// `GET /v1/events`.
#[utoipa::path(get, path = "/v1/events", tag = "events",
    params(
        ("Last-Event-ID" = Option<String>, Header, description = "the last id received: resume after it"),
        ("last_event_id" = Option<String>, Query, description = "the same, for a client that opens a new stream itself (an EventSource cannot set headers); the header wins when both are sent"),
        ("access_token" = Option<String>, Query, description = "the user token, for clients that cannot set Authorization (a browser's EventSource)"),
    ),
    responses((status = 200, description = "Server-Sent Events: snapshot, item_delivered, item_updated, item_revoked, group_message, badge, resync, heartbeat", content_type = "text/event-stream"),
        (status = 401, body = crate::error::ErrorBody), (status = 429, body = crate::error::ErrorBody)),
    security(("user_token" = [])))]
pub async fn stream(
    State(edge): State<Edge>,
    axum::Extension(Draining(shutdown)): axum::Extension<Draining>,
    headers: HeaderMap,
    query: Query,
) -> ApiResult<Response> {
    query.only(&["access_token", "last_event_id"])?;
    let user = match query.string("access_token") {
        token if !token.is_empty() => {
            edge.tokens.verify_token(&token).map_err(ApiError::unauthenticated)?.user
        }
        _ => authenticate(&headers, &edge)?,
    };
    let settings = &edge.ctx.settings.edge;
    // Opening a stream is a call: a client reconnecting in a loop is held
    // to the user's rate like any other.
    edge.quotas
        .admit_user(user.get(), settings.requests_per_second, settings.burst)
        .await
        .map_err(ApiError::from)?;
    edge.quotas
        .admit_user(user.get(), settings.requests_per_second, settings.burst)
        .await
        .map_err(ApiError::from)?;
    let slot =
        edge.streams.acquire(user.get(), settings.max_streams_per_user).ok_or_else(|| {
            ApiError::rate_limited(
                format!(
                    "this user has {} event streams open on this replica, the most it may \
                 (edge.max_streams_per_user)",
                    settings.max_streams_per_user
                ),
                None,
            )
        })?;
    // A malformed id is one the history cannot know: a resync. The header
    // (a browser's own reconnect) wins over the parameter (the page's).
    let parameter = query.string("last_event_id");
    let resume = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.is_empty())
        .or((!parameter.is_empty()).then_some(parameter.as_str()))
        .map(|value| value.parse::<Position>().unwrap_or(Position { offset: 0, stamp: 1 }));
    let (hub_stream, rx, start) =
        edge.hub.open_user(user.get(), resume).await.map_err(crate::routes::from_status)?;
    metrics::counter!("notify_edge_streams_opened_total", "start" => start_label(start))
        .increment(1);
    if let Start::Resync(gap) = start {
        let reason = if gap == Gap::TooOld { "too_old" } else { "unknown" };
        metrics::counter!("notify_edge_resyncs_total", "reason" => reason).increment(1);
    }
    let every = Duration::from_secs(settings.heartbeat_secs);
    let open = Open {
        hub: edge.hub.clone(),
        stream: hub_stream,
        rx,
        heartbeats: tokio::time::interval_at(first_beat(every), every),
        shutdown,
        first_loss: matches!(start, Start::Resync(_)),
        pending: Vec::new(),
        ended: false,
        _slot: slot,
        user,
    };
    let mut response = Sse::new(events(open)).into_response();
    // Proxies that buffer (nginx) pass each event on at once.
    response.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// The first heartbeat of a stream opened now: `every` from now, put off
/// to the next whole second of the process's clock. Streams' heartbeats so
/// fall on shared ticks, and the runtime wakes once for the many due at a
/// tick rather than once for each.
fn first_beat(every: Duration) -> tokio::time::Instant {
    static EPOCH: OnceLock<tokio::time::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(tokio::time::Instant::now);
    let due = (tokio::time::Instant::now() + every).duration_since(epoch);
    epoch + Duration::from_secs(due.as_secs() + u64::from(due.subsec_nanos() > 0))
}

fn start_label(start: Start) -> &'static str {
    match start {
        Start::Fresh => "fresh",
        Start::Resumed => "resumed",
        Start::Resync(_) => "resync",
    }
}

/// An open stream and what its writer needs.
struct Open {
    hub: Hub,
    stream: Arc<notify_api::events::Stream>,
    rx: mpsc::Receiver<Queued>,
    heartbeats: tokio::time::Interval,
    shutdown: CancellationToken,
    /// The next loss is the resume's (`history`), not a fall behind.
    first_loss: bool,
    /// Frames drained at a heartbeat, written before it.
    pending: Vec<SseEvent>,
    ended: bool,
    _slot: Slot,
    user: UserId,
}

impl Drop for Open {
    fn drop(&mut self) {
        // The reader went away (or the stream ended): forget its routes.
        let (hub, stream) = (self.hub.clone(), self.stream.clone());
        metrics::gauge!("notify_edge_streams").decrement(1);
        tokio::spawn(async move { hub.close(&stream).await });
    }
}

impl Open {
    /// The SSE frame of a queued item; none for the stream's end.
    fn frame(&mut self, queued: Queued) -> Option<SseEvent> {
        match queued {
            Queued::Event { at, event } => {
                let event = StreamEvent::from_proto(*event)?;
                metrics::counter!("notify_edge_events_sent_total", "kind" => event.name())
                    .increment(1);
                let mut frame = SseEvent::default().event(event.name()).data(event.data());
                if let Some(at) = at.filter(|_| self.stream.settled()) {
                    frame = frame.id(at.to_string());
                }
                Some(frame)
            }
            Queued::Lost => {
                let reason = if std::mem::take(&mut self.first_loss) { "history" } else { "lost" };
                if reason == "lost" {
                    metrics::counter!("notify_edge_resyncs_total", "reason" => "lost").increment(1);
                }
                let event = StreamEvent::Resync(Resync { reason: reason.to_owned() });
                Some(SseEvent::default().event(event.name()).data(event.data()))
            }
            Queued::End(status) => {
                tracing::debug!(user_id = self.user.get(), %status, "event stream ended");
                self.ended = true;
                None
            }
        }
    }

    /// A heartbeat: everything queued now is written first, then the
    /// beat. When the stream has every event up to the position read before
    /// the queue was drained, the beat is a `heartbeat` event carrying that
    /// position as its id (an event, not a comment, so that a browser's
    /// page sees the id: a client that reconnects by itself resumes from
    /// it, not from its last change, which may be older than the history);
    /// otherwise a comment.
    fn heartbeat(&mut self) {
        let routed = self.hub.routed();
        while let Ok(queued) = self.rx.try_recv() {
            if let Some(frame) = self.frame(queued) {
                self.pending.push(frame);
            }
        }
        let beat = match routed.filter(|_| self.stream.settled() && !self.ended) {
            Some(at) => SseEvent::default().event("heartbeat").data("{}").id(at.to_string()),
            None => SseEvent::default().comment(""),
        };
        self.pending.push(beat);
        self.pending.reverse();
    }
}

fn events(open: Open) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    metrics::gauge!("notify_edge_streams").increment(1);
    futures::stream::unfold(open, |mut open| async move {
        loop {
            if let Some(frame) = open.pending.pop() {
                return Some((Ok(frame), open));
            }
            if open.ended {
                return None;
            }
            tokio::select! {
                queued = open.rx.recv() => match queued {
                    Some(queued) => {
                        if let Some(frame) = open.frame(queued) {
                            return Some((Ok(frame), open));
                        }
                    }
                    None => return None,
                },
                _ = open.heartbeats.tick() => open.heartbeat(),
                () = open.shutdown.cancelled() => return None,
            }
        }
    })
}
