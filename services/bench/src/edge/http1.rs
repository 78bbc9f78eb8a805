//! The least of an HTTP/1.1 client the edge bench needs, over one tokio
//! `TcpStream`, so that 50,000 open event streams cost the load generator
//! little: a request is written whole; the response head is read up to its
//! blank line and parsed by `httparse`; a body comes by `Content-Length` or as chunks
//! (`Transfer-Encoding: chunked`), handed on as they arrive, since an event
//! stream never ends.
//!
//! An idle connection holds no read buffer: it waits for the socket to be
//! readable, then reads into a scratch buffer of its thread and keeps only
//! the bytes not yet parsed.

use std::cell::RefCell;
use std::io;

use anyhow::{Context as _, bail};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

thread_local! {
    /// Where every connection of this thread reads into.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0; 64 * 1024]);
}

/// A response's status line and the headers that frame its body.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    /// The status code.
    pub status: u16,
    /// `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// `Content-Length`, when given.
    pub length: Option<usize>,
}

/// One client connection and the bytes read from it but not yet parsed.
pub struct Conn {
    stream: TcpStream,
    raw: Vec<u8>,
}

impl Conn {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> Self {
        Self { stream, raw: Vec::new() }
    }

    /// Writes `request` whole.
    pub async fn send(&mut self, request: &[u8]) -> io::Result<()> {
        self.stream.write_all(request).await
    }

    /// Reads what the socket has (at least one byte); false at its end.
    async fn fill(&mut self) -> io::Result<bool> {
        loop {
            self.stream.readable().await?;
            let read = SCRATCH.with_borrow_mut(|scratch| {
                let read = self.stream.try_read(scratch)?;
                self.raw.extend_from_slice(&scratch[..read]);
                Ok::<_, io::Error>(read)
            });
            match read {
                Ok(0) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Frees the read buffer once everything in it was parsed.
    fn compact(&mut self, parsed: usize) {
        self.raw.drain(..parsed);
        if self.raw.is_empty() && self.raw.capacity() > 1024 {
            self.raw = Vec::new();
        }
    }

    /// Reads the response head.
    pub async fn head(&mut self) -> anyhow::Result<Head> {
        loop {
            if let Some((length, head)) = parse_head(&self.raw)? {
                self.compact(length);
                return Ok(head);
            }
            if !self.fill().await.context("reading a response head")? {
                bail!("the connection closed before a response head");
            }
        }
    }

    /// Reads a whole body framed as `head` says.
    pub async fn body(&mut self, head: &Head) -> anyhow::Result<Vec<u8>> {
        let mut body = Vec::new();
        if head.chunked {
            while self.chunks(&mut body).await? {}
            return Ok(body);
        }
        let length = head.length.unwrap_or(0);
        while self.raw.len() < length {
            if !self.fill().await.context("reading a response body")? {
                bail!("the connection closed within a response body");
            }
        }
        body.extend_from_slice(&self.raw[..length]);
        self.compact(length);
        Ok(body)
    }

    /// Appends the payload of every chunk that is whole to `out`, reading
    /// from the socket first when none is; false once the last chunk came
    /// (or the connection closed).
    pub async fn chunks(&mut self, out: &mut Vec<u8>) -> anyhow::Result<bool> {
        loop {
            let (parsed, last, got) = decode_chunks(&self.raw, out)?;
            self.compact(parsed);
            if last {
                return Ok(false);
            }
            if got {
                return Ok(true);
            }
            if !self.fill().await.context("reading a chunked body")? {
                return Ok(false);
            }
        }
    }
}

/// Where `needle` first occurs in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// The head at the start of `raw` and its length, once it is whole
/// (`httparse`, the parser hyper uses).
fn parse_head(raw: &[u8]) -> anyhow::Result<Option<(usize, Head)>> {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut fields);
    let length = match response.parse(raw).context("an HTTP response head")? {
        httparse::Status::Complete(length) => length,
        httparse::Status::Partial => return Ok(None),
    };
    let mut head = Head { status: response.code.unwrap_or_default(), chunked: false, length: None };
    for field in response.headers.iter() {
        let value = std::str::from_utf8(field.value).unwrap_or_default().trim();
        if field.name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = value.eq_ignore_ascii_case("chunked");
        } else if field.name.eq_ignore_ascii_case("content-length") {
            head.length = value.parse().ok();
        }
    }
    Ok(Some((length, head)))
}

/// Decodes the whole chunks at the start of `raw` into `out`: (bytes
/// parsed, the last chunk came, at least one chunk came).
fn decode_chunks(raw: &[u8], out: &mut Vec<u8>) -> anyhow::Result<(usize, bool, bool)> {
    let mut at = 0;
    let mut got = false;
    loop {
        let (start, size) = match httparse::parse_chunk_size(&raw[at..]) {
            Ok(httparse::Status::Complete((line, size))) => (at + line, size as usize),
            Ok(httparse::Status::Partial) => return Ok((at, false, got)),
            Err(_) => bail!("not a chunk size line at byte {at}"),
        };
        if size == 0 {
            // Trailers are not used by the edge; the body ends here.
            return Ok((raw.len(), true, got));
        }
        if raw.len() < start + size + 2 {
            return Ok((at, false, got));
        }
        out.extend_from_slice(&raw[start..start + size]);
        at = start + size + 2;
        got = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_says_how_its_body_is_framed() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n";
        let (length, head) = parse_head(raw).unwrap().expect("a whole head");
        assert_eq!(length, raw.len() - 3);
        assert_eq!((head.status, head.chunked, head.length), (200, true, None));
        let (_, head) = parse_head(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 12\r\n\r\n")
            .unwrap()
            .expect("a whole head");
        assert_eq!((head.status, head.chunked, head.length), (401, false, Some(12)));
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-").unwrap().is_none(), "partial");
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn whole_chunks_are_decoded_and_a_partial_one_waits() {
        let mut out = Vec::new();
        let raw = b"5\r\nhello\r\n6;x=1\r\n world\r\n4\r\nab";
        let (parsed, last, got) = decode_chunks(raw, &mut out).unwrap();
        assert_eq!(out, b"hello world");
        assert_eq!((parsed, last, got), (raw.len() - "4\r\nab".len(), false, true));
        let mut out = Vec::new();
        let (_, last, _) = decode_chunks(b"2\r\nok\r\n0\r\n\r\n", &mut out).unwrap();
        assert!(last);
        assert_eq!(out, b"ok");
        assert!(decode_chunks(b"zz\r\n", &mut out).is_err());
    }
}
