//! Console logins: a client token with `admin` or `console.read` opens a
//! session kept in Redis (under the SHA-256 of its id, so a Redis dump holds
//! no usable cookie) for `console.session_ttl_secs` after its last use,
//! behind an HttpOnly, SameSite=Strict cookie; state changes carry the
//! session's CSRF token and must come from the console's own origin.

use std::sync::Arc;

use axum::Form;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use notify_domain::auth::{Registry, Scope};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::Console;
use super::views::{LoginPage, Nav, render};

/// The session cookie's name.
const COOKIE: &str = "notify_console";

/// A logged-in operator, as the session holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Session {
    /// The client whose token opened it (audit records name it).
    pub client: String,
    /// May use the buttons (`console.manage`, or `admin`).
    pub manage: bool,
    /// The token every form of this session carries.
    pub csrf: String,
    /// The SHA-256 (base64) of the client token that opened it: the session
    /// ends when that token is no longer configured (a rotation, a client
    /// removed). Empty when auth is off.
    #[serde(default)]
    pub token_digest: String,
}

impl Session {
    /// This session as the replica's configuration allows it now: none when
    /// its token or client is gone or the client lost the console scopes;
    /// read-only when it lost `console.manage`.
    fn checked_against(mut self, registry: &Registry) -> Option<Self> {
        let caller = if registry.enabled() {
            let digest: [u8; 32] =
                URL_SAFE_NO_PAD.decode(&self.token_digest).ok()?.try_into().ok()?;
            registry.by_token_digest(&digest).filter(|caller| caller.name() == self.client)?
        } else {
            registry.local()
        };
        self.manage = caller.allows(Scope::ConsoleManage);
        (self.manage || caller.allows(Scope::ConsoleRead)).then_some(self)
    }
}

impl Session {
    /// The header of one of this session's pages, with `tab` open.
    pub(crate) fn nav(&self, tab: &'static str) -> Nav {
        Nav { client: self.client.clone(), csrf: self.csrf.clone(), tab }
    }
}

fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    URL_SAFE_NO_PAD.encode(bytes)
}

fn redis_key(console: &Console, session_id: &str) -> String {
    let digest = Sha256::digest(session_id.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}{{console}}:session:{hex}", console.ctx.cache.keys().prefix())
}

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|cookies| {
        cookies.split(';').find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE && !value.is_empty()).then(|| value.to_owned())
        })
    })
}

impl Console {
    /// Loads the session of a request's cookie, extending its life.
    async fn session_of(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie_value(headers)?;
        let key = redis_key(self, &id);
        let mut redis = self.ctx.cache.connection();
        let ttl = self.session_ttl.as_secs().max(1);
        let stored: Option<String> = match redis.get_ex(&key, redis::Expiry::EX(ttl)).await {
            Ok(stored) => stored,
            Err(e) => {
                warn!(error = %e, "console session store unavailable");
                None
            }
        };
        let session: Session = serde_json::from_str(&stored?).ok()?;
        let current = session.checked_against(&self.registry);
        if current.is_none() {
            // Its token or its scopes were taken away since the login.
            let _: redis::RedisResult<()> = redis.del(&key).await;
        }
        current
    }

    fn cookie(&self, id: &str, max_age: u64) -> String {
        let secure = if self.secure_cookie { "; Secure" } else { "" };
        format!(
            "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
        )
    }
}

/// The session a handler runs under: a request without one is sent to the
/// login page (a GET) or refused (anything else).
pub(crate) struct CurrentSession(pub Session);

impl FromRequestParts<Arc<Console>> for CurrentSession {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Arc<Console>,
    ) -> Result<Self, Self::Rejection> {
        match console.session_of(&parts.headers).await {
            Some(session) => Ok(Self(session)),
            None if parts.method == Method::GET => {
                let next = parts.uri.path_and_query().map_or("/console/sends", |p| p.as_str());
                let next = URL_SAFE_NO_PAD.encode(next);
                Err(Redirect::to(&format!("/console/login?next={next}")).into_response())
            }
            None => Err((StatusCode::UNAUTHORIZED, "log in to the console first").into_response()),
        }
    }
}

/// Why [`check_csrf`] refused a request: a 403 with the reason.
#[derive(Debug)]
pub(crate) struct CsrfRefused(&'static str);

impl IntoResponse for CsrfRefused {
    fn into_response(self) -> Response {
        (StatusCode::FORBIDDEN, self.0).into_response()
    }
}

/// Refuses a state change that did not come from the console's own pages:
/// `Sec-Fetch-Site` (sent by every current browser) must be same-origin;
/// without it, `Origin` must name this host; and the form's token must be
/// the session's.
pub(crate) fn check_csrf(
    headers: &HeaderMap,
    session: &Session,
    token: &str,
) -> Result<(), CsrfRefused> {
    let forbidden = |why: &'static str| Err(CsrfRefused(why));
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some("same-origin") => {}
        Some(_) => return forbidden("cross-site request refused"),
        None if !same_origin(headers) => {
            return forbidden("request without a same-origin Origin refused");
        }
        None => {}
    }
    if !constant_time_eq::constant_time_eq(token.as_bytes(), session.csrf.as_bytes()) {
        return forbidden("the form's token is not this session's (reload the page)");
    }
    Ok(())
}

/// Refuses a login posted from another site (login CSRF: a victim logged
/// into the attacker's session): `Sec-Fetch-Site` must be same-origin or
/// none (typed in); without it, an `Origin` must name this host. A request
/// with neither comes from no browser, and a CSRF needs one.
fn check_login_origin(headers: &HeaderMap) -> Result<(), CsrfRefused> {
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some("same-origin" | "none") => Ok(()),
        Some(_) => Err(CsrfRefused("cross-site login refused")),
        None if headers.contains_key(header::ORIGIN) && !same_origin(headers) => {
            Err(CsrfRefused("login from another origin refused"))
        }
        None => Ok(()),
    }
}

/// True when the request's `Origin` names the host it was sent to.
fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let origin_host = origin.map(|o| o.split_once("://").map_or(o, |(_, rest)| rest));
    origin_host == Some(host)
}

/// Query of the login page.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginQuery {
    /// Where to go after logging in (encoded).
    #[serde(default)]
    next: String,
}

/// Where a login goes next: only a console path.
fn next_path(encoded: &str) -> String {
    URL_SAFE_NO_PAD
        .decode(encoded)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|path| path.starts_with("/console/") && !path.starts_with("//"))
        .unwrap_or_else(|| "/console/sends".to_owned())
}

/// The login page.
pub(crate) async fn login_page(
    State(console): State<Arc<Console>>,
    Query(query): Query<LoginQuery>,
) -> Response {
    render(&LoginPage {
        next: query.next,
        error: String::new(),
        auth_off: !console.registry.enabled(),
    })
}

/// The login form.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
}

/// Checks a token and opens a session.
pub(crate) async fn login(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if let Err(refused) = check_login_origin(&headers) {
        return refused.into_response();
    }
    let failed = |error: &str| {
        let page = LoginPage {
            next: form.next.clone(),
            error: error.to_owned(),
            auth_off: !console.registry.enabled(),
        };
        let mut response = render(&page);
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        response
    };
    let caller = if console.registry.enabled() {
        match console.registry.by_token(form.token.trim().as_bytes()) {
            Some(caller) => caller,
            None => {
                metrics::counter!("notify_console_logins_total", "outcome" => "refused")
                    .increment(1);
                return failed("This token is not valid.");
            }
        }
    } else {
        console.registry.local()
    };
    let manage = caller.allows(Scope::ConsoleManage);
    if !manage && !caller.allows(Scope::ConsoleRead) {
        metrics::counter!("notify_console_logins_total", "outcome" => "refused").increment(1);
        return failed(&format!(
            "Client {} lacks the scope console.read (or admin) the console needs.",
            caller.name()
        ));
    }
    let token_digest = if console.registry.enabled() {
        URL_SAFE_NO_PAD.encode(Sha256::digest(form.token.trim().as_bytes()))
    } else {
        String::new()
    };
    let session =
        Session { client: caller.name().to_owned(), manage, csrf: random_token(), token_digest };
    let id = random_token();
    let mut redis = console.ctx.cache.connection();
    let stored: redis::RedisResult<()> = redis
        .set_ex(
            redis_key(&console, &id),
            serde_json::to_string(&session).unwrap_or_default(),
            console.session_ttl.as_secs().max(1),
        )
        .await;
    if let Err(e) = stored {
        warn!(error = %e, "could not store a console session");
        return (StatusCode::SERVICE_UNAVAILABLE, "the session store (Redis) is unavailable")
            .into_response();
    }
    metrics::counter!("notify_console_logins_total", "outcome" => "ok").increment(1);
    info!(client = %session.client, manage = session.manage, "console login");
    let cookie = console.cookie(&id, console.session_ttl.as_secs());
    ([(header::SET_COOKIE, cookie)], Redirect::to(&next_path(&form.next))).into_response()
}

/// The logout form.
#[derive(Debug, Deserialize)]
pub(crate) struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

/// Ends the session.
pub(crate) async fn logout(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    CurrentSession(session): CurrentSession,
    Form(form): Form<LogoutForm>,
) -> Response {
    if let Err(refused) = check_csrf(&headers, &session, &form.csrf) {
        return refused.into_response();
    }
    if let Some(id) = cookie_value(&headers) {
        let mut redis = console.ctx.cache.connection();
        let _: redis::RedisResult<()> = redis.del(redis_key(&console, &id)).await;
    }
    ([(header::SET_COOKIE, console.cookie("", 0))], Redirect::to("/console/login")).into_response()
}
