//! Who got a send and who read it, for its sender: a page of recipients in
//! user order merged across shards ([`list`]), and the state of given users
//! ([`status`]). Nothing here scans a send: a page reads, on each shard, the
//! chunks whose user runs reach past the cursor (`idx_chunks_recipients`),
//! or the reads recorded by message, or an announcement's materializations;
//! a delivered user's state comes from what their chunk's apply recorded
//! (when, and whom preferences held back) with the range of reads and
//! erasures among the page's users, or, for a user two chunks delivered to,
//! from a primary-key item lookup. So a page costs O(page) per
//! shard whatever the filter and however few match (a sparse filter returns
//! a shorter page with a token, never a longer scan), beside the index-only
//! read of the chunk entries past the cursor (one per 500 recipients), which
//! a page of a dense filter skips once the send's chunk index is kept in
//! memory ([`crate::context::ChunkIndexes`]: the first page of a started
//! send keeps it). The api and the console call it.

mod page;
mod status;
mod token;

pub use status::status;

use std::borrow::Cow;

use chrono::NaiveDateTime;
use shard_router::ShardId;
use tracing::instrument;

use crate::context::Context;
use crate::send;
use notify_domain::domain::{AudienceKind, MessageId, SendStatus};
use notify_domain::error::{Error, Result};
use notify_store::db::chunks::state as chunk;
use notify_store::db::recipients::{ChunkEnd, ItemRow};

/// Largest page of [`list`], and most users in one [`status`] call.
pub const MAX_PAGE_SIZE: u32 = 1000;
/// The page size of [`list`] when the caller gives none.
pub const DEFAULT_PAGE_SIZE: u32 = 100;

/// Where a send stands for one recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecipientState {
    /// Delivered, not read (or read, then marked unread).
    Unread,
    /// Delivered and read.
    Read,
    /// Not delivered yet.
    Pending,
    /// Its chunk was dead-lettered.
    Failed,
    /// Held back by the user's preferences, or erased.
    Suppressed,
    /// Left undelivered by a cancel (or by a recall before delivery).
    Cancelled,
    /// Taken back by a recall (or about to be).
    Recalled,
    /// Not a recipient of the send ([`status`] only).
    NotARecipient,
}

/// Which recipients [`list`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Filter {
    /// Every recipient.
    All,
    /// Those who got the item, read or not.
    Delivered,
    /// Those who read it.
    Read,
    /// Those who got it and have not read it.
    Unread,
    /// Those whose chunk was dead-lettered.
    Failed,
    /// Those not delivered yet.
    Pending,
    /// Those their preferences held back (or erased).
    Suppressed,
    /// Those it was taken back from.
    Recalled,
    /// Those a cancel left undelivered.
    Cancelled,
}

impl Filter {
    /// A stable code (page tokens).
    fn code(self) -> u8 {
        match self {
            Filter::All => 0,
            Filter::Delivered => 1,
            Filter::Read => 2,
            Filter::Unread => 3,
            Filter::Failed => 4,
            Filter::Pending => 5,
            Filter::Suppressed => 6,
            Filter::Recalled => 7,
            Filter::Cancelled => 8,
        }
    }

    /// True when a recipient in `state` is listed.
    fn matches(self, state: RecipientState) -> bool {
        use RecipientState as S;
        match self {
            Filter::All => true,
            Filter::Delivered => matches!(state, S::Read | S::Unread),
            Filter::Read => state == S::Read,
            Filter::Unread => state == S::Unread,
            Filter::Failed => state == S::Failed,
            Filter::Pending => state == S::Pending,
            Filter::Suppressed => state == S::Suppressed,
            Filter::Recalled => state == S::Recalled,
            Filter::Cancelled => state == S::Cancelled,
        }
    }

    /// The chunk states whose recipients may be listed (the send recalled
    /// or not): a recalled send's delivered chunks are recalled already or
    /// about to be, its pending ones cancelled.
    fn chunk_states(self, recalled: bool) -> Vec<u8> {
        use chunk::*;
        match (self, recalled) {
            (Filter::All, _) => {
                vec![PENDING, DONE, FAILED, CANCELLED, UNSETTLED, RECALLED, RECALL_UNSETTLED]
            }
            (Filter::Delivered | Filter::Unread | Filter::Suppressed | Filter::Read, false) => {
                vec![DONE, UNSETTLED]
            }
            (Filter::Delivered | Filter::Unread | Filter::Suppressed | Filter::Read, true) => {
                Vec::new()
            }
            (Filter::Pending, false) => vec![PENDING],
            (Filter::Pending, true) => Vec::new(),
            (Filter::Failed, _) => vec![FAILED],
            (Filter::Cancelled, false) => vec![CANCELLED],
            (Filter::Cancelled, true) => vec![PENDING, CANCELLED],
            (Filter::Recalled, false) => vec![RECALLED, RECALL_UNSETTLED],
            (Filter::Recalled, true) => vec![DONE, UNSETTLED, RECALLED, RECALL_UNSETTLED],
        }
    }
}

/// One recipient of a send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    /// The user.
    pub user_id: u64,
    /// Where the send stands for them.
    pub state: RecipientState,
    /// When the item was delivered (materialized, for an announcement).
    pub delivered_at: Option<NaiveDateTime>,
    /// When they read it.
    pub read_at: Option<NaiveDateTime>,
}

impl Recipient {
    fn bare(user_id: u64, state: RecipientState) -> Self {
        Self { user_id, state, delivered_at: None, read_at: None }
    }
}

/// A page of [`list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecipientPage {
    /// Recipients in user id order (possibly fewer than the page size while
    /// more follow: see [`list`]).
    pub recipients: Vec<Recipient>,
    /// The token of the next page; empty on the last page.
    pub next_page_token: String,
}

/// What the state of a recipient depends on besides their item.
#[derive(Debug, Clone, Copy)]
struct Sent {
    message_id: MessageId,
    recalled: bool,
}

impl Sent {
    /// The state of a recipient in a chunk in `chunk_state`; `item` is
    /// their item's (read or not) when the chunk is delivered.
    fn state_of(&self, chunk_state: u8, item: Option<bool>) -> RecipientState {
        use RecipientState as S;
        match chunk_state {
            chunk::PENDING if self.recalled => S::Cancelled,
            chunk::PENDING => S::Pending,
            chunk::FAILED => S::Failed,
            chunk::CANCELLED => S::Cancelled,
            chunk::DONE | chunk::UNSETTLED if self.recalled => S::Recalled,
            chunk::DONE | chunk::UNSETTLED => match item {
                Some(true) => S::Read,
                Some(false) => S::Unread,
                None => S::Suppressed,
            },
            _ => S::Recalled,
        }
    }

    /// A recipient in a chunk in `chunk_state`, with their item if they
    /// have one (a recalled send shows no reads).
    fn recipient(&self, user_id: u64, chunk_state: u8, item: Option<&ItemRow>) -> Recipient {
        Recipient {
            user_id,
            state: self.state_of(chunk_state, item.map(|item| item.is_read)),
            delivered_at: item.map(|item| item.created_at),
            read_at: item.and_then(|item| item.read_at).filter(|_| !self.recalled),
        }
    }
}

/// The page size a caller asked for: 0 means [`DEFAULT_PAGE_SIZE`].
pub fn page_size(requested: u32) -> Result<u32> {
    match requested {
        0 => Ok(DEFAULT_PAGE_SIZE),
        size if size > MAX_PAGE_SIZE => {
            Err(Error::invalid("page_size", &format!("is {size}, the limit is {MAX_PAGE_SIZE}")))
        }
        size => Ok(size),
    }
}

/// Lists a send's recipients in `filter` after the page token, in user id
/// order over every shard, up to `page_size` (0: the default). `owner` is
/// the caller's client unless it may see every client's sends; another
/// client's send is NOT_FOUND. A page may hold fewer recipients than asked
/// while more follow (a sparse filter stops after a bounded amount of work
/// on each shard); the token is empty only on the last page. For an
/// announcement the recipients are the users who have it materialized.
#[instrument(skip_all, fields(message_id = %message_id, ?filter))]
pub async fn list(
    ctx: &Context,
    message_id: MessageId,
    owner: Option<&str>,
    filter: Filter,
    page_size: u32,
    page_token: &str,
) -> Result<RecipientPage> {
    let page_size = self::page_size(page_size)?;
    let after = token::decode(page_token, message_id, filter)?;
    let routes = ctx.pools.snapshot();
    // The shard reads start with the send's record, as for a send that is
    // not recalled (the usual case): they are read again when it is, and
    // dropped unread when the send is not the caller's or the filter is
    // answered otherwise (an announcement's).
    let guessed = async {
        let index = PageIndex::kept(ctx, message_id, filter, after).await?;
        let unrecalled = Sent { message_id, recalled: false };
        let parts =
            shard_parts(ctx, &routes, &unrecalled, filter, after, page_size, index.as_ref())
                .await?;
        Ok::<_, Error>((parts, index))
    };
    let (row, (guess, index)) =
        futures::future::try_join(send::fetch_visible(ctx, message_id, owner), guessed).await?;
    let status = row.status()?;
    let send = Sent { message_id, recalled: status == SendStatus::Recalled };
    let announcement = row.audience == AudienceKind::AllUsers as u8;
    let reads_chunks = filter != Filter::Read && !announcement;
    if reads_chunks && index.is_none() && status != SendStatus::NotStarted {
        // Kept for the next pages (and status calls), read beside this
        // call's answer.
        let ctx = ctx.clone();
        tokio::spawn(async move { status::keep_index(&ctx, message_id, 0).await });
    }
    let parts = if announcement && filter != Filter::Read {
        let per_shard = per_shard(page_size, ctx.pools.iter().count());
        let pages = ctx.pools.iter().map(|(shard, pool)| {
            page::materialized(&routes, shard, pool, &send, filter, after, per_shard)
        });
        Parts::Readers(futures::future::try_join_all(pages).await?)
    } else if send.recalled {
        shard_parts(ctx, &routes, &send, filter, after, page_size, index.as_ref()).await?
    } else {
        guess
    };
    let (recipients, next) = match parts {
        Parts::Readers(pages) => page::merge(pages, page_size as usize),
        Parts::Chunks(parts) => {
            page::from_candidates(&routes, ctx.direct.as_deref(), &send, filter, parts, page_size)
                .await?
        }
    };
    Ok(RecipientPage {
        recipients,
        next_page_token: next
            .map(|last| token::encode(message_id, filter, last))
            .unwrap_or_default(),
    })
}

/// How many rows each of `shards` shards is asked for towards a page of
/// readers or materializations. Users spread evenly over shards by hash, so
/// a shard's part of `page_size` users varies around its share by about its
/// square root: a quarter more than the share, and 16, fills the page but
/// for odds of a few in a million (the page then ends at the shard that ran
/// out, with a token). Each row is an item lookup, so asking for twice the
/// share, as before, cost half again as many lookups.
fn per_shard(page_size: u32, shards: usize) -> u32 {
    let share = page_size.div_ceil(shards.max(1) as u32);
    (share + share / 4 + 16).min(page_size)
}

/// Every shard's part of a page before the merge.
enum Parts {
    /// Readers (or an announcement's materializations), items read.
    Readers(Vec<page::ShardPage>),
    /// Recipients from chunks, items still to look up.
    Chunks(Vec<page::ShardCandidates>),
}

/// The send's chunk index as a page reads it: the one kept from an earlier
/// call ([`crate::context::ChunkIndexes`], final once the send started),
/// with the chunks split off others since (read now, only once a bucket
/// moved: nothing else adds chunks to a started send).
struct PageIndex {
    kept: std::sync::Arc<crate::context::ChunkIndex>,
    splits: Vec<(ShardId, Vec<ChunkEnd>)>,
}

impl PageIndex {
    /// The index kept for pages of `filter` after user `after`, if one is
    /// and the filter's pages read chunks (readers come from their own
    /// table).
    async fn kept(
        ctx: &Context,
        message_id: MessageId,
        filter: Filter,
        after: u64,
    ) -> Result<Option<Self>> {
        let Some(low) = after.checked_add(1).filter(|_| filter != Filter::Read) else {
            return Ok(None);
        };
        let Some(kept) = ctx.chunk_indexes.get(message_id.get(), low) else {
            return Ok(None);
        };
        let moves = {
            let routes = ctx.pools.snapshot();
            !routes.moved().union(routes.frozen()).is_empty()
        };
        let splits =
            if moves { status::read_splits(ctx, message_id, low).await? } else { Vec::new() };
        Ok(Some(Self { kept, splits }))
    }

    /// A shard's entries (a chunk split before the index was kept is in
    /// both, once here).
    fn ends_of(&self, shard: ShardId) -> Cow<'_, [ChunkEnd]> {
        let kept = self
            .kept
            .shards
            .iter()
            .find(|(s, _)| *s == shard)
            .map_or(&[][..], |(_, ends)| ends.as_slice());
        let mut splits = self
            .splits
            .iter()
            .filter(|(s, _)| *s == shard)
            .flat_map(|(_, ends)| ends.iter().copied())
            .peekable();
        if splits.peek().is_none() {
            return Cow::Borrowed(kept);
        }
        let mut ends: Vec<ChunkEnd> = kept.iter().copied().chain(splits).collect();
        ends.sort_unstable_by_key(|end| end.chunk_id);
        ends.dedup_by_key(|end| end.chunk_id);
        Cow::Owned(ends)
    }
}

/// Every shard's part of a page of a send (not an announcement, but for the
/// readers, who are recorded alike for both), from the chunk index `index`
/// where one is kept.
async fn shard_parts(
    ctx: &Context,
    routes: &shard_router::Snapshot<'_, sqlx::MySqlPool>,
    send: &Sent,
    filter: Filter,
    after: u64,
    page_size: u32,
    index: Option<&PageIndex>,
) -> Result<Parts> {
    if filter == Filter::Read {
        let per_shard = per_shard(page_size, ctx.pools.iter().count());
        let pages = ctx.pools.iter().map(|(shard, pool)| {
            page::readers(routes, shard, pool, ctx.direct.as_deref(), send, after, per_shard)
        });
        return Ok(Parts::Readers(futures::future::try_join_all(pages).await?));
    }
    let needed = per_shard(page_size, ctx.pools.iter().count()) as usize;
    let parts = ctx.pools.iter().map(|(shard, pool)| {
        let ends = index.map(|index| index.ends_of(shard));
        async move {
            let kept = ends.as_deref().map(|ends| page::KeptEnds { ends, needed });
            let at = page::ShardAt { id: shard, pool, direct: ctx.direct.as_deref() };
            page::from_chunks(at, send, filter, after, page_size, kept).await
        }
    });
    Ok(Parts::Chunks(futures::future::try_join_all(parts).await?))
}
