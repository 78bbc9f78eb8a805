//! `notifyctl user-token`: signs a user token for `notify-edge` with an
//! HS256 key of the configuration, as an app's backend signs them
//! (docs/edge.md#signing-user-tokens). For development and for trying the
//! edge by hand: production tokens come from the app's own backend.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use clap::Args;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use notify_domain::settings::EdgeTokenSettings;
use secrecy::ExposeSecret;
use serde::Serialize;

/// Arguments of `notifyctl user-token`.
#[derive(Debug, Args)]
pub struct UserTokenArgs {
    /// The user the token is for (its `sub`).
    #[arg(long)]
    user: u64,
    /// Seconds it is valid for (at most `edge.tokens.max_lifetime_secs`).
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
    /// The key to sign with, by kid; default: the first HS256 key of
    /// `edge.tokens.keys`, else of `edge.tokens.jwks_file`.
    #[arg(long)]
    kid: Option<String>,
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

/// Prints a token of `args.user`, signed with an HS256 key of the
/// configuration.
pub fn user_token(args: UserTokenArgs) -> anyhow::Result<()> {
    let settings = notify_domain::Settings::load()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    println!("{}", sign(&settings.edge.tokens, &args, now)?);
    Ok(())
}

fn sign(tokens: &EdgeTokenSettings, args: &UserTokenArgs, now: u64) -> anyhow::Result<String> {
    if args.ttl == 0 || args.ttl > tokens.max_lifetime_secs {
        bail!(
            "--ttl: {} is not in 1..={} (edge.tokens.max_lifetime_secs)",
            args.ttl,
            tokens.max_lifetime_secs
        );
    }
    let (kid, secret) = hs256_key(tokens, args.kid.as_deref())?;
    let claims = Claims {
        sub: args.user.to_string(),
        iat: now,
        exp: now + args.ttl,
        aud: &tokens.audience,
        iss: &tokens.issuer,
    };
    let mut header = Header::new(Algorithm::HS256);
    header.kid = (!kid.is_empty()).then_some(kid);
    Ok(jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(&secret))?)
}

/// The kid and secret of the HS256 key to sign with.
fn hs256_key(
    tokens: &EdgeTokenSettings,
    wanted: Option<&str>,
) -> anyhow::Result<(String, Vec<u8>)> {
    let chosen = |kid: &str| wanted.is_none_or(|wanted| wanted == kid);
    if let Some(key) = tokens.keys.iter().find(|k| k.algorithm == "HS256" && chosen(&k.kid)) {
        let secret = match &key.secret {
            Some(secret) => secret.expose_secret().as_bytes().to_vec(),
            None => std::fs::read(&key.secret_file)
                .with_context(|| {
                    format!("edge.tokens.keys (kid {:?}): {}", key.kid, key.secret_file)
                })?
                .trim_ascii()
                .to_vec(),
        };
        return Ok((key.kid.clone(), secret));
    }
    if !tokens.jwks_file.is_empty() {
        let text = std::fs::read(&tokens.jwks_file)
            .with_context(|| format!("edge.tokens.jwks_file {}", tokens.jwks_file))?;
        let set: JwkSet = serde_json::from_slice(&text)
            .with_context(|| format!("edge.tokens.jwks_file {}: not a JWKS", tokens.jwks_file))?;
        for jwk in &set.keys {
            let kid = jwk.common.key_id.clone().unwrap_or_default();
            if let (Some(KeyAlgorithm::HS256), AlgorithmParameters::OctetKey(octets)) =
                (jwk.common.key_algorithm, &jwk.algorithm)
                && chosen(&kid)
            {
                let secret = URL_SAFE_NO_PAD.decode(&octets.value).with_context(|| {
                    format!("edge.tokens.jwks_file: key {kid:?} is not base64url")
                })?;
                return Ok((kid, secret));
            }
        }
    }
    match wanted {
        Some(kid) => {
            bail!("--kid: no HS256 key {kid:?} in edge.tokens.keys or edge.tokens.jwks_file")
        }
        None => bail!(
            "no HS256 key in edge.tokens.keys or edge.tokens.jwks_file to sign with (tokens signed \
             with a private key come from the app's backend: docs/edge.md#signing-user-tokens)"
        ),
    }
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

    fn args(kid: Option<&str>, ttl: u64) -> UserTokenArgs {
        UserTokenArgs { user: 42, ttl, kid: kid.map(str::to_owned) }
    }

    #[test]
    fn a_token_carries_the_user_the_lifetime_the_audience_and_the_kid() {
        let now = jsonwebtoken::get_current_timestamp();
        let token = sign(&tokens(), &args(None, 600), now).unwrap();
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

        let error = hs256_key(&tokens, Some("other")).unwrap_err().to_string();
        assert!(error.starts_with("--kid: no HS256 key \"other\""), "{error}");
        let error = sign(&tokens, &args(None, 90_000), 0).unwrap_err().to_string();
        assert!(error.starts_with("--ttl: 90000 is not in 1..=86400"), "{error}");
    }
}
