//! The recent events of the bus, by their offset in the events stream, so a
//! stream that reconnects resumes where it left off (the edge's
//! `Last-Event-ID`).
//!
//! A [`Position`] is an event's offset in RabbitMQ's events stream, shared
//! by every replica that reads it, with the event's publish time as a
//! check: a position whose event the history holds under another time
//! comes from another life of the stream (deleted and declared again) and
//! does not resume. The history is bounded by count and by age; further
//! back than it holds, a stream starts over with a snapshot.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use notify_core::events::BusEvent;

/// Where an event is in the events stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Its offset in the stream.
    pub offset: u64,
    /// When it was published, ms since the epoch (0: not stamped).
    pub stamp: u64,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.offset, self.stamp)
    }
}

impl FromStr for Position {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        let (offset, stamp) = text.trim().split_once('-').ok_or(())?;
        Ok(Self { offset: offset.parse().map_err(|_| ())?, stamp: stamp.parse().map_err(|_| ())? })
    }
}

/// Why a stream cannot resume from a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap {
    /// The position is older than what the history holds.
    TooOld,
    /// The history does not know it (another life of the stream, or
    /// ahead of what this replica read).
    Unknown,
}

/// The recent events, oldest first.
pub struct History {
    events: VecDeque<(Position, Arc<BusEvent>)>,
    max_events: usize,
    max_age_ms: u64,
}

impl History {
    /// An empty history of at most `max_events` events, none older than
    /// `max_age_ms` (by publish time) than the newest.
    pub fn new(max_events: usize, max_age_ms: u64) -> Self {
        Self { events: VecDeque::new(), max_events, max_age_ms }
    }

    /// Adds the next event. An offset that does not follow the last one
    /// (the stream dropped what this replica had not read) starts the
    /// history over: nothing before it can resume.
    pub fn push(&mut self, at: Position, event: Arc<BusEvent>) {
        if self.last().is_some_and(|last| at.offset != last.offset + 1) {
            self.events.clear();
        }
        self.events.push_back((at, event));
        while self.events.len() > self.max_events {
            self.events.pop_front();
        }
        let oldest = at.stamp.saturating_sub(self.max_age_ms);
        while self.events.front().is_some_and(|(p, _)| p.stamp < oldest && p.stamp > 0) {
            self.events.pop_front();
        }
    }

    /// Forgets everything (the bus lost events: nothing before resumes).
    pub fn clear(&mut self) {
        self.events.clear();
    }

    /// The newest event's position.
    pub fn last(&self) -> Option<Position> {
        self.events.back().map(|(p, _)| *p)
    }

    /// The events after `from`, oldest first, when the history holds
    /// `from` itself (so nothing between is missing).
    pub fn after(&self, from: Position) -> Result<Vec<(Position, Arc<BusEvent>)>, Gap> {
        let first = self.events.front().map(|(p, _)| p.offset).ok_or(Gap::Unknown)?;
        if from.offset < first {
            return Err(Gap::TooOld);
        }
        let index = (from.offset - first) as usize;
        match self.events.get(index) {
            Some((held, _)) if *held == from => {
                Ok(self.events.iter().skip(index + 1).map(|(p, e)| (*p, e.clone())).collect())
            }
            _ => Err(Gap::Unknown),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u64) -> Arc<BusEvent> {
        Arc::new(BusEvent::BadgesChanged { user_ids: vec![n] })
    }

    fn at(offset: u64) -> Position {
        Position { offset, stamp: 1_000 + offset }
    }

    #[test]
    fn a_position_resumes_after_itself_and_only_in_its_own_stream() {
        let mut history = History::new(100, 60_000);
        for offset in 10..20 {
            history.push(at(offset), event(offset));
        }
        let after: Vec<u64> =
            history.after(at(15)).unwrap().iter().map(|(p, _)| p.offset).collect();
        assert_eq!(after, [16, 17, 18, 19]);
        assert!(history.after(at(19)).unwrap().is_empty(), "the newest: nothing to replay");
        assert_eq!(history.after(at(9)).unwrap_err(), Gap::TooOld);
        let elsewhere = Position { offset: 15, stamp: 7 };
        assert_eq!(
            history.after(elsewhere).unwrap_err(),
            Gap::Unknown,
            "another life of the stream"
        );
        assert_eq!(history.after(at(25)).unwrap_err(), Gap::Unknown, "ahead of this replica");
        assert_eq!("15-1015".parse::<Position>(), Ok(at(15)));
        assert_eq!(at(15).to_string(), "15-1015");
        assert!("15".parse::<Position>().is_err());
    }

    #[test]
    fn the_history_is_bounded_by_count_and_age_and_a_skipped_offset_starts_it_over() {
        let mut history = History::new(5, 60_000);
        for offset in 0..8 {
            history.push(at(offset), event(offset));
        }
        assert_eq!(history.after(at(2)).unwrap_err(), Gap::TooOld);
        assert_eq!(history.after(at(3)).unwrap().len(), 4);

        let mut aged = History::new(100, 5);
        for offset in 0..10 {
            aged.push(at(offset), event(offset));
        }
        assert_eq!(
            aged.after(at(3)).unwrap_err(),
            Gap::TooOld,
            "older than 5 ms before the newest"
        );
        assert_eq!(aged.after(at(4)).unwrap().len(), 5);

        history.push(at(20), event(20));
        assert_eq!(history.after(at(7)).unwrap_err(), Gap::TooOld, "offsets 8..20 were never read");
        assert_eq!(history.last(), Some(at(20)));
    }
}
