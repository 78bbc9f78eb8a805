-- Recorded deliveries (expand only): a chunk applied by this version keeps
-- when it was applied and which of its recipients their preferences held
-- back, so "who got it" is answered from the chunk and the reads recorded by
-- message, without looking each recipient's item up (ListRecipients).
--
-- applied_at: set by the transaction that applies the chunk (the one that
--   writes its items); NULL on a chunk not applied yet, or applied before
--   this migration or by an older worker during a rollout: the recipients
--   queries look such a chunk's items up, as before.
-- held_back: the recipients of the chunk held back by their preferences
--   (muted category, erased), packed as user_ids is (sorted little-endian
--   u64s); NULL when none were.
--
-- Both columns are added at the end with a NULL default: instant in MariaDB,
-- no copy. The index finds the users erased after a send (AdminService
-- EraseUser sets erased_before): rare, and its entries change only then.
ALTER TABLE message_chunks
    ADD COLUMN applied_at DATETIME(3) NULL,
    ADD COLUMN held_back MEDIUMBLOB NULL;

ALTER TABLE user_preferences
    ADD KEY idx_user_preferences_erased (erased_before);
