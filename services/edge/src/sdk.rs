//! `GET /v1/sdk/notify-inbox.js`: the browser SDK (the typed client, the
//! live store and the `<notify-inbox>` element of `clients/js`), the
//! bundle committed at `clients/js/dist/notify-inbox.js` and built into
//! the binary, so a page needs one script tag and no build of its own
//! (docs/web-inbox.md). Public code: any origin may load it, as a module
//! script across origins must be allowed to; gzipped to clients that take
//! it; revalidated by its ETag.

use std::io::Write as _;
use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};

/// The bundle, as committed.
pub const BUNDLE: &[u8] = include_bytes!("../../../clients/js/dist/notify-inbox.js");

/// The bundle and what is derived from it once: its gzip and its ETag.
struct Served {
    gzip: Vec<u8>,
    etag: HeaderValue,
}

static SERVED: LazyLock<Served> = LazyLock::new(|| {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let gzip = encoder.write_all(BUNDLE).and_then(|()| encoder.finish()).unwrap_or_default();
    let digest = Sha256::digest(BUNDLE);
    let hex: String = digest[..12].iter().map(|byte| format!("{byte:02x}")).collect();
    let etag =
        HeaderValue::from_str(&format!("\"{hex}\"")).unwrap_or(HeaderValue::from_static("\"\""));
    Served { gzip, etag }
});

/// `GET /v1/sdk/notify-inbox.js`.
pub async fn bundle(headers: HeaderMap) -> Response {
    let served = &*SERVED;
    let mut response = if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|tag| tag.trim() == served.etag))
    {
        StatusCode::NOT_MODIFIED.into_response()
    } else if accepts_gzip(&headers) && !served.gzip.is_empty() {
        let mut response = served.gzip.clone().into_response();
        response.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        response
    } else {
        BUNDLE.into_response()
    };
    let headers = response.headers_mut();
    headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/javascript; charset=utf-8"));
    headers.insert(header::ETAG, served.etag.clone());
    // The URL names no version: a page picks up a new edge's bundle within
    // minutes, and revalidates cheaply meanwhile.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// Whether `Accept-Encoding` takes gzip (and does not refuse it with `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|param| {
                param.strip_prefix("q=").and_then(|q| q.parse::<f32>().ok()) == Some(0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(encoding: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(encoding).unwrap());
        headers
    }

    #[test]
    fn gzip_is_taken_when_asked_for_and_not_refused() {
        assert!(accepts_gzip(&with("gzip, deflate, br, zstd")));
        assert!(accepts_gzip(&with("br;q=1.0, GZIP;q=0.5")));
        assert!(accepts_gzip(&with("*")));
        assert!(!accepts_gzip(&with("br, deflate")));
        assert!(!accepts_gzip(&with("gzip;q=0, br")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn the_gzip_unpacks_to_the_bundle() {
        let mut unpacked = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(SERVED.gzip.as_slice()),
            &mut unpacked,
        )
        .unwrap();
        assert_eq!(unpacked, BUNDLE);
        assert!(SERVED.gzip.len() < BUNDLE.len() / 2, "{} of {}", SERVED.gzip.len(), BUNDLE.len());
    }
}
