//! The limits of a content's texts: what a send may carry, and what a
//! template's render is cut to.

/// Longest title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;
/// Longest body, in bytes of UTF-8.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Longest category, in bytes.
pub const MAX_CATEGORY_BYTES: usize = 64;
/// Most entries in `content.data`.
pub const MAX_DATA_ENTRIES: usize = 32;
/// Largest `content.data`, keys and values together, in bytes.
pub const MAX_DATA_BYTES: usize = 8 * 1024;
