//! The gateway event stream: snapshots, then deltas, for followed users only;
//! coalescing for slow readers; resync after the bus was away; drain.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use notify_api::events::{BusSource, Queued};
use notify_proto::v1;
use notify_proto::v1::event_service_client::EventServiceClient;
use notify_proto::v1::subscribe_response::Event;
use notify_testkit::{TestApp, content, spawn_app, spawn_app_with, test_settings};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{send, send_request, wait_for_status};

/// One open `Subscribe` stream.
struct Subscriber {
    changes: mpsc::Sender<v1::SubscribeRequest>,
    events: tonic::Streaming<v1::SubscribeResponse>,
}

impl Subscriber {
    async fn open(channel: Channel, users: &[u64]) -> Self {
        let (changes, rx) = mpsc::channel(16);
        let mut client = EventServiceClient::new(channel);
        let events = client.subscribe(ReceiverStream::new(rx)).await.unwrap().into_inner();
        let subscriber = Self { changes, events };
        subscriber.add(users).await;
        subscriber
    }

    async fn add(&self, users: &[u64]) {
        let request = v1::SubscribeRequest { add_user_ids: users.to_vec(), ..Default::default() };
        self.changes.send(request).await.unwrap();
    }

    /// The next event other than a heartbeat (15 s at most).
    async fn next(&mut self) -> Event {
        loop {
            let item = tokio::time::timeout(Duration::from_secs(20), self.events.next()).await;
            let item = item.expect("an event within 20 s").expect("stream open");
            match item.expect("no error").event.expect("an event") {
                Event::Heartbeat(_) => continue,
                event => return event,
            }
        }
    }

    /// Reads events until `found` picks one; returns it and everything read.
    async fn until<T>(&mut self, mut found: impl FnMut(&Event) -> Option<T>) -> (T, Vec<Event>) {
        let mut seen = Vec::new();
        loop {
            let event = match tokio::time::timeout(Duration::from_secs(15), self.next()).await {
                Ok(event) => event,
                Err(_) => panic!("no awaited event within 15 s; read so far: {seen:?}"),
            };
            let picked = found(&event);
            seen.push(event);
            if let Some(picked) = picked {
                return (picked, seen);
            }
        }
    }

    /// Reads until every user of `users` had a snapshot; returns them.
    async fn snapshots(&mut self, users: &[u64]) -> HashMap<u64, v1::Snapshot> {
        let mut snapshots = HashMap::new();
        while users.iter().any(|u| !snapshots.contains_key(u)) {
            if let Event::Snapshot(snapshot) = self.next().await {
                snapshots.insert(snapshot.user_id, snapshot);
            }
        }
        snapshots
    }
}

fn delivered(event: &Event, user_id: u64, message_id: u64) -> bool {
    matches!(event, Event::ItemDelivered(i) if i.user_id == user_id && i.message_id == message_id)
}

fn badge_of(event: &Event, user_id: u64) -> Option<(u64, u64)> {
    match event {
        Event::BadgeChanged(b) if b.user_id == user_id => Some((b.unread, b.group_unread)),
        _ => None,
    }
}

async fn send_and_wait(app: &TestApp, users: Vec<u64>) -> u64 {
    let id = send(app, users).await;
    wait_for_status(app, id, v1::MessageStatus::Completed).await;
    id
}

async fn mark_read(app: &TestApp, user_id: u64, message_ids: Vec<u64>) {
    app.inbox().mark_read(v1::MarkReadRequest { user_id, message_ids }).await.unwrap();
}

#[tokio::test]
async fn snapshots_carry_the_counts_and_items_reach_their_recipients_only() {
    let app = spawn_app().await;
    let first = send_and_wait(&app, vec![1, 2]).await;
    mark_read(&app, 2, vec![first]).await;

    let mut stream = Subscriber::open(app.channel(), &[1, 2, 3]).await;
    let snapshots = stream.snapshots(&[1, 2, 3]).await;
    assert_eq!(snapshots[&1].unread, 1);
    let latest = snapshots[&1].latest.as_ref().expect("user 1 has an item");
    assert_eq!((latest.message_id, latest.title.as_str()), (first, "hello"));
    assert_eq!(snapshots[&2].unread, 0);
    assert_eq!(snapshots[&2].latest.as_ref().map(|l| l.message_id), Some(first));
    assert_eq!((snapshots[&3].unread, snapshots[&3].latest.clone()), (0, None));

    let second = send(&app, vec![1, 3, 4]).await;
    // Each user's item is queued before their badge; users in any order.
    let mut badged = HashSet::new();
    let (_, seen) = stream
        .until(|e| {
            if let Some((unread, _)) = badge_of(e, 1).or(badge_of(e, 3)) {
                let user = if badge_of(e, 1).is_some() { 1 } else { 3 };
                if unread == if user == 1 { 2 } else { 1 } {
                    badged.insert(user);
                }
            }
            (badged.len() == 2).then_some(())
        })
        .await;
    for user in [1, 3] {
        let item = seen.iter().find_map(|e| match e {
            Event::ItemDelivered(i) if i.user_id == user => Some(i),
            _ => None,
        });
        let item = item.unwrap_or_else(|| panic!("no item for user {user} in {seen:?}"));
        assert_eq!((item.message_id, item.title.as_str()), (second, "hello"));
        assert!(item.created_at.is_some());
    }
    // User 2 is followed but got nothing; user 4 got an item but is not followed.
    let marker = send(&app, vec![2]).await;
    let (_, seen) = stream.until(|e| delivered(e, 2, marker).then_some(())).await;
    assert!(
        seen.iter().all(|e| !matches!(e, Event::ItemDelivered(i) if i.user_id == 4 || (i.user_id == 2 && i.message_id != marker))),
        "{seen:?}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn badges_follow_mark_read_and_mark_all_read() {
    let app = spawn_app().await;
    let a = send_and_wait(&app, vec![5]).await;
    send_and_wait(&app, vec![5]).await;
    send_and_wait(&app, vec![5]).await;
    let mut stream = Subscriber::open(app.channel(), &[5]).await;
    assert_eq!(stream.snapshots(&[5]).await[&5].unread, 3);

    mark_read(&app, 5, vec![a]).await;
    stream.until(|e| badge_of(e, 5).filter(|b| b.0 == 2)).await;
    let request = v1::MarkAllReadRequest { user_id: 5, ..Default::default() };
    app.inbox().mark_all_read(request).await.unwrap();
    stream.until(|e| badge_of(e, 5).filter(|b| b.0 == 0)).await;
    app.cleanup().await;
}

#[tokio::test]
async fn group_messages_reach_subscribed_members_only_and_stop_after_removal() {
    let app = spawn_app().await;
    let mut groups = app.groups();
    let group_id = groups
        .create_group(v1::CreateGroupRequest { group_id: 0, name: "team".into() })
        .await
        .unwrap()
        .into_inner()
        .group_id;
    let members =
        v1::AddGroupMembersRequest { group_id, user_ids: vec![10, 11], with_history: false };
    groups.add_group_members(members).await.unwrap();
    let message = |key: &str| v1::SendGroupMessageRequest {
        group_id,
        sender: "tests".into(),
        idempotency_key: key.into(),
        content: Some(content(key)),
    };

    let mut stream = Subscriber::open(app.channel(), &[10, 11, 12]).await;
    stream.snapshots(&[10, 11, 12]).await;
    let first = groups.send_group_message(message("one")).await.unwrap().into_inner();
    // Each member's group event is queued before its badge refresh.
    let mut seen = Vec::new();
    let mut badged = HashSet::new();
    while badged.len() < 2 {
        let event = stream.next().await;
        if let Event::BadgeChanged(b) = &event
            && b.group_unread == 1
        {
            badged.insert(b.user_id);
        }
        seen.push(event);
    }
    assert_eq!(badged, HashSet::from([10, 11]), "{seen:?}");
    let got: HashSet<u64> = seen
        .iter()
        .filter_map(|e| match e {
            Event::GroupMessage(g) if g.group_id == group_id && g.seq == first.seq => {
                assert_eq!(g.message_id, first.message_id);
                Some(g.user_id)
            }
            _ => None,
        })
        .collect();
    assert_eq!(got, HashSet::from([10, 11]), "{seen:?}");

    let removal = v1::RemoveGroupMembersRequest { group_id, user_ids: vec![11] };
    groups.remove_group_members(removal).await.unwrap();
    let joining = v1::AddGroupMembersRequest { group_id, user_ids: vec![12], with_history: false };
    groups.add_group_members(joining).await.unwrap();
    let second = groups.send_group_message(message("two")).await.unwrap().into_inner();
    // Members 10 and 12 get it, in either order; 11 (removed) does not.
    let mut reached = HashSet::new();
    let mut seen = Vec::new();
    while reached.len() < 2 {
        let event = stream.next().await;
        if let Event::GroupMessage(g) = &event
            && g.seq == second.seq
        {
            assert_ne!(g.user_id, 11, "a removed member got a group message");
            reached.insert(g.user_id);
        }
        seen.push(event);
    }
    assert_eq!(reached, HashSet::from([10, 12]), "{seen:?}");
    app.cleanup().await;
}

#[tokio::test]
async fn announcements_reach_every_stream_and_cancelling_revokes_them() {
    let app = spawn_app().await;
    let mut one = Subscriber::open(app.channel(), &[20]).await;
    let mut two = Subscriber::open(app.channel(), &[21]).await;
    one.snapshots(&[20]).await;
    two.snapshots(&[21]).await;
    let request = v1::SendMessageRequest {
        sender: "platform".into(),
        content: Some(content("maintenance")),
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        ..Default::default()
    };
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    for (stream, user) in [(&mut one, 20), (&mut two, 21)] {
        stream.until(|e| delivered(e, user, id).then_some(())).await;
        stream.until(|e| badge_of(e, user).filter(|b| b.0 == 1)).await;
    }
    app.messages().cancel_message(v1::CancelMessageRequest { message_id: id }).await.unwrap();
    for (stream, user) in [(&mut one, 20), (&mut two, 21)] {
        stream
            .until(|e| matches!(e, Event::ItemRevoked(r) if r.message_id == id).then_some(()))
            .await;
        stream.until(|e| badge_of(e, user).filter(|b| b.0 == 0)).await;
    }
    app.cleanup().await;
}

#[tokio::test]
async fn a_subscribe_racing_a_delivery_loses_nothing() {
    let app = spawn_app().await;
    let users: Vec<u64> = (1..=3000).collect();
    let id = send(&app, users.clone()).await;
    let mut stream = Subscriber::open(app.channel(), &[]).await;
    // Users join in batches while the chunks are being applied.
    for batch in users.chunks(300) {
        stream.add(batch).await;
        tokio::task::yield_now().await;
    }
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    // Published after every chunk's event: once it is here, so are they.
    mark_read(&app, 1, vec![id]).await;
    let mut has_item: HashSet<u64> = HashSet::new();
    let mut snapshotted: HashSet<u64> = HashSet::new();
    let mut marker = false;
    while !marker || snapshotted.len() < users.len() {
        match stream.next().await {
            Event::Snapshot(s) => {
                snapshotted.insert(s.user_id);
                if s.latest.is_some_and(|l| l.message_id == id) {
                    has_item.insert(s.user_id);
                }
            }
            Event::ItemDelivered(i) if i.message_id == id => {
                has_item.insert(i.user_id);
            }
            Event::BadgeChanged(b) if b.user_id == 1 && b.unread == 0 => marker = true,
            _ => {}
        }
    }
    let missing: Vec<u64> = users.iter().copied().filter(|u| !has_item.contains(u)).collect();
    assert!(
        missing.is_empty(),
        "{} users never learned of their item: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    app.cleanup().await;
}

#[tokio::test]
async fn a_stalled_reader_gets_snapshots_later_and_other_streams_stay_on_time() {
    let app = spawn_app().await;
    let users: Vec<u64> = (1..=20).collect();
    let mut reader = Subscriber::open(app.channel(), &users).await;
    reader.snapshots(&users).await;
    // The stalled stream is held in-process, on a hub of its own with a
    // 64-event buffer: over gRPC, HTTP/2 flow control would buffer ahead of it.
    let mut settings = app.settings.clone();
    settings.events.stream_buffer = 64;
    let ctx = notify_core::Context::connect(settings).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let hub = notify_api::events::Hub::new(ctx, stop.clone(), BusSource::Exclusive);
    let (stalled, mut queued) = hub.open().await.unwrap();
    hub.change(&stalled, &users, &[]).unwrap();

    let sends = 6;
    for _ in 0..sends {
        let id = send(&app, users.clone()).await;
        let mut got = HashSet::new();
        while got.len() < users.len() {
            match reader.next().await {
                Event::ItemDelivered(i) if i.message_id == id => {
                    got.insert(i.user_id);
                }
                Event::Snapshot(s) => panic!("the reader was coalesced: {s:?}"),
                _ => {}
            }
        }
    }
    assert!(queued.len() <= 64, "{} events queued for the stalled stream", queued.len());

    // Once it reads, every user's state (snapshot, then deltas) comes to the
    // final count, through snapshots that replaced the dropped events.
    let mut unread: HashMap<u64, u64> = HashMap::new();
    let mut snapshots: HashMap<u64, u32> = HashMap::new();
    while unread.len() < users.len() || unread.values().any(|u| *u != sends) {
        let next = tokio::time::timeout(Duration::from_secs(20), queued.recv()).await;
        let event = match next.expect("an event within 20 s").expect("open") {
            Queued::Event { event, .. } => *event,
            Queued::Lost => continue,
            Queued::End(status) => panic!("the stream ended: {status}"),
        };
        match event {
            Event::Snapshot(s) => {
                *snapshots.entry(s.user_id).or_default() += 1;
                unread.insert(s.user_id, s.unread);
            }
            Event::BadgeChanged(b) if unread.contains_key(&b.user_id) => {
                unread.insert(b.user_id, b.unread);
            }
            _ => {}
        }
    }
    assert!(snapshots.values().any(|n| *n > 1), "nothing was coalesced: {snapshots:?}");
    hub.close(&stalled).await;
    stop.cancel();
    app.cleanup().await;
}

#[tokio::test]
async fn streams_resync_after_the_bus_connection_is_lost() {
    let mut settings = test_settings();
    let proxies = notify_testkit::faults::route_through_proxies(&mut settings).await;
    let app = spawn_app_with(settings, true).await;
    let mut stream = Subscriber::open(app.channel(), &[30]).await;
    stream.snapshots(&[30]).await;
    proxies.rabbitmq.reset_connections().await;
    // Fresh snapshots after the consumer is back; deltas flow again.
    stream.snapshots(&[30]).await;
    let id = send(&app, vec![30]).await;
    stream.until(|e| delivered(e, 30, id).then_some(())).await;
    app.cleanup().await;
}

#[tokio::test]
async fn draining_ends_streams_with_unavailable() {
    let app = spawn_app().await;
    let replica = app.spawn_api_replica().await;
    let mut stream = Subscriber::open(replica.channel(), &[40]).await;
    stream.snapshots(&[40]).await;
    let stopping = tokio::spawn(replica.stop());
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(15), stream.events.next()).await {
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(status))) => break status,
            other => panic!("the stream ended without a status: {other:?}"),
        }
    };
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
    assert!(end.message().contains("draining"), "{end:?}");
    stopping.await.unwrap();
    app.cleanup().await;
}

#[tokio::test]
async fn bad_subscriptions_are_refused_naming_the_field() {
    let mut settings = test_settings();
    settings.events.max_users_per_stream = 3;
    let app = spawn_app_with(settings, false).await;
    for (users, words) in [
        (vec![0], "add_user_ids: user id must not be 0"),
        (vec![1, 2, 3, 4], "events.max_users_per_stream"),
    ] {
        let mut stream = Subscriber::open(app.channel(), &users).await;
        let status = loop {
            match tokio::time::timeout(Duration::from_secs(15), stream.events.next()).await {
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(status))) => break status,
                other => panic!("no error for {users:?}: {other:?}"),
            }
        };
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(words), "{status:?}");
    }
    app.cleanup().await;
}

#[tokio::test]
async fn item_updates_are_one_event_per_call_with_both_counts() {
    let app = spawn_app().await;
    let (user, muter) = (8_100_001, 8_100_002);
    let first = send_and_wait(&app, vec![user]).await;
    let second = send_and_wait(&app, vec![user]).await;
    let mut stream = Subscriber::open(app.channel(), &[user, muter]).await;
    let snapshots = stream.snapshots(&[user, muter]).await;
    assert_eq!((snapshots[&user].unread, snapshots[&user].unseen), (2, 2));

    // One id: the item and the states the action set, then the badge.
    let request = v1::UpdateItemsRequest {
        user_id: user,
        action: v1::ItemAction::MarkSeen as i32,
        message_ids: vec![second],
        all: None,
    };
    app.inbox().update_items(request).await.unwrap();
    let (updated, _) = stream
        .until(|e| match e {
            Event::ItemUpdated(u) if u.user_id == user => Some(u.clone()),
            _ => None,
        })
        .await;
    assert_eq!(updated.message_id, second);
    assert_eq!(
        (updated.seen, updated.read, updated.archived, updated.deleted),
        (Some(true), None, None, None)
    );
    let (badge, _) = stream
        .until(|e| match e {
            Event::BadgeChanged(b) if b.user_id == user => Some(*b),
            _ => None,
        })
        .await;
    assert_eq!((badge.unread, badge.unseen), (2, 1));

    // Every item: ONE event naming the filter, never one per item.
    let all = v1::ItemFilter { view: v1::InboxView::Inbox as i32, ..Default::default() };
    let request = v1::UpdateItemsRequest {
        user_id: user,
        action: v1::ItemAction::Delete as i32,
        message_ids: Vec::new(),
        all: Some(all.clone()),
    };
    app.inbox().update_items(request).await.unwrap();
    let (badge, seen) = stream
        .until(|e| match e {
            Event::BadgeChanged(b) if b.user_id == user && b.unread == 0 => Some(*b),
            _ => None,
        })
        .await;
    assert_eq!(badge.unseen, 0);
    let updates: Vec<&v1::ItemUpdated> = seen
        .iter()
        .filter_map(|e| match e {
            Event::ItemUpdated(u) => Some(u),
            _ => None,
        })
        .collect();
    assert_eq!(updates.len(), 1, "one event for the call: {seen:?}");
    assert_eq!((updates[0].message_id, updates[0].all.as_ref()), (0, Some(&all)));
    assert_eq!(updates[0].deleted, Some(true));
    assert_eq!(updates[0].action, v1::ItemAction::Delete as i32);
    let _ = first;

    // A muted recipient gets no item event (and no item).
    let preferences =
        v1::Preferences { muted_categories: vec!["system".into()], ..Default::default() };
    let request = v1::SetPreferencesRequest { user_id: muter, preferences: Some(preferences) };
    app.inbox().set_preferences(request).await.unwrap();
    let muted = send_and_wait(&app, vec![muter, user]).await;
    let marker = send(&app, vec![muter]).await;
    let mut critical = send_request(vec![muter]);
    critical.critical = true;
    let critical = app.messages().send_message(critical).await.unwrap().into_inner().message_id;
    let (_, seen) = stream.until(|e| delivered(e, muter, critical).then_some(())).await;
    assert!(
        !seen.iter().any(|e| delivered(e, muter, muted) || delivered(e, muter, marker)),
        "{seen:?}"
    );
    assert!(seen.iter().any(|e| delivered(e, user, muted)));
    app.cleanup().await;
}

#[tokio::test]
async fn a_recall_revokes_the_item_on_streams_and_an_edit_updates_it() {
    let app = spawn_app().await;
    let user = 8_200_001;
    let id = send_and_wait(&app, vec![user]).await;
    let mut stream = Subscriber::open(app.channel(), &[user]).await;
    let snapshots = stream.snapshots(&[user]).await;
    assert_eq!(snapshots[&user].unread, 1);

    let mut edited = content("fixed");
    edited.category = "system".into();
    let request = v1::EditMessageRequest { message_id: id, content: Some(edited) };
    app.messages().edit_message(request).await.unwrap();
    let (update, _) = stream
        .until(|e| match e {
            Event::ItemUpdated(u) if u.message_id == id => Some(u.clone()),
            _ => None,
        })
        .await;
    assert_eq!((update.user_id, update.title.as_str()), (0, "fixed"));
    assert!(update.edited_at.is_some());

    app.messages().recall_message(v1::RecallMessageRequest { message_id: id }).await.unwrap();
    stream.until(|e| matches!(e, Event::ItemRevoked(r) if r.message_id == id).then_some(())).await;
    stream
        .until(|e| match e {
            Event::BadgeChanged(b) if b.user_id == user && b.unread == 0 => Some(()),
            _ => None,
        })
        .await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_recalled_group_message_is_revoked_once_per_members_stream_and_their_badges_drop() {
    let app = spawn_app().await;
    let mut groups = app.groups();
    let request = v1::CreateGroupRequest { group_id: 0, name: "recalled".into() };
    let group_id = groups.create_group(request).await.unwrap().into_inner().group_id;
    let (first, second, outsider) = (8_300_001, 8_300_002, 8_300_003);
    let members =
        v1::AddGroupMembersRequest { group_id, user_ids: vec![first, second], with_history: false };
    groups.add_group_members(members).await.unwrap();
    let message = v1::SendGroupMessageRequest {
        group_id,
        sender: "tests".into(),
        idempotency_key: String::new(),
        content: Some(content("oops")),
    };
    let sent = groups.send_group_message(message).await.unwrap().into_inner();
    // One stream follows both members, another only a non-member.
    let mut stream = Subscriber::open(app.channel(), &[first, second]).await;
    let snapshots = stream.snapshots(&[first, second]).await;
    assert_eq!(snapshots[&first].group_unread, 1);
    let mut elsewhere = Subscriber::open(app.channel(), &[outsider]).await;
    elsewhere.snapshots(&[outsider]).await;

    let recall = v1::RecallGroupMessageRequest { group_id, seq: sent.seq };
    groups.recall_group_message(recall).await.unwrap();
    let mut dropped = HashSet::new();
    let (_, seen) = stream
        .until(|e| {
            if let Some((_, 0)) = badge_of(e, first) {
                dropped.insert(first);
            }
            if let Some((_, 0)) = badge_of(e, second) {
                dropped.insert(second);
            }
            (dropped.len() == 2).then_some(())
        })
        .await;
    let revoked = seen
        .iter()
        .filter(|e| matches!(e, Event::ItemRevoked(r) if r.message_id == sent.message_id))
        .count();
    assert_eq!(revoked, 1, "once per stream: {seen:?}");
    // The other stream learns nothing of it: events reach a stream in bus
    // order, so a later delivery to its user comes with nothing before it.
    let id = send_and_wait(&app, vec![outsider]).await;
    let (_, seen) = elsewhere.until(|e| delivered(e, outsider, id).then_some(())).await;
    assert!(!seen.iter().any(|e| matches!(e, Event::ItemRevoked(_))), "{seen:?}");
    app.cleanup().await;
}

/// Item updates, preference changes and group acks made on a replica whose
/// broker went away after their commits: their events were recorded with
/// the changes, and a worker's relay publishes them, so a gateway on
/// another replica ends with every user's exact badge though that replica
/// never lost the bus (nothing made it send fresh snapshots).
#[tokio::test]
async fn events_a_replica_could_not_publish_reach_gateways_through_the_relay() {
    let mut settings = test_settings();
    settings.events.outbox_retry_ms = 300;
    let app = spawn_app_with(settings, true).await;
    let users: Vec<u64> = (6_300_001..=6_300_020).collect();
    let mut sends = Vec::new();
    for _ in 0..4 {
        sends.push(send(&app, users.clone()).await);
    }
    for id in &sends {
        wait_for_status(&app, *id, v1::MessageStatus::Completed).await;
    }
    let mut gateway = Subscriber::open(app.channel(), &users).await;
    let snapshots = gateway.snapshots(&users).await;
    assert!(snapshots.values().all(|snapshot| snapshot.unread == 4));

    let mut cut = app.settings.clone();
    let broker = notify_testkit::faults::FaultProxy::start("rabbitmq", "127.0.0.1:5672").await;
    cut.rabbitmq.url = format!("amqp://guest:guest@{}/%2f", broker.addr()).into();
    let replica = app.spawn_api_replica_with(cut).await;
    broker.down().await;
    let mut inbox = v1::inbox_service_client::InboxServiceClient::new(replica.channel());
    for (index, user) in users.iter().enumerate() {
        let read = sends[..=index % sends.len()].to_vec();
        let request = v1::MarkReadRequest { user_id: *user, message_ids: read };
        inbox.mark_read(request).await.expect("the write commits, the broker away or not");
    }
    // Every gateway event now comes from the relay: the replica that made
    // the changes could publish none of them.
    let expected: HashMap<u64, u64> = {
        let mut expected = HashMap::new();
        for user in &users {
            expected.insert(*user, app.unread_truth(*user).await);
        }
        expected
    };
    assert!(expected.values().any(|unread| *unread < 4), "precondition: badges changed");
    let mut last: HashMap<u64, u64> = HashMap::new();
    gateway
        .until(|event| {
            if let Event::BadgeChanged(badge) = event {
                last.insert(badge.user_id, badge.unread);
            }
            (users.iter().all(|user| last.get(user) == expected.get(user))).then_some(())
        })
        .await;
    replica.stop().await;
    app.cleanup().await;
}
