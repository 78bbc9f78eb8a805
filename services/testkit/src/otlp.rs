//! An OTLP/gRPC trace receiver for tests: the services export to it like to
//! a collector, and a test awaits the spans it expects.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// One received span, with ids in hex and attributes as strings.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// `service.name` of the exporting process.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, empty for a root span.
    pub parent_span_id: String,
    /// Attributes, each value rendered as a string.
    pub attributes: HashMap<String, String>,
}

impl ReceivedSpan {
    /// The attribute `key`, if present.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// A running receiver; stops when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: watch::Receiver<Vec<ReceivedSpan>>,
    stop: CancellationToken,
}

impl OtlpReceiver {
    /// Starts a receiver on a free loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (sender, spans) = watch::channel(Vec::new());
        let collector = Collector { spans: Arc::new(Mutex::new(sender)) };
        let stop = CancellationToken::new();
        let stopping = stop.clone();
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector))
                .serve_with_incoming_shutdown(incoming, stopping.cancelled())
                .await;
        });
        Self { addr, spans, stop }
    }

    /// The endpoint to export to (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until the spans received so far satisfy `ready`, and returns
    /// them; panics after `within`.
    pub async fn wait_for(
        &self,
        what: &str,
        within: Duration,
        mut ready: impl FnMut(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let mut spans = self.spans.clone();
        let waited = tokio::time::timeout(within, spans.wait_for(|received| ready(received))).await;
        match waited {
            Ok(Ok(received)) => received.clone(),
            _ => panic!("{what}: not received within {within:?}"),
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct Collector {
    spans: Arc<Mutex<watch::Sender<Vec<ReceivedSpan>>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|attribute| attribute.key == "service.name")
                .and_then(|attribute| {
                    attribute.value.as_ref().and_then(|v| render(v.value.as_ref()))
                })
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    let attributes = span
                        .attributes
                        .iter()
                        .filter_map(|attribute| {
                            let value = attribute.value.as_ref()?.value.as_ref();
                            Some((attribute.key.clone(), render(value)?))
                        })
                        .collect();
                    received.push(ReceivedSpan {
                        service: service.clone(),
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes,
                    });
                }
            }
        }
        self.spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send_modify(|spans| spans.extend(received));
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn render(value: Option<&Value>) -> Option<String> {
    Some(match value? {
        Value::StringValue(text) => text.clone(),
        Value::BoolValue(flag) => flag.to_string(),
        Value::IntValue(number) => number.to_string(),
        Value::DoubleValue(number) => number.to_string(),
        other => format!("{other:?}"),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
