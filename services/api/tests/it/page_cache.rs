//! The inbox page cache: its store rule against the real Redis (a single
//! node, or the cluster of the suite's cluster pass), and through the api,
//! that a cached page is what ListInbox serves until a write to the user's
//! items (a delivery, a mark-read, an announcement) retires it.

use notify_cache::{Cache, PageToStore};
use notify_proto::v1;
use notify_store::db::items::InboxQuery;
use notify_testkit::{TestApp, spawn_app, test_settings};
use prost::Message as _;
use redis::AsyncCommands;

use crate::helpers::{send, send_request, wait_for_status};

const NOW_MS: i64 = 1_900_000_000_000;

fn page<'a>(user_id: u64, token: u64, payload: &'a [u8]) -> PageToStore<'a> {
    PageToStore {
        user_id,
        query: "q",
        token,
        epoch: 3,
        deadline_ms: NOW_MS + 1_000,
        payload,
        ttl_ms: 60_000,
        max_fields: 32,
    }
}

/// The payload cached for query "q" under epoch 3, if any.
async fn cached(cache: &Cache, user_id: u64) -> Option<Vec<u8>> {
    let page = cache.cached_page(user_id, "q", 3, NOW_MS).await.unwrap();
    page.map(|page| page.payload().to_vec())
}

/// Takes the lease of query "q" after finding it not cached.
async fn lease(cache: &Cache, user_id: u64) -> u64 {
    assert_eq!(cached(cache, user_id).await, None, "expected a miss");
    cache.lease_page(user_id, "q").await.unwrap()
}

#[tokio::test]
async fn a_stored_page_is_served_only_for_its_query_epoch_and_until_its_deadline() {
    let cache = Cache::connect(&test_settings().redis).await.unwrap();
    let user = 4_100_001;
    let token = lease(&cache, user).await;
    assert!(cache.store_page(&page(user, token, b"page one")).await.unwrap());

    assert_eq!(cached(&cache, user).await.as_deref(), Some(&b"page one"[..]));
    for (query, epoch, now, why) in [
        ("q2", 3, NOW_MS, "another query"),
        ("q", 4, NOW_MS, "another epoch"),
        ("q", 3, NOW_MS + 1_000, "its deadline"),
    ] {
        let looked = cache.cached_page(user, query, epoch, now).await.unwrap();
        assert!(looked.is_none(), "{why}: {looked:?}");
    }
    // The user's hash lives the ttl of its last store.
    let mut conn = cache.connection();
    let pttl: i64 = conn.pttl(cache.keys().inbox_pages(user)).await.unwrap();
    assert!((1..=60_000).contains(&pttl), "pttl {pttl}");
}

#[tokio::test]
async fn a_page_read_across_an_invalidation_or_a_writer_is_not_stored() {
    let cache = Cache::connect(&test_settings().redis).await.unwrap();
    let user = 4_100_002;

    // A delivery's invalidation between the lease and the store.
    let token = lease(&cache, user).await;
    cache.invalidate_counts(&[user]).await.unwrap();
    assert!(!cache.store_page(&page(user, token, b"read before a delivery")).await.unwrap());

    // A writer that began before the lease and has not finished.
    cache.begin_count_change(user).await.unwrap();
    let token = lease(&cache, user).await;
    assert!(!cache.store_page(&page(user, token, b"read during a write")).await.unwrap());

    // A writer that began after the lease.
    let token = lease(&cache, user).await;
    cache.begin_count_change(user).await.unwrap();
    cache.end_count_change(user).await.unwrap();
    assert!(!cache.store_page(&page(user, token, b"read across a write")).await.unwrap());
    cache.end_count_change(user).await.unwrap();

    // Two readers of the same page: the lease is the last one's.
    let (first, second) = (lease(&cache, user).await, lease(&cache, user).await);
    assert!(!cache.store_page(&page(user, first, b"the first reader's")).await.unwrap());
    assert!(cache.store_page(&page(user, second, b"the second reader's")).await.unwrap());
    assert_eq!(cached(&cache, user).await.as_deref(), Some(&b"the second reader's"[..]));

    // Every writer's invalidation retires the stored page.
    cache.begin_count_change(user).await.unwrap();
    assert_eq!(cached(&cache, user).await, None);
    cache.end_count_change(user).await.unwrap();
}

#[tokio::test]
async fn a_store_into_a_full_hash_starts_it_over() {
    let cache = Cache::connect(&test_settings().redis).await.unwrap();
    let user = 4_100_003;
    let store = async |query: &str, payload: &[u8]| {
        let looked = cache.cached_page(user, query, 3, NOW_MS).await.unwrap();
        assert!(looked.is_none(), "{query} was cached already");
        let token = cache.lease_page(user, query).await.unwrap();
        let entry = PageToStore { query, max_fields: 2, ..page(user, token, payload) };
        assert!(cache.store_page(&entry).await.unwrap(), "{query} not stored");
    };
    store("a", b"page a").await;
    store("b", b"page b").await;
    store("c", b"page c").await;
    let mut conn = cache.connection();
    let fields: Vec<String> = conn.hkeys(cache.keys().inbox_pages(user)).await.unwrap();
    assert_eq!(fields, ["p:c"], "a full hash was not started over");
    let gone = cache.cached_page(user, "b", 3, NOW_MS).await.unwrap();
    assert!(gone.is_none(), "{gone:?}");
}

async fn first_page(app: &TestApp, user_id: u64) -> Vec<v1::InboxItem> {
    app.inbox()
        .list_inbox(v1::ListInboxRequest { user_id, page_size: 10, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .items
}

/// Rewrites every page cached for `user_id` so that its titles read
/// "cached": a ListInbox that shows one served the cached page.
async fn mark_cached_pages(app: &TestApp, user_id: u64) -> usize {
    let mut conn = app.ctx.cache.connection();
    let key = app.ctx.cache.keys().inbox_pages(user_id);
    let fields: Vec<(String, Vec<u8>)> = conn.hgetall(&key).await.unwrap();
    let mut pages = 0;
    for (field, value) in fields.into_iter().filter(|(field, _)| field.starts_with("p:")) {
        let header = value.iter().enumerate().filter(|(_, b)| **b == b':').nth(1).unwrap().0 + 1;
        let mut page = v1::ListInboxResponse::decode(&value[header..]).unwrap();
        for item in &mut page.items {
            item.content.as_mut().unwrap().title = "cached".into();
        }
        let mut rewritten = value[..header].to_vec();
        rewritten.extend(page.encode_to_vec());
        let _: () = conn.hset(&key, field, rewritten).await.unwrap();
        pages += 1;
    }
    pages
}

fn titles(items: &[v1::InboxItem]) -> Vec<String> {
    items.iter().map(|item| item.content.as_ref().unwrap().title.clone()).collect()
}

#[tokio::test]
async fn listinbox_serves_the_cached_page_until_a_delivery_or_mark_read_retires_it() {
    let app = spawn_app().await;
    let user = 4_200_001;
    for _ in 0..3 {
        let id = send(&app, vec![user]).await;
        wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    }
    let items = first_page(&app, user).await;
    assert_eq!(titles(&items), ["hello"; 3]);
    assert_eq!(mark_cached_pages(&app, user).await, 1, "the first page was not cached");
    assert_eq!(titles(&first_page(&app, user).await), ["cached"; 3], "not served from the cache");

    // A delivery retires it.
    let id = send(&app, vec![user]).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let items = first_page(&app, user).await;
    assert_eq!(titles(&items), ["hello"; 4], "a delivered message was hidden by a cached page");
    assert_eq!(items[0].message_id, id);

    // So does a mark-read.
    assert_eq!(mark_cached_pages(&app, user).await, 1);
    let request = v1::MarkReadRequest { user_id: user, message_ids: vec![id] };
    app.inbox().mark_read(request).await.unwrap();
    let items = first_page(&app, user).await;
    assert_eq!(titles(&items), ["hello"; 4]);
    assert!(items[0].read && items[0].read_at.is_some(), "a mark-read was hidden by a cached page");
    assert!(items[1..].iter().all(|item| !item.read));

    // And a mark-all-read.
    assert_eq!(mark_cached_pages(&app, user).await, 1);
    let request = v1::MarkAllReadRequest { user_id: user, ..Default::default() };
    assert_eq!(app.inbox().mark_all_read(request).await.unwrap().into_inner().marked, 3);
    let items = first_page(&app, user).await;
    assert_eq!(titles(&items), ["hello"; 4]);
    assert!(items.iter().all(|item| item.read), "a mark-all-read was hidden by a cached page");
    app.cleanup().await;
}

#[tokio::test]
async fn an_announcement_retires_cached_pages_and_shows_at_once() {
    let app = spawn_app().await;
    let user = 4_200_002;
    let id = send(&app, vec![user]).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    first_page(&app, user).await;
    assert_eq!(mark_cached_pages(&app, user).await, 1);

    let mut request = send_request(Vec::new());
    request.audience = Some(v1::send_message_request::Audience::AllUsers(v1::AllUsersAudience {}));
    let announced = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    let items = first_page(&app, user).await;
    let ids: Vec<u64> = items.iter().map(|item| item.message_id).collect();
    assert_eq!(ids, [announced, id]);
    assert_eq!(titles(&items), ["hello"; 2], "served a page cached before the announcement");

    // Its cancellation retires the pages that show it.
    assert_eq!(mark_cached_pages(&app, user).await, 1);
    let cancel = v1::CancelMessageRequest { message_id: announced };
    app.messages().cancel_message(cancel).await.unwrap();
    let items = first_page(&app, user).await;
    assert_eq!(items.iter().map(|item| item.message_id).collect::<Vec<_>>(), [id]);
    assert_eq!(titles(&items), ["hello"]);
    app.cleanup().await;
}

/// The deadline of each page cached for `user_id`, by page query.
async fn cached_deadlines(app: &TestApp, user_id: u64) -> Vec<(String, i64)> {
    let mut conn = app.ctx.cache.connection();
    let key = app.ctx.cache.keys().inbox_pages(user_id);
    let fields: Vec<(String, Vec<u8>)> = conn.hgetall(&key).await.unwrap();
    let deadline = |value: &[u8]| {
        let header = String::from_utf8_lossy(&value[..value.len().min(40)]).into_owned();
        header.split(':').nth(1).unwrap().parse::<i64>().unwrap()
    };
    let mut pages: Vec<(String, i64)> = fields
        .into_iter()
        .filter_map(|(field, value)| Some((field.strip_prefix("p:")?.to_owned(), deadline(&value))))
        .collect();
    pages.sort();
    pages
}

#[tokio::test]
async fn a_cached_page_is_served_no_later_than_the_first_expiry_that_changes_it() {
    let app = spawn_app().await;
    let user = 4_200_003;
    let ttl_ms = app.settings.inbox.page_cache_ttl_secs as i64 * 1000;
    // Sooner than the ttl (the test reads long before it).
    let expire_at = chrono::Utc::now() + chrono::Duration::milliseconds(ttl_ms / 2);
    let expire_at_ms = expire_at.timestamp_millis();
    let older = send(&app, vec![user]).await;
    wait_for_status(&app, older, v1::MessageStatus::Completed).await;
    let mut request = send_request(vec![user]);
    request.expire_at = Some(prost_types::Timestamp {
        seconds: expire_at.timestamp(),
        nanos: expire_at.timestamp_subsec_millis() as i32 * 1_000_000,
    });
    let expiring = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    wait_for_status(&app, expiring, v1::MessageStatus::Completed).await;
    let newer = send(&app, vec![user]).await;
    wait_for_status(&app, newer, v1::MessageStatus::Completed).await;

    // Pages of one: [newer] (the expiring one decides its next token),
    // [expiring], and [older] with nothing after it.
    let started_ms = chrono::Utc::now().timestamp_millis();
    let mut token = String::new();
    let mut pages = Vec::new();
    for _ in 0..3 {
        let request = v1::ListInboxRequest {
            user_id: user,
            page_size: 1,
            page_token: token,
            ..Default::default()
        };
        let reply = app.inbox().list_inbox(request).await.unwrap().into_inner();
        pages.push(reply.items[0].message_id);
        token = reply.next_page_token;
    }
    let ended_ms = chrono::Utc::now().timestamp_millis();
    assert_eq!(pages, [newer, expiring, older]);
    assert!(token.is_empty());

    let deadlines = cached_deadlines(&app, user).await;
    let field = |before: u64| {
        notify_core::inbox::page_field(&InboxQuery { before, limit: 1, filter: Default::default() })
    };
    let of = |query: &str| deadlines.iter().find(|(q, _)| q == query).map(|(_, at)| *at);
    assert_eq!(
        of(&field(u64::MAX)),
        Some(expire_at_ms),
        "a page outlives the expiry of its next row"
    );
    assert_eq!(of(&field(newer)), Some(expire_at_ms), "a page outlives its row");
    let last = of(&field(expiring)).expect("the last page was cached");
    assert!(
        (started_ms + ttl_ms..=ended_ms + ttl_ms).contains(&last),
        "a page without expiries lasts the ttl: deadline {last}, read in {started_ms}..{ended_ms}"
    );
    app.cleanup().await;
}
