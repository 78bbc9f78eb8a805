//! The webhook dispatcher: one consumer per client with endpoints, on its
//! own channel of the worker's connection, POSTs each job to its endpoint
//! signed as Standard Webhooks says (see `notify_core::webhooks`).
//!
//! Isolation: a client's consumer has a prefetch of
//! `webhooks.concurrency_per_client` and every call a timeout of
//! `webhooks.timeout_ms`, so a slow or dead endpoint holds at most its own
//! client's slots for that long; chunk delivery and the other clients have
//! queues, channels and slots of their own. A job is acknowledged only once
//! it was answered 2xx, or re-queued for a later attempt (published to the
//! retry queue of its delay, confirmed), or dead-lettered after
//! `1 + webhooks.retry_delays_ms.len()` attempts: a worker that dies with a
//! job in hand leaves it to the broker to hand out again (at least once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use lapin::Connection;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use notify_core::Context;
use notify_core::queue;
use notify_core::webhooks::{Job, WebhookTopology, sign};
use notify_domain::Error;
use notify_domain::backoff::Reconnect;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::consumer::SharedConnection;

/// Shortest and longest wait before a lost consumer connects again.
const RECONNECT_MIN: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Builds the HTTP client every call goes through: rustls with the
/// system's roots, no redirects (a 3xx is a failed attempt), the call
/// timeout of `webhooks.timeout_ms`.
pub fn http_client(timeout: Duration) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("notify-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

/// Runs the consumer of one client's webhook queue until `shutdown`,
/// reconnecting after each loss.
pub async fn run_client(
    ctx: Context,
    broker: SharedConnection,
    http: reqwest::Client,
    client: String,
    shutdown: CancellationToken,
) {
    let mut backoff = Reconnect::new(RECONNECT_MIN, RECONNECT_MAX);
    let consuming = AtomicBool::new(false);
    while !shutdown.is_cancelled() {
        let consumed = match broker.get().await {
            Ok(connection) => {
                let consumed =
                    consume(&ctx, &connection, &http, &client, &consuming, &shutdown).await;
                if matches!(consumed, Err(Error::Unavailable(_))) {
                    broker.discard(&connection).await;
                }
                consumed
            }
            Err(e) => Err(e),
        };
        // It got as far as consuming: the next loss starts the waits over.
        if consuming.swap(false, Ordering::Relaxed) {
            backoff.reset();
        }
        match consumed {
            Ok(()) if shutdown.is_cancelled() => break,
            Ok(()) => warn!(client = %client, "webhook consumer stream ended, reconnecting"),
            Err(e) => warn!(error = %e, client = %client, "webhook consumer failed, reconnecting"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay()) => {}
            () = shutdown.cancelled() => break,
        }
    }
    info!(client = %client, "webhook consumer stopped");
}

async fn consume(
    ctx: &Context,
    connection: &Connection,
    http: &reqwest::Client,
    client: &str,
    consuming: &AtomicBool,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let topology = WebhookTopology::new(&ctx.settings);
    let channel = queue::bounded("opening a channel", connection.create_channel()).await?;
    topology.declare(&channel).await?;
    let concurrency = ctx.settings.webhooks.concurrency_per_client;
    queue::bounded("basic.qos", channel.basic_qos(concurrency, BasicQosOptions::default())).await?;
    let consume = channel.basic_consume(
        topology.queue(client).into(),
        format!("notify-webhooks-{client}-{}", std::process::id()).into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    );
    let consumer = queue::bounded("basic.consume", consume).await?;
    consuming.store(true, Ordering::Relaxed);
    info!(client = %client, concurrency, "consuming webhook jobs");
    // Stops taking jobs at shutdown and finishes (and settles) those taken;
    // a lost connection ends the stream, and unacked jobs go back.
    let topology = &topology;
    consumer
        .take_until(shutdown.cancelled())
        .take_while(|delivery| {
            if let Err(e) = delivery {
                warn!(error = %e, client = %client, "webhook consumer connection lost");
            }
            std::future::ready(delivery.is_ok())
        })
        .for_each_concurrent(usize::from(concurrency), |delivery| async move {
            if let Ok(delivery) = delivery {
                handle(ctx, topology, http, &delivery).await;
            }
        })
        .await;
    queue::close_channel(&channel, "worker shutting down").await;
    Ok(())
}

/// Calls the endpoint once and settles the job: acked when answered 2xx,
/// re-queued with a delay after a failure, dead-lettered after the last.
async fn handle(
    ctx: &Context,
    topology: &WebhookTopology,
    http: &reqwest::Client,
    delivery: &Delivery,
) {
    let mut job = match Job::decode(&delivery.data) {
        Ok(job) => job,
        Err(e) => {
            warn!(error = %e, "malformed webhook job, dead-lettering it");
            let dead = topology.dead_queue();
            settle(ctx.publisher.publish_persistent("", &dead, &delivery.data).await, delivery)
                .await;
            return;
        }
    };
    let client = job.client.clone();
    let endpoint = ctx
        .settings
        .auth
        .clients
        .iter()
        .filter(|c| c.name == job.client)
        .flat_map(|c| c.webhooks.iter())
        .find(|endpoint| endpoint.url == job.url);
    let Some(endpoint) = endpoint else {
        let endpoint = origin(&job.url);
        warn!(client = %client, endpoint = %endpoint, "webhook endpoint no longer configured, dropping its job");
        metrics::counter!("notify_webhooks_dropped_total", "client" => client).increment(1);
        let _ = queue::ack(&delivery.acker, BasicAckOptions::default()).await;
        return;
    };
    match call(http, &endpoint.signing_key(), &job).await {
        Ok(()) => {
            metrics::counter!("notify_webhooks_sent_total", "client" => client, "event" => job.event.clone())
                .increment(1);
            let _ = queue::ack(&delivery.acker, BasicAckOptions::default()).await;
        }
        Err(reason) => {
            metrics::counter!("notify_webhooks_failed_total", "client" => client.clone())
                .increment(1);
            let delays = &ctx.settings.webhooks.retry_delays_ms;
            let retry = delays.get(job.attempt.saturating_sub(1) as usize).copied();
            match retry {
                Some(delay) => {
                    let endpoint = origin(&job.url);
                    warn!(client = %client, endpoint = %endpoint, webhook_id = %job.id, attempt = job.attempt, retry_in_ms = delay, reason = %reason, "webhook attempt failed");
                    job.attempt += 1;
                    let exchange = topology.retry_exchange();
                    let key = WebhookTopology::retry_key(delay, &job.client);
                    let queued =
                        ctx.publisher.publish_persistent(&exchange, &key, &job.encode()).await;
                    settle(queued, delivery).await;
                }
                None => {
                    let endpoint = origin(&job.url);
                    warn!(client = %client, endpoint = %endpoint, webhook_id = %job.id, attempt = job.attempt, reason = %reason, "webhook failed its last attempt, dead-lettering it");
                    let dead = topology.dead_queue();
                    let queued = ctx.publisher.publish_persistent("", &dead, &job.encode()).await;
                    if queued.is_ok() {
                        metrics::counter!("notify_webhooks_dead_lettered_total", "client" => client)
                            .increment(1);
                    }
                    settle(queued, delivery).await;
                }
            }
        }
    }
}

/// Acks a job handed on (to a retry or the dead queue), or gives it back
/// to its queue when handing it on failed, so it is never lost.
async fn settle(handed_on: Result<(), Error>, delivery: &Delivery) {
    match handed_on {
        Ok(()) => {
            let _ = queue::ack(&delivery.acker, BasicAckOptions::default()).await;
        }
        Err(e) => {
            warn!(error = %e, "could not re-queue a webhook job, returning it to its queue");
            let requeue = BasicNackOptions { requeue: true, ..Default::default() };
            let _ = queue::nack(&delivery.acker, requeue).await;
        }
    }
}

/// An endpoint as logs name it: its scheme, host and port, never its path
/// or query, which may carry a token of the receiver's.
fn origin(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) => parsed.origin().ascii_serialization(),
        Err(_) => "(not a url)".to_owned(),
    }
}

/// One attempt: POSTs the payload with the Standard Webhooks headers.
/// Anything but a 2xx answer within the timeout is a failure.
async fn call(http: &reqwest::Client, key: &[u8], job: &Job) -> Result<(), String> {
    let timestamp = chrono::Utc::now().timestamp();
    let signature = sign::signature(key, &job.id, timestamp, job.payload.as_bytes());
    let answer = http
        .post(&job.url)
        .header("content-type", "application/json")
        .header("webhook-id", &job.id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(job.payload.clone())
        .send()
        .await
        // Without the url: its path or query may hold a secret of the
        // endpoint's (logs name the endpoint by its origin alone).
        .map_err(|e| {
            if e.is_timeout() { "timed out".to_owned() } else { e.without_url().to_string() }
        })?;
    let status = answer.status();
    if status.is_success() { Ok(()) } else { Err(format!("answered {status}")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_name_an_endpoint_by_its_origin_without_path_or_query() {
        let logged = origin("https://hooks.example.com:8443/notify/in?token=s3cr3t");
        assert_eq!(logged, "https://hooks.example.com:8443");
        assert_eq!(origin("http://127.0.0.1:9/x"), "http://127.0.0.1:9");
        assert_eq!(origin("not a url"), "(not a url)");
    }
}
