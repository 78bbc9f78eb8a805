-- Personalized sends (docs/templates.md). An expand step only: a build
-- before it neither reads nor writes these columns (its writes name their
-- own columns), so no contract migration follows.
--
-- `template`: the content's Template as JSON (vars, translations,
-- recipient_vars), NULL for plain content; on the control record and on
-- each shard's content copy, which an edit changes together, and on a
-- group message (send-wide vars only).
ALTER TABLE messages ADD COLUMN IF NOT EXISTS template MEDIUMTEXT NULL;
ALTER TABLE message_contents ADD COLUMN IF NOT EXISTS template MEDIUMTEXT NULL;
ALTER TABLE group_messages ADD COLUMN IF NOT EXISTS template MEDIUMTEXT NULL;
-- `vars`: each recipient's own variables, aligned with `user_ids`, as
-- length-prefixed JSON objects (notify_store::db::chunks::encode_vars);
-- NULL when the send's recipients carry none.
ALTER TABLE message_chunks ADD COLUMN IF NOT EXISTS vars MEDIUMBLOB NULL;
-- `vars`: the recipient's own variables (a JSON object) that the reader's
-- render fills the content's template with; NULL for plain items, an
-- announcement's and a group's.
ALTER TABLE message_items ADD COLUMN IF NOT EXISTS vars TEXT NULL;
