//! Domain types: ids with parsing constructors, statuses, lanes and content
//! limits. Everything that crosses the gRPC boundary is validated here.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{Error, Result};
use crate::template::Template;

pub use crate::limits::{
    MAX_BODY_BYTES, MAX_CATEGORY_BYTES, MAX_DATA_BYTES, MAX_DATA_ENTRIES, MAX_TITLE_CHARS,
};

/// Longest sender name, in bytes.
pub const MAX_SENDER_BYTES: usize = 64;
/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;

/// A user id: any non-zero 64-bit integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserId(u64);

impl UserId {
    /// Accepts any id but zero; `field` names the request field in the error.
    pub fn parse(raw: u64, field: &str) -> Result<Self> {
        if raw == 0 {
            return Err(Error::invalid(field, "user id must not be 0"));
        }
        Ok(Self(raw))
    }

    /// Returns the raw id.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// A message id: a non-zero, time-ordered 64-bit integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(u64);

impl MessageId {
    /// Accepts any id but zero; `field` names the request field in the error.
    pub fn parse(raw: u64, field: &str) -> Result<Self> {
        if raw == 0 {
            return Err(Error::invalid(field, "message id must not be 0"));
        }
        Ok(Self(raw))
    }

    /// Wraps an id read from storage or generated here.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// Returns the raw id.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Lifecycle of a send; the discriminants are the stored column values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SendStatus {
    /// Draft or scheduled.
    NotStarted = 0,
    /// Chunks are being delivered.
    Sending = 1,
    /// Delivery stopped; pending chunks wait for a resume.
    Paused = 2,
    /// Every chunk is done.
    Completed = 3,
    /// Stopped for good before completing.
    Cancelled = 4,
    /// Taken back from every inbox (its chunks' items are recalled by the
    /// workers; final).
    Recalled = 5,
}

impl SendStatus {
    /// The statuses a cancel moves a send from (any before COMPLETED).
    pub const CANCELLABLE: [Self; 3] = [Self::NotStarted, Self::Sending, Self::Paused];

    /// The statuses a recall moves a send from (any but RECALLED).
    pub const RECALLABLE: [Self; 5] =
        [Self::NotStarted, Self::Sending, Self::Paused, Self::Completed, Self::Cancelled];

    /// Decodes a stored column value.
    pub fn from_db(value: u8) -> Result<Self> {
        Ok(match value {
            0 => Self::NotStarted,
            1 => Self::Sending,
            2 => Self::Paused,
            3 => Self::Completed,
            4 => Self::Cancelled,
            5 => Self::Recalled,
            other => return Err(Error::Internal(format!("unknown stored message status {other}"))),
        })
    }

    /// Returns the stored column value.
    pub fn to_db(self) -> u8 {
        self as u8
    }

    /// Returns the lowercase name used in errors and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::NotStarted => "not_started",
            Self::Sending => "sending",
            Self::Paused => "paused",
            Self::Completed => "completed",
            Self::Cancelled => "cancelled",
            Self::Recalled => "recalled",
        }
    }
}
/// Who a message goes to; the discriminants are the stored column values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AudienceKind {
    /// An explicit user list (write diffusion).
    Users = 1,
    /// Every user (read diffusion).
    AllUsers = 2,
}
/// Delivery lane: high never waits behind bulk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Lane {
    /// Large sends.
    Bulk = 0,
    /// Small or high-priority sends.
    High = 1,
}
impl Lane {
    /// Decodes a stored column value.
    pub fn from_db(value: u8) -> Self {
        if value == 1 { Self::High } else { Self::Bulk }
    }
    /// Returns the routing key and queue suffix.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bulk => "bulk",
            Self::High => "high",
        }
    }
}

/// Requested priority of a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Priority {
    /// Lane chosen by size.
    Normal = 1,
    /// Always the high lane.
    High = 2,
}

/// What a recipient sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Content {
    /// Headline.
    pub title: String,
    /// Body text.
    pub body: String,
    /// Category for inbox filters; may be empty.
    pub category: String,
    /// Application data.
    pub data: BTreeMap<String, String>,
    /// When set, `title`, `body` and the `data` values are templates filled
    /// per recipient ([`crate::template`]).
    pub template: Option<Template>,
}

impl Content {
    /// Validates every field against the limits; `field` prefixes error names.
    pub fn validate(&self, field: &str) -> Result<()> {
        crate::limits::check_title(&self.title, &format!("{field}.title"))?;
        crate::limits::check_body(&self.body, &format!("{field}.body"))?;
        validate_category(&self.category, &format!("{field}.category"))?;
        if self.data.len() > MAX_DATA_ENTRIES {
            return Err(Error::invalid(
                &format!("{field}.data"),
                &format!("has {} entries, the limit is {MAX_DATA_ENTRIES}", self.data.len()),
            ));
        }
        let data_bytes: usize = self.data.iter().map(|(k, v)| k.len() + v.len()).sum();
        if data_bytes > MAX_DATA_BYTES {
            return Err(Error::invalid(
                &format!("{field}.data"),
                &format!("is {data_bytes} bytes, the limit is {MAX_DATA_BYTES}"),
            ));
        }
        if let Some(template) = &self.template {
            template.check(field, &self.title, &self.body, &self.data)?;
        }
        Ok(())
    }

    /// Encodes `template` as stored (`None` for plain content).
    pub fn template_json(&self) -> Option<String> {
        self.template.as_ref().map(Template::to_json)
    }

    /// Encodes `data` as the JSON object stored in the database.
    pub fn data_json(&self) -> String {
        serde_json::to_string(&self.data).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Decodes `data` stored as a JSON object.
    pub fn data_from_json(json: &str) -> BTreeMap<String, String> {
        serde_json::from_str(json).unwrap_or_default()
    }
}

/// A user's membership of a group, as the badge reads it: the cursor, and
/// whether the user mutes the group (its unread stays out of the total).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCursor {
    /// The group.
    pub group_id: u64,
    /// The last seq the member acknowledged.
    pub last_ack_seq: u64,
    /// The member mutes the group.
    pub muted: bool,
}

/// A group's seq state as the badge reads it: the max seq and the seqs of
/// the messages recalled from it (tombstones keep their seq, so a member's
/// unread is the seqs after their cursor that are not recalled).
///
/// Both parts only grow (retention prunes recalled seqs that every cursor
/// has passed), so two copies merge by taking the larger max and the union
/// of the recalled seqs: a stale copy never undoes a newer one. Encoded as
/// `12` or `12:4,9` (the recalled seqs ascending).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupSeq {
    /// The group's max seq.
    pub max_seq: u64,
    /// Recalled seqs, ascending, distinct.
    pub recalled: Vec<u64>,
}

impl GroupSeq {
    /// A group's state without recalls.
    pub fn new(max_seq: u64) -> Self {
        Self { max_seq, recalled: Vec::new() }
    }

    /// Messages after `ack` that are not recalled, never negative.
    pub fn unread_after(&self, ack: u64) -> u64 {
        let recalled_after =
            self.recalled.iter().filter(|seq| **seq > ack && **seq <= self.max_seq).count();
        self.max_seq.saturating_sub(ack).saturating_sub(recalled_after as u64)
    }

    /// Parses `12` or `12:4,9`; `None` when malformed.
    pub fn parse(value: &str) -> Option<Self> {
        let (max, recalled) = value.split_once(':').unwrap_or((value, ""));
        Some(Self { max_seq: max.parse().ok()?, recalled: parse_seq_list(recalled)? })
    }

    /// The encoded form [`Self::parse`] reads.
    pub fn encode(&self) -> String {
        if self.recalled.is_empty() {
            return self.max_seq.to_string();
        }
        format!("{}:{}", self.max_seq, encode_seq_list(&self.recalled))
    }

    /// Adds a recalled seq (a no-op when it is in already); returns true
    /// when it was new.
    pub fn recall(&mut self, seq: u64) -> bool {
        match self.recalled.binary_search(&seq) {
            Ok(_) => false,
            Err(at) => {
                self.recalled.insert(at, seq);
                true
            }
        }
    }
}

/// Parses a comma-separated list of seqs (empty: none) into ascending,
/// distinct seqs; `None` when an entry is not a number.
pub fn parse_seq_list(list: &str) -> Option<Vec<u64>> {
    let mut seqs = list
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<std::result::Result<Vec<u64>, _>>()
        .ok()?;
    seqs.sort_unstable();
    seqs.dedup();
    Some(seqs)
}

/// The comma-separated form of ascending seqs.
pub fn encode_seq_list(seqs: &[u64]) -> String {
    seqs.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// Checks a category: empty, or up to 64 bytes of `[a-z0-9_.-]`.
pub fn validate_category(category: &str, field: &str) -> Result<()> {
    if category.len() > MAX_CATEGORY_BYTES {
        return Err(Error::invalid(field, &format!("must be at most {MAX_CATEGORY_BYTES} bytes")));
    }
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b);
    if !category.bytes().all(allowed) {
        return Err(Error::invalid(field, "may only contain a-z, 0-9, '_', '.' and '-'"));
    }
    Ok(())
}

/// Checks a sender name: 1..=64 printable ASCII bytes.
pub fn validate_sender(sender: &str, field: &str) -> Result<()> {
    if sender.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if sender.len() > MAX_SENDER_BYTES {
        return Err(Error::invalid(field, &format!("must be at most {MAX_SENDER_BYTES} bytes")));
    }
    if !sender.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid(field, "must be printable ASCII without spaces"));
    }
    Ok(())
}

/// Checks an optional idempotency key: up to 128 printable ASCII bytes.
pub fn validate_idempotency_key(key: &str, field: &str) -> Result<()> {
    if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(Error::invalid(
            field,
            &format!("must be at most {MAX_IDEMPOTENCY_KEY_BYTES} bytes"),
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid(field, "must be printable ASCII without spaces"));
    }
    Ok(())
}

/// Validates a list of user ids: non-empty, at most `max`, none zero.
/// Returns them sorted with duplicates removed.
pub fn validate_user_ids(raw: &[u64], max: usize, field: &str, hint: &str) -> Result<Vec<u64>> {
    if raw.is_empty() {
        return Err(Error::invalid(field, "must contain at least one user id"));
    }
    if raw.len() > max {
        return Err(Error::invalid(
            field,
            &format!("has {} ids, the limit is {max}{hint}", raw.len()),
        ));
    }
    if let Some(index) = raw.iter().position(|id| *id == 0) {
        return Err(Error::invalid(&format!("{field}[{index}]"), "user id must not be 0"));
    }
    let mut ids = raw.to_vec();
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// A batch of recipients: sorted, distinct user ids, with each one's own
/// template variables when the send's template asks for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipients {
    /// Sorted, distinct.
    user_ids: Vec<u64>,
    /// Each one's vars, aligned with `user_ids`, with their index in the
    /// request (for errors); `None` when given as bare ids.
    vars: Option<Vec<(usize, BTreeMap<String, String>)>>,
    /// The request field that listed them.
    field: String,
}

impl Recipients {
    /// Bare ids ([`validate_user_ids`]).
    pub fn ids(raw: &[u64], max: usize, field: &str, hint: &str) -> Result<Self> {
        let user_ids = validate_user_ids(raw, max, field, hint)?;
        Ok(Self { user_ids, vars: None, field: field.to_owned() })
    }

    /// Users with their vars: none zero, none twice, at most `max`.
    pub fn with_vars(
        raw: Vec<(u64, BTreeMap<String, String>)>,
        max: usize,
        field: &str,
        hint: &str,
    ) -> Result<Self> {
        if raw.is_empty() {
            return Err(Error::invalid(field, "must contain at least one recipient"));
        }
        if raw.len() > max {
            return Err(Error::invalid(
                field,
                &format!("has {} recipients, the limit is {max}{hint}", raw.len()),
            ));
        }
        let mut entries: Vec<(u64, usize, BTreeMap<String, String>)> =
            Vec::with_capacity(raw.len());
        for (index, (user_id, vars)) in raw.into_iter().enumerate() {
            UserId::parse(user_id, &format!("{field}[{index}].user_id"))?;
            entries.push((user_id, index, vars));
        }
        entries.sort_unstable_by_key(|(user_id, index, _)| (*user_id, *index));
        if let Some(pair) = entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(Error::invalid(
                &format!("{field}[{}].user_id", pair[1].1),
                &format!("user {} is listed twice (at {} too)", pair[1].0, pair[0].1),
            ));
        }
        let user_ids = entries.iter().map(|(user_id, ..)| *user_id).collect();
        let vars = entries.into_iter().map(|(_, index, vars)| (index, vars)).collect();
        Ok(Self { user_ids, vars: Some(vars), field: field.to_owned() })
    }

    /// The user ids, sorted and distinct.
    pub fn user_ids(&self) -> &[u64] {
        &self.user_ids
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.user_ids.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.user_ids.is_empty()
    }

    /// The recipients as a batch stores them for a send with `template`:
    /// each one's vars a JSON object, aligned with the ids, or none when
    /// they carry none. Each recipient's vars are dropped as soon as they
    /// are encoded, so a batch is not held twice while it is stored.
    /// INVALID_ARGUMENT when the template asks for vars these recipients
    /// lack, or they carry vars it does not declare.
    pub fn into_stored(self, template: Option<&Template>) -> Result<StoredRecipients> {
        let declared = template.filter(|template| template.per_recipient());
        let vars = match (self.vars, declared) {
            (None, None) => None,
            (None, Some(template)) => {
                return Err(Error::invalid(
                    &self.field,
                    &format!(
                        "the send's template has recipient_vars ({}): list the users as \
                         recipients, each with their vars",
                        template.recipient_vars.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            (Some(vars), None) => match vars.iter().find(|(_, vars)| !vars.is_empty()) {
                Some((index, _)) => {
                    return Err(Error::invalid(
                        &format!("{}[{index}].vars", self.field),
                        "the send's template declares no recipient_vars",
                    ));
                }
                None => None,
            },
            (Some(vars), Some(template)) => Some(
                vars.into_iter()
                    .map(|(index, vars)| {
                        template
                            .recipient_vars_json(&vars, &format!("{}[{index}].vars", self.field))
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        Ok(StoredRecipients { user_ids: self.user_ids, vars })
    }
}

/// Recipients as a batch stores them ([`Recipients::into_stored`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecipients {
    /// Sorted, distinct.
    pub user_ids: Vec<u64>,
    /// Each one's vars (a JSON object), aligned with `user_ids`; `None`
    /// when they carry none.
    pub vars: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(title: &str, body: &str) -> Content {
        Content {
            title: title.into(),
            body: body.into(),
            category: String::new(),
            data: BTreeMap::new(),
            template: None,
        }
    }

    #[test]
    fn empty_title_is_rejected_with_the_field_name() {
        let err = content(" ", "b").validate("content").unwrap_err();
        assert_eq!(err.to_string(), "content.title: must not be empty");
    }

    #[test]
    fn oversized_body_is_rejected() {
        let err = content("t", &"x".repeat(MAX_BODY_BYTES + 1)).validate("content").unwrap_err();
        assert!(err.to_string().starts_with("content.body: is 16385 bytes"), "{err}");
    }

    #[test]
    fn bad_category_is_rejected() {
        assert!(validate_category("Billing", "content.category").is_err());
        assert!(validate_category("billing.v2-x_y", "content.category").is_ok());
    }

    #[test]
    fn user_ids_are_sorted_deduplicated_and_checked() {
        assert_eq!(validate_user_ids(&[3, 1, 3, 2], 10, "ids", "").unwrap(), vec![1, 2, 3]);
        let zero = validate_user_ids(&[5, 0], 10, "audience.users.user_ids", "").unwrap_err();
        assert_eq!(zero.to_string(), "audience.users.user_ids[1]: user id must not be 0");
        let many = validate_user_ids(&[1, 2, 3], 2, "ids", "; use the draft flow").unwrap_err();
        assert_eq!(many.to_string(), "ids: has 3 ids, the limit is 2; use the draft flow");
        assert!(validate_user_ids(&[], 2, "ids", "").is_err());
    }

    #[test]
    fn status_round_trips_through_the_database_value() {
        for value in 0..=4 {
            assert_eq!(SendStatus::from_db(value).unwrap().to_db(), value);
        }
        assert!(SendStatus::from_db(9).is_err());
    }

    #[test]
    fn group_seqs_count_unread_without_recalled_seqs() {
        let mut seq = GroupSeq::new(12);
        assert_eq!(seq.unread_after(4), 8);
        assert!(seq.recall(9));
        assert!(seq.recall(4));
        assert!(!seq.recall(9), "a repeat is a no-op");
        assert_eq!(seq.recalled, vec![4, 9]);
        // Recalled seqs at or before the cursor were not unread anyway.
        assert_eq!(seq.unread_after(4), 7);
        assert_eq!(seq.unread_after(3), 7);
        assert_eq!(seq.unread_after(9), 3);
        assert_eq!(seq.unread_after(12), 0);
        assert_eq!(seq.unread_after(20), 0);
        // A recalled seq above a (stale) max never makes the count negative.
        let ahead = GroupSeq { max_seq: 2, recalled: vec![3] };
        assert_eq!(ahead.unread_after(0), 2);
    }

    #[test]
    fn group_seqs_round_trip_their_encoding() {
        assert_eq!(GroupSeq::parse("12"), Some(GroupSeq::new(12)));
        let seq = GroupSeq::parse("12:9,4,9").unwrap();
        assert_eq!(seq.recalled, vec![4, 9]);
        assert_eq!(seq.encode(), "12:4,9");
        assert_eq!(GroupSeq::parse(&GroupSeq::new(3).encode()), Some(GroupSeq::new(3)));
        assert_eq!(GroupSeq::parse("12:"), Some(GroupSeq::new(12)));
        for bad in ["", "x", "12:4,x", ":4"] {
            assert_eq!(GroupSeq::parse(bad), None, "{bad:?}");
        }
    }
}
