//! A lean gRPC unary client straight on the `h2` crate (the HTTP/2 layer
//! under tonic), for load generation: what `h2load` or `ghz` do.
//!
//! On a 2-core machine the load generator shares the CPU with the api and
//! Redis. A tonic client spends about as much CPU per call as the server it
//! measures (its `Channel` adds a buffer task, reconnect and tower layers),
//! so a tonic-driven run reports the client's ceiling as much as the api's.
//! This client sends the same bytes a tonic client sends (a POST with
//! `content-type: application/grpc`, one length-prefixed protobuf message)
//! and checks the same things (HTTP 200, `grpc-status` 0, one well-framed
//! reply), with nothing else around it.

use anyhow::{Context as _, bail, ensure};
use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use http::{HeaderValue, Method, Request, Uri};
use tokio::net::TcpStream;

/// One HTTP/2 connection to a gRPC server; cheap to clone, calls on clones
/// are multiplexed as concurrent streams.
#[derive(Clone)]
pub struct WireChannel {
    send: SendRequest<Bytes>,
    authority: String,
    /// `authorization: Bearer ...` sent with every call, when set.
    authorization: Option<HeaderValue>,
}

impl WireChannel {
    /// Connects (with TCP_NODELAY, as tonic does) and runs the connection
    /// in a spawned task.
    pub async fn connect(addr: &str) -> anyhow::Result<Self> {
        let tcp = TcpStream::connect(addr).await.with_context(|| format!("connect {addr}"))?;
        tcp.set_nodelay(true)?;
        let (send, connection) = h2::client::handshake(tcp).await?;
        tokio::spawn(async move {
            // Ends when every clone is dropped or the server goes away.
            let _ = connection.await;
        });
        Ok(Self { send, authority: addr.to_owned(), authorization: None })
    }

    /// Connects like [`Self::connect`] and sends `token` with every call.
    pub async fn connect_with_token(addr: &str, token: &str) -> anyhow::Result<Self> {
        let mut wire = Self::connect(addr).await?;
        wire.authorization = Some(HeaderValue::from_str(&format!("Bearer {token}"))?);
        Ok(wire)
    }

    /// Calls the unary method at `path` (`/package.Service/Method`).
    pub async fn unary<Req, Res>(&self, path: &str, request: &Req) -> anyhow::Result<Res>
    where
        Req: prost::Message,
        Res: prost::Message + Default,
    {
        let uri = Uri::builder()
            .scheme("http")
            .authority(self.authority.as_str())
            .path_and_query(path)
            .build()?;
        let mut head = Request::builder().method(Method::POST).uri(uri).body(())?;
        let headers = head.headers_mut();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("te", HeaderValue::from_static("trailers"));
        if let Some(authorization) = &self.authorization {
            headers.insert("authorization", authorization.clone());
        }

        let mut send = self.send.clone().ready().await?;
        let (response, mut body_out) = send.send_request(head, false)?;
        body_out.send_data(frame(request), true)?;

        let response = response.await?;
        ensure!(response.status() == 200, "{path}: HTTP {}", response.status());
        if let Some(status) = response.headers().get("grpc-status") {
            // Trailers-only: an error without a body.
            bail!("{path}: grpc-status {status:?}");
        }
        let mut body = response.into_body();
        let mut message = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            body.flow_control().release_capacity(chunk.len())?;
            message.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await?.context("no trailers")?;
        let status = trailers.get("grpc-status").map(HeaderValue::as_bytes);
        ensure!(status == Some(b"0"), "{path}: grpc-status {status:?}");
        unframe(message.freeze())
    }
}

/// Prefixes an encoded message with gRPC's 5-byte header (uncompressed,
/// big-endian length).
fn frame<M: prost::Message>(message: &M) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    message.encode(&mut buf).expect("capacity reserved");
    buf.freeze()
}

/// Decodes exactly one length-prefixed, uncompressed message.
fn unframe<M: prost::Message + Default>(mut bytes: Bytes) -> anyhow::Result<M> {
    ensure!(bytes.len() >= 5, "reply shorter than a gRPC frame header");
    ensure!(bytes[0] == 0, "compressed reply");
    let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
    ensure!(bytes.len() == 5 + len, "reply of {} bytes frames {len}", bytes.len());
    Ok(M::decode(bytes.split_off(5))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify_proto::v1::GetUnreadCountRequest;

    #[test]
    fn frames_round_trip() {
        let request = GetUnreadCountRequest { user_id: 42 };
        let framed = frame(&request);
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 2]);
        assert_eq!(unframe::<GetUnreadCountRequest>(framed).unwrap(), request);
        assert!(unframe::<GetUnreadCountRequest>(Bytes::from_static(&[0, 0, 0, 0, 9, 8])).is_err());
    }
}
