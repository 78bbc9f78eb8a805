-- A version of the shard map can freeze buckets for writes: a bucket move
-- publishes its map with the moving buckets frozen, copies their last
-- changes once every live replica reports that version (so nothing writes
-- to them by an older map), then publishes the flipped map unfrozen.
-- Writers to a frozen bucket wait for the version that ends the freeze;
-- reads go on at the source. Text form: `512-767,900-900` (shard_router::BucketSet).
ALTER TABLE shard_map_versions
    ADD COLUMN frozen VARCHAR(4096) NOT NULL DEFAULT '' AFTER shard_map;
