//! The worker's one broker connection ([`SharedConnection`]), shared by the
//! consumers of every lane and shard, against the real RabbitMQ through a
//! fault proxy.

use std::sync::Arc;

use notify_testkit::faults::FaultProxy;
use notify_testkit::test_settings;
use notify_worker::consumer::SharedConnection;
use secrecy::SecretString;

#[tokio::test]
async fn lanes_share_one_connection_and_one_that_stopped_answering_is_replaced_once() {
    let proxy = FaultProxy::start("rabbitmq", "127.0.0.1:5672").await;
    let mut settings = test_settings().rabbitmq;
    settings.url = SecretString::from(format!("amqp://guest:guest@{}/%2f", proxy.addr()));
    let shared = SharedConnection::new(settings);
    let first = shared.get().await.expect("connects");
    assert!(Arc::ptr_eq(&first, &shared.get().await.unwrap()), "every lane gets the same one");

    // The broker stops answering: the connection still reads as connected,
    // so a lane whose step timed out discards it, and the next lane to ask
    // gets a new one once the broker answers again.
    proxy.black_hole().await;
    assert!(first.status().connected());
    shared.discard(&first).await;
    proxy.heal().await;
    proxy.reset_connections().await;
    let second = shared.get().await.expect("connects again");
    assert!(!Arc::ptr_eq(&first, &second), "a new connection");
    assert!(second.status().connected());
    // A lane that gives up on the first one late does not throw away the
    // one that replaced it.
    shared.discard(&first).await;
    assert!(Arc::ptr_eq(&second, &shared.get().await.unwrap()));
    let channel = second.create_channel().await.expect("a channel on the new connection");
    assert!(channel.status().connected());

    // A lost connection (the broker dropped it) is replaced without a
    // discard: its state says so.
    proxy.reset_connections().await;
    let third = notify_testkit::eventually(
        "the lost connection replaced",
        std::time::Duration::from_secs(30),
        || async {
            let got = shared.get().await.ok()?;
            (!Arc::ptr_eq(&got, &second)).then_some(got)
        },
    )
    .await;
    assert!(third.status().connected());

    shared.close().await;
    assert!(!third.status().connected(), "closed at shutdown");
}
