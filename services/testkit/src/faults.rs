//! Fault proxies: a test routes its connections to a shard, Redis or
//! RabbitMQ through its own TCP proxy (noxious, a Rust port of Toxiproxy,
//! run in-process) and breaks them at will: down (refuse new connections and
//! drop open ones), reset every connection, add latency, limit bandwidth,
//! black-hole (accept and never answer). Other tests, and the real servers,
//! are untouched.

use std::net::SocketAddr;
use std::time::Duration;

use notify_domain::Settings;
use noxious::proxy::{ProxyConfig, ProxyRunner, Runner, Toxics};
use noxious::signal::{Close, Stop, Stopper};
use noxious::socket::TcpListener;
use noxious::toxic::{
    StreamDirection, Toxic, ToxicEvent, ToxicEventKind, ToxicEventResult, ToxicKind,
};
use secrecy::SecretString;
use tokio::sync::Mutex;

use crate::servers::free_port;

/// A running proxy's handles.
struct Running {
    stopper: Stopper,
    events: bmrng::RequestSender<ToxicEvent, ToxicEventResult>,
    /// Ends once the proxy has closed its listener.
    task: tokio::task::JoinHandle<()>,
}

/// One fault proxy in front of one upstream.
pub struct FaultProxy {
    name: String,
    listen: SocketAddr,
    upstream: String,
    running: Mutex<Option<Running>>,
    toxics: Mutex<Vec<Toxic>>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of `upstream`
    /// (`host:port`).
    pub async fn start(name: &str, upstream: &str) -> Self {
        let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
        let proxy = Self {
            name: name.to_owned(),
            listen,
            upstream: upstream.to_owned(),
            running: Mutex::new(None),
            toxics: Mutex::new(Vec::new()),
        };
        proxy.up().await;
        proxy
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Starts accepting again (after [`Self::down`]), with the current toxics.
    pub async fn up(&self) {
        let mut running = self.running.lock().await;
        if running.is_some() {
            return;
        }
        let config = ProxyConfig {
            name: self.name.clone(),
            listen: self.listen.to_string(),
            upstream: self.upstream.clone(),
            enabled: true,
            rand_seed: None,
        };
        let mut toxics = Toxics::empty();
        for toxic in self.toxics.lock().await.iter() {
            match toxic.direction {
                StreamDirection::Upstream => toxics.upstream.push(toxic.clone()),
                StreamDirection::Downstream => toxics.downstream.push(toxic.clone()),
            }
        }
        // Again at once after a `down`, the port may still be held for a
        // moment by the stopped runner's listener (seen as "address in
        // use" on a slow machine): retried for up to 5 s.
        let mut attempts = 0;
        let (listener, info) = loop {
            match ProxyRunner::initialize_proxy::<TcpListener>(config.clone(), toxics.clone()).await
            {
                Ok(bound) => break bound,
                Err(e) if attempts < 250 => {
                    attempts += 1;
                    tracing::debug!(error = %e, proxy = %self.name, "proxy port still held, retrying");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("proxy binds {}: {e:?}", self.listen),
            }
        };
        let (stop, stopper) = Stop::new();
        let (_close, closer) = Close::new();
        let (events, receiver) = bmrng::channel(1);
        let task = tokio::spawn(async move {
            let _ = ProxyRunner::run_proxy(listener, info, receiver, stop, closer).await;
        });
        *running = Some(Running { stopper, events, task });
    }

    /// Refuses new connections and drops every open one, like a server
    /// that went away.
    pub async fn down(&self) {
        if let Some(mut running) = self.running.lock().await.take() {
            running.stopper.stop();
            // The runner drops its listener before it returns: once it has,
            // the caller's next step sees the outage. A runner that does not
            // see the stop (it waits on an upstream connect between accepts)
            // is aborted, which drops the listener all the same.
            if tokio::time::timeout(Duration::from_secs(5), &mut running.task).await.is_err() {
                running.task.abort();
                let _ = running.task.await;
            }
        }
    }

    /// Drops every open connection; new ones are accepted at once.
    pub async fn reset_connections(&self) {
        self.down().await;
        self.up().await;
    }

    /// Adds `millis` of latency to every answer from the upstream.
    pub async fn latency(&self, millis: u64) {
        self.add(ToxicKind::Latency { latency: millis, jitter: 0 }, StreamDirection::Downstream)
            .await;
    }

    /// Limits the upstream's answers to `kilobytes_per_second`.
    pub async fn bandwidth(&self, kilobytes_per_second: u64) {
        self.add(ToxicKind::Bandwidth { rate: kilobytes_per_second }, StreamDirection::Downstream)
            .await;
    }

    /// Accepts connections and passes nothing either way: calls hang until
    /// the client's own timeouts give up.
    pub async fn black_hole(&self) {
        self.add(ToxicKind::Timeout { timeout: 0 }, StreamDirection::Upstream).await;
        self.add(ToxicKind::Timeout { timeout: 0 }, StreamDirection::Downstream).await;
    }

    /// Removes every toxic and accepts connections again.
    pub async fn heal(&self) {
        self.toxics.lock().await.clear();
        self.send(ToxicEventKind::RemoveAllToxics).await;
        self.up().await;
    }

    async fn add(&self, kind: ToxicKind, direction: StreamDirection) {
        let mut toxic = Toxic { kind, name: String::new(), toxicity: 1.0, direction };
        toxic.set_default_name();
        self.toxics.lock().await.push(toxic.clone());
        self.send(ToxicEventKind::AddToxic(toxic)).await;
    }

    async fn send(&self, kind: ToxicEventKind) {
        let running = self.running.lock().await;
        if let Some(running) = running.as_ref() {
            let event = ToxicEvent::new(self.name.clone(), kind);
            let _ = running.events.send_receive(event).await;
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(running) = self.running.get_mut().take() {
            running.stopper.stop();
        }
    }
}

/// Fault proxies in front of every shard, Redis and RabbitMQ of a test.
pub struct Proxies {
    /// One per shard, in `database.shards` order.
    pub shards: Vec<FaultProxy>,
    /// In front of Redis.
    pub redis: FaultProxy,
    /// In front of RabbitMQ.
    pub rabbitmq: FaultProxy,
}

/// Routes `settings`' shards through fresh fault proxies, each answering
/// `millis` late: a worker with these settings delivers a chunk in several
/// round trips of that, slowly enough for a test to act in the middle of a
/// send, whatever the machine's speed.
pub async fn slow_shards(settings: &mut Settings, millis: u64) -> Vec<FaultProxy> {
    let mut proxies = Vec::new();
    for shard in &mut settings.database.shards {
        let proxy = FaultProxy::start(&format!("slow-shard-{}", shard.id), "127.0.0.1:3306").await;
        proxy.latency(millis).await;
        shard.url = Some(SecretString::from(format!("mysql://notify:notify@{}", proxy.addr())));
        proxies.push(proxy);
    }
    proxies
}

/// Routes `settings`' shards, Redis and RabbitMQ through fresh fault proxies
/// (to the local servers) and returns them.
pub async fn route_through_proxies(settings: &mut Settings) -> Proxies {
    let mut shards = Vec::new();
    for shard in &mut settings.database.shards {
        let proxy = FaultProxy::start(&format!("shard-{}", shard.id), "127.0.0.1:3306").await;
        shard.url = Some(SecretString::from(format!("mysql://notify:notify@{}", proxy.addr())));
        shards.push(proxy);
    }
    let redis = FaultProxy::start("redis", "127.0.0.1:6379").await;
    settings.redis.url = SecretString::from(format!("redis://{}", redis.addr()));
    let rabbitmq = FaultProxy::start("rabbitmq", "127.0.0.1:5672").await;
    settings.rabbitmq.url =
        SecretString::from(format!("amqp://guest:guest@{}/%2f", rabbitmq.addr()));
    Proxies { shards, redis, rabbitmq }
}
