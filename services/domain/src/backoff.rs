//! The reconnect backoff of every long-lived connection (the worker's
//! consumers, the api's event bus consumer, the near cache's tracking
//! connection): exponential, jittered, capped, and started over after a
//! good connect.
//!
//! It lives here, in the crate all three depend on, because it is pure: it
//! says how long to wait and the caller sleeps (this crate does no I/O).
//! The delays come from `backon`'s [`ExponentialBuilder`].

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// The waits between reconnect attempts.
///
/// Jittered so that replicas which lost a broker or Redis together (a
/// restart) do not all come back in the same instant: each wait is drawn
/// between the current step and twice it, the step doubling from `min` and
/// stopping at `max / 2`, so every wait lies within `[min, max]`.
#[derive(Debug)]
pub struct Reconnect {
    builder: ExponentialBuilder,
    delays: <ExponentialBuilder as BackoffBuilder>::Backoff,
    max: Duration,
}

impl Reconnect {
    /// A backoff whose first wait is at least `min` and whose waits never
    /// exceed `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        // backon adds a random share (0 to 100%) of the step on top of it,
        // so the step stops at half the longest wait.
        let builder = ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay((max / 2).max(min))
            .with_jitter()
            .without_max_times();
        Self { builder, delays: builder.build(), max }
    }

    /// How long to wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        // Without a limit on attempts the delays never run out.
        self.delays.next().unwrap_or(self.max)
    }

    /// Starts over from the shortest wait, after a connection that worked.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn first(backoff: &mut Reconnect, n: usize) -> Vec<Duration> {
        (0..n).map(|_| backoff.next_delay()).collect()
    }

    #[test]
    fn waits_grow_from_the_shortest_and_are_capped() {
        let waits = first(&mut Reconnect::new(MIN, MAX), 30);
        assert!(waits.iter().all(|wait| (MIN..=MAX).contains(wait)), "{waits:?}");
        assert!(waits[0] < 2 * MIN, "the first wait is near the shortest: {waits:?}");
        // Each step doubles and a wait lies between its step and twice it,
        // so waits rise strictly until the step reaches its cap (2.5 s,
        // after 100, 200, 400, 800, 1600 ms).
        for pair in waits[..5].windows(2) {
            assert!(pair[0] < pair[1], "waits grow: {waits:?}");
        }
        // Capped: from then on between the cap's step and the longest wait.
        assert!(waits[6..].iter().all(|wait| *wait >= MAX / 2), "{waits:?}");
    }

    #[test]
    fn two_backoffs_wait_differently() {
        // Replicas that lost the broker together come back at different
        // moments: the chance that 10 draws of two backoffs coincide is nil.
        let one = first(&mut Reconnect::new(MIN, MAX), 10);
        let other = first(&mut Reconnect::new(MIN, MAX), 10);
        assert_ne!(one, other);
    }

    #[test]
    fn a_reset_starts_over_from_the_shortest_wait() {
        let mut backoff = Reconnect::new(MIN, MAX);
        let long = first(&mut backoff, 10);
        assert!(long[9] >= MAX / 2, "{long:?}");
        backoff.reset();
        let wait = backoff.next_delay();
        assert!((MIN..2 * MIN).contains(&wait), "after a reset: {wait:?}");
    }
}
