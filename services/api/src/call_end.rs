//! Where a gRPC call ends, for the metrics and trace layers: its status is
//! in the headers of a trailers-only response (an error before any
//! message), or in the trailers after the last message (every other
//! response: unary successes, and streams however they end). A response
//! dropped before its status went out ended because the client went away.
//!
//! [`ObservedBody`] wraps a response body and reports the end once, when
//! the status is known or the body is dropped.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tonic::Code;

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// The server sent this `grpc-status` (a value that is no gRPC code
    /// reads as UNKNOWN, as tonic reads it).
    Status(Code),
    /// The response body failed: the client got no status.
    BodyFailed,
    /// The response was dropped before its status went out: the client
    /// reset the stream or closed the connection (or the server stopped
    /// serving it at the end of the shutdown grace). Recorded as CANCELLED,
    /// the code the client's own side reports for a call it gave up.
    Dropped,
}

impl CallEnd {
    /// The end told by `headers` (response headers or trailers), if they
    /// carry a `grpc-status`.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let status = headers.get("grpc-status")?;
        Some(Self::Status(Code::from_bytes(status.as_bytes())))
    }

    /// The gRPC code recorded for this end.
    pub fn code(self) -> Code {
        match self {
            Self::Status(code) => code,
            Self::BodyFailed => Code::Unavailable,
            Self::Dropped => Code::Cancelled,
        }
    }
}

/// What a layer does when a call ends.
pub trait OnCallEnd: Send + 'static {
    /// Records `end`; called once per call.
    fn ended(self, end: CallEnd);
}

/// Calls its [`OnCallEnd`] once: at the status, or when dropped first.
struct Watch<E: OnCallEnd> {
    on_end: Option<E>,
}

impl<E: OnCallEnd> Watch<E> {
    fn end(&mut self, end: CallEnd) {
        if let Some(on_end) = self.on_end.take() {
            on_end.ended(end);
        }
    }
}

impl<E: OnCallEnd> Drop for Watch<E> {
    fn drop(&mut self) {
        self.end(CallEnd::Dropped);
    }
}

pin_project_lite::pin_project! {
    /// A response body that reports how its call ended.
    pub struct ObservedBody<B, E: OnCallEnd> {
        #[pin]
        inner: B,
        watch: Watch<E>,
    }
}

impl<B: Body, E: OnCallEnd> ObservedBody<B, E> {
    /// Wraps `response`'s body; a trailers-only response (its status in
    /// the headers) ends here and now.
    pub fn wrap(response: http::Response<B>, on_end: E) -> http::Response<Self> {
        let mut watch = Watch { on_end: Some(on_end) };
        if let Some(end) = CallEnd::from_headers(response.headers()) {
            watch.end(end);
        } else if response.body().is_end_stream() {
            // Nothing will be sent after the headers, so no status either
            // (hyper does not even poll such a body).
            watch.end(CallEnd::Status(Code::Unknown));
        }
        response.map(|inner| Self { inner, watch })
    }
}

impl<B: Body, E: OnCallEnd> Body for ObservedBody<B, E> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    this.watch.end(
                        CallEnd::from_headers(trailers).unwrap_or(CallEnd::Status(Code::Unknown)),
                    );
                }
            }
            Some(Err(_)) => this.watch.end(CallEnd::BodyFailed),
            // The end without trailers: no status was sent (unless the
            // headers had it, and then this is already recorded).
            None => this.watch.end(CallEnd::Status(Code::Unknown)),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Empty, StreamBody};

    use super::*;

    /// Collects the ends it is told of.
    #[derive(Clone, Default)]
    struct Ends(Arc<Mutex<Vec<CallEnd>>>);

    impl OnCallEnd for Ends {
        fn ended(self, end: CallEnd) {
            self.0.lock().unwrap().push(end);
        }
    }

    impl Ends {
        fn seen(&self) -> Vec<CallEnd> {
            self.0.lock().unwrap().clone()
        }
    }

    type Frames = Vec<Result<Frame<Bytes>, std::io::Error>>;

    fn response(frames: Frames) -> http::Response<impl Body<Data = Bytes, Error = std::io::Error>> {
        http::Response::new(StreamBody::new(futures::stream::iter(frames)))
    }

    fn trailers(code: &'static str) -> Frame<Bytes> {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static(code));
        Frame::trailers(trailers)
    }

    #[tokio::test]
    async fn a_stream_ends_with_the_status_in_its_trailers() {
        let ends = Ends::default();
        let frames = vec![Ok(Frame::data(Bytes::from_static(b"m"))), Ok(trailers("3"))];
        let body = ObservedBody::wrap(response(frames), ends.clone()).into_body();
        assert!(ends.seen().is_empty(), "nothing ends with the headers");
        body.collect().await.unwrap();
        assert_eq!(ends.seen(), [CallEnd::Status(Code::InvalidArgument)]);
    }

    #[tokio::test]
    async fn a_trailers_only_response_ends_with_its_headers() {
        let ends = Ends::default();
        let mut response = http::Response::new(Empty::<Bytes>::new());
        response.headers_mut().insert("grpc-status", http::HeaderValue::from_static("5"));
        let body = ObservedBody::wrap(response, ends.clone()).into_body();
        assert_eq!(ends.seen(), [CallEnd::Status(Code::NotFound)]);
        drop(body);
        assert_eq!(ends.seen().len(), 1, "one end per call");
    }

    #[tokio::test]
    async fn a_stream_dropped_before_its_trailers_was_cancelled() {
        let ends = Ends::default();
        let frames = vec![Ok(Frame::data(Bytes::from_static(b"m"))), Ok(trailers("0"))];
        let mut body = ObservedBody::wrap(response(frames), ends.clone()).into_body();
        body.frame().await.unwrap().unwrap();
        drop(body);
        assert_eq!(ends.seen(), [CallEnd::Dropped]);
        assert_eq!(CallEnd::Dropped.code(), Code::Cancelled);
    }

    #[tokio::test]
    async fn a_failed_body_or_one_without_a_status_is_told_apart() {
        let ends = Ends::default();
        let frames = vec![Err(std::io::Error::other("reset"))];
        let body = ObservedBody::wrap(response(frames), ends.clone()).into_body();
        assert!(body.collect().await.is_err());
        let frames = vec![Ok(Frame::data(Bytes::from_static(b"m"))), Ok(trailers("x"))];
        ObservedBody::wrap(response(frames), ends.clone()).into_body().collect().await.unwrap();
        let frames = vec![Ok(Frame::data(Bytes::from_static(b"m")))];
        ObservedBody::wrap(response(frames), ends.clone()).into_body().collect().await.unwrap();
        let unknown = CallEnd::Status(Code::Unknown);
        assert_eq!(ends.seen(), [CallEnd::BodyFailed, unknown, unknown]);
    }
}
