//! The console in a real browser: Debian's `chromium`, headless, driven over
//! WebDriver by `chromedriver` (the same build; `scripts/test` installs both
//! when missing) against the real api, worker, MariaDB, RabbitMQ and Redis.
//! An operator logs in, watches a send advance without reloading, pauses it
//! (the confirmation names the send and its recipients; the paused state
//! and its audit record show), resumes it, sees it complete with the exact
//! totals and looks up a recipient's inbox; the page reports no
//! Content-Security-Policy violation, and a violation provoked on purpose is
//! reported and counted (so the check can fail).
//!
//! A personalized send's page shows its template and renders it for a
//! recipient the operator types in.
//!
//! With `NOTIFY_CONSOLE_SCREENSHOTS=<dir>` the send, recipients, template
//! and user pages are saved there as PNGs (`docs/console-send.png`,
//! `docs/console-recipients.png`, `docs/console-template.png` and
//! `docs/console-user.png` come from these tests).

use std::time::Duration;

use fantoccini::Locator;
use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_testkit::browser::Browser;
use notify_testkit::{
    authed, eventually, http_get, metric_sum, send_request, spawn_app_with, test_settings,
    with_clients,
};

/// Recipients of the send the test watches.
const RECIPIENTS: u64 = 6_000;
/// The first of them.
const FIRST_USER: u64 = 7_100_001;

/// The console's own readings of its pages.
trait ConsolePage {
    /// A counter of the send's page as a number (`6,000` reads 6000).
    async fn counter(&self, name: &str) -> u64;
    /// Presses a button whose confirmation is expected; returns its text.
    async fn press_confirmed(&self, action: &str) -> String;
    /// Saves the page as `name` when `NOTIFY_CONSOLE_SCREENSHOTS` is set.
    async fn shot(&self, name: &str);
    /// Opens `url`, which asks for a login first, and logs in with `token`.
    async fn log_in(&self, url: &str, token: &str);
}

impl ConsolePage for Browser {
    async fn counter(&self, name: &str) -> u64 {
        let text = self.text(&format!("[data-counter=\"{name}\"]")).await;
        text.replace(',', "").parse().unwrap_or_else(|_| panic!("{name}: {text:?}"))
    }

    async fn press_confirmed(&self, action: &str) -> String {
        let button = format!("button[data-action=\"{action}\"]");
        self.client.find(Locator::Css(&button)).await.expect(&button).click().await.expect("click");
        let asked = self.client.get_alert_text().await.expect("a confirmation");
        self.client.accept_alert().await.expect("confirmed");
        asked
    }

    async fn shot(&self, name: &str) {
        self.screenshot("NOTIFY_CONSOLE_SCREENSHOTS", name).await;
    }

    async fn log_in(&self, url: &str, token: &str) {
        self.client.goto(url).await.expect("goto");
        self.wait_for("input#token", Duration::from_secs(10)).await;
        let field = self.client.find(Locator::Css("input#token")).await.expect("token field");
        field.send_keys(token).await.expect("typed");
        let submit = self.client.find(Locator::Css("section.login button[type=submit]")).await;
        submit.expect("button").click().await.expect("click");
    }
}

#[tokio::test]
async fn an_operator_watches_pauses_resumes_and_looks_up_a_recipient() {
    let mut settings = test_settings();
    settings.send.chunk_size = 100;
    settings.console.update_interval_ms = 250;
    let tokens =
        with_clients(&mut settings, &[("operator", &["console.manage"]), ("app", &["send"])]);
    for client in &mut settings.auth.clients {
        client.senders = vec!["tests".to_owned()];
    }
    // The worker answers slowly (every MySQL reply 40 ms late) and applies
    // one chunk at a time, so the send takes seconds whatever the machine
    // and the test can watch it and pause it half-way.
    let mut slow = settings.clone();
    slow.worker.operation_timeout_secs = 300;
    slow.worker.concurrency = 1;
    slow.worker.chunks_per_transaction = 1;
    let proxies = notify_testkit::faults::slow_shards(&mut slow, 40).await;
    let mut app = spawn_app_with(settings, false).await;
    let console = format!("http://{}", app.console_addr.expect("console on"));
    let metrics_addr = app.metrics_addr;
    let csp_violations = move || async move {
        let page = http_get(metrics_addr, "/metrics").await.1;
        metric_sum(&page, "notify_console_csp_violations_total")
    };
    let violations_before = csp_violations().await;

    let mut messages = MessageServiceClient::new(authed(app.channel(), &tokens["app"]));
    let users: Vec<u64> = (FIRST_USER..FIRST_USER + RECIPIENTS).collect();
    let id =
        messages.send_message(send_request(users)).await.expect("send").into_inner().message_id;

    let browser = Browser::start(1280, 1000).await;
    let web = &browser.client;

    // Log in: the login page comes first, then where it was asked for.
    browser.log_in(&format!("{console}/console/sends/{id}"), &tokens["operator"]).await;
    browser.wait_for("article.send[data-live]", Duration::from_secs(10)).await;
    assert_eq!(browser.text("#status").await.to_lowercase(), "sending");
    assert_eq!(browser.counter("delivered").await, 0);
    assert_eq!(browser.counter("total").await, RECIPIENTS);

    // Delivery starts; the page follows without reloading.
    web.execute("window.notifyMarker = 'still the same page';", vec![]).await.expect("mark");
    app.start_worker_with(slow).await;
    eventually("the bar to advance", Duration::from_secs(60), || async {
        let delivered = browser.counter("delivered").await;
        (delivered > 0 && delivered < RECIPIENTS).then_some(())
    })
    .await;
    // A fifth of the way: the chart has had several updates to draw.
    eventually("a fifth delivered", Duration::from_secs(60), || async {
        (browser.counter("delivered").await >= RECIPIENTS / 5).then_some(())
    })
    .await;
    browser.shot("console-send.png").await;
    let marker = web.execute("return window.notifyMarker;", vec![]).await.expect("read mark");
    assert_eq!(marker, "still the same page", "the page advanced without a reload");
    let width = web
        .execute(
            "return document.querySelector('section.progress rect.delivered').getAttribute('width');",
            vec![],
        )
        .await
        .expect("bar width");
    let width: f64 = width.as_str().and_then(|w| w.parse().ok()).expect("a width");
    assert!(width > 0.0 && width < 100.0, "the bar shows part delivered: {width}");
    let points = web
        .execute("return document.querySelectorAll('#chart canvas').length;", vec![])
        .await
        .expect("chart");
    assert_eq!(points, 1, "the chart is drawn");

    // Pause: the confirmation names the send and its recipients.
    let asked = browser.press_confirmed("pause").await;
    assert!(asked.contains(&format!("Pause send {id}")), "{asked}");
    assert!(asked.contains("to 6,000 recipients"), "{asked}");
    browser.wait_for("#paused-banner", Duration::from_secs(10)).await;
    assert_eq!(browser.text("#status").await.to_lowercase(), "paused");
    let audit = browser.text("tr[data-audit-action=\"message.pause\"]").await;
    assert!(
        audit.contains("operator") && audit.contains("ok") && audit.contains("via console"),
        "{audit}"
    );
    let at_pause = browser.counter("delivered").await;
    assert!(at_pause < RECIPIENTS, "paused half-way: {at_pause}");
    browser.shot("console-send-paused.png").await;

    // Resume: it completes, the page shows the exact totals.
    let asked = browser.press_confirmed("resume").await;
    assert!(asked.contains(&format!("Resume send {id}")), "{asked}");
    browser.wait_for("#status.completed", Duration::from_secs(180)).await;
    assert_eq!(browser.counter("delivered").await, RECIPIENTS);
    assert_eq!(browser.counter("total").await, RECIPIENTS);
    assert_eq!(browser.counter("pending").await, 0);
    assert_eq!(browser.counter("failed").await, 0);
    let timeline = browser.text("ol.timeline").await;
    let audit = browser.text("table.audit").await;
    for moment in ["created", "started", "paused by operator", "resumed by operator", "completed"] {
        assert!(timeline.contains(moment), "timeline lacks {moment}: {timeline}\naudit: {audit}");
    }

    // Its recipients, by state, in pages that follow each other.
    let unread = format!("{console}/console/sends/{id}?state=unread#recipients");
    web.goto(&unread).await.expect("goto");
    let row = "table.recipients tr[data-state=\"unread\"]";
    browser.wait_for(row, Duration::from_secs(10)).await;
    let user_ids = |rows: Vec<fantoccini::elements::Element>| async move {
        let mut ids = Vec::new();
        for row in rows {
            let id = row.attr("data-user-id").await.expect("attr").expect("a user id");
            ids.push(id.parse::<u64>().expect("a number"));
        }
        ids
    };
    let first = user_ids(web.find_all(Locator::Css(row)).await.expect("rows")).await;
    assert_eq!(first.len(), 50, "a full page of unread recipients");
    assert!(first.windows(2).all(|w| w[0] < w[1]), "in user order");
    browser.shot("console-recipients.png").await;
    web.find(Locator::LinkText("Next recipients →"))
        .await
        .expect("next")
        .click()
        .await
        .expect("click");
    browser.wait_for(row, Duration::from_secs(10)).await;
    let second = user_ids(web.find_all(Locator::Css(row)).await.expect("rows")).await;
    assert!(second[0] > first[49], "the next page starts after the first");

    // A recipient's inbox.
    web.goto(&format!("{console}/console/users?user_id={FIRST_USER}")).await.expect("goto");
    browser.wait_for(&format!("tr[data-item=\"{id}\"]"), Duration::from_secs(10)).await;
    assert_eq!(browser.text("[data-badge=\"unread\"]").await, "1");
    browser.shot("console-user.png").await;

    // Nothing the page did broke its policy...
    assert_eq!(csp_violations().await, violations_before, "the pages reported a violation");
    // ...and a violation would have been seen: an image from elsewhere is
    // refused, reported and counted.
    web.execute(
        "const img = document.createElement('img'); img.src = 'https://example.invalid/x.png'; \
         document.body.append(img);",
        vec![],
    )
    .await
    .expect("provoke");
    eventually("the provoked violation to be counted", Duration::from_secs(20), || async {
        (csp_violations().await > violations_before).then_some(())
    })
    .await;

    browser.stop().await;
    drop(messages);
    app.cleanup().await;
    drop(proxies);
}

/// A personalized send's page: its template, languages and send-wide vars,
/// and a sample rendered for a recipient the operator types in (their
/// language, their own vars); a user id that is not one is refused on the
/// page, naming it.
#[tokio::test]
async fn an_operator_renders_a_personalized_send_for_a_recipient() {
    let mut settings = test_settings();
    let tokens = with_clients(
        &mut settings,
        &[("operator", &["console.manage"]), ("app", &["send", "inbox.write"])],
    );
    for client in &mut settings.auth.clients {
        client.senders = vec!["tests".to_owned()];
    }
    let app = spawn_app_with(settings, true).await;
    let console = format!("http://{}", app.console_addr.expect("console on"));
    let (ann, bo) = (FIRST_USER, FIRST_USER + 1);
    let preferences = v1::Preferences { locale: "de-AT".to_owned(), ..Default::default() };
    InboxServiceClient::new(authed(app.channel(), &tokens["app"]))
        .set_preferences(v1::SetPreferencesRequest { user_id: bo, preferences: Some(preferences) })
        .await
        .expect("locale set");
    let recipient = |user_id: u64, name: &str, amount: &str| v1::RecipientVars {
        user_id,
        vars: [("name".to_owned(), name.to_owned()), ("amount".to_owned(), amount.to_owned())]
            .into(),
    };
    let content = v1::Content {
        title: "Hi {{ name }}, your invoice of {{ amount }} is due".to_owned(),
        body: "Pay by {{ due }}.".to_owned(),
        category: "billing".to_owned(),
        template: Some(v1::Template {
            vars: [("due".to_owned(), "12 December".to_owned())].into(),
            translations: [(
                "de".to_owned(),
                v1::Translation {
                    title: "Hallo {{ name }}, {{ amount }} sind fällig".to_owned(),
                    body: "Bitte zahlen Sie bis {{ due }}.".to_owned(),
                },
            )]
            .into(),
            recipient_vars: vec!["amount".to_owned(), "name".to_owned()],
        }),
        ..Default::default()
    };
    let request = v1::SendMessageRequest {
        sender: "tests".to_owned(),
        content: Some(content),
        audience: Some(v1::send_message_request::Audience::Users(v1::UserAudience {
            recipients: vec![recipient(ann, "Ann", "¥1,280"), recipient(bo, "Bo", "€5")],
            ..Default::default()
        })),
        ..Default::default()
    };
    let mut messages = MessageServiceClient::new(authed(app.channel(), &tokens["app"]));
    let id = messages.send_message(request).await.expect("send").into_inner().message_id;
    eventually("both items delivered", Duration::from_secs(30), || async {
        (app.count_items(id).await == 2).then_some(())
    })
    .await;

    let browser = Browser::start(1280, 1200).await;
    browser.log_in(&format!("{console}/console/sends/{id}"), &tokens["operator"]).await;
    browser.wait_for("#template", Duration::from_secs(10)).await;
    let template = browser.text("#template").await;
    for shown in ["amount, name", "vars.due", "12 December", "default, de", "Hallo {{ name }}"] {
        assert!(template.contains(shown), "{shown:?} not in {template:?}");
    }

    // Bo reads German (de-AT falls back to de), with his own vars.
    let sample = browser.client.find(Locator::Css("input#sample")).await.expect("sample field");
    sample.send_keys(&bo.to_string()).await.expect("typed");
    let render = browser.client.find(Locator::Css("form.sample-form button")).await;
    render.expect("render button").click().await.expect("click");
    browser.wait_for("#sample-render", Duration::from_secs(10)).await;
    assert_eq!(browser.text("[data-sample=\"title\"]").await, "Hallo Bo, €5 sind fällig");
    assert_eq!(browser.text("[data-sample=\"body\"]").await, "Bitte zahlen Sie bis 12 December.");
    assert!(browser.text("#sample-render").await.contains("de-AT"), "the reader's language shows");
    browser.shot("console-template.png").await;

    // Ann reads the default, with hers.
    let url = format!("{console}/console/sends/{id}?sample={ann}");
    browser.client.goto(&url).await.expect("goto");
    browser.wait_for("#sample-render", Duration::from_secs(10)).await;
    assert_eq!(
        browser.text("[data-sample=\"title\"]").await,
        "Hi Ann, your invoice of ¥1,280 is due"
    );

    // A sample for what is not a user id says so, naming the field.
    browser.client.goto(&format!("{console}/console/sends/{id}?sample=ann")).await.expect("goto");
    let refused = browser.wait_for("section p.error[role=alert]", Duration::from_secs(10)).await;
    let refused = refused.text().await.expect("error text");
    assert!(refused.contains("sample"), "{refused:?}");

    browser.stop().await;
    drop(messages);
    app.cleanup().await;
}
