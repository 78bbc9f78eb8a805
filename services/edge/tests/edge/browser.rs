//! The web inbox in a real browser: the example page the edge serves (auth
//! off, on loopback) with `<notify-inbox>` from `/v1/sdk/notify-inbox.js`,
//! in Debian's headless Chromium, against the real edge, api, worker,
//! MariaDB, RabbitMQ and Redis. A user sees the bell and the list; a message
//! sent from the test appears and the count rises without a reload; opening
//! the panel clears the bell, clicking the item reads it, and the server
//! agrees with both; a second tab follows over the first tab's connection
//! and takes it over when the first closes; an edge restart loses nothing;
//! the page breaks nothing of its strict Content-Security-Policy (and a
//! violation provoked on purpose is counted, so the check can fail); and
//! axe-core finds no serious or critical violation, light or dark.
//!
//! With `NOTIFY_INBOX_SCREENSHOTS=<dir>` the bell and the open panel, light
//! and dark, are saved there (the `docs/web-inbox-*.png` come from this
//! test).

use std::time::Duration;

use fantoccini::key::Key;
use notify_proto::v1;
use notify_testkit::browser::Browser;
use notify_testkit::{TestApp, eventually, send_request, spawn_app};
use serde_json::Value;

use crate::{Edge, Keys, edge_settings, get};

/// The user the page signs in as.
const USER: u64 = 8_400_001;

/// The vendored axe-core (clients/js/vendor).
const AXE: &str = include_str!("../../../../clients/js/vendor/axe.min.js");

/// Sends a message titled `title` to `user` and waits until it is delivered.
async fn send_titled(app: &TestApp, user: u64, title: &str) -> u64 {
    let mut request = send_request(vec![user]);
    request.content = Some(notify_testkit::content(title));
    let id = app.messages().send_message(request).await.expect("sent").into_inner().message_id;
    app.wait_for_status(id, v1::MessageStatus::Completed).await;
    id
}

/// A script run against the inbox element's shadow root (`root`) and the
/// element (`inbox`): `body` returns the answer.
fn in_inbox(body: &str) -> String {
    format!(
        "const inbox = document.querySelector('notify-inbox'); \
         const root = inbox && inbox.shadowRoot; if (!root) return null; {body}"
    )
}

/// What the page shows: the bell's number (0 when hidden), whether the
/// panel is open, the stream's status, and the items listed with whether
/// each is read.
#[derive(Debug, PartialEq)]
struct Shown {
    bell: u64,
    open: bool,
    status: String,
    items: Vec<(u64, bool)>,
}

async fn shown(browser: &Browser) -> Option<Shown> {
    let script = in_inbox(
        "const badge = root.querySelector('[part~=\"badge\"]'); \
         const panel = root.querySelector('[part~=\"panel\"]'); \
         const status = root.querySelector('[part~=\"status\"]'); \
         const items = [...root.querySelectorAll('[part~=\"item\"]')].map((item) => \
           [item.dataset.messageId, item.dataset.read === 'true']); \
         return { bell: badge && !badge.hidden ? badge.textContent.trim() : '0', \
           open: !!panel && !panel.hidden, status: status ? status.dataset.status : '', items };",
    );
    let value = browser.run(&script).await;
    if value.is_null() {
        return None;
    }
    let items = value["items"].as_array()?;
    Some(Shown {
        bell: value["bell"].as_str()?.parse().ok()?,
        open: value["open"].as_bool()?,
        status: value["status"].as_str()?.to_owned(),
        items: items
            .iter()
            .filter_map(|pair| Some((pair[0].as_str()?.parse().ok()?, pair[1].as_bool()?)))
            .collect(),
    })
}

/// Whether this tab's store holds the user's one connection.
async fn leading(browser: &Browser) -> bool {
    browser.run(&in_inbox("return inbox.store.getState().leading;")).await == Value::Bool(true)
}

/// Waits (30 s at most) until what the page shows passes `check`.
async fn until(browser: &Browser, what: &str, check: impl Fn(&Shown) -> bool) -> Shown {
    eventually(what, Duration::from_secs(30), || async {
        shown(browser).await.filter(|shown| check(shown))
    })
    .await
}

/// Clicks the element of the inbox's shadow root that `css` selects, as a
/// pointer would (a click event on it).
async fn click(browser: &Browser, css: &str) {
    let script = in_inbox(&format!(
        "const target = root.querySelector('{css}'); if (!target) return false; \
         target.click(); return true;"
    ));
    assert_eq!(browser.run(&script).await, Value::Bool(true), "nothing to click at {css}");
}

/// The user's badge as the server counts it: (unread, unseen).
async fn server_badge(edge: &Edge) -> (u64, u64) {
    let answer = get(edge, &edge.token(USER), "/v1/badge").await;
    (answer.body["unread"].as_u64().unwrap(), answer.body["unseen"].as_u64().unwrap())
}

/// Violations of the example page's policy the browser reported (the
/// counter is the process's: any edge's metrics page reads it).
async fn csp_violations(edge: &Edge) -> f64 {
    edge.metric("notify_edge_example_csp_violations_total").await
}

/// Runs the vendored axe-core over the page; answers the serious and
/// critical violations, each as `id: help (targets)`.
async fn axe_violations(browser: &Browser) -> Vec<String> {
    let loaded = browser.run(&format!("{AXE}\n;return typeof axe.run;")).await;
    assert_eq!(loaded, "function", "axe-core loads");
    let found = browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1]; \
             axe.run(document, { resultTypes: ['violations'] }) \
               .then((results) => done(results.violations \
                 .filter((v) => v.impact === 'serious' || v.impact === 'critical') \
                 .map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`))) \
               .catch((e) => done([`axe failed: ${e}`]));",
            vec![],
        )
        .await
        .expect("axe runs");
    serde_json::from_value(found).expect("a list")
}

#[tokio::test]
async fn a_user_reads_the_inbox_live_across_tabs_and_an_edge_restart() {
    let app = spawn_app().await;
    let keys = Keys::new();
    let settings = edge_settings(&app, &keys);
    let edge = Edge::start_with(settings.clone(), keys).await;
    let violations_before = csp_violations(&edge).await;
    let welcome = send_titled(&app, USER, "Welcome aboard").await;

    // The page: the bell counts the unseen item, the stream is live.
    let browser = Browser::start(960, 720).await;
    let web = &browser.client;
    let page = format!("http://{}/dev/?user={USER}", edge.addr);
    web.goto(&page).await.expect("goto");
    until(&browser, "the bell to show the item", |s| s.bell == 1 && s.status == "live").await;
    browser.screenshot("NOTIFY_INBOX_SCREENSHOTS", "web-inbox-bell-light.png").await;
    browser.run("window.notifyMarker = 'still the same page'; return true;").await;

    // Opening the panel lists it and marks everything seen.
    click(&browser, "[part~=\"bell\"]").await;
    let open =
        until(&browser, "the panel to list the item", |s| s.open && !s.items.is_empty()).await;
    assert_eq!(open.items, vec![(welcome, false)]);
    until(&browser, "the bell to clear", |s| s.bell == 0).await;
    eventually("the server to count it seen", Duration::from_secs(10), || async {
        (server_badge(&edge).await == (1, 0)).then_some(())
    })
    .await;

    // A message sent now appears at the top without a reload.
    let news = send_titled(&app, USER, "Your invoice is ready").await;
    let live = until(&browser, "the new item to appear", |s| s.items.len() == 2).await;
    assert_eq!(live.items, vec![(news, false), (welcome, false)], "newest first, both unread");
    assert_eq!(
        browser.run("return window.notifyMarker;").await,
        "still the same page",
        "no reload"
    );

    // Clicking it reads it and closes the panel (the app goes where the
    // item leads); the server agrees.
    click(&browser, &format!("[part~=\"item\"][data-message-id=\"{news}\"]")).await;
    let read = until(&browser, "the item to show read", |s| s.items.contains(&(news, true))).await;
    assert!(!read.open, "the panel closes on a click");
    eventually("the server to count one unread", Duration::from_secs(10), || async {
        (server_badge(&edge).await.0 == 1).then_some(())
    })
    .await;

    // Strict CSP: nothing so far broke it.
    assert_eq!(csp_violations(&edge).await, violations_before, "the page reported a violation");

    // Accessibility, light and dark, with the panel open.
    click(&browser, "[part~=\"bell\"]").await;
    until(&browser, "the panel to open", |s| s.open).await;
    browser.screenshot("NOTIFY_INBOX_SCREENSHOTS", "web-inbox-panel-light.png").await;
    let found = axe_violations(&browser).await;
    assert!(found.is_empty(), "axe-core, light: {found:#?}");
    browser
        .run(&in_inbox(
            "inbox.setAttribute('theme', 'dark'); document.documentElement.dataset.theme = 'dark'; \
             return true;",
        ))
        .await;
    browser.screenshot("NOTIFY_INBOX_SCREENSHOTS", "web-inbox-panel-dark.png").await;
    let found = axe_violations(&browser).await;
    assert!(found.is_empty(), "axe-core, dark: {found:#?}");

    // Escape, typed, closes it and gives the focus back to the bell.
    web.active_element()
        .await
        .expect("focus")
        .send_keys(&Key::Escape.to_string())
        .await
        .expect("typed");
    until(&browser, "the panel to close", |s| !s.open).await;
    let focused = browser
        .run(&in_inbox("return root.activeElement && root.activeElement.getAttribute('part');"))
        .await;
    assert_eq!(focused, "bell", "the focus is back on the bell");
    browser.screenshot("NOTIFY_INBOX_SCREENSHOTS", "web-inbox-bell-dark.png").await;

    // A second tab follows; the first tab's one connection serves both.
    let first_tab = web.window().await.expect("this tab");
    let second_tab = web.new_window(true).await.expect("a second tab").handle;
    web.switch_to_window(second_tab.clone()).await.expect("switch");
    web.goto(&page).await.expect("goto");
    until(&browser, "the second tab to show the bell, live", |s| s.bell == 0 && s.status == "live")
        .await;
    assert!(!leading(&browser).await, "the second tab follows the first's connection");
    let third = send_titled(&app, USER, "A third one").await;
    until(&browser, "the second tab to count it", |s| s.bell == 1).await;
    web.switch_to_window(first_tab.clone()).await.expect("switch");
    until(&browser, "the first tab to count it", |s| s.bell == 1).await;
    assert!(leading(&browser).await, "the first tab holds the connection");

    // The first tab closes: the second takes the connection over.
    web.close_window().await.expect("closed");
    web.switch_to_window(second_tab).await.expect("switch");
    let fourth = send_titled(&app, USER, "A fourth one").await;
    until(&browser, "the second tab to count the fourth", |s| s.bell == 2 && s.status == "live")
        .await;

    // The edge restarts; what was sent meanwhile arrives, nothing is lost.
    let addr = edge.addr;
    edge.stop().await;
    until(&browser, "the page to see the edge gone", |s| s.status != "live").await;
    let fifth = send_titled(&app, USER, "Sent while the edge was away").await;
    let keys = Keys::new();
    let mut settings = edge_settings(&app, &keys);
    settings.edge.listen = addr.to_string();
    let edge = Edge::start_with(settings, keys).await;
    click(&browser, "[part~=\"bell\"]").await;
    let back = until(&browser, "the missed item to arrive", |s| {
        s.status == "live" && s.items.iter().any(|(id, _)| *id == fifth)
    })
    .await;
    let ids: Vec<u64> = back.items.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![fifth, fourth, third, news, welcome], "every item, once, newest first");
    eventually("the server and the page to agree", Duration::from_secs(10), || async {
        let shown = shown(&browser).await?;
        let unread = shown.items.iter().filter(|(_, read)| !read).count() as u64;
        (server_badge(&edge).await.0 == unread).then_some(())
    })
    .await;

    // Still no violation, and one would have been counted.
    assert_eq!(csp_violations(&edge).await, violations_before, "the page reported a violation");
    browser
        .run(
            "const img = document.createElement('img'); img.src = 'https://example.invalid/x.png'; \
             document.body.append(img); return true;",
        )
        .await;
    eventually("the provoked violation to be counted", Duration::from_secs(20), || async {
        (csp_violations(&edge).await > violations_before).then_some(())
    })
    .await;

    browser.stop().await;
    edge.stop().await;
    app.cleanup().await;
}
