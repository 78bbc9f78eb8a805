-- status_version increases with every status change. The Redis status cache
-- keeps the highest version it has seen, so a delayed write of an older status
-- can never overwrite a newer one, and a completion check that raced a
-- redrive fails on the version it read.
ALTER TABLE messages ADD COLUMN status_version BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER status;

-- "Does this send have a pending chunk on this shard?" is asked after every
-- applied chunk; answer it from an index instead of a scan of the send's chunks.
ALTER TABLE message_chunks ADD KEY idx_chunks_message_state (message_id, state);
