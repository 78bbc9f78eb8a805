//! `notifyctl` end to end: the real binary against an in-process api over
//! the real MariaDB, RabbitMQ and Redis.

use std::process::Output;

use notify_testkit::{spawn_app_with, test_settings};

async fn notifyctl(addr: std::net::SocketAddr, args: &[&str]) -> String {
    let output: Output = tokio::process::Command::new(env!("CARGO_BIN_EXE_notifyctl"))
        .arg("--addr")
        .arg(format!("http://{addr}"))
        .args(args)
        .output()
        .await
        .expect("notifyctl runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "notifyctl {args:?} failed: {stderr}");
    stdout
}

#[tokio::test]
async fn group_commands_create_add_send_pull_ack_and_count() {
    let app = spawn_app_with(test_settings(), false).await;
    let addr = app.addr;
    let created = notifyctl(addr, &["group", "create", "ops", "--id", "77"]).await;
    assert_eq!(created.trim(), "group 77");
    let added = notifyctl(addr, &["group", "add", "77", "--users", "1..=3"]).await;
    assert_eq!(added.trim(), "added 3 members to group 77");
    for title in ["first", "second"] {
        let sent = notifyctl(addr, &["group", "send", "77", "--title", title]).await;
        assert!(sent.starts_with("message ") && sent.contains(" seq "), "{sent}");
    }
    let unread = notifyctl(addr, &["group", "unread", "2"]).await;
    assert!(unread.contains("group 77 unread 2 (max_seq 2, last_ack_seq 0)"), "{unread}");
    let pulled = notifyctl(addr, &["group", "pull", "2", "77", "--limit", "1", "--ack"]).await;
    assert!(pulled.contains("first") && !pulled.contains("second"), "{pulled}");
    assert!(pulled.contains("more messages follow"), "{pulled}");
    assert!(pulled.contains("acknowledged up to seq 1"), "{pulled}");
    let acked = notifyctl(addr, &["group", "ack", "2", "77", "2"]).await;
    assert_eq!(acked.trim(), "user 2 group 77 last_ack_seq 2");
    assert!(notifyctl(addr, &["group", "unread", "2"]).await.contains("total 0"));
    let removed = notifyctl(addr, &["group", "remove", "77", "--users", "2..=2"]).await;
    assert_eq!(removed.trim(), "removed 1 members from group 77");
    app.cleanup().await;
}
