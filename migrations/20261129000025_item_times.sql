-- When an item was seen, read and archived, in columns that are never NULL
-- ('1000-01-01': not yet), and whether it was deleted, as a flag (no call
-- shows when). InnoDB stores nothing for a NULL, so setting seen_at,
-- read_at, archived_at or deleted_at from NULL grew every row it changed,
-- and full pages were rewritten or split: marking 10,000 items seen took
-- 101 ms against 24 ms when the time was changed in place (a scratch copy).
-- A NOT NULL DATETIME(3) keeps its 7 bytes in every row, so new pods change
-- the times in place (notify_store::db::item_times). The rows grow by 22
-- bytes; with idx_items_unread dropped by the same contract step, the
-- table and its indexes take a tenth less space than before (2M items on a
-- scratch copy: 405 against 452 MB), the rows themselves a third more.
--
-- Expand: added instantly (no copy of the table; old pods ignore the
-- columns). MariaDB stores no bytes for an instantly added column while a
-- row holds its default, in rows written after the ALTER as well, so the
-- bytes are laid out by the rebuild of the contract step
-- (migrations/contract/20261129000025_items_rebuild.sql); until then the
-- times still grow the rows, as before.
--
-- The old columns stay: pods of the version before write and read them
-- (they hide a deleted item by deleted_at alone). New pods read an item's
-- time as the later of the two, and write every change to both until the
-- contract step has run on the shard (the statement reads
-- _notify_contract_migrations), to the new ones only from then on.
ALTER TABLE message_items
    ADD COLUMN seen_time     DATETIME(3) NOT NULL DEFAULT '1000-01-01 00:00:00.000',
    ADD COLUMN read_time     DATETIME(3) NOT NULL DEFAULT '1000-01-01 00:00:00.000',
    ADD COLUMN archived_time DATETIME(3) NOT NULL DEFAULT '1000-01-01 00:00:00.000',
    ADD COLUMN is_deleted    TINYINT(1)  NOT NULL DEFAULT 0,
    ALGORITHM=INSTANT;

-- The contract step's record (notify_store::db::contract), created here as
-- sqlx creates it, so that statements can ask whether a contract migration
-- ran on this shard before the step first ran.
CREATE TABLE IF NOT EXISTS _notify_contract_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);
