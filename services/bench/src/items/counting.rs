//! A TCP proxy in front of one shard that counts the MySQL commands passing
//! through it: each command a client sends starts a packet with sequence id
//! 0 (the handshake's packets and a command's continuation packets have
//! others), so the count is the round trips the services made to that shard.
//! The server has TLS disabled here, so the packets are readable.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The proxy; stops accepting when dropped.
pub(super) struct CountingProxy {
    addr: SocketAddr,
    commands: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl CountingProxy {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub(super) async fn start(upstream: String) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let commands = Arc::new(AtomicU64::new(0));
        let counter = commands.clone();
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
        Ok(Self { addr, commands, accept })
    }

    /// Where the services connect.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Commands forwarded so far.
    pub(super) fn commands(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
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
    counter: &AtomicU64,
) -> std::io::Result<()> {
    let mut packet = Vec::new();
    loop {
        let mut header = [0u8; 4];
        from.read_exact(&mut header).await?;
        let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        if header[3] == 0 {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        packet.clear();
        packet.extend_from_slice(&header);
        packet.resize(4 + len, 0);
        from.read_exact(&mut packet[4..]).await?;
        to.write_all(&packet).await?;
    }
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
}
