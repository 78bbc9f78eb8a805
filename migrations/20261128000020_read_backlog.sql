-- Reads waiting to be counted (expand only: a table no older version
-- knows of; an older pod keeps counting reads in its own update, which
-- this version's counting agrees with, see docs/operations.md "Upgrades").
--
-- A filtered read or unread (UpdateItems with `all`, MarkAllRead) changes
-- the user's items and writes one row here, in its transaction: which
-- messages it changed, as a JSON array, and in which direction. The send's
-- read counts (`message_shard_stats`) and "who read it" (`message_reads`)
-- of those messages follow from the row a moment later, out of the user's
-- transaction (notify_store::db::read_backlog), where before the update
-- wrote 10,000 read counts and 10,000 readers for a 10,000-item inbox
-- itself. The row is deleted in the transaction that counts it.
--
-- Keyed by user first: a bucket move copies a user's rows to a shard whose
-- own counter may have given the same backlog_id to another user's row.
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
