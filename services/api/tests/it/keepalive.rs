//! The keepalive of the api's direct connections
//! (`notify_store::db::direct`): a write is never run twice, so one on a
//! connection not known open within the last second is pinged first; the
//! keepalive pings idle connections in the background so that an item
//! update after a pause needs no ping of its own, for
//! `database.read_keep_warm_secs` after a connection's last call.

use std::time::{Duration, Instant};

use notify_proto::v1;
use notify_testkit::{TestApp, eventually, spawn_app_with, test_settings};

use crate::helpers::next_lent_id;
use crate::items::{deliver, update};

/// The direct connections of `user`'s shard.
fn direct_of(app: &TestApp, user: u64) -> &notify_store::db::direct::DirectConnections {
    let shard = app.ctx.pools.for_user(user).shard();
    app.ctx.direct.as_ref().expect("direct connections").get(shard).unwrap()
}

/// An app with `read_keep_warm_secs` set, and an item of `user` marked
/// seen by one update: returns the app, the item and the id of the
/// connection the update went on (idle in its set now).
async fn updated_once(keep_warm_secs: u64, user: u64) -> (TestApp, u64, u64) {
    let mut settings = test_settings();
    settings.database.read_keep_warm_secs = keep_warm_secs;
    let app = spawn_app_with(settings, true).await;
    let item = deliver(&app, &[user], "billing").await;
    assert_eq!(update(&app, user, v1::ItemAction::MarkSeen, vec![item], None).await.changed, 1);
    let used = next_lent_id(direct_of(&app, user)).await;
    (app, item, used)
}

/// An update after a pause longer than the ping threshold finds its
/// connection checked by the keepalive moments before: the same
/// connection, and no ping of its own.
#[tokio::test]
async fn an_update_after_a_pause_finds_its_connection_kept_warm() {
    let user = 5_300_001;
    let (app, item, used) = updated_once(60, user).await;
    let paused = Instant::now();
    let direct = direct_of(&app, user);

    // Pinged once idle for half a second, and again half a second later:
    // by then the connection sat idle past the second a write checks.
    let pings = direct.stats().keepalive_pings;
    eventually("two keepalive pings", Duration::from_secs(10), || async {
        (direct.stats().keepalive_pings >= pings + 2).then_some(())
    })
    .await;
    assert!(paused.elapsed() >= Duration::from_secs(1), "{:?}", paused.elapsed());
    assert_eq!(update(&app, user, v1::ItemAction::MarkRead, vec![item], None).await.changed, 1);
    let stats = direct.stats();
    assert_eq!(stats.pinged_before_write, 0, "{stats:?}");
    assert_eq!(stats.dropped_by_keepalive, 0, "{stats:?}");
    assert_eq!(next_lent_id(direct).await, used, "the same connection, kept open");
    app.cleanup().await;
}

/// Past `read_keep_warm_secs` after its last call a connection is left
/// alone (an api idle for long sends nothing), so the server may close it
/// unseen; the next update pings it first, finds it closed and runs on a
/// new one, without an error.
#[tokio::test]
async fn past_the_keep_warm_window_an_update_pings_its_connection_first() {
    let user = 5_300_101;
    let (app, item, used) = updated_once(1, user).await;
    let direct = direct_of(&app, user);

    // The window passing is the condition under test: after it, the
    // keepalive sends nothing more, and a killed connection stays in the
    // set unseen.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let pings = direct.stats().keepalive_pings;
    assert!(pings >= 1, "tended within the window: {pings}");
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL CONNECTION {used}")))
        .execute(&*app.ctx.pools.for_user(user))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let stats = direct.stats();
    assert_eq!((stats.keepalive_pings, stats.dropped_by_keepalive), (pings, 0), "{stats:?}");
    assert_eq!(direct.idle_count(), 1, "the killed connection, still idle in the set");

    assert_eq!(update(&app, user, v1::ItemAction::MarkRead, vec![item], None).await.changed, 1);
    assert_eq!(direct.stats().pinged_before_write, 1);
    assert_ne!(next_lent_id(direct).await, used, "a new connection in the killed one's place");
    app.cleanup().await;
}

/// With `read_keep_warm_secs = 0` nothing is pinged in the background: an
/// update after a pause pings its connection first, as before the
/// keepalive.
#[tokio::test]
async fn without_a_keep_warm_window_an_update_after_a_pause_pings_first() {
    let user = 5_300_201;
    let (app, item, used) = updated_once(0, user).await;
    let direct = direct_of(&app, user);
    // The pause past the ping threshold is the condition under test.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(update(&app, user, v1::ItemAction::MarkRead, vec![item], None).await.changed, 1);
    let stats = direct.stats();
    assert_eq!((stats.pinged_before_write, stats.keepalive_pings), (1, 0), "{stats:?}");
    assert_eq!(next_lent_id(direct).await, used, "it answered: the same connection");
    app.cleanup().await;
}
