//! Token buckets shared by every api replica: GCRA (the generic cell rate
//! algorithm) in one Redis script, keyed by client and limit.
//!
//! A bucket is one key holding its theoretical arrival time (TAT) in µs on
//! Redis's clock (`TIME`), so replicas with skewed clocks agree. Taking `n`
//! tokens moves the TAT `n` emission intervals forward; the bucket is full
//! while TAT <= now and empty once TAT reaches now + burst intervals. The key
//! expires when the bucket would be full again.
//!
//! Keys carry the client in a hash tag (`quota:{billing}:rps`), so each
//! script touches one slot.

use redis::Script;
use tracing::instrument;

use crate::{Cache, cache_error};
use notify_domain::error::Result;

/// Takes between `min` and `want` tokens. KEYS: bucket. ARGV: interval µs,
/// burst, want, min. Returns {granted, retry_after_µs}.
const TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local min = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local available = math.floor((now + burst * interval - tat) / interval)
local grant = math.min(want, available)
if grant < min then
  return {0, math.ceil(tat + (min - burst) * interval - now)}
end
tat = tat + grant * interval
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
return {grant, 0}
";

/// What a take from a bucket got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Tokens granted (0 when fewer than `min` were available).
    pub granted: u64,
    /// When `min` tokens will be available, in µs, if none were granted.
    pub retry_after_us: u64,
}

/// A bucket's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// µs between two tokens.
    pub interval_us: u64,
    /// Tokens it holds when full.
    pub burst: u64,
}

impl Bucket {
    /// A bucket refilling `count` tokens per `period_us`, holding `burst`.
    pub fn per(count: u64, period_us: u64, burst: u64) -> Self {
        Self { interval_us: (period_us / count.max(1)).max(1), burst: burst.max(1) }
    }
}

pub(crate) fn script() -> Script {
    Script::new(TAKE)
}

impl Cache {
    /// Takes between `min` and `want` tokens from a client's bucket.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn take_tokens(
        &self,
        client: &str,
        limit: &str,
        bucket: Bucket,
        want: u64,
        min: u64,
    ) -> Result<Taken> {
        let mut conn = self.conn.clone();
        let (granted, retry_after_us): (u64, u64) = self
            .quota
            .key(self.keys.quota(client, limit))
            .arg(bucket.interval_us)
            .arg(bucket.burst)
            .arg(want)
            .arg(min)
            .invoke_async(&mut conn)
            .await
            .map_err(cache_error)?;
        Ok(Taken { granted, retry_after_us })
    }
}
