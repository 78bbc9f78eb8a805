//! A tower layer that opens one span per gRPC call, the root of the call's
//! trace (or a child of the caller's, when it sent a W3C `traceparent`).
//!
//! Only while spans are exported: otherwise calls pass straight through, so
//! a process without tracing pays one relaxed atomic load per call.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::Either;
use notify_core::telemetry::trace;
use tower::{Layer, Service};
use tracing::Instrument as _;

/// Adds [`GrpcTrace`] around a service.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcTraceLayer;

impl<S> Layer<S> for GrpcTraceLayer {
    type Service = GrpcTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTrace { inner }
    }
}

/// Runs each call inside a server span named after its method, with the
/// gRPC status recorded when the response starts.
#[derive(Debug, Clone)]
pub struct GrpcTrace<S> {
    inner: S,
}

type Traced<F> = Pin<Box<dyn Future<Output = F> + Send>>;

impl<S, B, ResBody> Service<http::Request<B>> for GrpcTrace<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>> + Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Traced<Result<Self::Response, Self::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !trace::exporting() {
            return Either::Left(self.inner.call(request));
        }
        let path = request.uri().path();
        let span = tracing::info_span!(
            "grpc",
            otel.name = path.trim_start_matches('/'),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            rpc.system = "grpc",
            rpc.method = path,
            rpc.grpc.status_code = tracing::field::Empty,
        );
        trace::follow_http(&span, request.headers());
        // The handler's own spans open while the call is made: inside ours.
        let future = span.in_scope(|| self.inner.call(request));
        let recorder = span.clone();
        Either::Right(Box::pin(
            async move {
                let result = future.await;
                let code = match &result {
                    Ok(response) => response
                        .headers()
                        .get("grpc-status")
                        .and_then(|value| value.to_str().ok())
                        .and_then(|value| value.parse::<u32>().ok())
                        .unwrap_or(0),
                    Err(_) => 14,
                };
                recorder.record("rpc.grpc.status_code", code);
                if code != 0 {
                    recorder.record("otel.status_code", "ERROR");
                }
                result
            }
            .instrument(span),
        ))
    }
}
