//! The edge's OpenAPI 3.1 document, built from the handlers and the JSON
//! types themselves (utoipa), served at `/v1/openapi.json` and committed as
//! `docs/edge-openapi.json` (a test keeps the two equal, so the document a
//! client generates its types from never drifts from the code).

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::{error, json, routes};

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Notify edge",
        version = "1",
        description = "A user's own inbox, badge, preferences and groups, and their live event \
                       stream, for browsers and apps. Every call carries a user token (a JWT \
                       whose `sub` is the user id) signed by the app's backend: \
                       docs/edge.md."
    ),
    paths(
        routes::inbox,
        routes::badge,
        routes::update_items,
        routes::get_preferences,
        routes::set_preferences,
        routes::groups,
        routes::group_messages,
        routes::group_ack,
        crate::events::stream,
    ),
    components(schemas(
        error::ErrorBody,
        error::ErrorDetail,
        json::Snapshot,
        json::ItemSummary,
        json::ItemDelivered,
        json::ItemUpdated,
        json::ItemRevoked,
        json::GroupMessageSent,
        json::Resync,
    )),
    modifiers(&UserToken),
    tags(
        (name = "inbox", description = "The user's items, their states and the badge"),
        (name = "preferences", description = "What the user mutes"),
        (name = "groups", description = "The user's groups and their messages"),
        (name = "events", description = "The live stream"),
    )
)]
pub struct EdgeApi;

struct UserToken;

impl Modify for UserToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = SecurityScheme::Http(
            Http::builder()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("JWT")
                .description(Some(
                    "A user token: sub = the user id, exp, signed by the app's backend",
                ))
                .build(),
        );
        openapi.components.get_or_insert_default().add_security_scheme("user_token", scheme);
    }
}

/// The document as JSON, pretty-printed, with a final newline.
pub fn json() -> String {
    let mut text = EdgeApi::openapi().to_pretty_json().unwrap_or_default();
    text.push('\n');
    text
}

static DOCUMENT: LazyLock<String> = LazyLock::new(json);

/// `GET /v1/openapi.json`.
pub async fn document() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT.as_str())
}

#[cfg(test)]
mod tests {
    /// The committed document is the code's: regenerate it with
    /// `NOTIFY_WRITE_OPENAPI=1 cargo test -p notify-edge --lib openapi`.
    #[test]
    fn the_committed_document_is_the_codes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/edge-openapi.json");
        let built = super::json();
        if std::env::var_os("NOTIFY_WRITE_OPENAPI").is_some() {
            std::fs::write(path, &built).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == built,
            "docs/edge-openapi.json differs from the code's document: run \
             NOTIFY_WRITE_OPENAPI=1 cargo test -p notify-edge --lib openapi"
        );
        assert!(built.contains("\"openapi\": \"3.1.0\""));
    }
}
