//! Reading recipients from a range, a file or stdin: bare ids, or users
//! with their own template variables (a CSV with a header, or JSON lines),
//! read batch by batch so that a file of millions is never held whole.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use clap::{Args, ValueEnum};
use notify_proto::v1;

/// Where users come from: a range, a file or stdin.
#[derive(Debug, Args)]
pub struct RecipientArgs {
    /// Users as a range: 1..1000000 or 1..=1000000.
    #[arg(long, conflicts_with_all = ["users_file", "stdin"])]
    users: Option<String>,
    /// File of users: ids (whitespace or comma separated), a CSV whose
    /// header names `user_id` and the template's recipient vars, or JSON
    /// lines (`{"user_id": 42, "name": "Ann"}`); see --users-format.
    #[arg(long)]
    users_file: Option<PathBuf>,
    /// Read users from standard input (ids unless --users-format says).
    #[arg(long)]
    stdin: bool,
    /// How the file or stdin lists users; `auto` goes by the file's
    /// extension (.csv, .jsonl or .ndjson; anything else holds ids).
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    users_format: Format,
}

/// How a file lists users.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// By the file's extension.
    Auto,
    /// Ids, whitespace or comma separated.
    Ids,
    /// A CSV with a header: `user_id`, then one column per variable.
    Csv,
    /// One JSON object per line: `user_id` and the variables.
    Jsonl,
}

/// Most bytes of vars one batch carries: a request stays under the api's
/// 4 MiB (`api.max_request_bytes`) whatever the vars' sizes.
const BATCH_VARS_BYTES: usize = 3 * 1024 * 1024;

/// A recipient's size in a request, roughly: its vars and their framing.
fn weight(recipient: &v1::RecipientVars) -> usize {
    16 + recipient.vars.iter().map(|(name, value)| name.len() + value.len() + 8).sum::<usize>()
}

/// A batch of recipients, as one request carries them.
#[derive(Debug, Clone, PartialEq)]
pub enum Batch {
    /// Bare ids.
    Ids(Vec<u64>),
    /// Users with their vars.
    Personal(Vec<v1::RecipientVars>),
}

impl Batch {
    /// How many users.
    pub fn len(&self) -> usize {
        match self {
            Self::Ids(ids) => ids.len(),
            Self::Personal(recipients) => recipients.len(),
        }
    }

    /// The ids and the recipients, as a request's two fields.
    pub fn into_fields(self) -> (Vec<u64>, Vec<v1::RecipientVars>) {
        match self {
            Self::Ids(ids) => (ids, Vec::new()),
            Self::Personal(recipients) => (Vec::new(), recipients),
        }
    }
}

/// Recipients read batch by batch.
pub struct Batches {
    /// The variable names every recipient carries (the file's columns or
    /// its first line's keys); empty for ids.
    pub vars: Vec<String>,
    next: Box<dyn Iterator<Item = anyhow::Result<Batch>>>,
}

impl Iterator for Batches {
    type Item = anyhow::Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next.next()
    }
}

impl RecipientArgs {
    /// Reads every user id (a CSV's or JSON lines' `user_id`s; their vars
    /// are not read).
    pub fn read(&self) -> anyhow::Result<Vec<u64>> {
        let mut ids = Vec::new();
        for batch in self.batches(usize::MAX)? {
            match batch? {
                Batch::Ids(batch) => ids.extend(batch),
                Batch::Personal(batch) => ids.extend(batch.iter().map(|r| r.user_id)),
            }
        }
        Ok(ids)
    }

    /// Opens whichever source was given, to be read in batches of `size`
    /// users (fewer when their vars would pass a request's size).
    pub fn batches(&self, size: usize) -> anyhow::Result<Batches> {
        if let Some(range) = &self.users {
            let ids = parse_range(range)?;
            // `1..1000` is 999 users, as in Rust: say so, so nobody is
            // surprised by the count.
            if let (Some(first), Some(last)) = (ids.first(), ids.last()) {
                eprintln!("--users {range}: {} users, {first} to {last}", ids.len());
            }
            return Ok(id_batches(ids, size));
        }
        let (reader, source, format): (Box<dyn BufRead>, String, Format) =
            match (&self.users_file, self.stdin) {
                (Some(path), _) => {
                    let file = std::fs::File::open(path)
                        .with_context(|| format!("--users-file {path:?}"))?;
                    let format = match self.users_format {
                        Format::Auto => format_of(path),
                        format => format,
                    };
                    (Box::new(std::io::BufReader::new(file)), path.display().to_string(), format)
                }
                (None, true) => {
                    let format = match self.users_format {
                        Format::Auto => Format::Ids,
                        format => format,
                    };
                    (Box::new(std::io::BufReader::new(std::io::stdin())), "stdin".into(), format)
                }
                (None, false) => {
                    bail!("give users with --users A..B, --users-file FILE or --stdin")
                }
            };
        match format {
            Format::Auto | Format::Ids => Ok(id_batches(read_ids(reader, &source)?, size)),
            Format::Csv => csv_batches(reader, source, size),
            Format::Jsonl => jsonl_batches(reader, source, size),
        }
    }
}

fn format_of(path: &Path) -> Format {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("csv") => Format::Csv,
        Some("jsonl" | "ndjson") => Format::Jsonl,
        _ => Format::Ids,
    }
}

fn id_batches(ids: Vec<u64>, size: usize) -> Batches {
    let batches: Vec<anyhow::Result<Batch>> =
        ids.chunks(size).map(|chunk| Ok(Batch::Ids(chunk.to_vec()))).collect();
    Batches { vars: Vec::new(), next: Box::new(batches.into_iter()) }
}

/// A CSV with a header: `user_id`, then the variables, one per column.
fn csv_batches(reader: Box<dyn BufRead>, source: String, size: usize) -> anyhow::Result<Batches> {
    let mut csv = csv::ReaderBuilder::new().trim(csv::Trim::All).from_reader(reader);
    let header = csv.headers().with_context(|| format!("{source}: no header"))?.clone();
    let id_column = header.iter().position(|name| name == "user_id");
    let Some(id_column) = id_column else {
        bail!(
            "{source}:1: the header has no user_id column (it has {:?})",
            header.iter().collect::<Vec<_>>()
        );
    };
    let vars: Vec<String> = header
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != id_column)
        .map(|(_, n)| n.to_owned())
        .collect();
    let names = vars.clone();
    let mut records = csv.into_records();
    let next = std::iter::from_fn(move || {
        let (mut batch, mut bytes) = (Vec::new(), 0);
        for record in records.by_ref() {
            let parsed = record.map_err(anyhow::Error::from).and_then(|record| {
                let line = record.position().map_or(0, |p| p.line());
                let raw = record.get(id_column).unwrap_or_default();
                let user_id = raw
                    .parse()
                    .with_context(|| format!("{source}:{line}: {raw:?} is not a user id"))?;
                let vars = record
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != id_column)
                    .zip(&names)
                    .map(|((_, value), name)| (name.clone(), value.to_owned()))
                    .collect();
                Ok(v1::RecipientVars { user_id, vars })
            });
            match parsed {
                Ok(recipient) => {
                    bytes += weight(&recipient);
                    batch.push(recipient);
                }
                Err(e) => return Some(Err(e)),
            }
            if batch.len() == size || bytes >= BATCH_VARS_BYTES {
                break;
            }
        }
        (!batch.is_empty()).then_some(Ok(Batch::Personal(batch)))
    });
    Ok(Batches { vars, next: Box::new(next) })
}

/// JSON lines: `{"user_id": 42, "name": "Ann", "amount": 128}` (numbers
/// and booleans become their text); blank lines are skipped.
fn jsonl_batches(reader: Box<dyn BufRead>, source: String, size: usize) -> anyhow::Result<Batches> {
    let mut lines = reader
        .lines()
        .enumerate()
        .filter(|(_, line)| line.as_ref().map_or(true, |line| !line.trim().is_empty()));
    let parse =
        move |number: usize, line: std::io::Result<String>| -> anyhow::Result<v1::RecipientVars> {
            let at = format!("{source}:{}", number + 1);
            let line = line.with_context(|| format!("{at}: read failed"))?;
            let serde_json::Value::Object(fields) =
                serde_json::from_str(&line).with_context(|| format!("{at}: not a JSON object"))?
            else {
                bail!("{at}: not a JSON object");
            };
            let mut user_id = None;
            let mut vars = std::collections::BTreeMap::new();
            for (name, value) in fields {
                if name == "user_id" {
                    user_id = value.as_u64();
                    ensure!(user_id.is_some(), "{at}: user_id {value} is not a user id");
                    continue;
                }
                let text = match value {
                    serde_json::Value::String(text) => text,
                    serde_json::Value::Number(_) | serde_json::Value::Bool(_) => value.to_string(),
                    other => {
                        bail!("{at}: {name} is {other}; a variable is a string, number or boolean")
                    }
                };
                vars.insert(name, text);
            }
            let user_id = user_id.with_context(|| format!("{at}: no user_id"))?;
            Ok(v1::RecipientVars { user_id, vars })
        };
    // The first line names the variables every recipient carries.
    let first = match lines.next() {
        Some((number, line)) => Some(parse(number, line)?),
        None => None,
    };
    let mut vars: Vec<String> = first.iter().flat_map(|r| r.vars.keys().cloned()).collect();
    vars.sort();
    let mut pending = first;
    let next = std::iter::from_fn(move || {
        let mut batch: Vec<v1::RecipientVars> = pending.take().into_iter().collect();
        let mut bytes: usize = batch.iter().map(weight).sum();
        while batch.len() < size && bytes < BATCH_VARS_BYTES {
            let Some((number, line)) = lines.next() else { break };
            match parse(number, line) {
                Ok(recipient) => {
                    bytes += weight(&recipient);
                    batch.push(recipient);
                }
                Err(e) => return Some(Err(e)),
            }
        }
        (!batch.is_empty()).then_some(Ok(Batch::Personal(batch)))
    });
    Ok(Batches { vars, next: Box::new(next) })
}

/// Parses `A..B` (exclusive) or `A..=B` (inclusive) into ids.
pub fn parse_range(range: &str) -> anyhow::Result<Vec<u64>> {
    let (start, end, inclusive) = if let Some((a, b)) = range.split_once("..=") {
        (a, b, true)
    } else if let Some((a, b)) = range.split_once("..") {
        (a, b, false)
    } else {
        bail!("--users: {range:?} is not a range like 1..1000 or 1..=1000");
    };
    let start: u64 =
        start.trim().parse().with_context(|| format!("--users: bad start {start:?}"))?;
    let end: u64 = end.trim().parse().with_context(|| format!("--users: bad end {end:?}"))?;
    let end = if inclusive { end } else { end.saturating_sub(1) };
    if start == 0 || start > end {
        bail!("--users: range {range:?} must start at 1 or more and not be empty");
    }
    Ok((start..=end).collect())
}

/// Reads whitespace- or comma-separated ids, one or more per line.
pub fn read_ids(reader: impl BufRead, source: &str) -> anyhow::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for (number, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("{source}: read failed"))?;
        for token in line.split(|c: char| c.is_whitespace() || c == ',').filter(|t| !t.is_empty()) {
            let id = token
                .parse()
                .with_context(|| format!("{source}:{}: {token:?} is not a user id", number + 1))?;
            ids.push(id);
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_like_rust_ranges() {
        assert_eq!(parse_range("1..4").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_range("1..=4").unwrap(), vec![1, 2, 3, 4]);
        assert!(parse_range("0..4").is_err());
        assert!(parse_range("5..5").is_err());
        assert!(parse_range("abc").is_err());
    }

    #[test]
    fn ids_are_read_from_lines_and_commas() {
        let ids = read_ids("1 2,3\n\n4\n".as_bytes(), "stdin").unwrap();
        assert_eq!(ids, vec![1, 2, 3, 4]);
        let err = read_ids("1\nx\n".as_bytes(), "ids.txt").unwrap_err();
        assert!(err.to_string().starts_with("ids.txt:2"), "{err}");
    }

    /// A recipient as read: id, and vars sorted by name.
    type Read = (u64, Vec<(String, String)>);

    fn personal(batches: Batches) -> Vec<Vec<Read>> {
        batches
            .map(|batch| match batch.unwrap() {
                Batch::Personal(recipients) => recipients
                    .into_iter()
                    .map(|r| {
                        let mut vars: Vec<_> = r.vars.into_iter().collect();
                        vars.sort();
                        (r.user_id, vars)
                    })
                    .collect(),
                Batch::Ids(_) => panic!("ids where vars were expected"),
            })
            .collect()
    }

    fn pair(name: &str, value: &str) -> (String, String) {
        (name.to_owned(), value.to_owned())
    }

    #[test]
    fn a_csv_names_user_id_and_the_vars_in_its_header_and_is_read_in_batches() {
        let text = "name, user_id ,amount\nAnn,42,\"¥1,280\"\nBo,43,€5\nCy,44,$1\n";
        let batches = csv_batches(Box::new(text.as_bytes()), "bills.csv".into(), 2).unwrap();
        assert_eq!(batches.vars, ["name", "amount"]);
        let read = personal(batches);
        assert_eq!(read.len(), 2, "two batches of at most two");
        assert_eq!(read[0][0], (42, vec![pair("amount", "¥1,280"), pair("name", "Ann")]));
        assert_eq!(read[1][0].0, 44);
        let bad = csv_batches(Box::new("name,user_id\nAnn,x\n".as_bytes()), "b.csv".into(), 10)
            .unwrap()
            .next()
            .unwrap()
            .unwrap_err();
        assert!(bad.to_string().starts_with("b.csv:2: \"x\" is not a user id"), "{bad}");
        let Err(no_id) = csv_batches(Box::new("name\nAnn\n".as_bytes()), "c.csv".into(), 10) else {
            panic!("a header without user_id must be refused");
        };
        assert!(no_id.to_string().contains("no user_id column"), "{no_id}");
    }

    #[test]
    fn a_batch_of_users_with_large_vars_stays_under_a_requests_size() {
        let value = "x".repeat(900);
        let text: String = (1..=10_000).map(|id| format!("{id},{value}\n")).collect();
        let text = format!("user_id,note\n{text}");
        let batches = csv_batches(Box::new(std::io::Cursor::new(text)), "big.csv".into(), 100_000);
        let sizes: Vec<usize> = batches.unwrap().map(|b| b.unwrap().len()).collect();
        assert!(sizes.len() > 1, "{sizes:?}");
        assert!(sizes.iter().all(|size| size * 900 <= BATCH_VARS_BYTES + 1_000), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), 10_000);
    }

    #[test]
    fn json_lines_carry_user_id_and_vars_as_text() {
        let text = "{\"user_id\": 42, \"name\": \"Ann\", \"amount\": 128}\n\n{\"user_id\": 43, \"name\": \"Bo\", \"amount\": 5.5}\n";
        let batches = jsonl_batches(Box::new(text.as_bytes()), "b.jsonl".into(), 10).unwrap();
        assert_eq!(batches.vars, ["amount", "name"]);
        let read = personal(batches);
        assert_eq!(read[0][0], (42, vec![pair("amount", "128"), pair("name", "Ann")]));
        assert_eq!(read[0][1], (43, vec![pair("amount", "5.5"), pair("name", "Bo")]));
        let bad = "{\"user_id\": 1, \"tags\": [1]}\n";
        let Err(err) = jsonl_batches(Box::new(bad.as_bytes()), "b.jsonl".into(), 10) else {
            panic!("an array var must be refused");
        };
        assert!(err.to_string().starts_with("b.jsonl:1: tags is [1]"), "{err}");
        assert_eq!(format_of(Path::new("x.NDJSON")), Format::Jsonl);
        assert_eq!(format_of(Path::new("ids.txt")), Format::Ids);
    }
}
