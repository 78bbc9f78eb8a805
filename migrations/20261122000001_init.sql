-- Shard schema, applied to every shard by `notifyctl migrate`.
-- Status values of messages.status: 0 not started, 1 sending, 2 paused,
-- 3 completed, 4 cancelled. Chunk states: 0 pending, 1 done, 2 failed, 3 cancelled.

-- Control record of a send, on the message's home shard (chosen from its id).
CREATE TABLE IF NOT EXISTS messages (
    message_id      BIGINT UNSIGNED  NOT NULL,
    sender          VARCHAR(64)      NOT NULL,
    idempotency_key VARCHAR(128)     NULL,
    audience        TINYINT UNSIGNED NOT NULL COMMENT '1 users, 2 all users',
    status          TINYINT UNSIGNED NOT NULL DEFAULT 0,
    -- Set by StartMessage; the scheduler starts such rows once send_at is due.
    start_requested TINYINT(1)       NOT NULL DEFAULT 0,
    priority        TINYINT UNSIGNED NOT NULL DEFAULT 1,
    lane            TINYINT UNSIGNED NOT NULL DEFAULT 0 COMMENT '0 bulk, 1 high',
    title           VARCHAR(200)     NOT NULL,
    body            TEXT             NOT NULL,
    category        VARCHAR(64)      NOT NULL DEFAULT '',
    data            TEXT             NOT NULL,
    send_at         DATETIME(3)      NULL,
    expire_at       DATETIME(3)      NULL,
    created_at      DATETIME(3)      NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    started_at      DATETIME(3)      NULL,
    finished_at     DATETIME(3)      NULL,
    updated_at      DATETIME(3)      NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    PRIMARY KEY (message_id),
    KEY idx_messages_due (status, start_requested, send_at),
    KEY idx_messages_sender (sender, message_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- (sender, idempotency_key) -> message id, on the shard chosen from the key.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    sender          VARCHAR(64)     NOT NULL,
    idempotency_key VARCHAR(128)    NOT NULL,
    message_id      BIGINT UNSIGNED NOT NULL,
    created_at      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (sender, idempotency_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Appended recipient batches of a draft, on the home shard: a retried batch
-- number is recognised here and adds nothing.
CREATE TABLE IF NOT EXISTS message_batches (
    message_id   BIGINT UNSIGNED NOT NULL,
    batch_number BIGINT UNSIGNED NOT NULL,
    recipients   INT UNSIGNED    NOT NULL,
    created_at   DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (message_id, batch_number)
) ENGINE=InnoDB;

-- Copy of a message's content on each shard that has recipients (one per shard).
CREATE TABLE IF NOT EXISTS message_contents (
    message_id BIGINT UNSIGNED NOT NULL,
    title      VARCHAR(200)    NOT NULL,
    body       TEXT            NOT NULL,
    category   VARCHAR(64)     NOT NULL DEFAULT '',
    data       TEXT            NOT NULL,
    expire_at  DATETIME(3)     NULL,
    created_at DATETIME(3)     NOT NULL,
    PRIMARY KEY (message_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Up to 500 recipients of a send on one shard: the unit of delivery and the
-- checkpoint. user_ids holds the sorted ids as little-endian u64s.
CREATE TABLE IF NOT EXISTS message_chunks (
    message_id BIGINT UNSIGNED  NOT NULL,
    chunk_id   BIGINT UNSIGNED  NOT NULL COMMENT 'batch_number << 16 | sequence',
    state      TINYINT UNSIGNED NOT NULL DEFAULT 0,
    recipients SMALLINT UNSIGNED NOT NULL,
    user_ids   MEDIUMBLOB       NOT NULL,
    attempts   INT UNSIGNED     NOT NULL DEFAULT 0,
    created_at DATETIME(3)      NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    -- Last publish or state change; the sweeper re-publishes old pending chunks.
    updated_at DATETIME(3)      NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (message_id, chunk_id),
    KEY idx_chunks_state (state, updated_at)
) ENGINE=InnoDB;

-- One row per recipient and message, on the recipient's shard.
CREATE TABLE IF NOT EXISTS message_items (
    user_id    BIGINT UNSIGNED NOT NULL,
    message_id BIGINT UNSIGNED NOT NULL,
    is_read    TINYINT(1)      NOT NULL DEFAULT 0,
    category   VARCHAR(64)     NOT NULL DEFAULT '',
    created_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    read_at    DATETIME(3)     NULL,
    expire_at  DATETIME(3)     NULL,
    PRIMARY KEY (user_id, message_id),
    KEY idx_items_unread (user_id, is_read, message_id),
    KEY idx_items_category (user_id, category, message_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Per-shard counters of a send, split in slots so concurrent chunks of one
-- send do not queue on one row lock. Progress sums them: O(shards x slots).
-- Signed, so a re-drive can subtract in slot 0 and keep every sum exact.
CREATE TABLE IF NOT EXISTS message_shard_stats (
    message_id     BIGINT UNSIGNED  NOT NULL,
    slot           TINYINT UNSIGNED NOT NULL,
    total          BIGINT NOT NULL DEFAULT 0,
    delivered      BIGINT NOT NULL DEFAULT 0,
    duplicates     BIGINT NOT NULL DEFAULT 0,
    failed         BIGINT NOT NULL DEFAULT 0,
    cancelled      BIGINT NOT NULL DEFAULT 0,
    read_count     BIGINT NOT NULL DEFAULT 0,
    chunks         BIGINT NOT NULL DEFAULT 0,
    done_chunks    BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id, slot)
) ENGINE=InnoDB;

-- Per-user inbox state on the user's shard (announcement watermark).
CREATE TABLE IF NOT EXISTS user_inbox_state (
    user_id                BIGINT UNSIGNED NOT NULL,
    announcement_watermark BIGINT UNSIGNED NOT NULL DEFAULT 0,
    updated_at             DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    PRIMARY KEY (user_id)
) ENGINE=InnoDB;
