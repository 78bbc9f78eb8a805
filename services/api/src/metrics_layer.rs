//! A tower layer that records, per gRPC method and status code, the request
//! count and duration, and the number of requests in flight.
//!
//! A call ends when its status goes out (see [`crate::call_end`]): a
//! stream is in flight until its trailers, and counted with the code in
//! them; one the client dropped first is counted as CANCELLED (1).
//!
//! Metric handles are resolved once per method and code and kept, so a call
//! costs a map lookup under a read lock and a few atomic operations, not a
//! registry lookup with freshly allocated labels.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, OnceLock, RwLock};
use std::task::{Context, Poll};
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram};
use tower::{Layer, Service};

use crate::call_end::{CallEnd, ObservedBody, OnCallEnd};

/// Distinct method paths given their own labels; calls to further paths
/// (only unknown methods, as the services have fewer) share one label, so a
/// client cannot grow the metrics without bound.
const MAX_METHODS: usize = 128;
/// Label of the calls beyond [`MAX_METHODS`].
const OTHER_METHOD: &str = "other";
/// gRPC codes 0..=16, then one slot for transport errors.
const CODES: usize = 18;
/// The slot of transport errors (the service failed, or the body did).
const TRANSPORT: usize = CODES - 1;
const CODE_LABELS: [&str; CODES] = [
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "10",
    "11",
    "12",
    "13",
    "14",
    "15",
    "16",
    "transport",
];

/// The handles of one method.
struct MethodMetrics {
    method: String,
    in_flight: Gauge,
    by_code: [OnceLock<(Counter, Histogram)>; CODES],
}

impl MethodMetrics {
    fn new(method: &str) -> Self {
        Self {
            method: method.to_owned(),
            in_flight: metrics::gauge!("notify_grpc_requests_in_flight", "method" => method.to_owned()),
            by_code: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    fn finished(&self, code: usize, seconds: f64) {
        let (count, duration) = self.by_code[code].get_or_init(|| {
            let labels = [("method", self.method.clone()), ("code", CODE_LABELS[code].to_owned())];
            (
                metrics::counter!("notify_grpc_requests_total", &labels),
                metrics::histogram!("notify_grpc_request_duration_seconds", &labels),
            )
        });
        count.increment(1);
        duration.record(seconds);
    }
}

static METHODS: LazyLock<RwLock<HashMap<String, Arc<MethodMetrics>>>> =
    LazyLock::new(RwLock::default);

tokio::task_local! {
    /// The method of the call whose handler is running.
    static CURRENT_METHOD: Arc<MethodMetrics>;
}

/// The gRPC method (`/notify.v1.MessageService/CancelMessage`) whose handler
/// runs in this task, for what it logs; empty outside a handler.
pub fn current_method() -> String {
    CURRENT_METHOD.try_with(|method| method.method.clone()).unwrap_or_default()
}

fn method_metrics(path: &str) -> Arc<MethodMetrics> {
    let known = METHODS.read().unwrap_or_else(|e| e.into_inner()).get(path).cloned();
    if let Some(known) = known {
        return known;
    }
    let mut methods = METHODS.write().unwrap_or_else(|e| e.into_inner());
    let key = if methods.len() < MAX_METHODS { path } else { OTHER_METHOD };
    methods.entry(key.to_owned()).or_insert_with(|| Arc::new(MethodMetrics::new(key))).clone()
}

/// The index in [`CODE_LABELS`] of how a call ended.
fn code_index(end: CallEnd) -> usize {
    match end {
        CallEnd::BodyFailed => TRANSPORT,
        end => end.code() as usize,
    }
}

/// Counts a call when it ends and takes it out of the in-flight gauge
/// (held by the response body of [`GrpcMetrics`]).
pub struct Finished {
    metrics: Arc<MethodMetrics>,
    started: Instant,
}

impl OnCallEnd for Finished {
    fn ended(self, end: CallEnd) {
        self.metrics.in_flight.decrement(1.0);
        self.metrics.finished(code_index(end), self.started.elapsed().as_secs_f64());
    }
}

/// Adds [`GrpcMetrics`] around a service.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMetricsLayer;

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner }
    }
}

/// Records `notify_grpc_requests_total`, `notify_grpc_request_duration_seconds`
/// and `notify_grpc_requests_in_flight`.
#[derive(Debug, Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
}

impl<S, B, ResBody> Service<http::Request<B>> for GrpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>> + Send,
    S::Future: Send + 'static,
    ResBody: http_body::Body,
{
    type Response = http::Response<ObservedBody<ResBody, Finished>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let metrics = method_metrics(request.uri().path());
        let started = Instant::now();
        metrics.in_flight.increment(1.0);
        let future = self.inner.call(request);
        let method = Arc::clone(&metrics);
        Box::pin(async move {
            // The handler runs inside `future`: what it logs can name the call.
            match CURRENT_METHOD.scope(method, future).await {
                Ok(response) => Ok(ObservedBody::wrap(response, Finished { metrics, started })),
                Err(error) => {
                    metrics.in_flight.decrement(1.0);
                    metrics.finished(TRANSPORT, started.elapsed().as_secs_f64());
                    Err(error)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_ends_map_to_their_code_labels() {
        let status = |value: &'static str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-status", http::HeaderValue::from_static(value));
            CODE_LABELS[code_index(CallEnd::from_headers(&headers).unwrap())]
        };
        assert_eq!(status("0"), "0");
        assert_eq!(status("3"), "3");
        assert_eq!(status("16"), "16");
        assert_eq!(status("17"), "2");
        assert_eq!(status("x"), "2");
        assert_eq!(CODE_LABELS[code_index(CallEnd::Dropped)], "1");
        assert_eq!(CODE_LABELS[code_index(CallEnd::BodyFailed)], "transport");
    }

    #[test]
    fn a_method_keeps_its_handles() {
        let first = method_metrics("/test.Service/Method");
        let second = method_metrics("/test.Service/Method");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(first.method, "/test.Service/Method");
    }
}
