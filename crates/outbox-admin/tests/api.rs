//! The admin API through its router, over the memory adapters.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::collections::BTreeSet;

use axum::http::StatusCode;
use outbox_admin::Redaction;
use support::{READ, WRITE, code, harness, harness_configured, harness_with, message, tokens};

#[tokio::test]
async fn without_tokens_every_request_is_refused_naming_the_setting() {
    let h = harness_with(vec![], Redaction::default());
    for (method, uri) in [
        ("GET", "/stats"),
        ("GET", "/openapi.json"),
        ("POST", "/messages/requeue"),
    ] {
        let (status, body) = h.call(method, uri, Some(WRITE), Some("{}")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {uri}");
        assert_eq!(code(&body), "admin_disabled");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("[[admin.tokens]]")
        );
    }
}

#[tokio::test]
async fn auth_matrix() {
    let h = harness();
    let id = h.dead(message("orders", "a", b"{}")).await;
    let requeue = format!("/messages/{id}/requeue");
    assert_eq!(
        h.call("GET", "/stats", None, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        h.call("GET", "/stats", Some("nope-nope-nope-nope"), None)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        h.call("GET", "/nowhere", None, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        h.call("GET", "/stats", Some(READ), None).await.0,
        StatusCode::OK
    );
    assert_eq!(
        h.call("GET", "/stats", Some(WRITE), None).await.0,
        StatusCode::OK
    );
    let (status, body) = h.call("POST", &requeue, Some(READ), None).await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "forbidden"));
    assert!(
        h.audit_entries().await.is_empty(),
        "a refused write is not done"
    );
    assert_eq!(
        h.call("POST", &requeue, Some(WRITE), None).await.0,
        StatusCode::NO_CONTENT
    );
    // A bare secret without the scheme is not a bearer token.
    let response = h.call("GET", "/stats", Some(""), None).await;
    assert_eq!(response.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn lists_messages_with_filters_and_keyset_pages() {
    let h = harness();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            h.pending(message(
                "orders",
                &format!("k{}", i % 2),
                format!("{{\"n\":{i}}}").as_bytes(),
            ))
            .await,
        );
    }
    h.pending(message("billing", "k0", b"x")).await;
    let (status, page) = h.get("/messages?exchange=orders&limit=2").await;
    assert_eq!(status, StatusCode::OK);
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["id"], ids[4].to_string(), "newest first");
    assert_eq!(items[0]["status"], "pending");
    assert_eq!(items[0]["payload_preview"], "{\"n\":4}");
    assert_eq!(items[0]["payload_size"], 7);
    assert_eq!(items[0]["type"], "order.created");
    let mut seen: Vec<String> = items
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect();
    let mut cursor = page["next_cursor"].as_str().unwrap().to_owned();
    loop {
        let (status, page) = h
            .get(&format!(
                "/messages?exchange=orders&limit=2&cursor={cursor}"
            ))
            .await;
        assert_eq!(status, StatusCode::OK);
        seen.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_owned(),
            None => break,
        }
    }
    let expected: Vec<String> = ids.iter().rev().map(ToString::to_string).collect();
    assert_eq!(seen, expected);
    let (_, page) = h.get("/messages?routing_key=k1&status=pending").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let (_, page) = h.get(&format!("/messages?q={}", ids[2])).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let (_, page) = h.get("/messages?status=dead").await;
    assert!(page["items"].as_array().unwrap().is_empty());
    assert!(page["next_cursor"].is_null());
    let (_, page) = h.get("/messages?created_after=2999-01-01T00:00:00Z").await;
    assert!(page["items"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn bad_inputs_are_400_with_a_code() {
    let h = harness();
    for (uri, expected) in [
        ("/messages?limit=0", "bad_limit"),
        ("/messages?limit=1001", "bad_limit"),
        ("/messages?limit=ten", "bad_limit"),
        ("/messages?cursor=%21%21", "bad_cursor"),
        ("/messages?cursor=AAAA", "bad_cursor"),
        ("/messages?status=bogus", "bad_status"),
        ("/messages?status=consumed", "bad_status"),
        ("/messages?status=received", "bad_status"),
        ("/consumers/billing/deliveries?status=pending", "bad_status"),
        (
            "/consumers/billing/deliveries?status=publish_failed",
            "bad_status",
        ),
        ("/messages?created_after=yesterday", "bad_time"),
        ("/messages?created_before=2026-13-01T00:00:00Z", "bad_time"),
        ("/messages?colour=red", "bad_query"),
        ("/messages/not-a-uuid", "bad_id"),
        ("/consumers/billing/deliveries/42", "bad_id"),
        ("/dead-letters/abc", "bad_id"),
        ("/dead-letters?limit=5000", "bad_limit"),
        ("/audit?cursor=zz", "bad_cursor"),
    ] {
        let (status, body) = h.get(uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert_eq!(code(&body), expected, "{uri}");
    }
    for (uri, body, expected) in [
        ("/messages/requeue", "{not json", "bad_body"),
        (
            "/messages/requeue",
            r#"{"filter":{},"colour":1}"#,
            "bad_body",
        ),
        (
            "/messages/requeue",
            r#"{"filter":{"colour":1}}"#,
            "bad_body",
        ),
        ("/messages/requeue", r#"{"max":0}"#, "bad_max"),
        (
            "/messages/requeue",
            r#"{"filter":{"status":"consumed"}}"#,
            "bad_status",
        ),
        (
            "/messages/delete",
            r#"{"filter":{"created_after":"soon"}}"#,
            "bad_time",
        ),
        (
            "/consumers/billing/deliveries/reconsume",
            r#"{"filter":{"status":"pending"}}"#,
            "bad_status",
        ),
        ("/messages/x/requeue", "", "bad_id"),
    ] {
        let (status, answer) = h.write("POST", uri, Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri} {body}: {answer}");
        assert_eq!(code(&answer), expected, "{uri} {body}");
    }
    let (status, body) = h
        .write(
            "DELETE",
            "/messages/00000000-0000-0000-0000-000000000000?force=maybe",
            None,
        )
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "bad_query")
    );
    let (status, body) = h.write("PUT", "/messages", None).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
    let (status, body) = h.get("/nowhere").await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "no_such_endpoint")
    );
}

#[tokio::test]
async fn a_message_shows_both_sides_and_unknown_ids_are_404() {
    let h = harness();
    let m = message("orders", "created", br#"{"order":1}"#);
    let id = h.dead(m.clone()).await;
    h.delivered("billing", &m, true).await;
    h.delivered("shipping", &m, false).await;
    let (status, detail) = h.get(&format!("/messages/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["status"], "dead");
    assert_eq!(detail["payload"], r#"{"order":1}"#);
    assert_eq!(detail["payload_base64"], false);
    assert_eq!(detail["attempts"], 1);
    assert_eq!(detail["last_error"], "broker said no");
    let history = detail["failed_attempts"].as_array().expect("history");
    assert_eq!(history.len(), 1, "{detail}");
    assert_eq!(
        (
            &history[0]["attempt"],
            &history[0]["error"],
            &history[0]["at"]
        ),
        (
            &serde_json::json!(1),
            &serde_json::json!("broker said no"),
            &detail["last_attempt_at"]
        )
    );
    let shipping = detail["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["consumer"] == "shipping")
        .expect("shipping's side");
    assert_eq!(shipping["failed_attempts"][0]["attempt"], 1, "{shipping}");
    let sides: BTreeSet<(String, String)> = detail["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["consumer"].as_str().unwrap().into(),
                d["status"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        sides,
        BTreeSet::from([
            ("billing".into(), "consumed".into()),
            ("shipping".into(), "dead".into())
        ])
    );
    let unknown = "00000000-0000-7000-8000-000000000000";
    let (status, body) = h.get(&format!("/messages/{unknown}")).await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let binary = h
        .pending(message("orders", "bin", &[0xff, 0xfe, 0x00]).clone())
        .await;
    let (_, detail) = h.get(&format!("/messages/{binary}")).await;
    assert_eq!(
        (
            detail["payload"].as_str(),
            detail["payload_base64"].as_bool()
        ),
        (Some("//4A"), Some(true))
    );
}

#[tokio::test]
async fn single_writes_are_guarded_and_audited() {
    let h = harness();
    let dead = h.dead(message("orders", "a", b"{}")).await;
    let pending = h.pending(message("orders", "b", b"{}")).await;
    let unknown = "00000000-0000-7000-8000-000000000000";
    let (status, body) = h
        .write("POST", &format!("/messages/{pending}/requeue"), None)
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::CONFLICT, "illegal_transition")
    );
    let (status, body) = h
        .write("POST", &format!("/messages/{unknown}/requeue"), None)
        .await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let (status, body) = h
        .write("DELETE", &format!("/messages/{pending}"), None)
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::CONFLICT, "not_deletable")
    );
    assert_eq!(
        h.write("DELETE", &format!("/messages/{pending}?force=true"), None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        h.write("POST", &format!("/messages/{dead}/requeue"), None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    let (_, detail) = h.get(&format!("/messages/{dead}")).await;
    assert_eq!(detail["status"], "pending");
    let entries = h.audit_entries().await;
    let shown: Vec<(String, String, String, u64)> = entries
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().into(),
                e["action"].as_str().unwrap().into(),
                e["target"].as_str().unwrap().into(),
                e["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("token:ops".into(), "requeue".into(), dead.to_string(), 1),
            (
                "token:ops".into(),
                "delete_forced".into(),
                pending.to_string(),
                1
            ),
        ],
        "newest first, failed writes not recorded"
    );
    assert!(entries[0]["at"].as_str().unwrap().contains('T'));
}

#[tokio::test]
async fn bulk_actions_apply_to_everything_matching_up_to_max() {
    let h = harness();
    for _ in 0..3 {
        h.dead(message("orders", "a", b"{}")).await;
    }
    h.dead(message("billing", "a", b"{}")).await;
    h.pending(message("orders", "a", b"{}")).await;
    let (status, answer) = h
        .write(
            "POST",
            "/messages/requeue",
            Some(r#"{"filter":{"exchange":"orders","status":"dead"},"dry_run":true}"#),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer, serde_json::json!({"matched": 3, "changed": 0}));
    assert!(
        h.audit_entries().await.is_empty(),
        "a dry run changes and records nothing"
    );
    let (_, answer) = h
        .write(
            "POST",
            "/messages/requeue",
            Some(r#"{"filter":{"exchange":"orders","status":"dead"},"max":2}"#),
        )
        .await;
    // Three match (exactly, whatever max); max lets two change.
    assert_eq!(answer, serde_json::json!({"matched": 3, "changed": 2}));
    let (_, page) = h.get("/messages?status=dead").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let (_, answer) = h
        .write(
            "POST",
            "/messages/delete",
            Some(r#"{"filter":{"status":"dead"}}"#),
        )
        .await;
    assert_eq!(answer["changed"], 2);
    let entries = h.audit_entries().await;
    assert_eq!(entries[0]["action"], "delete_matching");
    assert_eq!(entries[0]["target"], r#"{"status":"dead"}"#);
    assert_eq!(entries[0]["count"], 2);
    assert_eq!(entries[1]["action"], "requeue_matching");
    assert_eq!(
        entries[1]["target"],
        r#"{"status":"dead","exchange":"orders"}"#
    );
}

#[tokio::test]
async fn consumers_deliveries_and_reconsume() {
    let h = harness();
    let a = message("orders", "created", b"{}");
    let b = message("orders", "created", b"{}");
    h.delivered("billing", &a, true).await;
    h.delivered("billing", &b, false).await;
    let (status, list) = h.get("/consumers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"][0]["name"], "billing");
    assert_eq!(list["items"][0]["consumed"], 1);
    assert_eq!(list["items"][0]["dead"], 1);
    let (_, page) = h.get("/consumers/billing/deliveries?status=dead").await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], b.id.to_string());
    let (status, detail) = h
        .get(&format!("/consumers/billing/deliveries/{}", a.id))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(detail["status"], "consumed");
    let (status, body) = h
        .get(&format!("/consumers/shipping/deliveries/{}", a.id))
        .await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let uri = format!("/consumers/billing/deliveries/{}/reconsume", a.id);
    // A consumed delivery runs again only when asked for explicitly.
    let (status, body) = h.write("POST", &uri, None).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::CONFLICT, "illegal_transition"),
        "{body}"
    );
    // The body is optional, and `null` is no body (the OpenAPI document allows
    // it; Schemathesis found it answered 400).
    for empty in [r#"{"again":false}"#, "null"] {
        let (status, body) = h.write("POST", &uri, Some(empty)).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::CONFLICT, "illegal_transition"),
            "{empty}: {body}"
        );
    }
    let (status, body) = h.write("POST", &uri, Some(r#"{"again":1}"#)).await;
    assert_eq!((status, code(&body)), (StatusCode::BAD_REQUEST, "bad_body"));
    assert_eq!(
        h.write("POST", &uri, Some(r#"{"again":true}"#)).await.0,
        StatusCode::NO_CONTENT
    );
    let (_, detail) = h
        .get(&format!("/consumers/billing/deliveries/{}", a.id))
        .await;
    assert_eq!(detail["status"], "received");
    let (_, answer) = h
        .write(
            "POST",
            "/consumers/billing/deliveries/reconsume",
            Some(r#"{"filter":{"status":"dead"}}"#),
        )
        .await;
    assert_eq!(answer, serde_json::json!({"matched": 1, "changed": 1}));
    let (_, page) = h.get("/consumers/billing/deliveries?status=received").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let actions: Vec<String> = h
        .audit_entries()
        .await
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(actions, ["reconsume_matching", "reconsume"]);
}

/// A delivery the consume sweep's retry holds is not reconsumed (its handler is
/// running; a reconsume then could run it twice): 409 `busy`, with or without
/// `again`, and nothing is audited.
#[tokio::test]
async fn a_reconsume_of_a_delivery_a_retry_holds_is_refused_as_busy() {
    use outbox_ports::Lease;
    use outbox_ports::prelude::*;
    use std::time::Duration;
    let h = harness();
    let m = message("orders", "created", b"{}");
    let worker = Lease::new("worker", Duration::from_secs(30));
    h.inbox
        .record_arrival("billing", &m, &worker)
        .await
        .expect("arrival");
    h.inbox
        .mark_consume_failed(
            "billing",
            m.id,
            &worker,
            "boom",
            outbox_core::Decision::RetryAfter(Duration::ZERO),
        )
        .await
        .expect("failed");
    let sweep = Lease::new("sweep", Duration::from_secs(30));
    assert_eq!(
        h.inbox
            .claim_due("billing", &sweep, 10)
            .await
            .expect("claim")
            .len(),
        1
    );
    let uri = format!("/consumers/billing/deliveries/{}/reconsume", m.id);
    for body in [None, Some(r#"{"again":true}"#)] {
        let (status, answer) = h.write("POST", &uri, body).await;
        assert_eq!(
            (status, code(&answer)),
            (StatusCode::CONFLICT, "busy"),
            "{answer}"
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("held right now"),
            "{answer}"
        );
    }
    assert!(
        h.audit_entries().await.is_empty(),
        "a refused action is not audited"
    );
}

/// A key blocked behind a dead head: the two waiting count as unsent (the age an
/// alert reads), each names the head it waits behind, and the head says how many
/// wait behind it.
#[tokio::test]
async fn messages_waiting_behind_a_dead_head_are_unsent_and_name_their_head() {
    let h = harness();
    let keyed = || {
        let mut m = message("orders", "created", b"{}");
        m.ordering_key = Some("customer-7".into());
        m
    };
    let (k1, k2, k3) = (keyed(), keyed(), keyed());
    let head = h.dead(k1.clone()).await;
    assert_eq!(head, k1.id);
    h.pending(k2.clone()).await;
    h.pending(k3.clone()).await;
    let (_, stats) = h.get("/stats").await;
    assert!(
        stats["outbox"]["oldest_unsent_at"].is_string(),
        "waiting messages are unsent: {stats}"
    );
    let (status, detail) = h.get(&format!("/messages/{}", k2.id)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(detail["ordering_key"], "customer-7");
    assert_eq!(detail["waits_behind"], k1.id.to_string());
    assert!(detail["waiting_behind"].is_null(), "{detail}");
    let (_, detail) = h.get(&format!("/messages/{}", k1.id)).await;
    assert_eq!(detail["waiting_behind"], 2, "{detail}");
    assert!(detail["waits_behind"].is_null(), "{detail}");
}

#[tokio::test]
async fn dead_letters_are_listed_shown_and_deleted() {
    let h = harness();
    h.dead_letter("billing", b"not json at all").await;
    h.dead_letter("shipping", &[0xff; 300]).await;
    let (status, page) = h.get("/dead-letters").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let (_, page) = h.get("/dead-letters?consumer=billing").await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["body"], "not json at all");
    let id = items[0]["id"].as_u64().unwrap();
    let (_, all) = h.get("/dead-letters?consumer=shipping").await;
    assert_eq!(all["items"][0]["body_base64"], true);
    assert_eq!(all["items"][0]["body_size"], 300);
    let (status, letter) = h.get(&format!("/dead-letters/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(letter["reason"], "no message id");
    assert_eq!(letter["headers"]["x-token"], "abc");
    assert_eq!(
        h.write("DELETE", &format!("/dead-letters/{id}"), None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    let (status, body) = h.get(&format!("/dead-letters/{id}")).await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let (status, _) = h
        .write("DELETE", &format!("/dead-letters/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let entries = h.audit_entries().await;
    assert_eq!(
        (entries[0]["action"].as_str(), entries[0]["target"].as_str()),
        (Some("delete_dead_letter"), Some(id.to_string().as_str()))
    );
}

#[tokio::test]
async fn redacted_headers_and_json_fields_never_show() {
    let h = harness_with(tokens(), Redaction::new(["X-Token"], ["password"]));
    let mut m = message("orders", "a", br#"{"user":{"PASSWORD":"hunter2"},"n":1}"#);
    m.headers.insert("x-token".into(), "s3cr3t".into());
    let id = h.pending(m).await;
    let mut long = format!(r#"{{"password":"hunter2","pad":"{}"}}"#, "x".repeat(400)).into_bytes();
    long.truncate(long.len());
    h.pending(message("orders", "long", &long)).await;
    h.dead_letter("billing", br#"{"password":"hunter2"}"#).await;
    for uri in [
        format!("/messages/{id}"),
        "/messages".to_owned(),
        "/dead-letters".to_owned(),
        "/dead-letters/1".to_owned(),
    ] {
        let (status, body) = h.get(&uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        let text = body.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains("s3cr3t") && !text.contains("\"abc\""),
            "{uri}: {text}"
        );
    }
    let (_, detail) = h.get(&format!("/messages/{id}")).await;
    assert_eq!(detail["headers"]["x-token"], "***");
    assert_eq!(detail["payload_redacted"], true);
    assert!(detail["payload"].as_str().unwrap().contains(r#""n":1"#));
}

/// Hidden means hidden on every view: a body whose content type is not text (or
/// that is not UTF-8) is never handed out as base64 while JSON keys are hidden,
/// unless it is JSON and redacted key by key (issue 47).
#[tokio::test]
async fn a_body_redaction_cannot_reach_is_withheld_not_shown_as_base64() {
    use base64::Engine as _;
    let h = harness_with(tokens(), Redaction::new(["X-Token"], ["password"]));
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    // Protobuf-like (the secret without its key name), JSON under a binary
    // content type, and bytes that are not UTF-8 under a JSON content type.
    let proto = b"\x0a\x07hunter2\x10\x01".to_vec();
    let json = br#"{"password":"hunter2","n":1}"#.to_vec();
    let broken = b"{\"password\":\"hunter2\xff\"}".to_vec();
    let mut ids = Vec::new();
    for (payload, content_type) in [
        (&proto, "application/x-protobuf"),
        (&json, "application/octet-stream"),
        (&broken, "application/json"),
    ] {
        let mut m = message("orders", "a", payload);
        m.content_type = content_type.to_owned();
        ids.push((h.pending(m).await, payload.clone()));
    }
    h.dead_letter("billing", &proto).await;
    for (id, payload) in &ids {
        let (status, detail) = h.get(&format!("/messages/{id}")).await;
        assert_eq!(status, StatusCode::OK);
        let text = detail.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains(&b64(payload)),
            "{text}"
        );
        assert_eq!(detail["payload_redacted"], true, "{text}");
        assert_eq!(detail["payload_base64"], false, "{text}");
    }
    let (_, json_detail) = h.get(&format!("/messages/{}", ids[1].0)).await;
    assert!(
        json_detail["payload"]
            .as_str()
            .unwrap()
            .contains(r#""n":1"#),
        "JSON is redacted key by key: {json_detail}"
    );
    let (_, proto_detail) = h.get(&format!("/messages/{}", ids[0].0)).await;
    assert_eq!(proto_detail["payload"], outbox_admin::WITHHELD);
    for uri in ["/messages", "/dead-letters", "/dead-letters/1"] {
        let (_, body) = h.get(uri).await;
        let text = body.to_string();
        assert!(
            !text.contains("hunter2") && !text.contains(&b64(&proto)),
            "{uri}: {text}"
        );
    }
}

#[tokio::test]
async fn stats_count_both_sides_and_mark_what_is_not_counted() {
    let h = harness();
    let m = message("orders", "a", b"{}");
    h.dead(m.clone()).await;
    h.pending(message("orders", "a", b"{}")).await;
    h.delivered("billing", &m, true).await;
    let report = outbox_core::SweepReport {
        started_at: time::OffsetDateTime::now_utc(),
        completed_at: time::OffsetDateTime::now_utc(),
        publish_retried: 3,
        publish_failed: 1,
        consume_retried: 0,
        consume_failed: 0,
    };
    outbox_ports::SweepStateStore::set(
        &*h.state,
        "relay-sweep",
        &report,
        std::time::Duration::from_secs(60),
        1,
    )
    .await
    .unwrap();
    let (status, stats) = h.get("/stats").await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert_eq!(stats["outbox"]["pending"], 1);
    assert_eq!(stats["outbox"]["dead"], 1);
    assert!(stats["outbox"]["sent"].is_null());
    assert!(stats["outbox"]["oldest_unsent_age_seconds"].is_u64());
    assert_eq!(stats["consumers"][0]["consumed"], 1);
    assert_eq!(stats["consumed_per_minute"][0]["count"], 1);
    assert_eq!(stats["sweeps"][0]["key"], "relay-sweep");
    assert_eq!(stats["sweeps"][0]["publish_retried"], 3);
    assert_eq!(stats["precision"]["outbox_sent"], "not_counted");
}

/// The routes the issue asks for; the document and the router must agree with it.
const ROUTES: [(&str, &str); 33] = [
    ("get", "/stats"),
    ("get", "/ordering/blocked-keys"),
    ("get", "/failures"),
    ("get", "/messages"),
    ("get", "/messages/{id}"),
    ("delete", "/messages/{id}"),
    ("post", "/messages/{id}/requeue"),
    ("post", "/messages/{id}/publish-now"),
    ("post", "/messages/{id}/replay"),
    ("post", "/consumers/{name}/deliveries/{id}/replay"),
    ("post", "/messages/requeue"),
    ("post", "/messages/delete"),
    ("get", "/consumers"),
    ("get", "/consumers/{name}/deliveries"),
    ("get", "/consumers/{name}/deliveries/{id}"),
    ("post", "/consumers/{name}/deliveries/{id}/reconsume"),
    ("post", "/consumers/{name}/deliveries/reconsume"),
    ("get", "/dead-letters"),
    ("get", "/dead-letters/{id}"),
    ("delete", "/dead-letters/{id}"),
    ("get", "/audit"),
    ("get", "/openapi.json"),
    ("post", "/exchanges/{exchange}/pause"),
    ("post", "/exchanges/{exchange}/resume"),
    ("post", "/consumers/{name}/pause"),
    ("post", "/consumers/{name}/resume"),
    ("get", "/pauses"),
    ("post", "/failures/requeue"),
    ("post", "/failures/delete"),
    ("post", "/failures/reconsume"),
    ("get", "/throughput"),
    ("get", "/exchanges/{exchange}/throughput"),
    ("get", "/consumers/{name}/throughput"),
];

#[tokio::test]
async fn the_openapi_document_lists_exactly_the_routes_served() {
    let h = harness();
    let (status, doc) = h.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(documented, expected);
    for schema in [
        "MessagePage",
        "MessageDetail",
        "StatsResponse",
        "BulkRequest",
        "ErrorBody",
    ] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    // Every documented route is served, and no other method on its path.
    for path in expected
        .iter()
        .map(|(_, p)| p.clone())
        .collect::<BTreeSet<_>>()
    {
        let concrete = path
            .replace("{id}", "00000000-0000-7000-8000-000000000000")
            .replace("{name}", "billing")
            .replace(
                "/dead-letters/00000000-0000-7000-8000-000000000000",
                "/dead-letters/1",
            );
        for method in ["get", "post", "delete", "put", "patch"] {
            let (status, body) = h
                .call(&method.to_uppercase(), &concrete, Some(WRITE), Some("{}"))
                .await;
            let served = !matches!(code(&body), "method_not_allowed" | "no_such_endpoint");
            assert_eq!(
                served,
                expected.contains(&(method.to_owned(), path.clone())),
                "{method} {concrete}: {status} {body}"
            );
        }
    }
}

/// With a throughput log the charts come from the totals every instance adds, not
/// from the rows of the last hour.
#[tokio::test]
async fn stats_read_the_charts_from_the_throughput_log_when_given_one() {
    use std::sync::Arc;

    use outbox_adapters_memory::MemoryThroughputLog;
    use outbox_ports::{SystemClock, ThroughputKind, ThroughputLog};

    let log = Arc::new(MemoryThroughputLog::new(Arc::new(SystemClock)));
    log.add(ThroughputKind::Published, 1_200).await.unwrap();
    log.add(ThroughputKind::Consumed, 700).await.unwrap();
    let h = harness_configured(tokens(), |service| service.with_throughput(log));
    let (status, stats) = h.get("/stats").await;
    assert_eq!(status, StatusCode::OK);
    let total = |key: &str| {
        stats[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["count"].as_u64().unwrap())
            .sum::<u64>()
    };
    // The tables are empty: only the log can have said so.
    assert_eq!(total("published_per_minute"), 1_200);
    assert_eq!(total("consumed_per_minute"), 700);
    assert_eq!(stats["precision"]["per_minute"], "recorded");
}

/// Each exchange's and consumer's chart, every bucket of the window, from the
/// per-name totals; the list of every name with its totals; bad windows and names
/// are 400s, and a service without a log says so (404 `not_recorded`).
#[tokio::test]
async fn exchange_and_consumer_charts_come_from_the_per_name_totals() {
    use std::sync::Arc;

    use outbox_adapters_memory::MemoryThroughputLog;
    use outbox_ports::{SystemClock, ThroughputKind, ThroughputLog};

    let log = Arc::new(MemoryThroughputLog::new(Arc::new(SystemClock)));
    let n = |name: &str, c: u64| vec![(name.to_owned(), c)];
    log.add_named(ThroughputKind::Published, &n("orders", 12))
        .await
        .unwrap();
    log.add_named(ThroughputKind::Published, &n("audit", 2))
        .await
        .unwrap();
    log.add_named(ThroughputKind::PublishFailed, &n("orders", 3))
        .await
        .unwrap();
    log.add_named(ThroughputKind::Consumed, &n("billing", 9))
        .await
        .unwrap();
    log.add_named(ThroughputKind::ConsumeFailed, &n("billing", 1))
        .await
        .unwrap();
    // The totals of all are not any name's.
    log.add(ThroughputKind::Published, 1_000).await.unwrap();
    let h = harness_configured(tokens(), |service| service.with_throughput(log));
    for (window, buckets, seconds) in [("1h", 60, 60), ("24h", 96, 900), ("7d", 168, 3600)] {
        let (status, chart) = h
            .get(&format!("/exchanges/orders/throughput?window={window}"))
            .await;
        assert_eq!(status, StatusCode::OK, "{chart}");
        assert_eq!(chart["exchange"], "orders");
        assert_eq!(chart["window"], window);
        assert_eq!(chart["bucket_seconds"], seconds);
        let b = chart["buckets"].as_array().unwrap();
        assert_eq!(b.len(), buckets, "{window}");
        let sum = |key: &str| b.iter().map(|x| x[key].as_u64().unwrap()).sum::<u64>();
        assert_eq!((sum("published"), sum("failed")), (12, 3), "{window}");
        assert_eq!(
            (chart["published"].as_u64(), chart["failed"].as_u64()),
            (Some(12), Some(3))
        );
        let (status, chart) = h
            .get(&format!("/consumers/billing/throughput?window={window}"))
            .await;
        assert_eq!(status, StatusCode::OK, "{chart}");
        assert_eq!(chart["consumer"], "billing");
        assert_eq!(
            (chart["consumed"].as_u64(), chart["failed"].as_u64()),
            (Some(9), Some(1))
        );
        assert_eq!(chart["buckets"].as_array().unwrap().len(), buckets);
    }
    let (status, chart) = h.get("/exchanges/orders/throughput").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(chart["window"], "1h", "the default window");
    let (status, quiet) = h.get("/exchanges/quiet/throughput").await;
    assert_eq!(status, StatusCode::OK, "a name with nothing is all zeros");
    assert_eq!(quiet["published"], 0);
    let (status, all) = h.get("/throughput?window=24h").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        all,
        serde_json::json!({
            "window": "24h",
            "exchanges": [
                {"exchange": "audit", "published": 2, "failed": 0},
                {"exchange": "orders", "published": 12, "failed": 3},
            ],
            "consumers": [{"consumer": "billing", "consumed": 9, "failed": 1}],
        })
    );
    for bad in [
        "/throughput?window=2h",
        "/exchanges/orders/throughput?window=",
        "/exchanges/orders/throughput?since=1h",
        "/consumers/billing/throughput?window=7D",
    ] {
        let (status, body) = h.get(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let long = "x".repeat(256);
    let (status, body) = h.get(&format!("/exchanges/{long}/throughput")).await;
    assert_eq!((status, code(&body)), (StatusCode::BAD_REQUEST, "bad_name"));
    // A name no consumer can have (a control character) reads as an empty
    // chart: it is read, not written.
    let (status, body) = h.get("/consumers/a%01b/throughput").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["consumed"], 0);
    let (status, body) = h.get("/consumers/a%00b/throughput").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // A read token may read them.
    let (status, _) = h.call("GET", "/throughput", Some(READ), None).await;
    assert_eq!(status, StatusCode::OK);

    let without = harness();
    for path in [
        "/throughput",
        "/exchanges/orders/throughput",
        "/consumers/billing/throughput",
    ] {
        let (status, body) = without.get(path).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::NOT_FOUND, "not_recorded"),
            "{path}"
        );
    }
}

/// `stats` says whether each sweep's lock is held right now.
#[tokio::test]
async fn stats_say_whether_a_sweep_lock_is_held() {
    use std::sync::Arc;
    use std::time::Duration;

    use outbox_adapters_memory::MemoryLock;
    use outbox_ports::DistributedLock;

    let lock = Arc::new(MemoryLock::new());
    let guard = lock
        .acquire("relay-lock", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
        .expect("free");
    let keys = vec!["relay-lock".into(), "consumer-lock".into()];
    let h = harness_configured(tokens(), |service| service.with_locks(lock, keys));
    let (status, stats) = h.get("/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stats["locks"][0]["key"], "relay-lock");
    assert_eq!(stats["locks"][0]["held"], true);
    assert_eq!(stats["locks"][1]["key"], "consumer-lock");
    assert_eq!(stats["locks"][1]["held"], false);
    guard.release().await.unwrap();
}

/// Schemathesis found these: the document says `max` is an int64 of at least 1,
/// and JSON Schema counts `331.0` as an integer; the API took `2^63` and refused
/// `331.0`.
#[tokio::test]
async fn bulk_max_takes_what_the_document_allows_and_nothing_beyond() {
    let h = harness();
    h.dead(message("orders", "a", b"{}")).await;
    for uri in [
        "/messages/requeue",
        "/messages/delete",
        "/consumers/billing/deliveries/reconsume",
    ] {
        for max in ["331.0", "1e3", "9223372036854775807"] {
            let body = format!(r#"{{"dry_run":true,"max":{max}}}"#);
            let (status, answer) = h.write("POST", uri, Some(&body)).await;
            assert_eq!(status, StatusCode::OK, "{uri} max {max}: {answer}");
        }
        for max in [
            "9223372036854775808",
            "18446744073709551615",
            "0",
            "1.5",
            "-1",
        ] {
            let body = format!(r#"{{"dry_run":true,"max":{max}}}"#);
            let (status, answer) = h.write("POST", uri, Some(&body)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{uri} max {max}: {answer}");
        }
    }
}

/// The document allows the hyphenated form only, so the API takes no other.
#[tokio::test]
async fn message_ids_in_paths_are_hyphenated_uuids_only() {
    let h = harness();
    let id = h.dead(message("orders", "a", b"{}")).await.to_string();
    assert_eq!(h.get(&format!("/messages/{id}")).await.0, StatusCode::OK);
    let simple = id.replace('-', "");
    for bad in [simple, format!("%7B{id}%7D"), format!("urn:uuid:{id}")] {
        let (status, body) = h.get(&format!("/messages/{bad}")).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "bad_id"),
            "{bad}"
        );
    }
}

/// The document says what each parameter and field really is, so a fuzzer can
/// check the API against it: each side's statuses, ids, times, limits, cursors,
/// and an error body on every error status.
#[tokio::test]
async fn the_openapi_document_is_exact_about_inputs_and_answers() {
    let h = harness();
    let (_, doc) = h.get("/openapi.json").await;
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["OutboxStatusName"]["enum"],
        serde_json::json!(["pending", "sent", "publish_failed", "dead"])
    );
    assert_eq!(
        schemas["InboxStatusName"]["enum"],
        serde_json::json!(["received", "consumed", "consume_failed", "dead"])
    );
    let param = |path: &str, name: &str| -> serde_json::Value {
        doc["paths"][path]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["schema"]
            .clone()
    };
    assert_eq!(
        param("/messages", "status")["$ref"],
        "#/components/schemas/OutboxStatusName"
    );
    assert_eq!(
        param("/consumers/{name}/deliveries", "status")["$ref"],
        "#/components/schemas/InboxStatusName"
    );
    for path in [
        "/messages",
        "/consumers/{name}/deliveries",
        "/dead-letters",
        "/audit",
        "/ordering/blocked-keys",
    ] {
        let limit = param(path, "limit");
        assert_eq!(
            (&limit["type"], &limit["minimum"], &limit["maximum"]),
            (
                &serde_json::json!("integer"),
                &serde_json::json!(1),
                &serde_json::json!(1000)
            ),
            "{path}"
        );
        if path == "/ordering/blocked-keys" {
            assert_eq!(
                param(path, "after")["pattern"],
                outbox_admin::model::TEXT_PATTERN
            );
            continue;
        }
        assert_eq!(
            param(path, "cursor")["pattern"],
            outbox_admin::model::CURSOR_PATTERN,
            "{path}"
        );
    }
    let blocked = &schemas["BlockedKeyItem"]["properties"];
    assert_eq!(
        blocked["head_status"]["$ref"],
        "#/components/schemas/OutboxStatusName"
    );
    assert_eq!(
        blocked["head_id"]["pattern"],
        outbox_admin::model::MESSAGE_ID_PATTERN
    );
    for nullable in ["head_last_error", "head_next_attempt_at"] {
        assert_eq!(
            blocked[nullable]["type"],
            serde_json::json!(["string", "null"]),
            "{nullable}"
        );
    }
    assert_eq!(
        schemas["BlockedKeyPage"]["properties"]["next_after"]["type"],
        serde_json::json!(["string", "null"])
    );
    assert_eq!(param("/messages", "created_after")["format"], "date-time");
    assert_eq!(
        param("/messages/{id}", "id")["pattern"],
        outbox_admin::model::MESSAGE_ID_PATTERN
    );
    for (schema, status) in [
        ("MessageItem", "OutboxStatusName"),
        ("MessageDetail", "OutboxStatusName"),
        ("DeliveryItem", "InboxStatusName"),
        ("DeliveryDetail", "InboxStatusName"),
        ("ConsumeSide", "InboxStatusName"),
    ] {
        assert_eq!(
            schemas[schema]["properties"]["status"]["$ref"],
            format!("#/components/schemas/{status}"),
            "{schema}"
        );
    }
    // The delivery mirrors carry exactly the fields of what is served.
    for (mirror, served) in [
        ("DeliveryItem", "MessageItem"),
        ("DeliveryDetail", "MessageDetail"),
    ] {
        let keys = |s: &str| -> BTreeSet<String> {
            schemas[s]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        assert_eq!(keys(mirror), keys(served), "{mirror}");
    }
    assert_eq!(
        schemas["MessageItem"]["properties"]["created_at"]["format"],
        "date-time"
    );
    assert_eq!(
        schemas["MessageItem"]["properties"]["completed_at"]["type"],
        serde_json::json!(["string", "null"])
    );
    assert_eq!(schemas["BulkRequest"]["additionalProperties"], false);
    // Every operation: the bearer scheme, and an error body on every error status.
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]));
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            for required in ["401", "403"] {
                assert!(
                    responses.contains_key(required),
                    "{method} {path}: {required}"
                );
            }
            for (status, response) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    assert_eq!(
                        response["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/ErrorBody",
                        "{method} {path} {status}"
                    );
                }
                assert!(!status.contains('X'), "{method} {path}: a range {status}");
            }
            if path != "/openapi.json" {
                assert!(responses.contains_key("503"), "{method} {path}");
            }
        }
    }
}

/// Schemathesis found this against PostgreSQL: a NUL in a text filter or a
/// consumer name failed the query with a 500. No stored value can hold one, and
/// the document says so (`TEXT_PATTERN`), so the API refuses it with a 400.
#[tokio::test]
async fn a_nul_in_a_text_filter_or_a_name_is_a_400() {
    let h = harness();
    for uri in [
        "/messages?exchange=a%00b",
        "/messages?routing_key=%00",
        "/messages?type=x%00",
        "/messages?q=%00",
        "/consumers/billing/deliveries?exchange=%00",
        "/consumers/bil%00ling/deliveries",
        "/consumers/bil%00ling/deliveries/00000000-0000-7000-8000-000000000000",
        "/dead-letters?consumer=%00",
        "/ordering/blocked-keys?after=a%00",
    ] {
        let (status, body) = h.get(uri).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "bad_text"),
            "{uri}"
        );
    }
    for (uri, body) in [
        (
            "/messages/requeue",
            r#"{"filter":{"routing_key":"\u0000"}}"#,
        ),
        ("/messages/delete", r#"{"filter":{"q":"a\u0000"}}"#),
        (
            "/consumers/billing/deliveries/reconsume",
            r#"{"filter":{"type":"\u0000"}}"#,
        ),
        ("/consumers/bil%00ling/deliveries/reconsume", "{}"),
    ] {
        let (status, answer) = h.write("POST", uri, Some(body)).await;
        assert_eq!(
            (status, code(&answer)),
            (StatusCode::BAD_REQUEST, "bad_text"),
            "{uri}"
        );
    }
    let (_, doc) = h.get("/openapi.json").await;
    let exchange = doc["paths"]["/messages"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "exchange")
        .unwrap()["schema"]["pattern"]
        .clone();
    assert_eq!(exchange, outbox_admin::model::TEXT_PATTERN);
}

#[tokio::test]
async fn a_delayed_message_shows_as_scheduled_and_publish_now_makes_it_due() {
    let h = harness();
    let mut m = message("orders", "later", b"{}");
    let due = outbox_core::Timestamp::now_utc() + time::Duration::hours(2);
    let due = due.replace_nanosecond(0).unwrap_or(due);
    m.not_before = Some(due);
    let id = h.pending(m).await;
    let (_, stats) = h.get("/stats").await;
    assert_eq!(stats["outbox"]["scheduled"], 1, "{stats}");
    assert_eq!(stats["outbox"]["pending"], 1, "{stats}");
    assert!(
        stats["outbox"]["oldest_unsent_at"].is_null(),
        "a message not yet due waits for nothing: {stats}"
    );
    let (_, page) = h.get("/messages?status=pending").await;
    let shown = page["items"][0]["due_at"]
        .as_str()
        .expect("due_at")
        .to_owned();
    assert_eq!(
        time::OffsetDateTime::parse(&shown, &time::format_description::well_known::Rfc3339)
            .expect("RFC 3339"),
        due
    );
    let path = format!("/messages/{id}/publish-now");
    let (status, body) = h.call("POST", &path, Some(READ), None).await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "forbidden"));
    assert_eq!(h.write("POST", &path, None).await.0, StatusCode::NO_CONTENT);
    let (_, detail) = h.get(&format!("/messages/{id}")).await;
    assert!(detail["due_at"].is_null(), "{detail}");
    assert_eq!(detail["status"], "pending");
    let audit = h.audit_entries().await;
    assert_eq!(audit[0]["action"], "publish_now", "{audit:?}");
    assert_eq!(audit[0]["target"], id.to_string());
    let unknown = "/messages/01890000-0000-7000-8000-000000000000/publish-now";
    assert_eq!(
        h.write("POST", unknown, None).await.0,
        StatusCode::NOT_FOUND
    );
    let sent = h.dead(message("orders", "x", b"{}")).await;
    let (status, _) = h
        .write("POST", &format!("/messages/{sent}/publish-now"), None)
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a dead message is not pending"
    );
}

/// Blocked keys: a failing head and a dead head are listed in key order with
/// their head and the count behind; a pending head is not; pages continue after
/// the last key; bad inputs are 400s.
#[tokio::test]
async fn blocked_keys_are_listed_with_their_heads() {
    let h = harness();
    let keyed = |k: &str| {
        let mut m = message("orders", "order.created", b"{}");
        m.ordering_key = Some(k.to_owned());
        m
    };
    // Dead heads first (`dead` fails every pending message): b's head, then two
    // behind it; a's head pending with one behind (a pending head blocks nothing).
    let b_head = h.dead(keyed("key-b")).await;
    h.pending(keyed("key-b")).await;
    h.pending(keyed("key-b")).await;
    let c_head = h.dead(keyed("key-c")).await;
    h.pending(keyed("key-a")).await;
    h.pending(keyed("key-a")).await;

    let (status, page) = h.get("/ordering/blocked-keys").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let items = page["items"].as_array().unwrap();
    let keys: Vec<&str> = items.iter().map(|i| i["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["key-b", "key-c"]);
    assert_eq!(items[0]["head_id"], b_head.to_string());
    assert_eq!(items[0]["head_status"], "dead");
    assert_eq!(items[0]["head_attempts"], 1);
    assert_eq!(items[0]["head_last_error"], "broker said no");
    assert_eq!(items[0]["waiting"], 2);
    assert_eq!(items[0]["waiting_capped"], false);
    assert_eq!(items[1]["head_id"], c_head.to_string());
    assert_eq!(items[1]["waiting"], 0);
    assert!(page["next_after"].is_null(), "{page}");

    let (_, first) = h.get("/ordering/blocked-keys?limit=1").await;
    assert_eq!(first["items"][0]["key"], "key-b");
    assert_eq!(first["next_after"], "key-b");
    let (_, second) = h.get("/ordering/blocked-keys?limit=1&after=key-b").await;
    assert_eq!(second["items"][0]["key"], "key-c");
    let (_, last) = h.get("/ordering/blocked-keys?limit=1&after=key-c").await;
    assert_eq!(last["items"], serde_json::json!([]));
    assert!(last["next_after"].is_null());

    let (_, stats) = h.get("/stats").await;
    assert_eq!(stats["outbox"]["blocked_keys"], 2, "the count of the list");

    for uri in [
        "/ordering/blocked-keys?limit=0",
        "/ordering/blocked-keys?limit=1001",
        "/ordering/blocked-keys?limit=x",
    ] {
        let (status, body) = h.get(uri).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "bad_limit"),
            "{uri}"
        );
    }
    let (status, body) = h.get("/ordering/blocked-keys?cursor=AAAAAAAAAAA").await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "bad_query"),
        "unknown parameters are refused"
    );
    assert_eq!(
        h.call("GET", "/ordering/blocked-keys", None, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        h.call("GET", "/ordering/blocked-keys", Some(READ), None)
            .await
            .0,
        StatusCode::OK
    );
}

/// Failures grouped: the outbox's per exchange, then the inbox's per consumer,
/// texts that differ in values one group; a read token may look, none may not.
#[tokio::test]
async fn failures_are_grouped_by_error_per_exchange_and_consumer() {
    let h = harness();
    h.dead(message("orders", "order.created", b"{}")).await;
    h.dead(message("orders", "order.created", b"{}")).await;
    h.dead(message("payments", "paid", b"{}")).await;
    for _ in 0..3 {
        h.delivered("billing", &message("orders", "order.created", b"{}"), false)
            .await;
    }
    h.delivered("billing", &message("orders", "order.created", b"{}"), true)
        .await;

    let (status, body) = h.get("/failures").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let groups = body["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 3, "{body}");
    assert_eq!(groups[0]["exchange"], "orders");
    assert_eq!(groups[0]["count"], 2);
    assert_eq!(groups[0]["error"], "broker said no");
    assert!(groups[0].get("consumer").is_none(), "{body}");
    assert_eq!(groups[1]["exchange"], "payments");
    assert_eq!(groups[2]["consumer"], "billing");
    assert_eq!(groups[2]["count"], 3, "the consumed delivery is no failure");
    assert!(groups[2].get("exchange").is_none(), "{body}");
    for g in groups {
        let (oldest, newest) = (g["oldest"].as_str().unwrap(), g["newest"].as_str().unwrap());
        assert!(oldest <= newest, "{g}");
        assert!(oldest.ends_with('Z'), "RFC 3339 in UTC: {oldest}");
    }
    let (status, _) = h.call("GET", "/failures", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn exchanges_and_consumers_pause_and_resume_with_the_write_role_audited() {
    let h = harness();
    let held = h.pending(message("orders", "order.created", b"{}")).await;
    let flowing = h.pending(message("payments", "paid", b"{}")).await;
    h.delivered("billing", &message("orders", "order.created", b"{}"), true)
        .await;

    // No body, or an empty one with any content type, is accepted.
    let (status, body) = h.write("POST", "/exchanges/orders/pause", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["kind"], "exchange");
    assert_eq!(body["name"], "orders");
    assert_eq!(body["paused"], true);
    assert_eq!(body["changed"], true);
    let (status, body) = h.write("POST", "/exchanges/orders/pause", Some("")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["changed"], false, "paused already");
    let (status, body) = h.write("POST", "/consumers/billing/pause", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["kind"], "consumer");

    // The relays' claims obey at once.
    let lease = outbox_ports::Lease::new("relay-1", std::time::Duration::from_secs(60));
    let claimed: Vec<_> = outbox_ports::OutboxRelayPath::claim_pending(&*h.outbox, &lease, 10)
        .await
        .expect("claim")
        .into_iter()
        .map(|c| c.message.id)
        .collect();
    assert_eq!(
        claimed,
        vec![flowing],
        "a paused exchange's message was claimed"
    );
    assert!(
        outbox_ports::InboxConsumerPath::consumer_paused(&*h.inbox, "billing")
            .await
            .expect("read")
    );

    let (status, body) = h.get("/pauses").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let items = body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{body}");
    assert_eq!(items[0]["kind"], "exchange", "exchanges first: {body}");
    assert_eq!(items[0]["by"], "token:ops");
    assert!(items[0]["since"].as_str().unwrap().ends_with('Z'));
    assert_eq!(items[1]["name"], "billing");
    let (_, stats) = h.get("/stats").await;
    assert_eq!(stats["pauses"].as_array().unwrap().len(), 2, "{stats}");
    let (_, consumers) = h.get("/consumers").await;
    assert_eq!(consumers["items"][0]["paused"], true, "{consumers}");

    // Reading is not enough to pause, nor is no token.
    let (status, _) = h
        .call("POST", "/exchanges/payments/pause", Some(READ), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = h
        .call("POST", "/exchanges/payments/pause", None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Names a pause cannot hold.
    let long = "x".repeat(256);
    for uri in [
        format!("/exchanges/{long}/pause"),
        "/consumers/a%07b/pause".to_owned(),
        "/consumers/a%00b/resume".to_owned(),
    ] {
        let (status, body) = h.write("POST", &uri, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
    }
    let (status, _) = h.get("/exchanges/orders/pause").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // The document says which names are taken, so no name it allows is refused.
    let (_, doc) = h.get("/openapi.json").await;
    for (path, name) in [
        ("/exchanges/{exchange}/pause", "exchange"),
        ("/exchanges/{exchange}/resume", "exchange"),
        ("/consumers/{name}/pause", "name"),
        ("/consumers/{name}/resume", "name"),
    ] {
        let parameter = doc["paths"][path]["post"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{path} names {name}"));
        assert_eq!(
            parameter["schema"]["pattern"],
            outbox_admin::model::PAUSE_NAME_PATTERN,
            "{path}"
        );
    }

    let (status, body) = h.write("POST", "/exchanges/orders/resume", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["paused"], false);
    assert_eq!(body["changed"], true);
    let (_, body) = h.write("POST", "/exchanges/orders/resume", None).await;
    assert_eq!(body["changed"], false, "resumed already");
    let (status, _) = h.write("POST", "/consumers/billing/resume", None).await;
    assert_eq!(status, StatusCode::OK);
    let claimed = outbox_ports::OutboxRelayPath::claim_pending(&*h.outbox, &lease, 10)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].message.id, held, "resumed, the exchange flows");
    let (_, body) = h.get("/pauses").await;
    assert!(body["items"].as_array().unwrap().is_empty(), "{body}");

    let audit = h.audit_entries().await;
    let actions: Vec<(String, String, u64)> = audit
        .iter()
        .rev()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["target"].as_str().unwrap().to_owned(),
                e["count"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, String, u64)> = [
        ("pause", "exchange orders", 1),
        ("pause", "exchange orders", 0),
        ("pause", "consumer billing", 1),
        ("resume", "exchange orders", 1),
        ("resume", "exchange orders", 0),
        ("resume", "consumer billing", 1),
    ]
    .into_iter()
    .map(|(a, t, c)| (a.to_owned(), t.to_owned(), c))
    .collect();
    assert_eq!(actions, expected);
}

#[tokio::test]
async fn a_pause_counts_the_exchange_s_unsent_messages_and_warns_when_none_carries_the_name() {
    let h = harness();
    h.pending(message("orders", "order.created", b"{}")).await;
    h.pending(message("orders", "order.created", b"{}")).await;
    h.pending(message("payments", "paid", b"{}")).await;

    // An exchange messages carry: counted, no warning.
    let (status, body) = h.write("POST", "/exchanges/orders/pause", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["unsent"], 2, "{body}");
    assert!(body["warning"].is_null(), "{body}");
    assert_eq!(body["changed"], true, "today's fields stay: {body}");

    // A shard's queue name, which no message carries: in force all the same,
    // with a warning naming the sharded exchange to pause instead.
    let (status, body) = h
        .write("POST", "/exchanges/orders.shard-1/pause", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["paused"], &body["changed"], &body["unsent"]),
        (
            &serde_json::json!(true),
            &serde_json::json!(true),
            &serde_json::json!(0)
        ),
        "{body}"
    );
    let warning = body["warning"]
        .as_str()
        .unwrap_or_else(|| panic!("a warning: {body}"));
    assert!(
        warning.contains("no unsent message carries the exchange name \"orders.shard-1\"")
            && warning.contains("pause \"orders\""),
        "{warning}"
    );
    // A typo: warned too, with the hint about sharded names.
    let (status, body) = h.write("POST", "/exchanges/ordres/pause", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["unsent"], 0, "{body}");
    let warning = body["warning"]
        .as_str()
        .unwrap_or_else(|| panic!("a warning: {body}"));
    assert!(
        warning.contains("\"ordres\"") && warning.contains("typo") && warning.contains("shard"),
        "{warning}"
    );
    let (_, body) = h.get("/pauses").await;
    let names: Vec<&str> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["orders", "orders.shard-1", "ordres"], "{body}");

    // A consumer has no unsent messages of its own to count.
    let (status, body) = h.write("POST", "/consumers/billing/pause", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["unsent"].is_null() && body["warning"].is_null(),
        "{body}"
    );
    // A resume counts what it lets flow.
    let (_, body) = h.write("POST", "/exchanges/orders/resume", None).await;
    assert_eq!(
        (&body["unsent"], &body["warning"]),
        (&serde_json::json!(2), &serde_json::json!(null)),
        "{body}"
    );

    // The document describes both fields of the answer.
    let (_, doc) = h.get("/openapi.json").await;
    let state = &doc["components"]["schemas"]["PauseState"]["properties"];
    for field in ["unsent", "warning"] {
        assert!(
            state[field]["description"]
                .as_str()
                .is_some_and(|d| !d.is_empty()),
            "{field}: {state}"
        );
    }
    let described =
        doc["paths"]["/exchanges/{exchange}/pause"]["post"]["responses"]["200"]["description"]
            .as_str()
            .unwrap_or_default();
    assert!(described.contains("warning"), "{described}");
}

/// Dead messages of `exchange`, each failed with its own error text.
async fn dead_with(
    h: &support::Harness,
    exchange: &str,
    errors: &[&str],
) -> Vec<outbox_core::MessageId> {
    let mut ids = Vec::new();
    for error in errors {
        let id = h.pending(message(exchange, "k", b"{}")).await;
        let lease = outbox_ports::Lease::new(format!("t-{id}"), std::time::Duration::from_secs(30));
        let claimed = outbox_ports::OutboxRelayPath::claim_pending(&*h.outbox, &lease, 1000)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1);
        let failure = outbox_ports::PublishFailure {
            id,
            error: (*error).to_owned(),
            decision: outbox_core::Decision::Dead,
        };
        outbox_ports::OutboxRelayPath::mark_publish_failed(&*h.outbox, &lease, &[failure])
            .await
            .expect("mark");
        ids.push(id);
    }
    ids
}

#[tokio::test]
async fn a_failure_group_is_requeued_deleted_or_reconsumed_with_a_dry_run_first() {
    let h = harness();
    let grouped = dead_with(&h, "orders", &["order 17 rejected", "order 42 rejected"]).await;
    let other = dead_with(&h, "orders", &["broker said no"]).await;
    let elsewhere = dead_with(&h, "payments", &["order 99 rejected"]).await;
    for _ in 0..2 {
        h.delivered("billing", &message("orders", "order.created", b"{}"), false)
            .await;
    }
    let (_, groups) = h.get("/failures").await;
    let error = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["exchange"] == "orders" && g["count"] == 2)
        .expect("the group of two")["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(error, "order <n> rejected");

    let body = |place: &str, name: &str, dry: bool| {
        serde_json::json!({ place: name, "error": error, "dry_run": dry }).to_string()
    };
    let (status, answer) = h
        .write(
            "POST",
            "/failures/requeue",
            Some(&body("exchange", "orders", true)),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer, serde_json::json!({"matched": 2, "changed": 0}));
    let status_of = async |id| {
        outbox_ports::OutboxOperator::get_message(&*h.outbox, id)
            .await
            .expect("get")
            .expect("kept")
            .status
    };
    assert_eq!(
        status_of(grouped[0]).await,
        outbox_core::OutboxStatus::Dead,
        "a dry run changed it"
    );
    let (status, answer) = h
        .write(
            "POST",
            "/failures/requeue",
            Some(&body("exchange", "orders", false)),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer, serde_json::json!({"matched": 2, "changed": 2}));
    for id in &grouped {
        assert_eq!(status_of(*id).await, outbox_core::OutboxStatus::Pending);
    }
    assert_eq!(
        status_of(other[0]).await,
        outbox_core::OutboxStatus::Dead,
        "another group's"
    );
    assert_eq!(
        status_of(elsewhere[0]).await,
        outbox_core::OutboxStatus::Dead,
        "another exchange's"
    );

    let (status, answer) = h
        .write(
            "POST",
            "/failures/delete",
            Some(&body("exchange", "payments", false)),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["changed"], 1);
    assert!(
        outbox_ports::OutboxOperator::get_message(&*h.outbox, elsewhere[0])
            .await
            .expect("get")
            .is_none()
    );
    // The group is gone from orders now: nothing of it is failing or dead.
    let (status, answer) = h
        .write(
            "POST",
            "/failures/requeue",
            Some(&body("exchange", "orders", false)),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");

    let reconsume =
        serde_json::json!({"consumer": "billing", "error": "handler failed"}).to_string();
    let (status, answer) = h
        .write("POST", "/failures/reconsume", Some(&reconsume))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer, serde_json::json!({"matched": 2, "changed": 2}));

    let (status, _) = h
        .call(
            "POST",
            "/failures/requeue",
            Some(READ),
            Some(&body("exchange", "orders", true)),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for bad in [
        r#"{"exchange": "orders"}"#,
        r#"{"consumer": "billing", "error": "x"}"#,
        r#"{"exchange": "orders", "error": "x", "max": 0}"#,
        r#"{"exchange": "a\u0000b", "error": "x"}"#,
    ] {
        let (status, answer) = h.write("POST", "/failures/requeue", Some(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
    }
    let audit = h.audit_entries().await;
    let targets: Vec<String> = audit
        .iter()
        .filter(|e| e["action"] == "requeue_matching")
        .map(|e| e["target"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(targets.len(), 1, "one requeue changed something: {audit:?}");
    assert!(targets[0].contains("order <n> rejected"), "{targets:?}");
}

#[tokio::test]
async fn a_failure_groups_count_leaves_out_what_is_no_longer_failing() {
    let h = harness();
    let ids = dead_with(&h, "orders", &["order 7 rejected", "order 7 rejected"]).await;
    // One of them requeued: pending again, its last error kept.
    let (status, _) = h
        .write("POST", &format!("/messages/{}/requeue", ids[0]), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let body = r#"{"exchange": "orders", "error": "order <n> rejected", "dry_run": true}"#;
    let (status, answer) = h.write("POST", "/failures/requeue", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer,
        serde_json::json!({"matched": 1, "changed": 0}),
        "the pending one is not the group's any more"
    );
}

/// `error=` lists a failure group's members only (the group's text, or an error
/// as stored, which means its group), on messages, on a consumer's deliveries
/// and in a bulk action's filter; `/failures` has no `capped` any more.
#[tokio::test]
async fn lists_and_bulk_actions_filter_by_failure_group() {
    let h = harness();
    let grouped = dead_with(&h, "orders", &["order 17 rejected", "order 42 rejected"]).await;
    dead_with(&h, "orders", &["broker said no", "order 7 rejected!"]).await;
    h.delivered("billing", &message("orders", "order.created", b"{}"), false)
        .await;
    let ids = |page: &serde_json::Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let mut want: Vec<String> = grouped.iter().map(ToString::to_string).collect();
    want.sort();
    for query in [
        "/messages?error=order%20%3Cn%3E%20rejected",
        "/messages?error=order%2099%20rejected",
        "/messages?exchange=orders&status=dead&error=order%20%3Cn%3E%20rejected",
    ] {
        let (status, page) = h.get(query).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let mut got = ids(&page);
        got.sort();
        assert_eq!(got, want, "{query}");
    }
    let (_, none) = h.get("/messages?error=no%20such%20group").await;
    assert!(ids(&none).is_empty());
    let (_, deliveries) = h
        .get("/consumers/billing/deliveries?error=handler%20failed")
        .await;
    assert_eq!(ids(&deliveries).len(), 1, "{deliveries}");
    let (_, deliveries) = h.get("/consumers/billing/deliveries?error=other").await;
    assert!(ids(&deliveries).is_empty());
    let (_, answer) = h
        .write(
            "POST",
            "/messages/requeue",
            Some(r#"{"filter":{"error":"order <n> rejected"},"dry_run":true}"#),
        )
        .await;
    assert_eq!(answer, serde_json::json!({"matched": 2, "changed": 0}));
    let (_, groups) = h.get("/failures").await;
    assert!(groups.get("capped").is_none(), "{groups}");
}

/// `/stats` lists each exchange with an unsent or dead message or a pause, by
/// name, with its counts, its oldest unsent age and whether it is paused; each
/// consumer says whether it is paused.
#[tokio::test]
async fn stats_count_per_exchange_and_show_pauses() {
    use outbox_ports::{PauseKind, PauseStore as _};
    let h = harness();
    // The dead first: making one dead claims what is pending.
    h.dead(message("orders", "a", b"{}")).await;
    h.dead(message("billing", "a", b"{}")).await;
    h.pending(message("orders", "a", b"{}")).await;
    h.delivered("invoicing", &message("orders", "a", b"{}"), true)
        .await;
    h.outbox
        .pauses()
        .pause(PauseKind::Exchange, "orders", "ops")
        .await
        .expect("pause");
    h.outbox
        .pauses()
        .pause(PauseKind::Exchange, "quiet", "ops")
        .await
        .expect("pause");
    h.outbox
        .pauses()
        .pause(PauseKind::Consumer, "invoicing", "ops")
        .await
        .expect("pause");
    let (status, stats) = h.get("/stats").await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    let exchanges = stats["exchanges"].as_array().expect("exchanges");
    let names: Vec<&str> = exchanges
        .iter()
        .map(|e| e["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["billing", "orders", "quiet"]);
    assert_eq!(exchanges[1]["pending"], 1);
    assert_eq!(exchanges[1]["dead"], 1);
    assert_eq!(exchanges[1]["publish_failed"], 0);
    assert_eq!(exchanges[1]["paused"], true);
    assert!(exchanges[1]["oldest_unsent_age_s"].is_u64());
    assert_eq!(exchanges[0]["paused"], false);
    assert!(
        exchanges[0]["oldest_unsent_age_s"].is_null(),
        "dead only: none waits"
    );
    assert_eq!(exchanges[2]["pending"], 0, "paused with nothing in it");
    let consumers = stats["consumers"].as_array().expect("consumers");
    assert_eq!(consumers[0]["name"], "invoicing");
    assert_eq!(consumers[0]["paused"], true);
}

/// `sort=oldest` lists oldest first, on messages and on a consumer's deliveries;
/// another value is a 400 `bad_sort`.
#[tokio::test]
async fn lists_sort_oldest_first_when_asked() {
    let h = harness();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(h.pending(message("orders", "a", b"{}")).await.to_string());
    }
    for _ in 0..2 {
        h.delivered("billing", &message("orders", "a", b"{}"), false)
            .await;
    }
    let listed = |page: &serde_json::Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, oldest) = h.get("/messages?sort=oldest").await;
    assert_eq!(listed(&oldest), ids);
    let (_, newest) = h.get("/messages?sort=newest").await;
    let mut reversed = ids.clone();
    reversed.reverse();
    assert_eq!(listed(&newest), reversed);
    let (_, a) = h.get("/consumers/billing/deliveries?sort=oldest").await;
    let (_, b) = h.get("/consumers/billing/deliveries").await;
    let mut b = listed(&b);
    b.reverse();
    assert_eq!(listed(&a), b, "{a}");
    let (status, bad) = h.get("/messages?sort=sideways").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "bad_sort");
}
