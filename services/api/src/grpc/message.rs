//! `notify.v1.MessageService`: sends to user lists and their lifecycle.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use notify_cache::quota::Quotas;
use notify_core::Context;
use notify_core::audit::Target;
use notify_core::send::{self, MessageView};
use notify_core::{edit, recall};
use notify_domain::Error;
use notify_domain::auth::Caller;
use notify_domain::domain::{self, AudienceKind, MessageId, Recipients};
use notify_proto::v1;
use notify_proto::v1::message_service_server::MessageService;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{audit, recipients};
use crate::auth::{Guard, caller};
use crate::convert::{self, SendFields};
use crate::status::IntoStatus;
use crate::streams::StreamPermits;

const DRAFT_FLOW_HINT: &str =
    "; use CreateMessage, AppendRecipients and StartMessage for larger sends";
const DEFAULT_LIST_PAGE: u32 = 20;
const MAX_LIST_PAGE: u32 = 100;

/// Implements `MessageService` over the shared [`Context`].
#[derive(Clone)]
pub struct MessageApi {
    ctx: Context,
    guard: Arc<Guard>,
    watches: StreamPermits,
    shutdown: CancellationToken,
}

impl MessageApi {
    /// Creates the service; `shutdown` ends open watch streams.
    pub fn new(ctx: Context, guard: Arc<Guard>, shutdown: CancellationToken) -> Self {
        let watches =
            StreamPermits::new("WatchMessage", ctx.settings.api.max_watch_streams_per_client);
        Self { ctx, guard, watches, shutdown }
    }

    fn quotas(&self) -> &Quotas {
        self.guard.quotas()
    }

    /// Runs a lifecycle transition for `caller` and records it. Both run
    /// to the end in a task of their own: a caller that hangs up (or whose
    /// deadline passes) mid-call drops this handler, never a transition
    /// without its audit record.
    async fn lifecycle<F, Fut>(
        &self,
        caller: &Caller,
        action: &'static str,
        raw_id: u64,
        transition: F,
    ) -> Result<Response<v1::Message>, Status>
    where
        F: FnOnce(Context, MessageId, Option<String>) -> Fut,
        Fut: Future<Output = notify_domain::Result<MessageView>> + Send + 'static,
    {
        let id = message_id(raw_id)?;
        let owner = caller.sends_owner_filter().map(str::to_owned);
        let ctx = self.ctx.clone();
        let caller = caller.clone();
        let running = transition(ctx.clone(), id, owner);
        let result = tokio::spawn(async move {
            let result = running.await;
            audit(&ctx, &caller, action, Target::Message(id.get()), &result, String::new()).await;
            result
        })
        .await
        .map_err(|e| Status::internal(format!("{action} did not finish: {e}")))?;
        reply(result)
    }
}

fn message_id(raw: u64) -> Result<MessageId, Status> {
    MessageId::parse(raw, "message_id").into_status()
}

fn reply(view: notify_domain::Result<MessageView>) -> Result<Response<v1::Message>, Status> {
    view.and_then(convert::message_to_proto).map(Response::new).into_status()
}

#[tonic::async_trait]
impl MessageService for MessageApi {
    #[instrument(skip_all, fields(sender = %request.get_ref().sender))]
    async fn send_message(
        &self,
        request: Request<v1::SendMessageRequest>,
    ) -> Result<Response<v1::SendMessageResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let limits = &self.ctx.settings.send;
        let (audience, recipients) = match req.audience {
            Some(v1::send_message_request::Audience::Users(users)) => {
                let recipients = convert::recipients(
                    &users.user_ids,
                    users.recipients,
                    limits.max_inline_recipients,
                    "audience.users",
                    DRAFT_FLOW_HINT,
                )
                .into_status()?;
                (AudienceKind::Users, Some(recipients))
            }
            Some(v1::send_message_request::Audience::AllUsers(_)) => (AudienceKind::AllUsers, None),
            None => {
                return Err(Error::invalid("audience", "must be set to users or all_users"))
                    .into_status();
            }
        };
        let fields = SendFields {
            sender: req.sender,
            idempotency_key: req.idempotency_key,
            content: req.content,
            priority: req.priority,
            send_at: req.send_at,
            expire_at: req.expire_at,
            critical: req.critical,
        };
        let new_send =
            convert::new_send(&caller, fields, audience, limits.send_at_past_tolerance_secs)
                .into_status()?;
        let count = recipients.as_ref().map_or(0, Recipients::len);
        let (action, result) = match recipients {
            None => {
                let sent = match self.quotas().admit_announcement(&caller).await {
                    Ok(()) => notify_core::announce::send(&self.ctx, &new_send).await,
                    Err(e) => Err(e),
                };
                ("announcement.send", sent)
            }
            Some(recipients) => {
                let sent = match self.quotas().admit_recipients(&caller, count as u64).await {
                    Ok(()) => send::send_to_users(&self.ctx, &new_send, recipients).await,
                    Err(e) => Err(e),
                };
                ("message.send", sent)
            }
        };
        let target =
            result.as_ref().map_or(Target::None, |(c, _)| Target::Message(c.message_id.get()));
        let detail = match &result {
            Ok((created, _)) if created.deduplicated => "deduplicated".to_owned(),
            _ if audience == AudienceKind::Users => format!("recipients={count}"),
            _ => String::new(),
        };
        audit(&self.ctx, &caller, action, target, &result, detail).await;
        let (created, status) = result.into_status()?;
        Ok(Response::new(v1::SendMessageResponse {
            message_id: created.message_id.get(),
            status: convert::status_to_proto(status) as i32,
            deduplicated: created.deduplicated,
        }))
    }

    #[instrument(skip_all, fields(sender = %request.get_ref().sender))]
    async fn create_message(
        &self,
        request: Request<v1::CreateMessageRequest>,
    ) -> Result<Response<v1::CreateMessageResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let fields = SendFields {
            sender: req.sender,
            idempotency_key: req.idempotency_key,
            content: req.content,
            priority: req.priority,
            send_at: req.send_at,
            expire_at: req.expire_at,
            critical: req.critical,
        };
        let tolerance = self.ctx.settings.send.send_at_past_tolerance_secs;
        let new_send =
            convert::new_send(&caller, fields, AudienceKind::Users, tolerance).into_status()?;
        let result = send::create(&self.ctx, &new_send).await;
        let target = result.as_ref().map_or(Target::None, |c| Target::Message(c.message_id.get()));
        audit(&self.ctx, &caller, "message.create", target, &result, String::new()).await;
        let created = result.into_status()?;
        Ok(Response::new(v1::CreateMessageResponse {
            message_id: created.message_id.get(),
            deduplicated: created.deduplicated,
        }))
    }

    #[instrument(skip_all, fields(message_id = request.get_ref().message_id, batch = request.get_ref().batch_number))]
    async fn append_recipients(
        &self,
        request: Request<v1::AppendRecipientsRequest>,
    ) -> Result<Response<v1::AppendRecipientsResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let id = message_id(req.message_id)?;
        if req.batch_number == 0 || req.batch_number > send::plan::MAX_BATCH_NUMBER {
            return Err(Error::invalid(
                "batch_number",
                &format!("must be in 1..={}", send::plan::MAX_BATCH_NUMBER),
            ))
            .into_status();
        }
        let recipients = convert::recipients(
            &req.user_ids,
            req.recipients,
            self.ctx.settings.send.max_batch_recipients,
            "",
            "; split the list into more batches",
        )
        .into_status()?;
        self.quotas().admit_recipients(&caller, recipients.len() as u64).await.into_status()?;
        let owner = caller.sends_owner_filter();
        let appended =
            send::append(&self.ctx, id, owner, req.batch_number, recipients).await.into_status()?;
        Ok(Response::new(v1::AppendRecipientsResponse {
            message_id: id.get(),
            batch_number: req.batch_number,
            accepted: appended.accepted,
            duplicate_batch: appended.duplicate_batch,
        }))
    }

    async fn start_message(
        &self,
        request: Request<v1::StartMessageRequest>,
    ) -> Result<Response<v1::Message>, Status> {
        let caller = caller(&request)?;
        self.lifecycle(
            &caller,
            "message.start",
            request.into_inner().message_id,
            |ctx, id, owner| async move { send::start(&ctx, id, owner.as_deref()).await },
        )
        .await
    }

    async fn get_message(
        &self,
        request: Request<v1::GetMessageRequest>,
    ) -> Result<Response<v1::Message>, Status> {
        let caller = caller(&request)?;
        let id = message_id(request.into_inner().message_id)?;
        reply(send::get(&self.ctx, id, caller.sends_owner_filter()).await)
    }

    type WatchMessageStream = Pin<Box<dyn Stream<Item = Result<v1::Message, Status>> + Send>>;

    async fn watch_message(
        &self,
        request: Request<v1::WatchMessageRequest>,
    ) -> Result<Response<Self::WatchMessageStream>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let id = message_id(req.message_id)?;
        let interval_ms = match req.interval_ms {
            0 => 500,
            ms @ 100..=60_000 => ms,
            _ => {
                return Err(Error::invalid("interval_ms", "must be 0 (default) or in 100..=60000"))
                    .into_status();
            }
        };
        // Fail fast on an unknown id instead of opening an empty stream.
        let owner = caller.sends_owner_filter();
        let first = send::get(&self.ctx, id, owner)
            .await
            .and_then(convert::message_to_proto)
            .into_status()?;
        let permit = self.watches.acquire(&caller).into_status()?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let ctx = self.ctx.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut last = first;
            if tx.send(Ok(last.clone())).await.is_err() {
                return;
            }
            let mut ticker = tokio::time::interval(Duration::from_millis(u64::from(interval_ms)));
            while !is_final(&last) {
                tokio::select! {
                    _ = ticker.tick() => {}
                    () = tx.closed() => return,
                    () = shutdown.cancelled() => return,
                }
                // Ownership was checked when the watch opened.
                let next = send::get(&ctx, id, None).await.and_then(convert::message_to_proto);
                match next {
                    Ok(message) if message == last => {}
                    Ok(message) => {
                        if tx.send(Ok(message.clone())).await.is_err() {
                            return;
                        }
                        last = message;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(crate::status::to_status(e))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn pause_message(
        &self,
        request: Request<v1::PauseMessageRequest>,
    ) -> Result<Response<v1::Message>, Status> {
        let caller = caller(&request)?;
        let raw_id = request.into_inner().message_id;
        self.lifecycle(&caller, "message.pause", raw_id, |ctx, id, owner| async move {
            send::pause(&ctx, id, owner.as_deref()).await
        })
        .await
    }

    async fn resume_message(
        &self,
        request: Request<v1::ResumeMessageRequest>,
    ) -> Result<Response<v1::Message>, Status> {
        let caller = caller(&request)?;
        let raw_id = request.into_inner().message_id;
        self.lifecycle(&caller, "message.resume", raw_id, |ctx, id, owner| async move {
            send::resume(&ctx, id, owner.as_deref()).await
        })
        .await
    }

    async fn cancel_message(
        &self,
        request: Request<v1::CancelMessageRequest>,
    ) -> Result<Response<v1::Message>, Status> {
        let caller = caller(&request)?;
        let raw_id = request.into_inner().message_id;
        self.lifecycle(&caller, "message.cancel", raw_id, |ctx, id, owner| async move {
            send::cancel(&ctx, id, owner.as_deref()).await
        })
        .await
    }

    async fn redrive_message(
        &self,
        request: Request<v1::RedriveMessageRequest>,
    ) -> Result<Response<v1::Message>, Status> {
        let caller = caller(&request)?;
        let raw_id = request.into_inner().message_id;
        self.lifecycle(&caller, "message.redrive", raw_id, |ctx, id, owner| async move {
            send::redrive(&ctx, id, owner.as_deref()).await
        })
        .await
    }

    async fn list_messages(
        &self,
        request: Request<v1::ListMessagesRequest>,
    ) -> Result<Response<v1::ListMessagesResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let owner = caller.sends_owner_filter();
        let sender =
            if req.sender.is_empty() { caller.default_sender().to_owned() } else { req.sender };
        domain::validate_sender(&sender, "sender").into_status()?;
        let page_size = match req.page_size {
            0 => DEFAULT_LIST_PAGE,
            n @ 1..=MAX_LIST_PAGE => n,
            _ => {
                return Err(Error::invalid(
                    "page_size",
                    &format!("must be at most {MAX_LIST_PAGE}"),
                ))
                .into_status();
            }
        };
        let before =
            notify_core::inbox::decode_cursor(&req.page_token, "page_token").into_status()?;
        let views =
            send::list(&self.ctx, &sender, owner, before, page_size + 1).await.into_status()?;
        let has_more = views.len() > page_size as usize;
        let messages = views
            .into_iter()
            .take(page_size as usize)
            .map(convert::message_to_proto)
            .collect::<Result<Vec<_>, _>>()
            .into_status()?;
        let next_page_token = if has_more {
            messages
                .last()
                .map(|m| notify_core::inbox::encode_cursor(m.message_id))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(v1::ListMessagesResponse { messages, next_page_token }))
    }

    #[instrument(skip_all, fields(message_id = request.get_ref().message_id))]
    async fn list_recipients(
        &self,
        request: Request<v1::ListRecipientsRequest>,
    ) -> Result<Response<v1::ListRecipientsResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let id = message_id(req.message_id)?;
        let filter = recipients::filter(req.state, "state").into_status()?;
        let owner = caller.sends_owner_filter();
        let page = notify_core::recipients::list(
            &self.ctx,
            id,
            owner,
            filter,
            req.page_size,
            &req.page_token,
        )
        .await
        .into_status()?;
        Ok(Response::new(v1::ListRecipientsResponse {
            recipients: page.recipients.into_iter().map(recipients::recipient_to_proto).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    #[instrument(skip_all, fields(message_id = request.get_ref().message_id))]
    async fn get_recipient_status(
        &self,
        request: Request<v1::GetRecipientStatusRequest>,
    ) -> Result<Response<v1::GetRecipientStatusResponse>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let id = message_id(req.message_id)?;
        let owner = caller.sends_owner_filter();
        let found = notify_core::recipients::status(&self.ctx, id, owner, &req.user_ids)
            .await
            .into_status()?;
        Ok(Response::new(v1::GetRecipientStatusResponse {
            recipients: found.into_iter().map(recipients::recipient_to_proto).collect(),
        }))
    }

    #[instrument(skip_all, fields(message_id = request.get_ref().message_id))]
    async fn recall_message(
        &self,
        request: Request<v1::RecallMessageRequest>,
    ) -> Result<Response<v1::Message>, Status> {
        let caller = caller(&request)?;
        let raw_id = request.into_inner().message_id;
        self.lifecycle(&caller, "message.recall", raw_id, |ctx, id, owner| async move {
            recall::recall(&ctx, id, owner.as_deref()).await
        })
        .await
    }

    #[instrument(skip_all, fields(message_id = request.get_ref().message_id))]
    async fn edit_message(
        &self,
        request: Request<v1::EditMessageRequest>,
    ) -> Result<Response<v1::Message>, Status> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let id = message_id(req.message_id)?;
        let content = convert::content(req.content, "content").into_status()?;
        let owner = caller.sends_owner_filter();
        let result = edit::edit(&self.ctx, id, owner, &content).await;
        // The record keeps the title it replaced.
        let detail = result
            .as_ref()
            .map(|edited| format!("previous title: {:?}", edited.previous_title))
            .unwrap_or_default();
        audit(&self.ctx, &caller, "message.edit", Target::Message(id.get()), &result, detail).await;
        reply(result.map(|edited| edited.view))
    }
}

fn is_final(message: &v1::Message) -> bool {
    // A cancel, recall or edit is over once every shard's part is done.
    if !message.pending_operations.is_empty() {
        return false;
    }
    match v1::MessageStatus::try_from(message.status) {
        Ok(v1::MessageStatus::Completed | v1::MessageStatus::Cancelled) => true,
        // A recall is over once every chunk's items are taken back.
        Ok(v1::MessageStatus::Recalled) => message.finished_at.is_some(),
        _ => false,
    }
}
