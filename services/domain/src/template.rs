//! Templates: a send whose content carries a [`Template`] has a title, body
//! and data values written in MiniJinja (Jinja2's syntax, sandboxed), filled
//! for each recipient from the send's `vars` and the recipient's own, in the
//! variant of the recipient's language.
//!
//! Everything that can be checked before a send goes out is checked when it
//! is created ([`Template::check`]): syntax, filters, tests and functions the
//! engine does not know, and variables that neither the send nor every
//! recipient provides, each named by field, line and column. Rendering is
//! bounded: the engine runs on fuel, and each rendered text is cut to its
//! field's limit. The engine escapes nothing (clients escape what they show).
//!
//! The language is MiniJinja's core without its multi-template features:
//! `{{ expressions }}`, filters (`upper`, `default`, `round`, ...), tests,
//! `{% if %}`, `{% for %}`, `{% set %}`, `{% with %}`, `{% filter %}`, and the
//! global functions (`range`, `dict`, `namespace`). `include`, `extends`,
//! `import` and `macro` are not part of it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::OnceLock;

use minijinja::machinery::Instruction;
use minijinja::{Environment, ErrorKind, UndefinedBehavior, Value};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits::{MAX_BODY_BYTES, MAX_DATA_BYTES, MAX_TITLE_CHARS, check_body, check_title};
use crate::locale::Locale;

/// Most translations of one send.
pub const MAX_TRANSLATIONS: usize = 32;
/// Most variable names a send declares, send-wide and per recipient each.
pub const MAX_VARS: usize = 64;
/// Longest variable name, in bytes.
pub const MAX_VAR_NAME_BYTES: usize = 64;
/// Largest send-wide `vars`, names and values together, in bytes.
pub const MAX_SEND_VARS_BYTES: usize = 8 * 1024;
/// Largest vars of one recipient, names and values together, in bytes.
pub const MAX_RECIPIENT_VARS_BYTES: usize = 1024;
/// The engine's fuel for one text: about one instruction each. A title or
/// a body of a few kilobytes with a loop or two takes a few hundred.
pub const RENDER_FUEL: u64 = 20_000;

/// What makes a send's content a template, stored beside it as JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// Send-wide variables: every recipient's, unless the recipient carries
    /// one of the same name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, String>,
    /// Title and body by language (canonical BCP 47 tags); the content's
    /// own title and body are the default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub translations: BTreeMap<String, Translation>,
    /// The variables every recipient carries (no more, no fewer).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub recipient_vars: BTreeSet<String>,
}

/// A language's title and body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Translation {
    /// Headline template.
    pub title: String,
    /// Body template.
    #[serde(default)]
    pub body: String,
}

/// One text of a content: where it sits (for errors) and its source.
struct Source<'a> {
    field: String,
    text: &'a str,
}

impl Template {
    /// Builds a template from a request, canonicalizing the translations'
    /// language tags; `field` names the template in errors.
    pub fn new(
        vars: BTreeMap<String, String>,
        translations: impl IntoIterator<Item = (String, Translation)>,
        recipient_vars: impl IntoIterator<Item = String>,
        field: &str,
    ) -> Result<Self> {
        let mut canonical = BTreeMap::new();
        for (tag, translation) in translations {
            let locale = Locale::parse(&tag, &format!("{field}.translations"))?;
            if canonical.insert(locale.as_str().to_owned(), translation).is_some() {
                return Err(Error::invalid(
                    &format!("{field}.translations"),
                    &format!("{tag:?} names the language {} a second time", locale.as_str()),
                ));
            }
        }
        let mut names = BTreeSet::new();
        for name in recipient_vars {
            if !names.insert(name.clone()) {
                return Err(Error::invalid(
                    &format!("{field}.recipient_vars"),
                    &format!("{name:?} is listed twice"),
                ));
            }
        }
        Ok(Self { vars, translations: canonical, recipient_vars: names })
    }

    /// Encodes the template as stored.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Decodes a stored template.
    pub fn from_json(json: &str) -> Result<Self> {
        serde_json::from_str(json)
            .map_err(|e| Error::Internal(format!("undecodable stored template: {e}")))
    }

    /// Checks the template and the texts it makes templates of (`title`,
    /// `body` and `data` of the content named `field`): limits, names,
    /// syntax, and that every variable a text reads is provided.
    pub fn check(
        &self,
        field: &str,
        title: &str,
        body: &str,
        data: &BTreeMap<String, String>,
    ) -> Result<()> {
        let tfield = format!("{field}.template");
        check_names(self.vars.keys(), &format!("{tfield}.vars"))?;
        check_names(self.recipient_vars.iter(), &format!("{tfield}.recipient_vars"))?;
        let bytes: usize = self.vars.iter().map(|(k, v)| k.len() + v.len()).sum();
        if bytes > MAX_SEND_VARS_BYTES {
            return Err(Error::invalid(
                &format!("{tfield}.vars"),
                &format!("is {bytes} bytes, the limit is {MAX_SEND_VARS_BYTES}"),
            ));
        }
        if self.translations.len() > MAX_TRANSLATIONS {
            return Err(Error::invalid(
                &format!("{tfield}.translations"),
                &format!(
                    "has {} languages, the limit is {MAX_TRANSLATIONS}",
                    self.translations.len()
                ),
            ));
        }
        let mut sources = vec![
            Source { field: format!("{field}.title"), text: title },
            Source { field: format!("{field}.body"), text: body },
        ];
        for (key, value) in data {
            sources.push(Source { field: format!("{field}.data.{key}"), text: value });
        }
        for (locale, translation) in &self.translations {
            let at = format!("{tfield}.translations.{locale}");
            check_title(&translation.title, &format!("{at}.title"))?;
            check_body(&translation.body, &format!("{at}.body"))?;
            sources.push(Source { field: format!("{at}.title"), text: &translation.title });
            sources.push(Source { field: format!("{at}.body"), text: &translation.body });
        }
        let env = environment();
        for source in &sources {
            self.check_source(env, source)?;
        }
        Ok(())
    }

    /// True when every recipient must carry vars.
    pub fn per_recipient(&self) -> bool {
        !self.recipient_vars.is_empty()
    }

    /// Checks one recipient's vars against `recipient_vars` and encodes
    /// them as stored (a JSON object); `field` names them in errors.
    pub fn recipient_vars_json(
        &self,
        vars: &BTreeMap<String, String>,
        field: &str,
    ) -> Result<String> {
        // Both in name order: the usual case, exactly the declared names,
        // is one walk over the two.
        let exact = vars.len() == self.recipient_vars.len()
            && vars.keys().zip(&self.recipient_vars).all(|(given, declared)| given == declared);
        if !exact && let Some(extra) = vars.keys().find(|name| !self.recipient_vars.contains(*name))
        {
            return Err(Error::invalid(
                field,
                &format!(
                    "{extra:?} is not one of the template's recipient_vars ({})",
                    names(&self.recipient_vars)
                ),
            ));
        }
        if !exact
            && let Some(missing) = self.recipient_vars.iter().find(|name| !vars.contains_key(*name))
        {
            return Err(Error::invalid(field, &format!("{missing:?} is missing")));
        }
        let json = serde_json::to_string(vars).map_err(|e| Error::Internal(e.to_string()))?;
        if json.len() > MAX_RECIPIENT_VARS_BYTES {
            return Err(Error::invalid(
                field,
                &format!(
                    "are {} bytes as JSON, the limit is {MAX_RECIPIENT_VARS_BYTES}",
                    json.len()
                ),
            ));
        }
        Ok(json)
    }

    fn check_source(&self, env: &Environment<'static>, source: &Source<'_>) -> Result<()> {
        let template = env
            .template_from_str(source.text)
            .map_err(|e| template_error(&source.field, source.text, &e))?;
        let compiled = minijinja::machinery::get_compiled_template(&template);
        let globals: BTreeSet<&str> = env.globals().map(|(name, _)| name).collect();
        let undeclared = template.undeclared_variables(false);
        let blocks = std::iter::once(&compiled.instructions).chain(compiled.blocks.values());
        for instructions in blocks {
            for idx in 0..instructions.len() as u32 {
                let Some(instruction) = instructions.get(idx) else { continue };
                let problem = match instruction {
                    Instruction::ApplyFilter(name, ..) if !known(env, "filter", name) => {
                        format!("unknown filter {name:?}")
                    }
                    Instruction::PerformTest(name, ..) if !known(env, "test", name) => {
                        format!("unknown test {name:?}")
                    }
                    Instruction::CallFunction(name, _) if !globals.contains(name) => {
                        format!("unknown function {name:?}")
                    }
                    Instruction::Lookup(name)
                        if undeclared.contains(*name)
                            && !globals.contains(name)
                            && !self.vars.contains_key(*name)
                            && !self.recipient_vars.contains(*name) =>
                    {
                        format!(
                            "variable {name:?} is not provided: it is neither in the template's \
                             vars nor in its recipient_vars"
                        )
                    }
                    _ => continue,
                };
                let at = match instructions.get_span(idx) {
                    Some(span) => {
                        format!("line {}, column {}", span.start_line, span.start_col + 1)
                    }
                    None => format!("line {}", instructions.get_line(idx).unwrap_or(1)),
                };
                return Err(Error::invalid(&source.field, &format!("{at}: {problem}")));
            }
        }
        Ok(())
    }
}

/// The engine every template is checked and rendered with: builtins only,
/// strict about undefined variables, on fuel, shallow.
fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(new_environment)
}

fn new_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(RENDER_FUEL));
    env.set_recursion_limit(16);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env
}

/// True when the engine knows the filter or test `name` (`kind`): a probe
/// that uses it fails for another reason than its being unknown.
fn known(env: &Environment<'static>, kind: &str, name: &str) -> bool {
    let probe = match kind {
        "filter" => format!("{{{{ none|{name} }}}}"),
        _ => format!("{{% if none is {name} %}}{{% endif %}}"),
    };
    match env.render_str(&probe, ()) {
        Ok(_) => true,
        Err(e) => !matches!(e.kind(), ErrorKind::UnknownFilter | ErrorKind::UnknownTest),
    }
}

/// A compile error named by field, line and column.
fn template_error(field: &str, text: &str, e: &minijinja::Error) -> Error {
    let mut reason = String::new();
    if let Some(range) = e.range() {
        let before = &text[..range.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        let _ = write!(reason, "line {line}, column {column}: ");
    } else if let Some(line) = e.line() {
        let _ = write!(reason, "line {line}: ");
    }
    let _ = write!(reason, "{}", e.kind());
    if let Some(detail) = e.detail() {
        let _ = write!(reason, ": {detail}");
    }
    Error::invalid(field, &reason)
}

fn check_names<'a>(names: impl Iterator<Item = &'a String>, field: &str) -> Result<()> {
    let mut count = 0;
    for name in names {
        count += 1;
        let valid = name.len() <= MAX_VAR_NAME_BYTES
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(Error::invalid(
                field,
                &format!(
                    "{name:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*, at most \
                     {MAX_VAR_NAME_BYTES} bytes)"
                ),
            ));
        }
    }
    if count > MAX_VARS {
        return Err(Error::invalid(field, &format!("has {count} names, the limit is {MAX_VARS}")));
    }
    Ok(())
}

fn names(set: &BTreeSet<String>) -> String {
    if set.is_empty() {
        return "none".to_owned();
    }
    set.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

/// What a reader of `locale` gets of `by_language` (one value per
/// translation's tag): the value of the most specific tag its fallbacks
/// name, or `None` for the default.
pub fn pick_language<'a, V>(by_language: &'a BTreeMap<String, V>, locale: &str) -> Option<&'a V> {
    fallbacks(locale).find_map(|tag| by_language.get(tag))
}

/// The languages to try for a reader of `locale`, most specific first:
/// `zh-Hant-TW`, `zh-Hant`, `zh` (the default comes after them all).
pub fn fallbacks(locale: &str) -> impl Iterator<Item = &str> {
    let mut next = (!locale.is_empty()).then_some(locale);
    std::iter::from_fn(move || {
        let current = next?;
        next = current.rfind('-').map(|at| &current[..at]);
        Some(current)
    })
}

/// A content's texts as one recipient sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// Headline.
    pub title: String,
    /// Body.
    pub body: String,
    /// Application data.
    pub data: BTreeMap<String, String>,
}

/// A template compiled once, rendered for any recipient.
pub struct Compiled {
    /// The engine with every text compiled; `None` when every text is
    /// [`plain`] (most contents), which renders without it. An engine
    /// weighs ~60 KB with a content's texts, their pieces a few hundred bytes.
    env: Option<Environment<'static>>,
    vars: BTreeMap<String, String>,
    locales: BTreeSet<String>,
    data_keys: Vec<String>,
    sources: BTreeMap<String, String>,
    /// The texts that are only literal text and `{{ name }}`s, by name.
    plain: BTreeMap<String, Vec<Piece>>,
}

/// A piece of a [`plain`] text.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(Box<str>),
    Var(Box<str>),
}

/// The pieces of `name` when the engine compiled it to nothing but literal
/// text and variables emitted as they are (`Hi {{ name }}, {{ amount }}
/// is due`, most titles and bodies): such a text renders by concatenation,
/// as the engine would render it (no escaping, a var's string as it is),
/// without a context built for it. `None` for any other text.
fn plain(env: &Environment<'static>, name: &str) -> Option<Vec<Piece>> {
    let template = env.get_template(name).ok()?;
    let compiled = minijinja::machinery::get_compiled_template(&template);
    if !compiled.blocks.is_empty() {
        return None;
    }
    let instructions = &compiled.instructions;
    let mut pieces = Vec::new();
    let mut idx = 0;
    while let Some(instruction) = instructions.get(idx) {
        match instruction {
            Instruction::EmitRaw(text) => pieces.push(Piece::Text((*text).into())),
            Instruction::Lookup(var)
                if matches!(instructions.get(idx + 1), Some(Instruction::Emit)) =>
            {
                pieces.push(Piece::Var((*var).into()));
                idx += 1;
            }
            _ => return None,
        }
        idx += 1;
    }
    Some(pieces)
}

/// A recipient's stored vars, read without copying what needs no unescaping.
#[derive(Debug, Default, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct Str<'a>(#[serde(borrow)] std::borrow::Cow<'a, str>);

impl std::borrow::Borrow<str> for Str<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// The vars a recipient's texts see: their own, then the send's.
struct Lookup<'a> {
    own: BTreeMap<Str<'a>, Str<'a>>,
    send: &'a BTreeMap<String, String>,
}

impl Lookup<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        match self.own.get(name) {
            Some(value) => Some(&value.0),
            None => self.send.get(name).map(String::as_str),
        }
    }

    /// `pieces` filled in; `None` when a var is missing (the engine then
    /// renders the text, and fails it as it would).
    fn fill(&self, pieces: &[Piece]) -> Option<String> {
        let mut text = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(raw) => text.push_str(raw),
                Piece::Var(name) => text.push_str(self.get(name)?),
            }
        }
        Some(text)
    }
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled").field("locales", &self.locales).finish_non_exhaustive()
    }
}

impl Compiled {
    /// Compiles a stored content's texts. A text that does not compile (it
    /// passed [`Template::check`] when stored, so only a newer engine could
    /// refuse it) renders as its source.
    pub fn new(
        template: &Template,
        title: &str,
        body: &str,
        data: &BTreeMap<String, String>,
    ) -> Self {
        let mut env = new_environment();
        let mut sources = BTreeMap::new();
        let mut add = |name: String, text: &str| {
            sources.insert(name.clone(), text.to_owned());
            if env.add_template_owned(name, text.to_owned()).is_err() {
                count_failure();
            }
        };
        add("title".to_owned(), title);
        add("body".to_owned(), body);
        for (key, value) in data {
            add(format!("data/{key}"), value);
        }
        for (locale, translation) in &template.translations {
            add(format!("{locale}/title"), &translation.title);
            add(format!("{locale}/body"), &translation.body);
        }
        let plain: BTreeMap<String, Vec<Piece>> =
            sources.keys().filter_map(|name| Some((name.clone(), plain(&env, name)?))).collect();
        let env = (plain.len() < sources.len()).then_some(env);
        Self {
            env,
            vars: template.vars.clone(),
            locales: template.translations.keys().cloned().collect(),
            data_keys: data.keys().cloned().collect(),
            sources,
            plain,
        }
    }

    /// True when the template has languages besides the default.
    pub fn has_translations(&self) -> bool {
        !self.locales.is_empty()
    }

    /// The language variant a reader of `locale` gets: the most specific
    /// translation its fallbacks name, or the default (`None`).
    pub fn variant(&self, locale: &str) -> Option<&str> {
        fallbacks(locale).find_map(|tag| self.locales.get(tag).map(String::as_str))
    }

    /// Renders every text for a reader of `locale` with the recipient's
    /// stored vars (a JSON object; `None` for an announcement's or a
    /// group's reader). Returns the texts and whether each rendered (a
    /// text that failed shows its source).
    pub fn render(&self, locale: &str, recipient_vars: Option<&str>) -> (Rendered, bool) {
        let lookup = self.lookup(recipient_vars);
        let mut context = None;
        let prefix = self.variant(locale).map(|tag| format!("{tag}/")).unwrap_or_default();
        let mut ok = true;
        let mut text = |name: &str, limit: Limit| {
            let (text, rendered) =
                self.render_text(name, &lookup, &mut context, recipient_vars, limit);
            ok &= rendered;
            text
        };
        let title = text(&format!("{prefix}title"), Limit::Chars(MAX_TITLE_CHARS));
        let body = text(&format!("{prefix}body"), Limit::Bytes(MAX_BODY_BYTES));
        let data = self
            .data_keys
            .iter()
            .map(|key| (key.clone(), text(&format!("data/{key}"), Limit::Bytes(MAX_DATA_BYTES))))
            .collect();
        (Rendered { title, body, data }, ok)
    }

    /// Renders the title alone (what an event shows).
    pub fn render_title(&self, locale: &str, recipient_vars: Option<&str>) -> String {
        let lookup = self.lookup(recipient_vars);
        let name = match self.variant(locale) {
            Some(tag) => format!("{tag}/title"),
            None => "title".to_owned(),
        };
        let limit = Limit::Chars(MAX_TITLE_CHARS);
        self.render_text(&name, &lookup, &mut None, recipient_vars, limit).0
    }

    /// The title in each language besides the default, rendered with the
    /// send-wide vars alone (an announcement's event, which each gateway
    /// shows its readers in their language, [`pick_language`]).
    pub fn titles_by_language(&self) -> BTreeMap<String, String> {
        self.locales.iter().map(|tag| (tag.clone(), self.render_title(tag, None))).collect()
    }

    /// The vars of a recipient whose stored vars are `recipient_vars`
    /// (stored by the api, so they parse; if not, the send's alone).
    fn lookup<'a>(&'a self, recipient_vars: Option<&'a str>) -> Lookup<'a> {
        let own = recipient_vars.and_then(|json| serde_json::from_str(json).ok());
        Lookup { own: own.unwrap_or_default(), send: &self.vars }
    }

    /// Renders text `name`: a plain one by filling its pieces, any other
    /// by the engine, in `context` (built on first use).
    fn render_text(
        &self,
        name: &str,
        lookup: &Lookup<'_>,
        context: &mut Option<Value>,
        recipient_vars: Option<&str>,
        limit: Limit,
    ) -> (String, bool) {
        if let Some(text) = self.plain.get(name).and_then(|pieces| lookup.fill(pieces)) {
            return (limit.cut(text), true);
        }
        let context = context.get_or_insert_with(|| self.context(recipient_vars));
        self.render_one(name, context, limit)
    }

    fn context(&self, recipient_vars: Option<&str>) -> Value {
        let mut vars = self.vars.clone();
        if let Some(json) = recipient_vars
            && let Ok(own) = serde_json::from_str::<BTreeMap<String, String>>(json)
        {
            vars.extend(own);
        }
        Value::from_iter(vars)
    }

    fn render_one(&self, name: &str, context: &Value, limit: Limit) -> (String, bool) {
        // Without an engine every text is plain, and one that did not fill
        // misses a var: the engine (strict about undefined values) fails it.
        let rendered = self
            .env
            .as_ref()
            .map(|env| env.get_template(name).and_then(|template| template.render(context)));
        match rendered {
            Some(Ok(text)) => (limit.cut(text), true),
            Some(Err(_)) | None => {
                count_failure();
                let source = self.sources.get(name).cloned().unwrap_or_default();
                (limit.cut(source), false)
            }
        }
    }

    /// About how many bytes this takes: what a cache of compiled templates
    /// weighs it by.
    pub fn weight(&self) -> u32 {
        let texts: usize = self.sources.iter().map(|(name, text)| name.len() + text.len()).sum();
        let engine = if self.env.is_some() { ENGINE_BYTES } else { 0 };
        // The sources, their pieces and the maps around them (measured:
        // ~4.4 KB for seven short texts).
        u32::try_from(engine + 3 * texts + 4_096).unwrap_or(u32::MAX)
    }
}

/// About what an engine with a content's texts compiled weighs (measured:
/// ~60 KB with two translations and a data value).
const ENGINE_BYTES: usize = 64 << 10;

/// Counts a text that did not render.
fn count_failure() {
    metrics::counter!("notify_template_render_failures_total").increment(1);
}

/// A rendered text's limit.
#[derive(Clone, Copy)]
enum Limit {
    Chars(usize),
    Bytes(usize),
}

impl Limit {
    /// Cuts `text` to the limit, at a character boundary.
    fn cut(self, mut text: String) -> String {
        let end = match self {
            Self::Chars(chars) => text.char_indices().nth(chars).map(|(at, _)| at),
            Self::Bytes(bytes) if text.len() > bytes => {
                (0..=bytes).rev().find(|at| text.is_char_boundary(*at))
            }
            Self::Bytes(_) => None,
        };
        if let Some(end) = end {
            text.truncate(end);
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(recipient_vars: &[&str], vars: &[(&str, &str)]) -> Template {
        Template {
            vars: vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            translations: BTreeMap::new(),
            recipient_vars: recipient_vars.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn check(t: &Template, title: &str, body: &str) -> Result<()> {
        t.check("content", title, body, &BTreeMap::new())
    }

    #[test]
    fn errors_name_the_field_line_and_column() {
        let t = template(&["name"], &[]);
        let err = check(&t, "Hi {{ name }}", "ok\n  {{ name ").unwrap_err().to_string();
        assert!(err.starts_with("content.body: line 2, column"), "{err}");
        assert!(err.contains("syntax error"), "{err}");
        let err = check(&t, "Hi {{ name|shout }}", "").unwrap_err().to_string();
        assert_eq!(err, "content.title: line 1, column 12: unknown filter \"shout\"");
        let err = check(&t, "{% if name is odd_one %}x{% endif %}", "").unwrap_err().to_string();
        assert!(err.starts_with("content.title: line 1") && err.contains("unknown test"), "{err}");
        let err = check(&t, "Hi", "Dear {{ name }},\n{{ amount }} is due").unwrap_err().to_string();
        assert!(err.starts_with("content.body: line 2, column 4: variable \"amount\""), "{err}");
        let err = check(&t, "{{ launch() }}", "").unwrap_err().to_string();
        assert!(err.contains("unknown function \"launch\""), "{err}");
        let err = check(&t, "{% include 'x' %}", "").unwrap_err().to_string();
        assert!(err.starts_with("content.title: line 1"), "{err}");
    }

    #[test]
    fn a_variable_of_a_filter_branch_never_taken_is_still_checked() {
        let t = template(&[], &[("plan", "pro")]);
        let err = check(&t, "{% if plan == 'free' %}{{ plan|nope }}{% endif %}", "").unwrap_err();
        assert!(err.to_string().contains("unknown filter \"nope\""), "{err}");
        let ok = "{% for i in range(3) %}{{ loop.index }}{% set y = i %}{{ y }}{% endfor %}";
        check(&t, ok, "{{ plan|upper|default('x') }}").unwrap();
    }

    #[test]
    fn recipient_vars_are_exactly_the_declared_names() {
        let t = template(&["name", "amount"], &[]);
        let mut vars = BTreeMap::from([("name".to_owned(), "Ann".to_owned())]);
        let err = t.recipient_vars_json(&vars, "r[0].vars").unwrap_err().to_string();
        assert_eq!(err, "r[0].vars: \"amount\" is missing");
        vars.insert("amount".to_owned(), "¥128".to_owned());
        assert_eq!(t.recipient_vars_json(&vars, "f").unwrap(), r#"{"amount":"¥128","name":"Ann"}"#);
        vars.insert("nmae".to_owned(), "typo".to_owned());
        let err = t.recipient_vars_json(&vars, "f").unwrap_err().to_string();
        assert!(err.contains("\"nmae\" is not one of the template's recipient_vars"), "{err}");
        let big = BTreeMap::from([
            ("name".to_owned(), "x".repeat(1100)),
            ("amount".to_owned(), String::new()),
        ]);
        let err = t.recipient_vars_json(&big, "f").unwrap_err().to_string();
        assert!(err.contains("the limit is 1024"), "{err}");
    }

    #[test]
    fn locales_fall_back_to_less_specific_tags_then_the_default() {
        assert_eq!(fallbacks("zh-Hant-TW").collect::<Vec<_>>(), ["zh-Hant-TW", "zh-Hant", "zh"]);
        assert_eq!(fallbacks("").count(), 0);
        let t = Template::new(
            BTreeMap::from([("n".to_owned(), "Ann".to_owned())]),
            [
                (
                    "zh_Hant".to_owned(),
                    Translation { title: "{{ n }}，你好".into(), body: String::new() },
                ),
                ("de".to_owned(), Translation { title: "Hallo {{ n }}".into(), body: "B".into() }),
            ],
            [],
            "content.template",
        )
        .unwrap();
        assert!(t.translations.contains_key("zh-Hant"), "{t:?}");
        t.check("content", "Hi {{ n }}", "", &BTreeMap::new()).unwrap();
        let compiled = Compiled::new(&t, "Hi {{ n }}", "", &BTreeMap::new());
        assert_eq!(compiled.render_title("zh-Hant-TW", None), "Ann，你好");
        assert_eq!(compiled.render_title("de-CH", Some(r#"{"n":"Bea"}"#)), "Hallo Bea");
        assert_eq!(compiled.render_title("fr", None), "Hi Ann");
        assert_eq!(compiled.render_title("", None), "Hi Ann");
        let titles = compiled.titles_by_language();
        let expected = [("de", "Hallo Ann"), ("zh-Hant", "Ann，你好")];
        assert_eq!(titles, expected.map(|(k, v)| (k.to_owned(), v.to_owned())).into());
        assert_eq!(pick_language(&titles, "zh-Hant-TW").unwrap(), "Ann，你好");
        assert_eq!(pick_language(&titles, "de").unwrap(), "Hallo Ann");
        assert_eq!(pick_language(&titles, "zh"), None, "zh is less specific than zh-Hant");
        assert_eq!(pick_language(&titles, ""), None);
        let err = Template::new(
            BTreeMap::new(),
            [("de".to_owned(), Translation::default()), ("DE".to_owned(), Translation::default())],
            [],
            "t",
        )
        .unwrap_err();
        assert!(err.to_string().contains("a second time"), "{err}");
    }

    #[test]
    fn rendering_is_bounded_and_a_failure_shows_the_source() {
        let t = template(&[], &[]);
        let data = BTreeMap::from([("url".to_owned(), "/i/{{ 6 * 7 }}".to_owned())]);
        let long = "{% for i in range(1000) %}0123456789{% endfor %}";
        t.check("c", "x", long, &data).unwrap();
        let compiled = Compiled::new(&t, "{% for i in range(300) %}é{% endfor %}", long, &data);
        let (rendered, ok) = compiled.render("", None);
        assert!(ok);
        assert_eq!(rendered.title.chars().count(), MAX_TITLE_CHARS);
        assert_eq!(rendered.body.len(), 10_000);
        assert_eq!(rendered.data["url"], "/i/42");
        let spin = "{% for i in range(100000) %}{{ i }}{% endfor %}";
        let compiled = Compiled::new(&t, spin, "", &BTreeMap::new());
        let (rendered, ok) = compiled.render("", None);
        assert!(!ok, "out of fuel must fail");
        assert_eq!(rendered.title.chars().count(), spin.chars().count().min(MAX_TITLE_CHARS));
    }

    #[test]
    fn a_plain_text_renders_by_its_pieces_as_the_engine_renders_it() {
        let t = template(&["name", "amount"], &[("shop", "Ann's <Shop>"), ("name", "everyone")]);
        let texts = [
            ("Hi {{ name }}, {{ amount }} at {{ shop }}", true),
            ("{{name}}{{amount}}", true),
            ("  {{- name -}}  !\n", true),
            ("no vars at all", true),
            ("", true),
            ("{{ name|upper }}", false),
            ("{% if amount %}{{ amount }}{% endif %}", false),
            ("{{ shop ~ name }}", false),
        ];
        let own = [r#"{"amount":"¥128","name":"Ann \"A\""}"#, r#"{"amount":"1","name":""}"#];
        // The engine alone, as a content that needs it renders.
        let engine = |text: &str, context: &Value| {
            let mut env = new_environment();
            env.add_template("title", text).unwrap();
            match env.get_template("title").unwrap().render(context) {
                Ok(rendered) => (rendered, true),
                Err(_) => (text.to_owned(), false),
            }
        };
        for (text, is_plain) in texts {
            let compiled = Compiled::new(&t, text, text, &BTreeMap::new());
            assert_eq!(compiled.plain.contains_key("title"), is_plain, "{text:?}");
            assert_eq!(compiled.env.is_none(), is_plain, "an engine only where a text needs it");
            for vars in own.iter().copied().map(Some).chain([None]) {
                let engine = engine(text, &compiled.context(vars));
                let (rendered, ok) = compiled.render("", vars);
                assert_eq!(
                    (rendered.title.as_str(), ok),
                    (engine.0.as_str(), engine.1),
                    "{text:?}"
                );
                assert_eq!(compiled.render_title("", vars), engine.0, "{text:?} {vars:?}");
            }
        }
        // A var the recipient lacks fails as the engine fails it: the
        // source shows.
        let compiled = Compiled::new(&t, "Hi {{ amount }}", "", &BTreeMap::new());
        assert_eq!(compiled.render("", Some("{}")), (compiled.render("", None).0, false));
        assert_eq!(compiled.render_title("", None), "Hi {{ amount }}");
        assert_eq!(compiled.render_title("", Some(r#"{"amount":"3"}"#)), "Hi 3");
        // A content of plain texts weighs its texts, one that needs the
        // engine the engine too: what the cache of compiled contents counts.
        let plain = Compiled::new(&t, "Hi {{ name }}", "{{ amount }} due", &BTreeMap::new());
        let filtered =
            Compiled::new(&t, "Hi {{ name|upper }}", "{{ amount }} due", &BTreeMap::new());
        assert!(plain.weight() < 8 << 10, "{}", plain.weight());
        assert!(filtered.weight() > ENGINE_BYTES as u32, "{}", filtered.weight());
    }
}
