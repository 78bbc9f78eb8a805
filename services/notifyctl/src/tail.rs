//! `notifyctl tail`: follows users on the gateway event stream and prints
//! each event as it arrives, one line each.

use futures::StreamExt as _;
use notify_proto::v1;
use notify_proto::v1::event_service_client::EventServiceClient;
use notify_proto::v1::subscribe_response::Event;

use crate::connect::Api;
use crate::inbox::rfc3339;

/// Subscribes to `user_ids` and prints events until the stream ends (or
/// Ctrl-C).
pub async fn tail(channel: Api, user_ids: Vec<u64>) -> anyhow::Result<()> {
    let request = v1::SubscribeRequest { add_user_ids: user_ids, ..Default::default() };
    // The request side stays open: closing it is fine too, but a gateway
    // would keep sending changes on it.
    let requests = futures::stream::iter([request]).chain(futures::stream::pending());
    let mut events = EventServiceClient::new(channel).subscribe(requests).await?.into_inner();
    loop {
        tokio::select! {
            next = events.next() => match next {
                Some(Ok(response)) => {
                    if let Some(event) = response.event {
                        println!("{}", line(&event));
                    }
                }
                Some(Err(status)) => {
                    anyhow::bail!("stream ended: {}: {}", status.code(), status.message())
                }
                None => return Ok(()),
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// One event as a line of text.
pub fn line(event: &Event) -> String {
    match event {
        Event::Snapshot(s) => {
            let latest = s
                .latest
                .as_ref()
                .map(|l| {
                    format!(" latest {} {:?} {}", l.message_id, l.title, rfc3339(l.created_at))
                })
                .unwrap_or_default();
            format!(
                "snapshot  user {} unread {} unseen {} group_unread {}{latest}",
                s.user_id, s.unread, s.unseen, s.group_unread
            )
        }
        Event::ItemDelivered(i) => format!(
            "item      user {} message {} {:?} category {:?} {}",
            i.user_id,
            i.message_id,
            i.title,
            i.category,
            rfc3339(i.created_at)
        ),
        Event::BadgeChanged(b) => {
            format!(
                "badge     user {} unread {} unseen {} group_unread {}",
                b.user_id, b.unread, b.unseen, b.group_unread
            )
        }
        Event::GroupMessage(g) => format!(
            "group     user {} group {} seq {} message {}",
            g.user_id, g.group_id, g.seq, g.message_id
        ),
        Event::ItemRevoked(r) => format!("revoked   message {}", r.message_id),
        Event::Heartbeat(h) => format!("heartbeat {}", rfc3339(h.at)),
        Event::ItemUpdated(u) => {
            let target = match (&u.all, u.message_id) {
                (Some(all), _) => format!("all {all:?}"),
                (None, 0) => format!("messages {:?}", u.message_ids),
                (None, id) => format!("message {id}"),
            };
            let states: Vec<String> = [
                ("seen", u.seen),
                ("read", u.read),
                ("archived", u.archived),
                ("deleted", u.deleted),
            ]
            .into_iter()
            .filter_map(|(name, state)| state.map(|state| format!("{name}={state}")))
            .collect();
            format!("updated   user {} {target} {}", u.user_id, states.join(" "))
        }
    }
}
