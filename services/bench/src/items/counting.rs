//! A TCP proxy in front of one shard that counts the MySQL commands passing
//! through it: each command a client sends starts a packet with sequence id
//! 0 (the handshake's packets and a command's continuation packets have
//! others), so the count is the round trips the services made to that shard.
//! The server has TLS disabled here, so the packets are readable.
//!
//! Apart, it counts the commands on connections that carried an item
//! update's script (a query with [`UPDATE_MARK`]): an update's own round
//! trips, with the pings its connection got before or after it, and none
//! of the services' other work (the read counting that follows a read,
//! their background loops), as long as those run on other connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What an item update's script holds, and no other statement of the
/// services: its `UPDATE` of the items (`notify_store::db::item_updates`).
const UPDATE_MARK: &[u8] = b"UPDATE message_items i SET";
/// The script's `UPDATE` comes within its first bytes (the statements
/// before it are short for a filter), so longer statements, such as the
/// read counting's lists of ids, are not searched through.
const UPDATE_MARK_WITHIN: usize = 64 * 1024;
/// `COM_QUERY`: a query's text follows.
const COM_QUERY: u8 = 0x03;
/// `COM_PING`.
const COM_PING: u8 = 0x0e;

/// Commands counted by a proxy.
#[derive(Default)]
struct Counters {
    /// Every command.
    all: AtomicU64,
    /// Commands on connections that carried an item update's script, from
    /// that script on.
    on_updates: AtomicU64,
    /// Of those, pings.
    pings_on_updates: AtomicU64,
}

/// The proxy; stops accepting when dropped.
pub(super) struct CountingProxy {
    addr: SocketAddr,
    counters: Arc<Counters>,
    accept: JoinHandle<()>,
}

impl CountingProxy {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub(super) async fn start(upstream: String) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let counter = counters.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, counter) = (upstream.clone(), counter.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else { return };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    // Either side closing ends the connection.
                    tokio::select! {
                        _ = tokio::io::copy(&mut server_read, &mut client_write) => {}
                        _ = forward_commands(&mut client_read, &mut server_write, &counter) => {}
                    }
                });
            }
        });
        Ok(Self { addr, counters, accept })
    }

    /// Where the services connect.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Commands forwarded so far.
    pub(super) fn commands(&self) -> u64 {
        self.counters.all.load(Ordering::Relaxed)
    }

    /// Commands forwarded so far on connections that carried an item
    /// update's script, from that script on.
    pub(super) fn update_commands(&self) -> u64 {
        self.counters.on_updates.load(Ordering::Relaxed)
    }

    /// Pings among [`Self::update_commands`].
    pub(super) fn update_pings(&self) -> u64 {
        self.counters.pings_on_updates.load(Ordering::Relaxed)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies client packets to the server, one write per packet, counting
/// those that start a command.
async fn forward_commands(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    counters: &Counters,
) -> std::io::Result<()> {
    let mut packet = Vec::new();
    let mut carried_update = false;
    loop {
        let mut header = [0u8; 4];
        from.read_exact(&mut header).await?;
        let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        packet.clear();
        packet.extend_from_slice(&header);
        packet.resize(4 + len, 0);
        from.read_exact(&mut packet[4..]).await?;
        if header[3] == 0 {
            counters.all.fetch_add(1, Ordering::Relaxed);
            carried_update = carried_update || is_update(&packet[4..]);
            if carried_update {
                counters.on_updates.fetch_add(1, Ordering::Relaxed);
                if packet.get(4) == Some(&COM_PING) {
                    counters.pings_on_updates.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        to.write_all(&packet).await?;
    }
}

/// Whether a command's payload is an item update's script.
fn is_update(payload: &[u8]) -> bool {
    let Some((&COM_QUERY, text)) = payload.split_first() else { return false };
    let text = &text[..text.len().min(UPDATE_MARK_WITHIN)];
    text.windows(UPDATE_MARK.len()).any(|window| window == UPDATE_MARK)
}

/// `url` (`mysql://user:pass@host:port[/...]`) with its host and port
/// replaced by `addr`, and no database.
pub(super) fn url_via(url: &str, addr: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("mysql", url));
    let (credentials, host_and_path) = match rest.rsplit_once('@') {
        Some((credentials, host)) => (Some(credentials), host),
        None => (None, rest),
    };
    let query = host_and_path.split_once('?').map(|(_, q)| q);
    let mut out = format!("{scheme}://");
    if let Some(credentials) = credentials {
        out.push_str(credentials);
        out.push('@');
    }
    out.push_str(&addr.to_string());
    if let Some(query) = query {
        out.push_str("/?");
        out.push_str(query);
    }
    out
}

/// The `host:port` of a mysql url (3306 when it names none).
pub(super) fn upstream_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let host = host.split(['/', '?']).next().unwrap_or("127.0.0.1");
    if host.contains(':') { host.to_owned() } else { format!("{host}:3306") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_pointed_at_the_proxy() {
        let addr: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert_eq!(url_via("mysql://root@127.0.0.1:3306", addr), "mysql://root@127.0.0.1:4000");
        assert_eq!(
            url_via("mysql://u:p@db:3306/x?ssl-mode=disabled", addr),
            "mysql://u:p@127.0.0.1:4000/?ssl-mode=disabled"
        );
        assert_eq!(upstream_of("mysql://root@127.0.0.1:3306"), "127.0.0.1:3306");
        assert_eq!(upstream_of("mysql://u:p@db/x"), "db:3306");
    }

    #[test]
    fn an_update_is_told_by_its_query_text() {
        let query = |text: &str| [&[COM_QUERY], text.as_bytes()].concat();
        let script =
            "START TRANSACTION; UPDATE message_items i SET i.is_seen = 1 WHERE i.user_id = 42";
        assert!(is_update(&query(script)));
        assert!(!is_update(&query("SELECT COUNT(*) FROM message_items i WHERE i.user_id = 42")));
        assert!(!is_update(&[COM_PING]), "COM_PING");
        assert!(!is_update(&[]));
        let far = format!("SELECT '{}'; {script}", "x".repeat(UPDATE_MARK_WITHIN));
        assert!(!is_update(&query(&far)), "past the bytes searched");
    }
}
