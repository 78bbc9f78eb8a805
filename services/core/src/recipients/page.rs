//! One shard's part of a recipients page, the k-way merge of every shard's
//! part into the page, and the item lookups after it.
//!
//! Each shard answers the recipients it is sure of up to some user id
//! (`complete_to`): past the last chunk read of a run that may have more,
//! past the last row when it filled its part. The page is the merge of every
//! shard's recipients up to the smallest of these (then, where the filter
//! depends on the item, cut where the lookup budget ran out), so no
//! recipient is listed twice across pages and none whose state holds is
//! skipped, and no shard does more than O(page) work.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use chrono::NaiveDateTime;
use shard_router::{Key, ShardId, Snapshot};
use sqlx::MySqlPool;

use super::{Filter, Recipient, RecipientState, Sent};
use notify_domain::error::Result;
use notify_store::db::chunks::state as chunk;
use notify_store::db::direct::{self, ShardConnections};
use notify_store::db::recipients::{self as store, ChunkEnd, ItemRow};

/// Most recipients a chunk holds (the planner's chunk size).
const CHUNK_USERS: u32 = 500;
/// Item lookups per shard and page, in pages: a sparse filter (unread when
/// almost everyone read, suppressed) returns a shorter page past this.
const LOOKUP_PAGES: usize = 4;

/// The direct connections of `shard`, if the process has them: a page's
/// statements go on those (given back without sqlx's ping) rather than the
/// pool's ([`direct::read`]).
fn on(direct: Option<&ShardConnections>, shard: ShardId) -> Option<&direct::DirectConnections> {
    direct.and_then(|direct| direct.get(shard))
}

/// A shard's part of a page.
#[derive(Debug, Default)]
pub(super) struct ShardPage {
    /// Its recipients, in user order.
    entries: Vec<Recipient>,
    /// Every recipient of the shard up to this user id is in `entries`
    /// (`u64::MAX`: the shard has no more).
    complete_to: u64,
}

impl ShardPage {
    fn exhausted() -> Self {
        Self { entries: Vec::new(), complete_to: u64::MAX }
    }
}

/// Which chunk wins when a user is in several chunks of a send (batches
/// may repeat a user): a delivered one, then one still to come.
pub(super) fn rank(chunk_state: u8) -> u8 {
    match chunk_state {
        chunk::DONE | chunk::UNSETTLED => 0,
        chunk::PENDING => 1,
        chunk::FAILED => 2,
        chunk::RECALLED | chunk::RECALL_UNSETTLED => 3,
        _ => 4,
    }
}

/// A shard's recipients from its chunks, before their states are settled.
#[derive(Debug, Default)]
pub(super) struct ShardCandidates {
    /// Users past the cursor, in user order.
    users: Vec<Candidate>,
    /// Every recipient of the shard up to this user id is in `users`.
    complete_to: u64,
}

/// A recipient as their chunk says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Candidate {
    user_id: u64,
    /// The state of their chunk.
    chunk_state: u8,
    /// When their chunk was applied and whether they were held back, when
    /// the apply recorded it (`None`: their item says).
    recorded: Option<(NaiveDateTime, bool)>,
}

impl Candidate {
    fn delivered(&self) -> bool {
        matches!(self.chunk_state, chunk::DONE | chunk::UNSETTLED)
    }
}

/// Where a shard's part of a page is read.
#[derive(Clone, Copy)]
pub(super) struct ShardAt<'a> {
    /// The shard.
    pub id: ShardId,
    /// Its pool.
    pub pool: &'a MySqlPool,
    /// Its direct connections, if the process has them.
    pub direct: Option<&'a ShardConnections>,
}

/// A shard's part of the send's chunk index, kept from an earlier call
/// ([`crate::context::ChunkIndexes`]): every chunk's batch and user range,
/// their states as they were then.
pub(super) struct KeptEnds<'a> {
    /// The entries.
    pub ends: &'a [ChunkEnd],
    /// Recipients of the shard a page needs (its share of the page): fewer
    /// in the chunks read from the kept entries sends the part to the
    /// index read of [`store::chunks_after`].
    pub needed: usize,
}

/// A shard's recipients past the cursor from its chunks: per run, the
/// next chunks that start within what the shard can answer completely.
///
/// Which chunks those are comes from the send's chunk index. Read on each
/// page ([`store::chunks_after`]), it costs a range of the index's entries
/// past the cursor in the filter's states: about a third of all of them on
/// the average page (302 entries a shard for a 1M send, 1.8 ms: more than
/// the rest of the page's statements together), and more the longer the
/// send. With the index `kept` (ranges do not change once a send started;
/// the caller adds the chunks split off since), the runs are each batch's
/// chunks in any state, and only the picked chunks are read, in the
/// filter's states; a filter whose states are most chunks' (every state,
/// delivered) goes this way, and a part that holds fewer recipients than
/// its share (chunks in other states in between: a send still delivering)
/// reads the index after all.
pub(super) async fn from_chunks(
    at: ShardAt<'_>,
    send: &Sent,
    filter: Filter,
    after: u64,
    page_size: u32,
    kept: Option<KeptEnds<'_>>,
) -> Result<ShardCandidates> {
    let states = filter.chunk_states(send.recalled);
    // The cursor's chunk is read partly: one more than a page needs.
    let per_run = page_size.div_ceil(CHUNK_USERS) + 1;
    let Some(low) = after.checked_add(1) else {
        return Ok(ShardCandidates { users: Vec::new(), complete_to: u64::MAX });
    };
    if let Some(kept) = kept.filter(|_| states.contains(&chunk::DONE)) {
        // Runs by batch alone: every state's chunks of a batch follow each
        // other in user order.
        let ends = kept
            .ends
            .iter()
            .filter(|end| end.last_user >= low)
            .map(|end| ChunkEnd { state: 0, ..*end })
            .collect();
        let (wanted, complete_to) = store::page_heads(ends, per_run as usize);
        let chunks = direct::read(on(at.direct, at.id), at.pool, |conn, _| {
            Box::pin(store::chunks_in(conn, send.message_id, &states, &wanted, complete_to))
        })
        .await?;
        let part = candidates(chunks, after, complete_to);
        if part.complete_to == u64::MAX || part.users.len() >= kept.needed {
            return Ok(part);
        }
    }
    let (chunks, complete_to) = direct::read(on(at.direct, at.id), at.pool, |conn, _| {
        Box::pin(store::chunks_after(conn, send.message_id, &states, after, per_run))
    })
    .await?;
    Ok(candidates(chunks, after, complete_to))
}

/// The recipients past `after` and up to `complete_to` in `chunks`, one
/// entry per user.
fn candidates(chunks: Vec<store::ChunkUsers>, after: u64, complete_to: u64) -> ShardCandidates {
    let mut users: Vec<Candidate> = chunks
        .iter()
        .flat_map(|chunk| {
            chunk.user_ids.iter().map(move |user| Candidate {
                user_id: *user,
                chunk_state: chunk.state,
                recorded: chunk.applied.as_ref().map(|applied| (applied.at, applied.held(*user))),
            })
        })
        .filter(|c| c.user_id > after && c.user_id <= complete_to)
        .collect();
    // A user in two delivered chunks (two batches) whom one held back and
    // the other delivered to (unmuted in between) has the item: the one
    // that delivered wins.
    let held = |c: &Candidate| c.recorded.is_some_and(|(_, held)| held);
    users.sort_unstable_by_key(|c| (c.user_id, rank(c.chunk_state), held(c)));
    // A user whom two chunks delivered to has the item of whichever apply
    // inserted it first, which the chunks cannot tell (two applies on one
    // shard can run at once): their item is looked up, as every other view
    // of the send shows it. Rare (a user repeated across batches).
    for at in 1..users.len() {
        let (winner, other) = (users[at - 1], users[at]);
        if winner.user_id == other.user_id && other.delivered() && !held(&winner) && !held(&other) {
            users[at - 1].recorded = None;
        }
    }
    users.dedup_by_key(|c| c.user_id);
    ShardCandidates { users, complete_to }
}

/// A page from every shard's chunk candidates: merged in user order up to
/// the least complete shard, then, where the filter depends on more than
/// the chunk, the delivered users' states settled ([`settle`]): a page of
/// users, then, while the page is not full, as many as the yield so far
/// says it lacks, up to [`LOOKUP_PAGES`] pages of item lookups in all
/// (candidates whose chunk recorded its apply need none: all of them, if
/// need be). Returns the page and the user id the next starts after.
pub(super) async fn from_candidates(
    routes: &Snapshot<'_, MySqlPool>,
    direct: Option<&ShardConnections>,
    send: &Sent,
    filter: Filter,
    parts: Vec<ShardCandidates>,
    page_size: u32,
) -> Result<(Vec<Recipient>, Option<u64>)> {
    let page_size = page_size as usize;
    let parts = parts.into_iter().map(|part| (part.users, part.complete_to)).collect();
    let (candidates, end) = merge_by(parts, usize::MAX, |c: &Candidate| c.user_id);
    let needs_more = !send.recalled
        && matches!(filter, Filter::All | Filter::Delivered | Filter::Unread | Filter::Suppressed);
    if !needs_more {
        let entries: Vec<Recipient> = candidates
            .into_iter()
            .map(|c| Recipient::bare(c.user_id, send.state_of(c.chunk_state, None)))
            .filter(|recipient| filter.matches(recipient.state))
            .collect();
        return Ok(cut(entries, page_size, end));
    }
    let lookups_needed = candidates.iter().any(|c| c.delivered() && c.recorded.is_none());
    let budget = if !lookups_needed {
        candidates.len()
    } else if filter == Filter::All {
        page_size
    } else {
        page_size * LOOKUP_PAGES
    };
    let mut entries = Vec::new();
    let mut looked = 0;
    while looked < candidates.len() && looked < budget && entries.len() < page_size {
        // A page's worth first; when that did not fill the page, what it
        // still lacks at the yield so far (twice over, 100 at least): a
        // dense filter's few more, a sparse one's whole budget in one round.
        let take = if looked == 0 {
            page_size
        } else {
            let lacking = page_size - entries.len();
            (lacking * looked * 2 / entries.len().max(1)).max(100).min(budget - looked)
        };
        let window = &candidates[looked..(looked + take).min(candidates.len())];
        let settled = settle(routes, direct, send, window).await?;
        entries.extend(settled.into_iter().filter(|recipient| filter.matches(recipient.state)));
        looked += window.len();
    }
    if looked < candidates.len() && entries.len() <= page_size {
        // Users up to the last settled are complete.
        return Ok((entries, Some(candidates[looked - 1].user_id)));
    }
    Ok(cut(entries, page_size, end))
}

/// The recipients of `window` (in user order, delivered or not) with their
/// states. A delivered one whose chunk recorded its apply is held back
/// (suppressed), or else erased since (suppressed), read (a read recorded by
/// message) or unread, delivered when the chunk was applied: one range read
/// per shard of the reads and erasures in the window's users. The others'
/// items (users two chunks delivered to) are looked up by primary key.
async fn settle(
    routes: &Snapshot<'_, MySqlPool>,
    direct: Option<&ShardConnections>,
    send: &Sent,
    window: &[Candidate],
) -> Result<Vec<Recipient>> {
    let unrecorded: Vec<u64> = window
        .iter()
        .filter(|c| c.delivered() && c.recorded.is_none())
        .map(|c| c.user_id)
        .collect();
    let mut recorded = window.iter().filter(|c| c.delivered() && c.recorded.is_some());
    let range = recorded.next().map(|first| {
        let last = recorded.next_back().unwrap_or(first);
        (first.user_id, last.user_id)
    });
    let (found, marks) = futures::future::try_join(
        items(routes, direct, send, &unrecorded),
        marks(routes, direct, send, range),
    )
    .await?;
    Ok(window
        .iter()
        .map(|c| match c.recorded {
            Some((applied_at, held)) if c.delivered() => {
                // As an item would say: none when held back or erased since,
                // else read or not.
                let mark = marks.get(&c.user_id).copied().unwrap_or_default();
                let item_read = (!held && !mark.erased).then_some(mark.read_at.is_some());
                Recipient {
                    user_id: c.user_id,
                    state: send.state_of(c.chunk_state, item_read),
                    delivered_at: item_read.map(|_| applied_at),
                    read_at: mark.read_at.filter(|_| item_read == Some(true)),
                }
            }
            _ => send.recipient(c.user_id, c.chunk_state, found.get(&c.user_id)),
        })
        .collect())
}

/// What a shard records of a delivered user besides the chunk.
#[derive(Debug, Clone, Copy, Default)]
struct Settled {
    read_at: Option<NaiveDateTime>,
    erased: bool,
}

/// The reads and erasures of users in `range` (inclusive), from every
/// shard, each kept where the map routes its user now.
async fn marks(
    routes: &Snapshot<'_, MySqlPool>,
    direct: Option<&ShardConnections>,
    send: &Sent,
    range: Option<(u64, u64)>,
) -> Result<HashMap<u64, Settled>> {
    let Some((from, to)) = range else {
        return Ok(HashMap::new());
    };
    let reads = routes.iter().map(|(shard, pool)| async move {
        let marks = direct::read(on(direct, shard), pool, |conn, _| {
            Box::pin(store::marks_between(conn, send.message_id, from, to))
        })
        .await?;
        Ok::<_, notify_domain::error::Error>((shard, marks))
    });
    let mut settled: HashMap<u64, Settled> = HashMap::new();
    for (shard, marks) in futures::future::try_join_all(reads).await? {
        for mark in marks {
            if routes.of(Key::User(mark.user_id)).0 != shard {
                continue;
            }
            let entry = settled.entry(mark.user_id).or_default();
            entry.erased |= mark.erased;
            if mark.read_at.is_some() {
                entry.read_at = mark.read_at;
            }
        }
    }
    Ok(settled)
}

/// At most `page_size` entries; the next page starts after the last of a
/// cut page, else at `end`.
fn cut(
    mut entries: Vec<Recipient>,
    page_size: usize,
    end: Option<u64>,
) -> (Vec<Recipient>, Option<u64>) {
    if entries.len() > page_size {
        entries.truncate(page_size);
        let last = entries.last().map(|r| r.user_id);
        return (entries, last);
    }
    (entries, end)
}

/// The items of a send that `users` have, looked up on the shards the users
/// live on now (a bucket move carries items, not chunks).
pub(super) async fn items(
    routes: &Snapshot<'_, MySqlPool>,
    direct: Option<&ShardConnections>,
    send: &Sent,
    users: &[u64],
) -> Result<HashMap<u64, ItemRow>> {
    if users.is_empty() {
        return Ok(HashMap::new());
    }
    let lookups = routes.partition_users(users).into_iter().filter_map(|(shard, users)| {
        let pool = routes.get(shard)?;
        Some(async move {
            direct::read(on(direct, shard), pool, |conn, _| {
                Box::pin(store::items(conn, send.message_id, &users))
            })
            .await
        })
    });
    let found = futures::future::try_join_all(lookups).await?;
    Ok(found.into_iter().flatten().map(|item| (item.user_id, item)).collect())
}

/// A shard's readers (`message_reads`): a range of its primary key, only
/// the rows of users the map routes to this shard (a bucket move leaves
/// copies behind for a while).
pub(super) async fn readers(
    routes: &Snapshot<'_, MySqlPool>,
    shard: ShardId,
    pool: &MySqlPool,
    direct: Option<&ShardConnections>,
    send: &Sent,
    after: u64,
    page_size: u32,
) -> Result<ShardPage> {
    if send.recalled {
        return Ok(ShardPage::exhausted());
    }
    let rows = direct::read(on(direct, shard), pool, |conn, _| {
        Box::pin(store::reads_after(conn, send.message_id, after, page_size))
    })
    .await?;
    let complete_to = full_page_end(rows.len(), page_size, rows.last().map(|r| r.user_id));
    let entries = rows
        .into_iter()
        .filter(|row| routes.of(Key::User(row.user_id)).0 == shard)
        .map(|row| Recipient {
            user_id: row.user_id,
            state: RecipientState::Read,
            delivered_at: row.delivered_at,
            read_at: Some(row.read_at),
        })
        .collect();
    Ok(ShardPage { entries, complete_to })
}

/// A shard's users who have an announcement materialized (read ones come
/// from [`readers`]).
pub(super) async fn materialized(
    routes: &Snapshot<'_, MySqlPool>,
    shard: ShardId,
    pool: &MySqlPool,
    send: &Sent,
    filter: Filter,
    after: u64,
    page_size: u32,
) -> Result<ShardPage> {
    let possible = if send.recalled {
        filter.matches(RecipientState::Recalled)
    } else {
        filter.matches(RecipientState::Read) || filter.matches(RecipientState::Unread)
    };
    if !possible {
        return Ok(ShardPage::exhausted());
    }
    let rows = store::materialized_after(pool, send.message_id, after, page_size).await?;
    let complete_to = full_page_end(rows.len(), page_size, rows.last().map(|r| r.user_id));
    let entries = rows
        .into_iter()
        .filter(|row| routes.of(Key::User(row.user_id)).0 == shard)
        .map(|row| announcement_recipient(send, row))
        .filter(|recipient| filter.matches(recipient.state))
        .collect();
    Ok(ShardPage { entries, complete_to })
}

/// An announcement's recipient as its materialization says.
pub(super) fn announcement_recipient(send: &Sent, row: store::MaterializedRow) -> Recipient {
    let state = match (send.recalled, row.is_read) {
        (true, _) => RecipientState::Recalled,
        (false, true) => RecipientState::Read,
        (false, false) => RecipientState::Unread,
    };
    Recipient {
        user_id: row.user_id,
        state,
        delivered_at: Some(row.materialized_at),
        read_at: if send.recalled { None } else { row.read_at },
    }
}

/// `complete_to` of a key range read with a limit: its last row when it
/// filled the limit, else the end.
fn full_page_end(rows: usize, limit: u32, last: Option<u64>) -> u64 {
    match last {
        Some(last) if rows >= limit as usize => last,
        _ => u64::MAX,
    }
}

/// Merges the shards' parts (each in user order) up to the smallest
/// `complete_to`, one entry per user; returns the page and the user id the
/// next page starts after (`None` on the last page).
pub(super) fn merge(parts: Vec<ShardPage>, page_size: usize) -> (Vec<Recipient>, Option<u64>) {
    let parts = parts.into_iter().map(|part| (part.entries, part.complete_to)).collect();
    merge_by(parts, page_size, |recipient: &Recipient| recipient.user_id)
}

/// A k-way merge of lists in user order, each complete up to its bound:
/// the entries up to the smallest bound, one per user, at most `limit`;
/// and the user id the next page starts after (`None`: nothing follows).
fn merge_by<T>(
    parts: Vec<(Vec<T>, u64)>,
    limit: usize,
    user_of: impl Fn(&T) -> u64,
) -> (Vec<T>, Option<u64>) {
    let bound = parts.iter().map(|(_, complete_to)| *complete_to).min().unwrap_or(u64::MAX);
    let mut lists: Vec<std::vec::IntoIter<T>> =
        parts.into_iter().map(|(entries, _)| entries.into_iter()).collect();
    let mut heads = BinaryHeap::new();
    let mut pending: Vec<Option<T>> = Vec::with_capacity(lists.len());
    for (index, list) in lists.iter_mut().enumerate() {
        let head = list.next();
        if let Some(entry) = &head {
            heads.push(Reverse((user_of(entry), index)));
        }
        pending.push(head);
    }
    let mut page: Vec<T> = Vec::new();
    let mut last_user = None;
    while let Some(Reverse((user_id, index))) = heads.pop() {
        if user_id > bound || page.len() > limit {
            break;
        }
        let entry = pending[index].take().expect("a head for each heap entry");
        if let Some(next) = lists[index].next() {
            heads.push(Reverse((user_of(&next), index)));
            pending[index] = Some(next);
        }
        // A user on two shards (a bucket move between two batches) once.
        if last_user != Some(user_id) {
            last_user = Some(user_id);
            page.push(entry);
        }
    }
    if page.len() > limit {
        page.truncate(limit);
        let last = page.last().map(&user_of);
        return (page, last);
    }
    (page, (bound != u64::MAX).then_some(bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(users: &[u64], complete_to: u64) -> ShardPage {
        ShardPage {
            entries: users.iter().map(|u| Recipient::bare(*u, RecipientState::Unread)).collect(),
            complete_to,
        }
    }

    fn ids(page: &[Recipient]) -> Vec<u64> {
        page.iter().map(|r| r.user_id).collect()
    }

    #[test]
    fn the_merge_stops_at_the_least_complete_shard_and_resumes_there() {
        let (page, next) = merge(vec![part(&[1, 4, 9], u64::MAX), part(&[2, 3, 7], 5)], 10);
        assert_eq!(ids(&page), [1, 2, 3, 4]);
        assert_eq!(next, Some(5));
    }

    #[test]
    fn a_full_page_ends_at_its_last_user_and_the_last_page_has_no_token() {
        let (page, next) = merge(vec![part(&[1, 3, 5], u64::MAX), part(&[2, 4, 6], u64::MAX)], 4);
        assert_eq!(ids(&page), [1, 2, 3, 4]);
        assert_eq!(next, Some(4));
        let (page, next) = merge(vec![part(&[5], u64::MAX), part(&[6], u64::MAX)], 4);
        assert_eq!(ids(&page), [5, 6]);
        assert_eq!(next, None);
    }

    fn chunk(chunk_id: u64, user_ids: &[u64], at_ms: i64, held_back: &[u64]) -> store::ChunkUsers {
        let at = chrono::DateTime::from_timestamp_millis(at_ms).expect("a time").naive_utc();
        store::ChunkUsers {
            chunk_id,
            state: chunk::DONE,
            batch: chunk_id,
            user_ids: user_ids.to_vec(),
            applied: Some(store::Applied { at, held_back: held_back.to_vec() }),
        }
    }

    #[test]
    fn a_user_two_chunks_delivered_to_has_their_item_looked_up() {
        // User 2 is in both batches (delivered twice: which apply wrote the
        // item, only the item says); user 3 was held back by the first and
        // delivered by the second (unmuted in between): that one's time.
        let chunks = vec![chunk(1, &[1, 2, 3], 1_000, &[3]), chunk(2, &[2, 3, 4], 2_000, &[])];
        let part = candidates(chunks, 0, u64::MAX);
        let recorded: Vec<_> = part
            .users
            .iter()
            .map(|c| {
                (c.user_id, c.recorded.map(|(at, held)| (at.and_utc().timestamp_millis(), held)))
            })
            .collect();
        assert_eq!(
            recorded,
            [
                (1, Some((1_000, false))),
                (2, None),
                (3, Some((2_000, false))),
                (4, Some((2_000, false)))
            ]
        );
    }

    #[test]
    fn a_user_on_two_shards_is_listed_once() {
        let (page, next) = merge(vec![part(&[1, 2], u64::MAX), part(&[2, 3], u64::MAX)], 10);
        assert_eq!(ids(&page), [1, 2, 3]);
        assert_eq!(next, None);
    }
}
