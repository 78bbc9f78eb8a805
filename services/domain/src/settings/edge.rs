//! Settings of `notify-edge`, the end users' own door: REST and an event
//! stream for browsers and apps, each call carrying a user token that the
//! app's backend signed ([`EdgeTokenSettings`]).

use secrecy::SecretString;
use serde::Deserialize;

use super::{ApiTlsSettings, ClientAuth, SettingsError, invalid, parse_addr};

/// Settings of `notify-edge`.
#[derive(Debug, Clone, Deserialize)]
pub struct EdgeSettings {
    /// HTTP listen address (HTTP/1.1 and HTTP/2).
    pub listen: String,
    /// Prometheus listen address.
    pub metrics_listen: String,
    /// Longest drain of in-flight calls at shutdown (event streams end at
    /// once: their clients resume elsewhere).
    pub shutdown_grace_secs: u64,
    /// Runtime threads: 0 one per core, 1 one thread, N a pool of N.
    pub worker_threads: usize,
    /// Origins allowed to call from a browser (CORS), exactly as the
    /// browser sends them (`https://app.example.com`); `*` any.
    pub allowed_origins: Vec<String>,
    /// Largest request body accepted.
    pub max_request_bytes: usize,
    /// Calls per second of one user over every edge replica (event streams
    /// count once, when they open); 0: no limit.
    pub requests_per_second: u32,
    /// Calls allowed at once above the rate; 0: `requests_per_second`.
    pub burst: u32,
    /// Event streams one user may hold open on one replica (every tab and
    /// device has its own).
    pub max_streams_per_user: usize,
    /// Events one stream may have queued; a reader slower than that gets a
    /// `resync` instead of the events it missed.
    pub stream_buffer: usize,
    /// Interval of heartbeats on a quiet stream.
    pub heartbeat_secs: u64,
    /// How far back a reconnecting stream resumes (`Last-Event-ID`): the
    /// event history each replica holds, and the retention of the events
    /// stream in RabbitMQ.
    pub history_secs: u64,
    /// Most events the history holds in memory (a send's chunk is one
    /// event, whatever its recipients).
    pub history_max_events: usize,
    /// TLS on the listener (client certificates are not asked for).
    pub tls: ApiTlsSettings,
    /// The user tokens.
    pub tokens: EdgeTokenSettings,
}

/// How user tokens are checked: JWTs whose `sub` is the user id, signed by
/// the app's backend with one of these keys.
#[derive(Debug, Clone, Deserialize)]
pub struct EdgeTokenSettings {
    /// Keys named in the configuration.
    pub keys: Vec<EdgeKeySettings>,
    /// A JSON Web Key Set file (public keys with `kid` and `alg`), re-read
    /// when it changes; empty: none.
    pub jwks_file: String,
    /// The `aud` a token must carry; empty: `aud` is not checked.
    pub audience: String,
    /// The `iss` a token must carry; empty: `iss` is not checked.
    pub issuer: String,
    /// Longest lifetime accepted: `exp` at most this far past `iat` (or
    /// past now, without `iat`).
    pub max_lifetime_secs: u64,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway_secs: u64,
    /// How often the key files are checked for changes.
    pub reload_interval_secs: u64,
}

/// One key tokens may be signed with.
#[derive(Debug, Clone, Deserialize)]
pub struct EdgeKeySettings {
    /// The `kid` of tokens signed with it; empty: tokens without `kid`.
    #[serde(default)]
    pub kid: String,
    /// `HS256`, `RS256`, `ES256` or `EdDSA`.
    pub algorithm: String,
    /// The shared secret of `HS256` (at least 32 bytes).
    #[serde(default)]
    pub secret: Option<SecretString>,
    /// A file holding the shared secret instead.
    #[serde(default)]
    pub secret_file: String,
    /// The PEM public key of `RS256`, `ES256` or `EdDSA`.
    #[serde(default)]
    pub public_key_file: String,
}

/// The algorithms a key may name.
pub const EDGE_ALGORITHMS: [&str; 4] = ["HS256", "RS256", "ES256", "EdDSA"];

impl EdgeSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        parse_addr("edge.listen", &self.listen)?;
        parse_addr("edge.metrics_listen", &self.metrics_listen)?;
        let positive = [
            ("edge.max_streams_per_user", self.max_streams_per_user as u64),
            ("edge.stream_buffer", self.stream_buffer as u64),
            ("edge.heartbeat_secs", self.heartbeat_secs),
            ("edge.history_secs", self.history_secs),
            ("edge.history_max_events", self.history_max_events as u64),
            ("edge.tokens.max_lifetime_secs", self.tokens.max_lifetime_secs),
            ("edge.tokens.reload_interval_secs", self.tokens.reload_interval_secs),
        ];
        for (setting, value) in positive {
            if value == 0 {
                return Err(invalid(setting, "must be at least 1"));
            }
        }
        if self.max_request_bytes < 1024 {
            return Err(invalid("edge.max_request_bytes", "must be at least 1024"));
        }
        for origin in &self.allowed_origins {
            let scheme = origin.starts_with("https://") || origin.starts_with("http://");
            if origin != "*" && (!scheme || origin.ends_with('/')) {
                return Err(SettingsError::Invalid {
                    setting: "edge.allowed_origins",
                    reason: format!(
                        "{origin:?} is not an origin: scheme://host[:port] with no path, or *"
                    ),
                });
            }
        }
        if self.tls.client_auth != ClientAuth::None || !self.tls.client_ca_file.is_empty() {
            return Err(invalid(
                "edge.tls.client_auth",
                "must be \"none\": end users authenticate with tokens",
            ));
        }
        if self.tls.enabled() && self.tls.key_file.is_empty() {
            return Err(invalid("edge.tls.key_file", "must be set with edge.tls.cert_file"));
        }
        if self.tls.reload_interval_secs == 0 {
            return Err(invalid("edge.tls.reload_interval_secs", "must be at least 1"));
        }
        for (index, key) in self.tokens.keys.iter().enumerate() {
            key.validate(index)?;
        }
        Ok(())
    }
}

impl EdgeKeySettings {
    fn validate(&self, index: usize) -> Result<(), SettingsError> {
        let fail = |reason: String| SettingsError::Invalid {
            setting: "edge.tokens.keys",
            reason: format!("keys[{index}]: {reason}"),
        };
        if !EDGE_ALGORITHMS.contains(&self.algorithm.as_str()) {
            return Err(fail(format!(
                "algorithm {:?} is not one of {}",
                self.algorithm,
                EDGE_ALGORITHMS.join(", ")
            )));
        }
        let secret = self.secret.is_some() || !self.secret_file.is_empty();
        let public = !self.public_key_file.is_empty();
        match (self.algorithm == "HS256", secret, public) {
            (true, true, false) | (false, false, true) => Ok(()),
            (true, _, _) => Err(fail("HS256 takes exactly one of secret and secret_file".into())),
            (false, _, _) => Err(fail(format!("{} takes public_key_file only", self.algorithm))),
        }
    }
}
