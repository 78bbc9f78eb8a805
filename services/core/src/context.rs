//! The shared handles every service works with: settings, shard pools, cache,
//! publisher and id generator. Cheap to clone.

use std::sync::Arc;

use crate::cache::Cache;
use crate::db::{self, ShardPools};
use crate::error::Result;
use crate::ids::IdGenerator;
use crate::queue::Publisher;
use crate::settings::Settings;

/// Connected dependencies of a Notify process.
#[derive(Clone)]
pub struct Context {
    /// Validated settings.
    pub settings: Arc<Settings>,
    /// One MySQL pool per shard.
    pub pools: ShardPools,
    /// Redis.
    pub cache: Cache,
    /// RabbitMQ publisher with confirms.
    pub publisher: Arc<Publisher>,
    /// Message id generator.
    pub ids: Arc<IdGenerator>,
}

impl Context {
    /// Connects to every shard, Redis and RabbitMQ; fails with a line naming
    /// the setting of whatever is unreachable.
    pub async fn connect(settings: Settings) -> Result<Self> {
        let pools = db::connect(&settings).await?;
        let cache = Cache::connect(&settings.redis).await?;
        let publisher = Publisher::connect(&settings.rabbitmq).await?;
        Ok(Self {
            settings: Arc::new(settings),
            pools,
            cache,
            publisher: Arc::new(publisher),
            ids: Arc::new(IdGenerator::new()),
        })
    }
}
