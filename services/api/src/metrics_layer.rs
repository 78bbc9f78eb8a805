//! A tower layer that records, per gRPC method and status code, the request
//! count and duration, and the number of requests in flight.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tower::{Layer, Service};

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
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().to_owned();
        let started = Instant::now();
        let in_flight =
            metrics::gauge!("notify_grpc_requests_in_flight", "method" => method.clone());
        in_flight.increment(1.0);
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            in_flight.decrement(1.0);
            // Errors travel in the headers of trailers-only responses; a
            // response without grpc-status in its headers succeeded or
            // reports its status in trailers (streams), counted as "0".
            let code = match &result {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("0")
                    .to_owned(),
                Err(_) => "transport".to_owned(),
            };
            let labels = [("method", method), ("code", code)];
            metrics::counter!("notify_grpc_requests_total", &labels).increment(1);
            metrics::histogram!("notify_grpc_request_duration_seconds", &labels)
                .record(started.elapsed().as_secs_f64());
            result
        })
    }
}
