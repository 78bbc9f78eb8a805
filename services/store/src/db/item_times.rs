//! When an item was seen, read and archived, and whether it was deleted.
//!
//! Two columns hold each. `seen_at`, `read_at`, `archived_at` and
//! `deleted_at` are NULL until set: pods of the versions before migration
//! `20261129000025_item_times` write and read them, and setting one from
//! NULL grows the row (InnoDB stores nothing for a NULL), which split full
//! pages under a bulk update. `seen_time`, `read_time` and `archived_time`
//! are never NULL ([`not_yet!`] until set), and `is_deleted` is a flag (no
//! call shows when an item was deleted), so that once the contract step has
//! laid their bytes out, this version changes them in place. The rows grow
//! by 22 bytes (a third, on a scratch copy); with `idx_items_unread`
//! dropped by the same step, the table and its indexes take a tenth less.
//!
//! Until the contract step ran `20261129000025_items_rebuild` on a shard
//! (which it does once no pod of those versions runs), this version writes
//! the old column of each change as well ([`old_too!`]): those pods hide a
//! deleted item by `deleted_at`, count a read by `read_at`, and show the
//! times. From then on it writes the never-NULL columns only.
//!
//! Every read goes through the macros here: an item's time is the later of
//! its two columns (either side may have changed it last, and times only
//! grow), and a read or archive time shows only while the item is read or
//! archived (an unread or unarchive by the other side leaves this side's
//! column as it was). Seen falls back to the read time: items read before
//! seen existed count as seen then.
//!
//! The macros expand to string literals (`concat!`), so that queries built
//! from them stay `&'static str`. `$i` is the items' alias.

/// "Not yet" in the never-NULL time columns, as SQL.
macro_rules! not_yet {
    () => {
        "TIMESTAMP'1000-01-01 00:00:00.000'"
    };
}

/// When item `$i` was read, NULL while it is unread.
macro_rules! read_time {
    ($i:literal) => {
        concat!(
            "IF(",
            $i,
            ".is_read = 1, NULLIF(GREATEST(COALESCE(",
            $i,
            ".read_at, ",
            not_yet!(),
            "), ",
            $i,
            ".read_time), ",
            not_yet!(),
            "), NULL)"
        )
    };
}

/// When item `$i` was archived, NULL while it is in the inbox.
macro_rules! archived_time {
    ($i:literal) => {
        concat!(
            "IF(",
            $i,
            ".is_archived = 1, NULLIF(GREATEST(COALESCE(",
            $i,
            ".archived_at, ",
            not_yet!(),
            "), ",
            $i,
            ".archived_time), ",
            not_yet!(),
            "), NULL)"
        )
    };
}

/// When item `$i` was first seen (or read, for items read before seen
/// existed), NULL while it is unseen.
macro_rules! seen_time {
    ($i:literal) => {
        concat!(
            "COALESCE(NULLIF(GREATEST(COALESCE(",
            $i,
            ".seen_at, ",
            not_yet!(),
            "), ",
            $i,
            ".seen_time), ",
            not_yet!(),
            "), ",
            read_time!($i),
            ")"
        )
    };
}

/// True when item `$i` has a seen time of its own (not only a read's).
macro_rules! has_seen_time {
    ($i:literal) => {
        concat!("(", $i, ".seen_time > ", not_yet!(), " OR ", $i, ".seen_at IS NOT NULL)")
    };
}

/// Item `$i` is not deleted (by either build).
macro_rules! not_deleted {
    ($i:literal) => {
        concat!("(", $i, ".deleted_at IS NULL AND ", $i, ".is_deleted = 0)")
    };
}

/// Whether pods of the versions that read only the old columns may still
/// run against this shard: until the contract step ran
/// `20261129000025_items_rebuild` here. A constant subquery, evaluated once
/// a statement however often it appears.
macro_rules! old_pods_may_run {
    () => {
        "NOT EXISTS (SELECT 1 FROM _notify_contract_migrations \
         WHERE version = 20261129000025 AND success = 1)"
    };
}

/// An assignment of the old column `$column` of the items `i` to `$value`
/// while [`old_pods_may_run!`], and to itself (no change) after.
macro_rules! old_too {
    ($column:literal, $value:expr) => {
        concat!("i.", $column, " = IF(", old_pods_may_run!(), ", ", $value, ", i.", $column, ")")
    };
}
