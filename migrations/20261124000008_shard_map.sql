-- The bucket -> shard map as versioned data (used on the first shard, the
-- directory, like instance_leases). The config's database.bucket_ranges seed
-- version 1; each change (notifyctl shard add, a bucket move) appends a
-- version; every api and worker replica routes by the newest one it can serve.
CREATE TABLE IF NOT EXISTS shard_map_versions (
    version    BIGINT UNSIGNED NOT NULL,
    shard_map  TEXT            NOT NULL COMMENT 'shard=from-to,...;... (shard_router::ShardMap text form)',
    reason     VARCHAR(256)    NOT NULL,
    created_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Which version each running replica routes by, renewed every refresh; a
-- change is in force everywhere once every live replica reports it.
CREATE TABLE IF NOT EXISTS shard_map_replicas (
    replica VARCHAR(128)    NOT NULL COMMENT 'role host:pid:random token of the process',
    role    VARCHAR(16)     NOT NULL,
    version BIGINT UNSIGNED NOT NULL,
    refused BIGINT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'newest version it could not serve, 0 if none',
    seen_at DATETIME(3)     NOT NULL COMMENT 'UTC, in the database clock',
    PRIMARY KEY (replica)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
