//! A tower layer that opens one span per gRPC call, the root of the call's
//! trace (or a child of the caller's, when it sent a W3C `traceparent`).
//!
//! The span lasts until the call ends (see [`crate::call_end`]): a stream's
//! span closes at its trailers, with the code in them, or when the client
//! drops it first (CANCELLED, 1).
//!
//! Only while spans are exported: otherwise calls pass straight through, so
//! a process without tracing pays one relaxed atomic load per call.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::Either;
use futures::{FutureExt as _, TryFutureExt as _};
use notify_core::telemetry::trace;
use tower::{Layer, Service};
use tracing::Instrument as _;

use crate::call_end::{CallEnd, ObservedBody, OnCallEnd};

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
/// gRPC status recorded when the call ends.
#[derive(Debug, Clone)]
pub struct GrpcTrace<S> {
    inner: S,
}

type Traced<F> = Pin<Box<dyn Future<Output = F> + Send>>;

/// Records the call's status on its span when the call ends; the span
/// closes when this and the call's future are gone (held by the response
/// body of [`GrpcTrace`]; none while spans are not exported).
pub struct SpanEnd(Option<tracing::Span>);

impl SpanEnd {
    fn record(span: &tracing::Span, code: u32) {
        span.record("rpc.grpc.status_code", code);
        if code != 0 {
            span.record("otel.status_code", "ERROR");
        }
    }
}

impl OnCallEnd for SpanEnd {
    fn ended(self, end: CallEnd) {
        if let Some(span) = &self.0 {
            Self::record(span, end.code() as u32);
        }
    }
}

type Observed<B> = http::Response<ObservedBody<B, SpanEnd>>;

impl<S, B, ResBody> Service<http::Request<B>> for GrpcTrace<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>> + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: http_body::Body + Send + 'static,
{
    type Response = Observed<ResBody>;
    type Error = S::Error;
    type Future = Either<
        futures::future::MapOk<S::Future, fn(http::Response<ResBody>) -> Observed<ResBody>>,
        Traced<Result<Self::Response, Self::Error>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !trace::exporting() {
            let untraced: fn(http::Response<ResBody>) -> Observed<ResBody> =
                |response| ObservedBody::wrap(response, SpanEnd(None));
            return Either::Left(self.inner.call(request).map_ok(untraced));
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
            future
                .map(move |result| match result {
                    Ok(response) => Ok(ObservedBody::wrap(response, SpanEnd(Some(recorder)))),
                    Err(error) => {
                        SpanEnd::record(&recorder, tonic::Code::Unavailable as u32);
                        Err(error)
                    }
                })
                .instrument(span),
        ))
    }
}
