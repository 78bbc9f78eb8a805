//! Reading recipient ids from a range, a file or stdin.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

/// Where user ids come from: a range, a file or stdin.
#[derive(Debug, Args)]
pub struct RecipientArgs {
    /// Users as a range: 1..1000000 or 1..=1000000.
    #[arg(long, conflicts_with_all = ["users_file", "stdin"])]
    users: Option<String>,
    /// File of ids (whitespace or comma separated).
    #[arg(long)]
    users_file: Option<PathBuf>,
    /// Read ids from standard input.
    #[arg(long)]
    stdin: bool,
}

impl RecipientArgs {
    /// Reads the ids from whichever source was given.
    pub fn read(&self) -> anyhow::Result<Vec<u64>> {
        if let Some(range) = &self.users {
            let ids = parse_range(range)?;
            // `1..1000` is 999 users, as in Rust: say so, so nobody is
            // surprised by the count.
            if let (Some(first), Some(last)) = (ids.first(), ids.last()) {
                eprintln!("--users {range}: {} users, {first} to {last}", ids.len());
            }
            return Ok(ids);
        }
        if let Some(path) = &self.users_file {
            let file =
                std::fs::File::open(path).with_context(|| format!("--users-file {path:?}"))?;
            return read_ids(std::io::BufReader::new(file), &path.display().to_string());
        }
        if self.stdin {
            return read_ids(std::io::stdin().lock(), "stdin");
        }
        bail!("give users with --users A..B, --users-file FILE or --stdin")
    }
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
}
