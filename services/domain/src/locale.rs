//! A user's language: a BCP 47 tag, parsed and kept canonical with ICU4X.
//! Below the preferences that store it and the templates that pick a
//! variant by it.

use crate::error::{Error, Result};

/// Longest locale tag stored.
pub const MAX_LOCALE_BYTES: usize = 64;

/// A BCP 47 language tag (`en`, `zh-Hant-TW`, `de-CH-u-co-phonebk`), well
/// formed as ICU's parser reads it and kept in its canonical form (`zh_hant_tw`
/// is `zh-Hant-TW`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locale(String);

impl Locale {
    /// Parses `text`; `field` names it in the error.
    pub fn parse(text: &str, field: &str) -> Result<Self> {
        if text.len() > MAX_LOCALE_BYTES {
            return Err(Error::invalid(
                field,
                &format!("at most {MAX_LOCALE_BYTES} bytes (this one has {})", text.len()),
            ));
        }
        // ICU reads only "-" between subtags; "_" (as in POSIX names) is
        // taken for it.
        let parsed =
            icu_locale_core::Locale::try_from_str(&text.replace('_', "-")).map_err(|e| {
                Error::invalid(field, &format!("{text:?} is not a BCP 47 language tag ({e})"))
            })?;
        Ok(Self(parsed.to_string()))
    }

    /// The tag, canonical.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
