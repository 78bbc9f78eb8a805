//! `item.read` webhooks, queued from the read feed: reads are recorded in
//! their own transactions (`notify_store::db::read_feed`), and a worker's
//! relay ([`ReadRelay::run_once`], every `webhooks.read_flush_ms`) takes
//! them from each shard a batch at a time and queues one `item.read` job
//! per message and endpoint for up to `webhooks.read_batch_users` readers,
//! then deletes what it queued in the transaction that took it. So a read
//! is queued at least once whatever dies after its commit, and a million
//! reads of one send are about 2,000 calls, never a million.
//!
//! A batch's `webhook-id` derives from its message, its readers and the
//! endpoint's url: a batch queued again after a relay died between queueing
//! and deleting it (the same rows, taken again) reaches the endpoint under
//! the same id.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sqlx::MySqlPool;
use tracing::{debug, warn};

use crate::context::Context;
use crate::webhooks::{Job, endpoints_for, outbox_webhook_id, payload};
use notify_domain::domain::MessageId;
use notify_domain::error::Result;
use notify_domain::settings::WebhookEvent;
use notify_store::db::messages;
use notify_store::db::read_feed::{self, FeedRead};

/// Batches (of `read_batch_users` readers) one take may hold.
const BATCHES_PER_TAKE: usize = 8;

/// Takes from one shard per run at most, so a flood on one shard does not
/// hold the others back (the next run goes on with it).
const TAKES_PER_RUN: usize = 16;

/// Messages whose owner is remembered at most; then the memory starts over.
const OWNERS_REMEMBERED: usize = 10_000;

/// The relay of the read feed, with what it remembers between runs: each
/// message's client when one of its endpoints wants reads.
#[derive(Debug, Default)]
pub struct ReadRelay {
    owners: Mutex<HashMap<u64, Option<String>>>,
}

impl ReadRelay {
    /// A relay that remembers nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues the reads waiting on every shard (up to a bound per shard),
    /// each take within `worker.operation_timeout_secs`, and more than one
    /// per shard only within that time from the run's start; a shard that
    /// does not answer is passed over until the next run. Returns the
    /// batches queued.
    pub async fn run_once(&self, ctx: &Context) -> Result<u64> {
        let limit = Duration::from_secs(ctx.settings.worker.operation_timeout_secs);
        let started = std::time::Instant::now();
        let mut queued = 0;
        for (shard, pool) in ctx.pools.iter() {
            for take in 0..TAKES_PER_RUN {
                // Every shard gets a take; more only while the run is young,
                // so a slow RabbitMQ does not stretch it (and stall the
                // heartbeat) take after take.
                if take > 0 && started.elapsed() > limit {
                    break;
                }
                match tokio::time::timeout(limit, self.relay_take(ctx, pool)).await {
                    Ok(Ok((batches, more))) => {
                        queued += batches;
                        if !more {
                            break;
                        }
                    }
                    Ok(Err(e)) => {
                        warn!(error = %e, shard = %shard, "read feed relay cannot use this shard");
                        break;
                    }
                    Err(_) => {
                        warn!(shard = %shard, "read feed relay gave up on a shard that does not answer");
                        break;
                    }
                }
            }
        }
        if queued > 0 {
            debug!(queued, "queued item.read batches");
        }
        Ok(queued)
    }

    /// One take from `pool`: queues its reads by message, forgets those
    /// queued (and those nobody wants); a message whose batch could not be
    /// queued keeps its rows for the next take. Returns the batches queued
    /// and whether the take was full (more may wait).
    async fn relay_take(&self, ctx: &Context, pool: &MySqlPool) -> Result<(u64, bool)> {
        if !read_feed::any_waiting(pool).await? {
            return Ok((0, false));
        }
        let batch = ctx.settings.webhooks.read_batch_users.max(1);
        let limit = batch * BATCHES_PER_TAKE;
        let mut taken = read_feed::take(pool, u32::try_from(limit).unwrap_or(u32::MAX)).await?;
        let taken_reads = std::mem::take(&mut taken.reads);
        if taken_reads.is_empty() {
            taken.forget(&[]).await?;
            return Ok((0, false));
        }
        let full = taken_reads.len() >= limit;
        let mut done: Vec<&FeedRead> = Vec::with_capacity(taken_reads.len());
        let mut queued = 0;
        let mut failed = false;
        for reads in taken_reads.chunk_by(|a, b| a.message_id == b.message_id) {
            let message_id = reads[0].message_id;
            let client = match self.owner(ctx, message_id).await {
                Ok(Some(client)) => client,
                Ok(None) => {
                    // Nobody wants them (or the send is gone): dropped.
                    done.extend(reads);
                    continue;
                }
                Err(e) => {
                    // Kept for the next take, which asks again.
                    warn!(error = %e, message_id, "could not read the owner of a read message");
                    continue;
                }
            };
            if failed {
                continue;
            }
            let mut all_queued = true;
            for readers in reads.chunks(batch) {
                match queue_batch(ctx, &client, message_id, readers).await {
                    Ok(jobs) => queued += jobs,
                    Err(e) => {
                        warn!(error = %e, message_id, "could not queue item.read, the next run retries");
                        metrics::counter!("notify_webhooks_unqueued_total", "event" => "item.read")
                            .increment(1);
                        all_queued = false;
                        // RabbitMQ is most likely away: the rest waits too.
                        failed = true;
                        break;
                    }
                }
            }
            // A message half queued keeps all its rows: its queued batches
            // go again, under the same ids, with the next take.
            if all_queued {
                done.extend(reads);
            }
        }
        taken.forget(&done).await.map_err(|e| {
            warn!(error = %e, "could not forget queued reads: they are queued again, under the same ids");
            e
        })?;
        metrics::counter!("notify_webhooks_read_batches_total").increment(queued);
        Ok((queued, full && !failed))
    }

    /// The client of a message when one of its endpoints wants reads;
    /// `None` when none does, or the send is gone.
    async fn owner(&self, ctx: &Context, message_id: u64) -> Result<Option<String>> {
        if let Some(owner) = self.remembered().get(&message_id) {
            return Ok(owner.clone());
        }
        let home = ctx.pools.for_message(message_id);
        let row = messages::fetch(&*home, MessageId::from_raw(message_id)).await?;
        drop(home);
        let owner = row.map(|row| row.client).filter(|client| {
            !endpoints_for(&ctx.settings, client, WebhookEvent::ItemRead).is_empty()
        });
        let mut owners = self.remembered();
        if owners.len() >= OWNERS_REMEMBERED {
            owners.clear();
        }
        owners.insert(message_id, owner.clone());
        Ok(owner)
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Option<String>>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Queues one `item.read` job per endpoint of `client` that wants reads,
/// for `readers` of `message_id` (ordered by user). Returns the jobs.
async fn queue_batch(
    ctx: &Context,
    client: &str,
    message_id: u64,
    readers: &[FeedRead],
) -> Result<u64> {
    let urls = endpoints_for(&ctx.settings, client, WebhookEvent::ItemRead);
    let data = serde_json::json!({
        "message_id": message_id.to_string(),
        "user_ids": readers.iter().map(|r| r.user_id.to_string()).collect::<Vec<_>>(),
    });
    // The time of the batch's last read: the same bytes if queued again.
    let last_read = readers.iter().map(|r| r.read_at).max().unwrap_or_default();
    let body = payload(WebhookEvent::ItemRead, data, last_read.and_utc());
    let key = batch_key(message_id, readers);
    for url in &urls {
        let job = Job {
            id: outbox_webhook_id(&key, url),
            client: client.to_owned(),
            url: (*url).to_owned(),
            event: WebhookEvent::ItemRead.name().to_owned(),
            attempt: 1,
            payload: body.clone(),
        };
        ctx.publisher.publish_webhook(&job).await?;
    }
    Ok(urls.len() as u64)
}

/// What a batch's `webhook-id`s derive from: its message and readers.
fn batch_key(message_id: u64, readers: &[FeedRead]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 * (readers.len() + 1));
    key.extend_from_slice(&message_id.to_be_bytes());
    for reader in readers {
        key.extend_from_slice(&reader.user_id.to_be_bytes());
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(message_id: u64, user_id: u64) -> FeedRead {
        FeedRead { message_id, user_id, read_at: chrono::NaiveDateTime::default() }
    }

    #[test]
    fn a_batch_has_one_key_for_its_message_and_readers() {
        let batch = [read(7, 1), read(7, 2)];
        assert_eq!(batch_key(7, &batch), batch_key(7, &[read(7, 1), read(7, 2)]));
        assert_ne!(batch_key(7, &batch), batch_key(7, &[read(7, 1)]));
        assert_ne!(batch_key(7, &batch), batch_key(8, &[read(8, 1), read(8, 2)]));
    }
}
