//! Where templated content becomes each reader's text
//! ([`notify_domain::template`]). Items never copy content: a personalized
//! item stores only its recipient's vars, and every read renders the
//! shard's content copy with them in the reader's language. So an edit
//! re-renders every inbox at once, and the fan-out writes ~100 bytes more
//! per item instead of a rendered title and body.
//!
//! A template is compiled once per process and content version (a bounded
//! cache), then rendered per reader: a page of 20 items costs 20 renders
//! of already compiled templates.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use chrono::NaiveDateTime;
use notify_domain::domain::Content;
use notify_domain::error::Result;
use notify_domain::template::{Compiled, Rendered, Template};
use notify_store::db::groups::GroupMessageRow;
use notify_store::db::items::{self, InboxRow, TemplateTexts};
use sqlx::MySqlPool;
use tracing::warn;

/// What the compiled templates kept per process weigh at most
/// ([`Compiled::weight`]): some 7,000 contents of plain texts, or 500 that
/// need the engine.
const CACHED_TEMPLATE_BYTES: u64 = 32 << 20;

/// A compiled template's key: message id, the content's edit time, and
/// whether only the title was compiled (what an event shows).
type Key = (u64, i64, bool);

/// The compiled templates.
fn cache() -> &'static moka::sync::Cache<Key, Arc<Compiled>> {
    static CACHE: OnceLock<moka::sync::Cache<Key, Arc<Compiled>>> = OnceLock::new();
    CACHE.get_or_init(|| {
        moka::sync::Cache::builder()
            .max_capacity(CACHED_TEMPLATE_BYTES)
            .weigher(|_, compiled: &Arc<Compiled>| compiled.weight())
            .build()
    })
}

/// The texts of one version of a templated content.
#[derive(Debug, Clone, Copy)]
pub struct Texts<'a> {
    /// The send.
    pub message_id: u64,
    /// When its content was last edited (`None`: never): the version.
    pub edited_at: Option<NaiveDateTime>,
    /// Its template, as stored.
    pub template: &'a str,
    /// Title template.
    pub title: &'a str,
    /// Body template; `None` when only the title is rendered.
    pub body: Option<&'a str>,
    /// Data templates, as stored (a JSON object).
    pub data: &'a str,
}

/// A content version as the cache keys it.
fn version(edited_at: Option<NaiveDateTime>) -> i64 {
    edited_at.map_or(0, |at| at.and_utc().timestamp_millis())
}

/// Compiles `texts` once per process and version.
pub fn compiled(texts: &Texts<'_>) -> Option<Arc<Compiled>> {
    let key = (texts.message_id, version(texts.edited_at), texts.body.is_none());
    if let Some(found) = cache().get(&key) {
        return Some(found);
    }
    let template = match Template::from_json(texts.template) {
        Ok(template) => template,
        Err(e) => {
            warn!(error = %e, message_id = texts.message_id, "a stored template does not decode");
            return None;
        }
    };
    let data = match texts.body {
        Some(_) => Content::data_from_json(texts.data),
        None => BTreeMap::new(),
    };
    let body = texts.body.unwrap_or_default();
    let compiled = Arc::new(Compiled::new(&template, texts.title, body, &data));
    cache().insert(key, compiled.clone());
    Some(compiled)
}

/// Renders `texts` for a reader of `locale` with a recipient's `vars`;
/// `None` when its template does not decode (the texts show as stored).
fn render(texts: &Texts<'_>, locale: &str, vars: Option<&str>) -> Option<Rendered> {
    let compiled = compiled(texts)?;
    Some(rendered(&compiled, texts.message_id, locale, vars))
}

/// Renders a compiled template for a reader of `locale` with a
/// recipient's `vars`, saying so when a text did not render.
fn rendered(compiled: &Compiled, message_id: u64, locale: &str, vars: Option<&str>) -> Rendered {
    let (rendered, ok) = compiled.render(locale, vars);
    if !ok {
        warn!(message_id, "a text of a template did not render: its source shows");
    }
    rendered
}

/// The stored form of rendered data (a JSON object).
fn data_json(rendered: &Rendered) -> String {
    serde_json::to_string(&rendered.data).unwrap_or_else(|_| "{}".to_owned())
}

/// Renders a page's templated rows in place for their reader (`locale`,
/// the reader's, was read with the page). A page carries no template's
/// text: each is compiled once per process and version, and those this
/// process has not compiled yet are read from the user's shard (`pool`) in
/// one statement. Such a read finds the content as it is now: if it was
/// edited since the page was read, the row shows the edit.
pub async fn rows(pool: &MySqlPool, rows: &mut [InboxRow]) -> Result<()> {
    let cached: Vec<Option<Arc<Compiled>>> = rows
        .iter()
        .map(|row| if row.templated { cache().get(&key_of(row)) } else { None })
        .collect();
    // A page holds one item per send: no id twice.
    let missing: Vec<u64> = rows
        .iter()
        .zip(&cached)
        .filter(|(row, compiled)| row.templated && compiled.is_none())
        .map(|(row, _)| row.message_id)
        .collect();
    let mut read: HashMap<u64, TemplateTexts> =
        items::templates(pool, &missing).await?.into_iter().map(|t| (t.message_id, t)).collect();
    for (row, cached) in rows.iter_mut().zip(cached) {
        if !row.templated {
            continue;
        }
        row.templated = false;
        let compiled = match cached {
            Some(compiled) => Some(compiled),
            None => read.remove(&row.message_id).and_then(|texts| {
                (row.title, row.body, row.data) = (texts.title, texts.body, texts.data);
                row.edited_at = texts.edited_at;
                compiled(&Texts {
                    message_id: row.message_id,
                    edited_at: row.edited_at,
                    template: &texts.template,
                    title: &row.title,
                    body: Some(&row.body),
                    data: &row.data,
                })
            }),
        };
        if let Some(compiled) = compiled {
            let rendered = rendered(&compiled, row.message_id, &row.locale, row.vars.as_deref());
            row.data = data_json(&rendered);
            (row.title, row.body) = (rendered.title, rendered.body);
        }
        row.vars = None;
    }
    Ok(())
}

/// The cache key of a row's template (all its texts).
fn key_of(row: &InboxRow) -> Key {
    (row.message_id, version(row.edited_at), false)
}

/// Renders a group's templated messages in place for a member reading in
/// `locale` (group messages carry send-wide vars only).
pub fn group_messages(messages: &mut [GroupMessageRow], locale: &str) {
    for message in messages.iter_mut() {
        let Some(template) = message.template.take() else { continue };
        let texts = Texts {
            message_id: message.message_id,
            edited_at: None,
            template: &template,
            title: &message.title,
            body: Some(&message.body),
            data: &message.data,
        };
        if let Some(rendered) = render(&texts, locale, None) {
            message.data = data_json(&rendered);
            (message.title, message.body) = (rendered.title, rendered.body);
        }
    }
}

/// Recipients whose events show a templated title: who, and each one's
/// own vars (by user; `None` for a send without recipient vars).
#[derive(Debug)]
pub struct Recipients<'a> {
    /// Who.
    pub user_ids: &'a [u64],
    /// Their vars.
    pub vars: Option<HashMap<u64, &'a str>>,
}

/// The title each recipient sees in their event of a templated content,
/// for each of `groups` (a chunk's recipients each), rendered with their
/// vars in their language, when the template has translations: `known`
/// (every recipient's who set one, as the apply read them), or else read
/// from the shard in one statement for all of them.
pub async fn titles(
    pool: &MySqlPool,
    texts: &Texts<'_>,
    groups: &[Recipients<'_>],
    known: Option<&HashMap<u64, String>>,
) -> Result<Vec<Vec<String>>> {
    let Some(compiled) = compiled(texts) else {
        let as_stored = |group: &Recipients<'_>| vec![texts.title.to_owned(); group.user_ids.len()];
        return Ok(groups.iter().map(as_stored).collect());
    };
    let locales: Cow<'_, HashMap<u64, String>> = match known {
        _ if !compiled.has_translations() => Cow::Owned(HashMap::new()),
        Some(known) => Cow::Borrowed(known),
        None => {
            let everyone: Vec<u64> =
                groups.iter().flat_map(|group| group.user_ids.iter().copied()).collect();
            let read = notify_store::db::preferences::locales(pool, &everyone).await?;
            Cow::Owned(read.into_iter().collect())
        }
    };
    Ok(groups
        .iter()
        .map(|group| {
            group
                .user_ids
                .iter()
                .map(|user| {
                    let locale = locales.get(user).map_or("", String::as_str);
                    let own = group.vars.as_ref().and_then(|vars| vars.get(user).copied());
                    compiled.render_title(locale, own)
                })
                .collect()
        })
        .collect())
}

/// Renders `content` for one reader: a sample the console shows.
pub fn sample(
    content: &Content,
    message_id: u64,
    edited_at: Option<NaiveDateTime>,
    locale: &str,
    vars: Option<&str>,
) -> Option<Rendered> {
    let template = content.template.as_ref()?;
    let texts = Texts {
        message_id,
        edited_at,
        template: &template.to_json(),
        title: &content.title,
        body: Some(&content.body),
        data: &content.data_json(),
    };
    Some(compiled(&texts)?.render(locale, vars).0)
}
