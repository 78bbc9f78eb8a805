//! A client of the web console as a browser's network layer sees it (no
//! JavaScript): pages, forms with the headers a browser adds, the session
//! cookie, and the Server-Sent Events of a send's page.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;

/// A response, read whole.
#[derive(Debug)]
pub struct Page {
    /// Its status code.
    pub status: u16,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body as text.
    pub body: String,
}

impl Page {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Where a redirect points.
    pub fn location(&self) -> Option<&str> {
        self.header("location")
    }

    /// The `csrf` hidden input of the page's first form that has one.
    pub fn csrf(&self) -> String {
        let marker = "name=\"csrf\" value=\"";
        let start = self.body.find(marker).map(|i| i + marker.len());
        let start = start.unwrap_or_else(|| panic!("no csrf input on the page:\n{}", self.body));
        let end = self.body[start..].find('"').expect("closing quote") + start;
        self.body[start..end].to_owned()
    }
}

/// Where a POST claims to come from, as a browser says it.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// `Sec-Fetch-Site: same-origin` (every current browser, own pages).
    SameOrigin,
    /// `Sec-Fetch-Site: cross-site` (a form on another site).
    CrossSite,
    /// No `Sec-Fetch-Site` (an older browser), this `Origin` header.
    OriginHeader(&'a str),
    /// Neither header.
    Unknown,
}

/// A console client with its own cookie jar (one cookie: the session).
#[derive(Debug, Clone)]
pub struct ConsoleClient {
    addr: SocketAddr,
    cookie: Option<String>,
}

impl ConsoleClient {
    /// A client of the console at `addr`, not logged in.
    pub fn new(addr: SocketAddr) -> Self {
        Self { addr, cookie: None }
    }

    /// The same session against another replica's console.
    pub fn at(&self, addr: SocketAddr) -> Self {
        Self { addr, cookie: self.cookie.clone() }
    }

    /// The session cookie's value, when logged in.
    pub fn cookie(&self) -> Option<&str> {
        self.cookie.as_deref()
    }

    async fn send(&self, request: Request<Full<Bytes>>) -> hyper::Response<Incoming> {
        let stream = tokio::net::TcpStream::connect(self.addr).await.expect("console accepts");
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(io).await.expect("http/1.1 handshake");
        tokio::spawn(connection);
        sender.send_request(request).await.expect("console answers")
    }

    fn request(&self, method: Method, path: &str) -> http::request::Builder {
        let mut builder =
            Request::builder().method(method).uri(path).header(header::HOST, self.addr.to_string());
        if let Some(cookie) = &self.cookie {
            builder = builder.header(header::COOKIE, format!("notify_console={cookie}"));
        }
        builder
    }

    async fn read(response: hyper::Response<Incoming>) -> Page {
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body read").to_bytes();
        Page {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// GETs a page.
    pub async fn get(&self, path: &str) -> Page {
        let request = self
            .request(Method::GET, path)
            .header("sec-fetch-site", "same-origin")
            .body(Full::default())
            .expect("request");
        Self::read(self.send(request).await).await
    }

    /// POSTs a form claiming `origin`.
    pub async fn post(&self, path: &str, form: &[(&str, &str)], origin: Origin<'_>) -> Page {
        let body = form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
        let mut builder = self
            .request(Method::POST, path)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        builder = match origin {
            Origin::SameOrigin => builder.header("sec-fetch-site", "same-origin"),
            Origin::CrossSite => builder.header("sec-fetch-site", "cross-site"),
            Origin::OriginHeader(origin) => builder.header(header::ORIGIN, origin),
            Origin::Unknown => builder,
        };
        let request = builder.body(Full::new(Bytes::from(body))).expect("request");
        Self::read(self.send(request).await).await
    }

    /// Logs in with `token`; keeps the session cookie when one is set.
    pub async fn login(&mut self, token: &str) -> Page {
        let page = self.post("/console/login", &[("token", token)], Origin::SameOrigin).await;
        if let Some(set) = page.header("set-cookie") {
            let value = set.split(';').next().and_then(|pair| pair.split_once('=')).map(|p| p.1);
            self.cookie = value.filter(|v| !v.is_empty()).map(str::to_owned);
        }
        page
    }

    /// Logs in and panics unless the login succeeded.
    pub async fn logged_in(addr: SocketAddr, token: &str) -> Self {
        let mut client = Self::new(addr);
        let page = client.login(token).await;
        assert_eq!(page.status, 303, "login refused: {}", page.body);
        client
    }

    /// Opens a page's event stream.
    pub async fn events(&self, path: &str) -> EventStream {
        let request = self
            .request(Method::GET, path)
            .header(header::ACCEPT, "text/event-stream")
            .body(Full::default())
            .expect("request");
        let response = self.send(request).await;
        assert_eq!(response.status().as_u16(), 200, "event stream refused");
        EventStream { body: response.into_body(), buffer: String::new() }
    }
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Its `event:` name.
    pub name: String,
    /// Its `data:` lines, joined.
    pub data: String,
}

/// An open event stream.
#[derive(Debug)]
pub struct EventStream {
    body: Incoming,
    buffer: String,
}

impl EventStream {
    /// The next event (comments and keep-alives skipped); `None` once the
    /// server has ended the stream.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = Event { name: "message".to_owned(), data: String::new() };
                let mut any = false;
                for line in block.lines() {
                    if let Some(name) = line.strip_prefix("event:") {
                        event.name = name.trim().to_owned();
                        any = true;
                    } else if let Some(data) = line.strip_prefix("data:") {
                        if !event.data.is_empty() {
                            event.data.push('\n');
                        }
                        event.data.push_str(data.strip_prefix(' ').unwrap_or(data));
                        any = true;
                    }
                }
                if any {
                    return Some(event);
                }
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }
}
