-- The item.read feed (expand only): reads of items that item.read webhooks
-- report, recorded durably, so that an api killed after a read loses none
-- of them (before, each api gathered them in memory for a second).
--
-- While some endpoint asked for item.read, a read by ids (MarkRead,
-- UpdateItems with ids) writes one row per item it changed to read, in its
-- own transaction; a filtered read writes them when its read_backlog row is
-- counted (notify_store::db::read_backlog::apply), for the items read then.
-- A worker's relay takes the rows a batch at a time (READ COMMITTED, FOR
-- UPDATE SKIP LOCKED: two workers never take the same row, and nothing it
-- holds stops a read from adding rows), queues one item.read per message
-- and endpoint for up to webhooks.read_batch_users readers, and deletes
-- what it queued in the same transaction. So each read is queued at least
-- once whatever fails after its commit.
--
-- On the user's shard, but keyed by message (the relay batches by message)
-- and not moved with the user's bucket: a row is an event waiting to be
-- queued, not the user's data, and the relay drains every shard whoever
-- owns the user now. An erasure deletes the user's rows (by user_id).
--
-- Rows live about a second (longer while no worker runs or RabbitMQ is
-- away); a new table, so an older version running beside this one during
-- a rollout never writes here (its apis keep gathering reads in memory).
CREATE TABLE IF NOT EXISTS read_feed (
    message_id BIGINT UNSIGNED NOT NULL,
    user_id    BIGINT UNSIGNED NOT NULL,
    read_at    DATETIME(3)     NOT NULL,
    PRIMARY KEY (message_id, user_id),
    KEY idx_read_feed_user (user_id)
) ENGINE=InnoDB;
