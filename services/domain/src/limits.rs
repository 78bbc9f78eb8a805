//! The limits of a content's texts: what a send may carry, and what a
//! template's render is cut to.

use crate::error::{Error, Result};

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

/// Checks a title (a content's or a translation's) named `field`.
pub fn check_title(title: &str, field: &str) -> Result<()> {
    check_line(title, field, MAX_TITLE_CHARS)
}

/// Checks a short text named `field` (a title, a name): not blank, at most
/// `max_chars` characters.
pub fn check_line(text: &str, field: &str, max_chars: usize) -> Result<()> {
    if text.trim().is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if text.chars().count() > max_chars {
        return Err(Error::invalid(field, &format!("must be at most {max_chars} characters")));
    }
    Ok(())
}

/// Checks a body (a content's or a translation's) named `field`.
pub fn check_body(body: &str, field: &str) -> Result<()> {
    if body.len() > MAX_BODY_BYTES {
        return Err(Error::invalid(
            field,
            &format!("is {} bytes, the limit is {MAX_BODY_BYTES}", body.len()),
        ));
    }
    Ok(())
}
