//! Unit tests of the shard map and its routing.

use std::time::Instant;

use crate::*;

fn ids(n: u32) -> Vec<ShardId> {
    (0..n).map(ShardId).collect()
}

#[test]
fn even_map_covers_every_bucket_in_order() {
    let map = ShardMap::even(&ids(4)).unwrap();
    assert_eq!(map.shard_of_bucket(0), ShardId(0));
    assert_eq!(map.shard_of_bucket(255), ShardId(0));
    assert_eq!(map.shard_of_bucket(256), ShardId(1));
    assert_eq!(map.shard_of_bucket(1023), ShardId(3));
}

#[test]
fn known_users_land_on_known_shards() {
    let map = ShardMap::even(&ids(4)).unwrap();
    // bucket 812 -> shard 3, bucket 460 -> shard 1, bucket 999 -> shard 3.
    assert_eq!(map.shard_for_user(1), ShardId(3));
    assert_eq!(map.shard_for_user(42), ShardId(1));
    assert_eq!(map.shard_for_user(2), ShardId(3));
}

#[test]
fn unknown_shard_in_range_is_rejected_with_its_setting() {
    let ranges = [BucketRange { shard: ShardId(9), from: 0, to: 1023 }];
    let err = ShardMap::new(&ids(2), &ranges).unwrap_err();
    assert_eq!(err, ShardMapError::UnknownShard { index: 0, shard: ShardId(9) });
    assert!(err.to_string().starts_with("database.bucket_ranges[0]: shard 9"));
}

#[test]
fn overlapping_ranges_are_rejected() {
    let ranges = [
        BucketRange { shard: ShardId(0), from: 0, to: 600 },
        BucketRange { shard: ShardId(1), from: 500, to: 1023 },
    ];
    let err = ShardMap::new(&ids(2), &ranges).unwrap_err();
    assert_eq!(err, ShardMapError::Overlap { index: 1, bucket: 500, owner: ShardId(0) });
}

#[test]
fn gaps_and_bad_ranges_are_rejected() {
    let gap = [
        BucketRange { shard: ShardId(0), from: 0, to: 100 },
        BucketRange { shard: ShardId(1), from: 102, to: 1023 },
    ];
    assert_eq!(ShardMap::new(&ids(2), &gap).unwrap_err(), ShardMapError::Uncovered { bucket: 101 });
    let past_end = [BucketRange { shard: ShardId(0), from: 0, to: 1024 }];
    assert!(matches!(
        ShardMap::new(&ids(1), &past_end),
        Err(ShardMapError::BadRange { index: 0, .. })
    ));
    assert_eq!(ShardMap::new(&[], &[]).unwrap_err(), ShardMapError::NoShards);
    assert!(matches!(
        ShardMap::even(&[ShardId(1), ShardId(1)]),
        Err(ShardMapError::DuplicateShard { index: 1, .. })
    ));
}

#[test]
fn moving_a_range_to_a_new_shard_moves_only_its_buckets() {
    let before = ShardMap::even(&ids(2)).unwrap();
    let after = ShardMap::new(
        &ids(3),
        &[
            BucketRange { shard: ShardId(0), from: 0, to: 511 },
            BucketRange { shard: ShardId(1), from: 512, to: 767 },
            BucketRange { shard: ShardId(2), from: 768, to: 1023 },
        ],
    )
    .unwrap();
    for user_id in 1..10_000u64 {
        let (old, new) = (before.shard_for_user(user_id), after.shard_for_user(user_id));
        if bucket_of(user_id) < 768 {
            assert_eq!(old, new, "user {user_id} moved although its bucket did not");
        } else {
            assert_eq!(new, ShardId(2));
        }
    }
}

#[test]
fn partition_keeps_every_id_once() {
    let map = ShardMap::even(&ids(4)).unwrap();
    let users: Vec<u64> = (1..=5000).collect();
    let groups = map.partition_users(&users);
    let mut all: Vec<u64> = groups.iter().flat_map(|(_, u)| u.iter().copied()).collect();
    all.sort_unstable();
    assert_eq!(all, users);
    for (shard, users) in groups {
        assert!(users.iter().all(|u| map.shard_for_user(*u) == shard));
    }
}

#[test]
fn shards_route_to_their_member() {
    let shards =
        Shards::build(ShardMap::even(&ids(4)).unwrap(), |id| Ok::<_, ()>(format!("pool-{id}")))
            .unwrap();
    assert_eq!(shards.len(), 4);
    let routed = shards.for_user(42);
    assert_eq!(*routed, format!("pool-{}", routed.shard()));
    assert_eq!(shards.get(ShardId(3)).map(String::as_str), Some("pool-3"));
    assert!(shards.get(ShardId(7)).is_none());
}

#[test]
fn text_form_round_trips_and_lists_shards_without_buckets() {
    let map = ShardMap::even(&ids(2)).unwrap().with_shard(ShardId(7)).unwrap();
    assert_eq!(map.to_string(), "0=0-511;1=512-1023;7=");
    let moved = map.with_range(ShardId(7), 100, 199).unwrap();
    assert_eq!(moved.to_string(), "0=0-99,200-511;1=512-1023;7=100-199");
    let parsed: ShardMap = moved.to_string().parse().unwrap();
    assert_eq!(parsed.shards(), moved.shards());
    assert_eq!(parsed.ranges(), moved.ranges());
    assert_eq!(
        ShardMap::new(moved.shards(), &moved.ranges()).unwrap().to_string(),
        moved.to_string()
    );
}

#[test]
fn malformed_text_and_duplicate_shards_are_refused() {
    for text in ["", "0", "0=0-1023;x=", "0=0-1023;1=5", "0=0-10"] {
        assert!(text.parse::<ShardMap>().is_err(), "{text:?} parsed");
    }
    let map = ShardMap::even(&ids(2)).unwrap();
    assert!(matches!(map.with_shard(ShardId(1)), Err(ShardMapError::DuplicateShard { .. })));
    assert!(matches!(map.with_range(ShardId(9), 0, 10), Err(ShardMapError::UnknownShard { .. })));
}

#[test]
fn installed_maps_route_every_clone_and_only_newer_versions_win() {
    let members: Vec<(ShardId, String)> =
        ids(3).into_iter().map(|id| (id, format!("pool-{id}"))).collect();
    let start = ShardMap::even(&ids(2)).unwrap();
    let shards = Shards::with_members(members, start.clone(), 1).unwrap();
    let clone = shards.clone();
    let user = (1..).find(|u| bucket_of(*u) < 100).unwrap();
    assert_eq!(shards.for_user(user).shard(), ShardId(0));
    let moved = start.with_shard(ShardId(2)).unwrap().with_range(ShardId(2), 0, 99).unwrap();
    assert!(shards.install(moved.clone(), BucketSet::EMPTY, 2).unwrap());
    assert_eq!(clone.for_user(user).shard(), ShardId(2));
    assert_eq!(*clone.for_user(user), "pool-2");
    assert_eq!(clone.version(), 2);
    assert!(!shards.install(start.clone(), BucketSet::EMPTY, 2).unwrap(), "same version");
    assert!(!shards.install(start, BucketSet::EMPTY, 1).unwrap(), "older version");
    assert_eq!(shards.for_user(user).shard(), ShardId(2));
    let unknown = moved.with_shard(ShardId(5)).unwrap().with_range(ShardId(5), 0, 0).unwrap();
    assert_eq!(
        shards.install(unknown, BucketSet::EMPTY, 3).unwrap_err(),
        ShardMapError::NotConfigured { shard: ShardId(5) }
    );
    assert_eq!(shards.version(), 2);
    assert_eq!(shards.iter().count(), 3, "every member, bucketed or not");
}

#[test]
fn moved_buckets_gather_every_change_of_owner_since_the_first_stored_version() {
    let members: Vec<(ShardId, String)> =
        ids(3).into_iter().map(|id| (id, format!("pool-{id}"))).collect();
    let start = ShardMap::even(&ids(2)).unwrap().with_shard(ShardId(2)).unwrap();
    // Version 0 is the configuration's map: its first stored version moves
    // nothing, whatever it routes differently (a map stored before a
    // change to the configuration).
    let shards =
        Shards::build(ShardMap::even(&ids(3)).unwrap(), |id| Ok::<_, ()>(format!("pool-{id}")))
            .unwrap();
    assert!(shards.install(start.clone(), BucketSet::EMPTY, 1).unwrap());
    assert!(shards.snapshot().moved().is_empty());
    let shards = Shards::with_members(members, start.clone(), 1).unwrap();
    assert_eq!(start.moved_from(&start), BucketSet::EMPTY);
    // A move of 0-99 to shard 2, then of 10-19 back: both stay moved.
    let there = start.with_range(ShardId(2), 0, 99).unwrap();
    assert_eq!(there.moved_from(&start), BucketSet::range(0, 99));
    assert!(shards.install(there.clone(), BucketSet::range(0, 99), 2).unwrap());
    let back = there.with_range(ShardId(0), 10, 19).unwrap();
    assert!(shards.install(back.clone(), BucketSet::EMPTY, 3).unwrap());
    assert_eq!(shards.snapshot().moved(), BucketSet::range(0, 99));
    // Versions this process never installed come as history.
    let history = BucketSet::range(700, 701);
    assert!(shards.install_with_history(back, BucketSet::EMPTY, 5, history).unwrap());
    assert_eq!(shards.snapshot().moved(), BucketSet::range(0, 99).union(history));
    assert!(!shards.snapshot().moved().contains(500));
}

fn three_members() -> (Shards<String>, ShardMap) {
    let members: Vec<(ShardId, String)> =
        ids(3).into_iter().map(|id| (id, format!("pool-{id}"))).collect();
    let start = ShardMap::even(&ids(2)).unwrap().with_shard(ShardId(2)).unwrap();
    (Shards::with_members(members, start.clone(), 1).unwrap(), start)
}

#[test]
fn a_replica_routes_by_a_version_only_once_no_older_route_is_held() {
    let (shards, start) = three_members();
    let held = shards.for_user(1);
    let snapshot = shards.snapshot();
    assert_eq!(shards.oldest_in_use(), 1);
    assert!(shards.install(start.clone(), BucketSet::EMPTY, 2).unwrap());
    assert!(shards.install(start.clone(), BucketSet::EMPTY, 3).unwrap());
    assert_eq!(shards.version(), 3);
    assert_eq!(shards.oldest_in_use(), 1, "a route taken under version 1 is still held");
    drop(held);
    assert_eq!(shards.oldest_in_use(), 1, "so is a snapshot of version 1");
    drop(snapshot);
    assert_eq!(shards.oldest_in_use(), 3);
    let under_three = shards.for_key("k");
    assert!(shards.install(start, BucketSet::EMPTY, 4).unwrap());
    assert_eq!((under_three.version(), shards.oldest_in_use()), (3, 3));
    drop(under_three);
    assert_eq!(shards.oldest_in_use(), 4);
}

#[tokio::test]
async fn writes_to_a_frozen_bucket_wait_for_the_version_that_ends_the_freeze() {
    let (shards, start) = three_members();
    let user = (1..).find(|u| bucket_of(*u) == 600).unwrap();
    let other = (1..).find(|u| bucket_of(*u) == 100).unwrap();
    let frozen = BucketSet::range(512, 767);
    assert!(shards.install(start.clone(), frozen, 2).unwrap());
    let snapshot = shards.snapshot();
    assert!(snapshot.is_frozen(600) && !snapshot.is_frozen(100));
    assert_eq!(snapshot.frozen(), frozen);
    drop(snapshot);
    // Reads and writes elsewhere go on; the frozen bucket's write waits.
    assert_eq!(shards.route(Key::User(user)).shard(), ShardId(1));
    assert_eq!(shards.writable(Key::User(other)).await.shard(), ShardId(0));
    let waiter = {
        let shards = shards.clone();
        tokio::spawn(async move {
            let routed = shards.writable(Key::User(user)).await;
            (routed.shard(), routed.version())
        })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "a write to a frozen bucket went ahead");
    // A newer version that still freezes it keeps the writer waiting.
    assert!(shards.install(start.clone(), frozen, 3).unwrap());
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    let flipped = start.with_range(ShardId(2), 512, 767).unwrap();
    assert!(shards.install(flipped, BucketSet::EMPTY, 4).unwrap());
    assert_eq!(waiter.await.unwrap(), (ShardId(2), 4));
}

#[tokio::test]
async fn writes_wait_while_the_lease_is_lapsed_and_go_on_once_it_is_renewed() {
    let (shards, _) = three_members();
    let user = 42;
    // No lease kept: writes go on (a tool that never reports).
    assert!(!shards.lease_lapsed());
    assert!(shards.try_writable(Key::User(user)).is_some());
    // A lease that ran out holds writes back, not reads.
    shards.renew_lease(Instant::now());
    assert!(shards.lease_lapsed());
    assert!(shards.try_writable(Key::User(user)).is_none());
    assert_eq!(shards.route(Key::User(user)).shard(), shards.map().shard_for_user(user));
    let waiter = {
        let shards = shards.clone();
        tokio::spawn(async move { shards.writable(Key::User(user)).await.shard() })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "a write went ahead on a lapsed lease");
    // Renewed: the waiting writer goes on, and so do new ones.
    shards.renew_lease(Instant::now() + std::time::Duration::from_secs(60));
    assert_eq!(waiter.await.unwrap(), shards.map().shard_for_user(user));
    assert!(!shards.lease_lapsed());
    assert!(shards.try_writable(Key::User(user)).is_some());
    // An earlier time given later does not shorten it.
    shards.renew_lease(Instant::now());
    assert!(!shards.lease_lapsed());
}
