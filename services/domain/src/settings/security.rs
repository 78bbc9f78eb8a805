//! Settings of callers and transport security: TLS on the gRPC listener, the
//! clients with their credentials, scopes and limits, and TLS to MySQL.

use std::collections::HashSet;
use std::net::SocketAddr;

use serde::Deserialize;

use super::{SettingsError, invalid};
use crate::scope::Scope;

/// Who may use gRPC reflection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReflectionMode {
    /// Not served.
    Off,
    /// Served to any authenticated client (to everyone while auth is off).
    Authenticated,
    /// Served to everyone.
    Open,
}

/// Whether the gRPC listener asks clients for certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// No client certificates.
    None,
    /// A certificate, when presented, must verify and identifies a client.
    Optional,
    /// Every connection must present a certificate signed by the client CA.
    Required,
}

/// TLS to MySQL, as MySQL clients name the modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MySqlTlsMode {
    /// Plain TCP.
    Disabled,
    /// TLS when the server offers it, unverified.
    Preferred,
    /// TLS or no connection, unverified.
    Required,
    /// TLS with a certificate signed by the CA.
    VerifyCa,
    /// TLS with a certificate signed by the CA for the server's host name.
    VerifyIdentity,
}

/// TLS on the gRPC listener.
#[derive(Debug, Clone, Deserialize)]
pub struct ApiTlsSettings {
    /// PEM certificate chain; TLS is on when set.
    pub cert_file: String,
    /// PEM private key.
    pub key_file: String,
    /// PEM CA of client certificates.
    pub client_ca_file: String,
    /// Whether clients present certificates.
    pub client_auth: ClientAuth,
    /// How often the files are checked for changes.
    pub reload_interval_secs: u64,
}

impl ApiTlsSettings {
    /// Returns true when the listener speaks TLS.
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty()
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if self.enabled() && self.key_file.is_empty() {
            return Err(invalid("api.tls.key_file", "must be set with api.tls.cert_file"));
        }
        if !self.enabled() && (!self.key_file.is_empty() || !self.client_ca_file.is_empty()) {
            return Err(invalid("api.tls.cert_file", "must be set when other api.tls files are"));
        }
        if self.client_auth != ClientAuth::None && self.client_ca_file.is_empty() {
            return Err(invalid(
                "api.tls.client_ca_file",
                "must be set when api.tls.client_auth is \"optional\" or \"required\"",
            ));
        }
        if self.reload_interval_secs == 0 {
            return Err(invalid("api.tls.reload_interval_secs", "must be at least 1"));
        }
        Ok(())
    }
}

/// Who may call the api.
#[derive(Debug, Clone, Deserialize)]
pub struct AuthSettings {
    /// Every call but health needs a client's credentials.
    pub enabled: bool,
    /// Lets the api listen beyond loopback with `enabled = false`.
    pub insecure_allow_unauthenticated: bool,
    /// The callers.
    pub clients: Vec<ClientSettings>,
}

/// One calling service, with its credentials, scopes and limits.
#[derive(Debug, Clone, Deserialize)]
pub struct ClientSettings {
    /// Its name: `[a-z0-9_.-]`, at most 64 bytes.
    pub name: String,
    /// Hex SHA-256 digests of its bearer tokens (two during a rotation).
    #[serde(default)]
    pub token_sha256: Vec<String>,
    /// Subject alternative names (DNS or URI) or common names of its client
    /// certificates.
    #[serde(default)]
    pub cert_names: Vec<String>,
    /// What it may do.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// `sender` values it may use; empty means its own name; `*` any.
    #[serde(default)]
    pub senders: Vec<String>,
    /// Calls per second over every replica; 0: no limit.
    #[serde(default)]
    pub requests_per_second: u32,
    /// Calls allowed at once above the rate; 0: `requests_per_second`.
    #[serde(default)]
    pub burst: u32,
    /// Recipients per minute of sends and appended batches; 0: no limit.
    #[serde(default)]
    pub recipients_per_minute: u64,
    /// Announcements (all-user sends) per hour; 0: no limit.
    #[serde(default)]
    pub announcements_per_hour: u32,
    /// Endpoints called with events of its own sends (see `docs/webhooks.md`).
    #[serde(default)]
    pub webhooks: Vec<super::WebhookEndpoint>,
}

/// Longest client name, in bytes.
pub const MAX_CLIENT_NAME_BYTES: usize = 64;

/// Checks a client name: 1..=64 bytes of `[a-z0-9_.-]`.
pub fn valid_client_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_CLIENT_NAME_BYTES
        && name.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-'))
}

impl AuthSettings {
    pub(super) fn validate(&self, tls: &ApiTlsSettings) -> Result<(), SettingsError> {
        if self.enabled && self.clients.is_empty() {
            return Err(invalid("auth.clients", "must define a client when auth.enabled is true"));
        }
        let mut names = HashSet::new();
        let mut tokens = HashSet::new();
        let mut cert_names = HashSet::new();
        for (index, client) in self.clients.iter().enumerate() {
            let field = |what: &str| format!("auth.clients[{index}].{what}");
            let fail = |what: &str, reason: String| SettingsError::Invalid {
                setting: "auth.clients",
                reason: format!("{}: {reason}", field(what)),
            };
            if !valid_client_name(&client.name) {
                return Err(fail(
                    "name",
                    format!("{:?} must be 1..=64 of [a-z0-9_.-]", client.name),
                ));
            }
            if !names.insert(client.name.as_str()) {
                return Err(fail("name", format!("client {:?} is defined twice", client.name)));
            }
            if client.token_sha256.is_empty() && client.cert_names.is_empty() {
                return Err(fail("token_sha256", "needs a token or cert_names".to_owned()));
            }
            for hash in &client.token_sha256 {
                let hex = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit());
                if !hex {
                    return Err(fail(
                        "token_sha256",
                        format!("{hash:?} is not 64 hex digits (see `notifyctl token new`)"),
                    ));
                }
                if !tokens.insert(hash.to_ascii_lowercase()) {
                    return Err(fail("token_sha256", "a token hash is used twice".to_owned()));
                }
            }
            if !client.cert_names.is_empty() && tls.client_auth == ClientAuth::None {
                return Err(fail(
                    "cert_names",
                    "needs api.tls.client_auth \"optional\" or \"required\"".to_owned(),
                ));
            }
            for name in &client.cert_names {
                if !cert_names.insert(name.as_str()) {
                    return Err(fail("cert_names", format!("{name:?} names two clients")));
                }
            }
            for scope in &client.scopes {
                if scope.parse::<Scope>().is_err() {
                    return Err(fail(
                        "scopes",
                        format!("unknown scope {scope:?}; known: {}", Scope::names().join(", ")),
                    ));
                }
            }
            // A limit's bucket spaces its tokens whole microseconds apart.
            let limits = [
                ("requests_per_second", u64::from(client.requests_per_second), 1_000_000),
                ("recipients_per_minute", client.recipients_per_minute, 60_000_000),
                ("announcements_per_hour", u64::from(client.announcements_per_hour), 3_600_000_000),
            ];
            for (what, count, most) in limits {
                if count > most {
                    return Err(fail(
                        what,
                        format!("{count} is above {most}, the most a limit can count"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Refuses an api listener beyond loopback without authentication: one
    /// line naming the settings to set.
    pub fn check_listener(&self, listen: SocketAddr) -> Result<(), SettingsError> {
        if self.enabled || self.insecure_allow_unauthenticated || listen.ip().is_loopback() {
            return Ok(());
        }
        Err(SettingsError::Invalid {
            setting: "auth.enabled",
            reason: format!(
                "api.listen {listen} is reachable beyond this host and authentication is off; \
                 set auth.enabled = true with [[auth.clients]] (or listen on 127.0.0.1, or set \
                 auth.insecure_allow_unauthenticated = true)"
            ),
        })
    }
}
