//! User tokens: JWTs the app's backend signs, whose `sub` is the user id.
//!
//! A token names its key by `kid` (or none, for the one key configured
//! without a kid); the key fixes the algorithm, so a token cannot choose a
//! weaker one than its key's (no `alg` confusion, no `none`). Verification
//! is `jsonwebtoken`'s; around it the edge checks what a user token must
//! carry: `sub` (a user id), `exp`, a lifetime no longer than
//! `edge.tokens.max_lifetime_secs`, and the configured `aud` and `iss`.
//!
//! Keys come from the configuration (secrets and PEM files) and from an
//! optional JWKS file. The files are re-read every
//! `edge.tokens.reload_interval_secs`, and a changed set that loads replaces
//! the old one whole (a rotation adds the new `kid` first, then drops the
//! old once no token signed with it is alive); one that does not load keeps
//! the old set and is counted in `notify_edge_key_reload_errors_total`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use arc_swap::ArcSwap;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use notify_domain::domain::UserId;
use notify_domain::settings::{EdgeKeySettings, EdgeTokenSettings};
use secrecy::ExposeSecret;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Shortest HS256 secret accepted, in bytes (RFC 7518: at least the
/// hash's size).
const MIN_SECRET_BYTES: usize = 32;

/// Why a request's token was refused: each answers 401 with its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` header.
    Missing,
    /// Not a JWT, or its claims are not JSON of the expected shapes.
    Malformed,
    /// Its `kid` names no configured key (or it has none and no key is
    /// configured without one).
    UnknownKey,
    /// Its `alg` is not its key's.
    WrongAlgorithm,
    /// The signature does not verify.
    BadSignature,
    /// `exp` has passed.
    Expired,
    /// `nbf` is still ahead.
    NotYetValid,
    /// `aud` is not the configured audience.
    WrongAudience,
    /// `iss` is not the configured issuer.
    WrongIssuer,
    /// `exp` or `sub` is missing.
    MissingClaim,
    /// `sub` is not a user id.
    BadSubject,
    /// It lives longer than `edge.tokens.max_lifetime_secs`.
    TooLong,
}

impl Refusal {
    /// The code the error body carries, and the metric label.
    pub fn code(self) -> &'static str {
        match self {
            Self::Missing => "token_missing",
            Self::Malformed => "token_malformed",
            Self::UnknownKey => "token_unknown_key",
            Self::WrongAlgorithm => "token_wrong_algorithm",
            Self::BadSignature => "token_bad_signature",
            Self::Expired => "token_expired",
            Self::NotYetValid => "token_not_yet_valid",
            Self::WrongAudience => "token_wrong_audience",
            Self::WrongIssuer => "token_wrong_issuer",
            Self::MissingClaim => "token_missing_claim",
            Self::BadSubject => "token_bad_subject",
            Self::TooLong => "token_lifetime_too_long",
        }
    }

    /// What the caller reads.
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => "send the user token as Authorization: Bearer <token>",
            Self::Malformed => "the token is not a well-formed JWT",
            Self::UnknownKey => "the token's kid names no key this edge knows",
            Self::WrongAlgorithm => "the token's alg is not its key's algorithm",
            Self::BadSignature => "the token's signature does not verify",
            Self::Expired => "the token has expired (exp): get a fresh one",
            Self::NotYetValid => "the token is not valid yet (nbf)",
            Self::WrongAudience => "the token's aud is not this edge's audience",
            Self::WrongIssuer => "the token's iss is not the configured issuer",
            Self::MissingClaim => "the token must carry sub and exp",
            Self::BadSubject => "the token's sub must be a user id (1 to 2^63-1)",
            Self::TooLong => "the token lives longer than this edge allows (exp - iat)",
        }
    }
}

/// What a verified token says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Whose data it reaches.
    pub user: UserId,
    /// When it expires, seconds since the epoch.
    pub expires_at: u64,
}

#[derive(Deserialize)]
struct Claims {
    // Optional here so that a token without them is refused by the
    // validation, naming the claim, not as malformed.
    #[serde(default)]
    sub: Option<Subject>,
    #[serde(default)]
    exp: Option<u64>,
    #[serde(default)]
    iat: Option<u64>,
}

/// `sub` as a string (as RFC 7519 has it) or, leniently, a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum Subject {
    Text(String),
    Number(u64),
}

/// One key: its algorithm and what verifies it.
struct Key {
    algorithm: Algorithm,
    decoding: DecodingKey,
}

/// Every key, by `kid` (`""`: tokens without one).
struct KeySet {
    keys: HashMap<String, Key>,
    /// The files' contents it was built from, to see a change.
    sources: Vec<Vec<u8>>,
}

/// Verifies user tokens against the current keys.
pub struct Tokens {
    settings: EdgeTokenSettings,
    keys: ArcSwap<KeySet>,
}

impl Tokens {
    /// Loads the keys; fails naming the key or file that is wrong, or when
    /// there is none.
    pub async fn load(settings: &EdgeTokenSettings) -> anyhow::Result<Arc<Self>> {
        let sources = read_sources(settings).await?;
        let keys = build(settings, sources)?;
        if keys.keys.is_empty() {
            bail!(
                "edge.tokens: no key to verify user tokens with: set edge.tokens.keys or \
                 edge.tokens.jwks_file (docs/edge.md#signing-user-tokens)"
            );
        }
        Ok(Arc::new(Self { settings: settings.clone(), keys: ArcSwap::from_pointee(keys) }))
    }

    /// Verifies the bearer token of an `Authorization` header value.
    pub fn verify(&self, authorization: Option<&str>) -> Result<Verified, Refusal> {
        let token = authorization
            .and_then(|value| value.strip_prefix("Bearer ").or(value.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or(Refusal::Missing)?;
        self.verify_token(token)
    }

    /// Verifies a token.
    pub fn verify_token(&self, token: &str) -> Result<Verified, Refusal> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Refusal::Malformed)?;
        let keys = self.keys.load();
        let key = keys.keys.get(header.kid.as_deref().unwrap_or("")).ok_or(Refusal::UnknownKey)?;
        if header.alg != key.algorithm {
            return Err(Refusal::WrongAlgorithm);
        }
        let mut validation = Validation::new(key.algorithm);
        validation.leeway = self.settings.leeway_secs;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        if self.settings.audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&[&self.settings.audience]);
            required.push("aud");
        }
        if !self.settings.issuer.is_empty() {
            validation.set_issuer(&[&self.settings.issuer]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        let data = jsonwebtoken::decode::<Claims>(token, &key.decoding, &validation)
            .map_err(|e| refusal(e.kind()))?;
        let claims = data.claims;
        let user = match claims.sub.ok_or(Refusal::MissingClaim)? {
            Subject::Text(text) => text.parse::<u64>().ok(),
            Subject::Number(number) => Some(number),
        }
        .and_then(|raw| UserId::parse(raw, "sub").ok())
        .ok_or(Refusal::BadSubject)?;
        let expires_at = claims.exp.ok_or(Refusal::MissingClaim)?;
        let issued = claims.iat.unwrap_or_else(jsonwebtoken::get_current_timestamp);
        if expires_at.saturating_sub(issued) > self.settings.max_lifetime_secs {
            return Err(Refusal::TooLong);
        }
        Ok(Verified { user, expires_at })
    }

    /// Re-reads the key files every `reload_interval_secs` until
    /// `shutdown`; a changed set that does not load keeps the old one.
    pub async fn watch_files(self: Arc<Self>, shutdown: CancellationToken) {
        let every = Duration::from_secs(self.settings.reload_interval_secs);
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = shutdown.cancelled() => return,
            }
            let loaded = async {
                let sources = read_sources(&self.settings).await?;
                if sources == self.keys.load().sources {
                    return Ok(None);
                }
                build(&self.settings, sources).map(Some)
            };
            match loaded.await {
                Ok(None) => {}
                Ok(Some(keys)) => {
                    let count = keys.keys.len();
                    self.keys.store(Arc::new(keys));
                    metrics::counter!("notify_edge_key_reloads_total").increment(1);
                    info!(keys = count, "user token keys changed, reloaded");
                }
                Err(e) => {
                    metrics::counter!("notify_edge_key_reload_errors_total").increment(1);
                    warn!(error = %format!("{e:#}"), "user token keys do not load, keeping the old ones");
                }
            }
        }
    }
}

fn refusal(kind: &ErrorKind) -> Refusal {
    match kind {
        ErrorKind::InvalidSignature => Refusal::BadSignature,
        ErrorKind::ExpiredSignature => Refusal::Expired,
        ErrorKind::ImmatureSignature => Refusal::NotYetValid,
        ErrorKind::InvalidAudience => Refusal::WrongAudience,
        ErrorKind::InvalidIssuer => Refusal::WrongIssuer,
        ErrorKind::MissingRequiredClaim(_) => Refusal::MissingClaim,
        ErrorKind::InvalidAlgorithm => Refusal::WrongAlgorithm,
        _ => Refusal::Malformed,
    }
}

/// The files keys are read from, in order: each configured key's secret or
/// public key file, then the JWKS file.
async fn read_sources(settings: &EdgeTokenSettings) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut files = Vec::new();
    let paths = settings
        .keys
        .iter()
        .flat_map(|key| [&key.secret_file, &key.public_key_file])
        .chain(std::iter::once(&settings.jwks_file))
        .filter(|path| !path.is_empty());
    for path in paths {
        let contents = tokio::fs::read(path)
            .await
            .with_context(|| format!("edge.tokens: cannot read {path}"))?;
        files.push(contents);
    }
    Ok(files)
}

fn build(settings: &EdgeTokenSettings, sources: Vec<Vec<u8>>) -> anyhow::Result<KeySet> {
    let mut files = sources.iter();
    let mut keys = HashMap::new();
    for (index, configured) in settings.keys.iter().enumerate() {
        let file = (!configured.secret_file.is_empty() || !configured.public_key_file.is_empty())
            .then(|| files.next())
            .flatten();
        let key = configured_key(configured, file.map(Vec::as_slice))
            .with_context(|| format!("edge.tokens.keys[{index}] (kid {:?})", configured.kid))?;
        if keys.insert(configured.kid.clone(), key).is_some() {
            bail!("edge.tokens.keys[{index}]: kid {:?} is named twice", configured.kid);
        }
    }
    if !settings.jwks_file.is_empty() {
        let contents = files.next().map(Vec::as_slice).unwrap_or_default();
        let set: JwkSet = serde_json::from_slice(contents)
            .with_context(|| format!("edge.tokens.jwks_file {}: not a JWKS", settings.jwks_file))?;
        for (index, jwk) in set.keys.iter().enumerate() {
            let context = || format!("edge.tokens.jwks_file {}: keys[{index}]", settings.jwks_file);
            let kid =
                jwk.common.key_id.clone().with_context(|| format!("{}: no kid", context()))?;
            let algorithm = match jwk.common.key_algorithm {
                Some(KeyAlgorithm::HS256) => {
                    let AlgorithmParameters::OctetKey(octets) = &jwk.algorithm else {
                        bail!("{}: alg HS256 takes an oct key", context());
                    };
                    let length = URL_SAFE_NO_PAD.decode(&octets.value).map_or(0, |s| s.len());
                    if length < MIN_SECRET_BYTES {
                        bail!(
                            "{}: the HS256 secret has {length} bytes; at least {MIN_SECRET_BYTES}",
                            context()
                        );
                    }
                    Algorithm::HS256
                }
                Some(KeyAlgorithm::RS256) => Algorithm::RS256,
                Some(KeyAlgorithm::ES256) => Algorithm::ES256,
                Some(KeyAlgorithm::EdDSA) => Algorithm::EdDSA,
                other => bail!("{}: alg {other:?} is not HS256, RS256, ES256 or EdDSA", context()),
            };
            let decoding = DecodingKey::from_jwk(jwk).with_context(context)?;
            if keys.insert(kid.clone(), Key { algorithm, decoding }).is_some() {
                bail!("{}: kid {kid:?} is named twice", context());
            }
        }
    }
    Ok(KeySet { keys, sources })
}

fn configured_key(key: &EdgeKeySettings, file: Option<&[u8]>) -> anyhow::Result<Key> {
    let pem = || file.context("the key file was not read");
    let (algorithm, decoding) = match key.algorithm.as_str() {
        "HS256" => {
            let secret = match (&key.secret, file) {
                (Some(secret), _) => secret.expose_secret().as_bytes().to_vec(),
                (None, Some(contents)) => contents.trim_ascii().to_vec(),
                (None, None) => bail!("HS256 needs secret or secret_file"),
            };
            if secret.len() < MIN_SECRET_BYTES {
                bail!("the HS256 secret has {} bytes; at least {MIN_SECRET_BYTES}", secret.len());
            }
            (Algorithm::HS256, DecodingKey::from_secret(&secret))
        }
        "RS256" => (Algorithm::RS256, DecodingKey::from_rsa_pem(pem()?)?),
        "ES256" => (Algorithm::ES256, DecodingKey::from_ec_pem(pem()?)?),
        "EdDSA" => (Algorithm::EdDSA, DecodingKey::from_ed_pem(pem()?)?),
        other => bail!("algorithm {other:?} is not HS256, RS256, ES256 or EdDSA"),
    };
    Ok(Key { algorithm, decoding })
}
