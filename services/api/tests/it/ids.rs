//! Message id instance leases: two live processes never share an instance,
//! a process whose instance was taken moves to a free one, and a process
//! that cannot renew stops issuing ids before its lease can lapse.

use std::sync::Arc;
use std::time::Duration;

use notify_domain::ids::IdGenerator;
use notify_store::instance_lease::InstanceLease;
use notify_testkit::{eventually, spawn_app};

/// The instance an id was issued under.
fn instance_of(id: u64) -> u64 {
    (id >> 12) & 1023
}

async fn holder_of(pool: &sqlx::MySqlPool, instance: u64) -> Option<String> {
    sqlx::query_scalar(
        "SELECT holder FROM instance_leases WHERE instance = ? AND expires_at >= UTC_TIMESTAMP(3)",
    )
    .bind(instance)
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn live_processes_hold_distinct_instances_and_their_ids_carry_them() {
    let app = spawn_app().await;
    let second = notify_core::Context::connect(app.settings.clone()).await.unwrap();
    let (a, b) = (app.ctx.ids.instance(), second.ids.instance());
    assert_ne!(a, b, "two live processes share instance {a}");
    let first_shard = app.ctx.pools.iter().next().unwrap().1;
    let (holder_a, holder_b) = (holder_of(first_shard, a).await, holder_of(first_shard, b).await);
    assert!(holder_a.is_some() && holder_b.is_some() && holder_a != holder_b);
    assert_eq!(instance_of(app.ctx.ids.next_id().unwrap().get()), a);
    assert_eq!(instance_of(second.ids.next_id().unwrap().get()), b);
    // A send's id comes from the api's leased instance.
    let id = app.send(vec![1]).await;
    assert_eq!(instance_of(id), a);
    app.cleanup().await;
}

#[tokio::test]
async fn a_taken_instance_is_left_for_a_free_one_and_a_lapsed_lease_issues_no_ids() {
    let app = spawn_app().await;
    // A pool of its own, closed below as if the shard went away.
    let pools = notify_store::db::connect(&app.settings).await.unwrap();
    let pool = pools.iter().next().unwrap().1.clone();
    let generator = Arc::new(IdGenerator::with_instance(0));
    let lease =
        InstanceLease::acquire(pool.clone(), &generator, Duration::from_secs(4)).await.unwrap();
    let mine = generator.instance();
    assert_ne!(mine, app.ctx.ids.instance());
    // Another process took our instance (we were away past the lease).
    sqlx::query("UPDATE instance_leases SET holder = 'elsewhere' WHERE instance = ?")
        .bind(mine)
        .execute(&pool)
        .await
        .unwrap();
    lease.renew(&generator).await.unwrap();
    let moved = generator.instance();
    assert_ne!(moved, mine, "kept an instance another process holds");
    assert_eq!(holder_of(&pool, mine).await.as_deref(), Some("elsewhere"));
    assert_eq!(instance_of(generator.next_id().unwrap().get()), moved);

    // The first shard goes away for this process: renewals fail, and ids
    // stop before the 4 s lease can lapse in the database (at 3 s).
    pool.close().await;
    assert!(lease.renew(&generator).await.is_err());
    let refused = eventually("ids refused after the lease", Duration::from_secs(10), || async {
        generator.next_id().err()
    })
    .await;
    assert!(refused.to_string().contains("instance lease"), "{refused}");
    let lapsed = sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM instance_leases WHERE instance = ? AND expires_at >= UTC_TIMESTAMP(3)",
    )
    .bind(moved)
    .fetch_one(app.ctx.pools.iter().next().unwrap().1)
    .await
    .unwrap();
    assert_eq!(lapsed, 1, "ids went on until the lease had lapsed in the database");
    app.cleanup().await;
}
