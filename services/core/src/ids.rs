//! Time-ordered 64-bit message ids, unique across every live process.
//!
//! Layout: 41 bits of milliseconds since 2025-01-01, 10 bits of instance id,
//! 12 bits of sequence. Newer messages get larger ids, so "newest first" is
//! "largest id first".
//!
//! The instance id is leased, so two live processes never share one: each
//! process holds a row of `instance_leases` on the first shard of the map
//! (its instance, a random holder token, an expiry in the database's clock)
//! and renews it every [`RENEW_EVERY`]. A process stops issuing ids on its
//! own before the lease can have lapsed in the database ([`LEASE`] minus
//! [`SAFETY_MARGIN`] after the last renewal *began*), so another process
//! that takes the instance afterwards cannot overlap with it. A process that
//! finds its instance taken (it was away for longer than the lease) moves to
//! a free one. With 1,024 instances and a lease of two minutes, slots held by
//! crashed processes are never short.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlx::MySqlPool;
use tracing::{info, warn};

use crate::domain::MessageId;
use crate::error::{Error, Result};

const EPOCH_MS: u64 = 1_735_689_600_000;
/// Bits below the timestamp in an id.
const TIME_SHIFT: u32 = INSTANCE_BITS + SEQUENCE_BITS;
const SEQUENCE_BITS: u32 = 12;
const INSTANCE_BITS: u32 = 10;
const INSTANCES: u64 = 1 << INSTANCE_BITS;

/// The smallest id issued at or after `unix_ms` (milliseconds since 1970):
/// ids are time-ordered, so id ranges are time ranges (retention partitions
/// `message_items` by them).
pub fn first_id_at(unix_ms: u64) -> u64 {
    unix_ms.saturating_sub(EPOCH_MS) << TIME_SHIFT
}

/// How long a lease lasts in the database after a renewal.
pub const LEASE: Duration = Duration::from_secs(120);
/// How often a lease is renewed.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How long before the lease's end (counted from when the last renewal
/// began) a process stops issuing ids, for clock-rate differences.
pub const SAFETY_MARGIN: Duration = Duration::from_secs(10);

/// Generates message ids.
#[derive(Debug)]
pub struct IdGenerator {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last_ms: u64,
    sequence: u64,
    instance: u64,
    /// Until when the instance may be used; `None`: always (a fixed instance).
    valid_until: Option<Instant>,
}

impl IdGenerator {
    /// Creates a generator with a fixed instance id (`0..1024`), for tools
    /// and benches that never share a database with a live process.
    pub fn with_instance(instance: u64) -> Self {
        let state =
            State { last_ms: 0, sequence: 0, instance: instance % INSTANCES, valid_until: None };
        Self { state: Mutex::new(state) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The instance id in use.
    pub fn instance(&self) -> u64 {
        self.lock().instance
    }

    /// Returns the next id; strictly increasing within this generator.
    /// Fails while the instance lease cannot be renewed.
    pub fn next_id(&self) -> Result<MessageId> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(EPOCH_MS)
            .saturating_sub(EPOCH_MS);
        let mut state = self.lock();
        if state.valid_until.is_some_and(|until| Instant::now() >= until) {
            return Err(Error::Unavailable(
                "message ids: this process's instance lease could not be renewed (is the first \
                 shard reachable?)"
                    .to_owned(),
            ));
        }
        let (ms, sequence) = if now > state.last_ms {
            (now, 0)
        } else if state.sequence + 1 < (1 << SEQUENCE_BITS) {
            (state.last_ms, state.sequence + 1)
        } else {
            // Sequence exhausted within a millisecond: borrow the next one.
            (state.last_ms + 1, 0)
        };
        state.last_ms = ms;
        state.sequence = sequence;
        let id = (ms << TIME_SHIFT) | (state.instance << SEQUENCE_BITS);
        Ok(MessageId::from_raw(id | sequence))
    }

    /// Uses `instance` until `until`. On a move to another instance the
    /// next id starts a millisecond later, so ids stay strictly increasing
    /// whatever the new instance's number.
    fn hold(&self, instance: u64, until: Instant) {
        let mut state = self.lock();
        if state.instance != instance {
            state.last_ms += 1;
            state.sequence = 0;
            state.instance = instance;
        }
        state.valid_until = Some(until);
    }
}

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
                let renewed = tokio::time::timeout(RENEW_EVERY, self.renew(&generator))
                    .await
                    .unwrap_or_else(|_| Err(Error::Unavailable("lease renewal timed out".into())));
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
        ))
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

pub(crate) fn hostname() -> String {
    std::env::var("HOSTNAME").unwrap_or_else(|_| "local".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_strictly_increasing_and_non_zero() {
        let generator = IdGenerator::with_instance(7);
        let mut last = 0;
        for _ in 0..20_000 {
            let id = generator.next_id().unwrap().get();
            assert!(id > last);
            assert_eq!((id >> SEQUENCE_BITS) & (INSTANCES - 1), 7);
            last = id;
        }
    }

    #[test]
    fn a_lapsed_lease_issues_no_ids() {
        let generator = IdGenerator::with_instance(3);
        generator.hold(3, Instant::now());
        let err = generator.next_id().unwrap_err();
        assert!(err.to_string().contains("instance lease"), "{err}");
        let before = IdGenerator::with_instance(900);
        let last = before.next_id().unwrap().get();
        before.hold(5, Instant::now() + Duration::from_secs(60));
        let moved = before.next_id().unwrap().get();
        assert_eq!((moved >> SEQUENCE_BITS) & (INSTANCES - 1), 5);
        assert!(moved > last, "an id after moving to a lower instance went backwards");
    }
}
