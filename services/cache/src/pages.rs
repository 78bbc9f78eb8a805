//! Cached inbox pages, under the same protocol as the unread counters (see
//! [`super::badge`]): MySQL is the truth, Redis holds copies that every
//! writer of the user's items invalidates, and a page read before a commit
//! is never stored after it.
//!
//! # Keys
//!
//! One hash per user, `{u:ID}:inbox` (the user's slot), with two fields per
//! page query (filters, cursor and size, see `inbox::page_field`):
//! - `p:QUERY`: the page as `epoch:deadline_ms:payload` (the payload is the
//!   encoded `ListInboxResponse`, served as it is). It reads as a miss
//!   under another announcement epoch (starting or cancelling one changes
//!   every inbox) and from `deadline_ms` on: at most
//!   `inbox.page_cache_ttl_secs` after it was read, and never past the
//!   earliest expiry among its rows (the page changes then).
//! - `l:QUERY`: the lease token of a reader rebuilding that page.
//!
//! Every invalidation of a user's badge (a delivery's, a writer's before and
//! after its commit, a retention run's) deletes the whole hash, leases
//! included, in the same command. A reader therefore stores the page it read
//! from MySQL only if its lease is still there (nothing was invalidated
//! since it took it) and no writer is between "before" and "after commit"
//! (the badge's dirty marker): exactly the badge's rule, per page.
//!
//! The hash lives `inbox.page_cache_ttl_secs` after its last store and holds
//! at most `inbox.page_cache_pages` fields; a store into a full hash starts
//! it over. A lost Redis only causes reads from MySQL.

use redis::{AsyncCommands, Script};
use tracing::instrument;

use super::{Cache, LEASE_MS, cache_error};
use notify_domain::error::Result;

/// Takes a page's lease. KEYS: pages hash. ARGV: query, token, lease ms
/// (the hash's life when it has none yet).
const TAKE_LEASE: &str = r"
redis.call('HSET', KEYS[1], 'l:' .. ARGV[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
";

/// Stores a page only if its lease is still the caller's and no writer is
/// mid-transaction. KEYS: pages hash, the user's dirty marker. ARGV: query,
/// token, `epoch:deadline_ms:payload`, hash life ms, most fields.
const STORE_IF_LEASED: &str = r"
local lease = 'l:' .. ARGV[1]
if redis.call('HGET', KEYS[1], lease) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], lease)
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[5]) then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'p:' .. ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
";

/// The page scripts, loaded once per connection.
#[derive(Clone)]
pub(super) struct Scripts {
    take_lease: Script,
    store_if_leased: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self { take_lease: Script::new(TAKE_LEASE), store_if_leased: Script::new(STORE_IF_LEASED) }
    }
}

/// A stored `epoch:deadline_ms:payload`, as Redis returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedPage {
    stored: Vec<u8>,
    payload_at: usize,
}

impl CachedPage {
    /// Parses a stored value; `None` when it is not one.
    fn parse(stored: Vec<u8>) -> Option<(u64, i64, Self)> {
        let mut colons = stored.iter().enumerate().filter(|(_, b)| **b == b':').map(|(i, _)| i);
        let (first, second) = (colons.next()?, colons.next()?);
        fn number<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
            std::str::from_utf8(bytes).ok()?.parse().ok()
        }
        let epoch: u64 = number(&stored[..first])?;
        let deadline_ms: i64 = number(&stored[first + 1..second])?;
        Some((epoch, deadline_ms, Self { stored, payload_at: second + 1 }))
    }

    /// The page, as the reader that stored it encoded it.
    pub fn payload(&self) -> &[u8] {
        &self.stored[self.payload_at..]
    }
}

/// A page read from MySQL, to store where its lease still holds.
#[derive(Debug, Clone, Copy)]
pub struct PageToStore<'a> {
    /// The user.
    pub user_id: u64,
    /// The page query (`inbox::page_field`).
    pub query: &'a str,
    /// The lease token [`Cache::lease_page`] returned.
    pub token: u64,
    /// The announcement epoch the page was read under.
    pub epoch: u64,
    /// When the page stops being served (unix ms).
    pub deadline_ms: i64,
    /// The page, as the reader encoded it.
    pub payload: &'a [u8],
    /// How long the user's hash lives after this store.
    pub ttl_ms: u64,
    /// Most fields (pages and leases) the user's hash may hold.
    pub max_fields: u32,
}

impl Cache {
    /// The page cached for `query` under `epoch` and fresh at `now_ms`, if
    /// any (one `HGET`).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_page(
        &self,
        user_id: u64,
        query: &str,
        epoch: u64,
        now_ms: i64,
    ) -> Result<Option<CachedPage>> {
        let mut conn = self.conn.clone();
        let key = self.keys.inbox_pages(user_id);
        let stored: Option<Vec<u8>> =
            conn.hget(key, format!("p:{query}")).await.map_err(cache_error)?;
        Ok(stored.and_then(CachedPage::parse).and_then(|(at, deadline_ms, page)| {
            (at == epoch && deadline_ms > now_ms).then_some(page)
        }))
    }

    /// Takes the lease of a page about to be read from MySQL; returns its
    /// token, for [`Self::store_page`].
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn lease_page(&self, user_id: u64, query: &str) -> Result<u64> {
        let token = rand::random::<u64>() | 1;
        let mut conn = self.conn.clone();
        self.pages
            .take_lease
            .key(self.keys.inbox_pages(user_id))
            .arg(query)
            .arg(token)
            .arg(LEASE_MS)
            .invoke_async::<i64>(&mut conn)
            .await
            .map_err(cache_error)?;
        Ok(token)
    }

    /// Stores a page read from MySQL if its lease still holds and no writer
    /// of the user is mid-transaction; returns whether it was stored.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn store_page(&self, page: &PageToStore<'_>) -> Result<bool> {
        let mut conn = self.conn.clone();
        let stored: i64 = self
            .pages
            .store_if_leased
            .key(self.keys.inbox_pages(page.user_id))
            .key(self.keys.unread_dirty(page.user_id))
            .arg(page.query)
            .arg(page.token)
            .arg(stored_value(page))
            .arg(page.ttl_ms.max(1))
            .arg(page.max_fields.max(1))
            .invoke_async(&mut conn)
            .await
            .map_err(cache_error)?;
        Ok(stored == 1)
    }
}

/// `epoch:deadline_ms:payload`, as stored.
fn stored_value(page: &PageToStore<'_>) -> Vec<u8> {
    let mut value = format!("{}:{}:", page.epoch, page.deadline_ms.max(0)).into_bytes();
    value.extend_from_slice(page.payload);
    value
}

#[cfg(test)]
mod tests {
    use super::CachedPage;

    #[test]
    fn a_stored_page_is_its_epoch_deadline_and_payload() {
        let (epoch, deadline, page) =
            CachedPage::parse(b"7:1700000000000:\x08\x01:\xff".to_vec()).unwrap();
        assert_eq!(
            (epoch, deadline, page.payload()),
            (7, 1_700_000_000_000, &b"\x08\x01:\xff"[..])
        );
        let (_, _, empty) = CachedPage::parse(b"7:0:".to_vec()).unwrap();
        assert!(empty.payload().is_empty());
        for bad in [&b"7"[..], b"7:12", b"x:12:", b"7:y:", b":12:"] {
            assert!(
                CachedPage::parse(bad.to_vec()).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
