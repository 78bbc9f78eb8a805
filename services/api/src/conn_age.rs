//! The grace period of `api.max_connection_age_secs`.
//!
//! The server asks a connection to go away (HTTP/2 GOAWAY) once it is
//! `max_connection_age_secs` old: the client opens a new connection, likely
//! to another replica, and the calls in flight finish on the old one. A
//! client that keeps the old connection busy (a stream that never ends) must
//! not hold it forever: `max_connection_age_grace_secs` after the GOAWAY,
//! this wrapper ends the connection's transport, which closes it.
//!
//! tonic sends the GOAWAY; its own grace setting replaces the GOAWAY with a
//! hard close at age + grace (tonic 0.14), so the grace is kept here instead.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// A connection that ends its transport at a deadline.
pub struct AgedConnection<T> {
    inner: T,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<T> AgedConnection<T> {
    /// Wraps `inner`; it closes after `lifetime` (never when `None`).
    pub fn new(inner: T, lifetime: Option<Duration>) -> Self {
        Self { inner, deadline: lifetime.map(|after| Box::pin(tokio::time::sleep(after))) }
    }

    /// Returns an error once the deadline has passed (and registers the
    /// caller to be woken at it until then).
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        let deadline = self.deadline.as_mut()?;
        if deadline.as_mut().poll(cx).is_ready() {
            metrics::counter!("notify_grpc_connections_closed_after_grace_total").increment(1);
            return Some(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connection outlived its max age and grace period",
            ));
        }
        None
    }
}

impl<T: Connected> Connected for AgedConnection<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for AgedConnection<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(error) = self.expired(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for AgedConnection<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(error) = self.expired(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(error) = self.expired(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
