//! What a run needs before any connection: user tokens signed with the
//! edge's HS256 key, enough file descriptors for the bench and the edge,
//! the loopback source addresses the streams connect from, and the edge's
//! own configuration section.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::SystemTime;

use anyhow::{Context as _, bail};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use serde::Serialize;

/// The `aud` the bench's edge asks of tokens.
pub const AUDIENCE: &str = "notify-bench";

/// The `kid` of the bench's key.
const KID: &str = "bench";

/// Signs user tokens as an app's backend does (HS256 JWTs:
/// docs/edge.md#signing-user-tokens).
pub struct Signer {
    /// The shared secret: 64 hex digits, whose text is the key.
    secret: String,
    key: EncodingKey,
    header: Header,
    issued_at: u64,
}

#[derive(Serialize)]
struct Claims {
    sub: String,
    iat: u64,
    exp: u64,
    aud: &'static str,
}

impl Signer {
    /// A signer with a fresh random 32-byte secret.
    pub fn random() -> Self {
        let bytes: [u8; 32] = rand::random();
        let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(KID.to_owned());
        let key = EncodingKey::from_secret(secret.as_bytes());
        let issued_at =
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Self { secret, key, header, issued_at }
    }

    /// The secret as the edge's configuration takes it.
    pub fn secret_text(&self) -> &str {
        &self.secret
    }

    /// A token of `user`, valid for three hours.
    pub fn token(&self, user: u64) -> String {
        let claims = Claims {
            sub: user.to_string(),
            iat: self.issued_at,
            exp: self.issued_at + 3 * 3600,
            aud: AUDIENCE,
        };
        jsonwebtoken::encode(&self.header, &claims, &self.key).expect("HS256 claims encode")
    }
}

/// Descriptors the bench and the edge need besides one per stream (pools,
/// listeners, the mark-read connections).
pub const SPARE_FILES: u64 = 1_000;

/// Raises this process's open-file limit (soft and hard) to at least
/// `wanted`; the children spawned after inherit it. Returns the limit.
pub fn raise_open_files(wanted: u64) -> anyhow::Result<u64> {
    let limit = getrlimit(Resource::Nofile);
    let (soft, hard) = (limit.current.unwrap_or(u64::MAX), limit.maximum.unwrap_or(u64::MAX));
    if soft >= wanted {
        return Ok(soft);
    }
    let raised = Rlimit { current: Some(wanted), maximum: Some(hard.max(wanted)) };
    setrlimit(Resource::Nofile, raised).with_context(|| {
        format!(
            "RLIMIT_NOFILE: cannot raise {soft} (hard {hard}) to {wanted}: raising the hard limit \
             takes CAP_SYS_RESOURCE (root in most places; limits.conf, systemd LimitNOFILE, \
             `ulimit -Hn`); under this one ask for at most --connections {}",
            hard.saturating_sub(SPARE_FILES)
        )
    })?;
    Ok(wanted)
}

/// Ports one source address can connect from
/// (`net.ipv4.ip_local_port_range`).
pub fn ephemeral_ports() -> anyhow::Result<u64> {
    let path = "/proc/sys/net/ipv4/ip_local_port_range";
    let text = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
    let bounds: Vec<u64> = text.split_whitespace().filter_map(|n| n.parse().ok()).collect();
    match bounds.as_slice() {
        [low, high] if high >= low => Ok(high - low + 1),
        _ => bail!("{path}: not a port range: {text:?}"),
    }
}

/// The loopback source addresses of `connections` streams, at most
/// `per_source` each: 127.0.0.2, 127.0.0.3, ... (every 127/8 address is
/// the loopback interface's on Linux).
pub fn sources(connections: usize, per_source: usize) -> Vec<Ipv4Addr> {
    let count = connections.div_ceil(per_source.max(1)).max(1);
    (0..count as u32).map(|i| Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 0, 2)) + i)).collect()
}

/// The edge's settings for the run.
pub struct EdgeConfig {
    /// Where it serves.
    pub listen: SocketAddr,
    /// Where it serves `/metrics` and the probes.
    pub metrics: SocketAddr,
    /// `edge.worker_threads`.
    pub worker_threads: usize,
    /// `edge.heartbeat_secs`.
    pub heartbeat_secs: u64,
}

impl EdgeConfig {
    /// The `[edge]` section: the bench's key and audience, no rate limit
    /// (`requests_per_second = 0`: every stream opens, every call passes)
    /// and one stream per user at most.
    pub fn toml(&self, signer: &Signer) -> String {
        format!(
            "[edge]\nlisten = \"{}\"\nmetrics_listen = \"{}\"\nworker_threads = {}\n\
             heartbeat_secs = {}\nrequests_per_second = 0\nmax_streams_per_user = 4\n\
             shutdown_grace_secs = 2\n\n[edge.tokens]\naudience = \"{AUDIENCE}\"\n\n\
             [[edge.tokens.keys]]\nkid = \"{KID}\"\nalgorithm = \"HS256\"\nsecret = \"{}\"\n",
            self.listen,
            self.metrics,
            self.worker_threads,
            self.heartbeat_secs,
            signer.secret_text()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_an_hs256_jwt_of_its_user() {
        let signer = Signer::random();
        let mut validation = jsonwebtoken::Validation::new(Algorithm::HS256);
        validation.set_audience(&[AUDIENCE]);
        let key = jsonwebtoken::DecodingKey::from_secret(signer.secret_text().as_bytes());
        let token = jsonwebtoken::decode::<serde_json::Value>(&signer.token(42), &key, &validation)
            .expect("the token verifies");
        assert_eq!(token.header.kid.as_deref(), Some(KID));
        assert_eq!(token.claims["sub"], "42");
    }

    #[test]
    fn sources_take_at_most_their_share() {
        assert_eq!(sources(50_000, 20_000).len(), 3);
        assert_eq!(sources(10, 20_000), vec![Ipv4Addr::new(127, 0, 0, 2)]);
        assert_eq!(sources(600, 254)[2], Ipv4Addr::new(127, 0, 0, 4));
    }

    #[test]
    fn the_section_is_toml_the_settings_read() {
        let config = EdgeConfig {
            listen: "127.0.0.1:8480".parse().unwrap(),
            metrics: "127.0.0.1:9466".parse().unwrap(),
            worker_threads: 0,
            heartbeat_secs: 15,
        };
        let read: toml::Table = config.toml(&Signer::random()).parse().unwrap();
        assert_eq!(read["edge"]["requests_per_second"].as_integer(), Some(0));
        assert_eq!(read["edge"]["tokens"]["keys"][0]["secret"].as_str().map(str::len), Some(64));
    }
}
