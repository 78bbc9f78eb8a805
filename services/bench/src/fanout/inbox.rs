//! `fanout --personalized`, after the send: `ListInbox` pages of 20
//! personalized items against pages of 20 plain ones, in the same run, on
//! the same shards (which hold the send's million items).
//!
//! `--inbox-readers` users above the send's get 20 personalized sends (the
//! send's template, each reader their own vars, a third of them reading
//! `zh-Hant-TW`, a third `de`), as many others 20 plain sends of the same
//! texts rendered. Then one caller reads their first pages, one call at a
//! time, a personalized reader's and a plain reader's in turn (which goes
//! first alternates). The page cache would serve a page built once and hide
//! the render, so the pages are read from an api of their own started with
//! `inbox.page_cache_ttl_secs = 0`: every call reads MySQL and renders.

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{Context as _, ensure};
use hdrhistogram::Histogram;
use notify_proto::v1;
use notify_proto::v1::message_service_client::MessageServiceClient;
use notify_store::db::items::{self, InboxQuery};
use tonic::transport::Channel;

use super::FanoutArgs;
use super::personal::{self, Expected};
use crate::harness::{self, Env, verdict};
use crate::wire::WireChannel;

const LIST_INBOX: &str = "/notify.v1.InboxService/ListInbox";
/// Items a page shows, and sends each reader gets.
const PAGE: u32 = 20;
/// Longest a target p99 may be, as a multiple of the plain page's.
const TARGET_RATIO: f64 = 1.2;

/// What the comparison measured, each pair personalized then plain.
pub(super) struct PageTimes {
    readers: u64,
    locales_secs: f64,
    sends_secs: f64,
    /// `ListInbox` through the api.
    api: [Histogram<u64>; 2],
    /// The store's page query alone.
    sql: [Histogram<u64>; 2],
    /// `notify_core::render::rows` of a personalized page alone (its
    /// templates compiled).
    render: Histogram<u64>,
}

/// Sends the readers their items, then times their first pages.
pub(super) async fn compare(
    env: &mut Env,
    args: &FanoutArgs,
    content: &v1::Content,
) -> anyhow::Result<PageTimes> {
    ensure!(args.inbox_readers > 0 && args.inbox_calls > 0, "--inbox-* flags must be > 0");
    let first = args.recipients + 1;
    let personal_readers: Vec<u64> = (first..first + args.inbox_readers).collect();
    let plain_readers: Vec<u64> =
        (first + args.inbox_readers..first + 2 * args.inbox_readers).collect();
    let all: Vec<u64> = personal_readers.iter().chain(&plain_readers).copied().collect();
    let (_, locales_secs) = personal::seed_locales(&env.settings, &all).await?;

    let expected = Expected::of(content)?;
    // The plain sends show what a reader of the default language reads of
    // the personalized ones: the same texts, rendered once by the sender.
    let rendered = expected.in_locale("", plain_readers[0]);
    let plain = v1::Content {
        title: rendered.title.clone(),
        body: rendered.body.clone(),
        template: None,
        ..content.clone()
    };
    let started = Instant::now();
    let channel = env.channel().await?;
    let mut sends = Vec::new();
    for _ in 0..PAGE {
        let recipients = personal::recipients(&personal_readers);
        let audience = v1::UserAudience { recipients, ..Default::default() };
        sends.push(send(&channel, content.clone(), audience).await?);
        let audience = v1::UserAudience { user_ids: plain_readers.clone(), ..Default::default() };
        sends.push(send(&channel, plain.clone(), audience).await?);
    }
    for id in sends {
        harness::watch_until(&channel, id, 120, "COMPLETED", |m| {
            m.status == v1::MessageStatus::Completed as i32
        })
        .await?;
    }
    let sends_secs = started.elapsed().as_secs_f64();

    let (addr, _) = env
        .start_extra_api_tuned("notify-api-pages", |s| s.inbox.page_cache_ttl_secs = 0, "")
        .await?;
    let wire = WireChannel::connect(&addr).await?;
    // Unmeasured: every reader's page once, checked against the bench's
    // own render (the api's template cache and pools warm meanwhile).
    for user in &personal_readers {
        check_page(&page(&wire, *user).await?, *user, &expected.for_user(*user))?;
    }
    for user in &plain_readers {
        check_page(&page(&wire, *user).await?, *user, &rendered)?;
    }

    let arms = [personal_readers.as_slice(), plain_readers.as_slice()];
    let [personal, plain] =
        interleaved(arms, args.inbox_calls, async |user| Ok(page(&wire, user).await?.items.len()))
            .await?;

    // Where a personalized page's extra time goes: the store's query alone
    // (the api's, on a connection of the bench's, same turns), then the
    // render of a fetched page alone (the api's code, in this process).
    let map = env.settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;
    let pools = harness::shard_pools(&env.settings, 1).await?;
    let pool_of = |user: u64| map.slot_of(map.shard_for_user(user)).map(|slot| &pools[slot]);
    let query = InboxQuery { before: u64::MAX, limit: PAGE + 1, filter: Default::default() };
    let [sql_personal, sql_plain] = interleaved(arms, args.inbox_calls, async |user| {
        let pool = pool_of(user).context("shard slot")?;
        Ok(items::list(pool, user, &query).await?.len().min(PAGE as usize))
    })
    .await?;
    let pool = pool_of(personal_readers[0]).context("shard slot")?;
    let mut fetched = items::list(pool, personal_readers[0], &query).await?;
    fetched.truncate(PAGE as usize);
    // The first render compiles the page's templates (read from the shard
    // once per process), as an api's first page of a send does; the timed
    // ones find them compiled.
    notify_core::render::rows(pool, &mut fetched.clone()).await?;
    let mut render = new_hist()?;
    for _ in 0..args.inbox_calls {
        let mut rows = fetched.clone();
        let started = Instant::now();
        notify_core::render::rows(pool, &mut rows).await?;
        render.saturating_record(micros_since(started));
        ensure!(rows.iter().all(|row| !row.templated), "a row was left unrendered");
    }
    for pool in pools {
        pool.close().await;
    }
    Ok(PageTimes {
        readers: args.inbox_readers,
        locales_secs,
        sends_secs,
        api: [personal, plain],
        sql: [sql_personal, sql_plain],
        render,
    })
}

fn new_hist() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

fn micros_since(started: Instant) -> u64 {
    (started.elapsed().as_nanos() as u64 / 1000).max(1)
}

/// Times `calls` rounds of `read`, each a reader of each arm (round `i`
/// the `i`th reader, cycling), in turn, which arm first alternating;
/// `read` returns the items it got, which must be a page. Returns each
/// arm's latencies in microseconds.
async fn interleaved(
    arms: [&[u64]; 2],
    calls: u64,
    mut read: impl AsyncFnMut(u64) -> anyhow::Result<usize>,
) -> anyhow::Result<[Histogram<u64>; 2]> {
    let mut hists = [new_hist()?, new_hist()?];
    for call in 0..calls as usize {
        let order = if call % 2 == 0 { [0, 1] } else { [1, 0] };
        for arm in order {
            let user = arms[arm][call % arms[arm].len()];
            let started = Instant::now();
            let items = read(user).await?;
            hists[arm].saturating_record(micros_since(started));
            ensure!(items == PAGE as usize, "user {user}: a page of {items} items");
        }
    }
    Ok(hists)
}

/// Sends `content` to `audience` (`SendMessage`); returns its id.
async fn send(
    channel: &Channel,
    content: v1::Content,
    audience: v1::UserAudience,
) -> anyhow::Result<u64> {
    let reply = MessageServiceClient::new(channel.clone())
        .send_message(v1::SendMessageRequest {
            sender: "notify-bench".into(),
            content: Some(content),
            audience: Some(v1::send_message_request::Audience::Users(audience)),
            ..Default::default()
        })
        .await
        .context("SendMessage")?;
    Ok(reply.into_inner().message_id)
}

/// `user`'s first page of [`PAGE`] items.
async fn page(wire: &WireChannel, user: u64) -> anyhow::Result<v1::ListInboxResponse> {
    let request = v1::ListInboxRequest { user_id: user, page_size: PAGE, ..Default::default() };
    wire.unary(LIST_INBOX, &request).await
}

/// Fails unless every item of `reply` shows `expected`'s title and body.
fn check_page(
    reply: &v1::ListInboxResponse,
    user: u64,
    expected: &notify_domain::template::Rendered,
) -> anyhow::Result<()> {
    ensure!(
        reply.items.len() == PAGE as usize,
        "user {user}: a page of {} items",
        reply.items.len()
    );
    for item in &reply.items {
        let content = item.content.as_ref().context("an item without content")?;
        ensure!(
            content.title == expected.title && content.body == expected.body,
            "user {user} reads {:?} / {:?}, expected {:?} / {:?}",
            content.title,
            content.body,
            expected.title,
            expected.body
        );
    }
    Ok(())
}

impl PageTimes {
    /// The report's lines.
    pub(super) fn lines(&self) -> String {
        let ms = |hist: &Histogram<u64>, q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
        let pair = |[personal, plain]: &[Histogram<u64>; 2]| {
            format!(
                "personalized p50 {:.3} p99 {:.3} ms | plain p50 {:.3} p99 {:.3} ms",
                ms(personal, 0.5),
                ms(personal, 0.99),
                ms(plain, 0.5),
                ms(plain, 0.99)
            )
        };
        let [personal, plain] = &self.api;
        let ratio = ms(personal, 0.99) / ms(plain, 0.99);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "inbox     ListInbox first page of {PAGE}, one call at a time, interleaved, page cache \
             off: {} | p99 ratio {ratio:.2} (target <= {TARGET_RATIO}: {})",
            pair(&self.api),
            verdict(ratio <= TARGET_RATIO)
        );
        let _ =
            writeln!(s, "          its SQL alone (items::list, same turns): {}", pair(&self.sql));
        let _ = writeln!(
            s,
            "          its render alone (render::rows of a fetched page of {PAGE}): p50 {:.3} p99 \
             {:.3} ms",
            ms(&self.render, 0.5),
            ms(&self.render, 0.99)
        );
        let _ = writeln!(
            s,
            "          {} calls of each kind over {} readers each (every page checked against the \
             bench's render once first); their locales written in {:.2} s, {} sends in {:.2} s",
            personal.len(),
            self.readers,
            self.locales_secs,
            2 * PAGE,
            self.sends_secs
        );
        s
    }
}
