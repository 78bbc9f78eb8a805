//! The lease on a message id instance: each process holds a row of
//! `instance_leases` on the first shard of the map (its instance, a random
//! holder token, an expiry in the database's clock) and renews it every
//! [`RENEW_EVERY`]. A process stops issuing ids on its own before the lease
//! can have lapsed in the database ([`LEASE`] minus [`SAFETY_MARGIN`] after
//! the last renewal *began*), so another process that takes the instance
//! afterwards cannot overlap with it. A process that finds its instance taken
//! (it was away for longer than the lease) moves to a free one. With 1,024
//! instances and a lease of two minutes, slots held by crashed processes are
//! never short.

use std::time::{Duration, Instant};

use crate::error::Result;
use notify_domain::Error;
use notify_domain::ids::{INSTANCES, IdGenerator, hostname};
use sqlx::MySqlPool;
use tracing::{info, warn};

/// How long a lease lasts in the database after a renewal.
pub const LEASE: Duration = Duration::from_secs(120);
/// How often a lease is renewed.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How long before the lease's end (counted from when the last renewal
/// began) a process stops issuing ids, for clock-rate differences.
pub const SAFETY_MARGIN: Duration = Duration::from_secs(10);

/// A process's lease on an instance id, renewed in the background.
pub struct InstanceLease {
    pool: MySqlPool,
    holder: String,
    lease: Duration,
}

impl InstanceLease {
    /// Takes a free instance on `pool` for `generator` (`lease`: how long it
    /// lasts without renewal; [`LEASE`] outside tests).
    pub async fn acquire(
        pool: MySqlPool,
        generator: &IdGenerator,
        lease: Duration,
    ) -> Result<Self> {
        let holder =
            format!("{}:{}:{:016x}", hostname(), std::process::id(), rand::random::<u64>());
        let this = Self { pool, holder, lease };
        this.take_free(generator).await?;
        Ok(this)
    }

    /// Renews the lease, or takes a free instance if another process holds
    /// ours now. On an error the generator keeps its instance until the
    /// validity it had runs out.
    pub async fn renew(&self, generator: &IdGenerator) -> Result<()> {
        let began = Instant::now();
        let instance = generator.instance();
        if self.claim(instance).await? {
            generator.hold(instance, self.valid_until(began));
            return Ok(());
        }
        warn!(instance, "message id instance taken by another process, moving to a free one");
        self.take_free(generator).await
    }

    /// Renews every [`RENEW_EVERY`] for as long as `generator` is alive.
    pub fn spawn_renewals(self, generator: &std::sync::Arc<IdGenerator>) {
        let generator = std::sync::Arc::downgrade(generator);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(RENEW_EVERY.min(self.lease / 4));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let Some(generator) = generator.upgrade() else { break };
                // Bounded: a shard that never answers must not stop renewals
                // for good (the next tick tries again on a new connection).
                let renewed =
                    tokio::time::timeout(RENEW_EVERY, self.renew(&generator)).await.unwrap_or_else(
                        |_| Err(Error::Unavailable("lease renewal timed out".into()).into()),
                    );
                if let Err(e) = renewed {
                    metrics::counter!("notify_id_lease_renewals_failed_total").increment(1);
                    warn!(error = %e, "could not renew the message id instance lease");
                }
            }
            self.release().await;
        });
    }

    async fn take_free(&self, generator: &IdGenerator) -> Result<()> {
        for _ in 0..8 {
            let taken: Vec<u16> = sqlx::query_scalar(
                "SELECT instance FROM instance_leases WHERE expires_at >= UTC_TIMESTAMP(3)",
            )
            .fetch_all(&self.pool)
            .await?;
            let free: Vec<u64> = (0..INSTANCES).filter(|i| !taken.contains(&(*i as u16))).collect();
            if free.is_empty() {
                break;
            }
            let instance = free[rand::random_range(0..free.len())];
            let began = Instant::now();
            if self.claim(instance).await? {
                generator.hold(instance, self.valid_until(began));
                info!(instance, "message id instance leased");
                return Ok(());
            }
        }
        Err(Error::Unavailable(
            "message ids: no free instance id (1,024 live processes?)".to_owned(),
        )
        .into())
    }

    /// Takes or renews `instance` if it is free or ours; true if ours now.
    async fn claim(&self, instance: u64) -> Result<bool> {
        // Assignments apply left to right: `expires_at` moves only if the
        // holder is (now) us.
        sqlx::query(
            "INSERT INTO instance_leases (instance, holder, expires_at) \
             VALUES (?, ?, UTC_TIMESTAMP(3) + INTERVAL ? MICROSECOND) \
             ON DUPLICATE KEY UPDATE \
             holder = IF(expires_at < UTC_TIMESTAMP(3), VALUES(holder), holder), \
             expires_at = IF(holder = VALUES(holder), VALUES(expires_at), expires_at)",
        )
        .bind(instance)
        .bind(&self.holder)
        .bind(self.lease.as_micros() as u64)
        .execute(&self.pool)
        .await?;
        let holder: Option<String> =
            sqlx::query_scalar("SELECT holder FROM instance_leases WHERE instance = ?")
                .bind(instance)
                .fetch_optional(&self.pool)
                .await?;
        Ok(holder.as_deref() == Some(self.holder.as_str()))
    }

    fn valid_until(&self, began: Instant) -> Instant {
        began + self.lease.saturating_sub(SAFETY_MARGIN.min(self.lease / 4))
    }

    /// Gives the instance back (best effort: it lapses anyway).
    async fn release(&self) {
        let _ = sqlx::query("DELETE FROM instance_leases WHERE holder = ?")
            .bind(&self.holder)
            .execute(&self.pool)
            .await;
    }
}
