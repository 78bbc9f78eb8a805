//! Who got a send and who read it: recipients listed in user order across
//! shards with no gap or repeat across pages for every filter, read and
//! unread following every path that marks items, every other state, the
//! users an announcement materialized for, GetRecipientStatus, bad input,
//! scopes, and erasure taking the user's records with it.

use std::collections::{BTreeMap, BTreeSet};

use notify_proto::v1;
use notify_proto::v1::admin_service_client::AdminServiceClient;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_proto::v1::{RecipientFilter as F, RecipientState as S};
use std::time::Duration;

use notify_store::db::chunks;
use notify_store::shard_map;
use notify_testkit::{
    TestApp, authed, eventually, spawn_app, spawn_app_with, test_settings, with_clients,
};
use shard_router::{BucketSet, ShardId, bucket_of};
use tonic::Code;

use crate::helpers::{announce, idle_ids, inbox_ids, wait_for_status};

/// Every page of a filter, checking order and that each page moves on.
async fn list_all(app: &TestApp, message_id: u64, state: F, page_size: u32) -> Vec<v1::Recipient> {
    let mut listed: Vec<v1::Recipient> = Vec::new();
    let mut page_token = String::new();
    for _ in 0..10_000 {
        let page = app
            .messages()
            .list_recipients(v1::ListRecipientsRequest {
                message_id,
                state: state as i32,
                page_size,
                page_token: page_token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let most = if page_size == 0 { 100 } else { page_size as usize };
        assert!(page.recipients.len() <= most, "a page holds page_size (default 100) at most");
        for recipient in page.recipients {
            if let Some(last) = listed.last() {
                assert!(
                    recipient.user_id > last.user_id,
                    "{state:?}: user {} after {} (out of order or repeated)",
                    recipient.user_id,
                    last.user_id
                );
            }
            listed.push(recipient);
        }
        if page.next_page_token.is_empty() {
            return listed;
        }
        page_token = page.next_page_token;
    }
    panic!("{state:?}: the pages never ended");
}

fn users_of(recipients: &[v1::Recipient]) -> Vec<u64> {
    recipients.iter().map(|r| r.user_id).collect()
}

async fn status(app: &TestApp, message_id: u64, user_ids: Vec<u64>) -> Vec<v1::Recipient> {
    app.messages()
        .get_recipient_status(v1::GetRecipientStatusRequest { message_id, user_ids })
        .await
        .unwrap()
        .into_inner()
        .recipients
}

fn states(recipients: &[v1::Recipient]) -> Vec<(u64, i32)> {
    recipients.iter().map(|r| (r.user_id, r.state)).collect()
}

async fn mark_read(app: &TestApp, user_id: u64, message_id: u64) {
    app.inbox()
        .mark_read(v1::MarkReadRequest { user_id, message_ids: vec![message_id] })
        .await
        .unwrap();
}

#[tokio::test]
async fn every_filter_pages_across_shards_in_user_order_without_gaps_or_repeats() {
    let app = spawn_app().await;
    // Two batches whose user ranges interleave, so each shard holds two runs
    // of chunks to merge, and a user in both (listed once).
    let (id, everyone) = interleaved_send(&app, 8_000_000, 700).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let shards: BTreeSet<_> = everyone.iter().map(|u| app.ctx.pools.for_user(*u).shard()).collect();
    assert!(shards.len() >= 2, "the recipients live on {} shards", shards.len());

    // Reads by every path: MarkRead, MarkAllRead, UpdateItems (ids and a
    // filter); then some marked unread again (ids and a filter).
    let readers: Vec<u64> = everyone.iter().copied().step_by(13).collect();
    for user in &readers[..40] {
        mark_read(&app, *user, id).await;
    }
    for user in &readers[40..60] {
        app.inbox()
            .mark_all_read(v1::MarkAllReadRequest { user_id: *user, ..Default::default() })
            .await
            .unwrap();
    }
    for user in &readers[60..] {
        let all = v1::ItemFilter { view: v1::InboxView::Inbox as i32, ..Default::default() };
        let request = v1::UpdateItemsRequest {
            user_id: *user,
            action: v1::ItemAction::MarkRead as i32,
            message_ids: vec![],
            all: Some(all),
        };
        app.inbox().update_items(request).await.unwrap();
    }
    let unmarked = [readers[0], readers[45], readers[70]];
    for (index, user) in unmarked.iter().enumerate() {
        let (message_ids, all) = if index == 2 {
            (
                vec![],
                Some(v1::ItemFilter { view: v1::InboxView::Inbox as i32, ..Default::default() }),
            )
        } else {
            (vec![id], None)
        };
        let request = v1::UpdateItemsRequest {
            user_id: *user,
            action: v1::ItemAction::MarkUnread as i32,
            message_ids,
            all,
        };
        app.inbox().update_items(request).await.unwrap();
    }
    // A filter's reads are counted for the send a moment after the call.
    app.reads_counted().await;
    let read: BTreeSet<u64> = readers.iter().copied().filter(|u| !unmarked.contains(u)).collect();
    let unread: BTreeSet<u64> = everyone.difference(&read).copied().collect();

    for page_size in [7, 100, 1000] {
        let all = list_all(&app, id, F::Unspecified, page_size).await;
        assert_eq!(
            users_of(&all),
            everyone.iter().copied().collect::<Vec<_>>(),
            "all by {page_size}"
        );
        let listed_read = list_all(&app, id, F::Read, page_size).await;
        assert_eq!(users_of(&listed_read), read.iter().copied().collect::<Vec<_>>());
        let listed_unread = list_all(&app, id, F::Unread, page_size).await;
        assert_eq!(users_of(&listed_unread), unread.iter().copied().collect::<Vec<_>>());
        let delivered = list_all(&app, id, F::Delivered, page_size).await;
        assert_eq!(users_of(&delivered), users_of(&all));
        for filter in [F::Pending, F::Failed, F::Suppressed, F::Recalled, F::Cancelled] {
            assert!(list_all(&app, id, filter, page_size).await.is_empty(), "{filter:?}");
        }
    }
    let all = list_all(&app, id, F::Unspecified, 0).await;
    for recipient in &all {
        assert!(recipient.delivered_at.is_some(), "user {} has a delivery time", recipient.user_id);
        let expected = if read.contains(&recipient.user_id) { S::Read } else { S::Unread };
        assert_eq!(recipient.state, expected as i32, "user {}", recipient.user_id);
        assert_eq!(recipient.read_at.is_some(), expected == S::Read, "user {}", recipient.user_id);
    }
    // One delivery and one read time per user in every view: a page reads
    // them from the chunk's apply and the recorded read, GetRecipientStatus
    // from the item (which the apply wrote with its chunk's time), and the
    // read filter from the recorded reads alone (each holds its item's
    // delivery and read time, whichever path read it).
    let mut shown: BTreeMap<u64, v1::Recipient> = BTreeMap::new();
    let users: Vec<u64> = everyone.iter().copied().collect();
    for part in users.chunks(1000) {
        shown.extend(status(&app, id, part.to_vec()).await.into_iter().map(|r| (r.user_id, r)));
    }
    // The user in both batches (`interleaved_send`'s odd[10]) too: they got
    // one item, from whichever apply inserted it first, and a page shows
    // that item's time, not the time of the chunk it lists them from.
    for recipient in &all {
        assert_eq!(Some(recipient), shown.get(&recipient.user_id), "user {}", recipient.user_id);
    }
    let as_shown = |listed: &[v1::Recipient]| {
        for reader in listed {
            assert!(reader.delivered_at.is_some(), "user {}", reader.user_id);
            assert_eq!(Some(reader), shown.get(&reader.user_id), "user {}", reader.user_id);
        }
    };
    let listed_read = list_all(&app, id, F::Read, 0).await;
    assert_eq!(users_of(&listed_read), read.iter().copied().collect::<Vec<_>>());
    as_shown(&listed_read);
    app.cleanup().await;
}

/// A send of two batches whose user ranges interleave, and a user in both,
/// started; returns it and every recipient.
async fn interleaved_send(app: &TestApp, first: u64, per_batch: u64) -> (u64, BTreeSet<u64>) {
    let odd: Vec<u64> = (0..per_batch).map(|i| first + 1 + 2 * i).collect();
    let mut even: Vec<u64> = (0..per_batch).map(|i| first + 2 + 2 * i).collect();
    even.push(odd[10]);
    let id = crate::helpers::create_draft(app, "recipients").await;
    for (batch_number, user_ids) in [(1u64, odd.clone()), (2, even.clone())] {
        let request = v1::AppendRecipientsRequest {
            message_id: id,
            batch_number,
            user_ids,
            ..Default::default()
        };
        app.messages().append_recipients(request).await.unwrap();
    }
    app.messages().start_message(v1::StartMessageRequest { message_id: id }).await.unwrap();
    (id, odd.iter().chain(&even).copied().collect())
}

#[tokio::test]
async fn a_user_two_chunks_delivered_to_shows_their_items_time_in_every_view() {
    let app = spawn_app().await;
    let (id, _) = interleaved_send(&app, 8_050_000, 40).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    // `interleaved_send`'s odd[10], in both batches: one item, written by
    // whichever apply inserted it first. Moving every chunk's apply time
    // off its items' (as the apply that lost the race to insert records a
    // time its item does not have) leaves the item the one place that says
    // when.
    let twice = 8_050_000 + 1 + 2 * 10;
    for (_, pool) in app.ctx.pools.iter() {
        sqlx::query(
            "UPDATE message_chunks SET applied_at = applied_at + INTERVAL 1 SECOND \
             WHERE message_id = ?",
        )
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    }
    let item = status(&app, id, vec![twice]).await.remove(0);
    assert_eq!(item.state, S::Unread as i32);
    assert!(item.delivered_at.is_some());
    for filter in [F::Unspecified, F::Delivered, F::Unread] {
        for page_size in [7, 1000] {
            let listed = list_all(&app, id, filter, page_size).await;
            let entry = listed.iter().find(|r| r.user_id == twice);
            assert_eq!(entry, Some(&item), "{filter:?} by {page_size}");
        }
    }
    mark_read(&app, twice, id).await;
    let item = status(&app, id, vec![twice]).await.remove(0);
    assert_eq!(item.state, S::Read as i32);
    for filter in [F::Unspecified, F::Read] {
        let listed = list_all(&app, id, filter, 1000).await;
        assert_eq!(listed.iter().find(|r| r.user_id == twice), Some(&item), "{filter:?}");
    }
    app.cleanup().await;
}

#[tokio::test]
async fn pages_from_a_kept_chunk_index_list_what_reading_the_index_lists() {
    // Chunks of 100: each batch has several on every shard, more than a
    // page reads ahead, and a page of 1,000 needs more than the chunks a
    // kept index picks hold (the part then reads the index after all).
    let mut settings = test_settings();
    settings.send.chunk_size = 100;
    let app = spawn_app_with(settings, true).await;
    let (id, everyone) = interleaved_send(&app, 8_060_000, 2_000).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let everyone: Vec<u64> = everyone.into_iter().collect();
    assert!(app.ctx.chunk_indexes.get(id, 1).is_none());
    // The first page of a started send keeps its index for the next.
    assert_eq!(users_of(&list_all(&app, id, F::Delivered, 100).await), everyone);
    eventually("the chunk index kept", Duration::from_secs(10), || async {
        app.ctx.chunk_indexes.get(id, 1).map(|_| ())
    })
    .await;
    for page_size in [7, 100, 1000] {
        for filter in [F::Unspecified, F::Delivered, F::Unread] {
            let listed = list_all(&app, id, filter, page_size).await;
            assert_eq!(users_of(&listed), everyone, "{filter:?} by {page_size}");
        }
        assert!(list_all(&app, id, F::Read, page_size).await.is_empty());
    }

    // Every other chunk of one shard dead-lettered, its items gone (as a
    // worker that never applied them leaves them): delivered pages skip
    // them between the chunks the kept index picks (a part short of its
    // share reads the index), and their states are read anew.
    let (_, pool) = app.ctx.pools.iter().next().unwrap();
    let rows: Vec<(u64, Vec<u8>)> = sqlx::query_as(
        "SELECT chunk_id, user_ids FROM message_chunks WHERE message_id = ? ORDER BY chunk_id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(rows.len() >= 8, "{} chunks on the shard", rows.len());
    let (mut failed, mut kept) = (BTreeSet::new(), BTreeSet::new());
    for (nth, (chunk_id, packed)) in rows.iter().enumerate() {
        let users = chunks::decode_user_ids(packed).unwrap();
        if nth % 2 == 1 {
            kept.extend(users);
            continue;
        }
        sqlx::query("UPDATE message_chunks SET state = 2 WHERE message_id = ? AND chunk_id = ?")
            .bind(id)
            .bind(chunk_id)
            .execute(pool)
            .await
            .unwrap();
        failed.extend(users);
    }
    // The user in both batches, if in a dead-lettered chunk of one and a
    // delivered chunk of the other, is delivered and keeps the item.
    let failed: Vec<u64> = failed.difference(&kept).copied().collect();
    for user in &failed {
        sqlx::query("DELETE FROM message_items WHERE user_id = ? AND message_id = ?")
            .bind(user)
            .bind(id)
            .execute(pool)
            .await
            .unwrap();
    }
    let delivered: Vec<u64> = everyone.iter().copied().filter(|u| !failed.contains(u)).collect();
    for page_size in [7, 100, 1000] {
        assert_eq!(users_of(&list_all(&app, id, F::Failed, page_size).await), failed);
        for filter in [F::Delivered, F::Unread] {
            let listed = list_all(&app, id, filter, page_size).await;
            assert_eq!(users_of(&listed), delivered, "{filter:?} by {page_size}");
        }
        let all = list_all(&app, id, F::Unspecified, page_size).await;
        assert_eq!(users_of(&all), everyone, "all by {page_size}");
        for recipient in &all {
            let expected = if failed.contains(&recipient.user_id) { S::Failed } else { S::Unread };
            assert_eq!(recipient.state, expected as i32, "user {}", recipient.user_id);
        }
    }
    app.cleanup().await;
}

#[tokio::test]
async fn pending_failed_and_cancelled_recipients_are_listed_by_their_chunks() {
    let app = spawn_app_with(test_settings(), false).await;
    let users: Vec<u64> = (8_100_001..8_100_401).collect();
    let id = app.send(users.clone()).await;
    let pending = list_all(&app, id, F::Pending, 1000).await;
    assert_eq!(users_of(&pending), users);
    assert!(pending.iter().all(|r| r.state == S::Pending as i32 && r.delivered_at.is_none()));
    assert!(list_all(&app, id, F::Delivered, 1000).await.is_empty());
    // A started send's chunk index is final: the first status call keeps
    // it, and the later ones below read the chunks' states anew.
    assert_eq!(
        states(&status(&app, id, vec![users[0], 42]).await),
        [(users[0], S::Pending as i32), (42, S::NotARecipient as i32)]
    );
    assert!(app.ctx.chunk_indexes.get(id, 42).is_some());

    // One shard's chunk dead-lettered (as the worker stores it).
    let (shard, pool) = app.ctx.pools.iter().next().unwrap();
    sqlx::query("UPDATE message_chunks SET state = 2 WHERE message_id = ?")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    let failed: Vec<u64> =
        users.iter().copied().filter(|u| app.ctx.pools.for_user(*u).shard() == shard).collect();
    assert!(!failed.is_empty());
    assert_eq!(users_of(&list_all(&app, id, F::Failed, 50).await), failed);
    let still: Vec<u64> = users.iter().copied().filter(|u| !failed.contains(u)).collect();
    assert_eq!(users_of(&list_all(&app, id, F::Pending, 50).await), still);

    app.messages().cancel_message(v1::CancelMessageRequest { message_id: id }).await.unwrap();
    app.wait_for_operations(id).await;
    assert_eq!(users_of(&list_all(&app, id, F::Cancelled, 1000).await), still);
    assert!(list_all(&app, id, F::Pending, 1000).await.is_empty());
    let some = vec![failed[0], still[0], 42];
    assert_eq!(
        states(&status(&app, id, some).await),
        [
            (failed[0], S::Failed as i32),
            (still[0], S::Cancelled as i32),
            (42, S::NotARecipient as i32)
        ]
    );
    app.cleanup().await;
}

#[tokio::test]
async fn a_recalled_send_lists_its_recipients_as_recalled_and_no_reader() {
    let app = spawn_app().await;
    let users: Vec<u64> = (8_200_001..8_200_301).collect();
    let id = app.send(users.clone()).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    mark_read(&app, users[3], id).await;
    assert_eq!(users_of(&list_all(&app, id, F::Read, 100).await), [users[3]]);
    app.messages().recall_message(v1::RecallMessageRequest { message_id: id }).await.unwrap();
    // At once (items about to be taken back) and after the workers did.
    assert_eq!(users_of(&list_all(&app, id, F::Recalled, 100).await), users);
    let mut stream = app
        .messages()
        .watch_message(v1::WatchMessageRequest { message_id: id, interval_ms: 100 })
        .await
        .unwrap()
        .into_inner();
    while let Some(message) = stream.message().await.unwrap() {
        if message.finished_at.is_some() && message.status == v1::MessageStatus::Recalled as i32 {
            break;
        }
    }
    assert_eq!(users_of(&list_all(&app, id, F::Recalled, 1000).await), users);
    let all = list_all(&app, id, F::Unspecified, 1000).await;
    assert!(all.iter().all(|r| r.state == S::Recalled as i32));
    for filter in [F::Read, F::Unread, F::Delivered, F::Pending] {
        assert!(list_all(&app, id, filter, 100).await.is_empty(), "{filter:?}");
    }
    assert_eq!(states(&status(&app, id, vec![users[3]]).await), [(users[3], S::Recalled as i32)]);
    app.cleanup().await;
}

#[tokio::test]
async fn an_announcement_lists_the_users_who_have_it_materialized() {
    let app = spawn_app().await;
    let id = announce(&app, "for all").await;
    wait_for_status(&app, id, v1::MessageStatus::Sending).await;
    assert!(list_all(&app, id, F::Unspecified, 10).await.is_empty(), "nobody looked yet");
    let readers: Vec<u64> = (8_300_001..8_300_041).collect();
    for user in &readers {
        assert!(inbox_ids(&app, *user).await.contains(&id), "user {user} sees it");
    }
    mark_read(&app, readers[5], id).await;
    let all = list_all(&app, id, F::Unspecified, 7).await;
    assert_eq!(users_of(&all), readers);
    assert!(all.iter().all(|r| r.delivered_at.is_some()));
    assert_eq!(users_of(&list_all(&app, id, F::Read, 7).await), [readers[5]]);
    let unread = list_all(&app, id, F::Unread, 7).await;
    assert_eq!(unread.len(), readers.len() - 1);
    assert!(list_all(&app, id, F::Pending, 7).await.is_empty());
    assert_eq!(
        states(&status(&app, id, vec![readers[5], readers[0], 8_399_999]).await),
        [
            (readers[5], S::Read as i32),
            (readers[0], S::Unread as i32),
            (8_399_999, S::NotARecipient as i32)
        ]
    );
    app.cleanup().await;
}

#[tokio::test]
async fn recipient_status_answers_each_distinct_user_in_request_order() {
    let app = spawn_app().await;
    let users: Vec<u64> = (8_400_001..8_400_101).collect();
    let id = app.send(users.clone()).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    mark_read(&app, users[7], id).await;
    let asked = vec![users[9], 77, users[7], users[9], users[0]];
    let answered = status(&app, id, asked).await;
    assert_eq!(
        states(&answered),
        [
            (users[9], S::Unread as i32),
            (77, S::NotARecipient as i32),
            (users[7], S::Read as i32),
            (users[0], S::Unread as i32)
        ]
    );
    assert!(answered[2].read_at.is_some() && answered[2].delivered_at.is_some());
    assert!(answered[1].delivered_at.is_none());
    // A thousand at once, half of them recipients.
    let mut thousand: Vec<u64> = users.clone();
    thousand.extend(9_000_001..9_000_901);
    let answered = status(&app, id, thousand).await;
    assert_eq!(answered.len(), 1000);
    let by_state: BTreeMap<i32, usize> = answered.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.state).or_default() += 1;
        m
    });
    assert_eq!(by_state[&(S::NotARecipient as i32)], 900);
    assert_eq!(by_state[&(S::Unread as i32)], 99);
    // Once retention deleted the send's chunks (`chunks_days`, before its
    // items), the items still say who got it and who read it.
    let before = status(&app, id, users.clone()).await;
    for (_, pool) in app.ctx.pools.iter() {
        sqlx::query("DELETE FROM message_chunks WHERE message_id = ? AND state IN (1, 3)")
            .bind(id)
            .execute(pool)
            .await
            .unwrap();
    }
    assert_eq!(status(&app, id, users.clone()).await, before);
    assert_eq!(
        states(&status(&app, id, vec![77, users[7]]).await),
        [(77, S::NotARecipient as i32), (users[7], S::Read as i32)]
    );
    app.cleanup().await;
}

fn invalid_field(status: tonic::Status) -> String {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    status.message().split(':').next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_and_unknown_sends_are_not_found() {
    let app = spawn_app_with(test_settings(), false).await;
    let id = app.send(vec![8_500_001, 8_500_002]).await;
    let other = app.send(vec![8_500_003]).await;
    let list = |message_id: u64, state: i32, page_size: u32, page_token: String| {
        let mut client = app.messages();
        async move {
            client
                .list_recipients(v1::ListRecipientsRequest {
                    message_id,
                    state,
                    page_size,
                    page_token,
                })
                .await
        }
    };
    assert_eq!(invalid_field(list(id, 99, 10, String::new()).await.unwrap_err()), "state");
    assert_eq!(invalid_field(list(id, -1, 10, String::new()).await.unwrap_err()), "state");
    assert_eq!(invalid_field(list(id, 0, 1001, String::new()).await.unwrap_err()), "page_size");
    assert_eq!(invalid_field(list(id, 0, 10, "nonsense".into()).await.unwrap_err()), "page_token");
    assert_eq!(invalid_field(list(0, 0, 10, String::new()).await.unwrap_err()), "message_id");
    // A token of another send or filter.
    let first = list(id, F::Pending as i32, 1, String::new()).await.unwrap().into_inner();
    assert!(!first.next_page_token.is_empty());
    let token = first.next_page_token;
    assert_eq!(
        invalid_field(list(other, F::Pending as i32, 1, token.clone()).await.unwrap_err()),
        "page_token"
    );
    assert_eq!(
        invalid_field(list(id, F::Unread as i32, 1, token.clone()).await.unwrap_err()),
        "page_token"
    );
    let second = list(id, F::Pending as i32, 1, token).await.unwrap().into_inner();
    assert_eq!(users_of(&second.recipients), [8_500_002]);
    let unknown = list(other + 1_000_000, 0, 10, String::new()).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");

    let get = |message_id: u64, user_ids: Vec<u64>| {
        let mut client = app.messages();
        async move {
            client
                .get_recipient_status(v1::GetRecipientStatusRequest { message_id, user_ids })
                .await
        }
    };
    assert_eq!(invalid_field(get(id, (1..=1001).collect()).await.unwrap_err()), "user_ids");
    assert_eq!(invalid_field(get(id, vec![]).await.unwrap_err()), "user_ids");
    assert_eq!(invalid_field(get(id, vec![5, 0]).await.unwrap_err()), "user_ids[1]");
    assert_eq!(get(other + 1_000_000, vec![5]).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(get(id, (1..=1000).collect()).await.unwrap().into_inner().recipients.len(), 1000);
    app.cleanup().await;
}

#[tokio::test]
async fn sends_read_covers_ones_own_sends_and_sends_all_every_clients() {
    let mut settings = test_settings();
    let tokens = with_clients(
        &mut settings,
        &[
            ("billing", &["send", "sends.read"]),
            ("other", &["send", "sends.read"]),
            ("blind", &["send"]),
            ("ops", &["sends.read", "sends.all"]),
        ],
    );
    let app = spawn_app_with(settings, false).await;
    let client = |name: &str| MessageServiceClient::new(authed(app.channel(), &tokens[name]));
    let mut request = crate::helpers::send_request(vec![8_600_001, 8_600_002]);
    request.sender = "billing".into();
    let id = client("billing").send_message(request).await.unwrap().into_inner().message_id;
    let list = v1::ListRecipientsRequest { message_id: id, ..Default::default() };
    let get = v1::GetRecipientStatusRequest { message_id: id, user_ids: vec![8_600_001] };
    for name in ["billing", "ops"] {
        let page = client(name).list_recipients(list.clone()).await.unwrap().into_inner();
        assert_eq!(users_of(&page.recipients), [8_600_001, 8_600_002], "{name}");
        let found = client(name).get_recipient_status(get.clone()).await.unwrap().into_inner();
        assert_eq!(found.recipients[0].state, S::Pending as i32, "{name}");
    }
    let hidden = client("other").list_recipients(list.clone()).await.unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound, "another client's send is not found: {hidden:?}");
    let hidden = client("other").get_recipient_status(get.clone()).await.unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound);
    let refused = client("blind").list_recipients(list).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let refused = client("blind").get_recipient_status(get).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    app.cleanup().await;
}

/// Rows of a user's recipient records over every shard.
async fn records_of(app: &TestApp, user_id: u64) -> i64 {
    let mut total = 0;
    for (_, pool) in app.ctx.pools.iter() {
        for table in ["message_reads", "announcement_recipients"] {
            let sql = format!("SELECT COUNT(*) FROM {table} WHERE user_id = ?");
            let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(user_id)
                .fetch_one(pool)
                .await
                .unwrap();
            total += count;
        }
    }
    total
}

#[tokio::test]
async fn erasure_removes_the_users_reads_and_materializations() {
    let app = spawn_app().await;
    let (user, other) = (8_700_001, 8_700_002);
    let id = app.send(vec![user, other]).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let announcement = announce(&app, "for all").await;
    wait_for_status(&app, announcement, v1::MessageStatus::Sending).await;
    for who in [user, other] {
        assert!(inbox_ids(&app, who).await.contains(&announcement));
        mark_read(&app, who, id).await;
        mark_read(&app, who, announcement).await;
    }
    assert_eq!(records_of(&app, user).await, 3, "two reads and one materialization");
    AdminServiceClient::new(app.channel())
        .erase_user(v1::EraseUserRequest { user_id: user })
        .await
        .unwrap();
    assert_eq!(records_of(&app, user).await, 0);
    assert_eq!(records_of(&app, other).await, 3);
    assert_eq!(users_of(&list_all(&app, id, F::Read, 10).await), [other]);
    assert_eq!(users_of(&list_all(&app, announcement, F::Unspecified, 10).await), [other]);
    assert_eq!(
        states(&status(&app, id, vec![user, other]).await),
        [(user, S::Suppressed as i32), (other, S::Read as i32)]
    );
    assert_eq!(users_of(&list_all(&app, id, F::Suppressed, 10).await), [user]);
    app.cleanup().await;
}

/// Starts a draft of these batches (no worker runs in the apps below, so its
/// chunks stay pending and every state comes from them).
async fn start_batches(app: &TestApp, batches: &[Vec<u64>]) -> u64 {
    let id = crate::helpers::create_draft(app, "recipients").await;
    for (index, user_ids) in batches.iter().enumerate() {
        let request = v1::AppendRecipientsRequest {
            message_id: id,
            batch_number: index as u64 + 1,
            user_ids: user_ids.clone(),
            ..Default::default()
        };
        app.messages().append_recipients(request).await.unwrap();
    }
    app.messages().start_message(v1::StartMessageRequest { message_id: id }).await.unwrap();
    id
}

#[tokio::test]
async fn recipient_status_finds_each_user_in_the_one_chunk_of_each_batch_whose_range_holds_them() {
    let app = spawn_app_with(test_settings(), false).await;
    // Two interleaved batches, with the users between them no recipient:
    // every user falls inside the runs of chunks of both batches.
    let first: Vec<u64> = (0..900).map(|i| 8_600_000 + 3 * i).collect();
    let second: Vec<u64> = (0..900).map(|i| 8_600_001 + 3 * i).collect();
    let id = start_batches(&app, &[first.clone(), second.clone()]).await;
    // One shard's chunks dead-lettered.
    let (shard, pool) = app.ctx.pools.iter().next().unwrap();
    sqlx::query("UPDATE message_chunks SET state = 2 WHERE message_id = ?")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    let asked: Vec<u64> = (8_600_000..8_601_000).collect();
    let expected: Vec<(u64, i32)> = asked
        .iter()
        .map(|user| {
            let state = if (user - 8_600_000) % 3 == 2 {
                S::NotARecipient
            } else if app.ctx.pools.for_user(*user).shard() == shard {
                S::Failed
            } else {
                S::Pending
            };
            (*user, state as i32)
        })
        .collect();
    assert_eq!(states(&status(&app, id, asked).await), expected);
    app.cleanup().await;
}

/// An api that follows shard map versions closely, no worker (chunks stay
/// pending), and a started send to 40 users of shard 0 from `first` on:
/// the send, the first of them (whose bucket the caller moves) and the
/// second (whose bucket stays).
async fn pending_on_shard_0(first: u64) -> (TestApp, u64, u64, u64) {
    let mut settings = test_settings();
    settings.database.shard_map_refresh_ms = 100;
    let app = spawn_app_with(settings, false).await;
    let shard_of = |user: u64| app.ctx.pools.for_user(user).shard();
    let users: Vec<u64> = (first..).filter(|u| shard_of(*u) == ShardId(0)).take(40).collect();
    let id = start_batches(&app, std::slice::from_ref(&users)).await;
    // Not a user in the send's own home bucket (1 in 1,024 sends): moving
    // that bucket in the map alone would route the send's record away from
    // where it is.
    let mover = users.iter().copied().find(|u| bucket_of(*u) != bucket_of(id)).unwrap();
    let stayer = users.iter().copied().find(|u| bucket_of(*u) != bucket_of(mover)).unwrap();
    (app, id, mover, stayer)
}

/// Moves `user`'s bucket to shard 1 in a new shard map version, and waits
/// until the api routes by it. Returns that version.
async fn move_to_shard_1(app: &TestApp, user: u64) -> u64 {
    let bucket = bucket_of(user);
    let moved = app.ctx.pools.map().with_range(ShardId(1), bucket, bucket).unwrap();
    let version =
        shard_map::append(&app.ctx.pools, 1, &moved, "test: bucket to shard 1").await.unwrap();
    eventually("the api routes by the new version", Duration::from_secs(10), || async {
        (app.ctx.pools.version() >= version).then_some(())
    })
    .await;
    assert_eq!(app.ctx.pools.for_user(user).shard(), ShardId(1));
    assert!(app.ctx.pools.snapshot().moved().contains(bucket));
    version
}

#[tokio::test]
async fn recipient_status_finds_a_pending_user_whose_bucket_moved_since_the_chunk_was_cut() {
    // The bucket of the first user moves to shard 1 after their chunk was
    // cut on shard 0 (no worker runs: it stays pending there).
    let (app, id, mover, stayer) = pending_on_shard_0(8_800_000).await;
    let bucket = bucket_of(mover);
    assert!(app.ctx.pools.snapshot().moved().is_empty(), "nothing moved yet");
    let version = move_to_shard_1(&app, mover).await;
    // Both still in their pending chunk on shard 0; a user of no send in
    // the same bucket is none.
    let other = (mover + 1..).find(|u| bucket_of(*u) == bucket).unwrap();
    assert_eq!(
        states(&status(&app, id, vec![mover, stayer, other]).await),
        [(mover, S::Pending as i32), (stayer, S::Pending as i32), (other, S::NotARecipient as i32)]
    );
    // A process started later learns the move from the stored versions.
    let directory = shard_map::directory(&app.ctx.pools).unwrap();
    assert_eq!(
        shard_map::moves_since(directory, 1).await.unwrap(),
        BucketSet::range(bucket, bucket)
    );
    assert!(shard_map::moves_since(directory, version).await.unwrap().is_empty());
    app.cleanup().await;
}

/// A bucket move under a send that is still delivering splits the pending
/// chunks whose users it moved: the split parts are new chunks, which a
/// replica that kept the send's chunk index before does not hold.
#[tokio::test]
async fn recipient_status_finds_a_user_split_into_a_new_chunk_after_the_index_was_kept() {
    let (app, id, mover, stayer) = pending_on_shard_0(8_700_000).await;
    let before = states(&status(&app, id, vec![mover, stayer]).await);
    assert_eq!(before, [(mover, S::Pending as i32), (stayer, S::Pending as i32)]);
    assert!(app.ctx.chunk_indexes.get(id, mover).is_some(), "a started send's index is kept");

    move_to_shard_1(&app, mover).await;
    // As a worker would on applying the chunk: the mover goes into a chunk
    // of their own on shard 1, here dead-lettered there.
    split_by_hand(&app, id, mover, 2).await;
    let after = states(&status(&app, id, vec![mover, stayer]).await);
    assert_eq!(after, [(mover, S::Failed as i32), (stayer, S::Pending as i32)]);
    app.cleanup().await;
}

#[tokio::test]
async fn recipient_status_is_exact_where_a_users_bytes_straddle_two_ids_of_a_chunk() {
    let app = spawn_app_with(test_settings(), false).await;
    let shard_of = |user: u64| app.ctx.pools.for_user(user).shard();
    // Chunks store ids as little-endian u64s: the high (zero) byte of
    // `before` and the 7 low bytes of `after` spell 256 * `after`, one byte
    // off alignment, so a byte search alone would find that user there.
    let before = 8_700_001;
    let shard = shard_of(before);
    let after =
        (before + 1..).find(|u| shard_of(*u) == shard && shard_of(u * 256) == shard).unwrap();
    let lookalike = after * 256;
    let beyond = (lookalike + 1..).find(|u| shard_of(*u) == shard).unwrap();
    let without = start_batches(&app, &[vec![before, after, beyond]]).await;
    assert_eq!(
        states(&status(&app, without, vec![lookalike, after]).await),
        [(lookalike, S::NotARecipient as i32), (after, S::Pending as i32)]
    );
    // Also there as a recipient: found past the straddling bytes.
    let with = start_batches(&app, &[vec![before, after, lookalike]]).await;
    assert_eq!(
        states(&status(&app, with, vec![lookalike, before]).await),
        [(lookalike, S::Pending as i32), (before, S::Pending as i32)]
    );
    app.cleanup().await;
}

/// Sets every chunk of a send on every shard back to what a chunk applied
/// before recorded deliveries (or by an older worker) holds: no apply time,
/// no held-back users. Returns (chunks recorded, chunks holding some back)
/// before.
async fn forget_recorded_applies(app: &TestApp, message_id: u64) -> (i64, i64) {
    let (mut recorded, mut holding) = (0, 0);
    for (_, pool) in app.ctx.pools.iter() {
        let (r, h): (i64, i64) = sqlx::query_as(
            "SELECT CAST(COALESCE(SUM(applied_at IS NOT NULL), 0) AS SIGNED), \
             CAST(COALESCE(SUM(held_back IS NOT NULL), 0) AS SIGNED) \
             FROM message_chunks WHERE message_id = ?",
        )
        .bind(message_id)
        .fetch_one(pool)
        .await
        .unwrap();
        recorded += r;
        holding += h;
        sqlx::query(
            "UPDATE message_chunks SET applied_at = NULL, held_back = NULL WHERE message_id = ?",
        )
        .bind(message_id)
        .execute(pool)
        .await
        .unwrap();
    }
    (recorded, holding)
}

#[tokio::test]
async fn recorded_applies_item_lookups_and_status_give_the_same_states() {
    let app = spawn_app().await;
    let users: Vec<u64> = (0..1200).map(|i| 8_900_001 + i).collect();
    let muted: BTreeSet<u64> = users.iter().copied().step_by(37).collect();
    for user in &muted {
        let preferences =
            v1::Preferences { muted_categories: vec!["billing".into()], ..Default::default() };
        let request = v1::SetPreferencesRequest { user_id: *user, preferences: Some(preferences) };
        app.inbox().set_preferences(request).await.unwrap();
    }
    let mut request = notify_testkit::send_request(users.clone());
    request.content.as_mut().unwrap().category = "billing".into();
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    let readers: BTreeSet<u64> =
        users.iter().copied().step_by(11).filter(|u| !muted.contains(u)).collect();
    for user in &readers {
        mark_read(&app, *user, id).await;
    }
    // Erased after the delivery: their item goes, they count as suppressed.
    let erased = users[5];
    assert!(!muted.contains(&erased) && !readers.contains(&erased));
    AdminServiceClient::new(app.channel())
        .erase_user(v1::EraseUserRequest { user_id: erased })
        .await
        .unwrap();
    let expected = |user: u64| {
        if muted.contains(&user) || user == erased {
            S::Suppressed
        } else if readers.contains(&user) {
            S::Read
        } else {
            S::Unread
        }
    };
    let check = |listed: &[v1::Recipient], how: &str| {
        assert_eq!(users_of(listed), users, "{how}: every recipient once, in order");
        for recipient in listed {
            let state = expected(recipient.user_id);
            assert_eq!(recipient.state, state as i32, "{how}: user {}", recipient.user_id);
            let delivered = state != S::Suppressed;
            assert_eq!(recipient.delivered_at.is_some(), delivered, "{how}: {}", recipient.user_id);
            assert_eq!(
                recipient.read_at.is_some(),
                state == S::Read,
                "{how}: {}",
                recipient.user_id
            );
        }
    };
    let suppressed: Vec<u64> =
        users.iter().copied().filter(|u| expected(*u) == S::Suppressed).collect();
    for page_size in [100, 1000] {
        check(&list_all(&app, id, F::Unspecified, page_size).await, "recorded");
        assert_eq!(users_of(&list_all(&app, id, F::Suppressed, page_size).await), suppressed);
    }
    // GetRecipientStatus says the same of each (in request order).
    let mut answered = status(&app, id, users[..1000].to_vec()).await;
    answered.extend(status(&app, id, users[1000..].to_vec()).await);
    check(&answered, "status");

    let (recorded, holding) = forget_recorded_applies(&app, id).await;
    assert!(recorded >= 3, "every chunk applied now records it ({recorded})");
    assert!(holding >= 3, "chunks with muting recipients record them ({holding})");
    for page_size in [100, 1000] {
        check(&list_all(&app, id, F::Unspecified, page_size).await, "looked up");
        assert_eq!(users_of(&list_all(&app, id, F::Suppressed, page_size).await), suppressed);
    }
    // Without the record, a user without an item in a delivered chunk is
    // looked up again to tell held back from delivered during the call.
    let mut answered = status(&app, id, users[..1000].to_vec()).await;
    answered.extend(status(&app, id, users[1000..].to_vec()).await);
    check(&answered, "status, looked up");
    app.cleanup().await;
}

/// Once a send has started, a replica keeps its chunk index (where each
/// chunk's users start and end) and later status calls skip reading it;
/// the chunks' states are still read on each call. A draft, which may
/// still get chunks, keeps none.
#[tokio::test]
async fn recipient_status_keeps_a_started_sends_chunk_index_and_reads_chunk_states_anew() {
    let app = spawn_app().await;
    let draft = crate::helpers::create_draft(&app, "recipients").await;
    let request = v1::AppendRecipientsRequest {
        message_id: draft,
        batch_number: 1,
        user_ids: vec![8_950_001, 8_950_002],
        ..Default::default()
    };
    app.messages().append_recipients(request).await.unwrap();
    let answered = states(&status(&app, draft, vec![8_950_001, 8_950_003]).await);
    assert_eq!(answered, [(8_950_001, S::Pending as i32), (8_950_003, S::NotARecipient as i32)]);
    assert!(app.ctx.chunk_indexes.get(draft, 0).is_none(), "a draft's index is not final");

    let users: Vec<u64> = (8_950_001..8_952_001).collect();
    let id = app.send(users.clone()).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    assert!(app.ctx.chunk_indexes.get(id, users[0]).is_none());
    let answered = states(&status(&app, id, users[..1000].to_vec()).await);
    assert!(answered.iter().all(|(_, state)| *state == S::Unread as i32), "{answered:?}");
    let kept = app.ctx.chunk_indexes.get(id, users[0]).expect("the index of a completed send");
    let chunks: usize = kept.shards.iter().map(|(_, ends)| ends.len()).sum();
    assert!(chunks >= app.ctx.pools.iter().count(), "{chunks} chunks");

    // One shard's chunks dead-lettered and their items gone (as a worker
    // that never applied them leaves them): the kept index finds those
    // users in their chunks, whose state is read now.
    let (shard, pool) = app.ctx.pools.iter().next().unwrap();
    for sql in [
        "DELETE FROM message_items WHERE message_id = ?",
        "UPDATE message_chunks SET state = 2 WHERE message_id = ?",
    ] {
        sqlx::query(sql).bind(id).execute(pool).await.unwrap();
    }
    let mut asked = users[500..1499].to_vec();
    asked.push(9_999_999);
    let expected: Vec<(u64, i32)> = asked
        .iter()
        .map(|user| {
            let state = if *user == 9_999_999 {
                S::NotARecipient
            } else if app.ctx.pools.for_user(*user).shard() == shard {
                S::Failed
            } else {
                S::Unread
            };
            (*user, state as i32)
        })
        .collect();
    assert!(expected.iter().any(|(_, state)| *state == S::Failed as i32));
    assert_eq!(states(&status(&app, id, asked).await), expected);
    app.cleanup().await;
}

/// What a worker does to the pending chunk of `user` when a bucket move
/// made the user another shard's (`deliver::split`), by hand: the user
/// leaves the chunk, which narrows, for a new chunk of their own (top bit
/// of its id set) in `state`, on the shard that owns them now.
async fn split_by_hand(app: &TestApp, message_id: u64, user: u64, state: u8) {
    for (_, pool) in app.ctx.pools.iter() {
        let chunks: Vec<(u64, Vec<u8>)> =
            sqlx::query_as("SELECT chunk_id, user_ids FROM message_chunks WHERE message_id = ?")
                .bind(message_id)
                .fetch_all(pool)
                .await
                .unwrap();
        let found = chunks.iter().find_map(|(chunk_id, packed)| {
            let ids = chunks::decode_user_ids(packed).unwrap();
            ids.contains(&user).then(|| (*chunk_id, ids.into_iter().filter(|u| *u != user)))
        });
        let Some((from, stayed)) = found else { continue };
        let stayed = chunks::encode_user_ids(&stayed.collect::<Vec<_>>());
        sqlx::query("UPDATE message_chunks SET user_ids = ? WHERE message_id = ? AND chunk_id = ?")
            .bind(stayed)
            .bind(message_id)
            .bind(from)
            .execute(pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO message_chunks (user_ids, message_id, chunk_id, state, recipients) \
             VALUES (?, ?, ?, ?, 1)",
        )
        .bind(chunks::encode_user_ids(&[user]))
        .bind(message_id)
        .bind(chunks::SPLIT_CHUNK_BIT | from)
        .bind(state)
        .execute(app.ctx.pools.for_user(user).value())
        .await
        .unwrap();
        return;
    }
    panic!("user {user} is in no chunk of {message_id}");
}

/// While a send delivers, `GetRecipientStatus` is asked again and again
/// for users spread over it: a chunk applied between the call's two rounds
/// (after its items were read, before its chunks were) must not make its
/// users read as suppressed. No user mutes anything here, so every answer
/// is pending or unread.
#[tokio::test]
async fn recipient_status_never_reads_a_user_delivered_mid_call_as_suppressed() {
    let app = spawn_app().await;
    let users: Vec<u64> = (8_900_001..8_920_001).collect();
    let id = app.send(users.clone()).await;
    let asked: Vec<u64> = users.iter().copied().step_by(20).collect();
    let mut calls = 0;
    let mut seen = BTreeSet::new();
    loop {
        let done = app.get_message(id).await.status == v1::MessageStatus::Completed as i32;
        for recipient in status(&app, id, asked.clone()).await {
            let state = S::try_from(recipient.state).unwrap();
            assert!(
                matches!(state, S::Pending | S::Unread),
                "user {} read as {state:?} in call {calls}",
                recipient.user_id
            );
            seen.insert(recipient.state);
        }
        calls += 1;
        if done {
            break;
        }
    }
    // The last call came after the send completed: every user unread.
    assert!(seen.contains(&(S::Unread as i32)), "{calls} calls");
    app.cleanup().await;
}

/// Recipients pages and status calls read on the shards' direct connections
/// (given back without sqlx's ping): once the server killed every one the
/// first reads left idle, the same reads answer the same, each on a new
/// connection in a killed one's place, without an error.
#[tokio::test]
async fn recipient_reads_on_direct_connections_survive_killed_idle_ones() {
    let app = spawn_app().await;
    let users: Vec<u64> = (8_300_001..8_300_301).collect();
    let id = app.send(users.clone()).await;
    wait_for_status(&app, id, v1::MessageStatus::Completed).await;
    mark_read(&app, users[7], id).await;
    let filters = [F::Unspecified, F::Read, F::Unread];
    let mut before = Vec::new();
    for filter in filters {
        before.push(list_all(&app, id, filter, 50).await);
    }
    let statuses = status(&app, id, users.clone()).await;

    let direct = app.ctx.direct.as_ref().expect("direct connections");
    let mut killed = BTreeSet::new();
    for (shard, pool) in app.ctx.pools.iter() {
        for id in idle_ids(direct.get(shard).unwrap()).await {
            sqlx::query(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                .execute(pool)
                .await
                .unwrap();
            killed.insert(id);
        }
    }
    assert!(killed.len() >= 2, "the first reads left direct connections idle: {killed:?}");

    for (filter, before) in filters.into_iter().zip(&before) {
        assert_eq!(&list_all(&app, id, filter, 50).await, before, "{filter:?}");
    }
    assert_eq!(states(&status(&app, id, users).await), states(&statuses));
    for (shard, _) in app.ctx.pools.iter() {
        let idle = idle_ids(direct.get(shard).unwrap()).await;
        assert!(idle.iter().all(|id| !killed.contains(id)), "shard {shard:?}: {idle:?} lent again");
    }
    app.cleanup().await;
}
