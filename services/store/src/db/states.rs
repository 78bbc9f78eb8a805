//! The stored values of chunk states, send statuses and audiences, as SQL
//! literals for `concat!`: the completion and recovery rules live in SQL
//! (`state IN (pending, unsettled)`), and a bare number there would say
//! nothing of which states a rule means. Each expands to the same value as
//! its Rust constant ([`super::chunks::state`], `SendStatus`, `AudienceKind`);
//! the tests below hold them together.

/// A chunk state as a SQL literal: `chunk_state!(PENDING)`.
#[macro_export]
macro_rules! chunk_state {
    (PENDING) => {
        "0"
    };
    (DONE) => {
        "1"
    };
    (FAILED) => {
        "2"
    };
    (CANCELLED) => {
        "3"
    };
    (UNSETTLED) => {
        "4"
    };
    (RECALLED) => {
        "5"
    };
    (RECALL_UNSETTLED) => {
        "6"
    };
}

/// A send's status (`messages.status`) as a SQL literal:
/// `send_status!(SENDING)`.
#[macro_export]
macro_rules! send_status {
    (NOT_STARTED) => {
        "0"
    };
    (SENDING) => {
        "1"
    };
    (PAUSED) => {
        "2"
    };
    (COMPLETED) => {
        "3"
    };
    (CANCELLED) => {
        "4"
    };
    (RECALLED) => {
        "5"
    };
}

/// A send's audience (`messages.audience`) as a SQL literal.
#[macro_export]
macro_rules! audience {
    (USERS) => {
        "1"
    };
    (ALL_USERS) => {
        "2"
    };
}

#[cfg(test)]
mod tests {
    use notify_domain::domain::{AudienceKind, SendStatus};

    use crate::db::chunks::state;

    fn value(literal: &str) -> u8 {
        literal.parse().unwrap()
    }

    #[test]
    fn every_chunk_state_is_the_constant_it_names() {
        let states = [
            (chunk_state!(PENDING), state::PENDING),
            (chunk_state!(DONE), state::DONE),
            (chunk_state!(FAILED), state::FAILED),
            (chunk_state!(CANCELLED), state::CANCELLED),
            (chunk_state!(UNSETTLED), state::UNSETTLED),
            (chunk_state!(RECALLED), state::RECALLED),
            (chunk_state!(RECALL_UNSETTLED), state::RECALL_UNSETTLED),
        ];
        for (literal, constant) in states {
            assert_eq!(value(literal), constant);
        }
        // Seven states, each its own value.
        let distinct: std::collections::HashSet<u8> =
            states.iter().map(|(l, _)| value(l)).collect();
        assert_eq!(distinct.len(), 7);
    }

    #[test]
    fn every_send_status_and_audience_is_the_value_it_names() {
        let statuses = [
            (send_status!(NOT_STARTED), SendStatus::NotStarted),
            (send_status!(SENDING), SendStatus::Sending),
            (send_status!(PAUSED), SendStatus::Paused),
            (send_status!(COMPLETED), SendStatus::Completed),
            (send_status!(CANCELLED), SendStatus::Cancelled),
            (send_status!(RECALLED), SendStatus::Recalled),
        ];
        for (literal, status) in statuses {
            assert_eq!(SendStatus::from_db(value(literal)).unwrap(), status);
        }
        assert_eq!(value(audience!(USERS)), AudienceKind::Users as u8);
        assert_eq!(value(audience!(ALL_USERS)), AudienceKind::AllUsers as u8);
    }
}
