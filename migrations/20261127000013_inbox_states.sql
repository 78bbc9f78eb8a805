-- Item states, preferences and erasure (expand only: pods of the version
-- before keep working against it during a rollout; what they do not know of,
-- they ignore, see docs/operations.md "Upgrades").
--
-- An item is unseen -> seen -> read, and independently in the inbox or
-- archived; a deleted item stays as a tombstone (deleted_at set) until
-- retention drops its month, so a redelivered chunk or an announcement's
-- materialization never brings it back. Seen is `is_seen OR is_read`: items
-- read before this migration count as seen without a backfill.
ALTER TABLE message_items
    ADD COLUMN is_seen     TINYINT(1)  NOT NULL DEFAULT 0,
    ADD COLUMN seen_at     DATETIME(3) NULL,
    ADD COLUMN is_archived TINYINT(1)  NOT NULL DEFAULT 0,
    ADD COLUMN archived_at DATETIME(3) NULL,
    ADD COLUMN deleted_at  DATETIME(3) NULL;

-- Recipients a send did not write an item for: the user mutes the send's
-- category, or was erased after the send was queued.
ALTER TABLE message_shard_stats
    ADD COLUMN suppressed BIGINT NOT NULL DEFAULT 0 AFTER cancelled;

-- A critical send ignores mutes; the flag travels with the content copy,
-- which is what a chunk's apply and an announcement's materialization read.
ALTER TABLE messages
    ADD COLUMN critical TINYINT(1) NOT NULL DEFAULT 0 AFTER lane;
ALTER TABLE message_contents
    ADD COLUMN critical TINYINT(1) NOT NULL DEFAULT 0;

-- A user's preferences, on the user's shard, where the fan-out's INSERT
-- checks them in the same statement (one primary-key lookup per recipient;
-- most users have no row). Lists are comma-separated: categories are
-- [a-z0-9_.-] and group ids numbers, so FIND_IN_SET reads them as they are.
-- erased_before: the user was erased (AdminService.EraseUser) when ids
-- reached this value; items of older sends, still queued then, are never
-- written. The row keeps the user id and that id, nothing else of theirs.
CREATE TABLE IF NOT EXISTS user_preferences (
    user_id          BIGINT UNSIGNED NOT NULL,
    muted_categories VARCHAR(6600)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    muted_group_ids  VARCHAR(21000)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    erased_before    BIGINT UNSIGNED NOT NULL DEFAULT 0,
    updated_at       DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    bucket           SMALLINT UNSIGNED AS (((CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) ^ (CAST(MOD(CAST((user_id ^ (user_id >> 33)) AS DECIMAL(65,0)) * 18397679294719823053, 18446744073709551616) AS UNSIGNED) >> 33)) AS DECIMAL(65,0)) * 14181476777654086739, 18446744073709551616) AS UNSIGNED) >> 33)) % 1024)) VIRTUAL,
    PRIMARY KEY (user_id),
    KEY idx_user_preferences_bucket (bucket)
) ENGINE=InnoDB;
