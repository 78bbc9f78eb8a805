//! Callers: bearer tokens (kept only as SHA-256 digests, compared in
//! constant time) and the registry of configured clients that turns a token
//! or a certificate name into a [`Caller`]. Its scopes are [`crate::scope`]'s
//! (re-exported here), whose names the settings check at load.
//!
//! Tokens are 128 random bits, so a fast digest is as strong as a slow one
//! here: nobody can guess a preimage, and a leaked config reveals no token.
//! (128 bits, as an API key or session id needs, rather than more: HTTP/2
//! never compresses `authorization`, so every call carries the token and the
//! api Huffman-decodes it; tokens made before at 256 bits stay valid.)
//!
//! A client sends its token with every call, and HTTP/2 clients such as
//! tonic's never compress `authorization`; hashing it again on every call was
//! most of what authentication cost (a SHA-256 costs more than the rest of the
//! check). So a token that matched a digest once is remembered in memory
//! (never written anywhere) and later calls compare the presented token with
//! the remembered one, in constant time. Only tokens that matched are kept, so
//! the memory holds at most one entry per configured digest.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, OnceLock, RwLock};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use crate::scope::{Scope, ScopeSet};
use crate::settings::{AuthSettings, ClientSettings};

/// Prefix of Notify tokens, so secret scanners and people can recognise them.
pub const TOKEN_PREFIX: &str = "ntf_";

/// A client's limits; 0 means none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Calls per second over every replica.
    pub requests_per_second: u32,
    /// Calls allowed at once above the rate.
    pub burst: u32,
    /// Recipients per minute.
    pub recipients_per_minute: u64,
    /// Announcements per hour.
    pub announcements_per_hour: u32,
}

/// A configured calling service.
#[derive(Debug)]
pub struct Client {
    name: String,
    scopes: ScopeSet,
    senders: Vec<String>,
    any_sender: bool,
    limits: Limits,
    calls: OnceLock<metrics::Counter>,
}

/// The client a call runs as; cheap to clone.
pub type Caller = Arc<Client>;

/// Name of the client every call runs as while authentication is off.
pub const LOCAL_CLIENT: &str = "local";

impl Client {
    /// The client of every call while authentication is off: every scope,
    /// any sender, no limits.
    pub fn local() -> Self {
        Self {
            name: LOCAL_CLIENT.to_owned(),
            scopes: ScopeSet::all(),
            senders: Vec::new(),
            any_sender: true,
            limits: Limits::default(),
            calls: OnceLock::new(),
        }
    }

    fn from_settings(settings: &ClientSettings) -> Self {
        let scopes = settings.scopes.iter().filter_map(|name| name.parse().ok()).collect();
        let senders = if settings.senders.is_empty() {
            vec![settings.name.clone()]
        } else {
            settings.senders.clone()
        };
        Self {
            name: settings.name.clone(),
            scopes,
            any_sender: senders.iter().any(|s| s == "*"),
            senders,
            limits: Limits {
                requests_per_second: settings.requests_per_second,
                burst: if settings.burst == 0 {
                    settings.requests_per_second
                } else {
                    settings.burst
                },
                recipients_per_minute: settings.recipients_per_minute,
                announcements_per_hour: settings.announcements_per_hour,
            },
            calls: OnceLock::new(),
        }
    }

    /// Builds a client from its parts (tests and tools).
    pub fn new(name: &str, scopes: ScopeSet, senders: &[&str], limits: Limits) -> Self {
        let senders: Vec<String> = senders.iter().map(|s| (*s).to_owned()).collect();
        Self {
            name: name.to_owned(),
            scopes,
            any_sender: senders.iter().any(|s| s == "*"),
            senders,
            limits,
            calls: OnceLock::new(),
        }
    }

    /// Returns the client's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns true if the client may do what `scope` covers, directly or
    /// through `admin`.
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.holds(scope) || self.scopes.holds(Scope::Admin)
    }

    /// Returns true if only `admin` lets the client do what `scope` covers.
    pub fn allowed_only_by_admin(&self, scope: Scope) -> bool {
        !self.scopes.holds(scope) && self.scopes.holds(Scope::Admin)
    }

    /// Returns true if the client may send under `sender`.
    pub fn may_send_as(&self, sender: &str) -> bool {
        self.any_sender || self.senders.iter().any(|s| s == sender)
    }

    /// The sender of a send that names none: the client's first sender.
    pub fn default_sender(&self) -> &str {
        self.senders.first().filter(|s| *s != "*").map_or(&self.name, |s| s.as_str())
    }

    /// The client whose sends this caller may see: `None` for every
    /// client's (scope `sends.all`), else its own name.
    pub fn sends_owner_filter(&self) -> Option<&str> {
        if self.allows(Scope::SendsAll) { None } else { Some(&self.name) }
    }

    /// Returns the client's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Counts an admitted call in `notify_client_calls_total{client}` (the
    /// handle is resolved once per client).
    pub fn count_call(&self) {
        self.calls
            .get_or_init(
                || metrics::counter!("notify_client_calls_total", "client" => self.name.clone()),
            )
            .increment(1);
    }
}

/// A token that matched a digest, and the index of its client.
type VerifiedToken = (Box<[u8]>, usize);

/// Every configured client, found by token digest or certificate name.
#[derive(Debug)]
pub struct Registry {
    enabled: bool,
    local: Caller,
    clients: Vec<Caller>,
    /// (digest, index into `clients`), searched in full on every lookup.
    token_digests: Vec<([u8; 32], usize)>,
    /// Tokens that matched a digest, by a randomly keyed hash of the token
    /// (so a lookup's time depends on nothing an attacker can steer): the
    /// token itself and the index into `clients`.
    verified: RwLock<HashMap<u64, VerifiedToken>>,
    token_hasher: foldhash::quality::RandomState,
    by_cert_name: HashMap<String, usize>,
}

impl Registry {
    /// Builds the registry from validated settings.
    pub fn new(settings: &AuthSettings) -> Self {
        let clients: Vec<Caller> =
            settings.clients.iter().map(|c| Arc::new(Client::from_settings(c))).collect();
        let mut token_digests = Vec::new();
        let mut by_cert_name = HashMap::new();
        for (index, client) in settings.clients.iter().enumerate() {
            for hex in &client.token_sha256 {
                if let Some(digest) = decode_hex_digest(hex) {
                    token_digests.push((digest, index));
                }
            }
            for name in &client.cert_names {
                by_cert_name.insert(name.clone(), index);
            }
        }
        Self {
            enabled: settings.enabled,
            local: Arc::new(Client::local()),
            clients,
            token_digests,
            verified: RwLock::new(HashMap::new()),
            token_hasher: foldhash::quality::RandomState::default(),
            by_cert_name,
        }
    }

    /// Returns true when calls must authenticate.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The caller of every call while authentication is off.
    pub fn local(&self) -> Caller {
        self.local.clone()
    }

    /// Returns every configured client.
    pub fn clients(&self) -> &[Caller] {
        &self.clients
    }

    /// Finds the client of a bearer token. A token seen before is compared
    /// with the remembered one in constant time; any other is digested and
    /// every stored digest compared, in constant time, whatever matches: the
    /// time taken says nothing about how close a wrong token came.
    pub fn by_token(&self, token: &[u8]) -> Option<Caller> {
        let key = self.token_hasher.hash_one(token);
        let remembered =
            self.verified.read().unwrap_or_else(|e| e.into_inner()).get(&key).and_then(
                |(known, index)| constant_time_eq::constant_time_eq(known, token).then_some(*index),
            );
        if let Some(index) = remembered {
            return Some(self.clients[index].clone());
        }
        let digest: [u8; 32] = Sha256::digest(token).into();
        let mut found = None;
        for (stored, index) in &self.token_digests {
            if bool::from(stored.ct_eq(&digest)) {
                found = Some(*index);
            }
        }
        let index = found?;
        self.verified.write().unwrap_or_else(|e| e.into_inner()).insert(key, (token.into(), index));
        Some(self.clients[index].clone())
    }

    /// Finds the client a token with this SHA-256 digest belongs to (a
    /// console session remembers the digest of the token that opened it,
    /// never the token): none once the token is no longer configured.
    pub fn by_token_digest(&self, digest: &[u8; 32]) -> Option<Caller> {
        let mut found = None;
        for (stored, index) in &self.token_digests {
            if bool::from(stored.ct_eq(digest)) {
                found = Some(*index);
            }
        }
        Some(self.clients[found?].clone())
    }

    /// Finds the client one of a certificate's names (SANs, CN) belongs to.
    pub fn by_cert_names<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Option<Caller> {
        names
            .into_iter()
            .find_map(|name| self.by_cert_name.get(name))
            .map(|index| self.clients[*index].clone())
    }
}

fn decode_hex_digest(hex: &str) -> Option<[u8; 32]> {
    let mut digest = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(digest)
}

/// Generates a new bearer token: the prefix and 128 random bits.
pub fn new_token() -> String {
    let bytes: [u8; 16] = rand::random();
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// Returns the hex SHA-256 digest of a token, as `token_sha256` holds it.
pub fn token_sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(clients: Vec<ClientSettings>) -> AuthSettings {
        AuthSettings { enabled: true, insecure_allow_unauthenticated: false, clients }
    }

    fn client(name: &str, tokens: &[&str], scopes: &[&str]) -> ClientSettings {
        ClientSettings {
            name: name.into(),
            token_sha256: tokens.iter().map(|t| token_sha256_hex(t)).collect(),
            cert_names: vec![format!("{name}.internal")],
            scopes: scopes.iter().map(|s| (*s).into()).collect(),
            senders: Vec::new(),
            requests_per_second: 0,
            burst: 0,
            recipients_per_minute: 0,
            announcements_per_hour: 0,
            webhooks: Vec::new(),
        }
    }

    #[test]
    fn both_tokens_of_a_rotation_find_the_client_and_others_find_nothing() {
        let (old, new) = (new_token(), new_token());
        assert!(old.starts_with(TOKEN_PREFIX) && old != new);
        let random = URL_SAFE_NO_PAD.decode(&old[TOKEN_PREFIX.len()..]).unwrap();
        assert_eq!(random.len(), 16, "a token carries 128 random bits");
        let registry = Registry::new(&settings(vec![
            client("billing", &[&old, &new], &["send"]),
            client("growth", &[&new_token()], &["sends.read"]),
        ]));
        assert_eq!(registry.by_token(old.as_bytes()).unwrap().name(), "billing");
        assert_eq!(registry.by_token(new.as_bytes()).unwrap().name(), "billing");
        assert!(registry.by_token(new_token().as_bytes()).is_none());
        assert!(registry.by_token(b"").is_none());
        let digest: [u8; 32] = Sha256::digest(old.as_bytes()).into();
        assert_eq!(registry.by_token_digest(&digest).unwrap().name(), "billing");
        assert!(registry.by_token_digest(&Sha256::digest(b"gone").into()).is_none());
        let by_cert = registry.by_cert_names(["x", "growth.internal"]).unwrap();
        assert_eq!(by_cert.name(), "growth");
    }

    #[test]
    fn a_remembered_token_is_found_again_and_near_misses_are_not() {
        let token = new_token();
        let registry = Registry::new(&settings(vec![client("billing", &[&token], &["send"])]));
        for _ in 0..3 {
            assert_eq!(registry.by_token(token.as_bytes()).unwrap().name(), "billing");
        }
        let mut last_changed = token.clone().into_bytes();
        *last_changed.last_mut().unwrap() ^= 1;
        let longer = format!("{token}x");
        for wrong in [&last_changed[..], &token.as_bytes()[..token.len() - 1], longer.as_bytes()] {
            assert!(registry.by_token(wrong).is_none(), "{:?}", String::from_utf8_lossy(wrong));
        }
        let remembered = registry.verified.read().unwrap().len();
        assert_eq!(remembered, 1, "only tokens that matched a digest are remembered");
    }

    #[test]
    fn admin_allows_everything_and_says_so() {
        let admin =
            Client::new("ops", [Scope::Admin].into_iter().collect(), &[], Limits::default());
        assert!(Scope::ALL.iter().all(|scope| admin.allows(*scope)));
        assert!(admin.allowed_only_by_admin(Scope::SendsManage));
        assert_eq!(admin.sends_owner_filter(), None);
        let sender =
            Client::new("billing", ScopeSet::default().with(Scope::Send), &[], Limits::default());
        assert!(!sender.allows(Scope::SendAllUsers));
        assert_eq!(sender.sends_owner_filter(), Some("billing"));
    }

    #[test]
    fn senders_default_to_the_client_name() {
        let registry =
            Registry::new(&settings(vec![client("billing", &[&new_token()], &["send"])]));
        let billing = &registry.clients()[0];
        assert!(billing.may_send_as("billing"));
        assert!(!billing.may_send_as("growth"));
        assert_eq!(billing.default_sender(), "billing");
        assert!(Client::local().may_send_as("anything"));
    }

    #[test]
    fn token_digest_is_hex_sha256() {
        assert_eq!(
            token_sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
