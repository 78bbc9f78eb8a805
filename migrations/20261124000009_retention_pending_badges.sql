-- Users whose cached badge must be invalidated because a month of their
-- items was dropped: filled (server side) just before the drop, drained in
-- pages after it, so retention holds no list of users in memory and a run
-- that dies between the drop and the invalidation is finished by the next.
CREATE TABLE IF NOT EXISTS retention_pending_badges (
    user_id BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (user_id)
) ENGINE=InnoDB;
