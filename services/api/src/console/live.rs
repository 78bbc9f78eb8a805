//! Live progress of a send's page, by Server-Sent Events.
//!
//! Every page open on a send, on this replica, shares one poller: it reads
//! [`lookups::live`] (one statement per shard, the home shard's with the
//! status: what feeds `WatchMessage`, never a read per recipient) once per
//! `console.update_interval_ms`, and publishes to a watch channel only when
//! something changed. Each open page is a receiver of that channel. The
//! poller stops when the last page closes, or after publishing the final
//! state of a send that completed, was cancelled or whose recall finished;
//! the streams then end. Each replica behind a load balancer polls for the
//! pages it serves: the state is in MySQL, the sessions in Redis.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use notify_core::Context;
use notify_core::lookups::{self, LiveProgress, LiveReader};
use notify_core::send::{self, Progress};
use notify_domain::domain::MessageId;
use serde::Serialize;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tracing::{debug, warn};

use super::Console;
use super::session::CurrentSession;

/// What a page receives: the send's status and counters, in total and per
/// shard (field names as the API's `Progress`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LiveUpdate {
    /// The status name (`sending`).
    pub status: &'static str,
    /// No update follows.
    pub finished: bool,
    /// When it was read, Unix milliseconds (the chart's time axis).
    pub at_ms: i64,
    /// Summed over the shards.
    pub total: Counters,
    /// Each shard's counters, in shard order.
    pub shards: Vec<ShardCounters>,
}

/// A send's counters, as `Progress` names them.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Counters {
    total: u64,
    delivered: u64,
    failed: u64,
    read: u64,
    pending: u64,
    cancelled: u64,
    suppressed: u64,
    recalled: u64,
}

/// One shard's counters.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct ShardCounters {
    shard: u32,
    #[serde(flatten)]
    counters: Counters,
}

impl From<&Progress> for Counters {
    fn from(p: &Progress) -> Self {
        Self {
            total: p.total,
            delivered: p.delivered,
            failed: p.failed,
            read: p.read,
            pending: p.pending,
            cancelled: p.cancelled,
            suppressed: p.suppressed,
            recalled: p.recalled,
        }
    }
}

impl LiveUpdate {
    fn new(live: &LiveProgress) -> Self {
        Self {
            status: live.status.name(),
            finished: live.finished,
            at_ms: chrono::Utc::now().timestamp_millis(),
            total: Counters::from(&live.total),
            shards: live
                .shards
                .iter()
                .map(|(shard, p)| ShardCounters { shard: shard.0, counters: Counters::from(p) })
                .collect(),
        }
    }
}

type Feed = watch::Sender<Option<Arc<LiveUpdate>>>;

/// The pollers of this replica, one per send with an open page.
pub(crate) struct LiveHub {
    ctx: Context,
    interval: Duration,
    feeds: Mutex<HashMap<u64, Arc<Feed>>>,
}

impl LiveHub {
    pub(crate) fn new(ctx: Context, interval: Duration) -> Self {
        Self { ctx, interval: interval.max(Duration::from_millis(50)), feeds: Mutex::default() }
    }

    /// A receiver of `message_id`'s updates, starting its poller if none runs.
    fn subscribe(
        self: &Arc<Self>,
        message_id: MessageId,
        audience: u8,
    ) -> watch::Receiver<Option<Arc<LiveUpdate>>> {
        let mut feeds = self.feeds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(feed) = feeds.get(&message_id.get()) {
            return feed.subscribe();
        }
        let feed = Arc::new(watch::channel(None).0);
        let receiver = feed.subscribe();
        feeds.insert(message_id.get(), feed.clone());
        metrics::gauge!("notify_console_live_pollers").set(feeds.len() as f64);
        tokio::spawn(self.clone().poll(message_id, audience, feed));
        receiver
    }

    /// Removes `message_id`'s poller unless a page subscribed meanwhile
    /// (checked under the lock new subscribers take).
    fn retire(&self, message_id: MessageId, feed: &Feed, finished: bool) -> bool {
        let mut feeds = self.feeds.lock().unwrap_or_else(|e| e.into_inner());
        if !finished && feed.receiver_count() > 0 {
            return false;
        }
        feeds.remove(&message_id.get());
        metrics::gauge!("notify_console_live_pollers").set(feeds.len() as f64);
        true
    }

    async fn poll(self: Arc<Self>, message_id: MessageId, audience: u8, feed: Arc<Feed>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<LiveProgress> = None;
        loop {
            ticks.tick().await;
            if feed.receiver_count() == 0 && self.retire(message_id, &feed, false) {
                debug!(message_id = %message_id, "no page follows the send any more");
                return;
            }
            metrics::counter!("notify_console_live_polls_total").increment(1);
            let live =
                match lookups::live(&self.ctx, message_id, audience, LiveReader::Poller).await {
                    Ok(Some(live)) => live,
                    Ok(None) => {
                        self.retire(message_id, &feed, true);
                        return;
                    }
                    Err(e) => {
                        // Pages keep the last state; the next tick tries again.
                        warn!(error = %e, message_id = %message_id, "console live read failed");
                        continue;
                    }
                };
            if last.as_ref() != Some(&live) {
                metrics::counter!("notify_console_live_updates_total").increment(1);
                feed.send_replace(Some(Arc::new(LiveUpdate::new(&live))));
            }
            if live.finished {
                // Receivers still get the value sent; the stream ends after.
                self.retire(message_id, &feed, true);
                return;
            }
            last = Some(live);
        }
    }
}

/// `GET /console/sends/{id}/live`: the page's event stream (`progress`
/// events, the last one with `finished: true`; then the stream ends).
pub(crate) async fn stream(
    State(console): State<Arc<Console>>,
    CurrentSession(_session): CurrentSession,
    Path(id): Path<String>,
) -> Response {
    let Some(id) = id.parse::<u64>().ok().and_then(|id| MessageId::parse(id, "message_id").ok())
    else {
        return super::pages::not_found();
    };
    let audience = match send::get(&console.ctx, id, None).await {
        Ok(view) => view.row.audience,
        Err(_) => return super::pages::not_found(),
    };
    let updates = console.live.subscribe(id, audience);
    let events = events(updates).take_until(console.shutdown.clone().cancelled_owned());
    metrics::counter!("notify_console_live_streams_total").increment(1);
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

fn events(
    updates: watch::Receiver<Option<Arc<LiveUpdate>>>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    WatchStream::new(updates).filter_map(|update| async move {
        let update = update?;
        let data = serde_json::to_string(&*update).ok()?;
        Some(Ok(Event::default().event("progress").data(data)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_names_its_counters_as_the_api_does() {
        let counters = Counters {
            total: 10,
            delivered: 4,
            failed: 1,
            read: 2,
            pending: 5,
            cancelled: 0,
            suppressed: 0,
            recalled: 0,
        };
        let update = LiveUpdate {
            status: "sending",
            finished: false,
            at_ms: 1,
            total: counters,
            shards: vec![ShardCounters { shard: 3, counters }],
        };
        let json: serde_json::Value = serde_json::to_value(&update).expect("serializes");
        assert_eq!(json["total"]["delivered"], 4);
        assert_eq!(json["shards"][0]["shard"], 3);
        assert_eq!(json["shards"][0]["pending"], 5);
        assert_eq!(json["finished"], false);
    }
}
