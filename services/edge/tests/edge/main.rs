//! `notify-edge` against the real api, worker, MariaDB, RabbitMQ and Redis,
//! over HTTP from real clients: the user tokens, every call against the
//! gRPC answer for the same user, the event stream and its resume, and the
//! browser rules.

mod auth;
mod browser;
mod calls;
mod rules;
mod sdk;
mod stream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use notify_domain::Settings;
use notify_domain::settings::EdgeKeySettings;
use notify_testkit::TestApp;
use secrecy::SecretString;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The audience every test edge asks tokens for.
pub const AUDIENCE: &str = "notify-tests";

/// The HS256 secret of the test edges.
pub const SECRET: &str = "a-shared-secret-of-at-least-32-bytes!";

/// The origin the test edges allow.
pub const ORIGIN: &str = "https://app.example";

/// Keys of every algorithm: the signing halves stay here, the verifying
/// halves go into the edge's settings (files in `dir`).
pub struct Keys {
    /// The ES256 key pair (kid `es`).
    pub es256: rcgen::KeyPair,
    /// The Ed25519 key pair (kid `ed`).
    pub eddsa: rcgen::KeyPair,
    /// Where the public halves are written.
    pub dir: tempfile::TempDir,
}

impl Keys {
    /// Fresh ES256 and Ed25519 pairs, their public halves written.
    pub fn new() -> Self {
        let es256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let eddsa = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let dir = tempfile::Builder::new().prefix("notify-edge-keys-").tempdir().unwrap();
        std::fs::write(dir.path().join("es256.pem"), es256.public_key_pem()).unwrap();
        std::fs::write(dir.path().join("eddsa.pem"), eddsa.public_key_pem()).unwrap();
        Self { es256, eddsa, dir }
    }

    /// A file in the keys' directory.
    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    /// The edge's keys: one per algorithm, each by its kid.
    pub fn settings(&self) -> Vec<EdgeKeySettings> {
        let key = |kid: &str, algorithm: &str| EdgeKeySettings {
            kid: kid.into(),
            algorithm: algorithm.into(),
            secret: None,
            secret_file: String::new(),
            public_key_file: String::new(),
        };
        vec![
            EdgeKeySettings { secret: Some(SecretString::from(SECRET)), ..key("hs", "HS256") },
            EdgeKeySettings { public_key_file: rsa_public(), ..key("rs", "RS256") },
            EdgeKeySettings { public_key_file: self.path("es256.pem"), ..key("es", "ES256") },
            EdgeKeySettings { public_key_file: self.path("eddsa.pem"), ..key("ed", "EdDSA") },
        ]
    }
}

impl Default for Keys {
    fn default() -> Self {
        Self::new()
    }
}

fn rsa_public() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/edge/keys/rs256-public.pem").to_owned()
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// A token's claims; `sub` is a JSON value so tests can break it.
pub fn claims(user: u64) -> Value {
    serde_json::json!({ "sub": user.to_string(), "exp": now() + 600, "iat": now(), "aud": AUDIENCE })
}

/// Signs `claims` with the key of `kid` (its algorithm).
pub fn sign(keys: &Keys, kid: &str, claims: &Value) -> String {
    let (algorithm, key) = match kid {
        "hs" => (Algorithm::HS256, EncodingKey::from_secret(SECRET.as_bytes())),
        "rs" => {
            let pem = std::fs::read(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/edge/keys/rs256-private.pem"
            ))
            .unwrap();
            (Algorithm::RS256, EncodingKey::from_rsa_pem(&pem).unwrap())
        }
        "es" => (
            Algorithm::ES256,
            EncodingKey::from_ec_pem(keys.es256.serialize_pem().as_bytes()).unwrap(),
        ),
        "ed" => (
            Algorithm::EdDSA,
            EncodingKey::from_ed_pem(keys.eddsa.serialize_pem().as_bytes()).unwrap(),
        ),
        other => panic!("no test key {other}"),
    };
    let mut header = Header::new(algorithm);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

/// A token of `user`, HS256.
pub fn token(keys: &Keys, user: u64) -> String {
    sign(keys, "hs", &claims(user))
}

/// An edge serving in this process.
pub struct Edge {
    /// Where it serves the calls and the stream.
    pub addr: SocketAddr,
    /// Where it serves /metrics and the probes.
    pub metrics: SocketAddr,
    /// The keys its tokens are signed with.
    pub keys: Keys,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

/// The test edge's settings over the app's.
pub fn edge_settings(app: &TestApp, keys: &Keys) -> Settings {
    let mut settings = app.settings.clone();
    let edge = &mut settings.edge;
    edge.listen = "127.0.0.1:0".into();
    edge.metrics_listen = "127.0.0.1:0".into();
    edge.worker_threads = 2;
    edge.allowed_origins = vec![ORIGIN.into()];
    edge.requests_per_second = 1000;
    edge.burst = 1000;
    edge.heartbeat_secs = 1;
    edge.shutdown_grace_secs = 1;
    edge.tokens.keys = keys.settings();
    edge.tokens.audience = AUDIENCE.into();
    edge.tokens.reload_interval_secs = 1;
    settings
}

impl Edge {
    /// Starts an edge with the default test settings.
    pub async fn start(app: &TestApp) -> Self {
        let keys = Keys::new();
        let settings = edge_settings(app, &keys);
        Self::start_with(settings, keys).await
    }

    /// Starts an edge with `settings` (see [`edge_settings`]).
    pub async fn start_with(settings: Settings, keys: Keys) -> Self {
        let built = notify_edge::Application::build(settings).await.expect("the edge builds");
        let addr = built.local_addr().unwrap();
        let metrics = built.metrics_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(built.run_until_stopped(shutdown.clone()));
        // Serving once its readiness answers (the bus is read by then).
        notify_testkit::eventually("the edge is ready", Duration::from_secs(20), || async {
            let (status, _) = notify_testkit::try_http_get(metrics, "/readyz").await.ok()?;
            (status == 200).then_some(())
        })
        .await;
        Self { addr, metrics, keys, shutdown, task }
    }

    /// A token of `user` for this edge.
    pub fn token(&self, user: u64) -> String {
        token(&self.keys, user)
    }

    /// The sum of metric `name` on the edge's metrics page (the recorder
    /// is the process's, shared by every edge of this test binary).
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, page) = notify_testkit::try_http_get(self.metrics, "/metrics").await.unwrap();
        notify_testkit::metric_sum(&page, name)
    }

    /// Stops the edge and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// An answer: status, headers, and the body as JSON (`Null` when empty or
/// not JSON).
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: http::HeaderMap,
    /// The body as JSON.
    pub body: Value,
}

impl Answer {
    /// The error code of an error answer.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_default()
    }

    /// The field of a 400.
    pub fn field(&self) -> &str {
        self.body["error"]["field"].as_str().unwrap_or_default()
    }
}

/// Calls the edge: `method path` with `headers` and a body.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Answer {
    let (status, headers, bytes) = call_raw(addr, method, path, headers, body).await;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer { status, headers, body }
}

/// [`call`], answering the body's bytes as they came.
pub async fn call_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, http::HeaderMap, Bytes) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut request = http::Request::builder().method(method).uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let body = Full::new(Bytes::from(body.unwrap_or_default().to_owned()));
    let response = client.request(request.body(body).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, bytes)
}

/// `GET path` as `token`'s user.
pub async fn get(edge: &Edge, token: &str, path: &str) -> Answer {
    let bearer = format!("Bearer {token}");
    call(edge.addr, "GET", path, &[("authorization", &bearer)], None).await
}

/// `method path` with a JSON body as `token`'s user.
pub async fn send(edge: &Edge, token: &str, method: &str, path: &str, body: &Value) -> Answer {
    let bearer = format!("Bearer {token}");
    let body = body.to_string();
    call(edge.addr, method, path, &[("authorization", &bearer)], Some(&body)).await
}

/// A path of the test directory.
pub fn scratch(keys: &Keys, name: &str) -> PathBuf {
    keys.dir.path().join(name)
}
