//! Time-ordered 64-bit message ids, unique across api replicas.
//!
//! Layout: 41 bits of milliseconds since 2025-01-01, 10 bits of instance id
//! (random per process), 12 bits of sequence. Newer messages get larger ids,
//! so "newest first" is "largest id first". Two replicas that drew the same
//! instance id could in theory collide in the same millisecond; the insert of
//! the control record would then fail on its primary key and the caller
//! draws a new id.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::domain::MessageId;

const EPOCH_MS: u64 = 1_735_689_600_000;
const SEQUENCE_BITS: u32 = 12;
const INSTANCE_BITS: u32 = 10;

/// Generates message ids.
#[derive(Debug)]
pub struct IdGenerator {
    instance: u64,
    state: Mutex<(u64, u64)>,
}

impl IdGenerator {
    /// Creates a generator with a random instance id.
    pub fn new() -> Self {
        Self::with_instance(rand::random::<u64>() & ((1 << INSTANCE_BITS) - 1))
    }

    /// Creates a generator with a fixed instance id (`0..1024`).
    pub fn with_instance(instance: u64) -> Self {
        Self { instance: instance & ((1 << INSTANCE_BITS) - 1), state: Mutex::new((0, 0)) }
    }

    /// Returns the next id; strictly increasing within this generator.
    pub fn next_id(&self) -> MessageId {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(EPOCH_MS)
            .saturating_sub(EPOCH_MS);
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (last_ms, sequence) = *state;
        let (ms, seq) = if now > last_ms {
            (now, 0)
        } else if sequence + 1 < (1 << SEQUENCE_BITS) {
            (last_ms, sequence + 1)
        } else {
            // Sequence exhausted within a millisecond: borrow the next one.
            (last_ms + 1, 0)
        };
        *state = (ms, seq);
        MessageId::from_raw(
            (ms << (INSTANCE_BITS + SEQUENCE_BITS)) | (self.instance << SEQUENCE_BITS) | seq,
        )
    }
}

impl Default for IdGenerator {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_strictly_increasing_and_non_zero() {
        let generator = IdGenerator::with_instance(7);
        let mut last = 0;
        for _ in 0..20_000 {
            let id = generator.next_id().get();
            assert!(id > last);
            last = id;
        }
    }
}
