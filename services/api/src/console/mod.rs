//! The operators' web console, served by `notify-api` at `/console/` on a
//! listener of its own (`console.listen`): browsers speak HTTP/1.1 with
//! cookies, while the gRPC port speaks HTTP/2 with a credential on every
//! call and refuses what its policy table does not name.
//!
//! Pages are rendered on the server (askama templates compiled into the
//! binary, `templates/console/`); the only script is one plain JavaScript
//! module and a vendored chart library, served from the binary too
//! ([`assets`]); nothing is fetched from anywhere else. A send's page
//! follows its progress by Server-Sent Events fed by one poller per send
//! and replica ([`live`]).
//!
//! Security, the API's rules: beyond loopback only with authentication on;
//! login with a client token that has `admin` or `console.read` (the
//! buttons need `console.manage`); a session in Redis with a TTL behind an
//! HttpOnly, SameSite=Strict cookie (Secure with `console.secure_cookie`,
//! for TLS ended in front of the listener); every state change
//! is a POST checked for its origin (`Sec-Fetch-Site`, else `Origin`) and
//! for the session's CSRF token; a strict Content-Security-Policy with
//! violations reported back and counted; every button press is audited as
//! the gRPC call it stands for.

mod assets;
mod live;
mod pages;
mod session;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use notify_core::Context;
use notify_domain::auth::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::live::LiveHub;

/// What every console handler shares.
pub(crate) struct Console {
    ctx: Context,
    registry: Registry,
    live: Arc<LiveHub>,
    secure_cookie: bool,
    session_ttl: Duration,
    /// Ends open event streams when the api stops.
    shutdown: CancellationToken,
}

/// The Content-Security-Policy of every page: nothing inline, nothing from
/// elsewhere, violations reported to the console.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; \
     report-uri /console/csp-report";

/// Binds the console's listener when it is enabled, refusing a listener
/// beyond loopback while authentication is off.
pub async fn bind(settings: &notify_domain::Settings) -> anyhow::Result<Option<TcpListener>> {
    let console = &settings.console;
    if !console.enabled {
        return Ok(None);
    }
    let listen = notify_domain::settings::parse_addr("console.listen", &console.listen)?;
    if !listen.ip().is_loopback() && !settings.auth.enabled {
        anyhow::bail!(
            "console.listen: {listen} is reachable beyond this host and authentication is off; \
             set auth.enabled = true (logins need a client token), listen on 127.0.0.1, or set \
             console.enabled = false"
        );
    }
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("console.listen: cannot bind {listen}: {e}"))?;
    Ok(Some(listener))
}

/// Builds the console's router.
pub fn router(ctx: Context, shutdown: CancellationToken) -> Router {
    let settings = &ctx.settings;
    let console = Arc::new(Console {
        registry: Registry::new(&settings.auth),
        live: Arc::new(LiveHub::new(
            ctx.clone(),
            Duration::from_millis(settings.console.update_interval_ms),
        )),
        secure_cookie: settings.console.secure_cookie,
        session_ttl: Duration::from_secs(settings.console.session_ttl_secs),
        shutdown,
        ctx,
    });
    Router::new()
        .route("/console", get(|| async { Redirect::to("/console/sends") }))
        .route("/console/", get(|| async { Redirect::to("/console/sends") }))
        .route("/console/login", get(session::login_page).post(session::login))
        .route("/console/logout", post(session::logout))
        .route("/console/sends", get(pages::sends))
        .route("/console/sends/{id}", get(pages::send))
        .route("/console/sends/{id}/live", get(live::stream))
        .route("/console/sends/{id}/{action}", post(pages::act))
        .route("/console/users", get(pages::user))
        .route("/console/groups", get(pages::group))
        .route("/console/shards", get(pages::shards))
        .route(
            "/console/csp-report",
            post(csp_report).layer(DefaultBodyLimit::max(CSP_REPORT_MAX_BYTES)),
        )
        .route("/console/assets/{*file}", get(assets::serve))
        .route("/favicon.ico", get(assets::favicon))
        .fallback(|| async { pages::not_found() })
        .layer(axum::middleware::map_response(security_headers))
        .with_state(console)
}

/// Serves the console until `shutdown`; open event streams end with it.
pub async fn serve(listener: TcpListener, ctx: Context, shutdown: CancellationToken) {
    let addr = listener.local_addr().map_or_else(|_| "?".to_owned(), |a: SocketAddr| a.to_string());
    info!(%addr, "console serving at /console/");
    let app = router(ctx, shutdown.clone());
    let stopping = shutdown.clone();
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stopping.cancelled().await })
        .await
    {
        warn!(error = %e, "console listener failed");
    }
}

/// Adds the security headers to every response.
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = |headers: &mut HeaderMap, name: HeaderName, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(headers, header::CONTENT_SECURITY_POLICY, CSP);
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::X_FRAME_OPTIONS, "DENY");
    set(headers, header::REFERRER_POLICY, "no-referrer");
    set(headers, HeaderName::from_static("cross-origin-opener-policy"), "same-origin");
    if !headers.contains_key(header::CACHE_CONTROL) {
        set(headers, header::CACHE_CONTROL, "no-store");
    }
    response
}

/// The largest Content-Security-Policy report taken (a browser's is well
/// under 2 KB; a larger body is refused with 413 before it is read whole).
const CSP_REPORT_MAX_BYTES: usize = 8 * 1024;

/// How often a violation report is logged at most: anyone can post them
/// (browsers send them without a session), so they are counted, and only a
/// sample reaches the log.
const CSP_REPORT_LOG_EVERY: Duration = Duration::from_secs(60);

/// Counts a Content-Security-Policy violation a browser reports, and logs
/// one at most every [`CSP_REPORT_LOG_EVERY`].
async fn csp_report(body: String) -> impl IntoResponse {
    metrics::counter!("notify_console_csp_violations_total").increment(1);
    static LAST_LOGGED: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let log = {
        let mut last = LAST_LOGGED.lock().unwrap_or_else(|e| e.into_inner());
        let due = last.is_none_or(|at| at.elapsed() >= CSP_REPORT_LOG_EVERY);
        if due {
            *last = Some(Instant::now());
        }
        due
    };
    if log {
        let report: String = body.chars().take(1000).collect();
        warn!(report = %report, "console content security policy violation (others in the next minute are only counted)");
    }
    StatusCode::NO_CONTENT
}
