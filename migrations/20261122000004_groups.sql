-- Groups (pull model). A group's row, its seq counter and its messages live on
-- the group's home shard (the shard its id hashes to, exactly like a user id);
-- a member's cursor lives on the member's shard, beside their inbox. Nothing
-- is written per member when a message is sent.

CREATE TABLE IF NOT EXISTS message_groups (
    group_id   BIGINT UNSIGNED NOT NULL,
    name       VARCHAR(200)    NOT NULL,
    created_at DATETIME(3)     NOT NULL,
    PRIMARY KEY (group_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The seq counter has its own row: senders lock it to take the next seq,
-- member changes lock the group row, and neither waits for the other.
CREATE TABLE IF NOT EXISTS group_seqs (
    group_id BIGINT UNSIGNED NOT NULL,
    max_seq  BIGINT UNSIGNED NOT NULL DEFAULT 0,
    PRIMARY KEY (group_id)
) ENGINE=InnoDB;

-- Stored once per group. A NULL idempotency key never collides.
CREATE TABLE IF NOT EXISTS group_messages (
    group_id        BIGINT UNSIGNED NOT NULL,
    seq             BIGINT UNSIGNED NOT NULL,
    message_id      BIGINT UNSIGNED NOT NULL,
    sender          VARCHAR(64)     NOT NULL,
    idempotency_key VARCHAR(128)    NULL,
    title           VARCHAR(200)    NOT NULL,
    body            TEXT            NOT NULL,
    category        VARCHAR(64)     NOT NULL DEFAULT '',
    data            TEXT            NOT NULL,
    created_at      DATETIME(3)     NOT NULL,
    PRIMARY KEY (group_id, seq),
    UNIQUE KEY uk_group_messages_idempotency (group_id, sender, idempotency_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A member's cursor, on the member's shard. Seqs up to joined_seq were sent
-- before the member joined and are never shown to them; last_ack_seq starts
-- at joined_seq and only moves forward.
CREATE TABLE IF NOT EXISTS group_members (
    user_id      BIGINT UNSIGNED NOT NULL,
    group_id     BIGINT UNSIGNED NOT NULL,
    joined_seq   BIGINT UNSIGNED NOT NULL,
    last_ack_seq BIGINT UNSIGNED NOT NULL,
    joined_at    DATETIME(3)     NOT NULL,
    PRIMARY KEY (user_id, group_id),
    KEY idx_group_members_group (group_id)
) ENGINE=InnoDB;
