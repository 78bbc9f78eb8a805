//! What an operator looks up (the web console): recent sends of every
//! sender, a send's progress shard by shard, a user's state, a group's
//! state and the shard map with its replicas and bucket move. Each is a
//! bounded read: O(shards) queries, never a scan of a send's recipients.

use shard_router::{Key, ShardId};

use crate::context::Context;
use crate::groups::{self, UnreadSummary};
use crate::inbox::{self, Badge};
use crate::send::{self, MessageView, Progress};
use notify_domain::domain::{AudienceKind, MessageId, SendStatus, UserId};
use notify_domain::error::{Error, Result};
use notify_domain::preferences::Preferences;
use notify_store::db::groups::{self as group_store, GroupMessageRow};
use notify_store::db::items::{self, InboxQuery, InboxRow, ItemFilter, View};
use notify_store::db::lookups::{self as store, GroupRow};
use notify_store::db::messages::{self, MessageRow, ShardStats};
use notify_store::shard_map::{self, ReplicaState, StoredMap};
use notify_store::shard_move::{self, Move};

pub use notify_store::db::lookups::SendFilter;

/// Recent sends of every sender, newest first, merged over the home shards
/// (`limit` at most from each, then cut).
pub async fn recent_sends(
    ctx: &Context,
    filter: &SendFilter<'_>,
    before: u64,
    limit: u32,
) -> Result<Vec<MessageView>> {
    send::newest_views(ctx, limit, |pool| store::recent_sends(pool, filter, before, limit)).await
}

/// A send's progress on each shard (its stats rows there), in shard order.
pub async fn progress_by_shard(
    ctx: &Context,
    message_id: MessageId,
) -> Result<Vec<(ShardId, Progress)>> {
    let per_shard = ctx.pools.iter().map(|(shard, pool)| async move {
        let stats = messages::shard_stats(pool, message_id).await?;
        Ok::<_, Error>((shard, Progress::from_stats(&stats)))
    });
    futures::future::try_join_all(per_shard).await
}

/// A send's state for a live view: its status and progress, in total and
/// shard by shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveProgress {
    /// Its status.
    pub status: SendStatus,
    /// Final: completed, cancelled, or recalled from every inbox.
    pub finished: bool,
    /// Summed over the shards.
    pub total: Progress,
    /// Each shard's part, in shard order.
    pub shards: Vec<(ShardId, Progress)>,
}

/// Who reads a send's [`LiveProgress`]: the label `by` of
/// `notify_console_live_reads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveReader {
    /// A live view's poller (one for all the pages open on the send).
    Poller,
    /// A send's page as it is rendered.
    Page,
}

impl LiveReader {
    fn label(self) -> &'static str {
        match self {
            Self::Poller => "poller",
            Self::Page => "page",
        }
    }
}

/// Reads a send's [`LiveProgress`] with exactly one statement per shard
/// (the home shard's also reads the status); `None` if there is no such
/// send. `audience` is the send's (it never changes: read it once).
pub async fn live(
    ctx: &Context,
    message_id: MessageId,
    audience: u8,
    by: LiveReader,
) -> Result<Option<LiveProgress>> {
    let home_shard = ctx.pools.snapshot().of(Key::Message(message_id.get())).0;
    let reads = ctx.pools.iter().map(|(shard, pool)| async move {
        metrics::counter!("notify_console_live_reads_total", "by" => by.label()).increment(1);
        if shard == home_shard {
            let home = store::home_stats(pool, message_id).await?;
            Ok::<_, Error>((shard, home.map(|h| h.stats).unwrap_or_default(), home))
        } else {
            Ok((shard, messages::shard_stats(pool, message_id).await?, None))
        }
    });
    let read = futures::future::try_join_all(reads).await?;
    let Some(home) = read.iter().find_map(|(_, _, home)| *home) else { return Ok(None) };
    let mut sum = ShardStats::default();
    let shards = read
        .iter()
        .map(|(shard, stats, _)| {
            sum.add(stats);
            (*shard, Progress::from_stats(stats).for_audience(audience))
        })
        .collect();
    let status = SendStatus::from_db(home.status)?;
    let mut total = Progress::from_stats(&sum).for_audience(audience);
    if status == SendStatus::Recalled && audience == AudienceKind::AllUsers as u8 {
        total.recalled = total.delivered;
    }
    Ok(Some(LiveProgress { status, finished: home.finished, total, shards }))
}

/// What the console shows of a user.
#[derive(Debug, Clone)]
pub struct UserState {
    /// Both counts and the group total.
    pub badge: Badge,
    /// Per group unread, and the total.
    pub groups: UnreadSummary,
    /// What the user mutes.
    pub preferences: Preferences,
    /// The newest items of the view asked for (as stored: nothing is
    /// materialized by looking), rendered for the user.
    pub items: Vec<InboxRow>,
}

/// Reads a user's badge, groups, preferences and newest items of `view`.
pub async fn user(
    ctx: &Context,
    user_id: UserId,
    view: View,
    before: u64,
    limit: u32,
) -> Result<UserState> {
    let pool = ctx.pools.for_user(user_id.get());
    let query = InboxQuery { before, limit, filter: ItemFilter { view, ..ItemFilter::default() } };
    let (badge, groups, preferences, items) = futures::future::try_join4(
        inbox::badge(ctx, user_id),
        groups::unread(ctx, user_id),
        crate::preferences::get(ctx, user_id),
        async { Ok(items::list(&*pool, user_id.get(), &query).await?) },
    )
    .await?;
    let mut items = items;
    crate::render::rows(&pool, &mut items).await?;
    Ok(UserState { badge, groups, preferences, items })
}

/// What the console shows of a group.
#[derive(Debug, Clone)]
pub struct GroupState {
    /// Its row.
    pub group: GroupRow,
    /// Its newest seq.
    pub max_seq: u64,
    /// Members over every shard.
    pub members: u64,
    /// Its newest messages, newest first.
    pub recent: Vec<GroupMessageRow>,
}

/// Reads a group's row, max seq, member count and newest `limit` messages;
/// `None` for an unknown group.
pub async fn group(ctx: &Context, group_id: u64, limit: u32) -> Result<Option<GroupState>> {
    let home = ctx.pools.for_group(group_id);
    let Some(group) = store::group(&home, group_id).await? else { return Ok(None) };
    let max_seq = group_store::max_seq(&*home, group_id).await?.unwrap_or(0);
    let mut recent = group_store::messages_after(
        &home,
        group_id,
        max_seq.saturating_sub(u64::from(limit)),
        limit,
    )
    .await?;
    recent.reverse();
    crate::render::group_messages(&mut recent, "");
    drop(home);
    let routes = ctx.pools.snapshot();
    let counts = ctx.pools.iter().map(|(shard, pool)| {
        let routes = &routes;
        group_store::count_members(pool, group_id, move |bucket| {
            routes.of_bucket(bucket).0 == shard
        })
    });
    let members = futures::future::try_join_all(counts).await?.into_iter().sum();
    Ok(Some(GroupState { group, max_seq, members, recent }))
}

/// The shard map as stored, every replica's report, and the bucket move
/// under way, if any.
#[derive(Debug, Clone)]
pub struct ShardOverview {
    /// The newest stored version.
    pub map: Option<StoredMap>,
    /// Each replica's reported version.
    pub replicas: Vec<ReplicaState>,
    /// The active (or paused) bucket move.
    pub active_move: Option<Move>,
}

/// Reads the shard overview from the directory shard.
pub async fn shards(ctx: &Context) -> Result<ShardOverview> {
    let directory = shard_map::directory(&ctx.pools)?;
    let map = shard_map::latest(directory).await?;
    let replicas = shard_map::replicas(directory).await?;
    let active_move = shard_move::active(&ctx.pools).await?;
    Ok(ShardOverview { map, replicas, active_move })
}

/// A templated send rendered for one user, as the console shows it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The user's language ('' when not set).
    pub locale: String,
    /// The variant it picks: a translation's tag, or `None` for the default.
    pub variant: Option<String>,
    /// True when the user has an item of the send (their own vars filled
    /// it); false: rendered with the send-wide vars only.
    pub has_item: bool,
    /// The texts.
    pub rendered: notify_domain::template::Rendered,
}

/// Renders a templated send for `user_id` as their inbox shows it: in
/// their language, with their item's vars; `None` for plain content.
pub async fn sample(ctx: &Context, row: &MessageRow, user_id: UserId) -> Result<Option<Sample>> {
    let content = row.content();
    let Some(template) = &content.template else { return Ok(None) };
    let pool = ctx.pools.for_user(user_id.get());
    let (preferences, vars) =
        futures::future::try_join(crate::preferences::get(ctx, user_id), async {
            Ok(items::item_vars(&*pool, user_id.get(), row.message_id).await?)
        })
        .await?;
    let locale = preferences.locale.map(|l| l.as_str().to_owned()).unwrap_or_default();
    let variant = notify_domain::template::fallbacks(&locale)
        .find(|tag| template.translations.contains_key(*tag))
        .map(str::to_owned);
    let own = vars.clone().flatten();
    let rendered =
        crate::render::sample(&content, row.message_id, row.edited_at, &locale, own.as_deref());
    Ok(rendered.map(|rendered| Sample { locale, variant, has_item: vars.is_some(), rendered }))
}
