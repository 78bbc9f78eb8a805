//! Settings of webhooks: each client's endpoints (under `[[auth.clients]]`,
//! as `[[auth.clients.webhooks]]`) and the dispatcher's tuning
//! (`[webhooks]`). Endpoints are checked at load: an https url (plain http
//! only to a loopback host), a Standard Webhooks `whsec_` secret, known
//! event names.

use std::net::IpAddr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::{SettingsError, invalid};

/// The events a webhook endpoint can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WebhookEvent {
    /// A send of the client reached COMPLETED.
    MessageCompleted,
    /// A send of the client was recalled (RECALLED).
    MessageRecalled,
    /// A chunk of a send of the client failed for good.
    MessageFailed,
    /// Recipients read a send of the client (batched, opt-in).
    ItemRead,
}

impl WebhookEvent {
    /// Every event, in the order of the docs.
    pub const ALL: [WebhookEvent; 4] =
        [Self::MessageCompleted, Self::MessageRecalled, Self::MessageFailed, Self::ItemRead];

    /// Returns the event's `type` name, as payloads and the config spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::MessageCompleted => "message.completed",
            Self::MessageRecalled => "message.recalled",
            Self::MessageFailed => "message.failed",
            Self::ItemRead => "item.read",
        }
    }

    /// Parses an event name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|event| event.name() == name)
    }
}

/// One endpoint of a client.
#[derive(Debug, Clone, Deserialize)]
pub struct WebhookEndpoint {
    /// Where events are POSTed: `https://`, or `http://` to a loopback host.
    pub url: String,
    /// The signing secret, `whsec_<base64>` (Standard Webhooks).
    #[serde(default = "empty_secret")]
    pub secret: SecretString,
    /// A file holding the secret instead (a mounted Kubernetes Secret).
    #[serde(default)]
    pub secret_file: String,
    /// The event names it gets; `item.read` only when listed.
    #[serde(default)]
    pub events: Vec<String>,
}

fn empty_secret() -> SecretString {
    SecretString::from(String::new())
}

impl WebhookEndpoint {
    /// Returns true when this endpoint asked for `event`.
    pub fn wants(&self, event: WebhookEvent) -> bool {
        self.events.iter().any(|name| name == event.name())
    }

    /// Returns the HMAC key: the secret's base64 part, decoded. Empty for
    /// a secret that is not valid (refused at load).
    pub fn signing_key(&self) -> Vec<u8> {
        decode_secret(self.secret.expose_secret()).unwrap_or_default()
    }
}

/// Decodes a `whsec_<base64>` secret to its key bytes.
pub fn decode_secret(secret: &str) -> Option<Vec<u8>> {
    STANDARD.decode(secret.strip_prefix("whsec_")?).ok()
}

/// Shortest and longest signing key, in bytes (Standard Webhooks: 24 to 64).
const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// Tuning of the webhook dispatcher in `notify-worker`.
#[derive(Debug, Clone, Deserialize)]
pub struct WebhookSettings {
    /// Longest one call to an endpoint may take (connect, send, answer).
    pub timeout_ms: u64,
    /// Calls in flight at once per client (its queue's prefetch).
    pub concurrency_per_client: u16,
    /// Waits before the 2nd, 3rd, ... attempt; an event is dead-lettered
    /// after `1 + retry_delays_ms.len()` failed attempts.
    pub retry_delays_ms: Vec<u64>,
    /// Most user ids in one `item.read` payload.
    pub read_batch_users: usize,
    /// How often the workers queue the reads waiting for `item.read`.
    pub read_flush_ms: u64,
    /// How long a send's event recorded in the outbox waits for the process
    /// that made its change to queue it before a worker's relay does; also
    /// the relay's interval and its lease on an event it takes.
    pub outbox_retry_ms: u64,
}

impl WebhookSettings {
    /// Attempts at one event before it is dead-lettered.
    pub fn max_attempts(&self) -> u32 {
        u32::try_from(self.retry_delays_ms.len()).unwrap_or(u32::MAX).saturating_add(1)
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        let positive = [
            ("webhooks.timeout_ms", self.timeout_ms),
            ("webhooks.concurrency_per_client", u64::from(self.concurrency_per_client)),
            ("webhooks.read_batch_users", self.read_batch_users as u64),
            ("webhooks.read_flush_ms", self.read_flush_ms),
            ("webhooks.outbox_retry_ms", self.outbox_retry_ms),
        ];
        for (setting, value) in positive {
            if value == 0 {
                return Err(invalid(setting, "must be at least 1"));
            }
        }
        if self.retry_delays_ms.iter().any(|delay| *delay == 0 || *delay > u64::from(u32::MAX)) {
            return Err(invalid(
                "webhooks.retry_delays_ms",
                "every delay must be between 1 and 4294967295 ms",
            ));
        }
        Ok(())
    }
}

/// Reads every endpoint's `secret_file` into its `secret`, trimmed; takes
/// each client's endpoints in `auth.clients` order.
pub(super) fn read_secret_files<'a>(
    clients: impl Iterator<Item = &'a mut Vec<WebhookEndpoint>>,
) -> Result<(), SettingsError> {
    for (index, endpoints) in clients.enumerate() {
        for (hook, endpoint) in endpoints.iter_mut().enumerate() {
            if endpoint.secret_file.is_empty() {
                continue;
            }
            let text = std::fs::read_to_string(&endpoint.secret_file).map_err(|e| {
                SettingsError::File {
                    setting: format!("auth.clients[{index}].webhooks[{hook}].secret_file"),
                    path: endpoint.secret_file.clone(),
                    reason: e.to_string(),
                }
            })?;
            endpoint.secret = SecretString::from(text.trim().to_owned());
        }
    }
    Ok(())
}

/// Checks every client's endpoints, naming the field at fault; takes each
/// client's endpoints in `auth.clients` order.
pub(super) fn validate_endpoints<'a>(
    clients: impl Iterator<Item = &'a Vec<WebhookEndpoint>>,
) -> Result<(), SettingsError> {
    for (index, endpoints) in clients.enumerate() {
        for (hook, endpoint) in endpoints.iter().enumerate() {
            let fail = |what: &str, reason: String| SettingsError::Invalid {
                setting: "auth.clients",
                reason: format!("auth.clients[{index}].webhooks[{hook}].{what}: {reason}"),
            };
            check_url(&endpoint.url).map_err(|reason| fail("url", reason))?;
            let secret = endpoint.secret.expose_secret();
            if secret.is_empty() {
                return Err(fail("secret", "must be set (or secret_file)".to_owned()));
            }
            match decode_secret(secret) {
                Some(key) if KEY_BYTES.contains(&key.len()) => {}
                Some(key) => {
                    return Err(fail(
                        "secret",
                        format!("decodes to {} bytes; must be 24 to 64", key.len()),
                    ));
                }
                None => {
                    return Err(fail("secret", "must be \"whsec_\" and base64".to_owned()));
                }
            }
            if endpoint.events.is_empty() {
                return Err(fail("events", "must name at least one event".to_owned()));
            }
            for name in &endpoint.events {
                if WebhookEvent::parse(name).is_none() {
                    let known: Vec<&str> = WebhookEvent::ALL.iter().map(|e| e.name()).collect();
                    return Err(fail(
                        "events",
                        format!("unknown event {name:?}; known: {}", known.join(", ")),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// An endpoint url: https, or http to a loopback host (local tests).
fn check_url(text: &str) -> Result<(), String> {
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a url ({e})"))?;
    let loopback = match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => return Err(format!("{text:?} has no host")),
    };
    match url.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err(format!("{text:?} must be https (plain http only to a loopback host)")),
        other => Err(format!("{text:?} has scheme {other:?}; must be https")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn with_endpoint(url: &str, secret: &str, events: &[&str]) -> Settings {
        let mut settings = Settings::defaults().unwrap();
        let client = serde_json::json!({
            "name": "billing",
            "token_sha256": ["a".repeat(64)],
            "webhooks": [{
                "url": url,
                "secret": secret,
                "events": events,
            }],
        });
        settings.auth.clients.push(serde_json::from_value(client).unwrap());
        settings
    }

    fn read_secret_files_of(settings: &mut Settings) -> Result<(), SettingsError> {
        read_secret_files(settings.auth.clients.iter_mut().map(|c| &mut c.webhooks))
    }

    #[test]
    fn an_https_endpoint_and_plain_http_to_loopback_are_accepted() {
        for url in ["https://hooks.example/notify", "http://127.0.0.1:8080/h", "http://[::1]/h"] {
            with_endpoint(url, SECRET, &["message.completed"]).validate().unwrap();
        }
        with_endpoint("http://localhost:9/h", SECRET, &["item.read"]).validate().unwrap();
    }

    #[test]
    fn plain_http_beyond_loopback_is_refused_naming_the_field() {
        let err = with_endpoint("http://hooks.example/h", SECRET, &["message.completed"])
            .validate()
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "auth.clients: auth.clients[0].webhooks[0].url: \"http://hooks.example/h\" must be \
             https (plain http only to a loopback host)"
        );
        let err = with_endpoint("ftp://127.0.0.1/h", SECRET, &["message.completed"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("webhooks[0].url"), "{err}");
    }

    #[test]
    fn a_bad_secret_or_event_is_refused_naming_the_field() {
        let err = with_endpoint("https://h.example/", "plain", &["message.completed"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("webhooks[0].secret: must be \"whsec_\" and base64"), "{err}");
        let err = with_endpoint("https://h.example/", "whsec_c2hvcnQ=", &["message.completed"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("decodes to 5 bytes"), "{err}");
        let err = with_endpoint("https://h.example/", SECRET, &["message.sent"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("webhooks[0].events: unknown event \"message.sent\""), "{err}");
    }

    #[test]
    fn a_secret_is_read_from_its_file() {
        let dir = std::env::temp_dir().join(format!("notify-whsec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, format!("{SECRET}\n")).unwrap();
        let mut settings = with_endpoint("https://h.example/", "", &["message.completed"]);
        settings.auth.clients[0].webhooks[0].secret_file = path.display().to_string();
        read_secret_files_of(&mut settings).unwrap();
        settings.validate().unwrap();
        assert_eq!(settings.auth.clients[0].webhooks[0].secret.expose_secret(), SECRET);
        settings.auth.clients[0].webhooks[0].secret_file = dir.join("absent").display().to_string();
        let err = read_secret_files_of(&mut settings).unwrap_err().to_string();
        assert!(err.starts_with("auth.clients[0].webhooks[0].secret_file: cannot read "), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_zero_retry_delay_is_refused() {
        let mut settings = Settings::defaults().unwrap();
        settings.webhooks.retry_delays_ms = vec![1000, 0];
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.starts_with("webhooks.retry_delays_ms: "), "{err}");
    }
}
