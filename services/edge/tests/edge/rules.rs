//! The browser rules: CORS from the allow-list, the per-user rate limit
//! answered 429 with `Retry-After`, bad input answered 400 naming the field
//! (and nothing written), bodies bounded, the OpenAPI document served, and
//! TLS on the listener when it has a certificate.

use notify_testkit::spawn_app;
use serde_json::json;

use crate::{Edge, ORIGIN, call, edge_settings, get, send};

#[tokio::test]
async fn a_preflight_from_an_allowed_origin_passes_and_others_get_no_grant() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let preflight = |origin: &'static str| {
        let headers = [
            ("origin", origin),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "authorization, content-type"),
        ];
        async move { call(edge.addr, "OPTIONS", "/v1/items/update", &headers, None).await }
    };
    let allowed = preflight(ORIGIN).await;
    assert_eq!(allowed.status, 200);
    assert_eq!(allowed.headers["access-control-allow-origin"], ORIGIN);
    let methods = allowed.headers["access-control-allow-methods"].to_str().unwrap().to_owned();
    assert!(methods.contains("POST"), "{methods}");
    let headers = allowed.headers["access-control-allow-headers"].to_str().unwrap().to_lowercase();
    assert!(headers.contains("authorization"), "{headers}");
    assert!(allowed.headers.get("access-control-allow-credentials").is_none(), "no cookies");

    let refused = preflight("https://elsewhere.example").await;
    assert!(refused.headers.get("access-control-allow-origin").is_none());

    // A simple request from the allowed origin carries the grant too.
    let bearer = format!("Bearer {}", edge.token(8_400_001));
    let answer = call(
        edge.addr,
        "GET",
        "/v1/badge",
        &[("origin", ORIGIN), ("authorization", &bearer)],
        None,
    )
    .await;
    assert_eq!(answer.headers["access-control-allow-origin"], ORIGIN);
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_user_over_the_rate_gets_429_with_retry_after_and_others_do_not() {
    let app = spawn_app().await;
    let keys = crate::Keys::new();
    let mut settings = edge_settings(&app, &keys);
    settings.edge.requests_per_second = 1;
    settings.edge.burst = 2;
    let edge = Edge::start_with(settings, keys).await;
    let busy = edge.token(8_400_011);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get(&edge, &busy, "/v1/badge").await);
    }
    assert_eq!(statuses.iter().map(|a| a.status).collect::<Vec<_>>(), [200, 200, 429]);
    let refused = &statuses[2];
    assert_eq!(refused.code(), "rate_limited");
    let retry: u64 = refused.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "retry after {retry} s");
    let stream = get(&edge, &busy, "/v1/events").await;
    assert_eq!((stream.status, stream.code()), (429, "rate_limited"), "opening a stream is a call");
    assert_eq!(get(&edge, &edge.token(8_400_012), "/v1/badge").await.status, 200, "another user");
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_and_changes_nothing() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let user = 8_400_021;
    let id = app.send(vec![user]).await;
    app.wait_for_status(id, notify_proto::v1::MessageStatus::Completed).await;
    let token = edge.token(user);
    let cases = [
        ("GET", "/v1/inbox?page_size=1000", None, "page_size"),
        ("GET", "/v1/inbox?view=everything", None, "view"),
        ("GET", "/v1/inbox?unread_only=yes", None, "unread_only"),
        ("GET", "/v1/inbox?user_id=2", None, "user_id"),
        ("GET", "/v1/inbox?cursor=%%%", None, "cursor"),
        ("POST", "/v1/items/update", Some(json!({ "action": "mark_read" })), "message_ids"),
        (
            "POST",
            "/v1/items/update",
            Some(json!({ "action": "mark_read", "message_ids": [id.to_string()], "all": {} })),
            "message_ids",
        ),
        (
            "POST",
            "/v1/items/update",
            Some(json!({ "action": "shred", "message_ids": ["1"] })),
            "action",
        ),
        (
            "POST",
            "/v1/items/update",
            Some(json!({ "action": "archive", "all": { "category": "Not Valid!" } })),
            "all.category",
        ),
        (
            "POST",
            "/v1/items/update",
            Some(json!({ "action": "mark_read", "message_ids": ["x"] })),
            "message_ids[0]",
        ),
        (
            "PUT",
            "/v1/preferences",
            Some(json!({ "muted_categories": ["UPPER"] })),
            "muted_categories",
        ),
        ("GET", "/v1/groups/abc/messages", None, "group_id"),
    ];
    for (method, path, body, field) in cases {
        let answer = match &body {
            Some(body) => send(&edge, &token, method, path, body).await,
            None => get(&edge, &token, path).await,
        };
        assert_eq!(
            (answer.status, answer.code()),
            (400, "invalid_argument"),
            "{path} {body:?}: {:?}",
            answer.body
        );
        assert_eq!(answer.field(), field, "{path} {body:?}: {:?}", answer.body);
    }
    let bearer = format!("Bearer {token}");
    let text = call(
        edge.addr,
        "POST",
        "/v1/items/update",
        &[("authorization", &bearer), ("content-type", "text/plain")],
        None,
    )
    .await;
    assert_eq!(text.field(), "Content-Type");
    let huge = json!({ "action": "mark_read", "message_ids": vec!["1"; 20_000] });
    assert_eq!(send(&edge, &token, "POST", "/v1/items/update", &huge).await.status, 413);
    let badge = get(&edge, &token, "/v1/badge").await;
    assert_eq!(badge.body["unread"], 1, "no refused call changed anything");
    assert_eq!(get(&edge, &token, "/v1/nowhere").await.status, 404);
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn the_openapi_document_is_served_and_names_every_call() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let answer = call(edge.addr, "GET", "/v1/openapi.json", &[], None).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body["openapi"], "3.1.0");
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../../../../docs/edge-openapi.json")).unwrap();
    assert_eq!(answer.body, committed);
    for path in [
        "/v1/inbox",
        "/v1/badge",
        "/v1/items/update",
        "/v1/preferences",
        "/v1/groups",
        "/v1/events",
    ] {
        assert!(answer.body["paths"].get(path).is_some(), "{path}");
    }
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn with_a_certificate_the_edge_serves_tls_only() {
    use rustls::pki_types::pem::PemObject as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let app = spawn_app().await;
    let keys = crate::Keys::new();
    let pki = notify_testkit::pki::TestPki::new("edge");
    let files = pki.server("edge");
    let mut settings = edge_settings(&app, &keys);
    settings.edge.tls.cert_file = files.cert.to_string_lossy().into_owned();
    settings.edge.tls.key_file = files.key.to_string_lossy().into_owned();
    let edge = Edge::start_with(settings, keys).await;
    let request = format!(
        "GET /v1/badge HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\n\
         Connection: close\r\n\r\n",
        edge.token(8_400_041)
    );

    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(&pki.ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(edge.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.expect("a TLS handshake with the test CA");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"unread\":0"), "{answer}");

    // Plaintext HTTP on the same port gets no answer of the edge's.
    let mut plain = tokio::net::TcpStream::connect(edge.addr).await.unwrap();
    plain.write_all(request.as_bytes()).await.unwrap();
    let mut bytes = Vec::new();
    let read = plain.read_to_end(&mut bytes);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), read).await;
    assert!(!bytes.starts_with(b"HTTP/1.1 200"), "plaintext answered");
    edge.stop().await;
    app.cleanup().await;
}
