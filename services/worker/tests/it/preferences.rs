//! Applying chunks whose recipients mute the send: every way of checking
//! preferences (in the insert, first, or first with the recipients'
//! languages) writes the same items and tells the same recipients held
//! back, duplicates apart.

use std::collections::{BTreeSet, HashSet};

use notify_domain::domain::MessageId;
use notify_proto::v1;
use notify_store::db::chunks::{self, ApplyOutcome, GroupApplied, HoldCheck};
use notify_testkit::{content, send_request, spawn_app_with, test_settings};

/// What an apply should have done to `user_ids`: the held back (muting,
/// without the item) and how many items it wrote (neither muting nor
/// having the item already).
fn expected(user_ids: &[u64], muting: &HashSet<u64>, had: &HashSet<u64>) -> (BTreeSet<u64>, u64) {
    let held =
        user_ids.iter().copied().filter(|u| muting.contains(u) && !had.contains(u)).collect();
    let new = user_ids.iter().filter(|u| !muting.contains(u) && !had.contains(u)).count() as u64;
    (held, new)
}

#[tokio::test]
async fn every_way_of_checking_preferences_holds_back_the_same_recipients() {
    // No worker: the test applies the chunks itself, each way.
    let app = spawn_app_with(test_settings(), false).await;
    let users: Vec<u64> = (0..6_000).map(|i| 7_100_000 + i).collect();
    let muting: HashSet<u64> = users.iter().copied().filter(|u| u % 10 == 0).collect();
    for user in &muting {
        let preferences =
            v1::Preferences { muted_categories: vec!["promo".to_owned()], ..Default::default() };
        let request = v1::SetPreferencesRequest { user_id: *user, preferences: Some(preferences) };
        app.inbox().set_preferences(request).await.unwrap();
    }
    let mut request = send_request(users.clone());
    request.content = Some(v1::Content { category: "promo".to_owned(), ..content("muted") });
    let id = app.messages().send_message(request).await.unwrap().into_inner().message_id;
    let message_id = MessageId::from_raw(id);

    // Some recipients have the item already (as from an earlier batch
    // delivered before they muted): duplicates, not held back.
    let had: HashSet<u64> = users.iter().copied().filter(|u| u % 7 == 0).collect();
    assert!(had.iter().any(|u| muting.contains(u)) && had.iter().any(|u| !muting.contains(u)));
    let (mut applied_first, mut applied_in_insert, mut held_in_all) = (0, 0, 0);
    for (_, pool) in app.ctx.pools.iter() {
        let rows: Vec<(u64, Vec<u8>)> = sqlx::query_as(
            "SELECT chunk_id, user_ids FROM message_chunks \
             WHERE message_id = ? AND state = 0 ORDER BY chunk_id",
        )
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap();
        let chunks: Vec<(u64, Vec<u64>)> = rows
            .into_iter()
            .map(|(chunk_id, packed)| (chunk_id, chunks::decode_user_ids(&packed).unwrap()))
            .collect();
        assert!(chunks.len() >= 3, "{} chunks on a shard", chunks.len());
        for user in chunks.iter().flat_map(|(_, users)| users).filter(|u| had.contains(u)) {
            sqlx::query(
                "INSERT INTO message_items (user_id, message_id, category) VALUES (?, ?, 'promo')",
            )
            .bind(user)
            .bind(id)
            .execute(pool)
            .await
            .unwrap();
        }
        // One chunk each way alone (checking in the insert, and first
        // with the languages), the rest as a group checking first.
        for (nth, (chunk_id, user_ids)) in chunks.iter().take(2).enumerate() {
            let hold = if nth == 0 { HoldCheck::InInsert } else { HoldCheck::WithLocales };
            let outcome = chunks::apply(pool, message_id, &[*chunk_id], hold, |_| true).await;
            let ApplyOutcome::Applied(GroupApplied { delivered, held_back, locales, .. }) =
                outcome.unwrap()
            else {
                panic!("chunk {chunk_id} not applied");
            };
            let (held, new) = expected(user_ids, &muting, &had);
            assert_eq!(held_back.iter().copied().collect::<BTreeSet<u64>>(), held, "{hold:?}");
            assert_eq!(held_back.len(), held.len(), "{hold:?}: each held back once");
            assert_eq!(delivered, new, "{hold:?}");
            assert_eq!(locales.is_some(), hold == HoldCheck::WithLocales, "{hold:?}");
            held_in_all += held.len();
            match hold {
                HoldCheck::First | HoldCheck::WithLocales => applied_first += 1,
                HoldCheck::InInsert => applied_in_insert += 1,
            }
        }
        let rest: Vec<u64> = chunks[2..].iter().map(|(chunk_id, _)| *chunk_id).collect();
        let outcome = chunks::apply(pool, message_id, &rest, HoldCheck::First, |_| true).await;
        let ApplyOutcome::Applied(group) = outcome.unwrap() else {
            panic!("the group not applied");
        };
        let group_users: Vec<u64> =
            chunks[2..].iter().flat_map(|(_, u)| u.iter().copied()).collect();
        let (held, new) = expected(&group_users, &muting, &had);
        assert_eq!(group.held_back.iter().copied().collect::<BTreeSet<u64>>(), held);
        assert_eq!(group.delivered, new);
        held_in_all += held.len();
        applied_first += rest.len();
    }
    assert!(applied_first > 0 && applied_in_insert > 0);

    // The items: every recipient but the held back, once.
    let items = app.item_users(id).await;
    let wanted: Vec<u64> =
        users.iter().copied().filter(|u| !muting.contains(u) || had.contains(u)).collect();
    assert_eq!(items, wanted);
    assert_eq!(held_in_all, muting.iter().filter(|u| !had.contains(u)).count());
    app.cleanup().await;
}
