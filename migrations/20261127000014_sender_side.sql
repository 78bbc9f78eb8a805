-- The sender's side: who got a send and who read it, recall, edit
-- (expand only, like every migration).
--
-- A send's recipients on a shard are its chunks there, each a sorted run of
-- up to 500 user ids; within one batch the chunks' runs follow each other.
-- Listing them in user order reads, per batch, the chunks whose last user
-- lies past the cursor: these columns and this index say which, from the
-- stored bytes (little-endian u64s), so no write path changes and existing
-- chunks are covered. A split chunk (bit 63 of its id) is a batch of its
-- own. The index grows with chunks (one per 500 recipients), and only a
-- chunk's state changes move it: message_items gets no new index.
ALTER TABLE message_chunks
    ADD COLUMN batch      BIGINT UNSIGNED AS (chunk_id >> 16) VIRTUAL,
    ADD COLUMN first_user BIGINT UNSIGNED AS (CAST(CONV(HEX(REVERSE(LEFT(user_ids, 8))), 16, 10) AS UNSIGNED)) VIRTUAL,
    ADD COLUMN last_user  BIGINT UNSIGNED AS (CAST(CONV(HEX(REVERSE(RIGHT(user_ids, 8))), 16, 10) AS UNSIGNED)) VIRTUAL,
    ADD KEY idx_chunks_recipients (message_id, state, batch, last_user);

-- Reads recorded by message, on the reader's shard, written with the read
-- (and removed by mark-unread): "who read it" is a range of this key, also
-- when few did. Reads are rare next to deliveries.
CREATE TABLE IF NOT EXISTS message_reads (
    message_id BIGINT UNSIGNED NOT NULL,
    user_id    BIGINT UNSIGNED NOT NULL,
    read_at    DATETIME(3)     NOT NULL,
    bucket     SMALLINT UNSIGNED AS (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)) VIRTUAL,
    PRIMARY KEY (message_id, user_id),
    KEY idx_message_reads_user (user_id),
    KEY idx_message_reads_bucket (bucket)
) ENGINE=InnoDB;

-- Users who have an announcement in their inbox (its materializations), on
-- the user's shard, written in the materializing transaction: an
-- announcement's recipients are these, in user order.
CREATE TABLE IF NOT EXISTS announcement_recipients (
    message_id      BIGINT UNSIGNED NOT NULL,
    user_id         BIGINT UNSIGNED NOT NULL,
    materialized_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    bucket          SMALLINT UNSIGNED AS (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)) VIRTUAL,
    PRIMARY KEY (message_id, user_id),
    KEY idx_announcement_recipients_user (user_id),
    KEY idx_announcement_recipients_bucket (bucket)
) ENGINE=InnoDB;

-- Recall: status 5 (RECALLED); chunk states 5 (recalled: its items taken
-- back) and 6 (recalled, the recipients' badges not yet invalidated, as 4
-- is for a delivery). Items taken back are counted per shard.
ALTER TABLE message_shard_stats
    ADD COLUMN recalled BIGINT NOT NULL DEFAULT 0 AFTER suppressed;

-- Edits: when the content last changed (items show it; an edit updates the
-- home record and each shard's copy, never an item).
ALTER TABLE messages
    ADD COLUMN edited_at DATETIME(3) NULL AFTER finished_at;
ALTER TABLE message_contents
    ADD COLUMN edited_at DATETIME(3) NULL;

-- A recalled group message stays in its group's seq as a tombstone.
ALTER TABLE group_messages
    ADD COLUMN recalled_at DATETIME(3) NULL;
