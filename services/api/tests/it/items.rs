//! Item states: seen, read, unread, archived, deleted, one by one and in
//! bulk by the list's own filter; both badge counts exact after each change.

use std::collections::{BTreeMap, BTreeSet};

use notify_proto::v1;
use notify_testkit::{TestApp, spawn_app};
use tonic::Code;

use crate::helpers::{content, wait_for_status};

/// An item's states as MySQL holds them (read back independently of the
/// code under test): seen, read, archived, deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub seen: bool,
    pub read: bool,
    pub archived: bool,
    pub deleted: bool,
}

/// Every item of a user, by message id.
pub async fn stored(app: &TestApp, user_id: u64) -> BTreeMap<u64, Stored> {
    let pool = app.ctx.pools.for_user(user_id);
    let rows: Vec<(u64, bool, bool, bool, bool)> = sqlx::query_as(
        "SELECT message_id, is_seen, is_read, is_archived, is_deleted = 1 \
         FROM message_items WHERE user_id = ?",
    )
    .bind(user_id)
    .fetch_all(pool.value())
    .await
    .unwrap();
    rows.into_iter()
        .map(|(id, seen, read, archived, deleted)| (id, Stored { seen, read, archived, deleted }))
        .collect()
}

/// A user's unread and unseen counts from MySQL, by a query of the test's
/// own: unexpired, unrevoked items in the inbox (plus nothing pending).
pub async fn truth(app: &TestApp, user_id: u64) -> (u64, u64) {
    let pool = app.ctx.pools.for_user(user_id);
    let (unread, unseen): (i64, i64) = sqlx::query_as(
        "SELECT CAST(COALESCE(SUM(i.is_read = 0), 0) AS SIGNED), \
         CAST(COALESCE(SUM(i.is_read = 0 AND i.is_seen = 0), 0) AS SIGNED) \
         FROM message_items i JOIN message_contents c ON c.message_id = i.message_id \
         WHERE i.user_id = ? AND i.is_archived = 0 AND i.is_deleted = 0 AND c.revoked = 0 \
         AND (i.expire_at IS NULL OR i.expire_at > UTC_TIMESTAMP(3))",
    )
    .bind(user_id)
    .fetch_one(pool.value())
    .await
    .unwrap();
    (unread as u64, unseen as u64)
}

/// A user's badge as served: (unread, unseen).
pub async fn served(app: &TestApp, user_id: u64) -> (u64, u64) {
    let badge = app
        .inbox()
        .get_unread_count(v1::GetUnreadCountRequest { user_id })
        .await
        .unwrap()
        .into_inner();
    (badge.unread, badge.unseen)
}

/// Every id a list with `filter` shows, paging through.
pub async fn listed(app: &TestApp, user_id: u64, filter: &v1::ItemFilter) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut token = String::new();
    loop {
        let request = v1::ListInboxRequest {
            user_id,
            page_size: 7,
            page_token: token,
            unread_only: filter.unread_only,
            category: filter.category.clone(),
            view: filter.view,
            read_only: filter.read_only,
        };
        let page = app.inbox().list_inbox(request).await.unwrap().into_inner();
        ids.extend(page.items.iter().map(|item| item.message_id));
        if page.next_page_token.is_empty() {
            return ids;
        }
        token = page.next_page_token;
    }
}

/// Sends one message in `category` to `users` and waits for it.
pub async fn deliver(app: &TestApp, users: &[u64], category: &str) -> u64 {
    let mut request = crate::helpers::send_request(users.to_vec());
    request.content = Some(v1::Content { category: category.to_owned(), ..content("item") });
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    wait_for_status(app, id, v1::MessageStatus::Completed).await;
    id
}

/// Runs an update; returns the reply.
pub async fn update(
    app: &TestApp,
    user_id: u64,
    action: v1::ItemAction,
    ids: Vec<u64>,
    all: Option<v1::ItemFilter>,
) -> v1::UpdateItemsResponse {
    let request = v1::UpdateItemsRequest { user_id, action: action as i32, message_ids: ids, all };
    app.inbox().update_items(request).await.unwrap().into_inner()
}

fn inbox_filter() -> v1::ItemFilter {
    v1::ItemFilter { view: v1::InboxView::Inbox as i32, ..Default::default() }
}

#[tokio::test]
async fn each_action_moves_its_state_and_both_counts_exactly() {
    let app = spawn_app().await;
    let user = 5_100_001;
    let a = deliver(&app, &[user], "billing").await;
    let b = deliver(&app, &[user], "promo").await;
    let c = deliver(&app, &[user], "billing").await;
    assert_eq!(served(&app, user).await, (3, 3));

    // Seen: out of unseen, still unread; the list shows it seen.
    let reply = update(&app, user, v1::ItemAction::MarkSeen, vec![a], None).await;
    assert_eq!((reply.changed, reply.unread, reply.unseen), (1, 3, 2));
    let again = update(&app, user, v1::ItemAction::MarkSeen, vec![a], None).await;
    assert_eq!(again.changed, 0, "seen twice changes nothing");
    let page = app
        .inbox()
        .list_inbox(v1::ListInboxRequest { user_id: user, page_size: 10, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let item_a = page.items.iter().find(|item| item.message_id == a).unwrap();
    assert!(item_a.seen && item_a.seen_at.is_some() && !item_a.read);

    // Read implies seen.
    let reply = update(&app, user, v1::ItemAction::MarkRead, vec![b], None).await;
    assert_eq!((reply.changed, reply.unread, reply.unseen), (1, 2, 1));
    assert_eq!(
        stored(&app, user).await[&b],
        Stored { seen: true, read: true, archived: false, deleted: false }
    );

    // Unread again: back in unread, still seen.
    let reply = update(&app, user, v1::ItemAction::MarkUnread, vec![b], None).await;
    assert_eq!((reply.changed, reply.unread, reply.unseen), (1, 3, 1));

    // Archived: in neither count, in the archive view only.
    let reply = update(&app, user, v1::ItemAction::Archive, vec![c], None).await;
    assert_eq!((reply.changed, reply.unread, reply.unseen), (1, 2, 0));
    assert_eq!(listed(&app, user, &inbox_filter()).await, [b, a]);
    let archive = v1::ItemFilter { view: v1::InboxView::Archive as i32, ..Default::default() };
    assert_eq!(listed(&app, user, &archive).await, [c]);
    let both = v1::ItemFilter { view: v1::InboxView::All as i32, ..Default::default() };
    assert_eq!(listed(&app, user, &both).await, [c, b, a]);

    // Unarchived: back, unread and unseen as it was.
    let reply = update(&app, user, v1::ItemAction::Unarchive, vec![c], None).await;
    assert_eq!((reply.changed, reply.unread, reply.unseen), (1, 3, 1));

    // Deleted: gone from every view and count, and an id nobody knows.
    let reply = update(&app, user, v1::ItemAction::Delete, vec![c, 999_999_999], None).await;
    assert_eq!((reply.changed, reply.unread, reply.unseen), (1, 2, 0));
    assert_eq!(reply.unknown_message_ids, [999_999_999]);
    assert_eq!(listed(&app, user, &both).await, [b, a]);
    let on_deleted = update(&app, user, v1::ItemAction::Unarchive, vec![c], None).await;
    assert_eq!((on_deleted.changed, on_deleted.unknown_message_ids), (0, vec![c]));
    assert_eq!(served(&app, user).await, truth(&app, user).await);

    // The send's read count follows read and unread.
    let read_count = async |id: u64| app.get_message(id).await.progress.unwrap().read;
    assert_eq!(read_count(b).await, 0, "read then unread again");
    update(&app, user, v1::ItemAction::MarkRead, vec![a], None).await;
    assert_eq!(read_count(a).await, 1);

    // MarkRead and MarkAllRead agree with UpdateItems.
    let marked = app
        .inbox()
        .mark_all_read(v1::MarkAllReadRequest { user_id: user, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(marked.marked, 1, "b was the only unread item left");
    assert_eq!(served(&app, user).await, (0, 0));
    app.cleanup().await;
}

/// The users of [`bulk_scope_is_the_lists_scope_for_every_filter`], each
/// with the same items in the same states.
const FILTER_USERS: u64 = 36;

#[tokio::test]
async fn bulk_scope_is_the_lists_scope_for_every_filter() {
    let app = spawn_app().await;
    let users: Vec<u64> = (0..FILTER_USERS).map(|i| 5_200_000 + i * 7919).collect();
    let categories = ["billing", "promo", "billing", "", "promo", "billing", "news", "billing"];
    let mut ids = Vec::new();
    for category in categories {
        ids.push(deliver(&app, &users, category).await);
    }
    // The same states for everyone: read, seen, archived (read and not),
    // and one deleted.
    for user in &users {
        update(&app, *user, v1::ItemAction::MarkRead, vec![ids[0], ids[3]], None).await;
        update(&app, *user, v1::ItemAction::MarkSeen, vec![ids[1]], None).await;
        update(&app, *user, v1::ItemAction::Archive, vec![ids[2], ids[3]], None).await;
        update(&app, *user, v1::ItemAction::Delete, vec![ids[4]], None).await;
    }
    let views = [v1::InboxView::Inbox, v1::InboxView::Archive, v1::InboxView::All];
    let actions = [
        v1::ItemAction::MarkSeen,
        v1::ItemAction::MarkRead,
        v1::ItemAction::MarkUnread,
        v1::ItemAction::Archive,
        v1::ItemAction::Unarchive,
        v1::ItemAction::Delete,
    ];
    let mut filters = Vec::new();
    for view in views {
        for category in ["", "billing"] {
            for (unread_only, read_only) in [(false, false), (true, false), (false, true)] {
                for up_to in [0, ids[5]] {
                    filters.push(v1::ItemFilter {
                        view: view as i32,
                        category: category.to_owned(),
                        unread_only,
                        read_only,
                        up_to_message_id: up_to,
                    });
                }
            }
        }
    }
    assert_eq!(filters.len(), users.len());
    for (index, (user, filter)) in users.iter().zip(&filters).enumerate() {
        let action = actions[index % actions.len()];
        // What the list showed, up to the id the client had seen.
        let up_to = filter.up_to_message_id;
        let shown: BTreeSet<u64> = listed(&app, *user, filter)
            .await
            .into_iter()
            .filter(|id| up_to == 0 || *id <= up_to)
            .collect();
        let before = stored(&app, *user).await;
        let reply = update(&app, *user, action, Vec::new(), Some(filter.clone())).await;
        let after = stored(&app, *user).await;
        let changed: BTreeSet<u64> =
            after.iter().filter(|(id, state)| before[*id] != **state).map(|(id, _)| *id).collect();
        assert!(
            changed.is_subset(&shown),
            "{action:?} over {filter:?} changed {changed:?}, the list showed {shown:?}"
        );
        let expected: BTreeSet<u64> = shown
            .iter()
            .copied()
            .filter(|id| {
                let state = before[id];
                match action {
                    v1::ItemAction::MarkSeen => !state.seen,
                    v1::ItemAction::MarkRead => !state.read,
                    v1::ItemAction::MarkUnread => state.read,
                    v1::ItemAction::Archive => !state.archived,
                    v1::ItemAction::Unarchive => state.archived,
                    _ => true,
                }
            })
            .collect();
        assert_eq!(changed, expected, "{action:?} over {filter:?}");
        assert_eq!(reply.changed, expected.len() as u64, "{action:?} over {filter:?}");
        assert_eq!((reply.unread, reply.unseen), truth(&app, *user).await);
        assert_eq!(served(&app, *user).await, truth(&app, *user).await);
    }
    app.cleanup().await;
}

#[tokio::test]
async fn announcements_take_every_state_and_a_deleted_one_never_comes_back() {
    let app = spawn_app().await;
    let user = 5_300_001;
    let request = v1::SendMessageRequest {
        sender: "tests".into(),
        content: Some(content("to everyone")),
        audience: Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {})),
        ..Default::default()
    };
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    // Counted before anything is materialized: unread and unseen.
    assert_eq!(served(&app, user).await, (1, 1));
    // A bulk update covers it as the list would (materialized first).
    let seen = update(&app, user, v1::ItemAction::MarkSeen, Vec::new(), Some(inbox_filter())).await;
    assert_eq!((seen.changed, seen.unread, seen.unseen), (1, 1, 0));
    for (action, expected) in [
        (v1::ItemAction::MarkRead, (0, 0)),
        (v1::ItemAction::MarkUnread, (1, 0)),
        (v1::ItemAction::Archive, (0, 0)),
        (v1::ItemAction::Unarchive, (1, 0)),
    ] {
        let reply = update(&app, user, action, vec![id], None).await;
        assert_eq!((reply.changed, (reply.unread, reply.unseen)), (1, expected), "{action:?}");
    }
    let deleted = update(&app, user, v1::ItemAction::Delete, vec![id], None).await;
    assert_eq!((deleted.changed, deleted.unread, deleted.unseen), (1, 0, 0));
    // Reading the inbox again materializes nothing: the item stays deleted.
    let both = v1::ItemFilter { view: v1::InboxView::All as i32, ..Default::default() };
    assert!(listed(&app, user, &both).await.is_empty());
    app.flush_cache().await;
    assert_eq!(served(&app, user).await, (0, 0), "a rebuilt badge does not count it either");
    assert!(listed(&app, user, &both).await.is_empty());
    assert!(stored(&app, user).await[&id].deleted);
    app.cleanup().await;
}

#[tokio::test]
async fn bad_updates_name_the_field_and_change_nothing() {
    let app = spawn_app().await;
    let user = 5_400_001;
    let id = deliver(&app, &[user], "billing").await;
    let before = stored(&app, user).await;
    let cases = [
        (
            v1::UpdateItemsRequest { user_id: user, action: 0, message_ids: vec![id], all: None },
            "action",
        ),
        (
            v1::UpdateItemsRequest { user_id: user, action: 99, message_ids: vec![id], all: None },
            "action",
        ),
        (
            v1::UpdateItemsRequest { user_id: user, action: 2, message_ids: vec![], all: None },
            "message_ids",
        ),
        (
            v1::UpdateItemsRequest {
                user_id: user,
                action: 2,
                message_ids: vec![id],
                all: Some(inbox_filter()),
            },
            "message_ids",
        ),
        (
            v1::UpdateItemsRequest {
                user_id: user,
                action: 2,
                message_ids: (1..=1001).collect(),
                all: None,
            },
            "message_ids",
        ),
        (
            v1::UpdateItemsRequest {
                user_id: user,
                action: 6,
                message_ids: vec![],
                all: Some(v1::ItemFilter { category: "x".repeat(65), ..Default::default() }),
            },
            "all.category",
        ),
        (
            v1::UpdateItemsRequest {
                user_id: user,
                action: 6,
                message_ids: vec![],
                all: Some(v1::ItemFilter {
                    unread_only: true,
                    read_only: true,
                    ..Default::default()
                }),
            },
            "all.read_only",
        ),
        (
            v1::UpdateItemsRequest {
                user_id: user,
                action: 6,
                message_ids: vec![],
                all: Some(v1::ItemFilter { view: 9, ..Default::default() }),
            },
            "all.view",
        ),
        (
            v1::UpdateItemsRequest { user_id: 0, action: 6, message_ids: vec![id], all: None },
            "user_id",
        ),
    ];
    for (request, field) in cases {
        let status = app.inbox().update_items(request.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{request:?}");
        assert!(
            status.message().starts_with(&format!("{field}: ")),
            "{field}: {}",
            status.message()
        );
    }
    let list = v1::ListInboxRequest {
        user_id: user,
        page_size: 5,
        read_only: true,
        unread_only: true,
        ..Default::default()
    };
    let status = app.inbox().list_inbox(list).await.unwrap_err();
    assert!(status.message().starts_with("read_only: "), "{}", status.message());
    assert_eq!(stored(&app, user).await, before, "nothing was written");
    app.cleanup().await;
}

#[tokio::test]
async fn updates_racing_deliveries_and_a_redis_flush_leave_both_counts_exact() {
    let app = spawn_app().await;
    let users: Vec<u64> = (0..6).map(|i| 5_500_000 + i).collect();
    let mut sends = Vec::new();
    for round in 0..6u64 {
        let category = if round % 2 == 0 { "billing" } else { "promo" };
        let mut request = crate::helpers::send_request(users.clone());
        request.content = Some(v1::Content { category: category.to_owned(), ..content("race") });
        sends.push(app.messages().send_message(request).await.unwrap().into_inner().message_id);
        // While it is delivered: bulk updates over every user, and a flush.
        let mut updates = Vec::new();
        for (index, user) in users.iter().enumerate() {
            let action = [
                v1::ItemAction::MarkSeen,
                v1::ItemAction::MarkRead,
                v1::ItemAction::Archive,
                v1::ItemAction::MarkUnread,
                v1::ItemAction::Unarchive,
                v1::ItemAction::Delete,
            ][(index + round as usize) % 6];
            let filter = v1::ItemFilter {
                category: if index % 2 == 0 { "billing".to_owned() } else { String::new() },
                view: v1::InboxView::All as i32,
                ..Default::default()
            };
            let mut inbox = app.inbox();
            let request = v1::UpdateItemsRequest {
                user_id: *user,
                action: action as i32,
                message_ids: Vec::new(),
                all: Some(filter),
            };
            updates.push(async move { inbox.update_items(request).await.map(|_| ()) });
        }
        for result in futures::future::join_all(updates).await {
            result.unwrap();
        }
        if round == 3 {
            app.flush_cache().await;
        }
    }
    for id in sends {
        wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    }
    // Quiet now: both counts equal MySQL at once, cached or rebuilt.
    for user in &users {
        assert_eq!(served(&app, *user).await, truth(&app, *user).await, "user {user}");
    }
    app.flush_cache().await;
    for user in &users {
        assert_eq!(served(&app, *user).await, truth(&app, *user).await, "user {user} rebuilt");
    }
    app.cleanup().await;
}

/// A badge is the user's items less those of revoked messages (a recall
/// under way hides its items before it deletes them; a cancelled
/// announcement's stay until retention purges them), in every state: both
/// the count a badge read runs and the one in an update's own script agree
/// with the test's join. One user has most items unread, the other most
/// read.
#[tokio::test]
async fn counts_leave_out_revoked_messages_in_every_state() {
    let app = spawn_app().await;
    let (many, few) = (5_700_001, 5_700_002);
    let mut sends = Vec::new();
    for _ in 0..12 {
        sends.push(deliver(&app, &[many, few], "billing").await);
    }
    let set = async |user: u64, ids: &[u64], assignment: &str| {
        let pool = app.ctx.pools.for_user(user);
        let ids = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE message_items SET {assignment} WHERE user_id = {user} AND message_id IN ({ids})"
        )))
        .execute(pool.value())
        .await
        .unwrap();
    };
    // `many`: every state once among the revoked items and among the others,
    // and two plain items.
    set(many, &[sends[1], sends[6]], "is_seen = 1").await;
    set(many, &[sends[2], sends[7]], "is_read = 1, is_seen = 1").await;
    set(many, &[sends[3], sends[8]], "is_archived = 1").await;
    set(many, &[sends[4], sends[9]], "is_deleted = 1").await;
    set(many, &[sends[5]], "expire_at = UTC_TIMESTAMP(3) - INTERVAL 1 HOUR").await;
    // `few`: one plain item unread, and two unread but revoked (one seen).
    set(few, &sends[2..10], "is_read = 1, is_seen = 1").await;
    set(few, &[sends[11]], "is_read = 1, is_seen = 1").await;
    set(few, &[sends[1]], "is_seen = 1").await;
    let revoked = &sends[0..5];
    let list = revoked.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    for (_, pool) in app.ctx.pools.iter() {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE message_contents SET revoked = 1, revoked_at = UTC_TIMESTAMP(3) \
             WHERE message_id IN ({list})"
        )))
        .execute(pool)
        .await
        .unwrap();
    }

    for (user, expected) in [(many, (3, 2)), (few, (1, 1))] {
        assert_eq!(truth(&app, user).await, expected, "the test's own count of user {user}");
        let pool = app.ctx.pools.for_user(user);
        let counted = notify_store::db::items::count_unread(pool.value(), user).await.unwrap();
        assert_eq!((counted.unread, counted.unseen), expected, "a badge read's count of {user}");
        // An update that changes nothing still counts in its script.
        let reply = update(&app, user, v1::ItemAction::MarkSeen, vec![sends[2]], None).await;
        assert_eq!((reply.changed, reply.unread, reply.unseen), (0, expected.0, expected.1));
    }
    app.cleanup().await;
}

/// Marking items changes their rows alone: no index of the items holds a
/// state (an index over `is_read` would move 10,000 entries on a read of
/// 10,000 items, half of the update's time).
#[tokio::test]
async fn no_index_of_the_items_holds_a_state() {
    let app = spawn_app().await;
    let states = [
        "is_seen",
        "seen_time",
        "is_read",
        "read_time",
        "is_archived",
        "archived_time",
        "is_deleted",
    ];
    for (shard, pool) in app.ctx.pools.iter() {
        let indexed: Vec<(String, String)> = sqlx::query_as(
            "SELECT CAST(INDEX_NAME AS CHAR), CAST(COLUMN_NAME AS CHAR) \
             FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'message_items'",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        assert!(
            indexed.iter().any(|(index, _)| index == "PRIMARY"),
            "shard {shard:?}: {indexed:?}"
        );
        let holding: Vec<_> =
            indexed.iter().filter(|(_, column)| states.contains(&column.as_str())).collect();
        assert!(holding.is_empty(), "shard {shard:?}: indexes holding a state: {holding:?}");
    }
    app.cleanup().await;
}

/// The columns of `message_items` an action sets that may hold NULL:
/// setting one from NULL grows the row (InnoDB stores nothing for a NULL)
/// and splits full pages under a bulk update, so there must be none.
async fn nullable_state_columns(app: &TestApp) -> Vec<String> {
    let (_, pool) = app.ctx.pools.iter().next().unwrap();
    sqlx::query_scalar(
        "SELECT CAST(COLUMN_NAME AS CHAR) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'message_items' AND IS_NULLABLE = 'YES' \
         AND COLUMN_NAME IN ('is_seen', 'seen_time', 'is_read', 'read_time', 'is_archived', \
         'archived_time', 'is_deleted')",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// One item as the inbox shows it (every view).
async fn shown(app: &TestApp, user_id: u64, message_id: u64) -> v1::InboxItem {
    let request = v1::ListInboxRequest {
        user_id,
        page_size: 100,
        view: v1::InboxView::All as i32,
        ..Default::default()
    };
    let page = app.inbox().list_inbox(request).await.unwrap().into_inner();
    page.items.into_iter().find(|item| item.message_id == message_id).expect("item listed")
}

/// Every action, by ids and by filter, changes never-NULL columns only, so
/// no row grows; and the times shown follow the states.
#[tokio::test]
async fn actions_change_times_in_place_and_show_them() {
    let app = spawn_app().await;
    let user = 5_100_201;
    let a = deliver(&app, &[user], "billing").await;
    let b = deliver(&app, &[user], "billing").await;
    let all = Some(v1::ItemFilter { view: v1::InboxView::All as i32, ..Default::default() });
    assert_eq!(nullable_state_columns(&app).await, Vec::<String>::new());
    let actions = [
        v1::ItemAction::MarkSeen,
        v1::ItemAction::MarkRead,
        v1::ItemAction::MarkUnread,
        v1::ItemAction::Archive,
        v1::ItemAction::Unarchive,
    ];
    for action in actions {
        let reply = update(&app, user, action, vec![a], None).await;
        assert_eq!(reply.changed, 1, "{action:?} by id");
        let reply = update(&app, user, action, Vec::new(), all.clone()).await;
        assert!(reply.changed >= 1, "{action:?} by filter changed {}", reply.changed);
        for id in [a, b] {
            let item = shown(&app, user, id).await;
            assert_eq!(item.seen_at.is_some(), item.seen, "{action:?}: {item:?}");
            assert_eq!(item.read_at.is_some(), item.read, "{action:?}: {item:?}");
            assert_eq!(item.archived_at.is_some(), item.archived, "{action:?}: {item:?}");
        }
        if action == v1::ItemAction::MarkUnread {
            // Still seen, at the time it was first seen.
            assert!(shown(&app, user, a).await.seen_at.is_some());
        }
    }
    assert_eq!(served(&app, user).await, truth(&app, user).await);
    // A delete too: the item is gone, its row kept as a tombstone.
    let reply = update(&app, user, v1::ItemAction::Delete, vec![a], None).await;
    assert_eq!(reply.changed, 1);
    let reply = update(&app, user, v1::ItemAction::Delete, Vec::new(), all.clone()).await;
    assert_eq!(reply.changed, 1);
    assert_eq!(stored(&app, user).await.values().filter(|item| item.deleted).count(), 2);
    assert_eq!(listed(&app, user, all.as_ref().unwrap()).await, Vec::<u64>::new());
    assert_eq!(served(&app, user).await, (0, 0));
    app.cleanup().await;
}

/// Times follow their states: an unread or unarchive hides the read or
/// archive time and keeps the first seen time; a later read or archive
/// shows its own time.
#[tokio::test]
async fn times_show_while_their_state_holds_and_seen_stays_the_first() {
    let app = spawn_app().await;
    let user = 5_100_202;
    let a = deliver(&app, &[user], "billing").await;
    // Seen, read and archived an hour ago.
    let pool = app.ctx.pools.for_user(user);
    sqlx::query(
        "UPDATE message_items SET is_seen = 1, seen_time = UTC_TIMESTAMP(3) - INTERVAL 1 HOUR, \
         is_read = 1, read_time = UTC_TIMESTAMP(3) - INTERVAL 1 HOUR, \
         is_archived = 1, archived_time = UTC_TIMESTAMP(3) - INTERVAL 1 HOUR \
         WHERE user_id = ? AND message_id = ?",
    )
    .bind(user)
    .bind(a)
    .execute(pool.value())
    .await
    .unwrap();
    let seconds = |t: &prost_types::Timestamp| t.seconds;
    let before = shown(&app, user, a).await;
    let old_read = before.read_at.as_ref().map(seconds).expect("read shown");
    let old_seen = before.seen_at.as_ref().map(seconds).expect("seen shown");
    assert!(before.archived_at.is_some());

    update(&app, user, v1::ItemAction::MarkUnread, vec![a], None).await;
    update(&app, user, v1::ItemAction::Unarchive, vec![a], None).await;
    let unread = shown(&app, user, a).await;
    assert_eq!((unread.read, unread.read_at), (false, None), "{unread:?}");
    assert_eq!((unread.archived, unread.archived_at), (false, None), "{unread:?}");
    assert_eq!(unread.seen_at.as_ref().map(seconds), Some(old_seen), "{unread:?}");

    update(&app, user, v1::ItemAction::MarkRead, vec![a], None).await;
    update(&app, user, v1::ItemAction::Archive, vec![a], None).await;
    let again = shown(&app, user, a).await;
    let new_read = again.read_at.as_ref().map(seconds).expect("read again");
    assert!(new_read > old_read + 3000, "the later read shows: {new_read} vs {old_read}");
    let new_archive = again.archived_at.as_ref().map(seconds).expect("archived again");
    assert!(new_archive > old_read + 3000, "{again:?}");
    assert_eq!(again.seen_at.as_ref().map(seconds), Some(old_seen), "first seen stays");
    assert_eq!(served(&app, user).await, truth(&app, user).await);
    app.cleanup().await;
}

/// Updates go on the shard's direct connections, not sqlx's pool (which
/// pings each connection it gets back): one that ran to its end is given
/// back and taken again by the next update; one the server closed while it
/// sat idle is dropped by the keepalive, so the next write does not fail
/// (the ping before a write past the keepalive's window: `keepalive.rs`);
/// one whose update was cancelled half-way is closed, not lent again with
/// its replies on the wire and its transaction open.
#[tokio::test]
async fn updates_take_a_direct_connection_again_and_close_a_cancelled_ones() {
    use notify_domain::domain::UserId;
    use notify_store::db::item_updates::{Action, Target};
    use std::time::Duration;

    let app = spawn_app().await;
    let user = 5_100_301;
    let first = deliver(&app, &[user], "billing").await;
    let second = deliver(&app, &[user], "billing").await;
    let pool = app.ctx.pools.for_user(user);
    let direct = app.ctx.direct.as_ref().expect("direct connections").get(pool.shard()).unwrap();
    let next_lent = || crate::helpers::next_lent_id(direct);

    assert_eq!(direct.idle_count(), 0, "no call took one yet");
    assert_eq!(update(&app, user, v1::ItemAction::MarkSeen, vec![first], None).await.changed, 1);
    assert_eq!(direct.idle_count(), 1, "the update's connection, given back");
    let used = next_lent().await;
    assert_eq!(update(&app, user, v1::ItemAction::MarkRead, vec![first], None).await.changed, 1);
    assert_eq!((direct.idle_count(), next_lent().await), (1, used), "the same one, again");

    // Killed by the server while idle: the keepalive's ping finds it so.
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL CONNECTION {used}")))
        .execute(pool.value())
        .await
        .unwrap();
    notify_testkit::eventually("the keepalive drops it", Duration::from_secs(10), || async {
        (direct.stats().dropped_by_keepalive == 1).then_some(())
    })
    .await;
    assert_eq!(direct.idle_count(), 0);
    assert_eq!(update(&app, user, v1::ItemAction::MarkUnread, vec![first], None).await.changed, 1);
    let replaced = next_lent().await;
    assert_ne!(replaced, used, "a new connection in the killed one's place");
    assert_eq!(direct.idle_count(), 1);
    assert_eq!(direct.stats().pinged_before_write, 0, "a new one is not pinged");

    // An update waiting for the user's items, locked by another
    // transaction, cancelled once the server runs it.
    let mut locker = pool.value().begin().await.unwrap();
    sqlx::query("SELECT message_id FROM message_items WHERE user_id = ? FOR UPDATE")
        .bind(user)
        .fetch_all(&mut *locker)
        .await
        .unwrap();
    let ids = [second];
    let user_id = UserId::parse(user, "user_id").unwrap();
    {
        let mut waiting = std::pin::pin!(notify_core::inbox::update_items(
            &app.ctx,
            user_id,
            Action::MarkRead,
            Target::Ids(&ids)
        ));
        let running = async {
            notify_testkit::eventually(
                "the update waits for the lock",
                Duration::from_secs(10),
                || {
                    let pool = pool.value();
                    async move {
                        let busy: i64 = sqlx::query_scalar(
                            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                             WHERE ID = ? AND INFO IS NOT NULL",
                        )
                        .bind(replaced)
                        .fetch_one(pool)
                        .await
                        .unwrap();
                        (busy == 1).then_some(())
                    }
                },
            )
            .await
        };
        tokio::select! {
            done = &mut waiting => panic!("the update did not wait for the lock: {done:?}"),
            () = running => {}
        }
    } // the update's future, dropped: the call is cancelled
    assert_eq!(direct.idle_count(), 0, "the cancelled update's connection was given back");
    assert_ne!(next_lent().await, replaced, "the cancelled update's connection was lent");
    locker.rollback().await.unwrap();
    app.cleanup().await;
}
