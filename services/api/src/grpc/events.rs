//! `notify.v1.EventService`: the gateway stream (see `crate::events`).

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use notify_proto::v1::event_service_server::EventService;
use notify_proto::v1::{SubscribeRequest, SubscribeResponse};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::caller;
use crate::events::{Hub, Queued, TooManyUsers};
use crate::status::IntoStatus;
use crate::streams::StreamPermits;

/// The event service.
pub struct EventApi {
    hub: Hub,
    permits: StreamPermits,
    shutdown: CancellationToken,
}

impl EventApi {
    /// Creates the service; `shutdown` ends every stream with UNAVAILABLE.
    pub fn new(hub: Hub, shutdown: CancellationToken) -> Self {
        let per_client = hub.context().settings.events.max_streams_per_client;
        Self { hub, permits: StreamPermits::new("Subscribe", per_client), shutdown }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<SubscribeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl EventService for EventApi {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<Streaming<SubscribeRequest>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let caller = caller(&request)?;
        let permit = self.permits.acquire(&caller).into_status()?;
        let mut inbound = request.into_inner();
        let (stream, rx) = self.hub.open().await?;
        let hub = self.hub.clone();
        let shutdown = self.shutdown.clone();
        let settings = &hub.context().settings.events;
        let every = Duration::from_secs(settings.heartbeat_secs);
        let limit = settings.max_users_per_stream;
        tokio::spawn(async move {
            let _permit = permit;
            let mut heartbeats =
                tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            // A client may close its side after its last change and keep
            // reading.
            let mut reading = true;
            let end = loop {
                tokio::select! {
                    request = inbound.next(), if reading => match request {
                        Some(Ok(request)) => {
                            if let Err(status) = apply(&hub, &stream, &request, limit) {
                                break Some(status);
                            }
                        }
                        Some(Err(_)) => break None,
                        None => reading = false,
                    },
                    _ = heartbeats.tick() => stream.heartbeat(),
                    () = stream.finished() => break None,
                    () = shutdown.cancelled() => break Some(Status::unavailable(
                        "notify-api is draining; subscribe again",
                    )),
                }
            };
            if let Some(status) = end {
                metrics::counter!("notify_event_streams_ended_total", "code" => format!("{:?}", status.code())).increment(1);
                stream.end(status).await;
            }
            hub.close(&stream).await;
        });
        // A gRPC stream's snapshot is its resync: the loss marker is the edge's.
        let responses = ReceiverStream::new(rx).filter_map(|queued| {
            std::future::ready(match queued {
                Queued::Event { event, .. } => Some(Ok(SubscribeResponse { event: Some(*event) })),
                Queued::Lost => None,
                Queued::End(status) => Some(Err(*status)),
            })
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// Validates and applies one subscription change.
fn apply(
    hub: &Hub,
    stream: &crate::events::Stream,
    request: &SubscribeRequest,
    limit: usize,
) -> Result<(), Status> {
    for (field, ids) in
        [("add_user_ids", &request.add_user_ids), ("remove_user_ids", &request.remove_user_ids)]
    {
        if ids.contains(&0) {
            return Err(Status::invalid_argument(format!("{field}: user id must not be 0")));
        }
    }
    hub.change(stream, &request.add_user_ids, &request.remove_user_ids).map_err(
        |TooManyUsers { would_follow }| {
            Status::invalid_argument(format!(
                "add_user_ids: the stream would follow {would_follow} users, more than \
                 events.max_users_per_stream ({limit})"
            ))
        },
    )
}
