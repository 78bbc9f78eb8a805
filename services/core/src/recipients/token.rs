//! Page tokens of recipient lists: the send, the filter and the last user
//! id listed, opaque to callers; a token is valid only for the send and
//! filter it came from.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::Filter;
use notify_domain::domain::MessageId;
use notify_domain::error::{Error, Result};

const VERSION: &str = "r1";
const FIELD: &str = "page_token";

/// The token of the page after user `last`.
pub(super) fn encode(message_id: MessageId, filter: Filter, last: u64) -> String {
    URL_SAFE_NO_PAD.encode(format!("{VERSION}:{}:{}:{last}", message_id.get(), filter.code()))
}

/// The user id a page starts after (0 for an empty token).
pub(super) fn decode(token: &str, message_id: MessageId, filter: Filter) -> Result<u64> {
    if token.is_empty() {
        return Ok(0);
    }
    let malformed = || Error::invalid(FIELD, "is not a page token returned by ListRecipients");
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| malformed())?;
    let text = String::from_utf8(bytes).map_err(|_| malformed())?;
    let parts: Vec<&str> = text.split(':').collect();
    let [version, message, code, last] = parts[..] else {
        return Err(malformed());
    };
    if version != VERSION {
        return Err(malformed());
    }
    let message: u64 = message.parse().map_err(|_| malformed())?;
    let code: u8 = code.parse().map_err(|_| malformed())?;
    if message != message_id.get() || code != filter.code() {
        return Err(Error::invalid(
            FIELD,
            "belongs to another message or state filter: list again from the first page",
        ));
    }
    last.parse().map_err(|_| malformed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_and_fits_only_its_send_and_filter() {
        let id = MessageId::from_raw(77);
        let token = encode(id, Filter::Unread, 123_456);
        assert_eq!(decode(&token, id, Filter::Unread).unwrap(), 123_456);
        assert_eq!(decode("", id, Filter::Unread).unwrap(), 0);
        for wrong in [
            decode(&token, MessageId::from_raw(78), Filter::Unread),
            decode(&token, id, Filter::Read),
            decode("garbage!", id, Filter::Unread),
            decode(&URL_SAFE_NO_PAD.encode("v1:5"), id, Filter::Unread),
        ] {
            let Err(Error::InvalidArgument { field, .. }) = wrong else {
                panic!("expected INVALID_ARGUMENT, got {wrong:?}")
            };
            assert_eq!(field, "page_token");
        }
    }
}
