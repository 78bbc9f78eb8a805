//! A user's notification preferences: the categories and groups they mute,
//! and the language they read ([`Locale`]), with their limits and
//! validation. A send in a muted category writes no
//! item for the user (counted as suppressed in its progress) unless it is
//! critical; a muted group's messages still pull, but its unread stays out
//! of the badge total. Preferences apply to what is delivered after they
//! change: items already delivered stay as they are.

use crate::domain::validate_category;
use crate::error::{Error, Result};
pub use crate::locale::{Locale, MAX_LOCALE_BYTES};

/// Most categories a user may mute.
pub const MAX_MUTED_CATEGORIES: usize = 100;
/// Most groups a user may mute.
pub const MAX_MUTED_GROUPS: usize = 1000;

/// What a user mutes, and their language.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preferences {
    /// Muted categories, sorted and distinct (never the empty category).
    pub muted_categories: Vec<String>,
    /// Muted groups, sorted and distinct.
    pub muted_group_ids: Vec<u64>,
    /// The language the user reads; none when not set.
    pub locale: Option<Locale>,
}

impl Preferences {
    /// The language's tag, '' when none is set (as events carry it).
    pub fn language(&self) -> String {
        self.locale.as_ref().map(|locale| locale.as_str().to_owned()).unwrap_or_default()
    }

    /// Validates and normalizes (sorts, drops repeats) a request's lists,
    /// and parses its locale (empty: none); `field` prefixes the fields
    /// named in errors (`preferences`).
    pub fn parse(
        categories: Vec<String>,
        group_ids: Vec<u64>,
        locale: &str,
        field: &str,
    ) -> Result<Self> {
        let categories_field = format!("{field}.muted_categories");
        let groups_field = format!("{field}.muted_group_ids");
        let mut muted_categories = categories;
        muted_categories.sort_unstable();
        muted_categories.dedup();
        if muted_categories.len() > MAX_MUTED_CATEGORIES {
            return Err(Error::invalid(
                &categories_field,
                &format!("at most {MAX_MUTED_CATEGORIES} categories may be muted"),
            ));
        }
        for category in &muted_categories {
            if category.is_empty() {
                return Err(Error::invalid(
                    &categories_field,
                    "the empty category (uncategorized messages) cannot be muted",
                ));
            }
            validate_category(category, &categories_field)?;
        }
        let mut muted_group_ids = group_ids;
        muted_group_ids.sort_unstable();
        muted_group_ids.dedup();
        if muted_group_ids.len() > MAX_MUTED_GROUPS {
            return Err(Error::invalid(
                &groups_field,
                &format!("at most {MAX_MUTED_GROUPS} groups may be muted"),
            ));
        }
        if muted_group_ids.contains(&0) {
            return Err(Error::invalid(&groups_field, "group id must not be 0"));
        }
        let locale = match locale {
            "" => None,
            text => Some(Locale::parse(text, &format!("{field}.locale"))?),
        };
        Ok(Self { muted_categories, muted_group_ids, locale })
    }

    /// True when a send in `category` is held back for this user.
    pub fn mutes_category(&self, category: &str, critical: bool) -> bool {
        !critical && !category.is_empty() && self.muted_categories.iter().any(|c| c == category)
    }

    /// True when the user mutes `group_id`.
    pub fn mutes_group(&self, group_id: u64) -> bool {
        self.muted_group_ids.binary_search(&group_id).is_ok()
    }
}

/// Joins a list as stored: comma-separated (categories are `[a-z0-9_.-]`,
/// so `FIND_IN_SET` reads the column as it is).
pub fn join_list<T: ToString>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// Splits a stored comma-separated list; unreadable entries are skipped.
pub fn split_list<T: std::str::FromStr>(stored: &str) -> Vec<T> {
    stored.split(',').filter(|s| !s.is_empty()).filter_map(|s| s.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_normalized_and_limited_naming_the_field() {
        let prefs = Preferences::parse(
            vec!["promo".into(), "billing".into(), "promo".into()],
            vec![9, 3, 9],
            "",
            "preferences",
        )
        .unwrap();
        assert_eq!(prefs.muted_categories, ["billing", "promo"]);
        assert_eq!(prefs.muted_group_ids, [3, 9]);
        assert!(prefs.mutes_category("promo", false));
        assert!(!prefs.mutes_category("promo", true), "critical sends ignore mutes");
        assert!(!prefs.mutes_category("", false));
        assert!(prefs.mutes_group(9) && !prefs.mutes_group(4));

        let too_many: Vec<String> = (0..=MAX_MUTED_CATEGORIES).map(|i| format!("c{i}")).collect();
        let err = Preferences::parse(too_many, vec![], "", "preferences").unwrap_err();
        assert!(err.to_string().starts_with("preferences.muted_categories: at most 100"), "{err}");
        let err = Preferences::parse(vec!["Bad!".into()], vec![], "", "preferences").unwrap_err();
        assert!(err.to_string().starts_with("preferences.muted_categories: "), "{err}");
        let err = Preferences::parse(vec!["".into()], vec![], "", "preferences").unwrap_err();
        assert!(err.to_string().contains("empty category"), "{err}");
        let groups: Vec<u64> = (1..=MAX_MUTED_GROUPS as u64 + 1).collect();
        let err = Preferences::parse(vec![], groups, "", "preferences").unwrap_err();
        assert!(err.to_string().starts_with("preferences.muted_group_ids: at most 1000"), "{err}");
        let err = Preferences::parse(vec![], vec![0], "", "preferences").unwrap_err();
        assert!(err.to_string().starts_with("preferences.muted_group_ids: "), "{err}");
    }

    #[test]
    fn a_locale_is_kept_canonical_and_a_bad_one_is_named() {
        let parse = |text: &str| Preferences::parse(vec![], vec![], text, "preferences");
        assert_eq!(parse("").unwrap().locale, None);
        for (given, canonical) in [
            ("en", "en"),
            ("zh_hant_tw", "zh-Hant-TW"),
            ("ZH-hans", "zh-Hans"),
            ("de-CH-u-co-phonebk", "de-CH-u-co-phonebk"),
            ("es-419", "es-419"),
        ] {
            let locale = parse(given).unwrap().locale.unwrap();
            assert_eq!(locale.as_str(), canonical, "{given}");
        }
        for bad in ["english!", "e", "en--US", "x", "123"] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.starts_with("preferences.locale: "), "{bad}: {err}");
            assert!(err.contains("BCP 47"), "{bad}: {err}");
        }
        let err = parse(&format!("en-{}", ["abcdefgh"; 8].join("-"))).unwrap_err().to_string();
        assert!(err.starts_with("preferences.locale: at most 64 bytes"), "{err}");
    }

    #[test]
    fn stored_lists_round_trip() {
        assert_eq!(join_list(&[3u64, 9]), "3,9");
        assert_eq!(split_list::<u64>("3,9"), [3, 9]);
        assert_eq!(split_list::<String>(""), Vec::<String>::new());
        assert_eq!(join_list::<String>(&[]), "");
    }
}
