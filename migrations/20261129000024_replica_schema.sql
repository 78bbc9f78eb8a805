-- Which migrations each running replica was built with, so that a contract
-- step (migrations/contract/, `notifyctl migrate --contract`) runs only once
-- no live replica still needs what it removes. Replicas of the versions
-- before this column write nothing into it and read as 0: older than any
-- contract.
ALTER TABLE shard_map_replicas
    ADD COLUMN schema_version BIGINT UNSIGNED NOT NULL DEFAULT 0
        COMMENT 'newest migration of the build the replica runs; 0: a build before this column';
