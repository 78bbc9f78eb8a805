//! Event streams on HTTP/1.1 connections of their own, answered without
//! hyper's per-connection state.
//!
//! An SSE stream is a response that lasts for hours and is idle nearly all
//! of it. hyper keeps, for each HTTP/1.1 connection, a read buffer and a
//! write buffer of 8 KB or more and its connection state for all of that
//! time: more than the stream itself. So the edge looks at the first
//! request of each connection. When it is `GET /v1/events` over HTTP/1.1
//! with no body, the router answers it here exactly as it answers hyper
//! (authentication, CORS, limits and errors are the router's), and the
//! response goes straight to the socket: the head, then each event as one
//! chunk, holding no buffer between events. The connection closes when the
//! stream ends (`Connection: close`; `EventSource` opens a new one).
//!
//! Every other connection (another first request, HTTP/2, a request with a
//! body, a head that is not whole within [`MAX_HEAD`] bytes or does not
//! parse) goes to hyper, with the bytes read so far put back in front of
//! it ([`Rewind`]); a stream that comes on a connection hyper serves is
//! served by hyper, as before.
//!
//! The head is parsed by `httparse`, hyper's own parser.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Body;
use bytes::{Buf, Bytes};
use http::{Method, Request, Version, header};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tower::ServiceExt as _;

/// The longest request head answered here; a longer one goes to hyper
/// (which answers it 431 when it is over its own limit).
pub const MAX_HEAD: usize = 8 * 1024;

/// The most header fields answered here.
const MAX_HEADERS: usize = 64;

/// The path answered here.
const EVENTS: &str = "/v1/events";

/// How long a new connection may take to send its first request head.
pub const FIRST_HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// What a connection's first request is.
pub enum First<C> {
    /// `GET /v1/events` over HTTP/1.1, with no body: answered here.
    Events(C, Box<Request<Body>>),
    /// Anything else: hyper's, with the bytes already read in front.
    Other(Rewind<C>),
    /// The peer closed (or sent nothing in time) before a whole head.
    Gone,
}

/// Reads the first request head of `io` and says who answers it.
pub async fn first_request<C: AsyncRead + Unpin>(mut io: C) -> First<C> {
    let mut head: Vec<u8> = Vec::with_capacity(1024);
    let read = tokio::time::timeout(FIRST_HEAD_TIMEOUT, async {
        loop {
            if head.len() >= MAX_HEAD {
                return Ok(None);
            }
            if head.len() == head.capacity() {
                head.reserve(head.len().min(MAX_HEAD - head.len()));
            }
            if io.read_buf(&mut head).await? == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            // Only a GET is answered here: the HTTP/2 preface and every
            // other method go to hyper at once.
            if !head.starts_with(&b"GET "[..head.len().min(4)]) {
                return Ok(None);
            }
            let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut parsed = httparse::Request::new(&mut fields);
            match parsed.parse(&head) {
                Ok(httparse::Status::Complete(length)) => {
                    return Ok(events_request(&parsed, length == head.len()));
                }
                Ok(httparse::Status::Partial) => {}
                Err(_) => return Ok(None),
            }
        }
    })
    .await;
    match read {
        Ok(Ok(Some(request))) => First::Events(io, Box::new(request)),
        Ok(Ok(None)) => First::Other(Rewind { prefix: Bytes::from(head), io }),
        Ok(Err(_)) | Err(_) => First::Gone,
    }
}

/// The request, when it is one answered here: `GET /v1/events` over
/// HTTP/1.1, nothing after its head (no body, nothing pipelined), no
/// upgrade, every field a valid one.
fn events_request(parsed: &httparse::Request<'_, '_>, whole: bool) -> Option<Request<Body>> {
    let path = parsed.path?;
    if !whole || parsed.version != Some(1) || path.split('?').next() != Some(EVENTS) {
        return None;
    }
    let mut request = Request::builder().method(Method::GET).uri(path).version(Version::HTTP_11);
    for field in parsed.headers.iter() {
        let name = header::HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        let bodyless = match name {
            header::CONTENT_LENGTH => field.value == b"0",
            header::TRANSFER_ENCODING | header::UPGRADE => false,
            _ => true,
        };
        if !bodyless {
            return None;
        }
        request = request.header(name, header::HeaderValue::from_bytes(field.value).ok()?);
    }
    request.body(Body::empty()).ok()
}

/// Answers `request` with `app` on `io` and writes the response: a body of
/// known length at once, any other (the event stream) chunk by chunk as
/// the router yields it, until it ends, the peer goes, or a write fails.
pub async fn answer<C>(mut io: C, request: Box<Request<Body>>, app: Router) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let Ok(response) = app.oneshot(*request).await;
    let (parts, body) = response.into_parts();
    let length = http_body::Body::size_hint(&body).exact();
    let mut head = Vec::with_capacity(512);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(parts.status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\ndate: ");
    head.extend_from_slice(httpdate::fmt_http_date(SystemTime::now()).as_bytes());
    head.extend_from_slice(b"\r\nconnection: close\r\n");
    for (name, value) in &parts.headers {
        if matches!(*name, header::CONTENT_LENGTH | header::TRANSFER_ENCODING | header::CONNECTION)
        {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if let Some(length) = length {
        // An error or another whole answer: written at once.
        let bytes = body.collect().await.map_err(io::Error::other)?.to_bytes();
        head.extend_from_slice(format!("content-length: {length}\r\n\r\n").as_bytes());
        head.extend_from_slice(&bytes);
        io.write_all(&head).await?;
        io.flush().await?;
        return io.shutdown().await;
    }
    head.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
    io.write_all(&head).await?;
    io.flush().await?;
    drop(head);
    let mut body = std::pin::pin!(body);
    // Read only to see the peer go: a request sent behind an endless
    // response would never be answered, so anything it sends ends it.
    let mut probe = [0u8; 1];
    loop {
        tokio::select! {
            frame = body.frame() => match frame {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if !data.is_empty() {
                        io.write_all(&chunk(data)).await?;
                        io.flush().await?;
                    }
                }
                Some(Err(e)) => return Err(io::Error::other(e)),
                None => {
                    io.write_all(b"0\r\n\r\n").await?;
                    io.flush().await?;
                    return io.shutdown().await;
                }
            },
            read = io.read(&mut probe) => return read.map(drop),
        }
    }
}

/// One chunk of a chunked body: its length in hex, the data, CRLF.
fn chunk(data: Bytes) -> Vec<u8> {
    use std::io::Write as _;
    let mut chunk = Vec::with_capacity(data.len() + 12);
    let _ = write!(chunk, "{:x}\r\n", data.len());
    chunk.extend_from_slice(&data);
    chunk.extend_from_slice(b"\r\n");
    chunk
}

/// A connection with bytes already read from it put back in front.
pub struct Rewind<C> {
    prefix: Bytes,
    io: C,
}

impl<C: AsyncRead + Unpin> AsyncRead for Rewind<C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.has_remaining() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if !self.prefix.has_remaining() {
                // Freed, not kept for the connection's life.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Rewind<C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &[u8]) -> Option<Request<Body>> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut fields);
        match parsed.parse(head).unwrap() {
            httparse::Status::Complete(length) => events_request(&parsed, length == head.len()),
            httparse::Status::Partial => panic!("partial"),
        }
    }

    #[test]
    fn only_a_bodyless_http11_get_of_the_events_path_is_answered_here() {
        let taken =
            parse(b"GET /v1/events?access_token=t HTTP/1.1\r\nHost: e\r\nLast-Event-ID: 7\r\n\r\n")
                .expect("an events request");
        assert_eq!(taken.uri(), "/v1/events?access_token=t");
        assert_eq!(taken.headers()["last-event-id"], "7");
        assert!(parse(b"GET /v1/events HTTP/1.1\r\nContent-Length: 0\r\n\r\n").is_some());
        for other in [
            &b"GET /v1/inbox HTTP/1.1\r\nHost: e\r\n\r\n"[..],
            b"GET /v1/events/x HTTP/1.1\r\n\r\n",
            b"GET /v1/events HTTP/1.0\r\n\r\n",
            b"GET /v1/events HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
            b"GET /v1/events HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /v1/events HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"GET /v1/events HTTP/1.1\r\n\r\nGET /v1/badge HTTP/1.1\r\n\r\n",
        ] {
            assert!(parse(other).is_none(), "{}", String::from_utf8_lossy(other));
        }
    }

    #[tokio::test]
    async fn a_connection_handed_on_reads_the_bytes_already_read_first() {
        let (client, server) = tokio::io::duplex(64);
        let (mut client_read, mut client_write) = tokio::io::split(client);
        client_write.write_all(b"POST /v1/items/update HTTP/1.1\r\n\r\nrest").await.unwrap();
        let First::Other(mut rewound) = first_request(server).await else {
            panic!("a POST is hyper's");
        };
        let mut all = vec![0u8; 38];
        rewound.read_exact(&mut all).await.unwrap();
        assert_eq!(&all, b"POST /v1/items/update HTTP/1.1\r\n\r\nrest");
        rewound.write_all(b"ok").await.unwrap();
        let mut answer = [0u8; 2];
        client_read.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"ok");
    }
}
