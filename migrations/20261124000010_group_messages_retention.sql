-- Retention finds a group's messages past retention.group_messages_days by
-- message id (ids are time-ordered).
ALTER TABLE group_messages ADD KEY idx_group_messages_message (message_id);
