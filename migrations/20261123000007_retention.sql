-- Retention (services/core/src/retention): message_items partitioned by
-- message id range. Ids are time-ordered, so a range is a stretch of time,
-- and expiring a month is dropping its partition. This leaves one catch-all
-- partition; the worker's retention job (or `notifyctl retention`) splits
-- monthly partitions off it before each month starts, so it stays empty.
-- On an install that already holds items this ALTER copies the table once
-- (run it in a quiet hour); the first month split off then also holds every
-- older item, and goes when that month passes the horizon.
ALTER TABLE message_items
    PARTITION BY RANGE (message_id) (PARTITION p_future VALUES LESS THAN MAXVALUE);

-- When a send was cancelled, so its hidden items are purged after a grace.
ALTER TABLE message_contents ADD COLUMN revoked_at DATETIME(3) NULL;

-- Retention deletes a send's idempotency key by message id.
ALTER TABLE idempotency_keys ADD KEY idx_idempotency_keys_message (message_id);
