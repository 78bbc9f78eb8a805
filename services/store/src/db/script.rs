//! Multi-statement scripts: a transaction's statements sent as one script,
//! one round trip, with the values written into the text (the text protocol
//! binds nothing). What may go into the text is typed: a statement is built
//! from `&'static str` templates whose `?` take [`Arg`]s (the placeholders
//! a prepared statement binds, so one constant serves both), and an
//! argument is an integer, a list of integers, bytes (written as a hex
//! literal), a [`SafeText`] checked against a fixed alphabet when it is
//! made, or a piece of SQL built the same way ([`Sql`]), so no value from a
//! request can end a statement or start another.
//!
//! Session state a script sets (a user variable, a session variable) is
//! declared with [`Script::session`], and the script sets it back as its
//! last statements: a pooled connection leaves the script as it came.
//!
//! [`run`] sends a script and reads each statement's outcome; a script that
//! fails is rolled back on its connection, its session state set back (a
//! failed statement stops the script, leaving its transaction open and its
//! resets unsent), and the caller closes a connection where that fails too.

use futures::TryStreamExt;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Either, MySqlConnection};

use crate::error::Result;
use notify_domain::Error;

/// A value written into a statement's text.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// An integer.
    Int(u64),
    /// A signed integer.
    Signed(i64),
    /// Integers separated by commas (the inside of an `IN (...)`).
    Ints(&'a [u64]),
    /// Bytes, as a hex literal `X'..'`.
    Bytes(&'a [u8]),
    /// Text from a fixed alphabet, quoted.
    Text(&'a SafeText),
    /// A piece of SQL, as it was built.
    Sql(&'a Sql),
}

/// Text that is safe to quote in a statement: `[a-z0-9_.-]` only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeText(String);

impl SafeText {
    /// `text`, or an error naming `field` when it holds anything but
    /// `[a-z0-9_.-]`.
    pub fn new(field: &str, text: &str) -> notify_domain::Result<Self> {
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
            Arg::Signed(value) => sql.push_str(&value.to_string()),
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
            Arg::Sql(piece) => sql.push_str(&piece.0),
        }
    }
}

/// SQL text made of `&'static str` templates and [`Arg`]s alone: a
/// statement, or a piece of one that several statements share (a
/// condition), which they take as [`Arg::Sql`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sql(String);

impl Sql {
    /// `template` with each `?` replaced by the next of `args`.
    ///
    /// # Panics
    /// When the placeholders and the arguments do not match in number (a
    /// bug in the template at hand, found by its first test).
    pub fn new(template: &'static str, args: &[Arg<'_>]) -> Self {
        let mut sql = Self(String::with_capacity(template.len() + 16 * args.len()));
        sql.push(template, args);
        sql
    }

    /// Appends `template` with its `args`, as [`Self::new`] makes it.
    pub fn push(&mut self, template: &'static str, args: &[Arg<'_>]) -> &mut Self {
        let mut parts = template.split('?');
        self.0.push_str(parts.next().unwrap_or_default());
        let mut args = args.iter();
        for part in parts {
            let arg = args.next().expect("a script template has more ? than arguments");
            arg.write(&mut self.0);
            self.0.push_str(part);
        }
        assert!(args.next().is_none(), "a script template has fewer ? than arguments");
        self
    }

    /// Appends another piece.
    pub fn append(&mut self, piece: &Sql) -> &mut Self {
        self.0.push_str(&piece.0);
        self
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A script being built: its statements, each tagged with what the caller
/// reads from it.
#[derive(Debug, Clone)]
pub struct Script<S> {
    statements: Vec<(S, Sql)>,
    resets: Vec<&'static str>,
}

impl<S: Copy> Script<S> {
    /// An empty script.
    pub fn new() -> Self {
        Self { statements: Vec::new(), resets: Vec::new() }
    }

    /// Adds the statement `template` with its `args` ([`Sql::new`]).
    pub fn push(&mut self, step: S, template: &'static str, args: &[Arg<'_>]) -> &mut Self {
        self.statements.push((step, Sql::new(template, args)));
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

    /// The script to [`run`], its resets last (tagged `reset`).
    pub fn build(mut self, reset: S) -> Built<S> {
        let undo = ["ROLLBACK"].iter().chain(&self.resets).copied().collect::<Vec<_>>().join(";\n");
        for statement in std::mem::take(&mut self.resets) {
            self.statements.push((reset, Sql::new(statement, &[])));
        }
        let steps = self.statements.iter().map(|(step, _)| *step).collect();
        let text =
            self.statements.iter().map(|(_, sql)| sql.as_str()).collect::<Vec<_>>().join(";\n");
        Built { steps, text, undo }
    }
}

impl<S: Copy> Default for Script<S> {
    fn default() -> Self {
        Self::new()
    }
}

/// A built script: what each statement is, and the text that goes.
#[derive(Debug, Clone)]
pub struct Built<S> {
    /// Each statement's step, in order (the resets last).
    pub steps: Vec<S>,
    /// The statements, separated by `;`.
    pub text: String,
    /// What ends the script when a statement fails: `ROLLBACK`, then the
    /// resets.
    undo: String,
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
/// order, with its step. A script that fails is rolled back on `conn` and
/// its session state set back; `Err` with `fit = false` when that failed
/// too, and the connection is not fit to be used again.
pub async fn run<S: Copy>(
    conn: &mut MySqlConnection,
    script: Built<S>,
) -> std::result::Result<Vec<(S, Outcome)>, (crate::Error, bool)> {
    let Built { steps, text, undo } = script;
    match read(conn, steps.len(), text).await {
        Ok(outcomes) => Ok(steps.into_iter().zip(outcomes).collect()),
        Err(e) => {
            let fit = sqlx::raw_sql(AssertSqlSafe(undo)).execute(&mut *conn).await.is_ok();
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
                    return Err(malformed("more results than statements").into());
                }
            }
            Either::Right(row) => current.rows.push(row),
        }
    }
    if outcomes.len() != steps {
        return Err(malformed("fewer results than statements").into());
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
        let mut condition = Sql::new(" AND c = ?", &[Arg::Text(&category)]);
        condition.push(" AND d = ?", &[Arg::Signed(-1)]);
        let mut script = Script::new();
        script.session(Step::Set, "SET @at = ?", &[Arg::Int(7)], "SET @at = NULL").push(
            Step::Select,
            "SELECT 1 FROM t WHERE id IN (?)? AND b = ?",
            &[Arg::Ints(&[1, 2, 3]), Arg::Sql(&condition), Arg::Bytes(b"';")],
        );
        let built = script.build(Step::Reset);
        assert_eq!(built.steps, [Step::Set, Step::Select, Step::Reset]);
        assert_eq!(
            built.text,
            "SET @at = 7;\nSELECT 1 FROM t WHERE id IN (1, 2, 3) AND c = 'billing.eu-1' \
             AND d = -1 AND b = X'273B';\nSET @at = NULL"
        );
        // A script stopped by a failed statement never reaches its resets.
        assert_eq!(built.undo, "ROLLBACK;\nSET @at = NULL");
    }

    #[test]
    #[should_panic(expected = "more ? than arguments")]
    fn a_template_with_a_placeholder_too_many_is_a_bug() {
        Sql::new("SELECT ? FROM t WHERE id = ?", &[Arg::Int(1)]);
    }

    #[test]
    fn text_outside_its_alphabet_is_refused_naming_the_field() {
        for bad in ["a'b", "a;b", "A", "a b", "a\\b", "é"] {
            let refused = SafeText::new("category", bad).unwrap_err();
            assert!(refused.to_string().starts_with("category:"), "{bad}: {refused}");
        }
    }
}
