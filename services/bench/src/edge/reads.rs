//! The users' mark-reads, as their apps send them: `POST /v1/items/update`
//! with the user's own token, over a few keep-alive connections to the
//! edge (each call answered before the next). Each user's stream should
//! then get an `item_updated` and a `badge` with nothing unread.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context as _, bail};
use hdrhistogram::Histogram;
use tokio::net::TcpStream;

use super::http1::Conn;
use super::setup::Signer;
use super::streams::{Shared, now_ms};

/// What the calls did.
pub struct Calls {
    /// Calls answered 200.
    pub ok: u64,
    /// Calls that failed.
    pub failed: u64,
    /// The first failure, said.
    pub first_failure: Option<String>,
    /// Each call's time, µs.
    pub latency: Histogram<u64>,
    /// Wall time of them all.
    pub secs: f64,
}

/// Marks `message_id` read for each `(record, user)` of `users` (the
/// record's index in `shared`), over `connections` connections.
pub async fn mark_read(
    edge: SocketAddr,
    users: Arc<Vec<(usize, u64)>>,
    message_id: u64,
    signer: Arc<Signer>,
    shared: Arc<Shared>,
    connections: usize,
) -> anyhow::Result<Calls> {
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_failure = Arc::new(Mutex::new(None::<String>));
    let started = Instant::now();
    let mut callers = Vec::new();
    for _ in 0..connections.max(1) {
        let (users, next, signer, shared) =
            (users.clone(), next.clone(), signer.clone(), shared.clone());
        let (failed, first_failure) = (failed.clone(), first_failure.clone());
        callers.push(tokio::spawn(async move {
            let mut latency = Histogram::<u64>::new(3).expect("3 significant figures");
            let mut conn: Option<Conn> = None;
            let mut ok = 0u64;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(record, user)) = users.get(index) else { break };
                let body = format!(r#"{{"action":"mark_read","message_ids":["{message_id}"]}}"#);
                let request = format!(
                    "POST /v1/items/update HTTP/1.1\r\nHost: {edge}\r\nAuthorization: Bearer {}\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    signer.token(user),
                    body.len()
                );
                shared.records[record].read_sent_ms.store(now_ms(), Ordering::Relaxed);
                let sent = Instant::now();
                match call(&mut conn, edge, request.as_bytes()).await {
                    Ok(()) => {
                        ok += 1;
                        let _ = latency.record(sent.elapsed().as_micros() as u64);
                    }
                    Err(e) => {
                        conn = None;
                        failed.fetch_add(1, Ordering::Relaxed);
                        let mut first = first_failure.lock().unwrap_or_else(|e| e.into_inner());
                        first.get_or_insert(format!("user {user}: {e:#}"));
                    }
                }
            }
            (ok, latency)
        }));
    }
    let mut calls =
        Calls { ok: 0, failed: 0, first_failure: None, latency: Histogram::new(3)?, secs: 0.0 };
    for caller in callers {
        let (ok, latency) = caller.await.context("a mark-read caller panicked")?;
        calls.ok += ok;
        calls.latency.add(latency)?;
    }
    calls.secs = started.elapsed().as_secs_f64();
    calls.failed = failed.load(Ordering::Relaxed);
    calls.first_failure = first_failure.lock().unwrap_or_else(|e| e.into_inner()).take();
    Ok(calls)
}

/// One call on the kept connection (opened first when there is none).
async fn call(conn: &mut Option<Conn>, edge: SocketAddr, request: &[u8]) -> anyhow::Result<()> {
    if conn.is_none() {
        let stream = TcpStream::connect(edge).await.context("connect")?;
        stream.set_nodelay(true)?;
        *conn = Some(Conn::new(stream));
    }
    let open = conn.as_mut().expect("just opened");
    open.send(request).await.context("write the request")?;
    let head = open.head().await?;
    let body = open.body(&head).await?;
    if head.status != 200 {
        bail!("answered {}: {}", head.status, String::from_utf8_lossy(&body));
    }
    Ok(())
}
