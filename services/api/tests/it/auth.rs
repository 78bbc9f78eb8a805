//! Callers: credentials, the scope of every RPC, ownership of sends, limits
//! shared by replicas, the audit log, and the api's refusal to listen beyond
//! loopback without authentication.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut};
use notify_api::auth::policy::{self, Requirement};
use notify_domain::auth::Scope;
use notify_proto::v1;
use notify_proto::v1::admin_service_client::AdminServiceClient;
use notify_proto::v1::event_service_client::EventServiceClient;
use notify_proto::v1::group_service_client::GroupServiceClient;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_testkit::{
    AuthedChannel, TestApp, authed, eventually, send_request, spawn_app_with, test_settings,
    with_clients,
};
use prost::Message as _;
use tokio_stream::StreamExt;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

use crate::helpers::content;

/// Passes request and response messages through as raw bytes, so a test
/// can call any method by its path.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let bytes = src.chunk().to_vec();
        src.advance(bytes.len());
        Ok(Some(bytes))
    }
}

/// Calls `path` with an empty (all-default) request message; returns the
/// status the call ended with (OK when the first response arrived).
async fn call_raw(
    channel: &Channel,
    path: &str,
    streaming: (bool, bool),
    token: Option<&str>,
) -> Status {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let path =
        http::uri::PathAndQuery::from_maybe_shared(path.to_owned().into_bytes()).expect("path");
    let with_token = |request| with_bearer(request, token);
    let ended = match streaming {
        (false, false) => grpc
            .unary(with_token(tonic::Request::new(Vec::new())), path, RawCodec)
            .await
            .map(|_| ()),
        (false, true) => {
            match grpc
                .server_streaming(with_token(tonic::Request::new(Vec::new())), path, RawCodec)
                .await
            {
                Ok(response) => {
                    response.into_inner().next().await.unwrap_or(Ok(Vec::new())).map(|_| ())
                }
                Err(status) => Err(status),
            }
        }
        (true, _) => {
            let messages = tokio_stream::iter(vec![Vec::new()]);
            let request = with_bearer(tonic::Request::new(messages), token);
            match grpc.streaming(request, path, RawCodec).await {
                Ok(response) => {
                    response.into_inner().next().await.unwrap_or(Ok(Vec::new())).map(|_| ())
                }
                Err(status) => Err(status),
            }
        }
    };
    ended.err().unwrap_or_else(|| Status::ok(""))
}

/// Adds `authorization: Bearer <token>` when there is a token.
fn with_bearer<T>(mut request: tonic::Request<T>, token: Option<&str>) -> tonic::Request<T> {
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("ascii token");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// Every method of every service the api's descriptor set describes.
fn described_methods() -> Vec<(String, (bool, bool))> {
    let set = prost_types::FileDescriptorSet::decode(notify_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut methods = Vec::new();
    for file in set.file {
        for service in &file.service {
            for method in &service.method {
                let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                methods.push((path, (method.client_streaming(), method.server_streaming())));
            }
        }
    }
    methods
}

/// The scope a method's rule names (SendMessage with an empty request goes
/// to users: `send`).
fn required_scope(path: &str) -> Scope {
    let rule = policy::rule_for(path)
        .unwrap_or_else(|| panic!("{path} has no rule in notify_api::auth::policy"));
    match rule.requirement {
        Requirement::Scope(scope) => scope,
        Requirement::SendByAudience => Scope::Send,
        other => panic!("{path} must need a scope, it is {other:?}"),
    }
}

#[tokio::test]
async fn every_rpc_needs_its_scope_and_refuses_every_other() {
    let mut settings = test_settings();
    let mut clients: Vec<(String, Vec<&str>)> = Vec::new();
    for scope in Scope::ALL {
        clients.push((format!("only-{scope}"), vec![scope.name()]));
        let others = Scope::ALL.iter().filter(|s| **s != scope && **s != Scope::Admin);
        clients.push((format!("all-but-{scope}"), others.map(|s| s.name()).collect()));
    }
    let entries: Vec<(&str, &[&str])> =
        clients.iter().map(|(name, scopes)| (name.as_str(), scopes.as_slice())).collect();
    let tokens = with_clients(&mut settings, &entries);
    let app = spawn_app_with(settings, false).await;
    let channel = app.channel();

    let methods = described_methods();
    assert!(methods.len() >= policy::RULES.len(), "{methods:?}");
    for (path, streaming) in &methods {
        let scope = required_scope(path);
        let anonymous = call_raw(&channel, path, *streaming, None).await;
        assert_eq!(anonymous.code(), Code::Unauthenticated, "{path} without credentials");
        let without =
            call_raw(&channel, path, *streaming, Some(&tokens[&format!("all-but-{scope}")])).await;
        assert_eq!(without.code(), Code::PermissionDenied, "{path} without {scope}: {without:?}");
        assert!(without.message().contains(scope.name()), "{path}: {}", without.message());
        let with =
            call_raw(&channel, path, *streaming, Some(&tokens[&format!("only-{scope}")])).await;
        assert!(
            !matches!(with.code(), Code::PermissionDenied | Code::Unauthenticated),
            "{path} with only {scope}: {with:?}"
        );
        if scope != Scope::Admin {
            let admin = call_raw(&channel, path, *streaming, Some(&tokens["only-admin"])).await;
            assert!(!matches!(admin.code(), Code::PermissionDenied), "{path} as admin: {admin:?}");
        }
    }

    // An announcement needs send.all_users, a send to users needs send.
    let mut announcement = send_request(vec![]);
    announcement.audience =
        Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {}));
    let as_sender = |token: &str| MessageServiceClient::new(authed(channel.clone(), token));
    let refused =
        as_sender(&tokens["only-send"]).send_message(announcement.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("send.all_users"), "{}", refused.message());
    let refused = as_sender(&tokens["only-send.all_users"])
        .send_message(send_request(vec![1]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("scope send "), "{}", refused.message());
    app.cleanup().await;
}

/// A send request to `user_ids` from the calling client's default sender.
fn own_send(user_ids: Vec<u64>) -> v1::SendMessageRequest {
    v1::SendMessageRequest { sender: String::new(), ..send_request(user_ids) }
}

fn messages(app: &TestApp, token: &str) -> MessageServiceClient<AuthedChannel> {
    MessageServiceClient::new(authed(app.channel(), token))
}

#[tokio::test]
async fn both_tokens_of_a_rotation_work_and_wrong_ones_are_refused() {
    let mut settings = test_settings();
    let tokens = with_clients(&mut settings, &[("billing", &["inbox.read"])]);
    let next = notify_domain::auth::new_token();
    settings.auth.clients[0].token_sha256.push(notify_domain::auth::token_sha256_hex(&next));
    let app = spawn_app_with(settings, false).await;
    let badge = |token: &str| {
        let mut inbox = InboxServiceClient::new(authed(app.channel(), token));
        async move { inbox.get_unread_count(v1::GetUnreadCountRequest { user_id: 7 }).await }
    };
    assert_eq!(badge(&tokens["billing"]).await.unwrap().into_inner().user_id, 7);
    assert_eq!(badge(&next).await.unwrap().into_inner().user_id, 7);
    let wrong = badge(&notify_domain::auth::new_token()).await.unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated);
    assert_eq!(wrong.message(), "the bearer token is not valid");
    let mut request = tonic::Request::new(v1::GetUnreadCountRequest { user_id: 7 });
    request.metadata_mut().insert("authorization", "Basic dXNlcjpwYXNz".parse().unwrap());
    let basic = InboxServiceClient::new(app.channel()).get_unread_count(request).await.unwrap_err();
    assert_eq!(basic.code(), Code::Unauthenticated);
    // Health stays open.
    let health = HealthClient::new(app.channel())
        .check(HealthCheckRequest { service: String::new() })
        .await
        .unwrap();
    assert_eq!(health.into_inner().status, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn a_send_belongs_to_the_client_that_created_it() {
    let mut settings = test_settings();
    let manage: &[&str] = &["send", "sends.read", "sends.manage"];
    let tokens = with_clients(
        &mut settings,
        &[("billing", manage), ("growth", manage), ("ops", &["sends.read", "sends.all"])],
    );
    // Both may send as "shared": idempotency keys still belong to each.
    for client in &mut settings.auth.clients[..2] {
        client.senders = vec![client.name.clone(), "shared".into()];
    }
    let app = spawn_app_with(settings, false).await;
    let (billing, growth, ops) = (&tokens["billing"], &tokens["growth"], &tokens["ops"]);

    let sent =
        messages(&app, billing).send_message(own_send(vec![1, 2])).await.unwrap().into_inner();
    let id = sent.message_id;
    let own = messages(&app, billing).get_message(v1::GetMessageRequest { message_id: id }).await;
    assert_eq!(own.unwrap().into_inner().sender, "billing", "sender defaults to the client");

    let mut theirs = messages(&app, growth);
    let get = theirs.get_message(v1::GetMessageRequest { message_id: id }).await.unwrap_err();
    assert_eq!(get.code(), Code::NotFound);
    let pause = theirs.pause_message(v1::PauseMessageRequest { message_id: id }).await.unwrap_err();
    assert_eq!(pause.code(), Code::NotFound);
    let cancel =
        theirs.cancel_message(v1::CancelMessageRequest { message_id: id }).await.unwrap_err();
    assert_eq!(cancel.code(), Code::NotFound);
    let watch = theirs
        .watch_message(v1::WatchMessageRequest { message_id: id, interval_ms: 0 })
        .await
        .unwrap_err();
    assert_eq!(watch.code(), Code::NotFound);
    let listed = theirs
        .list_messages(v1::ListMessagesRequest { sender: "billing".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.messages.is_empty(), "growth sees billing's sends: {listed:?}");
    let mut as_billing = send_request(vec![3]);
    as_billing.sender = "billing".into();
    let spoofed = theirs.send_message(as_billing).await.unwrap_err();
    assert_eq!(spoofed.code(), Code::PermissionDenied);
    assert!(spoofed.message().starts_with("sender: client growth may not send as"), "{spoofed:?}");

    // A client with sends.all sees every client's sends.
    let mut all = messages(&app, ops);
    assert_eq!(
        all.get_message(v1::GetMessageRequest { message_id: id })
            .await
            .unwrap()
            .into_inner()
            .message_id,
        id
    );
    let listed = all
        .list_messages(v1::ListMessagesRequest { sender: "billing".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.messages.iter().map(|m| m.message_id).collect::<Vec<_>>(), vec![id]);

    // The same key under the same sender is a different send per client.
    let keyed = |token: &str| {
        let mut request = send_request(vec![5]);
        request.sender = "shared".into();
        request.idempotency_key = "invoice-1".into();
        let mut client = messages(&app, token);
        async move { client.send_message(request).await.unwrap().into_inner() }
    };
    let (first, again, other) = (keyed(billing).await, keyed(billing).await, keyed(growth).await);
    assert_eq!(again.message_id, first.message_id);
    assert!(again.deduplicated);
    assert_ne!(other.message_id, first.message_id);
    assert!(!other.deduplicated);
    app.cleanup().await;
}

#[tokio::test]
async fn limits_hold_across_two_api_replicas() {
    let mut settings = test_settings();
    let tokens = with_clients(
        &mut settings,
        &[("chatty", &["inbox.read"]), ("bulk", &["send", "send.all_users"])],
    );
    settings.auth.clients[0].requests_per_second = 1;
    settings.auth.clients[0].burst = 10;
    settings.auth.clients[1].recipients_per_minute = 1000;
    settings.auth.clients[1].announcements_per_hour = 1;
    let app = spawn_app_with(settings, false).await;
    let replica = app.spawn_api_replica().await;
    let channels = [app.channel(), replica.channel()];

    let started = Instant::now();
    let (mut admitted, mut retry_delays) = (0u64, Vec::new());
    for i in 0..40 {
        let mut inbox = InboxServiceClient::new(authed(channels[i % 2].clone(), &tokens["chatty"]));
        match inbox.get_unread_count(v1::GetUnreadCountRequest { user_id: 1 }).await {
            Ok(_) => admitted += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                retry_delays.push(status.get_details_retry_info().and_then(|r| r.retry_delay));
            }
        }
    }
    let elapsed = started.elapsed().as_secs();
    // A burst of 10 plus one per second, over both replicas together
    // (each replica on its own would have let 10 through).
    assert!(admitted >= 10 && admitted <= 11 + elapsed, "{admitted} admitted in {elapsed} s");
    assert!(!retry_delays.is_empty());
    for delay in retry_delays {
        let delay = delay.expect("a refusal says when to retry");
        assert!(delay > Duration::ZERO && delay <= Duration::from_secs(1), "{delay:?}");
    }

    let bulk =
        |channel: &Channel| MessageServiceClient::new(authed(channel.clone(), &tokens["bulk"]));
    bulk(&channels[0]).send_message(own_send((1..=600).collect())).await.unwrap();
    let over = bulk(&channels[1]).send_message(own_send((1..=600).collect())).await.unwrap_err();
    assert_eq!(over.code(), Code::ResourceExhausted);
    assert!(over.message().contains("recipients_per_minute"), "{}", over.message());
    let delay = over.get_details_retry_info().and_then(|r| r.retry_delay).expect("retry delay");
    assert!(delay > Duration::from_secs(5) && delay <= Duration::from_secs(60), "{delay:?}");
    let too_big =
        bulk(&channels[1]).send_message(own_send((1..=1001).collect())).await.unwrap_err();
    assert_eq!(too_big.code(), Code::ResourceExhausted);
    assert!(too_big.get_details_retry_info().is_none(), "no wait makes 1001 fit in 1000");

    let mut announcement = own_send(vec![]);
    announcement.audience =
        Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {}));
    bulk(&channels[1]).send_message(announcement.clone()).await.unwrap();
    let second = bulk(&channels[0]).send_message(announcement).await.unwrap_err();
    assert_eq!(second.code(), Code::ResourceExhausted);
    assert!(second.message().contains("announcements_per_hour"), "{}", second.message());
    replica.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn calls_arriving_together_share_one_lease_of_the_limit() {
    let mut settings = test_settings();
    let tokens = with_clients(&mut settings, &[("gateway", &["inbox.read"])]);
    // Leases of 50 calls out of a full bucket of 1,000.
    settings.auth.clients[0].requests_per_second = 1000;
    let app = spawn_app_with(settings, false).await;
    let inbox = InboxServiceClient::new(authed(app.channel(), &tokens["gateway"]));
    // 200 calls at once, well inside the bucket: when each call that found
    // no lease took one of its own, 20 of them emptied the bucket and the
    // rest were refused.
    let calls = (1..=200u64).map(|user_id| {
        let mut inbox = inbox.clone();
        async move { inbox.get_unread_count(v1::GetUnreadCountRequest { user_id }).await }
    });
    let refused: Vec<Status> =
        futures::future::join_all(calls).await.into_iter().filter_map(Result::err).collect();
    assert!(refused.is_empty(), "{} of 200 refused, first: {:?}", refused.len(), refused.first());
    app.cleanup().await;
}

async fn audit_actions(
    admin: &mut AdminServiceClient<AuthedChannel>,
    filter: v1::list_audit_records_request::Filter,
    at_least: usize,
) -> Vec<(String, String, String)> {
    eventually("audit records", Duration::from_secs(10), || {
        let mut admin = admin.clone();
        let filter = filter.clone();
        async move {
            let request =
                v1::ListAuditRecordsRequest { filter: Some(filter), ..Default::default() };
            let records = admin.list_audit_records(request).await.ok()?.into_inner().records;
            (records.len() >= at_least).then(|| {
                records.into_iter().rev().map(|r| (r.client, r.action, r.outcome)).collect()
            })
        }
    })
    .await
}

#[tokio::test]
async fn lifecycle_and_admin_actions_leave_audit_records() {
    let mut settings = test_settings();
    let tokens = with_clients(
        &mut settings,
        &[
            ("billing", &["send", "send.all_users", "sends.manage", "sends.read", "groups.manage"]),
            ("reader", &["sends.read"]),
            ("ops", &["admin"]),
        ],
    );
    let app = spawn_app_with(settings, false).await;
    let mut billing = messages(&app, &tokens["billing"]);
    let draft = billing
        .create_message(v1::CreateMessageRequest {
            content: Some(content("audited")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .message_id;
    billing
        .append_recipients(v1::AppendRecipientsRequest {
            message_id: draft,
            batch_number: 1,
            user_ids: vec![1, 2],
            ..Default::default()
        })
        .await
        .unwrap();
    billing.start_message(v1::StartMessageRequest { message_id: draft }).await.unwrap();
    billing.pause_message(v1::PauseMessageRequest { message_id: draft }).await.unwrap();
    billing.resume_message(v1::ResumeMessageRequest { message_id: draft }).await.unwrap();
    billing.cancel_message(v1::CancelMessageRequest { message_id: draft }).await.unwrap();
    let refused = billing.redrive_message(v1::RedriveMessageRequest { message_id: draft }).await;
    assert_eq!(refused.unwrap_err().code(), Code::FailedPrecondition);
    let denied = messages(&app, &tokens["reader"])
        .pause_message(v1::PauseMessageRequest { message_id: draft })
        .await;
    assert_eq!(denied.unwrap_err().code(), Code::PermissionDenied);
    let mut announcement = own_send(vec![]);
    announcement.audience =
        Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {}));
    let announced = billing.send_message(announcement).await.unwrap().into_inner().message_id;
    let mut groups = GroupServiceClient::new(authed(app.channel(), &tokens["billing"]));
    let group = groups
        .create_group(v1::CreateGroupRequest { group_id: 0, name: "audited".into() })
        .await
        .unwrap()
        .into_inner()
        .group_id;
    groups
        .add_group_members(v1::AddGroupMembersRequest {
            group_id: group,
            user_ids: vec![1, 2],
            with_history: false,
        })
        .await
        .unwrap();
    groups
        .remove_group_members(v1::RemoveGroupMembersRequest { group_id: group, user_ids: vec![2] })
        .await
        .unwrap();
    // ops reads billing's send only through admin: that use is on record.
    messages(&app, &tokens["ops"])
        .get_message(v1::GetMessageRequest { message_id: draft })
        .await
        .unwrap();

    use v1::list_audit_records_request::Filter;
    let mut admin = AdminServiceClient::new(authed(app.channel(), &tokens["ops"]));
    let ok = |action: &str| ("billing".to_owned(), action.to_owned(), "ok".to_owned());
    assert_eq!(
        audit_actions(&mut admin, Filter::MessageId(draft), 6).await,
        vec![
            ok("message.create"),
            ok("message.start"),
            ok("message.pause"),
            ok("message.resume"),
            ok("message.cancel"),
            ("billing".into(), "message.redrive".into(), "failed_precondition".into()),
        ]
    );
    assert_eq!(
        audit_actions(&mut admin, Filter::MessageId(announced), 1).await,
        vec![ok("announcement.send")]
    );
    assert_eq!(
        audit_actions(&mut admin, Filter::GroupId(group), 3).await,
        vec![ok("group.create"), ok("group.members.add"), ok("group.members.remove")]
    );
    let reader = audit_actions(&mut admin, Filter::Client("reader".into()), 1).await;
    assert_eq!(reader, vec![("reader".into(), "call.denied".into(), "permission_denied".into())]);
    // A stream ops may open only as admin, failing after it opened: its
    // status is in the trailers, and so is the outcome on record.
    let (changes, rx) = tokio::sync::mpsc::channel(1);
    let mut events = EventServiceClient::new(authed(app.channel(), &tokens["ops"]))
        .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("the stream opens")
        .into_inner();
    changes
        .send(v1::SubscribeRequest { add_user_ids: vec![0], ..Default::default() })
        .await
        .unwrap();
    let failed = loop {
        match events.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without an error"),
            Err(status) => break status,
        }
    };
    assert_eq!(failed.code(), Code::InvalidArgument, "{failed:?}");
    let ops = audit_actions(&mut admin, Filter::Client("ops".into()), 2).await;
    assert!(ops.contains(&("ops".into(), "admin.use".into(), "ok".into())), "{ops:?}");
    assert!(ops.contains(&("ops".into(), "admin.use".into(), "failed".into())), "{ops:?}");
    // The audit log itself is for admins only.
    let mut not_admin = AdminServiceClient::new(authed(app.channel(), &tokens["billing"]));
    let request = v1::ListAuditRecordsRequest {
        filter: Some(Filter::Client("ops".into())),
        ..Default::default()
    };
    assert_eq!(
        not_admin.list_audit_records(request).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    app.cleanup().await;
}

#[tokio::test]
async fn watch_streams_are_capped_per_client() {
    let mut settings = test_settings();
    let tokens = with_clients(
        &mut settings,
        &[("watcher", &["send", "sends.read"]), ("other", &["sends.read", "sends.all"])],
    );
    settings.api.max_watch_streams_per_client = 2;
    let app = spawn_app_with(settings, false).await;
    let mut watcher = messages(&app, &tokens["watcher"]);
    let id = watcher.send_message(own_send(vec![1])).await.unwrap().into_inner().message_id;
    let watch = v1::WatchMessageRequest { message_id: id, interval_ms: 0 };
    let first = watcher.watch_message(watch).await.unwrap().into_inner();
    let second = watcher.watch_message(watch).await.unwrap().into_inner();
    let third = watcher.watch_message(watch).await.unwrap_err();
    assert_eq!(third.code(), Code::ResourceExhausted, "{third:?}");
    // Another client has slots of its own.
    messages(&app, &tokens["other"]).watch_message(watch).await.unwrap();
    drop(first);
    let reopened = eventually("a freed watch slot", Duration::from_secs(10), || {
        let mut watcher = watcher.clone();
        async move { watcher.watch_message(watch).await.ok() }
    })
    .await;
    drop((second, reopened));
    app.cleanup().await;
}

#[tokio::test]
async fn reflection_is_authenticated_open_or_off_as_configured() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    let list = || {
        tokio_stream::iter(vec![ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }])
    };
    let mut outcomes = HashMap::new();
    for mode in ["authenticated", "open", "off"] {
        let mut settings = test_settings();
        let tokens = with_clients(&mut settings, &[("gateway", &["inbox.read"])]);
        settings.api.reflection = match mode {
            "open" => notify_domain::settings::ReflectionMode::Open,
            "off" => notify_domain::settings::ReflectionMode::Off,
            _ => notify_domain::settings::ReflectionMode::Authenticated,
        };
        let app = spawn_app_with(settings, false).await;
        let anonymous =
            ServerReflectionClient::new(app.channel()).server_reflection_info(list()).await;
        let with_token = ServerReflectionClient::new(authed(app.channel(), &tokens["gateway"]))
            .server_reflection_info(list())
            .await;
        let code = |result: Result<_, Status>| result.map_or_else(|s| s.code(), |_| Code::Ok);
        outcomes.insert(mode, (code(anonymous), code(with_token)));
        app.cleanup().await;
    }
    assert_eq!(outcomes["authenticated"], (Code::Unauthenticated, Code::Ok));
    assert_eq!(outcomes["open"], (Code::Ok, Code::Ok));
    assert_eq!(outcomes["off"], (Code::Unimplemented, Code::Unimplemented));
}

#[tokio::test]
async fn the_api_refuses_to_listen_beyond_loopback_without_authentication() {
    let mut settings = test_settings();
    settings.api.listen = "0.0.0.0:0".into();
    notify_store::db::migrate_all(&settings).await.unwrap();
    let refused = notify_api::Application::build(settings.clone()).await.err().expect("refused");
    let line = refused.to_string();
    assert!(
        line.starts_with("auth.enabled: api.listen 0.0.0.0:0 is reachable beyond this host"),
        "{line}"
    );
    assert!(line.contains("auth.insecure_allow_unauthenticated") && !line.contains('\n'), "{line}");
    settings.auth.insecure_allow_unauthenticated = true;
    assert!(notify_api::Application::build(settings.clone()).await.is_ok());
    settings.auth.insecure_allow_unauthenticated = false;
    with_clients(&mut settings, &[("billing", &["send"])]);
    assert!(notify_api::Application::build(settings.clone()).await.is_ok());
    notify_store::db::drop_all(&settings).await.unwrap();
}

#[tokio::test]
async fn requests_over_the_size_limit_are_refused_before_decoding() {
    let mut settings = test_settings();
    settings.api.max_request_bytes = 4096;
    let app = spawn_app_with(settings, false).await;
    let big = app.messages().send_message(send_request((1..=5000).collect())).await.unwrap_err();
    assert_eq!(big.code(), Code::OutOfRange, "{big:?}");
    assert!(big.message().contains("the limit is: 4096 bytes"), "{}", big.message());
    app.cleanup().await;
}
