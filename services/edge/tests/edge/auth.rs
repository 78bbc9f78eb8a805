//! User tokens: every algorithm, every refusal with its code, keys from a
//! JWKS file re-read when it changes, and a token reaching its own user's
//! data only.

use std::time::Duration;

use serde_json::json;

use crate::{Edge, claims, edge_settings, get, now, send, sign};
use notify_testkit::{eventually, spawn_app};

#[tokio::test]
async fn each_algorithm_signs_a_token_the_edge_takes_and_each_refusal_says_why() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let user = 8_100_001;
    for kid in ["hs", "rs", "es", "ed"] {
        let answer = get(&edge, &sign(&edge.keys, kid, &claims(user)), "/v1/badge").await;
        assert_eq!(answer.status, 200, "{kid}: {:?}", answer.body);
    }

    let with = |change: &dyn Fn(&mut serde_json::Value)| {
        let mut claims = claims(user);
        change(&mut claims);
        claims
    };
    let other_secret = jsonwebtoken::encode(
        &jsonwebtoken::Header { kid: Some("hs".into()), ..Default::default() },
        &claims(user),
        &jsonwebtoken::EncodingKey::from_secret(b"not-the-secret-not-the-secret-not!"),
    )
    .unwrap();
    let hs_as_es = {
        let mut token = sign(&edge.keys, "hs", &claims(user));
        // The header names the ES256 key, the signature is HS256's.
        let header = base64_url(r#"{"alg":"HS256","typ":"JWT","kid":"es"}"#);
        let rest = token.split_once('.').unwrap().1.to_owned();
        token = format!("{header}.{rest}");
        token
    };
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        ("no token", None, "token_missing"),
        ("not a JWT", Some("Bearer abc.def".into()), "token_malformed"),
        ("another secret", Some(format!("Bearer {other_secret}")), "token_bad_signature"),
        (
            "expired",
            Some(format!(
                "Bearer {}",
                sign(
                    &edge.keys,
                    "hs",
                    &with(&|c| {
                        c["iat"] = json!(now() - 600);
                        c["exp"] = json!(now() - 120);
                    })
                )
            )),
            "token_expired",
        ),
        (
            "not yet valid",
            Some(format!(
                "Bearer {}",
                sign(&edge.keys, "es", &with(&|c| c["nbf"] = json!(now() + 300)))
            )),
            "token_not_yet_valid",
        ),
        (
            "another audience",
            Some(format!(
                "Bearer {}",
                sign(&edge.keys, "ed", &with(&|c| c["aud"] = json!("elsewhere")))
            )),
            "token_wrong_audience",
        ),
        (
            "no audience",
            Some(format!(
                "Bearer {}",
                sign(
                    &edge.keys,
                    "rs",
                    &with(&|c| {
                        c.as_object_mut().unwrap().remove("aud");
                    })
                )
            )),
            "token_missing_claim",
        ),
        (
            "no exp",
            Some(format!(
                "Bearer {}",
                sign(
                    &edge.keys,
                    "hs",
                    &with(&|c| {
                        c.as_object_mut().unwrap().remove("exp");
                    })
                )
            )),
            "token_missing_claim",
        ),
        (
            "a sub that is no user id",
            Some(format!(
                "Bearer {}",
                sign(&edge.keys, "hs", &with(&|c| c["sub"] = json!("alice")))
            )),
            "token_bad_subject",
        ),
        (
            "user 0",
            Some(format!("Bearer {}", sign(&edge.keys, "hs", &with(&|c| c["sub"] = json!("0"))))),
            "token_bad_subject",
        ),
        (
            "a week long",
            Some(format!(
                "Bearer {}",
                sign(&edge.keys, "hs", &with(&|c| c["exp"] = json!(now() + 7 * 86_400)))
            )),
            "token_lifetime_too_long",
        ),
        ("an alg not its key's", Some(format!("Bearer {hs_as_es}")), "token_wrong_algorithm"),
    ];
    for (case, authorization, code) in cases {
        let headers: Vec<(&str, &str)> =
            authorization.as_deref().map(|a| vec![("authorization", a)]).unwrap_or_default();
        let answer = crate::call(edge.addr, "GET", "/v1/badge", &headers, None).await;
        assert_eq!((answer.status, answer.code()), (401, code), "{case}: {:?}", answer.body);
        assert_eq!(answer.headers["www-authenticate"], "Bearer", "{case}");
        assert!(!answer.body["error"]["message"].as_str().unwrap().is_empty(), "{case}");
    }
    let unknown_kid = {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("retired".into());
        let key = jsonwebtoken::EncodingKey::from_secret(crate::SECRET.as_bytes());
        jsonwebtoken::encode(&header, &claims(user), &key).unwrap()
    };
    let answer = get(&edge, &unknown_kid, "/v1/badge").await;
    assert_eq!((answer.status, answer.code()), (401, "token_unknown_key"));
    edge.stop().await;
    app.cleanup().await;
}

fn base64_url(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

#[tokio::test]
async fn keys_of_a_jwks_file_verify_tokens_and_a_rotation_is_picked_up() {
    let app = spawn_app().await;
    let keys = crate::Keys::new();
    let mut settings = edge_settings(&app, &keys);
    // The ES256 key only through the JWKS file, first under kid "old".
    settings.edge.tokens.keys.retain(|k| k.kid == "hs");
    let jwks = crate::scratch(&keys, "jwks.json");
    let es_private = keys.es256.serialize_pem();
    let es_jwk = |kid: &str| {
        let encoding = jsonwebtoken::EncodingKey::from_ec_pem(es_private.as_bytes()).unwrap();
        let mut jwk =
            jsonwebtoken::jwk::Jwk::from_encoding_key(&encoding, jsonwebtoken::Algorithm::ES256)
                .unwrap();
        jwk.common.key_id = Some(kid.into());
        json!({ "keys": [jwk] })
    };
    std::fs::write(&jwks, es_jwk("old").to_string()).unwrap();
    settings.edge.tokens.jwks_file = jwks.to_string_lossy().into_owned();
    let edge = Edge::start_with(settings, keys).await;

    let signed = |kid: &str| {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(kid.into());
        let key =
            jsonwebtoken::EncodingKey::from_ec_pem(edge.keys.es256.serialize_pem().as_bytes())
                .unwrap();
        jsonwebtoken::encode(&header, &claims(8_100_002), &key).unwrap()
    };
    assert_eq!(get(&edge, &signed("old"), "/v1/badge").await.status, 200);
    assert_eq!(get(&edge, &signed("new"), "/v1/badge").await.code(), "token_unknown_key");

    // A half-written file keeps the keys loaded; the rotated one replaces them.
    let failed = edge.metric("notify_edge_key_reload_errors_total").await;
    std::fs::write(&jwks, "{\"keys\": [").unwrap();
    eventually("the half-written file is read and refused", Duration::from_secs(10), || async {
        (edge.metric("notify_edge_key_reload_errors_total").await > failed).then_some(())
    })
    .await;
    assert_eq!(get(&edge, &signed("old"), "/v1/badge").await.status, 200, "kept on a bad file");
    std::fs::write(&jwks, es_jwk("new").to_string()).unwrap();
    eventually("the rotated key set is loaded", Duration::from_secs(10), || async {
        (get(&edge, &signed("new"), "/v1/badge").await.status == 200).then_some(())
    })
    .await;
    assert_eq!(get(&edge, &signed("old"), "/v1/badge").await.code(), "token_unknown_key");
    edge.stop().await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_token_reaches_its_own_users_data_and_nothing_else() {
    let app = spawn_app().await;
    let edge = Edge::start(&app).await;
    let (ann, bob) = (8_100_011, 8_100_012);
    let to_bob = app.send(vec![bob]).await;
    app.wait_for_status(to_bob, notify_proto::v1::MessageStatus::Completed).await;

    let as_ann = edge.token(ann);
    let page = get(&edge, &as_ann, "/v1/inbox").await;
    assert_eq!(page.body["items"], json!([]), "Bob's item is not Ann's");
    let update = json!({ "action": "mark_read", "message_ids": [to_bob.to_string()] });
    let answer = send(&edge, &as_ann, "POST", "/v1/items/update", &update).await;
    assert_eq!(answer.body["changed"], 0);
    assert_eq!(answer.body["unknown_message_ids"], json!([to_bob.to_string()]));
    let bob_badge = get(&edge, &edge.token(bob), "/v1/badge").await;
    assert_eq!(bob_badge.body["unread"], 1, "Ann's update left Bob's item unread");

    // A group Ann is not in: refused.
    let mut groups = app.groups();
    let group = groups
        .create_group(notify_proto::v1::CreateGroupRequest {
            name: "bob's".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .group_id;
    groups
        .add_group_members(notify_proto::v1::AddGroupMembersRequest {
            group_id: group,
            user_ids: vec![bob],
            ..Default::default()
        })
        .await
        .unwrap();
    let pulled = get(&edge, &as_ann, &format!("/v1/groups/{group}/messages")).await;
    assert_eq!((pulled.status, pulled.code()), (403, "permission_denied"), "{:?}", pulled.body);
    assert_eq!(
        get(&edge, &edge.token(bob), &format!("/v1/groups/{group}/messages")).await.status,
        200
    );
    edge.stop().await;
    app.cleanup().await;
}
