-- A recall marks the items it took back instead of deleting them: the
-- recall revoked the send's content copies first, so every read of items
-- (lists, counts, updates) already leaves them out, and their rows go with
-- retention's purge of hidden items (retention.purge_hidden_after_secs
-- later), as a cancelled send's do. Deleting them in the recall marked each
-- row and its index entries deleted, and InnoDB's purge then removed them
-- again beside the recall: it took longer than the fan-out that inserted
-- them. Setting this flag changes the row in place and no index entry.
--
-- The flag is what makes the recall exactly once per item: a recipient in
-- two chunks of the send (repeated across AppendRecipients batches) has one
-- item, counted by the first chunk taken back, as the delete did.
--
-- Expand: added instantly (no copy of the table); old pods name their
-- columns, and their recall tasks delete the items as before. Nothing to
-- backfill or contract.
ALTER TABLE message_items
    ADD COLUMN recalled TINYINT(1) NOT NULL DEFAULT 0,
    ALGORITHM=INSTANT;
