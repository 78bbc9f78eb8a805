//! Erasure of a user: nothing of theirs left on any shard or in Redis, sends
//! queued before it skip them (suppressed), the audit keeps only the id.

use std::collections::BTreeMap;

use notify_proto::v1;
use notify_proto::v1::admin_service_client::AdminServiceClient;
use notify_testkit::{TestApp, authed, spawn_app, spawn_app_with, test_settings, with_clients};
use redis::AsyncCommands;
use tonic::Code;

use crate::helpers::{
    chunk_vars, content, create_draft, personalized_draft, send_request, wait_for_status,
};
use crate::items::served;

/// Rows of `user_id` in every per-user table, summed over every shard.
async fn rows_of(app: &TestApp, user_id: u64) -> Vec<(String, i64)> {
    let mut counts = Vec::new();
    let tables = [
        "message_items",
        "user_inbox_state",
        "group_members",
        "retention_pending_badges",
        "read_feed",
    ];
    for table in tables {
        let mut total = 0;
        for (_, pool) in app.ctx.pools.iter() {
            let sql = format!("SELECT COUNT(*) FROM {table} WHERE user_id = ?");
            let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(user_id)
                .fetch_one(pool)
                .await
                .unwrap();
            total += count;
        }
        counts.push((table.to_owned(), total));
    }
    counts
}

async fn erase(app: &TestApp, user_id: u64) -> v1::EraseUserResponse {
    AdminServiceClient::new(app.channel())
        .erase_user(v1::EraseUserRequest { user_id })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn an_erased_user_leaves_nothing_on_any_shard_or_in_redis() {
    let mut app = spawn_app().await;
    let (user, other) = (7_100_001, 7_100_002);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = app.send(vec![user, other]).await;
        wait_for_status(&app, id, v1::MessageStatus::Completed).await;
        ids.push(id);
    }
    let announcement = v1::SendMessageRequest {
        sender: "tests".into(),
        content: Some(content("for all")),
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        ..Default::default()
    };
    app.messages().send_message(announcement).await.unwrap();
    let group = app
        .groups()
        .create_group(v1::CreateGroupRequest { group_id: 0, name: "erased".into() })
        .await
        .unwrap()
        .into_inner()
        .group_id;
    let add = v1::AddGroupMembersRequest {
        group_id: group,
        user_ids: vec![user, other],
        with_history: false,
    };
    app.groups().add_group_members(add).await.unwrap();
    let preferences = v1::Preferences {
        muted_categories: vec!["promo".into()],
        muted_group_ids: vec![group],
        locale: "zh-Hant".into(),
    };
    app.inbox()
        .set_preferences(v1::SetPreferencesRequest {
            user_id: user,
            preferences: Some(preferences),
        })
        .await
        .unwrap();
    // The announcement materialized, and then badge and page cached.
    assert_eq!(crate::helpers::inbox_ids(&app, user).await.len(), 4);
    assert_eq!(served(&app, user).await, (4, 4));
    assert_eq!(crate::helpers::inbox_ids(&app, user).await.len(), 4);
    let badge_key = app.ctx.cache.keys().unread(user);
    let mut redis = app.ctx.cache.connection();
    assert!(redis.exists::<_, bool>(&badge_key).await.unwrap(), "the badge was cached");
    // Reads of both waiting for item.read webhooks (as an endpoint would
    // have them recorded): the erased user's go, the other's stay. No
    // worker from here on: its relay would drop them (nobody wants them).
    app.stop_worker().await;
    for reader in [user, other] {
        let pool = app.ctx.pools.for_user(reader);
        sqlx::query(
            "INSERT INTO read_feed (message_id, user_id, read_at) VALUES (?, ?, UTC_TIMESTAMP(3))",
        )
        .bind(ids[0])
        .bind(reader)
        .execute(pool.value())
        .await
        .unwrap();
    }

    let erased = erase(&app, user).await;
    assert_eq!((erased.items, erased.memberships), (4, 1));
    for (table, count) in rows_of(&app, user).await {
        assert_eq!(count, 0, "{table} still holds rows of the erased user");
    }
    let marker: Vec<(String, String, u64, String)> = {
        let pool = app.ctx.pools.for_user(user);
        sqlx::query_as(
            "SELECT muted_categories, muted_group_ids, erased_before, locale FROM user_preferences \
             WHERE user_id = ?",
        )
        .bind(user)
        .fetch_all(pool.value())
        .await
        .unwrap()
    };
    assert_eq!(marker.len(), 1);
    assert_eq!(
        (marker[0].0.as_str(), marker[0].1.as_str(), marker[0].3.as_str()),
        ("", "", ""),
        "no preference is kept"
    );
    assert!(marker[0].2 > ids[2], "the marker reaches past every send queued before");
    let pattern = format!("{}{{u:{user}}}*", app.ctx.cache.keys().prefix());
    let keys: Vec<String> = redis.keys(pattern).await.unwrap();
    assert!(keys.is_empty(), "redis still holds {keys:?}");

    // Reads show nothing, and the announcement does not come back.
    assert_eq!(served(&app, user).await, (0, 0));
    assert!(crate::helpers::inbox_ids(&app, user).await.is_empty());
    assert_eq!(rows_of(&app, user).await[0].1, 0);
    // The other user lost nothing; the sends keep their totals.
    assert_eq!(crate::helpers::inbox_ids(&app, other).await.len(), 4);
    assert_eq!(rows_of(&app, other).await[4], ("read_feed".to_owned(), 1));
    assert_eq!(app.get_message(ids[0]).await.progress.unwrap().delivered, 2);

    // The audit record names the user and holds nothing else of theirs.
    let records = AdminServiceClient::new(app.channel())
        .list_audit_records(v1::ListAuditRecordsRequest {
            filter: Some(v1::list_audit_records_request::Filter::UserId(user)),
            page_size: 10,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .records;
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(
        (record.action.as_str(), record.target_kind.as_str(), record.target_id),
        ("user.erase", "user", user)
    );
    assert_eq!(record.detail, "items=4 memberships=1");

    // A second erasure finds nothing.
    let again = erase(&app, user).await;
    assert_eq!((again.items, again.memberships), (0, 0));
    app.cleanup().await;
}

#[tokio::test]
async fn sends_queued_before_an_erasure_skip_the_user_and_later_ones_do_not() {
    let app = spawn_app().await;
    let (user, other) = (7_200_001, 7_200_002);
    // Queued: appended to a draft, started only after the erasure.
    let draft = create_draft(&app, "queued").await;
    let batch = v1::AppendRecipientsRequest {
        message_id: draft,
        batch_number: 1,
        user_ids: vec![user, other],
        ..Default::default()
    };
    app.messages().append_recipients(batch).await.unwrap();
    erase(&app, user).await;
    app.messages().start_message(v1::StartMessageRequest { message_id: draft }).await.unwrap();
    let done = wait_for_status(&app, draft, v1::MessageStatus::Completed).await;
    let progress = done.progress.unwrap();
    assert_eq!((progress.total, progress.delivered, progress.suppressed), (2, 1, 1));
    assert!(crate::helpers::inbox_ids(&app, user).await.is_empty());

    // A send created well after the erasure is a new message to that id.
    tokio::time::sleep(std::time::Duration::from_millis(
        notify_core::erase::ERASURE_MARGIN_MS + 100,
    ))
    .await;
    let later = app.messages().send_message(send_request(vec![user])).await.unwrap().into_inner();
    wait_for_status(&app, later.message_id, v1::MessageStatus::Completed).await;
    assert_eq!(crate::helpers::inbox_ids(&app, user).await, [later.message_id]);
    app.cleanup().await;
}

#[tokio::test]
async fn an_erasure_blanks_the_users_vars_in_a_queued_personalized_send() {
    let app = spawn_app().await;
    let users = [7_250_001u64, 7_250_002, 7_250_003];
    let erased = users[1];
    let mut content = content("Hi {{ name }}");
    let recipient_vars = vec!["name".to_owned()];
    content.template = Some(v1::Template { recipient_vars, ..Default::default() });
    let recipients = users
        .iter()
        .map(|&user_id| v1::RecipientVars {
            user_id,
            vars: [("name".to_owned(), format!("N{user_id}"))].into(),
        })
        .collect();
    let draft = personalized_draft(&app, content, recipients).await;
    let vars_of = |user: u64| format!("{{\"name\":\"N{user}\"}}");
    let queued: BTreeMap<u64, String> = users.iter().map(|&user| (user, vars_of(user))).collect();
    assert_eq!(chunk_vars(&app, draft).await, queued);

    // The erasure blanks the user's vars in the queued chunks, and only
    // theirs; a second one finds nothing more to do.
    for _ in 0..2 {
        erase(&app, erased).await;
        let mut expected = queued.clone();
        expected.insert(erased, "{}".to_owned());
        assert_eq!(chunk_vars(&app, draft).await, expected);
    }

    app.messages().start_message(v1::StartMessageRequest { message_id: draft }).await.unwrap();
    let done = wait_for_status(&app, draft, v1::MessageStatus::Completed).await;
    let progress = done.progress.unwrap();
    assert_eq!((progress.total, progress.delivered, progress.suppressed), (3, 2, 1));
    assert!(crate::helpers::inbox_ids(&app, erased).await.is_empty());
    for user in [users[0], users[2]] {
        let request = v1::ListInboxRequest { user_id: user, page_size: 5, ..Default::default() };
        let page = app.inbox().list_inbox(request).await.unwrap().into_inner();
        assert_eq!(page.items[0].content.as_ref().unwrap().title, format!("Hi N{user}"));
    }
    // Applied, the chunks hold nobody's vars.
    assert_eq!(chunk_vars(&app, draft).await, BTreeMap::new());
    app.cleanup().await;
}

#[tokio::test]
async fn only_admin_may_erase_a_user() {
    let mut settings = test_settings();
    let tokens = with_clients(&mut settings, &[("inbox", &["inbox.read", "inbox.write"])]);
    let app = spawn_app_with(settings, true).await;
    let mut admin = AdminServiceClient::new(authed(app.channel(), &tokens["inbox"]));
    let status = admin.erase_user(v1::EraseUserRequest { user_id: 1 }).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    app.cleanup().await;
}
