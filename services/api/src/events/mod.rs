//! The gateway event stream: routes change events from the bus to the
//! streams that follow the users they name.
//!
//! One [`Hub`] per api replica holds every open stream, which users each
//! follows, and which of those users belong to which group. The bus consumer
//! ([`bus`]) runs only while at least one stream is open; it hands each event
//! to [`Hub::dispatch`], which never waits on a stream: it queues into the
//! stream's bounded buffer and, when that is full, marks the user as needing
//! a fresh snapshot instead (coalescing). Each stream has its own task that
//! sends those snapshots as the reader makes room, so a slow gateway costs
//! its own stream some latency and nothing else.
//!
//! No change is lost: a user is added to the routing table (with the bus
//! already consuming) before their snapshot is read, so every change after
//! the snapshot arrives as a delta. After the bus consumer reconnects, every
//! user of every stream gets a fresh snapshot, covering the events that
//! were published while it was away.
//!
//! The api reads the bus through an exclusive queue of its own, while
//! streams are open ([`BusSource::Exclusive`]). The edge reads RabbitMQ's
//! events stream instead ([`BusSource::Stream`]): every replica sees the
//! same offsets, keeps the recent events ([`history`]), and tags what it
//! queues with the [`Position`] of the event behind it, so a stream that
//! reconnects, to any replica, resumes after the last position it got
//! ([`Hub::open_user`]); a consumer that reconnects reads on from the offset
//! after its last, and loses nothing the stream still holds.

pub mod bus;
pub mod history;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
use notify_core::events::{BusEvent, BusFilter, ContentSummary};
use notify_core::inbox::{Action, InboxQuery, ItemFilter};
use notify_core::{Context, groups, inbox, preferences};
use notify_domain::domain::UserId;
use notify_domain::template::pick_language;

use crate::convert::WirePages;
use notify_proto::v1::{self, subscribe_response::Event};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::warn;

pub use history::{Gap, Position};

/// What a stream's reader receives, in order.
#[derive(Debug)]
pub enum Queued {
    /// An event, with the position of the bus event behind it (a snapshot:
    /// where the bus stood when it was read) when the hub reads the events
    /// stream.
    Event {
        /// Where it is.
        at: Option<Position>,
        /// What it says (boxed: each stream's queue holds its slots for
        /// its whole life, so a slot is kept small).
        event: Box<Event>,
    },
    /// Events of this stream were lost (it fell behind, or the bus lost
    /// some): a snapshot of each of its users follows.
    Lost,
    /// The stream ends with this status.
    End(Box<Status>),
}

/// Where the hub reads the bus from.
#[derive(Debug, Clone, Copy)]
pub enum BusSource {
    /// An exclusive queue of its own, consumed while any stream is open:
    /// events published while it is away are lost to it (the api).
    Exclusive,
    /// RabbitMQ's events stream, consumed always: `retention` of it is kept
    /// in RabbitMQ and up to `max_events` of it in memory, so streams
    /// resume (the edge).
    Stream {
        /// How far back streams resume.
        retention: Duration,
        /// Most events held in memory.
        max_events: usize,
    },
}

/// How [`Hub::open_user`] started a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From a snapshot (no position was given).
    Fresh,
    /// After the given position: the events since were queued first.
    Resumed,
    /// From a snapshot, because the events since the given position are
    /// gone (or were never read here): the reader missed some.
    Resync(Gap),
}

/// Users a batch of snapshots or badge refreshes covers at most.
const BATCH: usize = 256;

/// The routing state of one api replica.
#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Context,
    source: BusSource,
    /// The recent events, when the hub reads the events stream.
    history: Option<Mutex<history::History>>,
    /// The position of the last event routed to every stream it concerns.
    routed: Mutex<Option<Position>>,
    tables: RwLock<Tables>,
    next_stream: AtomicU64,
    /// Users whose badges changed, waiting for the refresher.
    badges: Mutex<HashSet<u64>>,
    badges_ready: Notify,
    bus: bus::BusControl,
    /// Snapshots being read at once, over every stream of the replica, so
    /// that many streams subscribing together cannot take every database
    /// connection.
    snapshot_permits: tokio::sync::Semaphore,
    shutdown: CancellationToken,
}

#[derive(Default)]
struct Tables {
    streams: HashMap<u64, Arc<Stream>>,
    users: HashMap<u64, Follower>,
    /// Group -> the followed users that are members.
    groups: HashMap<u64, HashSet<u64>>,
}

/// A followed user.
#[derive(Default)]
struct Follower {
    /// Streams following the user (usually one).
    streams: Vec<u64>,
    /// The user's groups, as of the last snapshot and member events since.
    groups: Vec<u64>,
    /// The user's language ('' for none), as of the last snapshot (or
    /// resume) and preference events since: an announcement's event shows
    /// its title in it.
    locale: String,
    /// Bumped by every membership and preference event, so a snapshot read
    /// before one does not overwrite it.
    version: u64,
}

/// One open `Subscribe` stream.
pub struct Stream {
    id: u64,
    tx: mpsc::Sender<Queued>,
    /// Events of it were lost since its last snapshot: the snapshot is
    /// preceded by [`Queued::Lost`].
    lost: AtomicBool,
    /// Snapshots taken from `owed` and not queued yet.
    snapshots_pending: AtomicUsize,
    /// The users it follows.
    users: Mutex<HashSet<u64>>,
    /// Users owed a snapshot (just added, or events coalesced).
    owed: Mutex<HashSet<u64>>,
    owed_ready: Notify,
    closed: CancellationToken,
}

impl Stream {
    /// Queues `event` without waiting; false when the buffer is full (the
    /// caller coalesces) or the reader is gone.
    fn offer(&self, at: Option<Position>, event: Event) -> bool {
        let kind = event_kind(&event);
        match self.tx.try_send(Queued::Event { at, event: Box::new(event) }) {
            Ok(()) => {
                metrics::counter!("notify_events_sent_total", "kind" => kind).increment(1);
                true
            }
            Err(mpsc::error::TrySendError::Full(_)) => false,
            Err(mpsc::error::TrySendError::Closed(_)) => true,
        }
    }

    /// Queues a per-user event, or owes the user a snapshot when the buffer
    /// is full.
    fn offer_for(&self, user_id: u64, at: Option<Position>, event: Event) {
        if !self.offer(at, event) {
            metrics::counter!("notify_events_coalesced_total").increment(1);
            self.lose(std::iter::once(user_id));
        }
    }

    /// Queues an event for the whole stream, or owes every user a snapshot.
    fn offer_to_all(&self, at: Option<Position>, event: Event) {
        if !self.offer(at, event) {
            metrics::counter!("notify_events_coalesced_total").increment(1);
            let users: Vec<u64> = lock(&self.users).iter().copied().collect();
            self.lose(users);
        }
    }

    /// Queues a heartbeat unless the buffer is full (then the stream is not
    /// quiet anyway).
    pub fn heartbeat(&self) {
        let now = std::time::SystemTime::now();
        self.offer(None, Event::Heartbeat(v1::Heartbeat { at: Some(now.into()) }));
    }

    /// True while every event routed to it is queued: no snapshot owed or
    /// being read, and nothing lost since the last (a position it reports
    /// then resumes without a gap).
    pub fn settled(&self) -> bool {
        !self.lost.load(Ordering::Acquire)
            && self.snapshots_pending.load(Ordering::Acquire) == 0
            && lock(&self.owed).is_empty()
    }

    /// Completes when the reader went away or the stream was ended.
    pub async fn finished(&self) {
        tokio::select! {
            () = self.tx.closed() => {}
            () = self.closed.cancelled() => {}
        }
    }

    /// Ends the stream with `status` (waiting up to a second for room).
    pub async fn end(&self, status: Status) {
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            self.tx.send(Queued::End(Box::new(status))),
        )
        .await;
        self.closed.cancel();
    }

    fn owe(&self, users: impl IntoIterator<Item = u64>) {
        lock(&self.owed).extend(users);
        self.owed_ready.notify_one();
    }

    /// Owes `users` a snapshot because events of theirs were lost.
    fn lose(&self, users: impl IntoIterator<Item = u64>) {
        self.lost.store(true, Ordering::Release);
        self.owe(users);
    }
}

/// Counts a taken snapshot as done (queued, or owed again) when dropped.
struct PendingSnapshot<'a>(&'a Stream);

impl Drop for PendingSnapshot<'_> {
    fn drop(&mut self) {
        self.0.snapshots_pending.fetch_sub(1, Ordering::AcqRel);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn event_kind(event: &Event) -> &'static str {
    match event {
        Event::Snapshot(_) => "snapshot",
        Event::ItemDelivered(_) => "item_delivered",
        Event::BadgeChanged(_) => "badge_changed",
        Event::GroupMessage(_) => "group_message",
        Event::ItemRevoked(_) => "item_revoked",
        Event::Heartbeat(_) => "heartbeat",
        Event::ItemUpdated(_) => "item_updated",
    }
}

/// The gateway's `ItemDelivered` of a send's item for `user_id`: the
/// summary's title, or the user's own (`title`) for a templated content.
fn delivered(
    user_id: u64,
    message_id: u64,
    summary: &ContentSummary,
    title: Option<&str>,
) -> Event {
    Event::ItemDelivered(v1::ItemDelivered {
        user_id,
        message_id,
        title: title.unwrap_or(&summary.title).to_owned(),
        category: summary.category.clone(),
        created_at: Some(timestamp_ms(summary.created_at_ms)),
    })
}

/// The gateway's `ItemUpdated` of an edit: the new title, for every user
/// who has the item.
fn edited(message_id: u64, title: &str, edited_at_ms: i64) -> Event {
    Event::ItemUpdated(v1::ItemUpdated {
        message_id,
        title: title.to_owned(),
        edited_at: Some(timestamp_ms(edited_at_ms)),
        ..v1::ItemUpdated::default()
    })
}

/// The gateway's `ItemUpdated` of one update call: the item, the items or
/// the filter, and the states the action set (the others unset).
fn item_updated(
    user_id: u64,
    action: Action,
    message_ids: Vec<u64>,
    filter: Option<BusFilter>,
) -> v1::ItemUpdated {
    let (message_id, message_ids) = match message_ids.as_slice() {
        [one] => (*one, Vec::new()),
        _ => (0, message_ids),
    };
    let all = filter.map(|filter| v1::ItemFilter {
        view: crate::convert::view_to_proto(filter.view) as i32,
        category: filter.category.unwrap_or_default(),
        unread_only: filter.unread_only,
        read_only: filter.read_only,
        up_to_message_id: filter.up_to.unwrap_or(0),
    });
    let mut event = v1::ItemUpdated {
        user_id,
        message_id,
        message_ids,
        all,
        action: crate::convert::action_to_proto(action) as i32,
        ..v1::ItemUpdated::default()
    };
    match action {
        Action::MarkSeen => event.seen = Some(true),
        Action::MarkRead => (event.seen, event.read) = (Some(true), Some(true)),
        Action::MarkUnread => event.read = Some(false),
        Action::Archive => event.archived = Some(true),
        Action::Unarchive => event.archived = Some(false),
        Action::Delete => event.deleted = Some(true),
    }
    event
}

/// Why a subscription change was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct TooManyUsers {
    /// Users the stream would follow.
    pub would_follow: usize,
}

impl Hub {
    /// Creates the hub reading the bus from `source`; its tasks end with
    /// `shutdown`.
    pub fn new(ctx: Context, shutdown: CancellationToken, source: BusSource) -> Self {
        let snapshots = ctx.settings.events.snapshot_concurrency;
        let history = match source {
            BusSource::Exclusive => None,
            BusSource::Stream { retention, max_events } => {
                Some(Mutex::new(history::History::new(max_events, retention.as_millis() as u64)))
            }
        };
        let hub = Self {
            inner: Arc::new(Inner {
                ctx,
                source,
                history,
                routed: Mutex::new(None),
                tables: RwLock::default(),
                next_stream: AtomicU64::new(1),
                badges: Mutex::default(),
                badges_ready: Notify::new(),
                bus: bus::BusControl::default(),
                snapshot_permits: tokio::sync::Semaphore::new(snapshots),
                shutdown,
            }),
        };
        tokio::spawn(hub.clone().refresh_badges());
        hub
    }

    /// The shared context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Where the bus source is.
    pub fn source(&self) -> BusSource {
        self.inner.source
    }

    /// The position of the last event routed to every stream it concerns:
    /// read before a stream's queue is drained, it is a position the reader
    /// has everything up to once the drained events are sent.
    pub fn routed(&self) -> Option<Position> {
        *lock(&self.inner.routed)
    }

    /// Starts the bus consumer and waits until it reads (UNAVAILABLE after
    /// 10 s); a hub reading the events stream keeps it running from then on.
    pub async fn start_bus(&self) -> Result<(), Status> {
        self.inner.bus.ensure(self).await
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Tables> {
        self.inner.tables.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Tables> {
        self.inner.tables.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a stream: makes sure the bus is consuming first (UNAVAILABLE
    /// when it cannot), then registers the stream and starts its snapshot
    /// task. Returns the stream and its reader's end.
    pub async fn open(&self) -> Result<(Arc<Stream>, mpsc::Receiver<Queued>), Status> {
        // Registered before the bus check, so a concurrent last close does
        // not stop the bus under this stream.
        let (tx, rx) = mpsc::channel(self.buffer());
        let stream = Arc::new(Stream {
            id: self.inner.next_stream.fetch_add(1, Ordering::Relaxed),
            tx,
            lost: AtomicBool::new(false),
            snapshots_pending: AtomicUsize::new(0),
            users: Mutex::default(),
            owed: Mutex::default(),
            owed_ready: Notify::new(),
            closed: CancellationToken::new(),
        });
        let streams = {
            let mut tables = self.write();
            tables.streams.insert(stream.id, stream.clone());
            tables.streams.len()
        };
        metrics::gauge!("notify_event_streams").set(streams as f64);
        if let Err(status) = self.inner.bus.ensure(self).await {
            self.close(&stream).await;
            return Err(status);
        }
        tokio::spawn(self.clone().send_snapshots(stream.clone()));
        Ok((stream, rx))
    }

    /// Closes a stream: forgets its users and stops the bus after the last.
    pub async fn close(&self, stream: &Arc<Stream>) {
        stream.closed.cancel();
        let users: Vec<u64> = lock(&stream.users).drain().collect();
        let remaining = {
            let mut tables = self.write();
            tables.streams.remove(&stream.id);
            for user_id in users {
                forget(&mut tables, stream.id, user_id);
            }
            metrics::gauge!("notify_event_subscribed_users").set(tables.users.len() as f64);
            tables.streams.len()
        };
        metrics::gauge!("notify_event_streams").set(remaining as f64);
        if remaining == 0 && matches!(self.inner.source, BusSource::Exclusive) {
            self.inner.bus.stop_if_idle(self).await;
        }
    }

    /// Events one stream may have queued.
    fn buffer(&self) -> usize {
        let settings = &self.inner.ctx.settings;
        match self.inner.source {
            BusSource::Exclusive => settings.events.stream_buffer,
            BusSource::Stream { .. } => settings.edge.stream_buffer,
        }
    }

    /// Opens a stream that follows one user (an edge connection). Without
    /// `resume`, the stream starts with the user's snapshot. With it, and
    /// the history holding it, the events since are queued first (the
    /// user's part of them), then the user's badge, and nothing is lost;
    /// else it starts with a snapshot, after [`Queued::Lost`].
    pub async fn open_user(
        &self,
        user_id: u64,
        resume: Option<Position>,
    ) -> Result<(Arc<Stream>, mpsc::Receiver<Queued>, Start), Status> {
        let (stream, rx) = self.open().await?;
        let Some(from) = resume else {
            self.follow_fresh(&stream, user_id);
            return Ok((stream, rx, Start::Fresh));
        };
        // The groups route the user's group events, the language titles
        // their announcements; both read before the cut.
        let user = UserId::parse(user_id, "user_id").map_err(crate::status::to_status)?;
        let ctx = &self.inner.ctx;
        let read =
            futures::future::try_join(groups::unread(ctx, user), preferences::get(ctx, user));
        let (groups, locale) = match read.await {
            Ok((summary, preferences)) => (
                summary.groups.iter().map(|g| g.group_id).collect::<Vec<_>>(),
                preferences.language(),
            ),
            Err(e) => {
                warn!(error = %e, user_id, "groups or language unavailable for a resume, starting over");
                stream.lost.store(true, Ordering::Release);
                self.follow_fresh(&stream, user_id);
                return Ok((stream, rx, Start::Resync(Gap::Unknown)));
            }
        };
        let replayed = {
            // Under the routing lock: no event is routed meanwhile, so each
            // is either in the history read here or routed to the stream
            // after (or both: a duplicate, harmless).
            let mut tables = self.write();
            let since = match &self.inner.history {
                Some(history) => lock(history).after(from),
                None => Err(Gap::Unknown),
            };
            let since = match since {
                Ok(since) => since,
                Err(gap) => {
                    drop(tables);
                    stream.lost.store(true, Ordering::Release);
                    self.follow_fresh(&stream, user_id);
                    return Ok((stream, rx, Start::Resync(gap)));
                }
            };
            lock(&stream.users).insert(user_id);
            let follower = tables.users.entry(user_id).or_default();
            follower.streams.push(stream.id);
            follower.groups = groups;
            // A change of language since the read is in the history.
            follower.locale = since
                .iter()
                .rev()
                .find_map(|(_, event)| match &**event {
                    BusEvent::PreferencesChanged { user_id: changed, locale }
                        if *changed == user_id =>
                    {
                        Some(locale.clone())
                    }
                    _ => None,
                })
                .unwrap_or(locale);
            for group_id in follower.groups.clone() {
                tables.groups.entry(group_id).or_default().insert(user_id);
            }
            metrics::gauge!("notify_event_subscribed_users").set(tables.users.len() as f64);
            let mut replayed = 0;
            for (at, event) in since {
                for event in self.replay(user_id, &tables, &event) {
                    replayed += 1;
                    stream.offer_for(user_id, Some(at), event);
                }
            }
            replayed
        };
        metrics::counter!("notify_events_replayed_total").increment(replayed);
        self.badges_changed(vec![user_id]);
        Ok((stream, rx, Start::Resumed))
    }

    /// Follows `user_id` on `stream` from a snapshot.
    fn follow_fresh(&self, stream: &Stream, user_id: u64) {
        // One user: never over max_users_per_stream.
        let _ = self.change(stream, &[user_id], &[]);
    }

    /// The events of a bus event that concern `user_id` (a follower in
    /// `tables`), as [`Hub::dispatch`] routes them.
    fn replay(&self, user_id: u64, tables: &Tables, event: &BusEvent) -> Vec<Event> {
        let member = |group_id: u64| {
            tables.groups.get(&group_id).is_some_and(|members| members.contains(&user_id))
        };
        match event {
            BusEvent::ItemsDelivered { message_id, user_ids, summary, titles, .. } => {
                let Some(at) = user_ids.iter().position(|u| *u == user_id) else { return vec![] };
                vec![delivered(user_id, *message_id, summary, titles.get(at).map(String::as_str))]
            }
            BusEvent::Announced { message_id, summary, titles } => {
                let locale = tables.users.get(&user_id).map_or("", |f| f.locale.as_str());
                let title = pick_language(titles, locale).map(String::as_str);
                vec![delivered(user_id, *message_id, summary, title)]
            }
            BusEvent::Revoked { message_id, user_ids }
                if user_ids.as_ref().is_none_or(|ids| ids.contains(&user_id)) =>
            {
                vec![Event::ItemRevoked(v1::ItemRevoked { message_id: *message_id })]
            }
            BusEvent::Edited { message_id, title, edited_at_ms } => {
                vec![edited(*message_id, title, *edited_at_ms)]
            }
            BusEvent::ItemsUpdated { user_id: changed, action, message_ids, filter }
                if *changed == user_id =>
            {
                let event = item_updated(user_id, *action, message_ids.clone(), filter.clone());
                vec![Event::ItemUpdated(event)]
            }
            BusEvent::GroupMessage { group_id, seq, message_id } if member(*group_id) => {
                let event = v1::GroupMessageSent {
                    user_id,
                    group_id: *group_id,
                    seq: *seq,
                    message_id: *message_id,
                };
                vec![Event::GroupMessage(event)]
            }
            BusEvent::GroupMessageRecalled { group_id, message_id, .. } if member(*group_id) => {
                vec![Event::ItemRevoked(v1::ItemRevoked { message_id: *message_id })]
            }
            _ => Vec::new(),
        }
    }

    /// Number of open streams.
    pub fn streams(&self) -> usize {
        self.read().streams.len()
    }

    /// Follows `add` and stops following `remove` on `stream`; each added
    /// user is owed a snapshot. Refuses (changing nothing) when the stream
    /// would follow more than `events.max_users_per_stream` users.
    pub fn change(&self, stream: &Stream, add: &[u64], remove: &[u64]) -> Result<(), TooManyUsers> {
        let limit = self.inner.ctx.settings.events.max_users_per_stream;
        let mut tables = self.write();
        let mut users = lock(&stream.users);
        let mut added: Vec<u64> = add.iter().copied().filter(|u| !users.contains(u)).collect();
        added.sort_unstable();
        added.dedup();
        let removing = remove.iter().filter(|u| users.contains(u) && !add.contains(u)).count();
        let would_follow = users.len() + added.len() - removing;
        if would_follow > limit {
            return Err(TooManyUsers { would_follow });
        }
        for user_id in remove.iter().filter(|u| !add.contains(u)) {
            if users.remove(user_id) {
                forget(&mut tables, stream.id, *user_id);
            }
        }
        for &user_id in &added {
            users.insert(user_id);
            let follower = tables.users.entry(user_id).or_default();
            follower.streams.push(stream.id);
            // Group routes come from the snapshot (or another stream's).
            let known_groups = follower.groups.clone();
            for group_id in known_groups {
                tables.groups.entry(group_id).or_default().insert(user_id);
            }
        }
        metrics::gauge!("notify_event_subscribed_users").set(tables.users.len() as f64);
        drop(users);
        drop(tables);
        if !added.is_empty() {
            stream.owe(added);
        }
        Ok(())
    }

    /// Owes every user of every stream a snapshot: after the bus consumer
    /// reconnected, events published meanwhile may be lost (and no stream
    /// resumes from before).
    pub fn resync_all(&self) {
        if let Some(history) = &self.inner.history {
            lock(history).clear();
        }
        let streams: Vec<Arc<Stream>> = self.read().streams.values().cloned().collect();
        for stream in streams {
            let users: Vec<u64> = lock(&stream.users).iter().copied().collect();
            stream.lose(users);
        }
    }

    /// Routes one event from the bus, read at `at` of the events stream
    /// (kept in the history first). Never waits on a stream.
    pub fn dispatch(&self, event: BusEvent, at: Option<Position>) {
        metrics::counter!("notify_events_received_total", "kind" => event.kind()).increment(1);
        if let (Some(history), Some(at)) = (&self.inner.history, at) {
            lock(history).push(at, Arc::new(event.clone()));
        }
        self.route(event, at);
        if at.is_some() {
            *lock(&self.inner.routed) = at;
        }
    }

    fn route(&self, event: BusEvent, at: Option<Position>) {
        match event {
            BusEvent::ItemsDelivered { message_id, user_ids, summary, titles, committed_at_ms } => {
                if let Some(committed) = committed_at_ms {
                    let lag_ms = (chrono::Utc::now().timestamp_millis() - committed).max(0);
                    metrics::histogram!("notify_event_commit_lag_seconds")
                        .record(lag_ms as f64 / 1000.0);
                }
                let titles: HashMap<u64, &str> =
                    user_ids.iter().copied().zip(titles.iter().map(String::as_str)).collect();
                let followed = self.offer_each(at, user_ids.iter().copied(), |user_id, _| {
                    delivered(user_id, message_id, &summary, titles.get(&user_id).copied())
                });
                self.expire_later(&summary, followed.clone());
                self.badges_changed(followed);
            }
            BusEvent::BadgesChanged { user_ids } => {
                let followed: Vec<u64> = {
                    let tables = self.read();
                    user_ids.into_iter().filter(|u| tables.users.contains_key(u)).collect()
                };
                self.badges_changed(followed);
            }
            BusEvent::GroupMessage { group_id, seq, message_id } => {
                let members = {
                    let tables = self.read();
                    let members = followed_members(&tables, group_id);
                    for &user_id in &members {
                        for stream in streams_of(&tables, user_id) {
                            let event = v1::GroupMessageSent { user_id, group_id, seq, message_id };
                            stream.offer_for(user_id, at, Event::GroupMessage(event));
                        }
                    }
                    members
                };
                self.badges_changed(members);
            }
            BusEvent::GroupMessageRecalled { group_id, seq: _, message_id } => {
                let members = {
                    let tables = self.read();
                    let members = followed_members(&tables, group_id);
                    // Once per stream, however many of its users are members.
                    let mut streams: Vec<&Arc<Stream>> =
                        members.iter().flat_map(|user_id| streams_of(&tables, *user_id)).collect();
                    streams.sort_unstable_by_key(|stream| stream.id);
                    streams.dedup_by_key(|stream| stream.id);
                    for stream in streams {
                        stream.offer_to_all(at, Event::ItemRevoked(v1::ItemRevoked { message_id }));
                    }
                    members
                };
                self.badges_changed(members);
            }
            BusEvent::GroupChanged { group_id } => {
                let members = followed_members(&self.read(), group_id);
                self.badges_changed(members);
            }
            BusEvent::MembersChanged { group_id, added, removed } => {
                let mut changed = Vec::new();
                {
                    let mut tables = self.write();
                    for user_id in added {
                        if let Some(follower) = tables.users.get_mut(&user_id) {
                            follower.version += 1;
                            if !follower.groups.contains(&group_id) {
                                follower.groups.push(group_id);
                            }
                            tables.groups.entry(group_id).or_default().insert(user_id);
                            changed.push(user_id);
                        }
                    }
                    for user_id in removed {
                        if let Some(follower) = tables.users.get_mut(&user_id) {
                            follower.version += 1;
                            follower.groups.retain(|g| *g != group_id);
                            remove_member(&mut tables, group_id, user_id);
                            changed.push(user_id);
                        }
                    }
                }
                self.badges_changed(changed);
            }
            BusEvent::Announced { message_id, summary, titles } => {
                let everyone: Vec<u64> = self.read().users.keys().copied().collect();
                let followed = self.offer_each(at, everyone, |user_id, follower| {
                    let title = pick_language(&titles, &follower.locale).map(String::as_str);
                    delivered(user_id, message_id, &summary, title)
                });
                if let Some(expire_at_ms) = summary.expire_at_ms {
                    self.revoke_later(message_id, expire_at_ms);
                }
                self.badges_changed(followed);
            }
            BusEvent::Revoked { message_id, user_ids: None } => self.revoke(at, message_id),
            BusEvent::Revoked { message_id, user_ids: Some(user_ids) } => {
                self.revoke_for(at, message_id, user_ids);
            }
            BusEvent::Edited { message_id, title, edited_at_ms } => {
                let streams: Vec<Arc<Stream>> = self.read().streams.values().cloned().collect();
                let event = edited(message_id, &title, edited_at_ms);
                for stream in streams {
                    stream.offer_to_all(at, event.clone());
                }
            }
            BusEvent::PreferencesChanged { user_id, locale } => {
                let followed = match self.write().users.get_mut(&user_id) {
                    Some(follower) => {
                        follower.version += 1;
                        follower.locale = locale;
                        true
                    }
                    None => false,
                };
                if followed {
                    self.badges_changed(vec![user_id]);
                }
            }
            BusEvent::ItemsUpdated { user_id, action, message_ids, filter } => {
                let followed = {
                    let tables = self.read();
                    let streams = streams_of(&tables, user_id);
                    if !streams.is_empty() {
                        let event = item_updated(user_id, action, message_ids, filter);
                        for stream in streams {
                            stream.offer_for(user_id, at, Event::ItemUpdated(event.clone()));
                        }
                    }
                    tables.users.contains_key(&user_id)
                };
                if followed {
                    self.badges_changed(vec![user_id]);
                }
            }
        }
    }

    /// Offers `event` of each followed user among `user_ids` to each of the
    /// user's streams; returns those users.
    fn offer_each(
        &self,
        at: Option<Position>,
        user_ids: impl IntoIterator<Item = u64>,
        event: impl Fn(u64, &Follower) -> Event,
    ) -> Vec<u64> {
        let tables = self.read();
        let mut followed = Vec::new();
        for user_id in user_ids {
            let Some(follower) = tables.users.get(&user_id) else { continue };
            let streams = streams_of(&tables, user_id);
            if streams.is_empty() {
                continue;
            }
            followed.push(user_id);
            for stream in streams {
                stream.offer_for(user_id, at, event(user_id, follower));
            }
        }
        followed
    }

    /// Tells every stream a message was withdrawn, and refreshes every badge.
    fn revoke(&self, at: Option<Position>, message_id: u64) {
        let (streams, everyone): (Vec<Arc<Stream>>, Vec<u64>) = {
            let tables = self.read();
            (tables.streams.values().cloned().collect(), tables.users.keys().copied().collect())
        };
        for stream in streams {
            stream.offer_to_all(at, Event::ItemRevoked(v1::ItemRevoked { message_id }));
        }
        self.badges_changed(everyone);
    }

    /// Tells the streams of `user_ids` (a recall's recipients on one
    /// shard) that a message was withdrawn, and refreshes their badges.
    fn revoke_for(&self, at: Option<Position>, message_id: u64, user_ids: Vec<u64>) {
        let revoked = |_, _: &Follower| Event::ItemRevoked(v1::ItemRevoked { message_id });
        let followed = self.offer_each(at, user_ids, revoked);
        self.badges_changed(followed);
    }

    /// An announcement ends at its expiry: streams learn it then.
    fn revoke_later(&self, message_id: u64, expire_at_ms: i64) {
        let Some(delay) = until(expire_at_ms) else { return };
        let hub = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => hub.revoke(None, message_id),
                () = hub.inner.shutdown.cancelled() => {}
            }
        });
    }

    /// Items with an expiry leave their users' badges then.
    fn expire_later(&self, summary: &ContentSummary, user_ids: Vec<u64>) {
        let Some(delay) = summary.expire_at_ms.and_then(until) else { return };
        if user_ids.is_empty() {
            return;
        }
        let hub = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => {
                    let followed: Vec<u64> = {
                        let tables = hub.read();
                        user_ids.into_iter().filter(|u| tables.users.contains_key(u)).collect()
                    };
                    hub.badges_changed(followed);
                }
                () = hub.inner.shutdown.cancelled() => {}
            }
        });
    }

    /// Queues users for a `BadgeChanged` with fresh counts.
    fn badges_changed(&self, user_ids: Vec<u64>) {
        if user_ids.is_empty() {
            return;
        }
        lock(&self.inner.badges).extend(user_ids);
        self.inner.badges_ready.notify_one();
    }

    /// Sends fresh badges for queued users, in batches; a user queued many
    /// times while a batch runs is read once.
    async fn refresh_badges(self) {
        let concurrency = self.inner.ctx.settings.events.snapshot_concurrency;
        loop {
            tokio::select! {
                () = self.inner.badges_ready.notified() => {}
                () = self.inner.shutdown.cancelled() => return,
            }
            loop {
                let batch: Vec<u64> = {
                    let mut pending = lock(&self.inner.badges);
                    let batch: Vec<u64> = pending.iter().take(BATCH).copied().collect();
                    for user_id in &batch {
                        pending.remove(user_id);
                    }
                    batch
                };
                if batch.is_empty() {
                    break;
                }
                let ctx = &self.inner.ctx;
                // These users' badges changed before the event that queued
                // them: their near-cache copies must be gone first.
                ctx.cache.sync_near_cache().await;
                let mut reads = futures::stream::iter(batch)
                    .map(|user_id| async move {
                        let badge = match UserId::parse(user_id, "user_id") {
                            Ok(user) => inbox::badge(ctx, user).await,
                            Err(e) => Err(e),
                        };
                        (user_id, badge)
                    })
                    .buffer_unordered(concurrency);
                while let Some((user_id, badge)) = reads.next().await {
                    match badge {
                        Ok(badge) => {
                            let tables = self.read();
                            for stream in streams_of(&tables, user_id) {
                                let event = v1::BadgeChanged {
                                    user_id,
                                    unread: badge.unread,
                                    group_unread: badge.group_unread.unwrap_or(0),
                                    unseen: badge.unseen,
                                    group_unread_unknown: badge.group_unread.is_none(),
                                };
                                stream.offer_for(user_id, None, Event::BadgeChanged(event));
                            }
                        }
                        Err(e) => {
                            // The user's shard is down: a snapshot later.
                            warn!(error = %e, user_id, "could not read a badge for a stream");
                            let tables = self.read();
                            for stream in streams_of(&tables, user_id) {
                                stream.owe(std::iter::once(user_id));
                            }
                        }
                    }
                }
            }
        }
    }

    /// A stream's task: sends the snapshots it is owed, as fast as its
    /// reader takes them, until the stream closes.
    async fn send_snapshots(self, stream: Arc<Stream>) {
        let concurrency = self.inner.ctx.settings.events.snapshot_concurrency;
        loop {
            tokio::select! {
                () = stream.owed_ready.notified() => {}
                () = stream.closed.cancelled() => return,
            }
            loop {
                let batch: Vec<u64> = {
                    let mut owed = lock(&stream.owed);
                    let following = lock(&stream.users);
                    let batch: Vec<u64> = owed.iter().take(BATCH).copied().collect();
                    for user_id in &batch {
                        owed.remove(user_id);
                    }
                    let batch: Vec<u64> =
                        batch.into_iter().filter(|u| following.contains(u)).collect();
                    stream.snapshots_pending.fetch_add(batch.len(), Ordering::AcqRel);
                    batch
                };
                if batch.is_empty() {
                    break;
                }
                let hub = &self;
                let mut snapshots = futures::stream::iter(batch)
                    .map(|user_id| async move {
                        let Ok(_permit) = hub.inner.snapshot_permits.acquire().await else {
                            return (user_id, None, Err(Status::unavailable("shutting down")));
                        };
                        // Every event after this position reaches the stream.
                        let at = hub.routed();
                        (user_id, at, hub.snapshot(user_id).await)
                    })
                    .buffer_unordered(concurrency);
                while let Some((user_id, at, snapshot)) = snapshots.next().await {
                    let _done = PendingSnapshot(&stream);
                    let snapshot = match snapshot {
                        Ok(snapshot) => snapshot,
                        Err(status) => {
                            // The user's shard is down or busy: the user is
                            // still routed (deltas flow) and is owed the
                            // snapshot again in a second.
                            metrics::counter!("notify_event_snapshot_errors_total").increment(1);
                            warn!(error = %status, user_id, "snapshot failed, retrying in 1 s");
                            // Still pending (not settled) until owed again.
                            stream.snapshots_pending.fetch_add(1, Ordering::AcqRel);
                            let stream = stream.clone();
                            tokio::spawn(async move {
                                tokio::select! {
                                    () = tokio::time::sleep(Duration::from_secs(1)) => {
                                        stream.owe(std::iter::once(user_id));
                                    }
                                    () = stream.closed.cancelled() => {}
                                }
                                stream.snapshots_pending.fetch_sub(1, Ordering::AcqRel);
                            });
                            continue;
                        }
                    };
                    let lost = stream.lost.swap(false, Ordering::AcqRel);
                    let queued = async {
                        if lost {
                            stream.tx.send(Queued::Lost).await?;
                        }
                        stream
                            .tx
                            .send(Queued::Event { at, event: Box::new(Event::Snapshot(snapshot)) })
                            .await
                    };
                    tokio::select! {
                        sent = queued => if sent.is_err() { return },
                        () = stream.closed.cancelled() => return,
                    }
                    metrics::counter!("notify_events_sent_total", "kind" => "snapshot")
                        .increment(1);
                }
            }
        }
    }

    /// Reads a user's snapshot, and records their groups for routing.
    async fn snapshot(&self, user_id: u64) -> Result<v1::Snapshot, Status> {
        let ctx = &self.inner.ctx;
        let user = UserId::parse(user_id, "add_user_ids").map_err(crate::status::to_status)?;
        let version = self.read().users.get(&user_id).map(|f| f.version);
        let query = InboxQuery { before: u64::MAX, limit: 1, filter: ItemFilter::default() };
        // A snapshot must not predate an event the stream already routed.
        ctx.cache.sync_near_cache().await;
        let (counts, groups, page, preferences) = futures::future::join4(
            inbox::counts(ctx, &[user_id]),
            groups::unread(ctx, user),
            inbox::list::<WirePages>(ctx, user, &query),
            preferences::get(ctx, user),
        )
        .await;
        let counts = counts.map_err(crate::status::to_status)?.first().copied().unwrap_or_default();
        let page = page.map_err(crate::status::to_status)?;
        let locale = preferences.map_err(crate::status::to_status)?.language();
        let group_unread = match groups {
            Ok(summary) => {
                let ids: Vec<u64> = summary.groups.iter().map(|g| g.group_id).collect();
                self.settle(user_id, version, Some(ids), locale);
                Some(summary.total)
            }
            Err(e) => {
                // The inbox badge still answers; group routes stay as they were.
                self.settle(user_id, version, None, locale);
                metrics::counter!("notify_badge_group_errors_total").increment(1);
                warn!(error = %e, user_id, "group unread unavailable in a snapshot");
                None
            }
        };
        let latest = page.items.into_iter().next().map(|item| {
            let content = item.content.unwrap_or_default();
            v1::ItemSummary {
                message_id: item.message_id,
                title: content.title,
                category: content.category,
                created_at: item.created_at,
            }
        });
        Ok(v1::Snapshot {
            user_id,
            unread: counts.unread,
            group_unread: group_unread.unwrap_or(0),
            latest,
            unseen: counts.unseen,
            group_unread_unknown: group_unread.is_none(),
        })
    }

    /// Replaces a followed user's language and groups (when read) with
    /// what a snapshot read, unless a membership or preference event
    /// arrived since it started (then the events' state stands and the user
    /// is owed another snapshot).
    fn settle(&self, user_id: u64, version: Option<u64>, groups: Option<Vec<u64>>, locale: String) {
        let mut tables = self.write();
        let Some(follower) = tables.users.get_mut(&user_id) else { return };
        if Some(follower.version) != version {
            let streams = follower.streams.clone();
            for stream in streams.iter().filter_map(|id| tables.streams.get(id)) {
                stream.owe(std::iter::once(user_id));
            }
            return;
        }
        follower.locale = locale;
        let Some(group_ids) = groups else { return };
        let old = std::mem::replace(&mut follower.groups, group_ids.clone());
        for group_id in old {
            remove_member(&mut tables, group_id, user_id);
        }
        for group_id in group_ids {
            tables.groups.entry(group_id).or_default().insert(user_id);
        }
    }
}

/// The streams following `user_id`.
/// The followed members of a group.
fn followed_members(tables: &Tables, group_id: u64) -> Vec<u64> {
    tables
        .groups
        .get(&group_id)
        .map(|members| members.iter().copied().collect())
        .unwrap_or_default()
}

fn streams_of(tables: &Tables, user_id: u64) -> Vec<&Arc<Stream>> {
    tables
        .users
        .get(&user_id)
        .map(|f| f.streams.iter().filter_map(|id| tables.streams.get(id)).collect())
        .unwrap_or_default()
}

/// Drops `stream_id` from a user's followers (and the user, after the last).
fn forget(tables: &mut Tables, stream_id: u64, user_id: u64) {
    let Some(follower) = tables.users.get_mut(&user_id) else { return };
    follower.streams.retain(|id| *id != stream_id);
    if follower.streams.is_empty() {
        let groups = std::mem::take(&mut follower.groups);
        tables.users.remove(&user_id);
        for group_id in groups {
            remove_member(tables, group_id, user_id);
        }
    }
}

fn remove_member(tables: &mut Tables, group_id: u64, user_id: u64) {
    if let Some(members) = tables.groups.get_mut(&group_id) {
        members.remove(&user_id);
        if members.is_empty() {
            tables.groups.remove(&group_id);
        }
    }
}

fn timestamp_ms(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// Time until `at_ms`, when it is in the future.
fn until(at_ms: i64) -> Option<Duration> {
    let now = chrono::Utc::now().timestamp_millis();
    (at_ms > now).then(|| Duration::from_millis((at_ms - now) as u64 + 10))
}
