-- No index of the items holds `is_read` any more (expand/contract, step one
-- of two): marking items read or unread changes the row alone, and no
-- longer moves an entry of `idx_items_unread` (user_id, is_read,
-- message_id) from one end of the user's range to the other. For
-- UpdateItems over 10,000 items that move was half of the UPDATE.
--
-- New pods read unread-only pages and count unread by the primary key: a
-- user's items are one range of it, in message id order, every column in
-- place (notify_store::db::items).
--
-- Pods of the version before force `idx_items_unread` for unread-only
-- pages, so the name stays while they may run, over (user_id, message_id):
-- their pages read the same items through it. The release after this one
-- drops it (contract). Built in place without locking the table.
ALTER TABLE message_items
    DROP INDEX idx_items_unread,
    ADD KEY idx_items_unread (user_id, message_id),
    ALGORITHM=INPLACE, LOCK=NONE;
