//! TLS on the gRPC listener: rustls with no, optional or required client
//! certificates. The certificate, key and client CA are re-read when their
//! files change (cert-manager renews them in place), so a renewal needs no
//! restart: new connections get the new certificate, open ones keep theirs.
//!
//! Handshakes run in their own tasks (a slow or silent client never holds up
//! the accept loop) with a deadline. A verified client certificate's names
//! (DNS and URI SANs, then the CN) travel with the connection as [`TlsPeer`],
//! where the auth layer maps them to a client.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use notify_domain::settings::{ApiTlsSettings, ClientAuth};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;
use tracing::{debug, info, warn};

/// Longest a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const ACCEPT_BACKLOG: usize = 128;

/// What a listener's TLS is built from: its settings, the section they
/// are under (`api.tls`, `edge.tls`: errors name it) and the protocols it
/// offers by ALPN.
#[derive(Debug, Clone)]
pub struct TlsSource {
    /// The files and client certificate rules.
    pub settings: ApiTlsSettings,
    /// The settings' section, for errors.
    pub section: &'static str,
    /// ALPN protocols, preferred first (`h2` for gRPC; `h2` and `http/1.1`
    /// for the edge).
    pub alpn: Vec<Vec<u8>>,
}

impl TlsSource {
    /// The gRPC listener's: HTTP/2 only.
    pub fn api(settings: &ApiTlsSettings) -> Self {
        Self { settings: settings.clone(), section: "api.tls", alpn: vec![b"h2".to_vec()] }
    }
}

/// The listener's TLS configuration, swapped whole when its files change.
pub struct ServerTls {
    source: TlsSource,
    current: RwLock<(Arc<ServerConfig>, Vec<u8>)>,
    reloads: watch::Sender<u64>,
    failed_reloads: watch::Sender<u64>,
}

impl ServerTls {
    /// Loads the files; fails with a line naming the setting that is wrong.
    pub async fn load(source: TlsSource) -> anyhow::Result<Arc<Self>> {
        let files = read_files(&source).await?;
        let config = build_config(&source, &files)?;
        Ok(Arc::new(Self {
            source,
            current: RwLock::new((Arc::new(config), files.concat())),
            reloads: watch::channel(0).0,
            failed_reloads: watch::channel(0).0,
        }))
    }

    /// Counts successful reloads; tests wait on it.
    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Counts changed files that did not load (the old configuration stayed).
    pub fn failed_reloads(&self) -> watch::Receiver<u64> {
        self.failed_reloads.subscribe()
    }

    fn config(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// Re-reads the files every `reload_interval_secs` until `shutdown`; a
    /// change that does not load (a half-written file) keeps the old
    /// configuration and is retried at the next tick.
    pub async fn watch_files(self: Arc<Self>, shutdown: CancellationToken) {
        let every = Duration::from_secs(self.source.settings.reload_interval_secs);
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = shutdown.cancelled() => return,
            }
            let files = match read_files(&self.source).await {
                Ok(files) => files,
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "cannot read the tls files, keeping the loaded ones");
                    metrics::counter!("notify_tls_reload_errors_total").increment(1);
                    continue;
                }
            };
            let contents = files.concat();
            if self.current.read().unwrap_or_else(|e| e.into_inner()).1 == contents {
                continue;
            }
            match build_config(&self.source, &files) {
                Ok(config) => {
                    *self.current.write().unwrap_or_else(|e| e.into_inner()) =
                        (Arc::new(config), contents);
                    self.reloads.send_modify(|count| *count += 1);
                    metrics::counter!("notify_tls_reloads_total").increment(1);
                    info!("tls certificate files changed, reloaded");
                }
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "changed tls files do not load, keeping the old ones");
                    metrics::counter!("notify_tls_reload_errors_total").increment(1);
                    self.failed_reloads.send_modify(|count| *count += 1);
                }
            }
        }
    }

    /// Accepts connections on `listener` and hands out those whose TLS
    /// handshake succeeded, until `shutdown`.
    pub fn incoming(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> ReceiverStream<std::io::Result<TlsConnection>> {
        let (ready, incoming) = mpsc::channel(ACCEPT_BACKLOG);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = shutdown.cancelled() => return,
                };
                let (tcp, remote) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off a little.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                metrics::counter!("notify_grpc_connections_total").increment(1);
                let acceptor = TlsAcceptor::from(self.config());
                let ready = ready.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let connection = TlsConnection::new(stream, remote);
                            let _ = ready.send(Ok(connection)).await;
                        }
                        Ok(Err(e)) => {
                            metrics::counter!("notify_tls_handshake_failures_total").increment(1);
                            debug!(error = %e, %remote, "tls handshake failed");
                        }
                        Err(_) => {
                            metrics::counter!("notify_tls_handshake_failures_total").increment(1);
                            debug!(%remote, "tls handshake timed out");
                        }
                    }
                });
            }
        });
        ReceiverStream::new(incoming)
    }
}

/// Reads one file on tokio's blocking pool, never on a runtime thread.
async fn read_file(setting: &str, path: &str) -> anyhow::Result<Vec<u8>> {
    tokio::fs::read(path).await.with_context(|| format!("{setting}: cannot read {path}"))
}

async fn read_files(source: &TlsSource) -> anyhow::Result<[Vec<u8>; 3]> {
    let (settings, section) = (&source.settings, source.section);
    let ca = if settings.client_ca_file.is_empty() {
        Vec::new()
    } else {
        read_file(&format!("{section}.client_ca_file"), &settings.client_ca_file).await?
    };
    Ok([
        read_file(&format!("{section}.cert_file"), &settings.cert_file).await?,
        read_file(&format!("{section}.key_file"), &settings.key_file).await?,
        ca,
    ])
}

fn build_config(source: &TlsSource, files: &[Vec<u8>; 3]) -> anyhow::Result<ServerConfig> {
    let (settings, section) = (&source.settings, source.section);
    let [cert_pem, key_pem, ca_pem] = files;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{section}.cert_file: not a PEM certificate chain"))?;
    anyhow::ensure!(!certs.is_empty(), "{section}.cert_file: holds no certificate");
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .with_context(|| format!("{section}.key_file: not a PEM private key"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("tls protocol versions")?;
    let builder = match settings.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Optional | ClientAuth::Required => {
            let mut roots = RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(ca_pem) {
                let ca =
                    ca.with_context(|| format!("{section}.client_ca_file: not a PEM certificate"))?;
                roots.add(ca).with_context(|| {
                    format!("{section}.client_ca_file: not a usable CA certificate")
                })?;
            }
            anyhow::ensure!(!roots.is_empty(), "{section}.client_ca_file: holds no certificate");
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if settings.client_auth == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().with_context(|| {
                format!("{section}.client_ca_file: cannot verify clients with it")
            })?)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .with_context(|| format!("{section}.key_file: does not match {section}.cert_file"))?;
    config.alpn_protocols = source.alpn.clone();
    Ok(config)
}

/// What the server knows about the other end of a TLS connection; the auth
/// layer finds it in every request's extensions.
#[derive(Debug, Clone)]
pub struct TlsPeer {
    /// The client's address.
    pub remote: SocketAddr,
    /// Names of its verified certificate (SANs, then CN); empty without one.
    pub cert_names: Arc<[String]>,
}

/// An accepted TLS connection with what its handshake told.
pub struct TlsConnection {
    stream: TlsStream<TcpStream>,
    peer: TlsPeer,
}

impl TlsConnection {
    fn new(stream: TlsStream<TcpStream>, remote: SocketAddr) -> Self {
        let cert_names = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| certificate_names(leaf.as_ref()))
            .unwrap_or_default();
        Self { stream, peer: TlsPeer { remote, cert_names: cert_names.into() } }
    }
}

/// Returns a certificate's DNS and URI subject alternative names, then its
/// common names.
pub fn certificate_names(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => names.push((*dns).to_owned()),
                GeneralName::URI(uri) => names.push((*uri).to_owned()),
                _ => {}
            }
        }
    }
    names.extend(
        cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_owned),
    );
    names
}

impl Connected for TlsConnection {
    type ConnectInfo = TlsPeer;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.peer.clone()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
