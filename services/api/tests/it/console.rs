//! The web console without a browser: login and sessions (in Redis, with a
//! TTL, on any replica), the refusals (cross-site posts, a wrong token, a
//! read-only login), the security headers of every response, every page
//! against real sends, users, groups and shards, the buttons and their
//! audit records, and the live stream (one poller per send, one read per
//! shard per interval, whatever the number of open pages).

use std::collections::HashMap;
use std::time::Duration;

use notify_core::audit::{self, Target};
use notify_proto::v1;
use notify_proto::v1::group_service_client::GroupServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_testkit::console::{ConsoleClient, Origin, Page};
use notify_testkit::{
    AuthedChannel, TestApp, authed, content, eventually, http_get, metric_sum, send_request,
    spawn_app_with, test_settings, with_clients,
};
use redis::AsyncCommands;

/// The policy every console response carries.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; \
     report-uri /console/csp-report";

struct Console {
    app: TestApp,
    tokens: HashMap<String, String>,
}

impl Console {
    async fn start(with_worker: bool, tweak: impl FnOnce(&mut notify_domain::Settings)) -> Self {
        let mut settings = test_settings();
        let tokens = with_clients(
            &mut settings,
            &[
                ("viewer", &["console.read"]),
                ("operator", &["console.manage"]),
                ("root", &["admin"]),
                ("service", &["send", "sends.read"]),
            ],
        );
        for client in &mut settings.auth.clients {
            client.senders = vec!["tests".to_owned()];
        }
        tweak(&mut settings);
        let app = spawn_app_with(settings, with_worker).await;
        Self { app, tokens }
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.app.console_addr.expect("the console is on")
    }

    fn grpc(&self) -> AuthedChannel {
        authed(self.app.channel(), &self.tokens["root"])
    }

    async fn login(&self, client: &str) -> ConsoleClient {
        ConsoleClient::logged_in(self.addr(), &self.tokens[client]).await
    }

    async fn send(&self, users: Vec<u64>) -> u64 {
        let mut messages = MessageServiceClient::new(self.grpc());
        messages.send_message(send_request(users)).await.expect("send").into_inner().message_id
    }

    async fn status(&self, id: u64) -> i32 {
        let mut messages = MessageServiceClient::new(self.grpc());
        let request = v1::GetMessageRequest { message_id: id };
        messages.get_message(request).await.expect("get").into_inner().status
    }

    /// The send's lifecycle records (its creation is on record too).
    async fn audit(&self, id: u64) -> Vec<notify_store::db::audit::AuditRow> {
        let filter = audit::Filter::Target(Target::Message(id));
        let mut rows = audit::list(&self.app.ctx, filter, 0, 100).await.expect("audit list");
        rows.retain(|r| r.action != "message.send");
        rows
    }

    async fn completed(&self, id: u64) {
        let completed = v1::MessageStatus::Completed as i32;
        eventually("the send to complete", Duration::from_secs(30), || async {
            (self.status(id).await == completed).then_some(())
        })
        .await;
    }
}

fn assert_secured(page: &Page, what: &str) {
    assert_eq!(page.header("content-security-policy"), Some(CSP), "{what}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"), "{what}");
    assert_eq!(page.header("x-frame-options"), Some("DENY"), "{what}");
    assert_eq!(page.header("referrer-policy"), Some("no-referrer"), "{what}");
}

/// No inline script, style or handler: what the policy would refuse.
fn assert_nothing_inline(page: &Page, what: &str) {
    let html = page.body.to_lowercase();
    assert!(!html.contains(" style="), "{what}: an inline style attribute");
    assert!(!html.contains("<style"), "{what}: a style element");
    assert!(!html.contains(" onclick=") && !html.contains(" onsubmit="), "{what}: a handler");
    for script in html.split("<script").skip(1) {
        let tag = &script[..script.find('>').expect("tag ends")];
        assert!(tag.contains(" src="), "{what}: an inline script");
        assert!(script[tag.len() + 1..].starts_with("</script>"), "{what}: script content");
    }
}

#[tokio::test]
async fn a_login_opens_a_session_in_redis_that_logout_ends() {
    let console = Console::start(false, |_| {}).await;
    let anonymous = ConsoleClient::new(console.addr());

    let page = anonymous.get("/console/sends?status=sending").await;
    assert_eq!(page.status, 303, "pages need a login");
    let to = page.location().expect("redirected").to_owned();
    assert!(to.starts_with("/console/login?next="), "{to}");
    let page = anonymous.post("/console/sends/1/pause", &[("csrf", "x")], Origin::SameOrigin).await;
    assert_eq!(page.status, 401, "a post without a session is refused, not redirected");

    let mut client = ConsoleClient::new(console.addr());
    let page = client.login("not-a-token").await;
    assert_eq!(page.status, 401);
    assert!(page.body.contains("This token is not valid."), "{}", page.body);
    assert!(client.cookie().is_none());
    let page = client.login(&console.tokens["service"]).await;
    assert_eq!(page.status, 401);
    assert!(page.body.contains("Client service lacks the scope console.read"), "{}", page.body);
    assert!(client.cookie().is_none());

    // The login goes where the page asked, and only to a console path.
    let next = to.trim_start_matches("/console/login?next=");
    let form = [("token", console.tokens["viewer"].as_str()), ("next", next)];
    let page = client.post("/console/login", &form, Origin::SameOrigin).await;
    assert_eq!(page.status, 303, "{}", page.body);
    assert_eq!(page.location(), Some("/console/sends?status=sending"));
    let cookie = page.header("set-cookie").expect("a session cookie").to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age=3600"] {
        assert!(cookie.contains(attribute), "{cookie} lacks {attribute}");
    }
    assert!(!cookie.contains("Secure"), "plain http, secure_cookie off: {cookie}");
    let evil = base64_url("//evil.example/console/");
    let form = [("token", console.tokens["viewer"].as_str()), ("next", evil.as_str())];
    let page = client.post("/console/login", &form, Origin::SameOrigin).await;
    assert_eq!(page.location(), Some("/console/sends"), "no open redirect");
    let page = client.post("/console/login", &form, Origin::CrossSite).await;
    assert_eq!(page.status, 403, "a cross-site login is refused");

    let client = console.login("viewer").await;
    let session = client.cookie().expect("logged in").to_owned();
    let page = client.get("/console/sends").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("viewer"), "the header names the client");

    // Redis holds the session under its digest, never the cookie itself,
    // with the configured TTL.
    let mut redis = console.app.ctx.cache.connection();
    let pattern = format!("{}{{console}}:session:*", console.app.settings.redis.key_prefix);
    let keys: Vec<String> = redis.keys(&pattern).await.expect("keys");
    assert_eq!(keys.len(), 3, "three logins, three sessions: {keys:?}");
    assert!(keys.iter().all(|k| !k.contains(&session)));
    for key in &keys {
        let ttl: i64 = redis.ttl(key).await.expect("ttl");
        assert!((3590..=3600).contains(&ttl), "{key}: ttl {ttl}");
    }

    let csrf = page.csrf();
    let page = client.post("/console/logout", &[("csrf", "wrong")], Origin::SameOrigin).await;
    assert_eq!(page.status, 403, "logout needs the token too");
    let page = client.post("/console/logout", &[("csrf", &csrf)], Origin::SameOrigin).await;
    assert_eq!(page.status, 303);
    assert!(page.header("set-cookie").is_some_and(|c| c.contains("Max-Age=0")));
    let keys: Vec<String> = redis.keys(&pattern).await.expect("keys");
    assert_eq!(keys.len(), 2, "the session is gone from Redis");
    assert_eq!(client.get("/console/sends").await.status, 303, "the old cookie is worthless");
    console.app.cleanup().await;
}

fn base64_url(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

#[tokio::test]
async fn a_session_unused_for_its_ttl_is_gone() {
    let console = Console::start(false, |s| s.console.session_ttl_secs = 1).await;
    let client = console.login("viewer").await;
    assert_eq!(client.get("/console/sends").await.status, 200);
    // Waits on Redis itself, not on the console: a page view would extend
    // the session.
    let mut redis = console.app.ctx.cache.connection();
    let pattern = format!("{}{{console}}:session:*", console.app.settings.redis.key_prefix);
    eventually("the session to expire", Duration::from_secs(10), || {
        let mut redis = redis.clone();
        let pattern = pattern.clone();
        async move {
            let keys: Vec<String> = redis.keys(pattern).await.expect("keys");
            keys.is_empty().then_some(())
        }
    })
    .await;
    let page = client.get("/console/sends").await;
    assert_eq!(page.status, 303, "an expired session logs in again");
    let keys: Vec<String> = redis.keys(&pattern).await.expect("keys");
    assert!(keys.is_empty(), "a refused cookie makes no session");
    console.app.cleanup().await;
}

#[tokio::test]
async fn every_response_carries_the_security_headers_and_nothing_inline() {
    let console = Console::start(true, |_| {}).await;
    let id = console.send(vec![31, 32, 33]).await;
    console.completed(id).await;
    let mut groups = GroupServiceClient::new(console.grpc());
    let request = v1::CreateGroupRequest { group_id: 0, name: "ops".into() };
    let group = groups.create_group(request).await.expect("group").into_inner().group_id;

    let anonymous = ConsoleClient::new(console.addr());
    let login = anonymous.get("/console/login").await;
    assert_eq!(login.status, 200);
    assert_secured(&login, "login page");
    assert_nothing_inline(&login, "login page");
    assert_eq!(login.header("cache-control"), Some("no-store"));

    let client = console.login("operator").await;
    let pages = [
        "/console/sends".to_owned(),
        "/console/sends?status=completed".to_owned(),
        format!("/console/sends/{id}"),
        "/console/users".to_owned(),
        "/console/users?user_id=31".to_owned(),
        "/console/users?user_id=31&view=all".to_owned(),
        "/console/groups".to_owned(),
        format!("/console/groups?group_id={group}"),
        "/console/shards".to_owned(),
    ];
    for path in &pages {
        let page = client.get(path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"), "{path}");
        assert_secured(&page, path);
        assert_nothing_inline(&page, path);
    }
    for (path, status) in [
        ("/console/nowhere", 404),
        ("/console/sends/abc", 400),
        ("/console/sends/999999999", 404),
        ("/console/users?user_id=abc", 400),
        ("/console/groups?group_id=0", 400),
        ("/console/groups?group_id=424242", 404),
        ("/console/sends?status=lost", 400),
    ] {
        let page = client.get(path).await;
        assert_eq!(page.status, status, "{path}: {}", page.body);
        assert_secured(&page, path);
    }
    let page = client.get("/console/sends?status=lost").await;
    assert!(page.body.contains("status: must be one of"), "names the field: {}", page.body);
    let page = client.get("/console/users?user_id=abc").await;
    assert!(page.body.contains("user_id: must be a number"), "{}", page.body);

    let script = anonymous.get("/console/assets/app.js").await;
    assert_eq!(script.status, 200);
    assert_eq!(script.header("content-type"), Some("text/javascript; charset=utf-8"));
    assert_secured(&script, "app.js");
    let etag = script.header("etag").expect("an etag").to_owned();
    let chart = anonymous.get("/console/assets/vendor/uplot/uPlot.esm.js").await;
    assert_eq!(chart.status, 200);
    assert!(chart.body.contains("uPlot"), "the vendored chart library");
    assert_eq!(anonymous.get("/console/assets/../Cargo.toml").await.status, 404);
    let _ = etag;

    // A violation a browser reports is counted.
    let before = metric_sum(
        &http_get(console.app.metrics_addr, "/metrics").await.1,
        "notify_console_csp_violations_total",
    );
    let report = r#"{"csp-report":{"violated-directive":"style-src"}}"#;
    let page = anonymous.post("/console/csp-report", &[("report", report)], Origin::Unknown).await;
    assert_eq!(page.status, 204);
    let after = metric_sum(
        &http_get(console.app.metrics_addr, "/metrics").await.1,
        "notify_console_csp_violations_total",
    );
    assert!(after > before, "{before} -> {after}");
    // A report is bounded: a body over 8 KiB is refused before it is read.
    let huge = format!(r#"{{"csp-report":{{"script-sample":"{}"}}}}"#, "x".repeat(9 * 1024));
    let page = anonymous.post("/console/csp-report", &[("report", &huge)], Origin::Unknown).await;
    assert_eq!(page.status, 413);
    // The icon every page's browser asks for.
    let icon = anonymous.get("/favicon.ico").await;
    assert_eq!((icon.status, icon.header("content-type")), (200, Some("image/svg+xml")));
    assert!(icon.body.starts_with("<svg"));
    console.app.cleanup().await;
}

#[tokio::test]
async fn a_button_needs_the_same_origin_and_the_sessions_token_and_is_audited() {
    // No worker: the send stays SENDING until the test acts on it.
    let console = Console::start(false, |_| {}).await;
    let id = console.send((1..=700).collect()).await;
    let client = console.login("operator").await;
    let page = client.get(&format!("/console/sends/{id}")).await;
    assert!(page.body.contains("data-action=\"pause\""), "a sending send can be paused");
    assert!(page.body.contains("Pause send"), "the confirmation names the send");
    assert!(page.body.contains("to 700 recipients?"), "and its recipients: {}", page.body);
    let csrf = page.csrf();
    let pause = format!("/console/sends/{id}/pause");

    for (origin, token, why) in [
        (Origin::CrossSite, csrf.as_str(), "cross-site"),
        (Origin::OriginHeader("http://evil.example"), csrf.as_str(), "another origin"),
        (Origin::Unknown, csrf.as_str(), "no origin at all"),
        (Origin::SameOrigin, "forged", "a token not the session's"),
        (Origin::SameOrigin, "", "no token"),
    ] {
        let page = client.post(&pause, &[("csrf", token)], origin).await;
        assert_eq!(page.status, 403, "{why}: {}", page.body);
        assert_eq!(console.status(id).await, v1::MessageStatus::Sending as i32, "{why}");
    }
    assert!(console.audit(id).await.is_empty(), "a refused request changed nothing");

    // An older browser without Sec-Fetch-Site but with our Origin passes.
    let origin = format!("http://{}", console.addr());
    let page = client.post(&pause, &[("csrf", &csrf)], Origin::OriginHeader(&origin)).await;
    assert_eq!(page.status, 303, "{}", page.body);
    assert_eq!(page.location(), Some(format!("/console/sends/{id}?done=pause").as_str()));
    assert_eq!(console.status(id).await, v1::MessageStatus::Paused as i32);
    let page = client.get(page.location().expect("redirect")).await;
    assert!(page.body.contains("id=\"paused-banner\""), "the paused state is unmistakable");
    assert!(!page.body.contains("class=\"notice\""), "the banner says it, once");
    assert!(page.body.contains("data-action=\"resume\""));
    assert!(!page.body.contains("data-action=\"pause\""));

    let page = client
        .post(&format!("/console/sends/{id}/resume"), &[("csrf", &csrf)], Origin::SameOrigin)
        .await;
    assert_eq!(page.status, 303);
    assert_eq!(console.status(id).await, v1::MessageStatus::Sending as i32);
    let page = client
        .post(&format!("/console/sends/{id}/cancel"), &[("csrf", &csrf)], Origin::SameOrigin)
        .await;
    assert_eq!(page.status, 303);
    assert_eq!(console.status(id).await, v1::MessageStatus::Cancelled as i32);
    // A transition that is not possible says why (a page open in another
    // tab still shows the button).
    let page = client.post(&pause, &[("csrf", &csrf)], Origin::SameOrigin).await;
    assert_eq!(page.status, 409, "{}", page.body);
    assert!(page.body.contains("Not possible now"));
    assert!(page.body.contains("it is cancelled"), "{}", page.body);
    let page = client
        .post(&format!("/console/sends/{id}/explode"), &[("csrf", &csrf)], Origin::SameOrigin)
        .await;
    assert_eq!(page.status, 404);

    let records = console.audit(id).await;
    let lines: Vec<(&str, &str, &str, &str)> = records
        .iter()
        .rev()
        .map(|r| (r.client.as_str(), r.action.as_str(), r.outcome.as_str(), r.detail.as_str()))
        .collect();
    assert_eq!(
        lines,
        [
            ("operator", "message.pause", "ok", "via console"),
            ("operator", "message.resume", "ok", "via console"),
            ("operator", "message.cancel", "ok", "via console"),
            ("operator", "message.pause", "failed_precondition", "via console"),
        ]
    );
    let page = client.get(&format!("/console/sends/{id}")).await;
    assert!(page.body.contains("paused by operator"), "the timeline: {}", page.body);
    assert!(page.body.contains("resumed by operator"));
    assert!(page.body.contains("cancel requested by operator"));
    console.app.cleanup().await;
}

#[tokio::test]
async fn a_read_only_login_sees_no_button_and_is_refused_on_record() {
    let console = Console::start(false, |_| {}).await;
    let id = console.send(vec![5, 6]).await;
    let client = console.login("viewer").await;
    let page = client.get(&format!("/console/sends/{id}")).await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("data-action="), "no button for a viewer");
    assert!(page.body.contains("lacks <code>console.manage</code>"));
    let page = client
        .post(&format!("/console/sends/{id}/cancel"), &[("csrf", &page.csrf())], Origin::SameOrigin)
        .await;
    assert_eq!(page.status, 403, "{}", page.body);
    assert!(page.body.contains("lacks the scope console.manage"));
    assert_eq!(console.status(id).await, v1::MessageStatus::Sending as i32);
    let records = console.audit(id).await;
    assert_eq!(records.len(), 1);
    assert_eq!(
        (records[0].client.as_str(), records[0].action.as_str(), records[0].outcome.as_str()),
        ("viewer", "message.cancel", "permission_denied")
    );

    // admin holds every scope, the buttons included.
    let root = console.login("root").await;
    let page = root.get(&format!("/console/sends/{id}")).await;
    assert!(page.body.contains("data-action=\"cancel\""));
    console.app.cleanup().await;
}

#[tokio::test]
async fn the_pages_show_sends_users_groups_and_shards_as_stored() {
    let console = Console::start(true, |_| {}).await;
    let users: Vec<u64> = (100..150).collect();
    let id = console.send(users.clone()).await;
    console.completed(id).await;
    let other = console.send(vec![7]).await;
    console.completed(other).await;
    let client = console.login("viewer").await;

    let page = client.get("/console/sends").await;
    let first = page.body.find(&format!("data-message-id=\"{other}\"")).expect("listed");
    let second = page.body.find(&format!("data-message-id=\"{id}\"")).expect("listed");
    assert!(first < second, "newest first");
    let page = client.get("/console/sends?status=paused").await;
    assert!(!page.body.contains(&format!("data-message-id=\"{id}\"")), "filtered out");
    let page = client.get("/console/sends?sender=nobody").await;
    assert!(page.body.contains("No send matches."));
    let page = client.get("/console/sends?sender=tests&status=completed").await;
    assert!(page.body.contains(&format!("data-message-id=\"{id}\"")));
    let page = client.get(&format!("/console/sends?id={id}")).await;
    assert_eq!(page.location(), Some(format!("/console/sends/{id}").as_str()), "search by id");

    let page = client.get(&format!("/console/sends/{id}")).await;
    assert!(page.body.contains("data-counter=\"delivered\">50<"), "{}", page.body);
    assert!(page.body.contains("data-counter=\"total\">50<"));
    assert!(page.body.contains("data-counter=\"pending\">0<"));
    assert!(!page.body.contains("data-live="), "a completed send is final: no stream");
    assert!(page.body.contains("completed"), "the timeline");
    let shard_rows = page.body.matches("<tr data-shard=").count();
    assert_eq!(shard_rows, console.app.settings.database.shards.len(), "a bar per shard");

    // The user: badge, item, a group and a mute.
    let mut inbox = v1::inbox_service_client::InboxServiceClient::new(console.grpc());
    let prefs = v1::SetPreferencesRequest {
        user_id: 100,
        preferences: Some(v1::Preferences {
            muted_categories: vec!["billing".into()],
            locale: "zh-Hant-TW".into(),
            ..Default::default()
        }),
    };
    inbox.set_preferences(prefs).await.expect("preferences");
    let mut groups = GroupServiceClient::new(console.grpc());
    let request = v1::CreateGroupRequest { group_id: 0, name: "night shift".into() };
    let group = groups.create_group(request).await.expect("group").into_inner().group_id;
    let add = v1::AddGroupMembersRequest {
        group_id: group,
        user_ids: vec![100, 101],
        with_history: false,
    };
    groups.add_group_members(add).await.expect("members");
    let message = v1::SendGroupMessageRequest {
        group_id: group,
        sender: "tests".into(),
        idempotency_key: "g1".into(),
        content: Some(content("shift change")),
    };
    groups.send_group_message(message).await.expect("group message");

    let page = client.get("/console/users?user_id=100").await;
    assert!(page.body.contains("data-badge=\"unread\">1<"), "{}", page.body);
    assert!(page.body.contains("data-badge=\"group_unread\">1<"));
    assert!(page.body.contains(&format!("data-item=\"{id}\"")));
    assert!(!page.body.contains(&format!("data-item=\"{other}\"")), "not this user's");
    assert!(page.body.contains("<span class=\"tag\">billing</span>"), "the mute");
    assert!(
        page.body.contains("<dt>Locale</dt><dd><span class=\"tag\">zh-Hant-TW</span>"),
        "the locale"
    );
    assert!(page.body.contains(&format!("/console/groups?group_id={group}")));
    assert!(!page.body.contains("Older items"), "one item: one page");
    let page = client.get(&format!("/console/users?user_id=100&before={id}")).await;
    assert!(page.body.contains("No item in this view."), "nothing older than its only item");
    assert!(page.body.contains("Newest items</a>"), "a way back to the first page");
    let page = client.get("/console/users?user_id=100&view=archive").await;
    assert!(page.body.contains("No item in this view."));

    let page = client.get(&format!("/console/groups?group_id={group}")).await;
    assert!(page.body.contains("night shift"));
    assert!(page.body.contains("data-group=\"members\">2<"));
    assert!(page.body.contains("data-group=\"max_seq\">1<"));
    assert!(page.body.contains("shift change"));

    let page = client.get("/console/shards").await;
    assert!(page.body.contains("Shard map <span class=\"sub\">version 1</span>"), "{}", page.body);
    assert!(page.body.contains("No bucket move under way."));
    assert!(page.body.contains("api"), "the replicas");
    let schema = notify_store::db::contract::schema_version();
    assert!(page.body.contains(&format!("data-schema>{schema}<")), "{}", page.body);
    // A move under way, none of its buckets flipped yet (no mover runs it).
    let pools = &console.app.ctx.pools;
    let request = notify_store::shard_move::MoveRequest {
        from: 768,
        to: 831,
        target: shard_router::ShardId(1),
        batch: 32,
    };
    let started = notify_store::shard_move::start(pools, request).await.expect("a move starts");
    let page = client.get("/console/shards").await;
    let summary = format!("move {}: buckets 768..=831 to shard 1, running", started.move_id);
    assert!(page.body.contains(&summary), "{}", page.body);
    assert!(page.body.contains("0% of its buckets flipped"), "{}", page.body);
    notify_store::shard_move::abort(&console.app.settings, pools, started.move_id)
        .await
        .expect("the move aborts");
    let page = client.get("/console/shards").await;
    assert!(page.body.contains("No bucket move under way."), "{}", page.body);
    console.app.cleanup().await;
}

#[tokio::test]
async fn the_console_is_refused_beyond_loopback_without_auth() {
    let mut settings = test_settings();
    settings.console.listen = "0.0.0.0:0".into();
    let error = notify_api::Application::build(settings).await.err().expect("refused");
    let text = format!("{error:#}");
    assert!(text.contains("console.listen") && text.contains("authentication is off"), "{text}");

    let mut settings = test_settings();
    settings.console.enabled = false;
    let app = spawn_app_with(settings, false).await;
    assert!(app.console_addr.is_none(), "off means no listener");
    app.cleanup().await;
}

#[tokio::test]
async fn a_session_ends_with_its_token_and_loses_the_buttons_with_the_scope() {
    let console = Console::start(false, |_| {}).await;
    let id = console.send(vec![7, 8]).await;
    let viewer = console.login("viewer").await;
    let operator = console.login("operator").await;
    // A new release of the configuration: the viewer's token rotated away,
    // the operator down to reading.
    let mut settings = console.app.settings.clone();
    for client in &mut settings.auth.clients {
        match client.name.as_str() {
            "viewer" => client.token_sha256 = vec![notify_domain::auth::token_sha256_hex("new")],
            "operator" => client.scopes = vec!["console.read".to_owned()],
            _ => {}
        }
    }
    let replica = console.app.spawn_api_replica_with(settings).await;
    let at = replica.console_addr.expect("replica console");
    let page = viewer.at(at).get("/console/sends").await;
    assert_eq!(page.status, 303, "a session of a token no longer configured is over");
    let mut redis = console.app.ctx.cache.connection();
    let pattern = format!("{}{{console}}:session:*", console.app.settings.redis.key_prefix);
    let keys: Vec<String> = redis.keys(&pattern).await.expect("keys");
    assert_eq!(keys.len(), 1, "and gone from Redis, on any replica: {keys:?}");
    assert_eq!(viewer.get("/console/sends").await.status, 303);

    let operator = operator.at(at);
    let page = operator.get(&format!("/console/sends/{id}")).await;
    assert_eq!(page.status, 200, "still console.read");
    assert!(!page.body.contains("data-action="), "no button without console.manage");
    let path = format!("/console/sends/{id}/cancel");
    let page = operator.post(&path, &[("csrf", &page.csrf())], Origin::SameOrigin).await;
    assert_eq!(page.status, 403, "{}", page.body);
    assert_eq!(console.status(id).await, v1::MessageStatus::Sending as i32);
    replica.stop().await;
    console.app.cleanup().await;
}

#[tokio::test]
async fn a_login_from_another_origin_is_refused_and_the_cookie_is_secure_when_asked() {
    let console = Console::start(false, |s| s.console.secure_cookie = true).await;
    let token = console.tokens["viewer"].clone();
    let form = [("token", token.as_str())];
    let client = ConsoleClient::new(console.addr());
    let evil = Origin::OriginHeader("http://evil.example");
    let page = client.post("/console/login", &form, evil).await;
    assert_eq!(page.status, 403, "an older browser's cross-origin login: {}", page.body);
    assert!(page.header("set-cookie").is_none());
    let own = format!("http://{}", console.addr());
    let page = client.post("/console/login", &form, Origin::OriginHeader(&own)).await;
    assert_eq!(page.status, 303, "{}", page.body);
    let page = client.post("/console/login", &form, Origin::Unknown).await;
    assert_eq!(page.status, 303, "no browser, no CSRF: {}", page.body);
    let cookie = page.header("set-cookie").expect("a session cookie");
    assert!(cookie.ends_with("; Secure"), "{cookie}");
    console.app.cleanup().await;
}

#[tokio::test]
async fn a_session_opened_on_one_replica_works_on_another() {
    let console = Console::start(false, |_| {}).await;
    let replica = console.app.spawn_api_replica().await;
    let client = console.login("viewer").await;
    let other = client.at(replica.console_addr.expect("replica console"));
    let page = other.get("/console/sends").await;
    assert_eq!(page.status, 200, "the session is in Redis, not in a replica");
    replica.stop().await;
    console.app.cleanup().await;
}

/// Reads the live counters of the api's console: the pollers' shard reads
/// and their polls. (The counters are the test process's: the send pages
/// other tests render read progress too, labelled `by="page"`.)
async fn live_counts(app: &TestApp) -> (f64, f64) {
    let page = http_get(app.metrics_addr, "/metrics").await.1;
    let page = notify_testkit::metrics::MetricsPage::parse(&page);
    (
        page.sum("notify_console_live_reads_total", &[("by", "poller")]),
        page.sum("notify_console_live_polls_total", &[]),
    )
}

#[tokio::test]
async fn open_pages_share_one_poller_that_reads_each_shard_once_per_interval() {
    let console = Console::start(false, |s| s.console.update_interval_ms = 100).await;
    let users: Vec<u64> = (1..=1200).collect();
    let id = console.send(users).await;
    let client = console.login("viewer").await;
    let path = format!("/console/sends/{id}/live");
    let shards = console.app.settings.database.shards.len() as f64;

    let (reads_before, polls_before) = live_counts(&console.app).await;
    let started = tokio::time::Instant::now();
    let mut streams = Vec::new();
    for _ in 0..5 {
        streams.push(client.events(&path).await);
    }
    for stream in &mut streams {
        let event = stream.next().await.expect("a first update");
        assert_eq!(event.name, "progress");
        let update: serde_json::Value = serde_json::from_str(&event.data).expect("json");
        assert_eq!(update["status"], "sending");
        assert_eq!(update["total"]["total"], 1200);
        assert_eq!(update["total"]["pending"], 1200);
        assert_eq!(update["finished"], false);
        assert_eq!(update["shards"].as_array().map(Vec::len), Some(shards as usize));
    }

    // Deliver: every page follows to the final state, then its stream ends.
    let mut app = console.app;
    app.start_worker().await;
    for stream in &mut streams {
        let mut last = None;
        while let Some(event) = stream.next().await {
            last = Some(event);
        }
        let update: serde_json::Value =
            serde_json::from_str(&last.expect("updates").data).expect("json");
        assert_eq!(update["status"], "completed");
        assert_eq!(update["finished"], true);
        assert_eq!(update["total"]["delivered"], 1200);
        assert_eq!(update["total"]["pending"], 0);
    }
    let elapsed = started.elapsed();
    let (reads, polls) = live_counts(&app).await;
    let (reads, polls) = (reads - reads_before, polls - polls_before);
    // One poller for the five pages: at most one poll per interval (and
    // the first at once), and each poll one read per shard.
    let intervals = elapsed.as_millis() as f64 / 100.0;
    assert!(polls >= 1.0 && polls <= intervals + 1.0, "{polls} polls in {intervals:.1} intervals");
    assert_eq!(reads, polls * shards, "{reads} reads for {polls} polls of {shards} shards");
    app.cleanup().await;
}

/// The user ids of a recipients table of a send's page (`class`), in order.
fn recipient_rows(body: &str, class: &str) -> Vec<(u64, String)> {
    let Some(start) = body.find(&format!("<table class=\"{class}\">")) else {
        return Vec::new();
    };
    let table = &body[start..start + body[start..].find("</table>").expect("closed")];
    table
        .split("<tr data-user-id=\"")
        .skip(1)
        .map(|row| {
            let (id, rest) = row.split_once('"').expect("id");
            let state = rest.split("data-state=\"").nth(1).and_then(|s| s.split('"').next());
            (id.parse().expect("a user id"), state.expect("a state").to_owned())
        })
        .collect()
}

/// The next recipients page's path, if the page links one.
fn next_recipients(body: &str, id: u64) -> Option<String> {
    let prefix = format!("href=\"/console/sends/{id}?");
    let start = body.find(&prefix)? + "href=\"".len();
    let end = start + body[start..].find('"')?;
    Some(body[start..end].replace("&#38;", "&").replace("&amp;", "&").replace("#recipients", ""))
}

#[tokio::test]
async fn a_sends_recipients_are_listed_by_state_in_user_order_and_looked_up() {
    let console = Console::start(true, |_| {}).await;
    let users: Vec<u64> = (200..320).collect();
    let id = console.send(users.clone()).await;
    console.completed(id).await;
    let readers = [203, 250, 317];
    let mut inbox = v1::inbox_service_client::InboxServiceClient::new(console.grpc());
    for user_id in readers {
        let request = v1::MarkReadRequest { user_id, message_ids: vec![id] };
        inbox.mark_read(request).await.expect("mark read");
    }
    let client = console.login("viewer").await;

    // Every recipient, 50 a page, in user order across the shards.
    let mut listed = Vec::new();
    let mut path = format!("/console/sends/{id}");
    for pages in 1.. {
        assert!(pages <= 4, "120 recipients take 3 pages of 50 (path {path})");
        let page = client.get(&path).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let rows = recipient_rows(&page.body, "recipients");
        assert!(rows.len() <= 50, "a page holds 50 at most");
        listed.extend(rows);
        match next_recipients(&page.body, id) {
            Some(next) => path = next,
            None => break,
        }
    }
    let ids: Vec<u64> = listed.iter().map(|(user, _)| *user).collect();
    assert_eq!(ids, users, "every recipient once, in order, over the pages");
    for (user, state) in &listed {
        let want = if readers.contains(user) { "read" } else { "unread" };
        assert_eq!(state, want, "user {user}");
    }

    let page = client.get(&format!("/console/sends/{id}?state=read")).await;
    let read: Vec<u64> = recipient_rows(&page.body, "recipients").iter().map(|r| r.0).collect();
    assert_eq!(read, readers, "only the readers");
    let page = client.get(&format!("/console/sends/{id}?state=pending")).await;
    assert!(recipient_rows(&page.body, "recipients").is_empty());
    assert!(page.body.contains("No recipient is pending."), "{}", page.body);

    let page = client.get(&format!("/console/sends/{id}?users=250,%20999")).await;
    let found = recipient_rows(&page.body, "recipient-status");
    assert_eq!(found, vec![(250, "read".to_owned()), (999, "not a recipient".to_owned())]);

    let page = client.get(&format!("/console/sends/{id}?state=opened")).await;
    assert!(page.body.contains("state: must be one of all, delivered"), "{}", page.body);
    console.app.cleanup().await;
}

#[tokio::test]
async fn a_templated_sends_page_shows_its_template_and_a_sample_for_a_typed_user() {
    let console = Console::start(true, |_| {}).await;
    let mut preferences = v1::inbox_service_client::InboxServiceClient::new(console.grpc());
    let zh = v1::Preferences { locale: "zh-Hant-TW".into(), ..Default::default() };
    let request = v1::SetPreferencesRequest { user_id: 301, preferences: Some(zh) };
    preferences.set_preferences(request).await.unwrap();
    let mut request = send_request(Vec::new());
    let content = request.content.as_mut().unwrap();
    content.title = "Hi {{ name }} & co".into();
    content.template = Some(v1::Template {
        vars: [("plan".to_owned(), "Pro".to_owned())].into(),
        translations: [(
            "zh-Hant".to_owned(),
            v1::Translation {
                title: "{{ name }}，您好 ({{ plan }})".into(), body: String::new()
            },
        )]
        .into(),
        recipient_vars: vec!["name".into()],
    });
    let recipients = [(300, "Ann"), (301, "Bo")]
        .map(|(user_id, name)| v1::RecipientVars {
            user_id,
            vars: [("name".to_owned(), name.to_owned())].into(),
        })
        .to_vec();
    request.audience = Some(v1::send_message_request::Audience::Users(v1::UserAudience {
        recipients,
        ..Default::default()
    }));
    let mut messages = MessageServiceClient::new(console.grpc());
    let id = messages.send_message(request).await.unwrap().into_inner().message_id;
    console.completed(id).await;
    let client = console.login("viewer").await;

    let page = client.get(&format!("/console/sends/{id}")).await;
    assert!(page.body.contains("<dt>Recipient vars</dt><dd>name</dd>"), "{}", page.body);
    assert!(page.body.contains("<dt>vars.plan</dt><dd>Pro</dd>"));
    assert!(page.body.contains("<dt>Languages</dt><dd>default, zh-Hant</dd>"));
    assert!(!page.body.contains("id=\"sample-render\""), "no sample until a user is typed");
    let sample = |user: &str| format!("/console/sends/{id}?sample={user}");
    let page = client.get(&sample("301")).await;
    assert!(page.body.contains("zh-Hant-TW → zh-Hant"), "{}", page.body);
    assert!(page.body.contains("data-sample=\"title\">Bo，您好 (Pro)<"), "{}", page.body);
    let page = client.get(&sample("300")).await;
    assert!(page.body.contains("data-sample=\"title\">Hi Ann &#38; co<"), "escaped: {}", page.body);
    let page = client.get(&sample("999")).await;
    assert!(page.body.contains("not a recipient (yet)"), "{}", page.body);
    let page = client.get(&sample("abc")).await;
    assert!(page.body.contains("sample: is not a user id"), "{}", page.body);
    console.app.cleanup().await;
}
