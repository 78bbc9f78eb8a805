//! The edge bench's figures and its summary, each target marked `OK` or
//! `MISS`.

use hdrhistogram::Histogram;

use super::EdgeArgs;
use super::commits::PublishGaps;
use super::reads::Calls;
use crate::harness::{thousands, verdict};

/// Streams the targets are stated for: below it, the streams' CPU is
/// judged as projected to it, and the count is not judged.
const TARGET_STREAMS: usize = 50_000;

/// The edge's CPU over one window.
pub struct Rest {
    /// In percent of one core.
    pub percent: f64,
    /// The machine's CPU line over the same window.
    pub line: String,
}

/// What the send's events showed.
pub struct Delivery {
    /// The send.
    pub message_id: u64,
    /// `item_delivered`: once, covered by a resync, twice or more, missing.
    pub tally: [u64; 4],
    /// Streams whose last badge showed 1 unread.
    pub badged: usize,
    /// Commit -> client, ms.
    pub commit: Histogram<u64>,
    /// Commit -> published (the worker), ms.
    pub to_publish: Histogram<u64>,
    /// Published -> client, ms.
    pub from_publish: Histogram<u64>,
    /// The event's `created_at` -> client, ms.
    pub from_created: Histogram<u64>,
    /// The worker's commit -> publish, divided.
    pub gaps: PublishGaps,
    /// Deliveries whose commit time the bench did not see.
    pub without_commit: u64,
    /// The edge's `notify_event_commit_lag_seconds`, said.
    pub routed: String,
    /// The edge's `notify_event_lag_seconds`, said.
    pub received: String,
    /// StartMessage -> every stream's `item_delivered`.
    pub secs: f64,
    /// The edge's CPU over the send.
    pub edge_cpu_secs: f64,
}

/// What the mark-reads' events showed.
pub struct Reading {
    /// `item_updated`: once, covered by a resync, twice or more, missing.
    pub tally: [u64; 4],
    /// Users who marked the item read.
    pub readers: usize,
    /// Of them, those whose last badge showed nothing unread.
    pub unbadged: usize,
    /// Call sent -> `item_updated`, ms.
    pub latency: Histogram<u64>,
    /// The edge's CPU over the calls and their events.
    pub edge_cpu_secs: f64,
    /// The calls.
    pub calls: Calls,
}

/// Everything the summary says.
pub struct Figures {
    /// Streams asked for.
    pub connections: usize,
    /// Streams that opened and got their snapshot.
    pub held: usize,
    /// Of them, those open at the end.
    pub still_open: usize,
    /// Streams that could not open.
    pub failed: u64,
    /// `notify_edge_streams` at rest.
    pub edge_streams: f64,
    /// Time to open them all.
    pub open_secs: f64,
    /// The edge's RSS before the streams, kB.
    pub rss_before: u64,
    /// The edge's RSS with them, at rest, kB.
    pub rss_with: u64,
    /// The edge's sampled peak RSS and VmHWM, kB.
    pub rss_peaks: (u64, u64),
    /// The bench's RSS, kB.
    pub bench_rss: u64,
    /// The edge's CPU with no stream.
    pub idle: Rest,
    /// The edge's CPU with every stream open and quiet.
    pub at_rest: Rest,
    /// Heartbeats received over that window.
    pub heartbeats: u64,
    /// The send's events.
    pub delivery: Delivery,
    /// The mark-reads' events.
    pub reading: Reading,
    /// Events of other kinds or messages.
    pub others: u64,
    /// `resync` events over the held streams.
    pub resyncs: u64,
    /// `notify_edge_resyncs_total` at the end.
    pub edge_resyncs: f64,
}

/// `p50 .. ms, p99 .. ms, max .. ms`.
pub fn quantiles(histogram: &Histogram<u64>) -> String {
    if histogram.is_empty() {
        return "no sample".into();
    }
    format!(
        "p50 {} ms, p99 {} ms, max {} ms",
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.max()
    )
}

/// Events expected once: once, covered by a resync, twice or more, missing.
fn tally(tally: &[u64; 4]) -> String {
    format!(
        "once {}, covered by a resync {}, twice or more {}, missing {}",
        thousands(tally[0]),
        thousands(tally[1]),
        thousands(tally[2]),
        thousands(tally[3])
    )
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// The summary block.
pub fn summary(args: &EdgeArgs, f: &Figures) -> String {
    let judged = f.connections >= TARGET_STREAMS;
    let per_stream_kb = f.rss_with.saturating_sub(f.rss_before) as f64 / f.held as f64;
    // The streams' CPU grows with their number.
    let projected = f.idle.percent
        + (f.at_rest.percent - f.idle.percent).max(0.0) * TARGET_STREAMS as f64 / f.held as f64;
    let judged_cpu = if judged { f.at_rest.percent } else { projected };
    let (d, r) = (&f.delivery, &f.reading);
    let once = |t: &[u64; 4]| t[2] == 0 && t[3] == 0;
    let every_event = once(&d.tally)
        && once(&r.tally)
        && d.badged == f.held
        && r.unbadged == r.readers
        && r.calls.failed == 0;
    let p99 = d.commit.value_at_quantile(0.99);
    let mut out = String::from("\n================ notify-bench edge: summary ================\n");
    out.push_str(&format!(
        "streams held: {} of {} ({}), {} still open at the end, the edge counted {}; opened in \
         {:.1} s, {} failed\n",
        thousands(f.held as u64),
        thousands(f.connections as u64),
        if judged { verdict(f.held >= TARGET_STREAMS) } else { "not judged below 50,000" },
        thousands(f.still_open as u64),
        f.edge_streams,
        f.open_secs,
        thousands(f.failed),
    ));
    out.push_str(&format!(
        "edge rss: {:.1} MB before, {:.1} MB with them: {per_stream_kb:.2} KB a stream ({}, \
         target <= 16 KB); peak {:.1} MB sampled, VmHWM {:.1} MB; the bench {:.0} MB\n",
        mb(f.rss_before),
        mb(f.rss_with),
        verdict(per_stream_kb <= 16.0),
        mb(f.rss_peaks.0),
        mb(f.rss_peaks.1),
        mb(f.bench_rss)
    ));
    out.push_str(&format!(
        "edge cpu at rest ({} s, heartbeats every {} s): {:.2}% of a core{} ({}, target < 5%); \
         with no stream {:.2}%; {} heartbeats received\n",
        args.rest_secs,
        args.heartbeat_secs,
        f.at_rest.percent,
        if judged { String::new() } else { format!(", {projected:.2}% projected to 50,000") },
        verdict(judged_cpu < 5.0),
        f.idle.percent,
        thousands(f.heartbeats)
    ));
    out.push_str(&format!(
        "send to {} users, {} connected: item_delivered {}; badge with 1 unread {} of {}\n\
         \x20 commit -> client {} ({}, target p99 < 250 ms; {} without a commit time)\n\
         \x20 of which commit -> published (the worker) {}, published -> client {}\n\
         \x20 the worker: commit -> a transaction's first publish {}; then each of its up to {} \
         chunks' events waits for the confirm of the one before: {} apart\n\
         \x20 the edge's own histograms (buckets): commit -> routed {}, published -> read from \
         the stream {}\n\
         \x20 the event's created_at (the message's creation) -> client {}\n\
         \x20 every event {:.1} s after StartMessage; edge cpu {:.2} s\n",
        thousands(args.recipients),
        thousands(f.held as u64),
        tally(&d.tally),
        thousands(d.badged as u64),
        thousands(f.held as u64),
        quantiles(&d.commit),
        verdict(!d.commit.is_empty() && p99 < 250),
        thousands(d.without_commit),
        quantiles(&d.to_publish),
        quantiles(&d.from_publish),
        quantiles(&d.gaps.first),
        d.gaps.most_chunks,
        quantiles(&d.gaps.between),
        d.routed,
        d.received,
        quantiles(&d.from_created),
        d.secs,
        d.edge_cpu_secs,
    ));
    let calls = &r.calls;
    out.push_str(&format!(
        "mark-reads: {} calls ({} failed) over {} connections in {:.1} s ({:.0}/s), call p50 \
         {:.1} ms, p99 {:.1} ms; item_updated {}; badge with 0 unread {} of {}\n\
         \x20 call sent -> item_updated {}; edge cpu {:.2} s{}\n",
        thousands(calls.ok + calls.failed),
        thousands(calls.failed),
        args.read_connections,
        calls.secs,
        calls.ok as f64 / calls.secs.max(1e-9),
        calls.latency.value_at_quantile(0.5) as f64 / 1000.0,
        calls.latency.value_at_quantile(0.99) as f64 / 1000.0,
        tally(&r.tally),
        thousands(r.unbadged as u64),
        thousands(r.readers as u64),
        quantiles(&r.latency),
        r.edge_cpu_secs,
        calls.first_failure.as_ref().map(|f| format!("; first failure: {f}")).unwrap_or_default(),
    ));
    out.push_str(&format!(
        "every event delivered once or covered by a resync: {}; other events {}, resyncs {}, \
         edge resyncs counted {}\n",
        verdict(every_event),
        thousands(f.others),
        thousands(f.resyncs),
        f.edge_resyncs,
    ));
    out.push_str("================================================================");
    out
}
