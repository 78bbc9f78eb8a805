//! OpenTelemetry traces across the queue: the api and a worker run as
//! processes exporting to an in-test OTLP receiver, and one send, made with
//! the caller's `traceparent`, must come back as one trace from the call to
//! every chunk's apply (alone or in a group), with its SQL and Redis calls
//! inside; a stream's span carries the status of its trailers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use notify_proto::v1;
use notify_testkit::child::ApiChild;
use notify_testkit::otlp::{OtlpReceiver, ReceivedSpan};
use notify_testkit::{TestApp, spawn_app_with, test_settings};
use tokio::process::Command;
use tonic::metadata::MetadataValue;

/// The caller's trace: its id, and the span the send is made from.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// Runs a Notify binary on the test's config, exporting spans to
/// `receiver` every 100 ms.
fn exporting(command: &mut Command, app: &TestApp, receiver: &OtlpReceiver) {
    command
        .env("NOTIFY_CONFIG", app.write_config_file())
        .env("NOTIFY_TRACE__OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
}

/// The api as a child process exporting to `receiver`.
async fn api_exporting(app: &TestApp, receiver: &OtlpReceiver) -> ApiChild {
    let binary = notify_testkit::bin(env!("CARGO_BIN_EXE_notify-api"));
    ApiChild::start(&binary, |command| exporting(command, app, receiver)).await
}

/// notify-worker, built beside notify-api by `cargo test --workspace`.
fn worker_binary() -> PathBuf {
    let worker =
        notify_testkit::bin(env!("CARGO_BIN_EXE_notify-api")).with_file_name("notify-worker");
    assert!(
        worker.exists(),
        "{} is missing: run the tests with --workspace (or cargo build -p notify-worker)",
        worker.display()
    );
    worker
}

/// True when `span` descends from the span `ancestor` through spans received.
fn descends_from(
    span: &ReceivedSpan,
    ancestor: &str,
    by_id: &HashMap<&str, &ReceivedSpan>,
) -> bool {
    let mut parent = span.parent_span_id.as_str();
    for _ in 0..64 {
        if parent == ancestor {
            return true;
        }
        match by_id.get(parent) {
            Some(next) => parent = next.parent_span_id.as_str(),
            None => return false,
        }
    }
    false
}

#[tokio::test]
async fn one_send_is_one_trace_from_the_call_to_every_chunks_apply() {
    let app = spawn_app_with(test_settings(), false).await;
    let receiver = OtlpReceiver::start().await;
    let api = api_exporting(&app, &receiver).await;
    // No sweep during the test: a re-publish would start traces of its own.
    let mut worker = Command::new(worker_binary());
    exporting(&mut worker, &app, &receiver);
    let _worker = worker
        .env("NOTIFY_WORKER__SWEEP_TIMEOUT_SECS", "300")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("notify-worker starts");
    let channel = api.channel.clone();

    // 3,000 users over four shards: several chunks on each.
    let mut request = tonic::Request::new(notify_testkit::send_request((1..=3_000).collect()));
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    request.metadata_mut().insert("traceparent", MetadataValue::try_from(traceparent).unwrap());
    let message_id = v1::message_service_client::MessageServiceClient::new(channel)
        .send_message(request)
        .await
        .expect("send accepted")
        .into_inner()
        .message_id;
    app.wait_for_status(message_id, v1::MessageStatus::Completed).await;
    let chunks = app.count_chunks(message_id).await as usize;
    assert!(chunks >= 8, "the send has several chunks per shard ({chunks})");

    // Every chunk's apply (a group of the send's chunks applied in one
    // transaction, a lone chunk a group of one), and the call's own span
    // (exported when it ends).
    let id = message_id.to_string();
    let is_apply = |span: &ReceivedSpan| {
        span.name == "apply_group" && span.attribute("message_id") == Some(id.as_str())
    };
    let chunks_applied = |spans: &[ReceivedSpan]| -> usize {
        spans
            .iter()
            .filter(|span| is_apply(span))
            .map(|span| span.attribute("chunks").unwrap().parse::<usize>().unwrap())
            .sum()
    };
    // Spans arrive in the exporters' batches, each when it ends: a span
    // between the call and an apply (the publish of a chunk, which ends after
    // the call when the send is planned in the background) may come later
    // than both. Wait until every apply's chain up to the call is complete.
    let linked = |spans: &[ReceivedSpan]| -> bool {
        let Some(call) =
            spans.iter().find(|span| span.name == "notify.v1.MessageService/SendMessage")
        else {
            return false;
        };
        let by_id: HashMap<&str, &ReceivedSpan> =
            spans.iter().map(|span| (span.span_id.as_str(), span)).collect();
        chunks_applied(spans) >= chunks
            && spans
                .iter()
                .filter(|span| is_apply(span))
                .all(|apply| descends_from(apply, &call.span_id, &by_id))
    };
    let spans = receiver
        .wait_for(
            "every chunk's apply, each descending from the call's span through the queue",
            Duration::from_secs(30),
            linked,
        )
        .await;

    let call =
        spans.iter().find(|span| span.name == "notify.v1.MessageService/SendMessage").unwrap();
    assert_eq!(call.service, "notify-api");
    assert_eq!(call.trace_id, CALLER_TRACE, "the call continues the caller's trace");
    assert_eq!(call.parent_span_id, CALLER_SPAN, "the call's span is a child of the caller's");
    assert_eq!(call.attribute("rpc.grpc.status_code"), Some("0"));

    // (Each apply descends from the call: the wait above.)
    let applies: Vec<&ReceivedSpan> = spans.iter().filter(|span| is_apply(span)).collect();
    assert_eq!(chunks_applied(&spans), chunks, "one apply per chunk, none twice");
    for apply in &applies {
        assert_eq!(apply.service, "notify-worker");
        assert_eq!(
            apply.trace_id,
            CALLER_TRACE,
            "chunk {:?} is in the send's trace",
            apply.attribute("chunk_id")
        );
    }

    // The worker's SQL and Redis calls are spans inside the chunks' spans
    // (the last of them may still be on their way: wait for one of each).
    let applies: Vec<String> = applies.iter().map(|span| span.span_id.clone()).collect();
    let inside = |spans: &[ReceivedSpan], system: &str| {
        let by_id: HashMap<&str, &ReceivedSpan> =
            spans.iter().map(|span| (span.span_id.as_str(), span)).collect();
        spans.iter().any(|span| {
            span.attribute("db.system") == Some(system)
                && applies.iter().any(|apply| descends_from(span, apply, &by_id))
        })
    };
    receiver
        .wait_for(
            "SQL and Redis spans inside the chunks' spans",
            Duration::from_secs(30),
            |spans| inside(spans, "mysql") && inside(spans, "redis"),
        )
        .await;
    // Nothing of this send left the trace.
    let spans = receiver.wait_for("the spans so far", Duration::from_secs(1), |_| true).await;
    let strays = spans
        .iter()
        .filter(|span| span.attribute("message_id") == Some(id.as_str()))
        .filter(|span| span.trace_id != CALLER_TRACE)
        .count();
    assert_eq!(strays, 0, "every span about the send is in the caller's trace");
    app.cleanup().await;
}

#[tokio::test]
async fn a_stream_that_fails_is_traced_with_the_code_in_its_trailers() {
    let app = spawn_app_with(test_settings(), false).await;
    let receiver = OtlpReceiver::start().await;
    let api = api_exporting(&app, &receiver).await;
    let channel = api.channel.clone();
    let status = crate::helpers::subscribe_then_fail(channel).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let name = "notify.v1.EventService/Subscribe";
    let spans = receiver
        .wait_for("the stream's span", Duration::from_secs(30), |spans| {
            spans.iter().any(|span| span.name == name)
        })
        .await;
    let span = spans.iter().find(|span| span.name == name).unwrap();
    assert_eq!(span.attribute("rpc.grpc.status_code"), Some("3"), "{span:?}");
    app.cleanup().await;
}
