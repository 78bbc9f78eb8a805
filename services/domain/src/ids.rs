//! Time-ordered 64-bit message ids, unique across every live process.
//!
//! Layout: 41 bits of milliseconds since 2025-01-01, 10 bits of instance id,
//! 12 bits of sequence. Newer messages get larger ids, so "newest first" is
//! "largest id first".
//!
//! The instance id is leased, so two live processes never share one (the
//! lease is stored on the first shard: `notify_store::instance_lease`). A
//! generator stops issuing ids on its own once the validity its lease holder
//! gave it ([`IdGenerator::hold`]) has run out.

use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::domain::MessageId;
use crate::error::{Error, Result};

const EPOCH_MS: u64 = 1_735_689_600_000;
/// Bits below the timestamp in an id.
const TIME_SHIFT: u32 = INSTANCE_BITS + SEQUENCE_BITS;
const SEQUENCE_BITS: u32 = 12;
const INSTANCE_BITS: u32 = 10;
/// How many instance ids there are: live processes issue ids under
/// distinct ones.
pub const INSTANCES: u64 = 1 << INSTANCE_BITS;

/// The smallest id issued at or after `unix_ms` (milliseconds since 1970):
/// ids are time-ordered, so id ranges are time ranges (retention partitions
/// `message_items` by them).
pub fn first_id_at(unix_ms: u64) -> u64 {
    unix_ms.saturating_sub(EPOCH_MS) << TIME_SHIFT
}

/// Generates message ids.
#[derive(Debug)]
pub struct IdGenerator {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last_ms: u64,
    sequence: u64,
    instance: u64,
    /// Until when the instance may be used; `None`: always (a fixed instance).
    valid_until: Option<Instant>,
}

impl IdGenerator {
    /// Creates a generator with a fixed instance id (`0..1024`), for tools
    /// and benches that never share a database with a live process.
    pub fn with_instance(instance: u64) -> Self {
        let state =
            State { last_ms: 0, sequence: 0, instance: instance % INSTANCES, valid_until: None };
        Self { state: Mutex::new(state) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The instance id in use.
    pub fn instance(&self) -> u64 {
        self.lock().instance
    }

    /// Returns the next id; strictly increasing within this generator.
    /// Fails while the instance lease cannot be renewed.
    pub fn next_id(&self) -> Result<MessageId> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(EPOCH_MS)
            .saturating_sub(EPOCH_MS);
        let mut state = self.lock();
        if state.valid_until.is_some_and(|until| Instant::now() >= until) {
            return Err(Error::Unavailable(
                "message ids: this process's instance lease could not be renewed (is the first \
                 shard reachable?)"
                    .to_owned(),
            ));
        }
        let (ms, sequence) = if now > state.last_ms {
            (now, 0)
        } else if state.sequence + 1 < (1 << SEQUENCE_BITS) {
            (state.last_ms, state.sequence + 1)
        } else {
            // Sequence exhausted within a millisecond: borrow the next one.
            (state.last_ms + 1, 0)
        };
        state.last_ms = ms;
        state.sequence = sequence;
        let id = (ms << TIME_SHIFT) | (state.instance << SEQUENCE_BITS);
        Ok(MessageId::from_raw(id | sequence))
    }

    /// Uses `instance` until `until` (called by the holder of the
    /// instance's lease). On a move to another instance the next id starts a
    /// millisecond later, so ids stay strictly increasing whatever the new
    /// instance's number.
    pub fn hold(&self, instance: u64, until: Instant) {
        let mut state = self.lock();
        if state.instance != instance {
            state.last_ms += 1;
            state.sequence = 0;
            state.instance = instance;
        }
        state.valid_until = Some(until);
    }
}

/// The host name this process runs on (`HOSTNAME`, else `local`), as
/// replicas and lease holders name themselves.
pub fn hostname() -> String {
    std::env::var("HOSTNAME").unwrap_or_else(|_| "local".to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn ids_are_strictly_increasing_and_non_zero() {
        let generator = IdGenerator::with_instance(7);
        let mut last = 0;
        for _ in 0..20_000 {
            let id = generator.next_id().unwrap().get();
            assert!(id > last);
            assert_eq!((id >> SEQUENCE_BITS) & (INSTANCES - 1), 7);
            last = id;
        }
    }

    #[test]
    fn a_lapsed_lease_issues_no_ids() {
        let generator = IdGenerator::with_instance(3);
        generator.hold(3, Instant::now());
        let err = generator.next_id().unwrap_err();
        assert!(err.to_string().contains("instance lease"), "{err}");
        let before = IdGenerator::with_instance(900);
        let last = before.next_id().unwrap().get();
        before.hold(5, Instant::now() + Duration::from_secs(60));
        let moved = before.next_id().unwrap().get();
        assert_eq!((moved >> SEQUENCE_BITS) & (INSTANCES - 1), 5);
        assert!(moved > last, "an id after moving to a lower instance went backwards");
    }
}
