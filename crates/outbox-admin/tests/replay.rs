//! Edit and replay through the router: off by default (404 whatever the body),
//! and when on, a dead message replayed once as a new one with hidden values put
//! back, the original kept dead, the audit entry holding what changed and no
//! secret.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use axum::http::StatusCode;
use outbox_admin::Redaction;
use outbox_core::MessageId;
use outbox_ports::OutboxOperator;
use serde_json::{Value, json};
use support::{Harness, READ, code, harness, harness_configured, message, tokens};

fn editing() -> Harness {
    harness_configured(tokens(), |s| {
        s.with_edit(true)
            .with_redaction(Redaction::new(["authorization"], ["password"]))
    })
}

async fn secret_dead(h: &Harness) -> MessageId {
    let mut m = message(
        "orders",
        "orders.created",
        br#"{"user":"ann","password":"hunter2","amount":5}"#,
    );
    m.headers
        .insert("authorization".into(), "Bearer s3cret".into());
    m.headers.insert("trace".into(), "t1".into());
    h.dead(m).await
}

#[tokio::test]
async fn with_editing_off_a_replay_is_404_whatever_the_body() {
    let h = harness();
    let id = h.dead(message("orders", "a", b"{}")).await;
    let uri = format!("/messages/{id}/replay");
    for body in [
        Some(r#"{"payload":"{}"}"#),
        Some("not json"),
        Some(r#"{"unknown":1}"#),
        None,
    ] {
        let (status, answer) = h.write("POST", &uri, body).await;
        assert_eq!(
            (status, code(&answer)),
            (StatusCode::NOT_FOUND, "edit_off"),
            "{body:?}"
        );
    }
    // Not even an unknown id tells more.
    let (status, _) = h
        .write("POST", "/messages/not-an-id/replay", Some("{}"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(h.audit_entries().await.is_empty());
    let (_, detail) = h.get(&format!("/messages/{id}")).await;
    assert_eq!(detail["status"], "dead");
    assert_eq!(detail["replayed_as"], Value::Null);
}

#[tokio::test]
async fn a_dead_message_is_replayed_once_with_hidden_values_put_back() {
    let h = editing();
    let id = secret_dead(&h).await;
    let uri = format!("/messages/{id}/replay");
    let (_, shown) = h.get(&format!("/messages/{id}")).await;
    let shown_payload: Value = serde_json::from_str(shown["payload"].as_str().unwrap()).unwrap();
    assert_eq!(shown_payload["password"], "***", "what the operator sees");
    assert_eq!(shown["headers"]["authorization"], "***");

    // The operator edits what was shown: the amount and one header.
    let mut edited = shown_payload.clone();
    edited["amount"] = json!(6);
    let body = json!({
        "payload": edited.to_string(),
        "headers": {"authorization": "***", "trace": "t2"},
    })
    .to_string();
    let (status, read_only) = h.call("POST", &uri, Some(READ), Some(&body)).await;
    assert_eq!(
        (status, code(&read_only)),
        (StatusCode::FORBIDDEN, "forbidden")
    );
    let (status, answer) = h.write("POST", &uri, Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["replayed_from"], id.to_string());
    let new: MessageId = answer["id"].as_str().unwrap().parse().unwrap();
    assert_ne!(new, id);

    // Stored: the secrets as they were, never `***`; the edit applied.
    let stored = h.outbox.get_message(new).await.unwrap().unwrap();
    let payload: Value = serde_json::from_slice(&stored.message.payload).unwrap();
    assert_eq!(payload["password"], "hunter2");
    assert_eq!(payload["amount"], 6);
    assert_eq!(payload["user"], "ann");
    assert_eq!(stored.message.headers["authorization"], "Bearer s3cret");
    assert_eq!(stored.message.headers["trace"], "t2");
    assert_eq!(stored.message.exchange, "orders");
    assert_eq!(stored.message.routing_key, "orders.created");

    let (_, replay) = h.get(&format!("/messages/{new}")).await;
    assert_eq!(replay["status"], "pending");
    assert_eq!(replay["replayed_from"], id.to_string());
    let (_, original) = h.get(&format!("/messages/{id}")).await;
    assert_eq!(original["status"], "dead", "the original is kept");
    assert_eq!(original["replayed_as"], new.to_string());

    // Audited with what changed, and no secret.
    let entries = h.audit_entries().await;
    let entry = entries.iter().find(|e| e["action"] == "replay").unwrap();
    let target = entry["target"].as_str().unwrap();
    let target_json: Value = serde_json::from_str(target).unwrap();
    assert_eq!(target_json["message"], id.to_string());
    assert_eq!(target_json["replayed_as"], new.to_string());
    let changed = target_json["changed"].as_array().unwrap();
    assert!(
        changed
            .iter()
            .any(|c| c["payload"] == "/amount" && c["from"] == "5" && c["to"] == "6"),
        "{target}"
    );
    assert!(
        changed
            .iter()
            .any(|c| c["header"] == "trace" && c["to"] == "t2"),
        "{target}"
    );
    assert_eq!(changed.len(), 2, "nothing else changed: {target}");
    assert!(
        !target.contains("hunter2") && !target.contains("s3cret"),
        "{target}"
    );

    // Never a second run beside the replay.
    let (status, again) = h.write("POST", &uri, Some(&body)).await;
    assert_eq!((status, code(&again)), (StatusCode::CONFLICT, "refused"));
    let (status, requeue) = h
        .write("POST", &format!("/messages/{id}/requeue"), None)
        .await;
    assert_eq!((status, code(&requeue)), (StatusCode::CONFLICT, "refused"));
    assert!(
        requeue["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&new.to_string())
    );
}

#[tokio::test]
async fn an_empty_edit_replays_the_message_as_it_was() {
    let h = editing();
    let id = secret_dead(&h).await;
    let (status, answer) = h
        .write("POST", &format!("/messages/{id}/replay"), Some("{}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let new: MessageId = answer["id"].as_str().unwrap().parse().unwrap();
    let original = h.outbox.get_message(id).await.unwrap().unwrap();
    let replay = h.outbox.get_message(new).await.unwrap().unwrap();
    assert_eq!(replay.message.payload, original.message.payload);
    // The original's headers, and the one that names the message it stands in for.
    let mut headers = original.message.headers.clone();
    headers.insert(outbox_ports::REPLAY_OF_HEADER.to_owned(), id.to_string());
    assert_eq!(replay.message.headers, headers);
}

#[tokio::test]
async fn bad_edits_are_refused_and_change_nothing() {
    let h = editing();
    let id = secret_dead(&h).await;
    let uri = format!("/messages/{id}/replay");
    let cases = [
        (
            json!({"payload": "{not json"}).to_string(),
            StatusCode::CONFLICT,
            "payload_not_json",
        ),
        // `***` where the original hides nothing: no value to put back.
        (
            json!({"payload": r#"{"nested":{"password":"***"}}"#}).to_string(),
            StatusCode::CONFLICT,
            "hidden_value",
        ),
    ];
    for (body, status, expected) in &cases {
        let (got, answer) = h.write("POST", &uri, Some(body)).await;
        assert_eq!((got, code(&answer)), (*status, *expected), "{body}");
    }
    let (got, answer) = h
        .write(
            "POST",
            &uri,
            Some(&json!({"headers": {"x-new": "***"}}).to_string()),
        )
        .await;
    // Not a hidden header's name: `***` is a value like any other.
    assert_eq!(got, StatusCode::OK, "{answer}");

    let h = harness_configured(tokens(), |s| {
        s.with_edit(true)
            .with_redaction(Redaction::new(["authorization", "cookie"], ["password"]))
    });
    let id = secret_dead(&h).await;
    let uri = format!("/messages/{id}/replay");
    let (got, answer) = h
        .write(
            "POST",
            &uri,
            Some(&json!({"headers": {"cookie": "***"}}).to_string()),
        )
        .await;
    assert_eq!((got, code(&answer)), (StatusCode::CONFLICT, "hidden_value"));
    // What the document forbids is refused: a header name past 63 characters.
    let long = "x".repeat(64);
    let (got, answer) = h
        .write(
            "POST",
            &uri,
            Some(&json!({"headers": {long: "v"}}).to_string()),
        )
        .await;
    assert_eq!(
        (got, code(&answer)),
        (StatusCode::BAD_REQUEST, "bad_headers")
    );
    let (got, answer) = h
        .write("POST", &uri, Some(r#"{"payload":"{}","extra":1}"#))
        .await;
    assert_eq!((got, code(&answer)), (StatusCode::BAD_REQUEST, "bad_body"));
    assert!(h.audit_entries().await.is_empty(), "nothing was done");
    let (_, original) = h.get(&format!("/messages/{id}")).await;
    assert_eq!(original["replayed_as"], Value::Null);

    // Only a dead message, and only a known one.
    let pending = h.pending(message("orders", "a", b"{}")).await;
    let (got, answer) = h
        .write("POST", &format!("/messages/{pending}/replay"), Some("{}"))
        .await;
    assert_eq!((got, code(&answer)), (StatusCode::CONFLICT, "refused"));
    let unknown = message("orders", "a", b"{}").id;
    let (got, answer) = h
        .write("POST", &format!("/messages/{unknown}/replay"), Some("{}"))
        .await;
    assert_eq!((got, code(&answer)), (StatusCode::NOT_FOUND, "not_found"));
}

#[tokio::test]
async fn an_edit_with_nothing_hidden_is_stored_as_written() {
    let h = editing();
    let id = h.dead(message("orders", "a", br#"{"x":1}"#)).await;
    let text = "{ \"zeta\": 1,\n  \"alpha\": 123456789012345678901234567890 }";
    let (status, answer) = h
        .write(
            "POST",
            &format!("/messages/{id}/replay"),
            Some(&json!({"payload": text}).to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let new: MessageId = answer["id"].as_str().unwrap().parse().unwrap();
    let stored = h.outbox.get_message(new).await.unwrap().unwrap();
    assert_eq!(stored.message.payload, text.as_bytes(), "byte for byte");
    let (status, answer) = h
        .write(
            "POST",
            &format!(
                "/messages/{}/replay",
                h.dead(message("orders", "a", b"{}")).await
            ),
            Some(&json!({"headers": {"x": "a\u{0}b"}}).to_string()),
        )
        .await;
    assert_eq!(
        (status, code(&answer)),
        (StatusCode::BAD_REQUEST, "bad_headers")
    );
}

/// A dead delivery replays as a new delivery of the same consumer: 404 while
/// editing is off; with it on, the secret put back, the original kept dead and
/// showing its replay, and neither reconsumed nor replayed again.
#[tokio::test]
async fn a_dead_delivery_is_replayed_once_as_a_new_delivery() {
    let off = harness();
    let m = message("orders", "a", b"{}");
    off.delivered("billing", &m, false).await;
    let (status, answer) = off
        .write(
            "POST",
            &format!("/consumers/billing/deliveries/{}/replay", m.id),
            Some("{}"),
        )
        .await;
    assert_eq!((status, code(&answer)), (StatusCode::NOT_FOUND, "edit_off"));

    let h = editing();
    let mut m = message(
        "orders",
        "orders.created",
        br#"{"password":"hunter2","amount":5}"#,
    );
    m.headers
        .insert("authorization".into(), "Bearer s3cret".into());
    h.delivered("billing", &m, false).await;
    let uri = format!("/consumers/billing/deliveries/{}/replay", m.id);
    let body = json!({
        "payload": r#"{"password":"***","amount":6}"#,
        "headers": {"authorization": "***"},
    })
    .to_string();
    let (status, answer) = h.write("POST", &uri, Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let new: MessageId = answer["id"].as_str().unwrap().parse().unwrap();
    let stored = outbox_ports::InboxOperator::get_delivery(&*h.inbox, "billing", new)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, outbox_core::InboxStatus::Received);
    let payload: Value = serde_json::from_slice(&stored.message.payload).unwrap();
    assert_eq!(
        (payload["password"].as_str(), payload["amount"].as_i64()),
        (Some("hunter2"), Some(6))
    );
    assert_eq!(stored.message.headers["authorization"], "Bearer s3cret");

    let (_, original) = h
        .get(&format!("/consumers/billing/deliveries/{}", m.id))
        .await;
    assert_eq!(original["status"], "dead");
    assert_eq!(original["replayed_as"], new.to_string());
    let (_, replay) = h.get(&format!("/consumers/billing/deliveries/{new}")).await;
    assert_eq!(replay["replayed_from"], m.id.to_string());
    let entries = h.audit_entries().await;
    let target = entries
        .iter()
        .find(|e| e["action"] == "replay")
        .and_then(|e| e["target"].as_str())
        .unwrap()
        .to_owned();
    assert!(
        target.contains("\"consumer\":\"billing\"") && target.contains("/amount"),
        "{target}"
    );
    assert!(
        !target.contains("hunter2") && !target.contains("s3cret"),
        "{target}"
    );

    let (status, again) = h.write("POST", &uri, Some("{}")).await;
    assert_eq!((status, code(&again)), (StatusCode::CONFLICT, "refused"));
    let (status, reconsume) = h
        .write(
            "POST",
            &format!("/consumers/billing/deliveries/{}/reconsume", m.id),
            Some("{}"),
        )
        .await;
    assert_eq!(
        (status, code(&reconsume)),
        (StatusCode::CONFLICT, "refused")
    );
    let (status, _) = h
        .write(
            "POST",
            &format!("/consumers/shipping/deliveries/{}/replay", m.id),
            Some("{}"),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another consumer's is not this one"
    );
}
