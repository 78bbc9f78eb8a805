//! TLS: the api's listener (server certificates reloaded from disk, client
//! certificates as identities), and MySQL, Redis and RabbitMQ reached over
//! TLS, each a private server that refuses plain connections.

use std::sync::Arc;
use std::time::Duration;

use notify_domain::settings::ClientAuth;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_testkit::pki::{CertFiles, TestPki};
use notify_testkit::servers::{MariaDbServer, RabbitMqServer, RedisServer};
use notify_testkit::{TestApp, authed, spawn_app_with, test_settings, with_clients};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// Settings with TLS on the api listener, a server certificate from `pki`,
/// and client certificates checked against it as `client_auth` says.
fn tls_settings(pki: &TestPki, client_auth: ClientAuth) -> notify_domain::Settings {
    let server = pki.server("api");
    let mut settings = test_settings();
    settings.api.tls.cert_file = server.cert.display().to_string();
    settings.api.tls.key_file = server.key.display().to_string();
    settings.api.tls.client_ca_file = pki.ca.display().to_string();
    settings.api.tls.client_auth = client_auth;
    settings.api.tls.reload_interval_secs = 1;
    settings
}

/// A TLS channel to the app trusting `ca`, presenting `identity` if given.
async fn tls_channel(
    app: &TestApp,
    ca: &std::path::Path,
    identity: Option<&CertFiles>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .domain_name("localhost");
    if let Some(files) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&files.cert).unwrap(),
            std::fs::read(&files.key).unwrap(),
        ));
    }
    Channel::from_shared(format!("https://localhost:{}", app.addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
}

async fn badge<T>(channel: T) -> Result<u64, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let response = InboxServiceClient::new(channel)
        .get_unread_count(v1::GetUnreadCountRequest { user_id: 42 })
        .await?;
    Ok(response.into_inner().user_id)
}

/// The certificate the api presents to a new connection, by a raw handshake.
async fn served_certificate(app: &TestApp, ca: &std::path::Path) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let stream = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn der_of(pem: &std::path::Path) -> Vec<u8> {
    CertificateDer::from_pem_file(pem).unwrap().to_vec()
}

#[tokio::test]
async fn the_api_serves_tls_and_picks_up_a_renewed_certificate_without_restarting() {
    let pki = TestPki::new("api-renewal");
    let settings = tls_settings(&pki, ClientAuth::None);
    let cert_file = std::path::PathBuf::from(&settings.api.tls.cert_file);
    let key_file = std::path::PathBuf::from(&settings.api.tls.key_file);
    let app = spawn_app_with(settings, false).await;
    let channel = tls_channel(&app, &pki.ca, None).await.expect("tls connects");
    assert_eq!(badge(channel.clone()).await.unwrap(), 42);
    let plain = Channel::from_shared(format!("http://{}", app.addr)).unwrap().connect().await;
    let plain_answered = match plain {
        Ok(channel) => badge(channel).await.is_ok(),
        Err(_) => false,
    };
    assert!(!plain_answered, "a plaintext client must not get an answer");
    assert_eq!(served_certificate(&app, &pki.ca).await, der_of(&cert_file));

    // cert-manager renews: new files in place.
    let mut reloads = app.tls.as_ref().expect("tls on").reloads();
    let renewed = pki.server("api-renewed");
    std::fs::copy(&renewed.key, &key_file).unwrap();
    std::fs::copy(&renewed.cert, &cert_file).unwrap();
    tokio::time::timeout(Duration::from_secs(20), reloads.changed())
        .await
        .expect("reloaded")
        .unwrap();
    assert_eq!(served_certificate(&app, &pki.ca).await, der_of(&renewed.cert));
    // Open connections keep working; new ones get the new certificate.
    assert_eq!(badge(channel).await.unwrap(), 42);
    let fresh = tls_channel(&app, &pki.ca, None).await.expect("tls connects after renewal");
    assert_eq!(badge(fresh).await.unwrap(), 42);

    // A broken renewal (a key that does not match) keeps the working one.
    let mut failures = app.tls.as_ref().expect("tls on").failed_reloads();
    std::fs::write(&key_file, std::fs::read(&pki.client("stray", "stray").key).unwrap()).unwrap();
    tokio::time::timeout(Duration::from_secs(20), failures.changed())
        .await
        .expect("noticed")
        .unwrap();
    assert_eq!(served_certificate(&app, &pki.ca).await, der_of(&renewed.cert));
    assert_eq!(badge(tls_channel(&app, &pki.ca, None).await.unwrap()).await.unwrap(), 42);
    app.cleanup().await;
}

#[tokio::test]
async fn client_certificates_identify_clients_and_bad_ones_are_refused() {
    let pki = TestPki::new("api-mtls");
    let mut settings = tls_settings(&pki, ClientAuth::Optional);
    let tokens =
        with_clients(&mut settings, &[("billing", &["inbox.read"]), ("growth", &["inbox.read"])]);
    settings.auth.clients[0].cert_names = vec!["billing.internal".into()];
    let app = spawn_app_with(settings, false).await;

    let billing = pki.client("billing", "billing.internal");
    let channel = tls_channel(&app, &pki.ca, Some(&billing)).await.expect("mtls connects");
    assert_eq!(badge(channel.clone()).await.unwrap(), 42, "the certificate alone authenticates");
    let mixed = badge(authed(channel, &tokens["growth"])).await.unwrap_err();
    assert_eq!(mixed.code(), Code::Unauthenticated, "token and certificate of different clients");

    let stranger = pki.client("stranger", "stranger.internal");
    let channel =
        tls_channel(&app, &pki.ca, Some(&stranger)).await.expect("a valid certificate connects");
    let refused = badge(channel).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(refused.message().contains("stranger.internal"), "{}", refused.message());

    // Optional client auth: a token over TLS without a certificate works.
    let channel = tls_channel(&app, &pki.ca, None).await.expect("tls connects");
    assert_eq!(badge(authed(channel, &tokens["growth"])).await.unwrap(), 42);

    // An expired certificate, or one from an unknown CA, fails the handshake.
    let expired = pki.expired_client("expired", "billing.internal");
    let outcome = match tls_channel(&app, &pki.ca, Some(&expired)).await {
        Ok(channel) => badge(channel).await.err().map(|s| s.code()),
        Err(_) => Some(Code::Unavailable),
    };
    assert!(matches!(outcome, Some(Code::Unavailable | Code::Unknown)), "expired: {outcome:?}");
    let other_ca = TestPki::new("api-other");
    let foreign = other_ca.client("foreign", "billing.internal");
    let outcome = match tls_channel(&app, &pki.ca, Some(&foreign)).await {
        Ok(channel) => badge(channel).await.err().map(|s| s.code()),
        Err(_) => Some(Code::Unavailable),
    };
    assert!(matches!(outcome, Some(Code::Unavailable | Code::Unknown)), "unknown ca: {outcome:?}");
    // A client that does not trust the api's CA does not connect either.
    let outcome = match tls_channel(&app, &other_ca.ca, None).await {
        Ok(channel) => badge(channel).await.err().map(|s| s.code()),
        Err(_) => Some(Code::Unavailable),
    };
    assert!(
        matches!(outcome, Some(Code::Unavailable | Code::Unknown)),
        "server not trusted: {outcome:?}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn required_client_certificates_turn_away_connections_without_one() {
    let pki = TestPki::new("api-required");
    let mut settings = tls_settings(&pki, ClientAuth::Required);
    let tokens = with_clients(&mut settings, &[("billing", &["inbox.read"])]);
    settings.auth.clients[0].cert_names = vec!["billing.internal".into()];
    let app = spawn_app_with(settings, false).await;
    let outcome = match tls_channel(&app, &pki.ca, None).await {
        Ok(channel) => badge(authed(channel, &tokens["billing"])).await.err().map(|s| s.code()),
        Err(_) => Some(Code::Unavailable),
    };
    assert!(
        matches!(outcome, Some(Code::Unavailable | Code::Unknown)),
        "no certificate: {outcome:?}"
    );
    let billing = pki.client("billing", "billing.internal");
    let channel = tls_channel(&app, &pki.ca, Some(&billing)).await.expect("mtls connects");
    assert_eq!(badge(channel).await.unwrap(), 42);
    app.cleanup().await;
}

#[tokio::test]
async fn mysql_redis_and_rabbitmq_over_tls_carry_a_whole_send() {
    let pki = TestPki::new("backends");
    let (mariadb, redis, rabbitmq) = tokio::join!(
        MariaDbServer::start_tls(&pki),
        RedisServer::start_tls(&pki),
        RabbitMqServer::start_tls(&pki)
    );
    let ca = pki.ca.display().to_string();
    let mut settings = test_settings();
    settings.database.url = secrecy::SecretString::from(mariadb.url());
    settings.database.tls_mode = notify_domain::settings::MySqlTlsMode::VerifyIdentity;
    settings.database.tls_ca_file = ca.clone();
    settings.redis.url = secrecy::SecretString::from(redis.url());
    settings.redis.tls_ca_file = ca.clone();
    settings.rabbitmq.url = secrecy::SecretString::from(rabbitmq.url());
    settings.rabbitmq.tls_ca_file = ca;
    // Each server refuses plain connections, so a delivered send went over TLS.
    let app = spawn_app_with(settings.clone(), true).await;
    let id = app.send((1..=1200).collect()).await;
    let done = app.wait_for_status(id, v1::MessageStatus::Completed).await;
    assert_eq!(done.progress.unwrap().delivered, 1200);
    assert_eq!(app.count_items(id).await, 1200);
    assert_eq!(badge(app.channel()).await.unwrap(), 42);
    let unread = app
        .inbox()
        .get_unread_count(v1::GetUnreadCountRequest { user_id: 7 })
        .await
        .unwrap()
        .into_inner()
        .unread;
    assert_eq!(unread, 1, "the badge came through Redis over TLS");
    app.cleanup().await;

    // Without the CA, none of them is trusted.
    let other = TestPki::new("backends-other");
    let mut untrusted = settings;
    untrusted.database.tls_ca_file = other.ca.display().to_string();
    let error =
        notify_core::Context::connect(untrusted.clone()).await.err().expect("mysql refused");
    assert!(error.to_string().contains("database.shards[0]"), "{error}");
    untrusted.database.tls_ca_file = pki.ca.display().to_string();
    untrusted.redis.tls_ca_file = other.ca.display().to_string();
    let error = notify_cache::Cache::connect(&untrusted.redis).await.err().expect("redis refused");
    assert!(error.to_string().contains("redis.url"), "{error}");
    untrusted.rabbitmq.tls_ca_file = other.ca.display().to_string();
    let Err(error) = notify_core::queue::connect(&untrusted.rabbitmq, "tls-test").await else {
        panic!("rabbitmq must refuse a client that does not trust its certificate");
    };
    assert!(error.to_string().contains("rabbitmq.url"), "{error}");
}
