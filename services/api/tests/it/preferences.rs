//! Preferences: muted categories hold back later sends (counted as
//! suppressed) and announcements, critical sends ignore them, muted groups
//! still pull but stay out of the badge total; bad preferences are refused.

use notify_proto::v1;
use notify_proto::v1::inbox_service_client::InboxServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_testkit::{TestApp, authed, spawn_app, spawn_app_with, test_settings, with_clients};
use tonic::Code;

use crate::helpers::{content, send_request, wait_for_status};
use crate::items::{served, stored, truth};

async fn set_prefs(app: &TestApp, user_id: u64, categories: &[&str], groups: &[u64]) {
    let preferences = v1::Preferences {
        muted_categories: categories.iter().map(|c| (*c).to_owned()).collect(),
        muted_group_ids: groups.to_vec(),
        ..Default::default()
    };
    let request = v1::SetPreferencesRequest { user_id, preferences: Some(preferences) };
    app.inbox().set_preferences(request).await.unwrap();
}

/// Sends `category` to `users` (critical or not); waits until it ends.
async fn send_in(app: &TestApp, users: &[u64], category: &str, critical: bool) -> v1::Message {
    let mut request = send_request(users.to_vec());
    request.content = Some(v1::Content { category: category.to_owned(), ..content("pref") });
    request.critical = critical;
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    wait_for_status(app, id, v1::MessageStatus::Completed).await
}

fn holds(progress: &v1::Progress) {
    assert_eq!(
        progress.total,
        progress.delivered
            + progress.failed
            + progress.suppressed
            + progress.cancelled
            + progress.pending,
        "total = delivered + failed + suppressed + cancelled + pending: {progress:?}"
    );
}

#[tokio::test]
async fn a_muted_category_holds_later_sends_back_and_a_critical_send_ignores_it() {
    let app = spawn_app().await;
    let (muter, other) = (6_100_001, 6_100_002);
    let before = send_in(&app, &[muter, other], "promo", false).await;
    set_prefs(&app, muter, &["promo", "news", "promo"], &[]).await;
    let prefs = app
        .inbox()
        .get_preferences(v1::GetPreferencesRequest { user_id: muter })
        .await
        .unwrap()
        .into_inner()
        .preferences
        .unwrap();
    assert_eq!(prefs.muted_categories, ["news", "promo"], "sorted, without repeats");

    let muted = send_in(&app, &[muter, other], "promo", false).await;
    let progress = muted.progress.unwrap();
    assert_eq!((progress.total, progress.delivered, progress.suppressed), (2, 1, 1));
    holds(&progress);
    let items = stored(&app, muter).await;
    assert!(items.contains_key(&before.message_id), "items delivered before the mute stay");
    assert!(!items.contains_key(&muted.message_id), "no item for a muted category");
    assert!(stored(&app, other).await.contains_key(&muted.message_id));

    let critical = send_in(&app, &[muter, other], "promo", true).await;
    assert!(critical.critical);
    let progress = critical.progress.unwrap();
    assert_eq!((progress.delivered, progress.suppressed), (2, 0), "critical ignores mutes");
    let elsewhere = send_in(&app, &[muter], "billing", false).await;
    assert_eq!(elsewhere.progress.unwrap().delivered, 1);

    set_prefs(&app, muter, &[], &[]).await;
    let after = send_in(&app, &[muter], "promo", false).await;
    assert_eq!(after.progress.unwrap().delivered, 1, "unmuted: delivered again");
    assert_eq!(served(&app, muter).await, truth(&app, muter).await);
    app.cleanup().await;
}

#[tokio::test]
async fn suppression_is_counted_exactly_in_chunk_groups_and_the_events_skip_it() {
    let app = spawn_app().await;
    // 1,200 recipients (several chunks per shard, applied as groups), a
    // tenth of them muting the category.
    let users: Vec<u64> = (0..1200).map(|i| 6_200_000 + i).collect();
    let muting: Vec<u64> = users.iter().copied().filter(|u| u % 10 == 0).collect();
    for user in &muting {
        set_prefs(&app, *user, &["promo"], &[]).await;
    }
    let sent = send_in(&app, &users, "promo", false).await;
    let progress = sent.progress.unwrap();
    assert_eq!(progress.total, 1200);
    assert_eq!(progress.suppressed, muting.len() as u64);
    assert_eq!(progress.delivered, 1200 - muting.len() as u64);
    holds(&progress);
    assert_eq!(app.count_items(sent.message_id).await, 1200 - muting.len() as u64);
    app.cleanup().await;
}

#[tokio::test]
async fn an_announcement_in_a_muted_category_is_neither_shown_nor_counted() {
    let app = spawn_app().await;
    let (muter, other) = (6_300_001, 6_300_002);
    set_prefs(&app, muter, &["promo"], &[]).await;
    let announce = |category: &str, critical: bool| v1::SendMessageRequest {
        sender: "tests".into(),
        content: Some(v1::Content { category: category.to_owned(), ..content("all") }),
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        critical,
        ..Default::default()
    };
    let promo = app.messages().send_message(announce("promo", false)).await.unwrap().into_inner();
    assert_eq!(served(&app, muter).await, (0, 0));
    assert_eq!(served(&app, other).await, (1, 1));
    assert!(crate::helpers::inbox_ids(&app, muter).await.is_empty());
    assert_eq!(crate::helpers::inbox_ids(&app, other).await, [promo.message_id]);
    // Nothing was written for the muter: a read materializes nothing.
    assert!(stored(&app, muter).await.is_empty());

    let critical = app.messages().send_message(announce("promo", true)).await.unwrap().into_inner();
    assert_eq!(served(&app, muter).await, (1, 1), "a critical announcement ignores mutes");
    assert_eq!(crate::helpers::inbox_ids(&app, muter).await, [critical.message_id]);

    // Unmuted while still live: it is delivered now.
    set_prefs(&app, muter, &[], &[]).await;
    assert_eq!(served(&app, muter).await, (2, 2));
    assert_eq!(
        crate::helpers::inbox_ids(&app, muter).await,
        [critical.message_id, promo.message_id]
    );
    app.cleanup().await;
}

#[tokio::test]
async fn a_muted_group_still_pulls_but_stays_out_of_the_badge_total() {
    let app = spawn_app().await;
    let user = 6_400_001;
    let mut groups = app.groups();
    let mut make = async |name: &str| {
        let request = v1::CreateGroupRequest { group_id: 0, name: name.to_owned() };
        let group = groups.create_group(request).await.unwrap().into_inner().group_id;
        let add = v1::AddGroupMembersRequest {
            group_id: group,
            user_ids: vec![user],
            with_history: false,
        };
        groups.add_group_members(add).await.unwrap();
        for seq in 0..3 {
            let send = v1::SendGroupMessageRequest {
                group_id: group,
                sender: "tests".into(),
                content: Some(content(&format!("{name} {seq}"))),
                ..Default::default()
            };
            groups.send_group_message(send).await.unwrap();
        }
        group
    };
    let loud = make("loud").await;
    let quiet = make("quiet").await;
    let unread = async || {
        app.groups()
            .get_group_unread(v1::GetGroupUnreadRequest { user_id: user })
            .await
            .unwrap()
            .into_inner()
    };
    assert_eq!(unread().await.total, 6);
    set_prefs(&app, user, &[], &[quiet]).await;
    let after = unread().await;
    assert_eq!(after.total, 3, "the muted group's unread is out of the total");
    let of = |id: u64| *after.groups.iter().find(|g| g.group_id == id).unwrap();
    assert!(of(quiet).muted && of(quiet).unread == 3);
    assert!(!of(loud).muted && of(loud).unread == 3);
    let badge = crate::helpers::counts(&app, user).await;
    assert_eq!(badge.group_unread, 3);
    app.flush_cache().await;
    assert_eq!(unread().await.total, 3, "rebuilt from MySQL the same");
    let pull = v1::PullGroupMessagesRequest {
        user_id: user,
        group_id: quiet,
        limit: 100,
        ..Default::default()
    };
    let pulled = app.groups().pull_group_messages(pull).await.unwrap().into_inner();
    assert_eq!(pulled.messages.len(), 3, "a muted group's messages still pull");
    set_prefs(&app, user, &[], &[]).await;
    assert_eq!(unread().await.total, 6);
    app.cleanup().await;
}

#[tokio::test]
async fn bad_preferences_name_the_field_and_change_nothing() {
    let app = spawn_app().await;
    let user = 6_500_001;
    let kept = v1::Preferences {
        muted_categories: vec!["billing".into()],
        muted_group_ids: vec![7],
        locale: "zh-Hant-TW".into(),
    };
    let request = v1::SetPreferencesRequest { user_id: user, preferences: Some(kept.clone()) };
    app.inbox().set_preferences(request).await.unwrap();
    let too_many: Vec<String> = (0..101).map(|i| format!("c{i}")).collect();
    let cases = [
        (
            v1::Preferences { muted_categories: too_many, ..Default::default() },
            "preferences.muted_categories",
        ),
        (
            v1::Preferences { muted_categories: vec!["Bad!".into()], ..Default::default() },
            "preferences.muted_categories",
        ),
        (
            v1::Preferences { muted_categories: vec!["".into()], ..Default::default() },
            "preferences.muted_categories",
        ),
        (
            v1::Preferences { muted_group_ids: (1..=1001).collect(), ..Default::default() },
            "preferences.muted_group_ids",
        ),
        (
            v1::Preferences { muted_group_ids: vec![0], ..Default::default() },
            "preferences.muted_group_ids",
        ),
        (v1::Preferences { locale: "english!".into(), ..Default::default() }, "preferences.locale"),
        (v1::Preferences { locale: "x".repeat(65), ..Default::default() }, "preferences.locale"),
    ];
    for (preferences, field) in cases {
        let request = v1::SetPreferencesRequest { user_id: user, preferences: Some(preferences) };
        let status = app.inbox().set_preferences(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with(&format!("{field}: ")), "{}", status.message());
    }
    let stored = app
        .inbox()
        .get_preferences(v1::GetPreferencesRequest { user_id: user })
        .await
        .unwrap()
        .into_inner()
        .preferences
        .unwrap();
    assert_eq!(stored, kept, "nothing changed");
    app.cleanup().await;
}

#[tokio::test]
async fn a_locale_is_stored_canonical_answered_and_cleared() {
    let app = spawn_app().await;
    let user = 6_500_011;
    let set = |locale: &str| v1::SetPreferencesRequest {
        user_id: user,
        preferences: Some(v1::Preferences { locale: locale.to_owned(), ..Default::default() }),
    };
    let get = || async {
        let request = v1::GetPreferencesRequest { user_id: user };
        app.inbox().get_preferences(request).await.unwrap().into_inner().preferences.unwrap()
    };
    let answered = app.inbox().set_preferences(set("zh_hant_tw")).await.unwrap().into_inner();
    assert_eq!(answered.preferences.unwrap().locale, "zh-Hant-TW", "canonical, as answered");
    assert_eq!(get().await.locale, "zh-Hant-TW", "canonical, as stored");
    app.inbox().set_preferences(set("")).await.unwrap();
    assert_eq!(get().await.locale, "", "a replace without a locale clears it");
    app.cleanup().await;
}

#[tokio::test]
async fn a_critical_send_needs_its_scope_and_preferences_need_inbox_scopes() {
    let mut settings = test_settings();
    let tokens = with_clients(
        &mut settings,
        &[
            ("plain", &["send", "sends.read"]),
            ("urgent", &["send", "send.critical", "sends.read"]),
            ("reader", &["inbox.read"]),
        ],
    );
    let app = spawn_app_with(settings, true).await;
    let mut plain = MessageServiceClient::new(authed(app.channel(), &tokens["plain"]));
    let mut request = send_request(vec![6_600_001]);
    request.sender = String::new();
    request.critical = true;
    let status = plain.send_message(request.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().starts_with("critical: "), "{}", status.message());
    let mut urgent = MessageServiceClient::new(authed(app.channel(), &tokens["urgent"]));
    urgent.send_message(request).await.unwrap();

    let mut reader = InboxServiceClient::new(authed(app.channel(), &tokens["reader"]));
    reader.get_preferences(v1::GetPreferencesRequest { user_id: 1 }).await.unwrap();
    let set = v1::SetPreferencesRequest { user_id: 1, preferences: Some(Default::default()) };
    assert_eq!(reader.set_preferences(set).await.unwrap_err().code(), Code::PermissionDenied);
    app.cleanup().await;
}
