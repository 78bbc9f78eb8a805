//! The browser SDK's bundle, served to any origin, gzipped and revalidated;
//! the development example page and its token endpoint, there only for a
//! development edge and only to the page's own origin.

use std::io::Read as _;

use notify_testkit::{spawn_app, with_clients};
use serde_json::json;

use crate::{Edge, Keys, call, call_raw, edge_settings, get};

/// The committed bundle.
const BUNDLE: &[u8] = include_bytes!("../../../../clients/js/dist/notify-inbox.js");

#[tokio::test]
async fn the_sdk_is_served_to_any_origin_gzipped_and_revalidated() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let path = "/v1/sdk/notify-inbox.js";
    let elsewhere = ("origin", "https://elsewhere.example");

    // No token, any origin: the bundle as committed.
    let (status, headers, body) = call_raw(edge.addr, "GET", path, &[elsewhere], None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/javascript; charset=utf-8");
    assert_eq!(headers["access-control-allow-origin"], "*");
    assert!(headers.get("content-encoding").is_none());
    assert_eq!(body.as_ref(), BUNDLE);
    let etag = headers["etag"].to_str().unwrap().to_owned();

    // Gzipped when taken, the same bytes inside, under the size target.
    let (status, headers, gzip) =
        call_raw(edge.addr, "GET", path, &[elsewhere, ("accept-encoding", "gzip, br")], None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-encoding"], "gzip");
    assert_eq!(headers["etag"], etag.as_str());
    let mut unpacked = Vec::new();
    flate2::read::GzDecoder::new(gzip.as_ref()).read_to_end(&mut unpacked).unwrap();
    assert_eq!(unpacked, BUNDLE);
    assert!(gzip.len() < 20 * 1024, "{} bytes gzipped: over the 20 KB target", gzip.len());

    // Revalidated by its ETag.
    let (status, _, body) =
        call_raw(edge.addr, "GET", path, &[("if-none-match", etag.as_str())], None).await;
    assert_eq!(status, 304);
    assert!(body.is_empty());
    let (status, _, _) =
        call_raw(edge.addr, "GET", path, &[("if-none-match", "\"other\"")], None).await;
    assert_eq!(status, 200);

    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn the_example_page_and_its_tokens_are_for_a_development_edge_only() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let own = format!("http://{}", edge.addr);

    // The page, under its strict policy.
    let (status, headers, body) = call_raw(edge.addr, "GET", "/dev/", &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let policy = headers["content-security-policy"].to_str().unwrap();
    assert!(policy.starts_with("default-src 'none'; script-src 'self';"), "{policy}");
    assert!(String::from_utf8_lossy(&body).contains("<notify-inbox"));
    for file in ["example.js", "example.css", "index.html"] {
        let (status, _, _) = call_raw(edge.addr, "GET", &format!("/dev/{file}"), &[], None).await;
        assert_eq!(status, 200, "{file}");
    }

    // A token of the user asked for, which the edge takes.
    let asked = json!({ "user_id": "8400101" }).to_string();
    let answer =
        call(edge.addr, "POST", "/dev/token", &[("origin", own.as_str())], Some(&asked)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let token = answer.body["token"].as_str().unwrap();
    assert!(answer.body["expires_at"].as_u64().unwrap() > crate::now());
    assert_eq!(get(&edge, token, "/v1/badge").await.status, 200);

    // Not for another site's page; not for no user.
    for origin in ["https://elsewhere.example", "http://127.0.0.1:1"] {
        let answer =
            call(edge.addr, "POST", "/dev/token", &[("origin", origin)], Some(&asked)).await;
        assert_eq!((answer.status, answer.code()), (403, "permission_denied"), "{origin}");
    }
    let cross = [("sec-fetch-site", "cross-site")];
    assert_eq!(call(edge.addr, "POST", "/dev/token", &cross, Some(&asked)).await.status, 403);
    let zero = json!({ "user_id": "0" }).to_string();
    let answer = call(edge.addr, "POST", "/dev/token", &[], Some(&zero)).await;
    assert_eq!((answer.status, answer.field()), (400, "user_id"));
    edge.stop().await;

    // With the api's authentication on, neither the page nor the tokens.
    let keys = Keys::new();
    let mut settings = edge_settings(&app, &keys);
    with_clients(&mut settings, &[("app", &["send"])]);
    let edge = Edge::start_with(settings, keys).await;
    assert_eq!(call_raw(edge.addr, "GET", "/dev/", &[], None).await.0, 404);
    assert_eq!(call(edge.addr, "POST", "/dev/token", &[], Some(&asked)).await.status, 404);
    edge.stop().await;
    app.cleanup().await;
}
