//! Personalized sends: templates filled per recipient and per language,
//! everywhere the text shows (ListInbox, the gateway's events, the console),
//! re-rendered by an edit; and every bad input refused naming its field.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::StreamExt;
use notify_core::deliver::{self, TaskOutcome};
use notify_proto::v1;
use notify_proto::v1::event_service_client::EventServiceClient;
use notify_proto::v1::subscribe_response::Event;
use notify_testkit::{TestApp, spawn_app, spawn_app_with, test_settings};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::helpers::{chunk_vars, personalized_draft, wait_for_status};

/// An invoice reminder in English (the default), Traditional Chinese and
/// German; each recipient carries their name and amount.
fn invoice() -> v1::Content {
    let translation = |title: &str, body: &str| v1::Translation {
        title: title.to_owned(),
        body: body.to_owned(),
    };
    v1::Content {
        title: "Hi {{ name }}, your invoice of {{ amount }} is due".to_owned(),
        body: "Pay by {{ due }}.{% if amount|length > 5 %} A large one!{% endif %}".to_owned(),
        category: "billing".to_owned(),
        data: [("link".to_owned(), "app://invoices/{{ name|lower }}".to_owned())].into(),
        template: Some(v1::Template {
            vars: [("due".to_owned(), "12 December".to_owned())].into(),
            translations: [
                (
                    "zh-Hant".to_owned(),
                    translation(
                        "{{ name }}，您的帳單 {{ amount }} 即將到期",
                        "請於 {{ due }} 前付款",
                    ),
                ),
                (
                    "de".to_owned(),
                    translation("Hallo {{ name }}, {{ amount }} sind fällig", "Bis {{ due }}"),
                ),
            ]
            .into(),
            recipient_vars: vec!["name".to_owned(), "amount".to_owned()],
        }),
    }
}

fn recipient(user_id: u64, name: &str, amount: &str) -> v1::RecipientVars {
    v1::RecipientVars {
        user_id,
        vars: [("name".to_owned(), name.to_owned()), ("amount".to_owned(), amount.to_owned())]
            .into(),
    }
}

fn personalized(
    content: v1::Content,
    recipients: Vec<v1::RecipientVars>,
) -> v1::SendMessageRequest {
    v1::SendMessageRequest {
        sender: "tests".to_owned(),
        content: Some(content),
        audience: Some(v1::send_message_request::Audience::Users(v1::UserAudience {
            recipients,
            ..Default::default()
        })),
        ..Default::default()
    }
}

async fn set_locale(app: &TestApp, user_id: u64, locale: &str) {
    let preferences = v1::Preferences { locale: locale.to_owned(), ..Default::default() };
    let request = v1::SetPreferencesRequest { user_id, preferences: Some(preferences) };
    app.inbox().set_preferences(request).await.unwrap();
}

/// The user's item of `message_id` as ListInbox shows it.
async fn item(app: &TestApp, user_id: u64, message_id: u64) -> v1::Content {
    let request = v1::ListInboxRequest { user_id, page_size: 50, ..Default::default() };
    let page = app.inbox().list_inbox(request).await.unwrap().into_inner();
    let item = page.items.into_iter().find(|item| item.message_id == message_id);
    item.unwrap_or_else(|| panic!("user {user_id} has no item {message_id}")).content.unwrap()
}

fn refused(status: tonic::Status, field: &str) -> String {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{field}: ")),
        "expected an error naming {field}, got {:?}",
        status.message()
    );
    status.message().to_owned()
}

#[tokio::test]
async fn each_recipient_reads_their_own_text_in_their_language_on_every_shard() {
    // Chunks of three: a worker applies several of a shard's chunks in one
    // transaction, and their events' titles are rendered together.
    let mut settings = test_settings();
    settings.send.chunk_size = 3;
    let app = spawn_app_with(settings, true).await;
    // Forty users spread over the four shards, three languages and none.
    let users: Vec<u64> = (0..40).map(|i| 7_300_001 + i * 7_919).collect();
    let locales = ["zh-Hant-TW", "de-CH", "fr", ""];
    for (index, user) in users.iter().enumerate() {
        let locale = locales[index % locales.len()];
        if !locale.is_empty() {
            set_locale(&app, *user, locale).await;
        }
    }
    let mut stream = open_stream(&app, &users).await;
    let recipients =
        users.iter().map(|u| recipient(*u, &format!("U{u}"), &format!("¥{}", u % 1000))).collect();
    let response = app.messages().send_message(personalized(invoice(), recipients)).await;
    let id = response.unwrap().into_inner().message_id;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    // One item each, in its user's bucket.
    let mut sorted = users.clone();
    sorted.sort_unstable();
    assert_eq!(app.item_users(id).await, sorted);

    let mut expected_titles = BTreeMap::new();
    for (index, user) in users.iter().enumerate() {
        let (name, amount) = (format!("U{user}"), format!("¥{}", user % 1000));
        let shown = item(&app, *user, id).await;
        let (title, body) = match locales[index % locales.len()] {
            "zh-Hant-TW" => (
                format!("{name}，您的帳單 {amount} 即將到期"),
                "請於 12 December 前付款".to_owned(),
            ),
            "de-CH" => {
                (format!("Hallo {name}, {amount} sind fällig"), "Bis 12 December".to_owned())
            }
            _ => {
                let large = if amount.chars().count() > 5 { " A large one!" } else { "" };
                (
                    format!("Hi {name}, your invoice of {amount} is due"),
                    format!("Pay by 12 December.{large}"),
                )
            }
        };
        assert_eq!(
            (shown.title.as_str(), shown.body.as_str()),
            (title.as_str(), body.as_str()),
            "user {user}"
        );
        assert_eq!(shown.data["link"], format!("app://invoices/u{user}"));
        assert!(shown.template.is_none(), "an item shows the text, not the template");
        expected_titles.insert(*user, title);
    }

    // The gateway's events carry each recipient's own title.
    assert_eq!(stream.titles_of(id, users.len()).await, expected_titles);

    // An applied chunk keeps no vars: its items hold them.
    let mut chunks = Vec::new();
    for (shard, pool) in app.ctx.pools.iter() {
        let rows: Vec<(u64, Option<Vec<u8>>)> =
            sqlx::query_as("SELECT chunk_id, vars FROM message_chunks WHERE message_id = ?")
                .bind(id)
                .fetch_all(pool)
                .await
                .unwrap();
        for (chunk_id, vars) in rows {
            assert_eq!(vars, None, "chunk {chunk_id} on shard {shard} kept its recipients' vars");
            chunks.push((shard, chunk_id));
        }
    }
    assert!(chunks.len() > 4, "chunks of three on four shards: {chunks:?}");
    // A duplicate task of each (its first attempt may have died before its
    // event) announces it again, titled from the items' vars.
    let send = notify_domain::domain::MessageId::from_raw(id);
    for (shard, chunk_id) in &chunks {
        let outcomes = deliver::apply_group(&app.ctx, *shard, send, &[*chunk_id], true).await;
        assert_eq!(outcomes.unwrap(), [TaskOutcome::AlreadyDone]);
    }
    assert_eq!(stream.titles_of(id, users.len()).await, expected_titles);

    // An edit re-renders every inbox with the vars each item keeps.
    let mut edited = invoice();
    edited.title = "Reminder for {{ name }}: {{ amount }}".to_owned();
    edited.template.as_mut().unwrap().translations.clear();
    let request = v1::EditMessageRequest { message_id: id, content: Some(edited) };
    app.messages().edit_message(request).await.unwrap();
    let updated = loop {
        if let Event::ItemUpdated(update) = stream.next().await
            && update.message_id == id
        {
            break update;
        }
    };
    assert_eq!(updated.title, "", "a template's new title differs by reader: streams re-read it");
    for &user in &users[..3] {
        let shown = item(&app, user, id).await;
        assert_eq!(shown.title, format!("Reminder for U{user}: ¥{}", user % 1000));
    }

    // A reader who changes language reads the other variant at once.
    let mut back = invoice();
    back.title = "Hi {{ name }}, your invoice of {{ amount }} is due".to_owned();
    let request = v1::EditMessageRequest { message_id: id, content: Some(back) };
    app.messages().edit_message(request).await.unwrap();
    set_locale(&app, users[3], "zh-Hant").await;
    let shown = item(&app, users[3], id).await;
    assert_eq!(shown.title, format!("U{}，您的帳單 ¥{} 即將到期", users[3], users[3] % 1000));
    app.cleanup().await;
}

#[tokio::test]
async fn a_translated_send_holds_back_who_mutes_it_and_titles_the_rest_in_their_language() {
    // Chunks of two: the apply reads each recipient's preferences once, for
    // who is held back and for the language of their event's title.
    let mut settings = test_settings();
    settings.send.chunk_size = 2;
    let app = spawn_app_with(settings, true).await;
    let (zh, muting, none, fr) = (7_400_001, 7_400_002, 7_400_003, 7_400_004);
    set_locale(&app, zh, "zh-Hant-TW").await;
    let mutes = |user_id, locale: &str, category: &str| v1::SetPreferencesRequest {
        user_id,
        preferences: Some(v1::Preferences {
            locale: locale.to_owned(),
            muted_categories: vec![category.to_owned()],
            ..Default::default()
        }),
    };
    app.inbox().set_preferences(mutes(muting, "de", "billing")).await.unwrap();
    app.inbox().set_preferences(mutes(fr, "fr", "news")).await.unwrap();
    let users = [zh, muting, none, fr];
    let mut stream = open_stream(&app, &users).await;
    let recipients = users.iter().map(|u| recipient(*u, &format!("U{u}"), "¥9")).collect();
    let response = app.messages().send_message(personalized(invoice(), recipients)).await;
    let id = response.unwrap().into_inner().message_id;
    let done = wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let progress = done.progress.unwrap();
    assert_eq!((progress.delivered, progress.suppressed), (3, 1));
    assert_eq!(app.item_users(id).await, [zh, none, fr]);

    let expected: HashMap<u64, String> = [
        (zh, format!("U{zh}，您的帳單 ¥9 即將到期")),
        (none, format!("Hi U{none}, your invoice of ¥9 is due")),
        (fr, format!("Hi U{fr}, your invoice of ¥9 is due")),
    ]
    .into();
    let mut titles = HashMap::new();
    while titles.len() < expected.len() {
        if let Event::ItemDelivered(item) = stream.next().await
            && item.message_id == id
        {
            assert_ne!(item.user_id, muting, "an event for the recipient who mutes the send");
            titles.insert(item.user_id, item.title);
        }
    }
    assert_eq!(titles, expected);
    for user in [zh, none, fr] {
        assert_eq!(item(&app, user, id).await.title, expected[&user]);
    }
    app.cleanup().await;
}

#[tokio::test]
async fn a_send_found_by_its_key_takes_recipients_checked_against_its_own_template() {
    let app = spawn_app().await;
    let mut messages = app.messages();
    // A draft under the key, never filled: a SendMessage with the same key
    // finds it, and fills and starts it.
    let draft = v1::CreateMessageRequest {
        sender: "tests".to_owned(),
        idempotency_key: "invoices-7".to_owned(),
        content: Some(invoice()),
        ..Default::default()
    };
    let id = messages.create_message(draft).await.unwrap().into_inner().message_id;
    let users = [7_500_001, 7_500_002];
    let send = |content: v1::Content, names_only: bool| {
        let recipients = users
            .iter()
            .map(|u| {
                let mut one = recipient(*u, &format!("U{u}"), "¥1");
                if names_only {
                    one.vars.remove("amount");
                }
                one
            })
            .collect();
        let mut request = personalized(content, recipients);
        request.idempotency_key = "invoices-7".to_owned();
        request
    };
    // Another template under the same key: these recipients fit it, not
    // the draft's, so nothing is appended.
    let mut other = invoice();
    other.title = "Hi {{ name }}".to_owned();
    other.body = "Your invoice".to_owned();
    other.data.clear();
    let template = other.template.as_mut().unwrap();
    template.translations.clear();
    template.recipient_vars = vec!["name".to_owned()];
    let status = messages.send_message(send(other, true)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("another template"), "{status:?}");
    assert_eq!(app.count_chunks(id).await, 0, "recipients stored against another template");

    // The draft's own template: its recipients go in, and it starts.
    let sent = messages.send_message(send(invoice(), false)).await.unwrap().into_inner();
    assert_eq!(sent.message_id, id);
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert_eq!(app.item_users(id).await, users);
    assert_eq!(item(&app, users[0], id).await.title, "Hi U7500001, your invoice of ¥1 is due");
    app.cleanup().await;
}

#[tokio::test]
async fn a_draft_takes_recipients_with_vars_batch_by_batch_and_a_bad_batch_stores_nothing() {
    let app = spawn_app().await;
    let mut messages = app.messages();
    let request = v1::CreateMessageRequest {
        sender: "tests".to_owned(),
        content: Some(invoice()),
        ..Default::default()
    };
    let id = messages.create_message(request).await.unwrap().into_inner().message_id;
    let batch = |number: u64, recipients: Vec<v1::RecipientVars>| v1::AppendRecipientsRequest {
        message_id: id,
        batch_number: number,
        recipients,
        ..Default::default()
    };
    let first: Vec<_> =
        (0..600).map(|i| recipient(7_400_001 + i, &format!("N{i}"), "€5")).collect();
    messages.append_recipients(batch(1, first)).await.unwrap();
    let mut bad: Vec<_> = (0..3).map(|i| recipient(7_500_001 + i, "X", "€1")).collect();
    bad[1].vars.remove("amount");
    let status = messages.append_recipients(batch(2, bad)).await.unwrap_err();
    let reason = refused(status, "recipients[1].vars");
    assert!(reason.contains("\"amount\" is missing"), "{reason}");
    let bare = v1::AppendRecipientsRequest {
        message_id: id,
        batch_number: 3,
        user_ids: vec![7_600_001],
        ..Default::default()
    };
    refused(messages.append_recipients(bare).await.unwrap_err(), "user_ids");
    let message = messages.get_message(v1::GetMessageRequest { message_id: id }).await.unwrap();
    assert_eq!(message.into_inner().progress.unwrap().total, 600, "refused batches store nobody");

    messages.start_message(v1::StartMessageRequest { message_id: id }).await.unwrap();
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    for (i, user) in [(0, 7_400_001), (599, 7_400_600)] {
        let shown = item(&app, user, id).await;
        assert_eq!(shown.title, format!("Hi N{i}, your invoice of €5 is due"));
    }
    app.cleanup().await;
}

#[tokio::test]
async fn an_announcement_renders_in_each_readers_language_with_the_sends_vars() {
    let app = spawn_app().await;
    let (zh, plain) = (7_700_001, 7_700_002);
    set_locale(&app, zh, "zh-Hant-TW").await;
    let announce = |product: &str| {
        let mut content = invoice();
        content.title = "{{ product }} is out".to_owned();
        content.body = String::new();
        content.data.clear();
        let template = content.template.as_mut().unwrap();
        template.recipient_vars.clear();
        template.vars = [("product".to_owned(), product.to_owned())].into();
        let translation =
            |title: &str| v1::Translation { title: title.into(), body: String::new() };
        template.translations = [
            ("zh-Hant".to_owned(), translation("{{ product }} 發佈了")),
            ("de".to_owned(), translation("{{ product }} ist da")),
        ]
        .into();
        v1::SendMessageRequest {
            sender: "tests".to_owned(),
            content: Some(content),
            audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
            ..Default::default()
        }
    };
    // Each reader's stream shows the title in their language, as their
    // snapshot read it and as they change it while followed.
    let mut stream = open_stream(&app, &[zh, plain]).await;
    let first = app.messages().send_message(announce("Notify 2")).await.unwrap().into_inner();
    let shown = stream.titles_of(first.message_id, 2).await;
    let expected = [(zh, "Notify 2 發佈了"), (plain, "Notify 2 is out")];
    assert_eq!(shown, expected.map(|(user, title)| (user, title.to_owned())).into());
    assert_eq!(item(&app, zh, first.message_id).await.title, "Notify 2 發佈了");
    assert_eq!(item(&app, plain, first.message_id).await.title, "Notify 2 is out");

    set_locale(&app, plain, "de-AT").await;
    let second = app.messages().send_message(announce("Notify 3")).await.unwrap().into_inner();
    let shown = stream.titles_of(second.message_id, 2).await;
    let expected = [(zh, "Notify 3 發佈了"), (plain, "Notify 3 ist da")];
    assert_eq!(shown, expected.map(|(user, title)| (user, title.to_owned())).into());
    assert_eq!(item(&app, plain, second.message_id).await.title, "Notify 3 ist da");
    app.cleanup().await;
}

#[tokio::test]
async fn bad_templates_and_vars_are_refused_naming_the_field_and_store_nothing() {
    let app = spawn_app().await;
    let mut messages = app.messages();
    let user = 7_800_001;
    let with = |edit: &dyn Fn(&mut v1::Content)| {
        let mut content = invoice();
        edit(&mut content);
        personalized(content, vec![recipient(user, "Ann", "¥1")])
    };
    let cases: Vec<(v1::SendMessageRequest, &str, &str)> = vec![
        (
            with(&|c| c.body = "line one\n{% if name %}open".to_owned()),
            "content.body",
            "line 2, column",
        ),
        (
            with(&|c| c.title = "Hi {{ name|shout }}".to_owned()),
            "content.title",
            "line 1, column 12: unknown filter \"shout\"",
        ),
        (
            with(&|c| c.body = "{{ name }}\n  {{ balance }}".to_owned()),
            "content.body",
            "line 2, column 6: variable \"balance\" is not provided",
        ),
        (
            with(&|c| {
                c.data.insert("x".to_owned(), "{{ nope() }}".to_owned());
            }),
            "content.data.x",
            "unknown function \"nope\"",
        ),
        (
            with(&|c| {
                let t = c.template.as_mut().unwrap();
                t.translations.insert(
                    "english!".to_owned(),
                    v1::Translation { title: "x".into(), body: String::new() },
                );
            }),
            "content.template.translations",
            "not a BCP 47 language tag",
        ),
        (
            with(&|c| {
                c.template.as_mut().unwrap().translations.get_mut("de").unwrap().title =
                    "{{ name ".to_owned()
            }),
            "content.template.translations.de.title",
            "line 1, column",
        ),
        (
            with(&|c| {
                c.template.as_mut().unwrap().vars.insert("1st".into(), String::new());
            }),
            "content.template.vars",
            "not a variable name",
        ),
    ];
    for (request, field, reason) in cases {
        let message = refused(messages.send_message(request).await.unwrap_err(), field);
        assert!(message.contains(reason), "{field}: {message:?} lacks {reason:?}");
    }
    let recipients_cases: Vec<(Vec<v1::RecipientVars>, &str, &str)> = vec![
        (
            vec![recipient(user, "Ann", &"9".repeat(1_100))],
            "audience.users.recipients[0].vars",
            "the limit is 1024",
        ),
        (
            vec![
                recipient(user, "Ann", "1"),
                recipient(user + 1, "Bo", "2"),
                recipient(user, "Ann", "1"),
            ],
            "audience.users.recipients[2].user_id",
            "listed twice",
        ),
        (
            vec![{
                let mut r = recipient(user, "Ann", "1");
                r.vars.insert("nmae".to_owned(), "typo".to_owned());
                r
            }],
            "audience.users.recipients[0].vars",
            "\"nmae\" is not one of the template's recipient_vars",
        ),
        (vec![recipient(0, "Zero", "0")], "audience.users.recipients[0].user_id", "must not be 0"),
    ];
    for (recipients, field, reason) in recipients_cases {
        let status = messages.send_message(personalized(invoice(), recipients)).await.unwrap_err();
        let message = refused(status, field);
        assert!(message.contains(reason), "{field}: {message:?} lacks {reason:?}");
    }
    // Bare ids for a template that needs vars, and vars for one that needs none.
    let mut bare = personalized(invoice(), Vec::new());
    bare.audience = Some(v1::send_message_request::Audience::Users(v1::UserAudience {
        user_ids: vec![user],
        ..Default::default()
    }));
    refused(messages.send_message(bare).await.unwrap_err(), "audience.users.user_ids");
    let mut plain = invoice();
    plain.title = "Hi".into();
    plain.body = "{{ due }}".into();
    plain.data.clear();
    plain.template.as_mut().unwrap().recipient_vars.clear();
    plain.template.as_mut().unwrap().translations.clear();
    let status = messages.send_message(personalized(plain, vec![recipient(user, "A", "1")])).await;
    refused(status.unwrap_err(), "audience.users.recipients[0].vars");
    // An announcement has no recipients to carry vars.
    let announcement = v1::SendMessageRequest {
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        ..personalized(invoice(), Vec::new())
    };
    refused(
        messages.send_message(announcement).await.unwrap_err(),
        "content.template.recipient_vars",
    );

    // None of it left a send or an item behind.
    let listed = messages
        .list_messages(v1::ListMessagesRequest {
            sender: "tests".into(),
            page_size: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.messages.is_empty(), "{:?}", listed.messages);

    // An edit keeps the recipients' var names: their vars are stored.
    let response =
        messages.send_message(personalized(invoice(), vec![recipient(user, "Ann", "¥1")]));
    let id = response.await.unwrap().into_inner().message_id;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let mut renamed = invoice();
    renamed.template.as_mut().unwrap().recipient_vars.push("plan".into());
    let request = v1::EditMessageRequest { message_id: id, content: Some(renamed) };
    refused(messages.edit_message(request).await.unwrap_err(), "content.template.recipient_vars");
    assert_eq!(item(&app, user, id).await.title, "Hi Ann, your invoice of ¥1 is due");
    app.cleanup().await;
}

#[tokio::test]
async fn a_cancelled_personalized_draft_keeps_no_vars() {
    let app = spawn_app().await;
    let users = [7_360_001u64, 7_360_002, 7_360_003];
    let recipients = users.iter().map(|u| recipient(*u, &format!("U{u}"), "¥1")).collect();
    let draft = personalized_draft(&app, invoice(), recipients).await;
    assert_eq!(chunk_vars(&app, draft).await.len(), users.len());
    app.messages().cancel_message(v1::CancelMessageRequest { message_id: draft }).await.unwrap();
    wait_for_status(&app, draft, v1::MessageStatus::Cancelled).await;
    // The cancel's walk of each shard's pending chunks runs after the status.
    app.wait_for_operations(draft).await;
    assert_eq!(chunk_vars(&app, draft).await, BTreeMap::new());
    app.cleanup().await;
}

/// A `Subscribe` stream following `users`, past their snapshots.
async fn open_stream(app: &TestApp, users: &[u64]) -> EventReader {
    let (changes, rx) = mpsc::channel(4);
    let mut client = EventServiceClient::new(app.channel());
    let events = client.subscribe(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let request = v1::SubscribeRequest { add_user_ids: users.to_vec(), ..Default::default() };
    changes.send(request).await.unwrap();
    let mut reader = EventReader { _changes: changes, events };
    let mut snapshots = 0;
    while snapshots < users.len() {
        if let Event::Snapshot(_) = reader.next().await {
            snapshots += 1;
        }
    }
    reader
}

struct EventReader {
    _changes: mpsc::Sender<v1::SubscribeRequest>,
    events: tonic::Streaming<v1::SubscribeResponse>,
}

impl EventReader {
    async fn next(&mut self) -> Event {
        let item = tokio::time::timeout(Duration::from_secs(20), self.events.next()).await;
        item.expect("an event within 20 s").expect("stream open").unwrap().event.unwrap()
    }

    /// The titles of `message_id`'s `ItemDelivered`, by user, once `users`
    /// of them arrived.
    async fn titles_of(&mut self, message_id: u64, users: usize) -> BTreeMap<u64, String> {
        let mut titles = BTreeMap::new();
        while titles.len() < users {
            if let Event::ItemDelivered(item) = self.next().await
                && item.message_id == message_id
            {
                titles.insert(item.user_id, item.title);
            }
        }
        titles
    }
}

#[tokio::test]
async fn a_group_message_renders_in_each_members_language_and_refuses_recipient_vars() {
    let app = spawn_app().await;
    let group = crate::groups::create_group(&app, "ops").await;
    let (de, plain) = (7_900_001, 7_900_002);
    crate::groups::add(&app, group, vec![de, plain], false).await;
    set_locale(&app, de, "de-AT").await;
    let mut content = invoice();
    content.title = "{{ service }} is down".to_owned();
    content.body = "since {{ since }}".to_owned();
    content.data.clear();
    let template = content.template.as_mut().unwrap();
    template.recipient_vars.clear();
    template.vars =
        [("service".to_owned(), "Billing".to_owned()), ("since".to_owned(), "09:00".to_owned())]
            .into();
    template.translations = [(
        "de".to_owned(),
        v1::Translation {
            title: "{{ service }} ist ausgefallen".to_owned(),
            body: "seit {{ since }}".to_owned(),
        },
    )]
    .into();
    let mut request = crate::groups::send_request(group, "x", "k1");
    request.content = Some(content.clone());
    app.groups().send_group_message(request.clone()).await.unwrap();
    let shown = |pulled: v1::PullGroupMessagesResponse| {
        let content = pulled.messages[0].content.clone().unwrap();
        (content.title, content.body)
    };
    let pulled = crate::groups::pull(&app, de, group, None, 10).await;
    assert_eq!(shown(pulled), ("Billing ist ausgefallen".to_owned(), "seit 09:00".to_owned()));
    let pulled = crate::groups::pull(&app, plain, group, None, 10).await;
    assert_eq!(shown(pulled), ("Billing is down".to_owned(), "since 09:00".to_owned()));

    content.template.as_mut().unwrap().recipient_vars = vec!["name".to_owned()];
    request.content = Some(content);
    request.idempotency_key = "k2".to_owned();
    let status = app.groups().send_group_message(request).await.unwrap_err();
    refused(status, "content.template.recipient_vars");
    app.cleanup().await;
}
