//! Signs user tokens for `notify-edge` with an HS256 key of the
//! configuration, as an app's backend signs them
//! (docs/edge.md#signing-user-tokens): `notifyctl user-token` and the edge's
//! development example page (`/dev/token`). Production tokens come from the
//! app's own backend; tokens signed with a private key never come from here.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use notify_domain::settings::EdgeTokenSettings;
use secrecy::ExposeSecret;
use serde::Serialize;

/// Why no token was signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The lifetime asked for is zero or past `edge.tokens.max_lifetime_secs`.
    #[error("{ttl} is not in 1..={max} (edge.tokens.max_lifetime_secs)")]
    Lifetime {
        /// The lifetime asked for.
        ttl: u64,
        /// The longest allowed.
        max: u64,
    },
    /// No HS256 key of that kid.
    #[error("no HS256 key {0:?} in edge.tokens.keys or edge.tokens.jwks_file")]
    UnknownKid(String),
    /// No HS256 key at all.
    #[error(
        "no HS256 key in edge.tokens.keys or edge.tokens.jwks_file to sign with (tokens signed \
         with a private key come from the app's backend: docs/edge.md#signing-user-tokens)"
    )]
    NoKey,
    /// A key's file could not be read or parsed.
    #[error("{0}")]
    Key(String),
}

#[derive(Debug, Serialize)]
struct Claims<'a> {
    sub: String,
    iat: u64,
    exp: u64,
    #[serde(skip_serializing_if = "str::is_empty")]
    aud: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    iss: &'a str,
}

/// A token of `user`, issued at `now` (seconds since the epoch) and valid
/// for `ttl` seconds, signed with the HS256 key `kid` (default: the first
/// of `edge.tokens.keys`, else of `edge.tokens.jwks_file`), carrying the
/// configured audience and issuer.
pub fn sign(
    tokens: &EdgeTokenSettings,
    user: u64,
    ttl: u64,
    kid: Option<&str>,
    now: u64,
) -> Result<String, SignError> {
    if ttl == 0 || ttl > tokens.max_lifetime_secs {
        return Err(SignError::Lifetime { ttl, max: tokens.max_lifetime_secs });
    }
    let (kid, secret) = hs256_key(tokens, kid)?;
    let claims = Claims {
        sub: user.to_string(),
        iat: now,
        exp: now + ttl,
        aud: &tokens.audience,
        iss: &tokens.issuer,
    };
    let mut header = Header::new(Algorithm::HS256);
    header.kid = (!kid.is_empty()).then_some(kid);
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(&secret))
        .map_err(|e| SignError::Key(e.to_string()))
}

/// The kid and secret of the HS256 key to sign with.
fn hs256_key(
    tokens: &EdgeTokenSettings,
    wanted: Option<&str>,
) -> Result<(String, Vec<u8>), SignError> {
    let chosen = |kid: &str| wanted.is_none_or(|wanted| wanted == kid);
    if let Some(key) = tokens.keys.iter().find(|k| k.algorithm == "HS256" && chosen(&k.kid)) {
        let secret = match &key.secret {
            Some(secret) => secret.expose_secret().as_bytes().to_vec(),
            None => std::fs::read(&key.secret_file)
                .map_err(|e| {
                    SignError::Key(format!(
                        "edge.tokens.keys (kid {:?}): {}: {e}",
                        key.kid, key.secret_file
                    ))
                })?
                .trim_ascii()
                .to_vec(),
        };
        return Ok((key.kid.clone(), secret));
    }
    if !tokens.jwks_file.is_empty() {
        let file = &tokens.jwks_file;
        let text = std::fs::read(file)
            .map_err(|e| SignError::Key(format!("edge.tokens.jwks_file {file}: {e}")))?;
        let set: JwkSet = serde_json::from_slice(&text).map_err(|e| {
            SignError::Key(format!("edge.tokens.jwks_file {file}: not a JWKS: {e}"))
        })?;
        for jwk in &set.keys {
            let kid = jwk.common.key_id.clone().unwrap_or_default();
            if let (Some(KeyAlgorithm::HS256), AlgorithmParameters::OctetKey(octets)) =
                (jwk.common.key_algorithm, &jwk.algorithm)
                && chosen(&kid)
            {
                let secret = URL_SAFE_NO_PAD.decode(&octets.value).map_err(|_| {
                    SignError::Key(format!("edge.tokens.jwks_file: key {kid:?} is not base64url"))
                })?;
                return Ok((kid, secret));
            }
        }
    }
    Err(match wanted {
        Some(kid) => SignError::UnknownKid(kid.to_owned()),
        None => SignError::NoKey,
    })
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{DecodingKey, Validation};
    use notify_domain::settings::EdgeKeySettings;
    use secrecy::SecretString;

    use super::*;

    const SECRET: &str = "a-development-secret-of-32-bytes-or-more";

    fn tokens() -> EdgeTokenSettings {
        let mut tokens = notify_domain::Settings::defaults().unwrap().edge.tokens;
        tokens.audience = "app".into();
        tokens.keys = vec![EdgeKeySettings {
            kid: "dev".into(),
            algorithm: "HS256".into(),
            secret: Some(SecretString::from(SECRET)),
            secret_file: String::new(),
            public_key_file: String::new(),
        }];
        tokens
    }

    #[test]
    fn a_token_carries_the_user_the_lifetime_the_audience_and_the_kid() {
        let now = jsonwebtoken::get_current_timestamp();
        let token = sign(&tokens(), 42, 600, None, now).unwrap();
        assert_eq!(jsonwebtoken::decode_header(&token).unwrap().kid.as_deref(), Some("dev"));
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&["app"]);
        let claims = jsonwebtoken::decode::<serde_json::Value>(
            &token,
            &DecodingKey::from_secret(SECRET.as_bytes()),
            &validation,
        )
        .unwrap()
        .claims;
        assert_eq!(claims["sub"], "42");
        assert_eq!(claims["exp"].as_u64(), Some(now + 600));
    }

    #[test]
    fn an_oct_key_of_the_jwks_file_signs_and_wrong_asks_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        let jwks = serde_json::json!({ "keys": [
            { "kty": "oct", "kid": "file", "alg": "HS256", "k": URL_SAFE_NO_PAD.encode(SECRET) }
        ]});
        std::fs::write(&path, jwks.to_string()).unwrap();
        let mut tokens = tokens();
        tokens.keys.clear();
        tokens.jwks_file = path.to_string_lossy().into_owned();
        let (kid, secret) = hs256_key(&tokens, None).unwrap();
        assert_eq!((kid.as_str(), secret.as_slice()), ("file", SECRET.as_bytes()));

        let error = hs256_key(&tokens, Some("other")).unwrap_err();
        assert!(matches!(&error, SignError::UnknownKid(kid) if kid == "other"), "{error}");
        let error = sign(&tokens, 42, 90_000, None, 0).unwrap_err().to_string();
        assert!(error.starts_with("90000 is not in 1..=86400"), "{error}");
        tokens.jwks_file.clear();
        assert!(matches!(sign(&tokens, 42, 60, None, 0), Err(SignError::NoKey)));
    }
}
