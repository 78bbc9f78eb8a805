//! `notifyctl` end to end: the real binary against an in-process api over
//! the real MariaDB, RabbitMQ and Redis.

use std::process::Output;

use notify_proto::v1;
use notify_testkit::{spawn_app_with, test_settings};

async fn notifyctl(addr: std::net::SocketAddr, args: &[&str]) -> String {
    let output: Output =
        tokio::process::Command::new(notify_testkit::bin(env!("CARGO_BIN_EXE_notifyctl")))
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

#[tokio::test]
async fn inbox_items_prefs_and_user_erase_show_and_change_item_states() {
    let app = spawn_app_with(test_settings(), true).await;
    let addr = app.addr;
    let (first, second) = (app.send(vec![42]).await, app.send(vec![42]).await);
    app.wait_for_status(second, v1::MessageStatus::Completed).await;
    app.wait_for_status(first, v1::MessageStatus::Completed).await;
    let listed = notifyctl(addr, &["inbox", "42"]).await;
    assert!(listed.contains(&format!("*+  {second} ")), "unread and unseen: {listed}");
    let seen = notifyctl(addr, &["items", "42", "seen", &second.to_string()]).await;
    assert_eq!(seen.trim(), "changed 1 (user 42 unread 2 unseen 1)");
    let archived = notifyctl(addr, &["items", "42", "archive", "--all"]).await;
    assert_eq!(archived.trim(), "changed 2 (user 42 unread 0 unseen 0)");
    assert!(!notifyctl(addr, &["inbox", "42"]).await.contains(&first.to_string()));
    let archive = notifyctl(addr, &["inbox", "42", "--archive"]).await;
    assert!(archive.contains(&format!("* A {second} ")), "{archive}");
    assert!(archive.contains(&format!("*+A {first} ")), "{archive}");
    assert_eq!(notifyctl(addr, &["badge", "42"]).await.trim(), "user 42 unread 0 unseen 0");

    let prefs = notifyctl(addr, &["prefs", "42", "--mute", "billing", "--mute", "promo"]).await;
    assert!(prefs.contains("muted categories: billing promo"), "{prefs}");
    let prefs = notifyctl(addr, &["prefs", "42", "--unmute", "billing", "--mute-group", "9"]).await;
    assert!(prefs.contains("muted categories: promo"), "{prefs}");
    assert!(prefs.contains("muted groups:     9"), "{prefs}");
    let prefs = notifyctl(addr, &["prefs", "42", "--locale", "zh_hant_tw"]).await;
    assert!(prefs.contains("locale:           zh-Hant-TW"), "{prefs}");
    assert!(prefs.contains("muted categories: promo"), "the mutes stay: {prefs}");

    let erased = notifyctl(addr, &["user", "erase", "42"]).await;
    assert_eq!(erased.trim(), "user 42 erased: 2 items, 0 group memberships");
    let audit = notifyctl(addr, &["audit", "--user", "42"]).await;
    assert!(audit.contains("user.erase") && audit.contains("user 42"), "{audit}");
    let prefs = notifyctl(addr, &["prefs", "42"]).await;
    assert!(prefs.contains("muted categories: none") && prefs.contains("locale:           none"));
    app.cleanup().await;
}

#[tokio::test]
async fn edit_then_recall_with_watch_from_the_command_line() {
    let app = spawn_app_with(test_settings(), true).await;
    let addr = app.addr;
    let id = app.send(vec![42, 43]).await;
    app.wait_for_status(id, v1::MessageStatus::Completed).await;
    let id_text = id.to_string();
    let edited = notifyctl(addr, &["edit", &id_text, "--title", "fixed"]).await;
    assert!(edited.contains("[completed]"), "{edited}");
    let page = notifyctl(addr, &["inbox", "42"]).await;
    assert!(page.contains("fixed"), "{page}");
    let recalled = notifyctl(addr, &["recall", &id_text, "--watch"]).await;
    assert!(recalled.contains("[recalled]") && recalled.contains(" recalled=2 "), "{recalled}");
    assert!(!notifyctl(addr, &["inbox", "42"]).await.contains(&id_text));
    app.cleanup().await;
}

#[tokio::test]
async fn recipients_and_recipient_show_who_got_a_send_and_who_read_it() {
    let app = spawn_app_with(test_settings(), true).await;
    let addr = app.addr;
    let users: Vec<u64> = (9_500_001..=9_500_005).collect();
    let id = app.send(users.clone()).await;
    app.wait_for_status(id, v1::MessageStatus::Completed).await;
    let request = v1::MarkReadRequest { user_id: users[1], message_ids: vec![id] };
    app.inbox().mark_read(request).await.unwrap();
    let id_text = id.to_string();
    let read = notifyctl(addr, &["recipients", &id_text, "--state", "read"]).await;
    let lines: Vec<&str> = read.lines().collect();
    assert_eq!(lines.len(), 1, "{read}");
    assert!(lines[0].contains("9500002") && lines[0].contains(" read "), "{read}");
    // Pages of 2, followed by --all: every recipient once, in user order.
    let all = notifyctl(addr, &["recipients", &id_text, "--page-size", "2", "--all"]).await;
    let listed: Vec<u64> =
        all.lines().filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect();
    assert_eq!(listed, users, "{all}");
    let first =
        notifyctl(addr, &["recipients", &id_text, "--state", "unread", "--page-size", "2"]).await;
    assert!(first.contains("next page: --page-token "), "{first}");
    let status = notifyctl(addr, &["recipient", &id_text, "9500002", "9500003", "7"]).await;
    let states: Vec<&str> = status.lines().filter_map(|l| l.split_whitespace().nth(1)).collect();
    assert_eq!(states, ["read", "unread", "not-a-recipient"], "{status}");
    app.cleanup().await;
}

/// `notifyctl recipients 123 --all | head`: the reader leaves, and notifyctl
/// ends by SIGPIPE as `cat` would, not with a panic from `println!`.
#[tokio::test]
async fn output_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let app = spawn_app_with(test_settings(), true).await;
    let id = app.send((9_600_001..=9_600_003).collect()).await;
    app.wait_for_status(id, v1::MessageStatus::Completed).await;
    let mut child =
        tokio::process::Command::new(notify_testkit::bin(env!("CARGO_BIN_EXE_notifyctl")))
            .arg("--addr")
            .arg(format!("http://{}", app.addr))
            .args(["recipients", &id.to_string(), "--all"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("notifyctl runs");
    // The reader is gone before the first line is written.
    drop(child.stdout.take());
    let output = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.signal(), Some(13), "ended by SIGPIPE: {:?} {stderr}", output.status);
    app.cleanup().await;
}

/// Runs notifyctl with extra environment; returns (exit code, stdout, stderr).
async fn notifyctl_env(env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(notify_testkit::bin(env!("CARGO_BIN_EXE_notifyctl")))
        .envs(env.iter().copied())
        .args(args)
        .output()
        .await
        .expect("notifyctl runs");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

#[tokio::test]
async fn token_health_send_and_audit_against_an_api_with_tls_and_tokens() {
    let (code, made, _) = notifyctl_env(&[], &["token", "new", "ops", "--scopes", "admin"]).await;
    assert_eq!(code, 0, "{made}");
    let token = made.lines().nth(1).expect("token line").trim().to_owned();
    let digest_line = made.lines().find(|l| l.starts_with("token_sha256 = ")).expect("digest line");
    let digest = digest_line.split('"').nth(1).expect("quoted digest").to_owned();
    assert_eq!(digest, notify_domain::auth::token_sha256_hex(&token));

    let pki = notify_testkit::pki::TestPki::new("cli");
    let server = pki.server("api");
    let mut settings = test_settings();
    settings.api.tls.cert_file = server.cert.display().to_string();
    settings.api.tls.key_file = server.key.display().to_string();
    settings.auth.enabled = true;
    settings.auth.clients.push(notify_domain::settings::ClientSettings {
        name: "ops".into(),
        token_sha256: vec![digest],
        cert_names: Vec::new(),
        scopes: vec!["admin".into()],
        senders: Vec::new(),
        requests_per_second: 0,
        burst: 0,
        recipients_per_minute: 0,
        announcements_per_hour: 0,
        webhooks: Vec::new(),
    });
    let app = spawn_app_with(settings, false).await;
    let addr = format!("https://localhost:{}", app.addr.port());
    let ca = pki.ca.display().to_string();
    let tls = [("NOTIFY_ADDR", addr.as_str()), ("NOTIFY_CA", ca.as_str())];

    let (code, out, err) = notifyctl_env(&tls, &["health"]).await;
    assert_eq!((code, out.trim()), (0, "notify-api: SERVING"), "{err}");
    let (code, _, err) = notifyctl_env(&tls, &["badge", "1"]).await;
    assert_eq!(code, 1, "a call without a token is refused");
    assert!(err.contains("no credentials"), "{err}");
    let with_token = [tls[0], tls[1], ("NOTIFY_TOKEN", token.as_str())];
    let (code, out, err) =
        notifyctl_env(&with_token, &["send", "--users", "1..=3", "--title", "hi"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("message "), "{out}");
    let (code, out, err) = notifyctl_env(&with_token, &["audit", "--client", "ops"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("message.send") && out.contains(" ok "), "{out}");
    // A client that does not trust the api's CA cannot reach it.
    let (code, _, err) = notifyctl_env(&[tls[0]], &["health"]).await;
    assert_eq!(code, 2, "{err}");
    app.cleanup().await;
}

#[tokio::test]
async fn tail_prints_snapshots_then_items_as_they_arrive() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let app = spawn_app_with(test_settings(), true).await;
    let mut child =
        tokio::process::Command::new(notify_testkit::bin(env!("CARGO_BIN_EXE_notifyctl")))
            .arg("--addr")
            .arg(format!("http://{}", app.addr))
            .args(["tail", "--users", "42,43"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("notifyctl runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line());
        line.await.expect("a line within 20 s").unwrap().expect("tail still running")
    };
    let mut snapshots = vec![next().await, next().await];
    snapshots.sort();
    assert_eq!(
        snapshots,
        [
            "snapshot  user 42 unread 0 unseen 0 group_unread 0",
            "snapshot  user 43 unread 0 unseen 0 group_unread 0"
        ]
    );
    let id = app.send(vec![42]).await;
    let item = next().await;
    assert!(item.starts_with(&format!("item      user 42 message {id} \"hello\"")), "{item}");
    assert_eq!(next().await, "badge     user 42 unread 1 unseen 1 group_unread 0");
    child.kill().await.unwrap();
    app.cleanup().await;
}

#[tokio::test]
async fn shard_map_shows_the_stored_map_and_shard_add_registers_a_configured_shard() {
    let mut app = spawn_app_with(test_settings(), true).await;
    let config = app.write_config_file();
    let env = [("NOTIFY_CONFIG", config.to_str().unwrap())];
    let (code, shown, err) = notifyctl_env(&env, &["shard", "map"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(shown.contains("shard map version 1 (initial: database.bucket_ranges"), "{shown}");
    assert!(shown.contains("shard 3:  256 buckets  768..=1023"), "{shown}");

    // A fifth shard in the config: an even split over five would move most
    // buckets; the stored map moves none, and `shard add` registers it empty.
    let fifth = format!("{}_extra", app.settings.database.shards[0].database);
    app.settings.database.shards.push(notify_domain::settings::ShardSettings {
        id: shard_router::ShardId(4),
        database: fifth.clone(),
        url: None,
        url_file: None,
    });
    let config = app.write_config_file();
    let env = [("NOTIFY_CONFIG", config.to_str().unwrap())];
    let (code, added, err) = notifyctl_env(&env, &["shard", "add", "--id", "4"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(added.contains("shard 4 registered: shard map version 2"), "{added}");
    assert!(added.contains("shard 0:  256 buckets  0..=255"), "{added}");
    assert!(added.contains("shard 4:    0 buckets  none"), "{added}");
    let (code, _, err) = notifyctl_env(&env, &["shard", "add", "--id", "4"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("shard 4 is already in the shard map (version 2)"), "{err}");

    // The running api and worker were not given shard 4: they keep version 1
    // and say so.
    let refused = notify_testkit::eventually(
        "both replicas report refusing version 2",
        std::time::Duration::from_secs(10),
        || async {
            let (_, shown, _) = notifyctl_env(&env, &["shard", "map"]).await;
            (shown.matches("version    1").count() == 2
                && shown.matches("refused version 2").count() == 2)
                .then_some(shown)
        },
    )
    .await;
    assert!(refused.contains("replicas (2)"), "{refused}");

    let (_, shard0) = app.ctx.pools.iter().next().unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS `{fifth}`")))
        .execute(shard0)
        .await
        .unwrap();
    app.cleanup().await;
}

#[tokio::test]
async fn shard_move_moves_buckets_with_their_rows_and_refuses_bad_input() {
    let mut settings = test_settings();
    settings.database.shard_map_refresh_ms = 100;
    let app = spawn_app_with(settings, true).await;
    let config = app.write_config_file();
    let env = [("NOTIFY_CONFIG", config.to_str().unwrap())];
    let users: Vec<u64> =
        (1..).filter(|u| (768..=783).contains(&shard_router::bucket_of(*u))).take(50).collect();
    let sent = app.send(users.clone()).await;
    app.wait_for_status(sent, v1::MessageStatus::Completed).await;

    let (code, _, err) = notifyctl_env(&env, &["shard", "move", "--status"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("no shard move is in progress"), "{err}");
    let (code, _, err) =
        notifyctl_env(&env, &["shard", "move", "--buckets", "9..=2", "--to", "1"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("buckets: 9..=2 must satisfy from <= to < 1024"), "{err}");
    let (code, _, err) =
        notifyctl_env(&env, &["shard", "move", "--buckets", "768..=783", "--to", "9"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("shard 9 is not in the shard map"), "{err}");

    let args = ["shard", "move", "--buckets", "768..=783", "--to", "1", "--batch", "8"];
    let (code, moved, err) = notifyctl_env(&env, &args).await;
    assert_eq!(code, 0, "{err}");
    assert!(moved.contains("buckets 768..=783 to shard 1: done"), "{moved}");
    assert!(moved.contains("longest write freeze"), "{moved}");
    let (_, shown, _) = notifyctl_env(&env, &["shard", "map"]).await;
    assert!(shown.contains("shard 1:  272 buckets  256..=511, 768..=783"), "{shown}");
    assert!(shown.contains("shard 3:  240 buckets  784..=1023"), "{shown}");
    let on_target: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM message_items WHERE message_id = ?")
            .bind(sent)
            .fetch_one(app.ctx.pools.get(shard_router::ShardId(1)).unwrap())
            .await
            .unwrap();
    assert_eq!(on_target as usize, users.len());
    assert_eq!(app.unread_truth(users[0]).await, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn a_csv_of_users_with_vars_sends_one_personalized_message_that_inbox_shows_rendered() {
    let app = spawn_app_with(test_settings(), true).await;
    let addr = app.addr;
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("bills.csv");
    std::fs::write(&users, "user_id,name,amount\n9700001,Ann,\"¥1,280\"\n9700002,Bo,€5\n").unwrap();
    let translations = dir.path().join("translations.json");
    let zh = r#"{"zh-Hant": {"title": "{{ name }}，帳單 {{ amount }} 於 {{ due }} 到期"}}"#;
    std::fs::write(&translations, zh).unwrap();
    notifyctl(addr, &["prefs", "9700002", "--locale", "zh-Hant-TW"]).await;
    let args = [
        "send",
        "--users-file",
        users.to_str().unwrap(),
        "--title",
        "Hi {{ name }}, {{ amount }} is due on {{ due }}",
        "--var",
        "due=12 December",
        "--translations",
        translations.to_str().unwrap(),
        "--watch",
    ];
    let sent = notifyctl(addr, &args).await;
    assert!(sent.contains("accepted for 2 recipients"), "{sent}");
    let ann = notifyctl(addr, &["inbox", "9700001"]).await;
    assert!(ann.contains("Hi Ann, ¥1,280 is due on 12 December"), "{ann}");
    let bo = notifyctl(addr, &["inbox", "9700002"]).await;
    assert!(bo.contains("Bo，帳單 €5 於 12 December 到期"), "{bo}");
    app.cleanup().await;
}
