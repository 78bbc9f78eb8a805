//! `ListRecipients` and `GetRecipientStatus` on the wire: the filter and the
//! states between proto and `notify_core::recipients`.

use notify_core::recipients::{Filter, Recipient, RecipientState};
use notify_domain::{Error, Result};
use notify_proto::v1;

use crate::convert::timestamp;

/// Reads a `RecipientFilter`, naming `field` when it is unknown (0, the
/// default, lists every recipient).
pub fn filter(raw: i32, field: &str) -> Result<Filter> {
    use v1::RecipientFilter as F;
    match F::try_from(raw) {
        Ok(F::Unspecified) => Ok(Filter::All),
        Ok(F::Delivered) => Ok(Filter::Delivered),
        Ok(F::Read) => Ok(Filter::Read),
        Ok(F::Unread) => Ok(Filter::Unread),
        Ok(F::Failed) => Ok(Filter::Failed),
        Ok(F::Pending) => Ok(Filter::Pending),
        Ok(F::Suppressed) => Ok(Filter::Suppressed),
        Ok(F::Recalled) => Ok(Filter::Recalled),
        Ok(F::Cancelled) => Ok(Filter::Cancelled),
        Err(_) => Err(Error::invalid(field, &format!("unknown recipient filter {raw}"))),
    }
}

/// The proto state of a state.
pub fn state_to_proto(state: RecipientState) -> v1::RecipientState {
    use v1::RecipientState as S;
    match state {
        RecipientState::Unread => S::Unread,
        RecipientState::Read => S::Read,
        RecipientState::Pending => S::Pending,
        RecipientState::Failed => S::Failed,
        RecipientState::Suppressed => S::Suppressed,
        RecipientState::Cancelled => S::Cancelled,
        RecipientState::Recalled => S::Recalled,
        RecipientState::NotARecipient => S::NotARecipient,
    }
}

/// The proto recipient of a recipient.
pub fn recipient_to_proto(recipient: Recipient) -> v1::Recipient {
    v1::Recipient {
        user_id: recipient.user_id,
        state: state_to_proto(recipient.state) as i32,
        delivered_at: recipient.delivered_at.map(timestamp),
        read_at: recipient.read_at.map(timestamp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_filters_are_refused_naming_the_field() {
        assert_eq!(filter(0, "state").unwrap(), Filter::All);
        assert_eq!(filter(3, "state").unwrap(), Filter::Unread);
        assert_eq!(
            filter(99, "state").unwrap_err().to_string(),
            "state: unknown recipient filter 99"
        );
    }
}
