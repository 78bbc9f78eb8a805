-- Announcements (audience = 2) are stored once: a control record on the home
-- shard and a content copy on every shard. A cancelled announcement's copies
-- are revoked, which hides every materialized item of it at once.
ALTER TABLE message_contents ADD COLUMN revoked TINYINT(1) NOT NULL DEFAULT 0;

-- Finds active announcements on each home shard.
ALTER TABLE messages ADD KEY idx_messages_audience_status (audience, status);
