//! Per-client limits that hold across api replicas: calls per second,
//! recipients per minute and announcements per hour, each a GCRA bucket in
//! Redis ([`bucket`]).
//!
//! Calls are frequent and cheap, so a replica does not ask Redis for every
//! call: it takes a small lease of tokens at once (a twentieth of a second's
//! worth) and spends them locally for up to [`LEASE_TTL`]. Every token still
//! comes out of the one shared bucket, so replicas together never admit more
//! than the limit; an unspent lease only lets fewer through. One call per
//! client and replica renews the lease while the others wait for it: calls
//! arriving together would otherwise each take a lease, drain the bucket and
//! keep only the last (so a client would get less than its limit, at a Redis
//! call every few calls). A refusal is remembered locally until the bucket
//! refills, so a client hammering a full limit costs Redis nothing.
//!
//! Redis being down lets calls through (the limits protect the platform
//! from a runaway caller; they must not take it down with the cache), counted
//! in `notify_quota_errors_total`; the replica asks again a lease's time later.

pub(crate) mod bucket;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::Cache;
use bucket::Bucket;
use notify_domain::auth::Client;
use notify_domain::error::{Error, Result};

/// How long leased call tokens may be spent.
pub const LEASE_TTL: Duration = Duration::from_millis(250);

const SECOND_US: u64 = 1_000_000;
const MINUTE_US: u64 = 60 * SECOND_US;
const HOUR_US: u64 = 3600 * SECOND_US;

/// A replica's leased call tokens of one client.
#[derive(Debug, Clone, Copy)]
struct Lease {
    remaining: u64,
    until: Instant,
    /// The bucket said no: refuse locally until then.
    refused_until: Option<Instant>,
}

/// The limits of every client, as seen from one replica.
pub struct Quotas {
    cache: Cache,
    /// By client name; hashed with foldhash: looked up on every call.
    leases: Mutex<HashMap<String, Lease, foldhash::fast::RandomState>>,
    /// By client name: held by the one call renewing the client's lease.
    renewals: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Quotas {
    /// Creates the limiter over the shared cache.
    pub fn new(cache: Cache) -> Self {
        Self { cache, leases: Mutex::new(HashMap::default()), renewals: Mutex::new(HashMap::new()) }
    }

    /// Admits one call of `client`, or says when to retry.
    pub async fn admit_call(&self, client: &Client) -> Result<()> {
        let limits = client.limits();
        if limits.requests_per_second == 0 {
            return Ok(());
        }
        if let Some(outcome) = self.spend_lease(client.name(), Instant::now()) {
            return outcome;
        }
        let renewal = self.renewal(client.name());
        let _renewing = renewal.lock().await;
        // The call that renewed before this one may have left a lease.
        let now = Instant::now();
        if let Some(outcome) = self.spend_lease(client.name(), now) {
            return outcome;
        }
        let rate = u64::from(limits.requests_per_second);
        let burst = u64::from(limits.burst.max(1));
        let bucket = Bucket::per(rate, SECOND_US, burst);
        let want = (rate / 20).clamp(1, burst);
        match self.cache.take_tokens(client.name(), "rps", bucket, want, 1).await {
            Ok(taken) if taken.granted > 0 => {
                self.store_lease(client.name(), taken.granted - 1, None, now);
                Ok(())
            }
            Ok(taken) => {
                let retry = Duration::from_micros(taken.retry_after_us);
                self.store_lease(client.name(), 0, Some(now + retry), now);
                Err(exhausted(client, "requests_per_second", limits.requests_per_second, retry))
            }
            Err(e) => {
                cache_error(client, e);
                // Let this client's calls through for a lease's time rather
                // than have each wait for Redis in turn.
                self.store_lease(client.name(), u64::MAX, None, now);
                Ok(())
            }
        }
    }

    /// Admits a send or batch of `recipients` recipients of `client`.
    pub async fn admit_recipients(&self, client: &Client, recipients: u64) -> Result<()> {
        let limit = client.limits().recipients_per_minute;
        if limit == 0 || recipients == 0 {
            return Ok(());
        }
        if recipients > limit {
            return Err(Error::ResourceExhausted {
                reason: format!(
                    "client {} may send to {limit} recipients per minute; this call has \
                     {recipients}: split it into smaller batches",
                    client.name()
                ),
                retry_after: None,
            });
        }
        let bucket = Bucket::per(limit, MINUTE_US, limit);
        self.take_all(client, "recipients_per_minute", limit, bucket, recipients).await
    }

    /// Admits one announcement (a send to all users) of `client`.
    pub async fn admit_announcement(&self, client: &Client) -> Result<()> {
        let limit = u64::from(client.limits().announcements_per_hour);
        if limit == 0 {
            return Ok(());
        }
        let bucket = Bucket::per(limit, HOUR_US, limit);
        self.take_all(client, "announcements_per_hour", limit, bucket, 1).await
    }

    /// Admits one call of end user `user_id` at the edge: `rate` calls per
    /// second over every edge replica, `burst` at once above it. A token
    /// from the shared bucket each call (a user's calls are few; no lease
    /// is kept per user). Redis being down lets the call through, as for
    /// clients.
    pub async fn admit_user(&self, user_id: u64, rate: u32, burst: u32) -> Result<()> {
        if rate == 0 {
            return Ok(());
        }
        let bucket = Bucket::per(u64::from(rate), SECOND_US, u64::from(burst.max(1)));
        let name = format!("user.{user_id}");
        match self.cache.take_tokens(&name, "edge_rps", bucket, 1, 1).await {
            Ok(taken) if taken.granted > 0 => Ok(()),
            Ok(taken) => {
                metrics::counter!("notify_edge_rate_limited_total").increment(1);
                let retry = Duration::from_micros(taken.retry_after_us);
                Err(Error::ResourceExhausted {
                    reason: format!(
                        "over {rate} calls per second (edge.requests_per_second); retry in \
                         {:.2} s",
                        retry.as_secs_f64()
                    ),
                    retry_after: Some(retry),
                })
            }
            Err(e) => {
                metrics::counter!("notify_quota_errors_total").increment(1);
                warn!(error = %e, user_id, "edge rate limit check failed, letting the call through");
                Ok(())
            }
        }
    }

    async fn take_all(
        &self,
        client: &Client,
        limit_name: &'static str,
        limit: u64,
        bucket: Bucket,
        tokens: u64,
    ) -> Result<()> {
        match self.cache.take_tokens(client.name(), limit_name, bucket, tokens, tokens).await {
            Ok(taken) if taken.granted > 0 => Ok(()),
            Ok(taken) => Err(exhausted(
                client,
                limit_name,
                limit,
                Duration::from_micros(taken.retry_after_us),
            )),
            Err(e) => {
                cache_error(client, e);
                Ok(())
            }
        }
    }

    /// Spends a leased token if there is one; `Some` answers the call.
    fn spend_lease(&self, client: &str, now: Instant) -> Option<Result<()>> {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let lease = leases.get_mut(client)?;
        if let Some(until) = lease.refused_until {
            if now < until {
                let retry = until - now;
                return Some(Err(Error::ResourceExhausted {
                    reason: format!("client {client} is over its requests_per_second limit"),
                    retry_after: Some(retry),
                }));
            }
            lease.refused_until = None;
        }
        if lease.remaining > 0 && now < lease.until {
            lease.remaining -= 1;
            return Some(Ok(()));
        }
        None
    }

    fn renewal(&self, client: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut renewals = self.renewals.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(renewal) = renewals.get(client) {
            return renewal.clone();
        }
        renewals.entry(client.to_owned()).or_default().clone()
    }

    fn store_lease(
        &self,
        client: &str,
        remaining: u64,
        refused_until: Option<Instant>,
        now: Instant,
    ) {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        leases
            .insert(client.to_owned(), Lease { remaining, until: now + LEASE_TTL, refused_until });
    }
}

fn exhausted(
    client: &Client,
    limit_name: &'static str,
    limit: impl std::fmt::Display,
    retry: Duration,
) -> Error {
    metrics::counter!(
        "notify_quota_exceeded_total",
        "client" => client.name().to_owned(),
        "limit" => limit_name
    )
    .increment(1);
    Error::ResourceExhausted {
        reason: format!(
            "client {} is over its {limit_name} limit of {limit}; retry in {:.2} s",
            client.name(),
            retry.as_secs_f64()
        ),
        retry_after: Some(retry),
    }
}

fn cache_error(client: &Client, error: Error) {
    metrics::counter!("notify_quota_errors_total").increment(1);
    warn!(error = %error, client = client.name(), "quota check failed, letting the call through");
}
