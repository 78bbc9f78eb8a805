-- The shard schema, applied to every shard by `notifyctl migrate`. Every
-- shard holds every table (the shard map, moves and id leases are used on
-- the first shard of the map only, the directory). Shard databases are
-- created with CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, which tables
-- without their own charset take.
--
-- messages.status (notify_domain::domain::SendStatus): 0 not started,
-- 1 sending, 2 paused, 3 completed, 4 cancelled, 5 recalled.
--
-- message_chunks.state (notify_store::db::chunks::state): 0 pending, 1 done,
-- 2 failed (dead-lettered after too many attempts), 3 cancelled,
-- 4 unsettled (applied, its recipients' cached badges not yet invalidated),
-- 5 recalled (its items taken back, the badges invalidated),
-- 6 recall-unsettled (taken back, the badges not yet invalidated).
--
-- Buckets. Every table keyed by a user, a message home, a group home or an
-- idempotency key has a `bucket` column and an index on it, which
-- `notifyctl shard move` reads a bucket's rows by (InnoDB appends the
-- primary key, so they come in key order). Where the key is a number, the
-- bucket is `bucket_of(id)` of shard_router (MurmurHash3 fmix64, then
-- % 1024) written in SQL, with the 64-bit wrapping multiplications done in
-- DECIMAL and reduced mod 2^64. The test
-- `sql_bucket_expression_matches_bucket_of` pins it to the Rust function.
-- Tables written per recipient store it from a DEFAULT, evaluated once when
-- the row is inserted: InnoDB evaluates an indexed virtual column again on
-- every UPDATE and DELETE of the row, and this is DECIMAL arithmetic.
-- Tables whose rows are written rarely (per send, per group, per audit
-- record, a user's preferences) compute it as a VIRTUAL column. Idempotency keys hash a
-- string (FNV-1a), which SQL cannot: the api stores their bucket.


-- ---------------------------------------------------------------------------
-- A send's control records, on its home shard (the shard its id hashes to)
-- ---------------------------------------------------------------------------

-- The control record of a send. `client` is the authenticated client that
-- created it ("local" while authentication is off), `sender` who it is sent
-- as. `status_version` grows with every status change: the Redis status
-- cache keeps the highest version it has seen, so a delayed write of an
-- older status never overwrites a newer one, and a completion check that
-- raced a re-drive fails on the version it read. A critical send ignores
-- mutes. `content_version` counts edits (see message_contents).
-- idx_messages_due finds scheduled sends that are due and recalls still
-- being taken back, idx_messages_audience_status the live announcements,
-- idx_messages_sender and idx_messages_client_sender a sender's sends (of
-- every client, or of one).
CREATE TABLE IF NOT EXISTS messages (
    message_id      BIGINT UNSIGNED  NOT NULL,
    client          VARCHAR(64)      NOT NULL DEFAULT '',
    sender          VARCHAR(64)      NOT NULL,
    idempotency_key VARCHAR(128)     NULL,
    audience        TINYINT UNSIGNED NOT NULL COMMENT '1 users, 2 all users',
    status          TINYINT UNSIGNED NOT NULL DEFAULT 0,
    status_version  BIGINT UNSIGNED  NOT NULL DEFAULT 0,
    -- Set by StartMessage: the scheduler starts such rows once send_at is due.
    start_requested TINYINT(1)       NOT NULL DEFAULT 0,
    priority        TINYINT UNSIGNED NOT NULL DEFAULT 1,
    lane            TINYINT UNSIGNED NOT NULL DEFAULT 0 COMMENT '0 bulk, 1 high',
    critical        TINYINT(1)       NOT NULL DEFAULT 0,
    title           VARCHAR(200)     NOT NULL,
    body            TEXT             NOT NULL,
    category        VARCHAR(64)      NOT NULL DEFAULT '',
    data            TEXT             NOT NULL,
    send_at         DATETIME(3)      NULL,
    expire_at       DATETIME(3)      NULL,
    created_at      DATETIME(3)      NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    started_at      DATETIME(3)      NULL,
    finished_at     DATETIME(3)      NULL,
    -- When the content last changed (an edit updates this record and each
    -- shard's content copy, never an item).
    edited_at       DATETIME(3)      NULL,
    updated_at      DATETIME(3)      NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    bucket          SMALLINT UNSIGNED AS (((CAST(MOD(CAST((CAST(MOD(CAST((message_id ^ (message_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((message_id ^ (message_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((message_id ^ (message_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((message_id ^ (message_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)) VIRTUAL,
    content_version INT UNSIGNED     NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id),
    KEY idx_messages_due (status, start_requested, send_at),
    KEY idx_messages_sender (sender, message_id),
    KEY idx_messages_audience_status (audience, status),
    KEY idx_messages_client_sender (client, sender, message_id),
    KEY idx_messages_bucket (bucket)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- (client, sender, idempotency_key) -> message id, on the shard chosen from
-- the key: a retried create finds the send it made. Keys are per client.
-- Retention deletes a send's key by its message id.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    client          VARCHAR(64)     NOT NULL DEFAULT '',
    sender          VARCHAR(64)     NOT NULL,
    idempotency_key VARCHAR(128)    NOT NULL,
    message_id      BIGINT UNSIGNED NOT NULL,
    created_at      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    -- Stored by the api; a bucket move fills in a row that has none.
    bucket          SMALLINT UNSIGNED NULL COMMENT 'bucket_of_key(client 0x1f sender 0x1f key)',
    PRIMARY KEY (client, sender, idempotency_key),
    KEY idx_idempotency_keys_message (message_id),
    KEY idx_idempotency_keys_bucket (bucket)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The recipient batches appended to a draft: a retried batch number is
-- recognised here and adds nothing.
CREATE TABLE IF NOT EXISTS message_batches (
    message_id   BIGINT UNSIGNED NOT NULL,
    batch_number BIGINT UNSIGNED NOT NULL,
    recipients   INT UNSIGNED    NOT NULL,
    created_at   DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    bucket       SMALLINT UNSIGNED AS (((CAST(MOD(CAST((CAST(MOD(CAST((message_id ^ (message_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((message_id ^ (message_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((message_id ^ (message_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((message_id ^ (message_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)) VIRTUAL,
    PRIMARY KEY (message_id, batch_number),
    KEY idx_message_batches_bucket (bucket)
) ENGINE=InnoDB;


-- ---------------------------------------------------------------------------
-- A send's content copies, chunks and stats, on each shard
-- ---------------------------------------------------------------------------

-- A copy of a send's content on each shard that has recipients of it (one
-- per shard). An announcement (audience 2) is stored once: its control
-- record on the home shard and a copy on every shard, from which users'
-- items are materialized when they read. A chunk's apply and an
-- announcement's materialization read `critical` here. A cancelled or
-- recalled send's copies are `revoked`, which hides every item of it at
-- once; `revoked_at` says when, so that retention purges the hidden items
-- after retention.purge_hidden_after_secs. A copy takes an edit only if the
-- edit's `content_version` is newer than the copy's, so two edits driven at
-- once (the caller's api and a sweeper) leave every copy with the last.
-- idx_contents_revoked finds the shard's revoked copies (few), which a
-- badge count leaves out, instead of joining every unread item to its copy.
CREATE TABLE IF NOT EXISTS message_contents (
    message_id      BIGINT UNSIGNED NOT NULL,
    title           VARCHAR(200)    NOT NULL,
    body            TEXT            NOT NULL,
    category        VARCHAR(64)     NOT NULL DEFAULT '',
    data            TEXT            NOT NULL,
    expire_at       DATETIME(3)     NULL,
    created_at      DATETIME(3)     NOT NULL,
    revoked         TINYINT(1)      NOT NULL DEFAULT 0,
    revoked_at      DATETIME(3)     NULL,
    critical        TINYINT(1)      NOT NULL DEFAULT 0,
    edited_at       DATETIME(3)     NULL,
    content_version INT UNSIGNED    NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id),
    KEY idx_contents_revoked (revoked, message_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Up to 500 recipients of a send on one shard: the unit of delivery and the
-- checkpoint. `user_ids` holds the sorted ids as little-endian u64s;
-- within one batch the chunks' runs of users follow each other.
-- `applied_at` is set by the transaction that applies the chunk (NULL until
-- then), `held_back` lists the recipients their preferences held back
-- (muted category, erased), packed as user_ids is (NULL when none were):
-- "who got it" is answered from the chunk without an item lookup.
-- idx_chunks_state finds chunks left in a state for a while (pending ones
-- the sweeper re-publishes, unsettled ones a settler settles), and
-- idx_chunks_message_state answers "does this send have a pending
-- chunk on this shard?", asked after every applied chunk.
-- The virtual `batch`, `first_user` and `last_user` read a chunk's batch and
-- the ends of its run from its id and its bytes: idx_chunks_recipients
-- lists a send's recipients in user order by reading, per batch, only the
-- chunks whose run reaches past the cursor, and tests a user against the
-- one chunk of a batch whose range holds them. One entry per chunk, moved
-- only by a state change. `batch` is `chunk_id >> 16`: one value per
-- planned batch (its chunks' ids are `batch_number << 20 | sequence`, and a
-- batch has far fewer than 65,536 chunks), and a chunk split off by a bucket
-- move (bit 63 of its id) is a batch of its own.
CREATE TABLE IF NOT EXISTS message_chunks (
    message_id BIGINT UNSIGNED   NOT NULL,
    chunk_id   BIGINT UNSIGNED   NOT NULL COMMENT 'batch_number << 20 | sequence',
    state      TINYINT UNSIGNED  NOT NULL DEFAULT 0,
    recipients SMALLINT UNSIGNED NOT NULL,
    user_ids   MEDIUMBLOB        NOT NULL,
    attempts   INT UNSIGNED      NOT NULL DEFAULT 0,
    created_at DATETIME(3)       NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    -- Last publish or state change; the sweeper re-publishes old pending chunks.
    updated_at DATETIME(3)       NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    batch      BIGINT UNSIGNED AS (chunk_id >> 16) VIRTUAL,
    first_user BIGINT UNSIGNED AS (CAST(CONV(HEX(REVERSE(LEFT(user_ids, 8))), 16, 10) AS UNSIGNED)) VIRTUAL,
    last_user  BIGINT UNSIGNED AS (CAST(CONV(HEX(REVERSE(RIGHT(user_ids, 8))), 16, 10) AS UNSIGNED)) VIRTUAL,
    applied_at DATETIME(3)       NULL,
    held_back  MEDIUMBLOB        NULL,
    PRIMARY KEY (message_id, chunk_id),
    KEY idx_chunks_state (state, updated_at),
    KEY idx_chunks_message_state (message_id, state),
    KEY idx_chunks_recipients (message_id, state, batch, last_user, first_user)
) ENGINE=InnoDB;

-- Per-shard counters of a send, split in slots so that concurrent chunks of
-- one send (and its readers) do not queue on one row lock. Progress sums
-- them: O(shards x slots). Signed, so a re-drive can subtract in slot 0 and
-- keep every sum exact. `suppressed`: recipients no item was written for
-- (they mute the send's category, or were erased after it was queued).
-- `recalled`: items taken back by a recall.
CREATE TABLE IF NOT EXISTS message_shard_stats (
    message_id     BIGINT UNSIGNED  NOT NULL,
    slot           TINYINT UNSIGNED NOT NULL,
    total          BIGINT NOT NULL DEFAULT 0,
    delivered      BIGINT NOT NULL DEFAULT 0,
    duplicates     BIGINT NOT NULL DEFAULT 0,
    failed         BIGINT NOT NULL DEFAULT 0,
    cancelled      BIGINT NOT NULL DEFAULT 0,
    suppressed     BIGINT NOT NULL DEFAULT 0,
    recalled       BIGINT NOT NULL DEFAULT 0,
    read_count     BIGINT NOT NULL DEFAULT 0,
    chunks         BIGINT NOT NULL DEFAULT 0,
    done_chunks    BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id, slot)
) ENGINE=InnoDB;


-- ---------------------------------------------------------------------------
-- Per-user tables, on the user's shard
-- ---------------------------------------------------------------------------

-- One row per recipient and message. An item is unseen, seen or read, and
-- independently in the inbox or archived: the flags say which (seen is
-- `is_seen OR is_read`), and `seen_time`, `read_time` and `archived_time`
-- say when. The times are never NULL ('1000-01-01 00:00:00.000': not yet):
-- InnoDB stores nothing for a NULL, so setting a nullable time would grow
-- the row and split full pages under a bulk update, where a NOT NULL
-- DATETIME(3) is changed in place. A deleted item stays as a tombstone
-- (`is_deleted`) until retention drops its month, so a redelivered chunk or
-- an announcement's materialization never brings it back. A recall marks
-- the items it takes back (`recalled`) instead of deleting them: the flag
-- changes the row in place and no index entry, makes the recall count each
-- item once, and the rows go with retention's purge of hidden items.
-- No index holds `is_read`, so marking items read or unread changes the row
-- alone: unread pages and counts read the user's range of the primary key,
-- in message id order. idx_items_category serves pages of one category.
--
-- Partitioned by message id range: ids are time-ordered, so a partition is
-- a stretch of time, and expiring a month is dropping its partition.
-- `p_future` is the catch-all: the worker's retention job (or `notifyctl
-- retention`) splits monthly partitions off it before each month starts,
-- so it stays empty.
CREATE TABLE IF NOT EXISTS message_items (
    user_id       BIGINT UNSIGNED NOT NULL,
    message_id    BIGINT UNSIGNED NOT NULL,
    is_read       TINYINT(1)      NOT NULL DEFAULT 0,
    category      VARCHAR(64)     NOT NULL DEFAULT '',
    created_at    DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    expire_at     DATETIME(3)     NULL,
    is_seen       TINYINT(1)      NOT NULL DEFAULT 0,
    is_archived   TINYINT(1)      NOT NULL DEFAULT 0,
    bucket        SMALLINT UNSIGNED NOT NULL DEFAULT (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)),
    seen_time     DATETIME(3)     NOT NULL DEFAULT '1000-01-01 00:00:00.000',
    read_time     DATETIME(3)     NOT NULL DEFAULT '1000-01-01 00:00:00.000',
    archived_time DATETIME(3)     NOT NULL DEFAULT '1000-01-01 00:00:00.000',
    is_deleted    TINYINT(1)      NOT NULL DEFAULT 0,
    recalled      TINYINT(1)      NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, message_id),
    KEY idx_items_category (user_id, category, message_id),
    KEY idx_items_bucket (bucket)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
    PARTITION BY RANGE (message_id) (PARTITION p_future VALUES LESS THAN MAXVALUE);

-- Reads recorded by message, on the reader's shard, written with the read
-- and removed by mark-unread: "who read it" is a range of this key, also
-- when few did. `delivered_at` is the item's created_at, set by the
-- statement that records the read, so a page of readers is a range of this
-- primary key alone.
CREATE TABLE IF NOT EXISTS message_reads (
    message_id   BIGINT UNSIGNED NOT NULL,
    user_id      BIGINT UNSIGNED NOT NULL,
    read_at      DATETIME(3)     NOT NULL,
    bucket       SMALLINT UNSIGNED NOT NULL DEFAULT (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)),
    delivered_at DATETIME(3)     NOT NULL,
    PRIMARY KEY (message_id, user_id),
    KEY idx_message_reads_user (user_id),
    KEY idx_message_reads_bucket (bucket)
) ENGINE=InnoDB;

-- Users who have an announcement in their inbox (its materializations),
-- written in the materializing transaction: an announcement's recipients
-- are these, in user order.
CREATE TABLE IF NOT EXISTS announcement_recipients (
    message_id      BIGINT UNSIGNED NOT NULL,
    user_id         BIGINT UNSIGNED NOT NULL,
    materialized_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    bucket          SMALLINT UNSIGNED NOT NULL DEFAULT (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)),
    PRIMARY KEY (message_id, user_id),
    KEY idx_announcement_recipients_user (user_id),
    KEY idx_announcement_recipients_bucket (bucket)
) ENGINE=InnoDB;

-- Reads waiting to be counted. A filtered read or unread (UpdateItems with
-- `all`, MarkAllRead) changes the user's items and writes one row here in
-- its transaction: which messages it changed (a JSON array) and in which
-- direction. The sends' read counts (message_shard_stats) and readers
-- (message_reads) follow from the row a moment later, out of the user's
-- transaction (notify_store::db::read_backlog), in the transaction that
-- deletes it. Keyed by user first: a bucket move copies a user's rows to a
-- shard whose own counter may have given the same backlog_id to another
-- user's row. idx_read_backlog_id finds the oldest rows left waiting.
CREATE TABLE IF NOT EXISTS read_backlog (
    backlog_id  BIGINT UNSIGNED  NOT NULL AUTO_INCREMENT,
    user_id     BIGINT UNSIGNED  NOT NULL,
    delta       TINYINT          NOT NULL,
    message_ids LONGTEXT         CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    created_at  DATETIME(3)      NOT NULL DEFAULT UTC_TIMESTAMP(3),
    bucket      SMALLINT UNSIGNED NOT NULL DEFAULT (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)),
    PRIMARY KEY (user_id, backlog_id),
    KEY idx_read_backlog_id (backlog_id),
    KEY idx_read_backlog_bucket (bucket)
) ENGINE=InnoDB;

-- A user's inbox state: how far announcements were materialized for them.
-- A materialization locks this row first, so those of one user queue.
CREATE TABLE IF NOT EXISTS user_inbox_state (
    user_id                BIGINT UNSIGNED NOT NULL,
    announcement_watermark BIGINT UNSIGNED NOT NULL DEFAULT 0,
    updated_at             DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    bucket                 SMALLINT UNSIGNED NOT NULL DEFAULT (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)),
    PRIMARY KEY (user_id),
    KEY idx_inbox_state_bucket (bucket)
) ENGINE=InnoDB;

-- A user's preferences, where the fan-out's INSERT checks them in the same
-- statement (one primary-key lookup per recipient, most users have no
-- row). Lists are comma-separated: categories are [a-z0-9_.-] and group ids
-- numbers, so FIND_IN_SET reads them as they are. `erased_before`: the user
-- was erased (AdminService.EraseUser) when ids reached this value, and
-- items of older sends, still queued then, are never written; the row then
-- keeps the user id and that id, nothing else of theirs.
-- idx_user_preferences_erased finds the users erased after a send (rare).
CREATE TABLE IF NOT EXISTS user_preferences (
    user_id          BIGINT UNSIGNED NOT NULL,
    muted_categories VARCHAR(6600)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    muted_group_ids  VARCHAR(21000)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    erased_before    BIGINT UNSIGNED NOT NULL DEFAULT 0,
    updated_at       DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    bucket           SMALLINT UNSIGNED AS (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)) VIRTUAL,
    PRIMARY KEY (user_id),
    KEY idx_user_preferences_bucket (bucket),
    KEY idx_user_preferences_erased (erased_before)
) ENGINE=InnoDB;


-- ---------------------------------------------------------------------------
-- Groups (pull model)
-- ---------------------------------------------------------------------------
-- A group's row, its seq counter and its messages live on the group's home
-- shard (the shard its id hashes to, as a user id's does); a member's cursor
-- lives on the member's shard, beside their inbox. Nothing is written per
-- member when a message is sent.

CREATE TABLE IF NOT EXISTS message_groups (
    group_id   BIGINT UNSIGNED NOT NULL,
    name       VARCHAR(200)    NOT NULL,
    created_at DATETIME(3)     NOT NULL,
    bucket     SMALLINT UNSIGNED AS (((CAST(MOD(CAST((CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)) VIRTUAL,
    PRIMARY KEY (group_id),
    KEY idx_message_groups_bucket (bucket)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The seq counter has its own row: senders lock it to take the next seq,
-- member changes lock the group row, and neither waits for the other.
-- `recalled_seqs`: the recalled seqs, ascending and comma-separated (NULL:
-- none), so that unread counts (max seq - cursor - recalled seqs after the
-- cursor) come from one row per group, never from the messages. Retention
-- drops the seqs every cursor has passed.
CREATE TABLE IF NOT EXISTS group_seqs (
    group_id      BIGINT UNSIGNED NOT NULL,
    max_seq       BIGINT UNSIGNED NOT NULL DEFAULT 0,
    bucket        SMALLINT UNSIGNED AS (((CAST(MOD(CAST((CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)) VIRTUAL,
    recalled_seqs TEXT            NULL,
    PRIMARY KEY (group_id),
    KEY idx_group_seqs_bucket (bucket)
) ENGINE=InnoDB;

-- A group's messages, stored once per group. A NULL idempotency key never
-- collides. A recalled message stays in its group's seq as a tombstone
-- (`recalled_at` set, content cleared). `client` sent it: recalling one's
-- own takes sends.manage, another's (or one without a client) sends.all.
-- Retention finds messages past retention.group_messages_days by message id
-- (ids are time-ordered).
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
    bucket          SMALLINT UNSIGNED AS (((CAST(MOD(CAST((CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((group_id ^ (group_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)) VIRTUAL,
    recalled_at     DATETIME(3)     NULL,
    client          VARCHAR(64)     NOT NULL DEFAULT '',
    PRIMARY KEY (group_id, seq),
    UNIQUE KEY uk_group_messages_idempotency (group_id, sender, idempotency_key),
    KEY idx_group_messages_message (message_id),
    KEY idx_group_messages_bucket (bucket)
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
    bucket       SMALLINT UNSIGNED NOT NULL DEFAULT (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)),
    PRIMARY KEY (user_id, group_id),
    KEY idx_group_members_group (group_id),
    KEY idx_group_members_bucket (bucket)
) ENGINE=InnoDB;


-- ---------------------------------------------------------------------------
-- The shard map, bucket moves and id leases (used on the first shard)
-- ---------------------------------------------------------------------------

-- The bucket -> shard map as versioned data. The config's
-- database.bucket_ranges seed version 1; each change (notifyctl shard add, a
-- bucket move) appends a version, and every api and worker replica routes
-- by the newest one it can serve. A version can freeze buckets for writes
-- (`frozen`, text form `512-767,900-900`, shard_router::BucketSet): a
-- bucket move publishes its map with the moving buckets frozen, copies
-- their last changes once every live replica reports that version (so
-- nothing writes to them by an older map), then publishes the flipped map
-- unfrozen. Writers to a frozen bucket wait for the version that ends the
-- freeze, and reads go on at the source.
CREATE TABLE IF NOT EXISTS shard_map_versions (
    version    BIGINT UNSIGNED NOT NULL,
    shard_map  TEXT            NOT NULL COMMENT 'shard=from-to,...;... (shard_router::ShardMap text form)',
    frozen     VARCHAR(4096)   NOT NULL DEFAULT '',
    reason     VARCHAR(256)    NOT NULL,
    created_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Which map version each running replica routes by, renewed every refresh:
-- a change is in force everywhere once every live replica reports it.
-- `schema_version` is the newest migration the replica's build holds, so
-- that a contract step (`notifyctl migrate --contract`) runs only once no
-- live replica still needs what it removes.
CREATE TABLE IF NOT EXISTS shard_map_replicas (
    replica        VARCHAR(128)    NOT NULL COMMENT 'role host:pid:random token of the process',
    role           VARCHAR(16)     NOT NULL,
    version        BIGINT UNSIGNED NOT NULL,
    refused        BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'newest version it could not serve, 0 if none',
    seen_at        DATETIME(3)     NOT NULL COMMENT 'UTC, in the database clock',
    schema_version BIGINT UNSIGNED NOT NULL DEFAULT 0
        COMMENT 'newest migration of the build the replica runs; 0: a build before this column',
    PRIMARY KEY (replica)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The journal of bucket moves (`notifyctl shard move`): one active move at
-- a time, resumed from here after a crash of its mover.
CREATE TABLE IF NOT EXISTS shard_moves (
    move_id           BIGINT UNSIGNED   NOT NULL AUTO_INCREMENT,
    from_bucket       SMALLINT UNSIGNED NOT NULL,
    to_bucket         SMALLINT UNSIGNED NOT NULL,
    target            INT UNSIGNED      NOT NULL,
    batch             SMALLINT UNSIGNED NOT NULL COMMENT 'buckets frozen and flipped together',
    state             VARCHAR(16)       NOT NULL COMMENT 'running, paused, done, aborted',
    copied_to         INT               NOT NULL COMMENT 'last bucket of the first copy pass',
    flipped_to        INT               NOT NULL COMMENT 'last bucket flipped to the target',
    cleaned_to        INT               NOT NULL COMMENT 'last bucket removed from its source',
    rows_copied       BIGINT UNSIGNED   NOT NULL DEFAULT 0,
    longest_freeze_ms BIGINT UNSIGNED   NOT NULL DEFAULT 0,
    mover             VARCHAR(128)      NOT NULL DEFAULT '' COMMENT 'host:pid of the process running it',
    heartbeat_at      DATETIME(3)       NULL COMMENT 'UTC; a mover silent for 60 s can be taken over',
    detail            VARCHAR(512)      NOT NULL DEFAULT '',
    created_at        DATETIME(3)       NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at        DATETIME(3)       NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    PRIMARY KEY (move_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Message id instance leases: a live process holds one of the 1,024
-- instance ids of the id layout and renews it, so two processes never
-- issue ids from the same instance.
CREATE TABLE IF NOT EXISTS instance_leases (
    instance   SMALLINT UNSIGNED NOT NULL,
    holder     VARCHAR(128)      NOT NULL COMMENT 'host:pid:random token of the process',
    expires_at DATETIME(3)       NOT NULL COMMENT 'UTC, in the database clock',
    PRIMARY KEY (instance)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;


-- ---------------------------------------------------------------------------
-- Outboxes, operations and repairs
-- ---------------------------------------------------------------------------

-- A control operation on a send (cancel, recall, edit), recorded on the
-- send's home shard in the same transaction as the status or content change
-- it stands for: the durable intent that the caller's api, then any
-- worker's sweeper, drives to the end on every shard, whatever fails
-- midway. The row goes once every shard's part is done.
-- `generation` grows when the operation is asked for again (an edit after
-- an edit), and `shards_done` lists the shards whose visible part (a
-- content copy revoked or edited, its recipients' cached badges and pages
-- retired) is done for that generation. `retire` says which cached badges
-- and pages the operation retires: 0 none (nothing delivered yet), 1 the
-- recipients' (per chunk, read from the send's chunks on each shard),
-- 2 every user's (the announcement epoch: an announcement, or a send over
-- control.retire_recipients_max). A drive holds `leased_until` (renewed as
-- it goes, under `lease_token`), and the sweeper takes operations whose
-- lease ran out (idx_operations_due).
CREATE TABLE IF NOT EXISTS message_operations (
    message_id   BIGINT UNSIGNED  NOT NULL,
    kind         TINYINT UNSIGNED NOT NULL COMMENT '1 cancel, 2 recall, 3 edit',
    generation   INT UNSIGNED     NOT NULL DEFAULT 1,
    retire       TINYINT UNSIGNED NOT NULL DEFAULT 0,
    shards_done  VARCHAR(1024)    NOT NULL DEFAULT '',
    leased_until DATETIME(3)      NOT NULL,
    lease_token  BIGINT UNSIGNED  NOT NULL DEFAULT 0,
    attempts     INT UNSIGNED     NOT NULL DEFAULT 0,
    last_error   VARCHAR(255)     NOT NULL DEFAULT '',
    created_at   DATETIME(3)      NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (message_id, kind),
    KEY idx_operations_due (leased_until)
) ENGINE=InnoDB;

-- Users whose cached badge, inbox pages and group cursors a write could not
-- retire because Redis did not answer: written in the write's transaction
-- (an item update, an announcement's materialization, a preference change,
-- a group ack), so the write succeeds with Redis away. Every worker's
-- settler retires the user's cached state once Redis answers again, then
-- deletes the row (unless a later write stamped it again since).
CREATE TABLE IF NOT EXISTS badge_repairs (
    user_id    BIGINT UNSIGNED NOT NULL,
    changed_at DATETIME(6)     NOT NULL,
    PRIMARY KEY (user_id)
) ENGINE=InnoDB;

-- Gateway events recorded in the transaction of the change they report (an
-- item update, a preference change, a group ack, send, recall or member
-- change, an erasure, an announcement's start), on the shard of that
-- transaction. The api that made the change publishes it after the commit
-- and deletes the row; a row left (the publish failed, the api died first)
-- is published by every worker's relay. `body` is a `BusEvent` (JSON) that
-- tells every gateway what to refresh.
CREATE TABLE IF NOT EXISTS event_outbox (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    body       BLOB            NOT NULL,
    created_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (id)
) ENGINE=InnoDB;

-- A send's webhook event (message.completed, message.recalled,
-- message.failed), recorded in the transaction of the change it reports, on
-- the shard that change is on, when some endpoint asked for it. The process
-- that made the change queues it in RabbitMQ right after the commit and
-- deletes the row; a row still here at `due_at` (that publish failed, or
-- the process died in between) is queued by a worker's relay, which first
-- moves due_at on by a lease so that two workers do not take it at once.
-- `event_key` is 16 random bytes: every webhook-id of the event derives from
-- it and the endpoint's url, so an event queued twice reaches an endpoint
-- under one id, which receivers dedupe. `created_at` is when the change was
-- made (the payload's timestamp), `attempts` how often the relay took it.
CREATE TABLE IF NOT EXISTS webhook_outbox (
    event_key  BINARY(16)          NOT NULL,
    message_id BIGINT UNSIGNED     NOT NULL,
    event      VARCHAR(32)         CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    chunk_id   BIGINT UNSIGNED     NULL,
    created_at DATETIME(3)         NOT NULL,
    due_at     DATETIME(3)         NOT NULL,
    attempts   INT UNSIGNED        NOT NULL DEFAULT 0,
    PRIMARY KEY (event_key),
    KEY idx_webhook_outbox_due (due_at)
) ENGINE=InnoDB;

-- The item.read feed: reads that item.read webhooks report, recorded
-- durably. While some endpoint asks for item.read, a read by ids writes one
-- row per item it changed to read, in its own transaction, and a filtered
-- read writes them when its read_backlog row is counted. A worker's relay
-- takes the rows a batch at a time (READ COMMITTED, FOR UPDATE SKIP LOCKED),
-- queues one item.read per message and endpoint, and deletes what it queued
-- in the same transaction, so each read is queued at least once. On the
-- user's shard but keyed by message (the relay batches by message) and not
-- moved with the user's bucket: a row is an event waiting to be queued, and
-- the relay drains every shard. An erasure deletes the user's rows.
CREATE TABLE IF NOT EXISTS read_feed (
    message_id BIGINT UNSIGNED NOT NULL,
    user_id    BIGINT UNSIGNED NOT NULL,
    read_at    DATETIME(3)     NOT NULL,
    PRIMARY KEY (message_id, user_id),
    KEY idx_read_feed_user (user_id)
) ENGINE=InnoDB;


-- ---------------------------------------------------------------------------
-- Audit
-- ---------------------------------------------------------------------------

-- Lifecycle and admin actions: who did what to which send or group, when,
-- and how it ended. A record lives on its target's home shard (`bucket` is
-- the target's), a client's own actions without a target on the shard of
-- the client's name (`bucket` NULL: they stay where they were written), so
-- the history of one send is one indexed range on one shard.
CREATE TABLE IF NOT EXISTS audit_log (
    audit_id    BIGINT UNSIGNED NOT NULL COMMENT 'time-ordered, from the message id generator',
    at          DATETIME(3)     NOT NULL,
    client      VARCHAR(64)     NOT NULL,
    action      VARCHAR(64)     NOT NULL,
    target_kind VARCHAR(16)     NOT NULL DEFAULT '' COMMENT 'message, group or empty',
    target_id   BIGINT UNSIGNED NOT NULL DEFAULT 0,
    outcome     VARCHAR(32)     NOT NULL COMMENT 'ok, or the gRPC code of the failure',
    detail      VARCHAR(512)    NOT NULL DEFAULT '',
    bucket      SMALLINT UNSIGNED AS (IF(target_kind = '', NULL, ((CAST(MOD(CAST((CAST(MOD(CAST((target_id ^ (target_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((target_id ^ (target_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((target_id ^ (target_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((target_id ^ (target_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024))) VIRTUAL,
    PRIMARY KEY (audit_id),
    KEY idx_audit_target (target_kind, target_id, audit_id),
    KEY idx_audit_client (client, audit_id),
    KEY idx_audit_bucket (bucket)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;


-- ---------------------------------------------------------------------------
-- Retention
-- ---------------------------------------------------------------------------

-- Users whose cached badge must be invalidated because a month of their
-- items was dropped: filled (server side) just before the drop, drained in
-- pages after it, so retention holds no list of users in memory, and a run
-- that dies between the drop and the invalidation is finished by the next.
CREATE TABLE IF NOT EXISTS retention_pending_badges (
    user_id BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (user_id)
) ENGINE=InnoDB;
