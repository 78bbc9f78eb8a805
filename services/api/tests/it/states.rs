//! Every chunk state, and the transitions the SQL allows: each statement
//! that changes a chunk's state is run on one chunk in each of the seven
//! states, and the table below is what it must leave. A transition the
//! code does not mean (a cancel of a delivered chunk, a settle of a pending
//! one) shows up here as a changed cell.

use notify_domain::domain::{Content, MessageId};
use notify_store::db::chunks::{self, ChunkPlan, ContentCopy, HoldCheck, state};
use notify_store::db::recall;
use notify_testkit::{TestApp, spawn_app_with, test_settings};
use sqlx::MySqlPool;

/// Every state, in column order.
const STATES: [u8; 7] = [
    state::PENDING,
    state::DONE,
    state::FAILED,
    state::CANCELLED,
    state::UNSETTLED,
    state::RECALLED,
    state::RECALL_UNSETTLED,
];

/// What each statement leaves a chunk of each state in (columns as in
/// [`STATES`]: pending, done, failed, cancelled, unsettled, recalled,
/// recall-unsettled).
const TRANSITIONS: [(&str, [u8; 7]); 8] = [
    ("apply", [4, 1, 2, 3, 4, 5, 6]),
    ("settle", [0, 1, 2, 3, 1, 5, 6]),
    ("cancel", [3, 1, 2, 3, 4, 5, 6]),
    ("fail", [2, 1, 2, 3, 4, 5, 6]),
    ("redrive", [0, 1, 0, 3, 4, 5, 6]),
    ("recall", [0, 6, 2, 3, 6, 5, 6]),
    ("recall settled", [0, 5, 2, 3, 5, 5, 6]),
    ("settle recall", [0, 1, 2, 3, 4, 5, 5]),
];

/// A send with one chunk (one recipient) in each state on `pool`.
async fn chunks_in_every_state(pool: &MySqlPool, message_id: MessageId) -> Vec<u64> {
    let content = Content {
        title: "states".into(),
        body: "states".into(),
        category: "system".into(),
        data: Default::default(),
        template: None,
    };
    let copy = ContentCopy {
        content: &content,
        expire_at: None,
        created_at: chrono::Utc::now().naive_utc(),
        critical: false,
    };
    let plans: Vec<ChunkPlan> = STATES
        .iter()
        .enumerate()
        .map(|(index, _)| ChunkPlan {
            chunk_id: index as u64,
            user_ids: vec![9_100_001 + index as u64],
            vars: None,
        })
        .collect();
    chunks::store(pool, message_id, &copy, &plans).await.unwrap();
    for (chunk_id, chunk_state) in STATES.iter().enumerate() {
        sqlx::query("UPDATE message_chunks SET state = ? WHERE message_id = ? AND chunk_id = ?")
            .bind(chunk_state)
            .bind(message_id.get())
            .bind(chunk_id as u64)
            .execute(pool)
            .await
            .unwrap();
    }
    (0..STATES.len() as u64).collect()
}

async fn states_of(pool: &MySqlPool, message_id: MessageId) -> [u8; 7] {
    let rows: Vec<(u64, u8)> = sqlx::query_as(
        "SELECT chunk_id, state FROM message_chunks WHERE message_id = ? ORDER BY chunk_id",
    )
    .bind(message_id.get())
    .fetch_all(pool)
    .await
    .unwrap();
    let mut states = [u8::MAX; 7];
    for (chunk_id, chunk_state) in rows {
        states[chunk_id as usize] = chunk_state;
    }
    states
}

/// Runs `statement` on every chunk of the send.
async fn run(statement: &str, pool: &MySqlPool, message_id: MessageId, chunk_ids: &[u64]) {
    for chunk_id in chunk_ids {
        let id = *chunk_id;
        match statement {
            "apply" => {
                chunks::apply(pool, message_id, &[id], HoldCheck::InInsert, |_| true)
                    .await
                    .unwrap();
            }
            "settle" => chunks::settle(pool, message_id, &[id]).await.unwrap(),
            "fail" => {
                chunks::mark_failed(pool, message_id, id, None).await.unwrap();
            }
            "recall" | "recall settled" => {
                let settled = statement == "recall settled";
                recall::recall_many(pool, message_id, &[id], settled).await.unwrap();
            }
            "settle recall" => recall::settle_recall(pool, message_id, &[id]).await.unwrap(),
            _ => {}
        }
    }
    // The statements that take a send's chunks as a whole.
    match statement {
        "cancel" => {
            chunks::cancel_pending_page(pool, message_id, 0, 100, true).await.unwrap();
        }
        "redrive" => {
            chunks::reset_failed(pool, message_id).await.unwrap();
        }
        _ => {}
    }
}

#[tokio::test]
async fn every_chunk_state_moves_only_where_its_statements_say() {
    let app: TestApp = spawn_app_with(test_settings(), false).await;
    let (_, pool) = app.ctx.pools.iter().next().unwrap();
    let mut found = Vec::new();
    for (round, (statement, _)) in TRANSITIONS.iter().enumerate() {
        let message_id = MessageId::from_raw(9_000_000_000 + round as u64);
        let chunk_ids = chunks_in_every_state(pool, message_id).await;
        assert_eq!(states_of(pool, message_id).await, STATES, "set up");
        run(statement, pool, message_id, &chunk_ids).await;
        found.push((*statement, states_of(pool, message_id).await));
    }
    assert_eq!(found, TRANSITIONS.to_vec());
    app.cleanup().await;
}
