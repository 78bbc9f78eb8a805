//! One shard's part of a recipients page, and the k-way merge of every
//! shard's part into the page.
//!
//! Each shard answers the recipients it is sure of up to some user id
//! (`complete_to`): past the last chunk read of a run that may have more,
//! past the last user looked up when its lookup budget ran out, past the
//! last row when it filled the page. The page is the merge of every shard's
//! recipients up to the smallest of these, so no recipient is skipped or
//! listed twice across pages, and no shard does more than O(page) work.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use shard_router::{Key, ShardId, Snapshot};
use sqlx::MySqlPool;

use super::{Filter, Recipient, RecipientState, Sent};
use notify_domain::error::Result;
use notify_store::db::chunks::state as chunk;
use notify_store::db::recipients::{self as store, ItemRow};

/// Most recipients a chunk holds (the planner's chunk size).
const CHUNK_USERS: u32 = 500;
/// Item lookups per shard and page, in pages: a sparse filter (unread when
/// almost everyone read, suppressed) returns a shorter page past this.
const LOOKUP_PAGES: usize = 4;

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

    /// Keeps `page_size` entries at most, and says so in `complete_to`.
    fn truncated(mut self, page_size: usize) -> Self {
        if self.entries.len() > page_size {
            self.entries.truncate(page_size);
        }
        if self.entries.len() == page_size
            && let Some(last) = self.entries.last()
        {
            self.complete_to = self.complete_to.min(last.user_id);
        }
        self
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

/// A shard's part from its chunks: per run, the chunks past the cursor, and
/// the items of their delivered users (looked up where the users live now).
pub(super) async fn from_chunks(
    routes: &Snapshot<'_, MySqlPool>,
    pool: &MySqlPool,
    send: &Sent,
    filter: Filter,
    after: u64,
    page_size: u32,
) -> Result<ShardPage> {
    let states = filter.chunk_states(send.recalled);
    let runs = store::runs(pool, send.message_id, &states).await?;
    if runs.is_empty() {
        return Ok(ShardPage::exhausted());
    }
    // The cursor's chunk is read partly: one more than a page needs.
    let per_run = page_size.div_ceil(CHUNK_USERS) + 1;
    let chunks = store::chunks_after(pool, send.message_id, &runs, after, per_run).await?;
    let mut read_per_run: HashMap<(u8, u64), (u32, u64)> = HashMap::new();
    for chunk in &chunks {
        let entry = read_per_run.entry((chunk.state, chunk.batch)).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(chunk.user_ids.last().copied().unwrap_or(0));
    }
    // A run that gave as many chunks as asked may have more past its last.
    let mut complete_to = read_per_run
        .values()
        .filter(|(count, _)| *count >= per_run)
        .map(|(_, last)| *last)
        .min()
        .unwrap_or(u64::MAX);
    let mut candidates: Vec<(u64, u8)> = chunks
        .iter()
        .flat_map(|chunk| chunk.user_ids.iter().map(move |user| (*user, chunk.state)))
        .filter(|(user, _)| *user > after && *user <= complete_to)
        .collect();
    candidates.sort_unstable_by_key(|(user, state)| (*user, rank(*state)));
    candidates.dedup_by_key(|(user, _)| *user);

    let page_size = page_size as usize;
    let needs_items = !send.recalled
        && matches!(filter, Filter::All | Filter::Delivered | Filter::Unread | Filter::Suppressed);
    if !needs_items {
        let entries = candidates
            .into_iter()
            .map(|(user, state)| Recipient::bare(user, send.state_of(state, None)))
            .filter(|recipient| filter.matches(recipient.state))
            .collect();
        return Ok(ShardPage { entries, complete_to }.truncated(page_size));
    }
    let budget = if filter == Filter::All { page_size } else { page_size * LOOKUP_PAGES };
    let mut entries = Vec::new();
    let mut looked = 0;
    for window in candidates.chunks(page_size) {
        if entries.len() >= page_size || looked >= budget {
            // Users up to the last looked up are complete.
            complete_to = complete_to.min(candidates[looked - 1].0);
            break;
        }
        let delivered: Vec<u64> = window
            .iter()
            .filter(|(_, state)| matches!(*state, chunk::DONE | chunk::UNSETTLED))
            .map(|(user, _)| *user)
            .collect();
        let found = items(routes, send, &delivered).await?;
        for (user, state) in window {
            let item = found.get(user);
            let state = send.state_of(*state, item.map(|item| item.is_read));
            if filter.matches(state) {
                entries.push(Recipient {
                    user_id: *user,
                    state,
                    delivered_at: item.map(|item| item.created_at),
                    read_at: item.and_then(|item| item.read_at),
                });
            }
        }
        looked += window.len();
    }
    Ok(ShardPage { entries, complete_to }.truncated(page_size))
}

/// The items of a send that `users` have, looked up on the shards the users
/// live on now (a bucket move carries items, not chunks).
pub(super) async fn items(
    routes: &Snapshot<'_, MySqlPool>,
    send: &Sent,
    users: &[u64],
) -> Result<HashMap<u64, ItemRow>> {
    if users.is_empty() {
        return Ok(HashMap::new());
    }
    let lookups = routes.partition_users(users).into_iter().filter_map(|(shard, users)| {
        let pool = routes.get(shard)?;
        Some(async move { store::items(pool, send.message_id, &users).await })
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
    send: &Sent,
    after: u64,
    page_size: u32,
) -> Result<ShardPage> {
    if send.recalled {
        return Ok(ShardPage::exhausted());
    }
    let rows = store::reads_after(pool, send.message_id, after, page_size).await?;
    let complete_to = full_page_end(rows.len(), page_size, rows.last().map(|r| r.user_id));
    let entries = rows
        .into_iter()
        .filter(|row| row.is_read && routes.of(Key::User(row.user_id)).0 == shard)
        .map(|row| Recipient {
            user_id: row.user_id,
            state: RecipientState::Read,
            delivered_at: row.created_at,
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
    let bound = parts.iter().map(|part| part.complete_to).min().unwrap_or(u64::MAX);
    let mut lists: Vec<std::vec::IntoIter<Recipient>> =
        parts.into_iter().map(|part| part.entries.into_iter()).collect();
    let mut heads = BinaryHeap::new();
    let mut pending: Vec<Option<Recipient>> = Vec::with_capacity(lists.len());
    for (index, list) in lists.iter_mut().enumerate() {
        let head = list.next();
        if let Some(recipient) = &head {
            heads.push(Reverse((recipient.user_id, index)));
        }
        pending.push(head);
    }
    let mut page: Vec<Recipient> = Vec::with_capacity(page_size + 1);
    while let Some(Reverse((user_id, index))) = heads.pop() {
        if user_id > bound || page.len() > page_size {
            break;
        }
        let recipient = pending[index].take().expect("a head for each heap entry");
        if let Some(next) = lists[index].next() {
            heads.push(Reverse((next.user_id, index)));
            pending[index] = Some(next);
        }
        // A user on two shards (a bucket move between two batches) once.
        if page.last().is_none_or(|last| last.user_id != user_id) {
            page.push(recipient);
        }
    }
    if page.len() > page_size {
        page.truncate(page_size);
        let last = page.last().map(|r| r.user_id);
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

    #[test]
    fn a_user_on_two_shards_is_listed_once() {
        let (page, next) = merge(vec![part(&[1, 2], u64::MAX), part(&[2, 3], u64::MAX)], 10);
        assert_eq!(ids(&page), [1, 2, 3]);
        assert_eq!(next, None);
    }
}
