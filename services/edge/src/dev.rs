//! The development example page: `<notify-inbox>` on a page of its own, at
//! `/dev/`, with `POST /dev/token` signing a user token for the user the
//! page names (`?user=42`) with the configuration's HS256 key, as an app's
//! backend would ([`notify_core::user_tokens`]). Only for a development
//! deployment: the routes exist when the api's authentication is off and
//! the edge listens on loopback (as `./scripts/run` runs it), and never
//! otherwise, whatever else is configured. The page is served with the
//! strict Content-Security-Policy an app's page should be able to set
//! (docs/web-inbox.md#content-security-policy).

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use notify_domain::Settings;
use serde::{Deserialize, Serialize};

use crate::Edge;
use crate::error::{ApiError, ApiResult};
use crate::json::Id;
use crate::routes::Body;

/// The policy of the example page: nothing inline, nothing from elsewhere,
/// violations reported (and counted).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'; report-uri /dev/csp-report";

/// Largest violation report read.
const CSP_REPORT_MAX_BYTES: usize = 8 * 1024;

/// Lifetime of the page's tokens (the page asks again before they end).
const TOKEN_TTL_SECS: u64 = 600;

/// The page's files, as committed in `clients/js/example`.
const FILES: [(&str, &str, &str); 3] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../../clients/js/example/index.html"),
    ),
    (
        "example.js",
        "text/javascript; charset=utf-8",
        include_str!("../../../clients/js/example/example.js"),
    ),
    (
        "example.css",
        "text/css; charset=utf-8",
        include_str!("../../../clients/js/example/example.css"),
    ),
];

/// Whether a deployment gets the example: the api's authentication off
/// and the edge on loopback.
pub fn enabled(settings: &Settings, listening: SocketAddr) -> bool {
    !settings.auth.enabled && listening.ip().is_loopback()
}

/// The example's routes: each file at `/dev/<name>`, the page at `/dev/`
/// too.
pub fn routes() -> Router<Edge> {
    let mut router = Router::new().route("/dev/token", post(token)).route(
        "/dev/csp-report",
        post(csp_report).layer(axum::extract::DefaultBodyLimit::max(CSP_REPORT_MAX_BYTES)),
    );
    for (name, content_type, text) in FILES {
        let page = get(move || async move { file(content_type, text) });
        if name == "index.html" {
            router = router.route("/dev/", page.clone());
        }
        router = router.route(&format!("/dev/{name}"), page);
    }
    router
}

/// A file of the page, under the page's policy.
fn file(content_type: &'static str, text: &'static str) -> Response {
    let mut response = text.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers
        .insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// Counts a violation of the page's policy a browser reports
/// (`notify_edge_example_csp_violations_total`); the report itself is
/// logged at debug.
async fn csp_report(body: String) -> StatusCode {
    metrics::counter!("notify_edge_example_csp_violations_total").increment(1);
    tracing::debug!(report = %body, "the example page's content security policy was violated");
    StatusCode::NO_CONTENT
}

/// What the page asks for.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The user to sign in as.
    pub user_id: Id,
}

/// A token and when it ends.
#[derive(Debug, Serialize, Deserialize)]
pub struct TokenResponse {
    /// The user token.
    pub token: String,
    /// Its `exp`, seconds since the epoch.
    pub expires_at: u64,
}

/// `POST /dev/token`: a token of the user asked for. Only the page's own
/// origin may ask: a page of another origin open in the developer's
/// browser gets nothing.
async fn token(
    State(edge): State<Edge>,
    headers: HeaderMap,
    Body(request): Body<TokenRequest>,
) -> ApiResult<axum::Json<TokenResponse>> {
    same_origin(&headers)?;
    let user = request.user_id.0;
    if user == 0 || user > i64::MAX as u64 {
        return Err(ApiError::invalid("user_id", "must be between 1 and 2^63-1"));
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let tokens = &edge.ctx.settings.edge.tokens;
    let ttl = TOKEN_TTL_SECS.min(tokens.max_lifetime_secs);
    let token = notify_core::user_tokens::sign(tokens, user, ttl, None, now).map_err(|e| {
        notify_domain::Error::FailedPrecondition(format!("the example cannot sign tokens: {e}"))
    })?;
    Ok(axum::Json(TokenResponse { token, expires_at: now + ttl }))
}

/// Refuses a request another site's page sent: its `Origin` must be this
/// host's, and `Sec-Fetch-Site` (where the browser sends it) same-origin.
fn same_origin(headers: &HeaderMap) -> ApiResult<()> {
    let text = |name: header::HeaderName| {
        headers.get(name).and_then(|value| value.to_str().ok()).map(str::to_owned)
    };
    let refused = || {
        Err(notify_domain::Error::PermissionDenied(
            "the example's tokens are for its own page only".into(),
        )
        .into())
    };
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site"))
        && site != "same-origin"
    {
        return refused();
    }
    if let Some(origin) = text(header::ORIGIN) {
        let host = text(header::HOST).unwrap_or_default();
        let own = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
        if own != Some(host.as_str()) {
            return refused();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn only_the_pages_own_origin_gets_a_token() {
        let host = ("host", "127.0.0.1:8480");
        assert!(same_origin(&headers(&[host])).is_ok());
        assert!(same_origin(&headers(&[host, ("origin", "http://127.0.0.1:8480")])).is_ok());
        assert!(
            same_origin(&headers(&[
                host,
                ("origin", "http://127.0.0.1:8480"),
                ("sec-fetch-site", "same-origin")
            ]))
            .is_ok()
        );
        assert!(same_origin(&headers(&[host, ("origin", "https://evil.example")])).is_err());
        assert!(same_origin(&headers(&[host, ("origin", "http://127.0.0.1:9999")])).is_err());
        assert!(same_origin(&headers(&[host, ("sec-fetch-site", "cross-site")])).is_err());
        assert!(same_origin(&headers(&[host, ("sec-fetch-site", "same-site")])).is_err());
    }

    #[test]
    fn the_example_is_for_loopback_with_authentication_off() {
        let mut settings = Settings::defaults().unwrap();
        let loopback: SocketAddr = "127.0.0.1:8480".parse().unwrap();
        let wide: SocketAddr = "0.0.0.0:8480".parse().unwrap();
        settings.auth.enabled = false;
        assert!(enabled(&settings, loopback));
        assert!(!enabled(&settings, wide));
        settings.auth.enabled = true;
        assert!(!enabled(&settings, loopback));
    }
}
