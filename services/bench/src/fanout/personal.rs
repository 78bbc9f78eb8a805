//! `fanout --personalized`: the send's content is a template with `zh-Hant`
//! and `de` translations, every recipient carries about 100 bytes of vars
//! of their own, and a third of the recipients read `zh-Hant-TW`, a third
//! `de` (their `user_preferences.locale`), a third set none. The baseline
//! writes each row with the same vars, byte for byte, as the api stores
//! them. After the send, [`super::inbox`] times `ListInbox` pages of
//! personalized items against plain ones.

use std::collections::BTreeMap;

use anyhow::Context as _;
use notify_domain::Settings;
use notify_domain::template::{Compiled, Rendered, Template, Translation};
use notify_proto::v1;

use super::preferences::{self, Column};
use crate::harness;

/// The languages a recipient may read, by `user % 3`: `zh-Hant-TW` (falls
/// back to the template's `zh-Hant`), `de`, none (the default texts).
const LOCALES: [Option<&str>; 3] = [Some("zh-Hant-TW"), Some("de"), None];

const FIRST_NAMES: [&str; 8] =
    ["Maria", "Jonas", "Mei-Ling", "Lukas", "Chen", "Anna", "Wei", "Sofia"];
const LAST_NAMES: [&str; 8] =
    ["Schmidt", "Lin", "Weber", "Huang", "Fischer", "Wu", "Becker", "Tsai"];
const PLANS: [&str; 4] = ["Basic monthly", "Premium yearly", "Family", "Business"];

/// The content's default title and body, its send-wide vars and the
/// translations: a bill reminder, as a personalized send would carry.
const TITLE: &str = "{{ name }}, your {{ plan }} invoice is ready";
const BODY: &str = "Hello {{ name }}, your invoice of {{ amount }} {{ currency }} for {{ plan }} \
                    (account {{ account }}) is due on {{ due }}.";
const ZH_TITLE: &str = "{{ name }}，您的{{ plan }}帳單已備妥";
const ZH_BODY: &str = "{{ name }}您好，您的{{ plan }}帳單（帳號 {{ account }}）金額為 \
                       {{ amount }} {{ currency }}，繳費期限為 {{ due }}。";
const DE_TITLE: &str = "{{ name }}, Ihre Rechnung für {{ plan }} ist da";
const DE_BODY: &str = "Hallo {{ name }}, Ihre Rechnung über {{ amount }} {{ currency }} für \
                       {{ plan }} (Konto {{ account }}) ist am {{ due }} fällig.";

/// The language `user` reads (`None`: none set).
pub(super) fn locale_of(user: u64) -> Option<&'static str> {
    LOCALES[(user % 3) as usize]
}

/// The vars `user` carries: five short values, about 100 bytes as JSON.
pub(super) fn vars_of(user: u64) -> BTreeMap<String, String> {
    let name =
        format!("{} {}", FIRST_NAMES[(user % 8) as usize], LAST_NAMES[(user / 8 % 8) as usize]);
    [
        ("account", format!("AC-{user:09}")),
        ("amount", format!("{}.{:02}", 10 + user % 990, user % 100)),
        ("due", format!("2027-{:02}-{:02}", 1 + user % 12, 1 + user % 28)),
        ("name", name),
        ("plan", PLANS[(user / 64 % 4) as usize].to_owned()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect()
}

/// `user`'s vars as the api stores them (`Template::recipient_vars_json`:
/// a JSON object, names sorted): what `message_items.vars` holds.
pub(super) fn vars_json(user: u64) -> String {
    serde_json::to_string(&vars_of(user)).expect("string vars serialize")
}

/// Recipients with their vars, as `AppendRecipients` carries them.
pub(super) fn recipients(user_ids: &[u64]) -> Vec<v1::RecipientVars> {
    user_ids
        .iter()
        .map(|user| v1::RecipientVars {
            user_id: *user,
            vars: vars_of(*user).into_iter().collect(),
        })
        .collect()
}

/// The template that makes `content` personalized (its title and body
/// become [`TITLE`] and [`BODY`]).
pub(super) fn personalize(content: &mut v1::Content) {
    content.title = TITLE.to_owned();
    content.body = BODY.to_owned();
    let translation =
        |title: &str, body: &str| v1::Translation { title: title.into(), body: body.into() };
    content.template = Some(v1::Template {
        vars: [("currency".to_owned(), "EUR".to_owned())].into(),
        translations: [
            ("zh-Hant".to_owned(), translation(ZH_TITLE, ZH_BODY)),
            ("de".to_owned(), translation(DE_TITLE, DE_BODY)),
        ]
        .into(),
        recipient_vars: vars_of(1).into_keys().collect(),
    });
}

/// What a reader of `content` (made by [`personalize`]) sees: the bench's
/// own render of it, to check the api's pages against.
pub(super) struct Expected {
    compiled: Compiled,
}

impl Expected {
    /// Compiles `content`'s template as the api does.
    pub(super) fn of(content: &v1::Content) -> anyhow::Result<Self> {
        let template = content.template.as_ref().ok_or_else(|| anyhow::anyhow!("no template"))?;
        let template = Template::new(
            template.vars.clone().into_iter().collect(),
            template.translations.iter().map(|(tag, t)| {
                (tag.clone(), Translation { title: t.title.clone(), body: t.body.clone() })
            }),
            template.recipient_vars.iter().cloned(),
            "content.template",
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let data = content.data.clone().into_iter().collect();
        Ok(Self { compiled: Compiled::new(&template, &content.title, &content.body, &data) })
    }

    /// The texts `user` reads, in their language, with their vars.
    pub(super) fn for_user(&self, user: u64) -> Rendered {
        self.in_locale(locale_of(user).unwrap_or(""), user)
    }

    /// The texts a reader of `locale` ('' for none) with `user`'s vars reads.
    pub(super) fn in_locale(&self, locale: &str, user: u64) -> Rendered {
        self.compiled.render(locale, Some(&vars_json(user))).0
    }
}

/// Sets the language of those of `users` who read one ([`locale_of`]),
/// then brings the shards' statistics up to date ([`preferences::analyze`]).
/// Returns the rows written and the seconds the writes took.
pub(super) async fn seed_locales(settings: &Settings, users: &[u64]) -> anyhow::Result<(u64, f64)> {
    let rows: Vec<(u64, &str)> =
        users.iter().filter_map(|user| Some((*user, locale_of(*user)?))).collect();
    let secs = preferences::seed(settings, Column::Locale, &rows).await?;
    preferences::analyze(settings).await?;
    Ok((rows.len() as u64, secs))
}

/// The bytes of vars `users` carry together.
pub(super) fn vars_bytes(users: &[u64]) -> u64 {
    users.iter().map(|user| vars_json(*user).len() as u64).sum()
}

/// What the items of `message_id` hold of vars, over the shards of
/// `settings`: `SUM(LENGTH(vars))`, and how many of every 997th of `users`
/// have an item whose vars differ from [`vars_json`] (or no item).
pub(super) async fn stored_vars(
    settings: &Settings,
    message_id: u64,
    users: &[u64],
) -> anyhow::Result<StoredVars> {
    let pools = harness::shard_pools(settings, 2).await?;
    let map = settings.shard_map().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut bytes = 0u64;
    for pool in &pools {
        let sum: u64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(LENGTH(vars)), 0) AS UNSIGNED) FROM message_items \
             WHERE message_id = ?",
        )
        .bind(message_id)
        .fetch_one(pool)
        .await?;
        bytes += sum;
    }
    let (mut sampled, mut wrong) = (0u64, 0u64);
    for user in users.iter().step_by(997) {
        let slot = map.slot_of(map.shard_for_user(*user)).context("shard slot")?;
        let stored: Option<Option<String>> = sqlx::query_scalar(
            "SELECT vars FROM message_items WHERE user_id = ? AND message_id = ?",
        )
        .bind(user)
        .bind(message_id)
        .fetch_optional(&pools[slot])
        .await?;
        sampled += 1;
        wrong += u64::from(stored.flatten() != Some(vars_json(*user)));
    }
    for pool in pools {
        pool.close().await;
    }
    Ok(StoredVars { bytes, sampled, wrong })
}

/// What [`stored_vars`] found.
#[derive(Debug, Clone, Copy)]
pub(super) struct StoredVars {
    pub(super) bytes: u64,
    pub(super) sampled: u64,
    pub(super) wrong: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vars_are_about_100_bytes_and_locales_split_in_thirds() {
        let users: Vec<u64> = (1..=30_000).collect();
        let mean = vars_bytes(&users) as f64 / users.len() as f64;
        assert!((95.0..=110.0).contains(&mean), "{mean} bytes of vars a recipient");
        let zh = users.iter().filter(|u| locale_of(**u) == Some("zh-Hant-TW")).count();
        let de = users.iter().filter(|u| locale_of(**u) == Some("de")).count();
        assert_eq!((zh, de), (10_000, 10_000));
    }

    #[test]
    fn vars_are_stored_as_the_api_stores_them() {
        let mut content = v1::Content::default();
        personalize(&mut content);
        let names = content.template.as_ref().unwrap().recipient_vars.iter().cloned();
        let template = Template::new(BTreeMap::new(), [], names, "t").unwrap();
        for user in [1, 7, 1_000_000] {
            assert_eq!(template.recipient_vars_json(&vars_of(user), "v").unwrap(), vars_json(user));
        }
    }

    #[test]
    fn each_language_reads_its_own_variant() {
        let mut content = v1::Content::default();
        personalize(&mut content);
        let expected = Expected::of(&content).unwrap();
        let zh = expected.for_user(3);
        assert!(zh.title.contains("帳單") && zh.title.contains(&vars_of(3)["name"]), "{zh:?}");
        assert!(expected.for_user(4).title.contains("Ihre Rechnung"));
        let default = expected.for_user(5);
        assert!(
            default.body.contains("EUR") && default.body.contains("AC-000000005"),
            "{default:?}"
        );
    }
}
