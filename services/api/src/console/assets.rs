//! The console's static files, compiled into the binary: its own script
//! and style sheet and the vendored uPlot (`assets/console/vendor/uplot`,
//! MIT). Each is served with a strong ETag and revalidated, so a new
//! binary's files replace the old ones at once.

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:literal) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/console/", $path)),
        }
    };
}

const ASSETS: &[Asset] = &[
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("vendor/uplot/uPlot.esm.js", "text/javascript; charset=utf-8"),
    asset!("vendor/uplot/uPlot.min.css", "text/css; charset=utf-8"),
    asset!("vendor/uplot/LICENSE", "text/plain; charset=utf-8"),
];

/// A file's ETag: its FNV-1a hash (stable across builds of the same bytes).
fn etag(body: &[u8]) -> String {
    let hash = body.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("\"{hash:016x}\"")
}

/// `GET /favicon.ico`, which browsers ask for on every page: the console's
/// icon (an SVG, which they take under that name too).
pub(crate) async fn favicon(headers: HeaderMap) -> Response {
    serve(Path("favicon.svg".to_owned()), headers).await
}

/// `GET /console/assets/{file}` (no session needed: nothing in them is
/// private, and the login page uses them).
pub(crate) async fn serve(Path(file): Path<String>, headers: HeaderMap) -> Response {
    let Some(asset) = ASSETS.iter().find(|a| a.path == file) else {
        return (StatusCode::NOT_FOUND, "no such file").into_response();
    };
    let tag = etag(asset.body);
    let cache = [(header::CACHE_CONTROL, "no-cache"), (header::ETAG, tag.as_str())];
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    if matches {
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    (cache, [(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_embedded_and_tagged_apart() {
        let tags: std::collections::HashSet<String> = ASSETS.iter().map(|a| etag(a.body)).collect();
        assert_eq!(tags.len(), ASSETS.len());
        assert!(ASSETS.iter().all(|a| !a.body.is_empty()));
    }
}
