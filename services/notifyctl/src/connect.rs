//! How notifyctl reaches notify-api: the address, TLS (the CA to trust, and a
//! client certificate for mutual TLS), and the bearer token sent with every
//! call.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// Connection options shared by every command that calls the api.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// Address of notify-api; https:// speaks TLS.
    #[arg(long, global = true, env = "NOTIFY_ADDR", default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Bearer token of the client to call as (`notifyctl token new` makes one).
    #[arg(long, global = true, env = "NOTIFY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM CA to verify the api's certificate with (default: the system's
    /// roots); implies TLS.
    #[arg(long, global = true, env = "NOTIFY_CA")]
    pub ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --key).
    #[arg(long, global = true, env = "NOTIFY_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, global = true, env = "NOTIFY_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
}

/// Adds the bearer token, when there is one, to every call.
#[derive(Clone)]
pub struct Credentials(Option<MetadataValue<Ascii>>);

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A connection to the api with the caller's credentials.
pub type Api = InterceptedService<Channel, Credentials>;

impl ConnectArgs {
    /// Connects, with TLS when the address is https:// or a CA is given.
    pub async fn connect(&self) -> anyhow::Result<Api> {
        let tls = self.addr.starts_with("https://") || self.ca.is_some() || self.cert.is_some();
        let addr = if tls && self.addr.starts_with("http://") {
            self.addr.replacen("http://", "https://", 1)
        } else {
            self.addr.clone()
        };
        let mut endpoint = Channel::from_shared(addr.clone())
            .with_context(|| format!("--addr {addr:?} is not a url"))?
            .connect_timeout(Duration::from_secs(10));
        if tls {
            let mut config = ClientTlsConfig::new();
            config = match &self.ca {
                Some(ca) => config.ca_certificate(Certificate::from_pem(
                    std::fs::read(ca)
                        .with_context(|| format!("--ca: cannot read {}", ca.display()))?,
                )),
                None => config.with_native_roots(),
            };
            if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                let cert = std::fs::read(cert)
                    .with_context(|| format!("--cert: cannot read {}", cert.display()))?;
                let key = std::fs::read(key)
                    .with_context(|| format!("--key: cannot read {}", key.display()))?;
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(config).context("tls configuration")?;
        }
        let channel = endpoint.connect().await.map_err(|e| {
            anyhow::anyhow!("cannot reach notify-api at {addr}: {}", error_chain(&e))
        })?;
        let token = match &self.token {
            Some(token) => Some(
                format!("Bearer {}", token.trim())
                    .parse()
                    .context("--token must be printable ASCII")?,
            ),
            None => None,
        };
        Ok(InterceptedService::new(channel, Credentials(token)))
    }
}

/// Joins an error with its sources ("transport error: tls handshake: ...").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
