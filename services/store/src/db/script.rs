//! Multi-statement scripts: a transaction's statements sent as one script,
//! one round trip, with the values written into the text (the text protocol
//! binds nothing). What may go into the text is typed: each statement is a
//! `&'static str` template whose `{}` take [`Arg`]s, and an argument is an
//! integer, a list of integers, bytes (written as a hex literal) or a
//! [`SafeText`] checked against a fixed alphabet when it is made, so no
//! value from a request can end a statement or start another.
//!
//! Session state a script sets (a user variable, a session variable) is
//! declared with [`Script::session`], and the script sets it back as its
//! last statements: a pooled connection leaves the script as it came.
//!
//! [`run`] sends a script and reads each statement's outcome; a script that
//! fails is rolled back on its connection (a failed statement stops the
//! script, leaving its transaction open), and the caller closes a connection
//! whose rollback fails too.

use futures::TryStreamExt;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Either, MySqlConnection};

use notify_domain::error::{Error, Result};

/// A value written into a statement's text.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// An integer.
    Int(u64),
    /// Integers separated by commas (the inside of an `IN (...)`).
    Ints(&'a [u64]),
    /// Bytes, as a hex literal `X'..'`.
    Bytes(&'a [u8]),
    /// Text from a fixed alphabet, quoted.
    Text(&'a SafeText),
}

/// Text that is safe to quote in a statement: `[a-z0-9_.-]` only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeText(String);

impl SafeText {
    /// `text`, or an error naming `field` when it holds anything but
    /// `[a-z0-9_.-]`.
    pub fn new(field: &str, text: &str) -> Result<Self> {
        let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c);
        if !text.chars().all(allowed) {
            return Err(Error::invalid(field, "may hold only a-z, 0-9, '_', '.' and '-'"));
        }
        Ok(Self(text.to_owned()))
    }
}

impl Arg<'_> {
    fn write(&self, sql: &mut String) {
        match self {
            Arg::Int(value) => sql.push_str(&value.to_string()),
            Arg::Ints(values) => {
                for (index, value) in values.iter().enumerate() {
                    if index > 0 {
                        sql.push_str(", ");
                    }
                    sql.push_str(&value.to_string());
                }
            }
            Arg::Bytes(bytes) => {
                sql.push_str("X'");
                for byte in *bytes {
                    sql.push_str(&format!("{byte:02X}"));
                }
                sql.push('\'');
            }
            Arg::Text(text) => {
                sql.push('\'');
                sql.push_str(&text.0);
                sql.push('\'');
            }
        }
    }
}

/// A script being built: its statements, each tagged with what the caller
/// reads from it.
#[derive(Debug, Clone)]
pub struct Script<S> {
    statements: Vec<(S, String)>,
    resets: Vec<&'static str>,
}

impl<S: Copy> Script<S> {
    /// An empty script.
    pub fn new() -> Self {
        Self { statements: Vec::new(), resets: Vec::new() }
    }

    /// Adds `template` with each `{}` replaced by the next of `args`.
    ///
    /// # Panics
    /// When the placeholders and the arguments do not match in number (a
    /// bug in the template at hand, found by its first test).
    pub fn push(&mut self, step: S, template: &'static str, args: &[Arg<'_>]) -> &mut Self {
        let mut sql = String::with_capacity(template.len() + 16 * args.len());
        let mut parts = template.split("{}");
        sql.push_str(parts.next().unwrap_or_default());
        let mut args = args.iter();
        for part in parts {
            let arg = args.next().expect("a script template has more {} than arguments");
            arg.write(&mut sql);
            sql.push_str(part);
        }
        assert!(args.next().is_none(), "a script template has fewer {{}} than arguments");
        self.statements.push((step, sql));
        self
    }

    /// Adds a statement that sets session state (`template`, as
    /// [`Self::push`]), and `reset`, the statement that sets it back, to the
    /// script's end.
    pub fn session(
        &mut self,
        step: S,
        template: &'static str,
        args: &[Arg<'_>],
        reset: &'static str,
    ) -> &mut Self {
        self.push(step, template, args);
        self.resets.push(reset);
        self
    }

    /// The steps in order (resets last, tagged `reset`), and the script's
    /// text.
    pub fn build(mut self, reset: S) -> (Vec<S>, String) {
        for statement in std::mem::take(&mut self.resets) {
            self.statements.push((reset, statement.to_owned()));
        }
        let steps = self.statements.iter().map(|(step, _)| *step).collect();
        let text =
            self.statements.iter().map(|(_, sql)| sql.as_str()).collect::<Vec<_>>().join(";\n");
        (steps, text)
    }
}

impl<S: Copy> Default for Script<S> {
    fn default() -> Self {
        Self::new()
    }
}

/// What one statement of a script did: rows affected, or rows.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Rows it changed (an `INSERT`, `UPDATE` or `DELETE`).
    pub rows_affected: u64,
    /// Rows it returned (a `SELECT`).
    pub rows: Vec<MySqlRow>,
}

/// Sends a built script on `conn` and reads each statement's outcome, in
/// order (`steps.len()` of them). A script that fails is rolled back on
/// `conn`; `Err` with `fit = false` when that failed too, and the
/// connection is not fit to be used again.
pub async fn run(
    conn: &mut MySqlConnection,
    steps: usize,
    text: String,
) -> std::result::Result<Vec<Outcome>, (Error, bool)> {
    let ran = read(conn, steps, text).await;
    match ran {
        Ok(outcomes) => Ok(outcomes),
        Err(e) => {
            let fit = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.is_ok();
            Err((e, fit))
        }
    }
}

async fn read(conn: &mut MySqlConnection, steps: usize, text: String) -> Result<Vec<Outcome>> {
    let malformed = |what: &str| Error::Internal(format!("a script: {what}"));
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(steps);
    let mut current = Outcome::default();
    let mut results = sqlx::raw_sql(AssertSqlSafe(text)).fetch_many(&mut *conn);
    while let Some(result) = results.try_next().await? {
        match result {
            Either::Left(done) => {
                current.rows_affected = done.rows_affected();
                outcomes.push(std::mem::take(&mut current));
                if outcomes.len() > steps {
                    return Err(malformed("more results than statements"));
                }
            }
            Either::Right(row) => current.rows.push(row),
        }
    }
    if outcomes.len() != steps {
        return Err(malformed("fewer results than statements"));
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Step {
        Set,
        Select,
        Reset,
    }

    #[test]
    fn values_are_written_by_type_and_session_state_is_set_back_last() {
        let category = SafeText::new("category", "billing.eu-1").unwrap();
        let mut script = Script::new();
        script.session(Step::Set, "SET @at = {}", &[Arg::Int(7)], "SET @at = NULL").push(
            Step::Select,
            "SELECT 1 FROM t WHERE id IN ({}) AND c = {} AND b = {}",
            &[Arg::Ints(&[1, 2, 3]), Arg::Text(&category), Arg::Bytes(b"';")],
        );
        let (steps, text) = script.build(Step::Reset);
        assert_eq!(steps, [Step::Set, Step::Select, Step::Reset]);
        assert_eq!(
            text,
            "SET @at = 7;\nSELECT 1 FROM t WHERE id IN (1, 2, 3) AND c = 'billing.eu-1' \
             AND b = X'273B';\nSET @at = NULL"
        );
    }

    #[test]
    fn text_outside_its_alphabet_is_refused_naming_the_field() {
        for bad in ["a'b", "a;b", "A", "a b", "a\\b", "é"] {
            let refused = SafeText::new("category", bad).unwrap_err();
            assert!(refused.to_string().starts_with("category:"), "{bad}: {refused}");
        }
    }
}
