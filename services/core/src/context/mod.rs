//! The shared handles every service works with: settings, shard pools, cache,
//! publisher and id generator. Cheap to clone.

use std::sync::Arc;
use std::time::Duration;

mod chunk_indexes;
mod holding_sends;
mod outbox;
mod stale_seqs;
mod unreachable_shards;

pub use chunk_indexes::{ChunkIndex, ChunkIndexes};
pub use holding_sends::HoldingSends;
pub use outbox::OutboxCleaner;
pub use stale_seqs::StaleSeqs;
pub use unreachable_shards::{ShardRead, UnreachableShards};

use shard_router::{Key, Routed, ShardId, Snapshot};
use sqlx::MySqlPool;
use tokio::sync::Semaphore;

use crate::queue::Publisher;
use crate::webhooks::anyone_wants;
use notify_cache::Cache;
use notify_domain::error::{Error, Result};
use notify_domain::ids::IdGenerator;
use notify_domain::settings::{Settings, WebhookEvent};
use notify_store::db::{self, ShardPools};
use notify_store::instance_lease::{self, InstanceLease};

/// Connected dependencies of a Notify process.
#[derive(Clone)]
pub struct Context {
    /// Validated settings.
    pub settings: Arc<Settings>,
    /// One MySQL pool per shard.
    pub pools: ShardPools,
    /// Connections per shard for inbox pages and item updates, apart from
    /// the pools (see [`db::direct`]); `None` when
    /// `database.read_connections` is 0.
    pub direct: Option<Arc<db::direct::ShardConnections>>,
    /// Redis.
    pub cache: Cache,
    /// RabbitMQ publisher with confirms.
    pub publisher: Arc<Publisher>,
    /// Message id generator.
    pub ids: Arc<IdGenerator>,
    /// Bounds concurrent calls that hold a connection on one shard while
    /// they write to others (AppendRecipients, group member changes), so
    /// they cannot take every connection of a pool and wait on each other.
    pub cross_shard_permits: Arc<Semaphore>,
    /// Some endpoint asked for `item.read`: reads are recorded for it
    /// ([`notify_store::db::read_feed`]).
    pub read_feed: bool,
    /// Groups whose cached seq state a failed Redis write may have left
    /// behind MySQL, for [`crate::groups::repair_stale_seqs`].
    pub stale_seqs: Arc<StaleSeqs>,
    /// The chunk indexes of started sends, for recipient status calls.
    pub chunk_indexes: Arc<ChunkIndexes>,
    /// Sends whose chunks held recipients back, by shard: how the next
    /// apply checks preferences.
    pub holding_sends: Arc<HoldingSends>,
    /// Deletes the records of published events (the event outbox).
    pub event_outbox: Arc<OutboxCleaner>,
    /// Shards left out of the live announcement list until a probe reads
    /// them again ([`crate::announce::active`]).
    pub unreachable_shards: Arc<UnreachableShards>,
}

impl Context {
    /// The pool of the shard a chunk task names (a task of a shard this
    /// replica's settings do not have is an internal error).
    pub fn task_pool(&self, shard: ShardId) -> Result<&MySqlPool> {
        self.pools
            .get(shard)
            .ok_or_else(|| Error::Internal(format!("task names unknown shard {}", shard.0)))
    }

    /// Routes a write to `key`'s shard by the map in use. While a bucket
    /// move freezes the key's bucket, waits for the version that ends the
    /// freeze, at most `database.freeze_wait_ms`, then fails UNAVAILABLE.
    /// Hold the route until the write is done: the replica reports a newer
    /// version only once no route of an older one is held.
    pub async fn writable(&self, key: Key<'_>) -> Result<Routed<'_, MySqlPool>> {
        Ok(self.writable_snapshot(&[key]).await?.route(key))
    }

    /// Holds the map in use for a write to several keys' shards, once it
    /// freezes none of their buckets (waiting like [`Self::writable`]).
    pub async fn writable_snapshot(&self, keys: &[Key<'_>]) -> Result<Snapshot<'_, MySqlPool>> {
        let buckets: Vec<u32> = keys.iter().map(Key::bucket).collect();
        self.writable_buckets(&buckets).await
    }

    /// Holds the map in use for a write to several users' shards, like
    /// [`Self::writable_snapshot`].
    pub async fn writable_users(&self, user_ids: &[u64]) -> Result<Snapshot<'_, MySqlPool>> {
        let buckets: Vec<u32> = user_ids.iter().map(|id| shard_router::bucket_of(*id)).collect();
        self.writable_buckets(&buckets).await
    }

    async fn writable_buckets(&self, buckets: &[u32]) -> Result<Snapshot<'_, MySqlPool>> {
        if let Some(snapshot) = self.pools.try_writable_snapshot(buckets) {
            return Ok(snapshot);
        }
        metrics::counter!("notify_frozen_writes_total").increment(1);
        let limit = Duration::from_millis(self.settings.database.freeze_wait_ms);
        tokio::time::timeout(limit, self.pools.writable_snapshot(buckets)).await.map_err(|_| {
            if self.pools.lease_lapsed() {
                metrics::counter!("notify_lease_refused_writes_total").increment(1);
                return Error::Unavailable(format!(
                    "this replica has not reached the directory shard for longer than \
                     database.replica_lease_secs ({} s): it may route by an outdated shard \
                     map, so writes wait until it reports again; retry",
                    self.settings.database.replica_lease_secs
                ));
            }
            Error::Unavailable(format!(
                "a bucket of this write is frozen by a shard move for longer than \
                 database.freeze_wait_ms ({} ms); retry",
                limit.as_millis()
            ))
        })
    }

    /// Waits for a [`Self::cross_shard_permits`] permit.
    pub async fn cross_shard_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.cross_shard_permits
            .acquire()
            .await
            .map_err(|_| Error::Unavailable("the api is shutting down".to_owned()))
    }

    /// Connects to every shard, Redis and RabbitMQ; fails with a line naming
    /// the setting of whatever is unreachable.
    pub async fn connect(settings: Settings) -> Result<Self> {
        let pools = db::connect(&settings).await?;
        let pools_for_cleaner = pools.clone();
        notify_store::shard_map::adopt(&settings, &pools).await?;
        let pool_max = settings.database.pool_max as usize;
        let cache = Cache::connect(&settings.redis).await?;
        for problem in cache.server_config_problems().await {
            tracing::warn!(%problem, "redis is configured against its use as notify's cache");
        }
        let publisher = Publisher::connect(&settings).await?;
        let ids = Arc::new(IdGenerator::with_instance(0));
        let (_, first) = pools.iter().next().ok_or_else(|| {
            Error::Internal("database.shards: no shard to lease an id instance on".to_owned())
        })?;
        InstanceLease::acquire(first.clone(), &ids, instance_lease::LEASE)
            .await?
            .spawn_renewals(&ids);
        let direct = db::connect_direct(&settings)?.map(Arc::new);
        if let Some(direct) = &direct {
            direct.spawn_keepalive();
        }
        let settings = Arc::new(settings);
        let publisher = Arc::new(publisher);
        let read_feed = anyone_wants(&settings, WebhookEvent::ItemRead);
        Ok(Self {
            settings,
            direct,
            pools,
            cache,
            publisher,
            ids,
            cross_shard_permits: Arc::new(Semaphore::new((pool_max / 2).max(1))),
            read_feed,
            stale_seqs: Arc::default(),
            holding_sends: Arc::default(),
            chunk_indexes: Arc::default(),
            event_outbox: Arc::new(OutboxCleaner::start(pools_for_cleaner)),
            unreachable_shards: Arc::default(),
        })
    }
}
