-- Recalling a group message (RecallGroupMessage): the message stays in its
-- group's seq as a tombstone (group_messages.recalled_at, content cleared).
--
-- The recalled seqs, ascending and comma-separated, beside the counter, so
-- that unread counts (max seq - cursor - recalled seqs after the cursor) are
-- answered from one row per group, never by reading the messages. Retention
-- drops the seqs every cursor has passed. NULL: none recalled.
ALTER TABLE group_seqs
    ADD COLUMN recalled_seqs TEXT NULL;

-- The client that sent a group message: recalling one's own takes
-- sends.manage, another's sends.all. Messages sent before this column have
-- none, so only sends.all recalls them.
ALTER TABLE group_messages
    ADD COLUMN client VARCHAR(64) NOT NULL DEFAULT '';
