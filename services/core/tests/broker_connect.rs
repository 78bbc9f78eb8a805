//! A process retrying through a broker outage keeps nothing of its failed
//! attempts. This binary counts the bytes it holds with its own global
//! allocator, so it is a test binary of its own: no other test allocates
//! meanwhile.

use std::alloc::System;

use notify_core::queue;
use notify_domain::settings::RabbitSettings;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static COUNTING: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A broker url on a loopback port nothing listens on.
fn refused_broker() -> RabbitSettings {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port();
    RabbitSettings {
        url: format!("amqp://guest:guest@127.0.0.1:{port}/%2f").into(),
        url_file: String::new(),
        tls_ca_file: String::new(),
        prefix: "refused".to_owned(),
        queue_type: "quorum".to_owned(),
        publish_window: 1,
    }
}

/// lapin 4.12 kept ~10 KB of every attempt whose socket was refused for as
/// long as the process lived: 300 attempts held ~3 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connects_leave_nothing_held() {
    let broker = refused_broker();
    let attempt = || async {
        let error = queue::connect(&broker, "refused-test").await.expect_err("nothing listens");
        let message = error.to_string();
        assert!(message.contains("rabbitmq.url: cannot connect"), "{message}");
    };
    // Lazily built statics (the runtime's, rustls', tracing's) first.
    for _ in 0..20 {
        attempt().await;
    }
    let region = Region::new(COUNTING);
    for _ in 0..300 {
        attempt().await;
    }
    let change = region.change();
    let grown = change.bytes_allocated as isize - change.bytes_deallocated as isize
        + change.bytes_reallocated;
    assert!(grown < 64 * 1024, "300 refused connects left {grown} bytes held");
}
