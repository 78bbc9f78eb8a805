//! When an item was seen, read and archived, and whether it was deleted.
//!
//! `seen_time`, `read_time` and `archived_time` are never NULL ([`not_yet!`]
//! until set) and deletion is a flag (`is_deleted`: no call shows when an
//! item was deleted), so marking 10,000 items seen, read, archived or
//! deleted changes each row in place: setting a column from NULL would grow
//! the row (InnoDB stores nothing for a NULL) and split full pages under a
//! bulk update. A time shows only while its state holds: a read time while
//! the item is read, an archive time while it is archived (an unread or an
//! unarchive leaves the column as it was, and the next read or archive
//! writes it again).
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
        concat!("IF(", $i, ".is_read = 1, NULLIF(", $i, ".read_time, ", not_yet!(), "), NULL)")
    };
}

/// When item `$i` was archived, NULL while it is in the inbox.
macro_rules! archived_time {
    ($i:literal) => {
        concat!(
            "IF(",
            $i,
            ".is_archived = 1, NULLIF(",
            $i,
            ".archived_time, ",
            not_yet!(),
            "), NULL)"
        )
    };
}

/// When item `$i` was first seen (a read sees it too), NULL while it is
/// unseen.
macro_rules! seen_time {
    ($i:literal) => {
        concat!("NULLIF(", $i, ".seen_time, ", not_yet!(), ")")
    };
}

/// True when item `$i` has a seen time.
macro_rules! has_seen_time {
    ($i:literal) => {
        concat!("(", $i, ".seen_time > ", not_yet!(), ")")
    };
}

/// Item `$i` is not deleted.
macro_rules! not_deleted {
    ($i:literal) => {
        concat!("(", $i, ".is_deleted = 0)")
    };
}
