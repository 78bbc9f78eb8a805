//! Redis, which is only ever a cache: losing all of it loses no data and
//! leaves no count wrong. It holds the message-status cache and send
//! heartbeats, (in [`badge`]) the unread counters that never drift, (in
//! [`pages`]) inbox pages under the same protocol, (in [`groups`]) group seqs
//! and member cursors, the api's near copy of badge keys kept by Redis's
//! client tracking ([`near`]), and the per-client [`quota`] buckets.
//!
//! It depends on `notify-domain` only: it never talks to MySQL (the engine,
//! `notify-core`, counts there and hands the cache what to store) and knows
//! nothing of the wire format (a cached inbox page is bytes the api encoded).
//!
//! # Keys and slots
//!
//! Every key carries one hash tag right after `redis.key_prefix` ([`Keys`]):
//! `{u:ID}` for what belongs to a user (badge, its lease and dirty marker,
//! inbox pages, group cursors), `{g:ID}` for a group's seq, `{m:ID}` for a
//! send's status and heartbeat, `{ann}` for the announcement epoch and list,
//! and the client for quota buckets. Every script declares its keys and touches one tag, so
//! it runs on a Redis Cluster (`redis.cluster = true`) as on one node.
//! Operations over many users go per slot ([`Cache::by_slot`]): on a
//! cluster each slot's share is one command and the shares run
//! concurrently; a single node has no slots, so it takes them all at once.
//! Badge invalidation, which a worker runs on every chunk group, keeps at
//! most 1,000 users' keys in flight instead ([`waves`]), so that groups
//! applied together do not each hold their whole `DEL` at the same time.

mod badge;
mod coalesce;
mod groups;
mod near;
mod pages;
pub mod quota;
mod values;

pub use badge::RebuiltCount;
pub use pages::{CachedPage, PageToStore};
pub use values::{CachedCounts, CachedGroup, CachedUserState, Counts};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};
use tracing::instrument;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{
    AsyncCommands, Cmd, IntoConnectionInfo, Pipeline, ProtocolVersion, RedisFuture, Script, Value,
};
use secrecy::ExposeSecret;

use notify_domain::error::{Error, Result};
use notify_domain::settings::RedisSettings;

/// A Redis error as callers see it: [`Error::Cache`], which is transient
/// (Redis is only a cache, and a call may run again once it answers). Every
/// Redis error leaves this crate through here.
pub(crate) fn cache_error(error: redis::RedisError) -> Error {
    Error::Cache(error.to_string())
}

/// How long a rebuild may take before its lease lapses.
const LEASE_MS: u64 = 5_000;
/// How long a writer's dirty marker stops caching, if the writer dies. Longer
/// than InnoDB's default lock wait (50 s), so a slow transaction is covered.
const DIRTY_MS: u64 = 90_000;

/// Stores `version:status` unless the cache already holds an equal or newer
/// version. KEYS: status key. ARGV: version, status, ttl secs.
const WRITE_STATUS_IF_NEWER: &str = r"
local current = redis.call('GET', KEYS[1])
if current then
  local version = tonumber(string.match(current, '^(%d+):'))
  if version and version >= tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], 'EX', ARGV[3])
return 1
";

fn tls_certificates(settings: &RedisSettings) -> Result<Option<redis::TlsCertificates>> {
    if settings.tls_ca_file.is_empty() {
        return Ok(None);
    }
    let root_cert = std::fs::read(&settings.tls_ca_file).map_err(|e| {
        Error::Internal(format!("redis.tls_ca_file: cannot read {}: {e}", settings.tls_ca_file))
    })?;
    Ok(Some(redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) }))
}

/// Builds a client for `redis.url` (one node); a `rediss://` url verifies
/// the server against `redis.tls_ca_file` when set (else the system roots).
/// (`protocol` overrides the url's RESP version: the near cache needs RESP3).
fn client(settings: &RedisSettings, protocol: Option<ProtocolVersion>) -> Result<redis::Client> {
    let invalid = |e: redis::RedisError| Error::Internal(format!("redis.url: {e}"));
    let mut info = settings.url.expose_secret().into_connection_info().map_err(invalid)?;
    if let Some(protocol) = protocol {
        let settings = info.redis_settings().clone().set_protocol(protocol);
        info = info.set_redis_settings(settings);
    }
    let client = match tls_certificates(settings)? {
        None => redis::Client::open(info),
        Some(certificates) => redis::Client::build_with_tls(info, certificates),
    };
    client.map_err(invalid)
}

/// Builds a client for the Redis Cluster whose seed nodes `redis.url` lists
/// (comma-separated), with the same TLS rules as [`client`].
fn cluster_client(settings: &RedisSettings) -> Result<redis::cluster::ClusterClient> {
    let seeds: Vec<&str> = settings.url.expose_secret().split(',').map(str::trim).collect();
    let mut builder = redis::cluster::ClusterClientBuilder::new(seeds)
        .connection_timeout(Duration::from_secs(3))
        .response_timeout(Duration::from_secs(3))
        .retries(2);
    if let Some(certificates) = tls_certificates(settings)? {
        builder = builder.certs(certificates);
    }
    builder.build().map_err(|e| Error::Internal(format!("redis.url: {e}")))
}

/// A connection to one Redis node or to a Redis Cluster. Both multiplex
/// every caller over their sockets and reconnect by themselves; clones are
/// cheap handles. A [`Breaker`] in front answers at once while Redis was
/// just found unreachable.
#[derive(Clone)]
pub struct Connection {
    to: Connected,
    breaker: Breaker,
}

#[derive(Clone)]
enum Connected {
    /// One node (or a replicated primary).
    Node(ConnectionManager),
    /// A Redis Cluster: each command goes to the master of its key's slot.
    Cluster(ClusterConnection),
}

impl Connection {
    /// Connects to the node or cluster `redis.url` names, naming the setting
    /// when Redis is unreachable.
    pub async fn open(settings: &RedisSettings) -> Result<Self> {
        let unreachable = |e| Error::Unavailable(format!("redis.url: cannot connect: {e}"));
        let to = if settings.cluster {
            let client = cluster_client(settings)?;
            Connected::Cluster(client.get_async_connection().await.map_err(unreachable)?)
        } else {
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(3)))
                .set_response_timeout(Some(Duration::from_secs(3)))
                .set_number_of_retries(2);
            let client = client(settings, None)?;
            let manager = client.get_connection_manager_with_config(config).await;
            Connected::Node(manager.map_err(unreachable)?)
        };
        Ok(Self { to, breaker: Breaker::default() })
    }

    fn is_cluster(&self) -> bool {
        matches!(self.to, Connected::Cluster(_))
    }
}

/// How long commands are answered at once with an error after one found
/// Redis unreachable. Without it every command of every caller tries the
/// connection again (with the manager's retries, ~0.4 s each), so a write
/// that makes three Redis calls while Redis is away takes over a second.
const BREAKER_OPEN: Duration = Duration::from_millis(500);

/// Fails commands at once for [`BREAKER_OPEN`] after one failed on the
/// connection itself (refused, reset, timed out); the first command after
/// that tries Redis again.
#[derive(Clone, Default)]
struct Breaker {
    /// When the breaker closes again, in ms since [`BREAKER_CLOCK`] (0: closed).
    open_until_ms: Arc<AtomicU64>,
}

static BREAKER_CLOCK: LazyLock<Instant> = LazyLock::new(Instant::now);

impl Breaker {
    fn now_ms() -> u64 {
        BREAKER_CLOCK.elapsed().as_millis() as u64
    }

    fn refuses(&self) -> bool {
        self.open_until_ms.load(Ordering::Relaxed) > Self::now_ms()
    }

    fn observe<T>(&self, result: &redis::RedisResult<T>) {
        match result {
            Err(e) if e.is_io_error() || e.is_connection_refusal() || e.is_timeout() => {
                let until = Self::now_ms() + BREAKER_OPEN.as_millis() as u64;
                self.open_until_ms.store(until, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    fn refusal<T>() -> redis::RedisResult<T> {
        Err(redis::RedisError::from((redis::ErrorKind::Io, "redis was unreachable a moment ago")))
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if self.breaker.refuses() {
            return Box::pin(std::future::ready(Breaker::refusal()));
        }
        let breaker = self.breaker.clone();
        let sent = match &mut self.to {
            Connected::Node(conn) => conn.req_packed_command(cmd),
            Connected::Cluster(conn) => conn.req_packed_command(cmd),
        };
        Box::pin(async move {
            let result = sent.await;
            breaker.observe(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        if self.breaker.refuses() {
            return Box::pin(std::future::ready(Breaker::refusal()));
        }
        let breaker = self.breaker.clone();
        let sent = match &mut self.to {
            Connected::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            Connected::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        };
        Box::pin(async move {
            let result = sent.await;
            breaker.observe(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.to {
            Connected::Node(conn) => conn.get_db(),
            Connected::Cluster(conn) => conn.get_db(),
        }
    }
}

/// What in a Redis server's configuration works against Notify's cache:
/// persistence (a restart reloads counts and pages that writes after the
/// snapshot had invalidated, and serves them until they expire) and a memory
/// limit that refuses writes instead of evicting (mark-reads then fail).
/// Every key but the announcement epoch expires by itself and any of them
/// may be evicted; so may the epoch, which never goes back (see [`badge`]).
fn config_problems(save: &str, appendonly: &str, maxmemory: u64, policy: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !save.trim().is_empty() || appendonly == "yes" {
        problems.push(format!(
            "persistence is on (save \"{save}\", appendonly {appendonly}): a restart reloads \
             badges and inbox pages that later writes had invalidated, and serves them until \
             they expire; run this Redis without persistence (save \"\", appendonly no)"
        ));
    }
    if maxmemory > 0 && policy == "noeviction" {
        problems.push(format!(
            "maxmemory {maxmemory} with maxmemory-policy noeviction: once full, Redis refuses \
             writes and mark-reads fail with UNAVAILABLE; use allkeys-lru or volatile-lru"
        ));
    }
    problems
}

/// The key names, each with its hash tag (see the module docs).
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (validated to hold no braces).
    pub fn new(prefix: &str) -> Self {
        Self { prefix: prefix.to_owned() }
    }

    /// What every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The announcement epoch.
    pub fn epoch(&self) -> String {
        format!("{}{{ann}}:epoch", self.prefix)
    }

    /// What every active-list key starts with (the epoch follows). The
    /// `2`: the lists carry each announcement's category and whether it is
    /// critical (mutes apply to announcements); the lists of replicas from
    /// before, under `active:`, lack them and are never read.
    fn active_list_prefix(&self) -> String {
        format!("{}{{ann}}:active2:", self.prefix)
    }

    /// The active-announcement list cached for `epoch`.
    pub fn active_list(&self, epoch: u64) -> String {
        format!("{}{epoch}", self.active_list_prefix())
    }

    /// A user's cached badge (`epoch:unread:unseen`).
    pub fn unread(&self, user_id: u64) -> String {
        format!("{}{{u:{user_id}}}:unread", self.prefix)
    }

    /// The lease of a reader rebuilding a user's badge.
    pub fn unread_lease(&self, user_id: u64) -> String {
        format!("{}{{u:{user_id}}}:unread:lease", self.prefix)
    }

    /// How many writers are changing a user's badge right now.
    pub fn unread_dirty(&self, user_id: u64) -> String {
        format!("{}{{u:{user_id}}}:unread:dirty", self.prefix)
    }

    /// A user's cached inbox pages and their leases (see [`pages`]).
    pub fn inbox_pages(&self, user_id: u64) -> String {
        format!("{}{{u:{user_id}}}:inbox", self.prefix)
    }

    /// A user's cached group cursors (`group -> last_ack_seq`).
    pub fn memberships(&self, user_id: u64) -> String {
        format!("{}{{u:{user_id}}}:gmem", self.prefix)
    }

    /// The lease of a reader rebuilding a user's cursors.
    pub fn memberships_lease(&self, user_id: u64) -> String {
        format!("{}{{u:{user_id}}}:gmem:lease", self.prefix)
    }

    /// How many writers are changing a user's cursors right now.
    pub fn memberships_dirty(&self, user_id: u64) -> String {
        format!("{}{{u:{user_id}}}:gmem:dirty", self.prefix)
    }

    /// What every group seq key starts with (the group id and
    /// [`Self::GROUP_SEQ_SUFFIX`] follow).
    fn group_seq_prefix(&self) -> String {
        format!("{}{{g:", self.prefix)
    }

    const GROUP_SEQ_SUFFIX: &str = "}:seq";

    /// A group's cached max seq.
    pub fn group_seq(&self, group_id: u64) -> String {
        format!("{}{group_id}{}", self.group_seq_prefix(), Self::GROUP_SEQ_SUFFIX)
    }

    /// A group's seq fill lease: a reader filling the group's seq state
    /// from MySQL caches it only while this holds its token.
    pub fn group_seq_lease(&self, group_id: u64) -> String {
        format!("{}:lease", self.group_seq(group_id))
    }

    /// A send's cached status (`version:status`).
    pub fn status(&self, message_id: u64) -> String {
        format!("{}{{m:{message_id}}}:status", self.prefix)
    }

    /// A send's progress heartbeat.
    pub fn heartbeat(&self, message_id: u64) -> String {
        format!("{}{{m:{message_id}}}:beat", self.prefix)
    }

    /// A client's quota bucket for one limit.
    pub fn quota(&self, client: &str, limit: &str) -> String {
        format!("{}quota:{{{client}}}:{limit}", self.prefix)
    }
}

/// [`Cache::by_slot`], for a cluster or a single node.
fn group_by_slot<T>(
    cluster: bool,
    items: impl IntoIterator<Item = T>,
    most: usize,
    key: impl Fn(&T) -> String,
) -> Vec<Vec<T>> {
    let most = most.max(1);
    let mut groups: Vec<Vec<T>> = Vec::new();
    // The group still filling, per slot.
    let mut open: HashMap<Option<Slot>, usize> = HashMap::new();
    for item in items {
        let slot = cluster.then(|| Slot::for_key(key(&item)));
        match open.get(&slot) {
            Some(&index) if groups[index].len() < most => groups[index].push(item),
            _ => {
                open.insert(slot, groups.len());
                groups.push(vec![item]);
            }
        }
    }
    groups
}

/// Consecutive runs of `groups` holding at most `most` items together (a
/// group larger than that alone), in order: calls to run together, one
/// run after another.
fn waves<T>(groups: Vec<Vec<T>>, most: usize) -> Vec<Vec<Vec<T>>> {
    let mut waves: Vec<Vec<Vec<T>>> = Vec::new();
    let mut held = 0;
    for group in groups {
        match waves.last_mut() {
            Some(wave) if held + group.len() <= most => {
                held += group.len();
                wave.push(group);
            }
            _ => {
                held = group.len();
                waves.push(vec![group]);
            }
        }
    }
    waves
}

/// The Redis cache, with its key names.
#[derive(Clone)]
pub struct Cache {
    conn: Connection,
    keys: Keys,
    write_status_if_newer: Script,
    badge: badge::Scripts,
    pages: pages::Scripts,
    groups: groups::Scripts,
    quota: Script,
    user_state_reads: coalesce::UserStateReads,
    /// This process's coherent copy of badge keys (see [`near`]), when
    /// `redis.near_cache_users` > 0 on a single node.
    near: Option<near::Near>,
}

impl Cache {
    /// Connects, naming the setting when Redis is unreachable.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn connect(settings: &RedisSettings) -> Result<Self> {
        let conn = Connection::open(settings).await?;
        let keys = Keys::new(&settings.key_prefix);
        let groups = groups::Scripts::new();
        let near = near::Near::new(settings, keys.clone())?;
        // The reader task's own handle keeps neither itself nor the near
        // cache's task alive.
        let cache = Self {
            conn,
            keys,
            write_status_if_newer: Script::new(WRITE_STATUS_IF_NEWER),
            badge: badge::Scripts::new(),
            pages: pages::Scripts::new(),
            groups,
            quota: quota::bucket::script(),
            user_state_reads: coalesce::UserStateReads::idle(),
            near: near.as_ref().map(near::Near::unowned),
        };
        Ok(Self { user_state_reads: coalesce::UserStateReads::start(cache.clone()), near, ..cache })
    }

    /// Returns once every invalidation of the near cache for writes made
    /// before the call is applied: for reads that follow a write learned of
    /// elsewhere (an event), which must not answer from before it.
    pub async fn sync_near_cache(&self) {
        if let Some(near) = &self.near {
            near.sync().await;
        }
    }

    /// Drops the near cache's copies of keys this process just wrote.
    fn forget_near(&self, keys: impl IntoIterator<Item = near::Held>) {
        if let Some(near) = &self.near {
            near.forget(keys);
        }
    }

    /// How many users and groups the near cache holds keys of.
    pub fn near_cache_held(&self) -> (usize, usize) {
        self.near.as_ref().map_or((0, 0), near::Near::held)
    }

    /// Returns a connection handle (cheap clone).
    pub fn connection(&self) -> Connection {
        self.conn.clone()
    }

    /// The key names.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// True on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// Sets each lease key to a fresh token for [`LEASE_MS`] (one pipeline
    /// per slot, up to `most` keys each); returns the tokens in `keys`'
    /// order. A rebuild stores what it read only while its token holds.
    pub(crate) async fn take_lease_keys(&self, keys: Vec<String>, most: usize) -> Result<Vec<u64>> {
        let tokens: Vec<u64> = keys.iter().map(|_| rand::random::<u64>() | 1).collect();
        let leases = keys.into_iter().zip(&tokens);
        let pipes = self.by_slot(leases, most, |(key, _)| key.clone()).into_iter().map(|group| {
            let mut pipe = redis::pipe();
            for (key, token) in group {
                let expiry = redis::SetExpiry::PX(LEASE_MS);
                pipe.set_options(key, *token, redis::SetOptions::default().with_expiration(expiry))
                    .ignore();
            }
            let mut conn = self.conn.clone();
            async move { pipe.query_async::<()>(&mut conn).await }
        });
        futures::future::try_join_all(pipes).await.map_err(cache_error)?;
        Ok(tokens)
    }

    /// Splits `items` into groups whose keys (`key(item)`) share a slot, at
    /// most `most` items each, in input order within a group. A single node
    /// has no slots: everything is one group (then cut at `most`).
    pub fn by_slot<T>(
        &self,
        items: impl IntoIterator<Item = T>,
        most: usize,
        key: impl Fn(&T) -> String,
    ) -> Vec<Vec<T>> {
        group_by_slot(self.is_cluster(), items, most, key)
    }

    /// What in the Redis server's configuration works against a cache of
    /// Notify's (see [`config_problems`]), one sentence each. Empty when the
    /// server does not allow `CONFIG GET` (managed services often rename
    /// it). On a cluster, one node answers.
    pub async fn server_config_problems(&self) -> Vec<String> {
        let mut conn = self.conn.clone();
        let mut values = HashMap::new();
        // One name per call: Redis before 7 takes one pattern.
        for name in ["save", "appendonly", "maxmemory", "maxmemory-policy"] {
            let got: redis::RedisResult<HashMap<String, String>> =
                redis::cmd("CONFIG").arg("GET").arg(name).query_async(&mut conn).await;
            match got {
                Ok(got) => values.extend(got),
                Err(e) => {
                    tracing::debug!(error = %e, "CONFIG GET not allowed, configuration unchecked");
                    return Vec::new();
                }
            }
        }
        let value = |name: &str| values.get(name).map_or("", String::as_str);
        config_problems(
            value("save"),
            value("appendonly"),
            value("maxmemory").parse().unwrap_or(0),
            value("maxmemory-policy"),
        )
    }

    /// Records that a send just made progress (a chunk was applied).
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn heartbeat(&self, message_id: u64, ttl_secs: u64) -> Result<()> {
        let mut conn = self.conn.clone();
        conn.set_ex::<_, _, ()>(self.keys.heartbeat(message_id), 1, ttl_secs.max(1))
            .await
            .map_err(cache_error)?;
        Ok(())
    }

    /// Returns true if a send made progress within the heartbeat's TTL.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn has_heartbeat(&self, message_id: u64) -> Result<bool> {
        let mut conn = self.conn.clone();
        conn.exists(self.keys.heartbeat(message_id)).await.map_err(cache_error)
    }

    /// Returns a cached message status.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn cached_status(&self, message_id: u64) -> Result<Option<u8>> {
        let mut conn = self.conn.clone();
        let value: Option<String> =
            conn.get(self.keys.status(message_id)).await.map_err(cache_error)?;
        Ok(value.and_then(|v| v.split_once(':').and_then(|(_, status)| status.parse().ok())))
    }

    /// Caches a status read from MySQL with its version. Versions only move
    /// forward: a late write of an older status is ignored.
    #[instrument(level = "debug", skip_all, fields(db.system = "redis"))]
    pub async fn write_status(
        &self,
        message_id: u64,
        version: u64,
        status: u8,
        ttl_secs: u64,
    ) -> Result<()> {
        let mut conn = self.conn.clone();
        self.write_status_if_newer
            .key(self.keys.status(message_id))
            .arg(version)
            .arg(status)
            .arg(ttl_secs.max(1))
            .invoke_async::<i64>(&mut conn)
            .await
            .map_err(cache_error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_user_group_or_send_is_in_one_slot() {
        let keys = Keys::new("notify:");
        for id in [1, 42, 7_000_000_000, u64::MAX] {
            let user = Slot::for_key(keys.unread(id));
            for key in [
                keys.unread_lease(id),
                keys.unread_dirty(id),
                keys.inbox_pages(id),
                keys.memberships(id),
                keys.memberships_lease(id),
                keys.memberships_dirty(id),
            ] {
                assert_eq!(Slot::for_key(&key), user, "{key}");
            }
            assert_eq!(Slot::for_key(keys.group_seq(id)), Slot::for_key(format!("{{g:{id}}}")));
            assert_eq!(Slot::for_key(keys.status(id)), Slot::for_key(keys.heartbeat(id)));
            assert_eq!(Slot::for_key(keys.active_list(id)), Slot::for_key(keys.epoch()));
        }
        assert_eq!(Slot::for_key(keys.quota("billing", "rps")), Slot::for_key("billing"));
        // Users spread: the tag is the user, not the prefix.
        let slots: std::collections::HashSet<Slot> =
            (1..=100).map(|user| Slot::for_key(keys.unread(user))).collect();
        assert!(slots.len() > 90, "{} slots for 100 users", slots.len());
    }

    #[test]
    fn waves_hold_at_most_the_cap_in_order_and_lose_nothing() {
        let groups = vec![vec![1; 600], vec![2; 300], vec![3; 200], vec![4; 1500], vec![5; 1]];
        let sizes = |waves: &Vec<Vec<Vec<i32>>>| -> Vec<Vec<usize>> {
            waves.iter().map(|wave| wave.iter().map(Vec::len).collect()).collect()
        };
        let cut = waves(groups.clone(), 1000);
        assert_eq!(sizes(&cut), [vec![600, 300], vec![200], vec![1500], vec![1]]);
        assert_eq!(cut.concat(), groups);
        // Groups of one (a cluster's slots): a thousand to a wave.
        let singles: Vec<Vec<u64>> = (0..2500).map(|i| vec![i]).collect();
        let cut = waves(singles, 1000);
        assert_eq!(cut.iter().map(Vec::len).collect::<Vec<_>>(), [1000, 1000, 500]);
        assert!(waves(Vec::<Vec<u8>>::new(), 1000).is_empty());
    }

    #[test]
    fn groups_share_a_slot_keep_input_order_and_respect_the_cap() {
        let keys = Keys::new("t:");
        let users = [1u64, 2, 1, 3, 1, 1, 2];
        let groups = group_by_slot(true, users, 2, |user| keys.unread(*user));
        for group in &groups {
            assert!(group.len() <= 2, "{groups:?}");
            let slot = Slot::for_key(keys.unread(group[0]));
            assert!(group.iter().all(|user| Slot::for_key(keys.unread(*user)) == slot));
        }
        let ones: Vec<&Vec<u64>> = groups.iter().filter(|group| group[0] == 1).collect();
        assert_eq!(ones, [&vec![1, 1], &vec![1, 1]]);
        let mut all: Vec<u64> = groups.concat();
        all.sort_unstable();
        assert_eq!(all, [1, 1, 1, 1, 2, 2, 3]);
        // One node: no slots, one group cut at the cap, in input order.
        let groups = group_by_slot(false, users, 4, |user| keys.unread(*user));
        assert_eq!(groups, [vec![1, 2, 1, 3], vec![1, 1, 2]]);
    }
}
