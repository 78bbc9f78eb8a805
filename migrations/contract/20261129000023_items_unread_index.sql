-- Contract of migration 23, run once every live replica was built with it
-- or later (`notifyctl migrate --contract`): since then idx_items_unread
-- holds (user_id, message_id) only for pods of the version before, which
-- force it by name for unread-only pages, and every delivery still wrote an
-- entry of it. Dropping a secondary index changes no row: in place, without
-- locking the table.
ALTER TABLE message_items
    DROP INDEX IF EXISTS idx_items_unread,
    ALGORITHM=INPLACE, LOCK=NONE;
