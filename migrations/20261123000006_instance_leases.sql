-- Message id instance leases: a live process holds one of the 1,024
-- instance ids of the id layout and renews it, so two processes never issue
-- ids from the same instance. Used on the first shard of the map only
-- (created on every shard, like every table). Expand-only.
CREATE TABLE IF NOT EXISTS instance_leases (
    instance   SMALLINT UNSIGNED NOT NULL,
    holder     VARCHAR(128)      NOT NULL COMMENT 'host:pid:random token of the process',
    expires_at DATETIME(3)       NOT NULL COMMENT 'UTC, in the database clock',
    PRIMARY KEY (instance)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
