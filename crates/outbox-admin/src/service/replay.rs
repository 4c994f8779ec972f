//! Edit and replay: a dead message made again from an operator's edit, as a new
//! message naming its original. Off unless `[admin] allow_edit = true`: it sends
//! what no producer wrote.
//!
//! What the operator was shown had its hidden values (redaction) as `***`; such a
//! value sent back unchanged stands for the original's, which is restored, so a
//! replay never carries `***` where a secret was. The audit entry keeps what
//! changed, hidden values still hidden.

use std::collections::BTreeMap;

use outbox_core::{Headers, Message, MessageId};
use serde_json::{Value, json};

use super::AdminService;
use crate::AdminError;
use crate::model::{ReplayRequest, ReplayResponse};
use crate::redact::{REDACTED, is_textual};

/// Changes the audit entry lists at most (a larger edit says how many more).
const MAX_DIFF_ENTRIES: usize = 50;

/// A value in the audit diff is cut to this many characters.
const MAX_DIFF_VALUE_CHARS: usize = 200;

impl AdminService {
    /// Allows (or not, the default) editing and replaying dead messages.
    #[must_use]
    pub fn with_edit(mut self, allowed: bool) -> Self {
        self.edit = allowed;
        self
    }

    /// Whether editing and replaying is on.
    #[must_use]
    pub fn edit_allowed(&self) -> bool {
        self.edit
    }

    /// Replays dead message `id` with `edit` as a new message (audited as
    /// `replay`, the target naming both and what changed).
    ///
    /// # Errors
    /// `EditOff` when editing is off; `NotFound`; `Conflict` (409) for a payload
    /// that is not the JSON its content type says, or a `***` with no hidden value
    /// behind it; a 400 for a header name or value the document forbids; `Refused`
    /// (409) for a message not dead, replayed already or keyed; what the stores say.
    pub async fn replay_message(
        &self,
        actor: &str,
        id: MessageId,
        edit: ReplayRequest,
    ) -> Result<ReplayResponse, AdminError> {
        if !self.edit {
            return Err(AdminError::EditOff);
        }
        let original = self
            .ports
            .outbox
            .get_message(id)
            .await?
            .ok_or_else(|| super::not_found("message", id))?
            .message;
        let replay = self.replayed(&original, edit)?;
        let target = json!({
            "message": id.to_string(),
            "replayed_as": replay.id.to_string(),
            "changed": self.diff(&original, &replay),
        });
        let new_id = replay.id;
        self.ports.outbox.replay_message(id, replay).await?;
        self.audit(actor, "replay", target.to_string(), 1).await?;
        Ok(ReplayResponse {
            id: new_id.to_string(),
            replayed_from: id.to_string(),
        })
    }

    /// Replays `consumer`'s dead delivery `id` with `edit` as a new delivery, run
    /// by the consume sweep (audited as `replay`, the target naming the consumer,
    /// both ids and what changed).
    ///
    /// # Errors
    /// As [`AdminService::replay_message`], for a delivery.
    pub async fn replay_delivery(
        &self,
        actor: &str,
        consumer: &str,
        id: MessageId,
        edit: ReplayRequest,
    ) -> Result<ReplayResponse, AdminError> {
        if !self.edit {
            return Err(AdminError::EditOff);
        }
        let original = self
            .ports
            .inbox
            .get_delivery(consumer, id)
            .await?
            .ok_or_else(|| super::not_found("delivery", format!("{consumer}/{id}")))?
            .message;
        let replay = self.replayed(&original, edit)?;
        let target = json!({
            "consumer": consumer,
            "delivery": id.to_string(),
            "replayed_as": replay.id.to_string(),
            "changed": self.diff(&original, &replay),
        });
        let new_id = replay.id;
        self.ports
            .inbox
            .replay_delivery(consumer, id, replay)
            .await?;
        self.audit(actor, "replay", target.to_string(), 1).await?;
        Ok(ReplayResponse {
            id: new_id.to_string(),
            replayed_from: id.to_string(),
        })
    }

    /// What `edit` makes of `original`: a new id and time, the edited payload and
    /// headers (hidden values put back) with [`outbox_ports::REPLAY_OF_HEADER`]
    /// naming the message it stands in for, the rest as it was, checked against AMQP's
    /// limits (a message a broker would refuse is an input error, not a stored row
    /// that can never be sent).
    fn replayed(&self, original: &Message, edit: ReplayRequest) -> Result<Message, AdminError> {
        let payload = match edit.payload {
            None => original.payload.clone(),
            Some(text) => self.edited_payload(original, text)?,
        };
        let mut headers = match edit.headers {
            None => original.headers.clone(),
            Some(headers) => self.edited_headers(&original.headers, headers)?,
        };
        // Whatever the edit says: consumers record the replay as the message it
        // stands in for, so an inbox that has the original absorbs it.
        outbox_ports::stamp_replay_of(&mut headers, original);
        let now = self.clock.now();
        let mut random = [0u8; 10];
        getrandom::fill(&mut random)
            .map_err(|e| AdminError::bad("no_randomness", format!("no random id: {e}")))?;
        let replay = Message {
            id: MessageId::v7(now, random),
            exchange: original.exchange.clone(),
            routing_key: original.routing_key.clone(),
            message_type: original.message_type.clone(),
            headers,
            payload,
            content_type: original.content_type.clone(),
            source: original.source.clone(),
            correlation_id: original.correlation_id.clone(),
            created_at: now,
            not_before: None,
            ordering_key: None,
        };
        replay
            .check_amqp()
            .map_err(outbox_ports::PortError::InvalidMessage)?;
        Ok(replay)
    }

    /// The edited payload's bytes: JSON checked when the content type says JSON,
    /// `***` under a hidden key put back to the original's value.
    fn edited_payload(&self, original: &Message, text: String) -> Result<Vec<u8>, AdminError> {
        if !original.content_type.to_ascii_lowercase().contains("json") {
            // Not JSON: hidden values cannot be told apart key by key. A payload
            // that was withheld whole must not come back as its placeholder.
            let shown =
                self.redaction
                    .bytes(&original.payload, false, is_textual(&original.content_type));
            if shown.redacted && text.contains(REDACTED) {
                return Err(conflict(
                    "hidden_value",
                    format!(
                        "the payload was shown with hidden values ({REDACTED}) and its content type ({}) is not JSON, so they cannot be put back; write the whole payload",
                        original.content_type
                    ),
                ));
            }
            return Ok(text.into_bytes());
        }
        let mut edited: Value = serde_json::from_str(&text).map_err(|e| {
            conflict(
                "payload_not_json",
                format!(
                    "the payload is not JSON, as its content type ({}) says it is: {e}",
                    original.content_type
                ),
            )
        })?;
        let before: Option<Value> = serde_json::from_slice(&original.payload).ok();
        let mut restored = false;
        self.restore(
            &mut edited,
            before.as_ref(),
            &mut String::new(),
            &mut restored,
        )?;
        if !restored {
            // Nothing put back: the text as the operator wrote it, byte for byte
            // (a re-encoding would reorder keys and round large numbers).
            return Ok(text.into_bytes());
        }
        serde_json::to_vec(&edited).map_err(|e| AdminError::bad("bad_payload", e.to_string()))
    }

    /// Puts the original's value back wherever `edited` holds `***` under a hidden
    /// key; `path` is where `edited` sits (a JSON pointer).
    fn restore(
        &self,
        edited: &mut Value,
        original: Option<&Value>,
        path: &mut String,
        restored: &mut bool,
    ) -> Result<(), AdminError> {
        match edited {
            Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    let before = original.and_then(|o| o.get(key.as_str()));
                    let len = path.len();
                    path.push('/');
                    path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    if self.redaction.hides_field(key) && inner.as_str() == Some(REDACTED) {
                        *inner = before.cloned().ok_or_else(|| {
                            conflict(
                                "hidden_value",
                                format!(
                                    "{REDACTED} at {path} stands for a hidden value, and the original has none there; write the value itself"
                                ),
                            )
                        })?;
                        *restored = true;
                    } else {
                        self.restore(inner, before, path, restored)?;
                    }
                    path.truncate(len);
                }
            }
            Value::Array(items) => {
                for (i, inner) in items.iter_mut().enumerate() {
                    let before = original.and_then(|o| o.get(i));
                    let len = path.len();
                    path.push('/');
                    path.push_str(&i.to_string());
                    self.restore(inner, before, path, restored)?;
                    path.truncate(len);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The edited headers, a hidden one sent back as `***` holding the original's
    /// value.
    fn edited_headers(
        &self,
        original: &Headers,
        edited: BTreeMap<String, String>,
    ) -> Result<Headers, AdminError> {
        edited
            .into_iter()
            .map(|(name, value)| {
                // PostgreSQL's jsonb takes no NUL, and AMQP header texts carry no
                // control characters a person means: refused alike by every store.
                if name.chars().chain(value.chars()).any(char::is_control) {
                    return Err(AdminError::bad(
                        "bad_headers",
                        format!("header {name:?} has a control character in its name or value"),
                    ));
                }
                let chars = name.chars().count();
                if chars == 0 || chars > crate::model::MAX_REPLAY_HEADER_NAME_CHARS {
                    return Err(AdminError::bad(
                        "bad_headers",
                        format!(
                            "header {name:?}: a name is 1 to {} characters",
                            crate::model::MAX_REPLAY_HEADER_NAME_CHARS
                        ),
                    ));
                }
                if value == REDACTED && self.redaction.hides_header(&name) {
                    let kept = original.get(&name).cloned().ok_or_else(|| {
                        conflict(
                            "hidden_value",
                            format!(
                                "header {name:?} is {REDACTED}, which stands for a hidden value, and the original has no such header; write the value itself"
                            ),
                        )
                    })?;
                    Ok((name, kept))
                } else {
                    Ok((name, value))
                }
            })
            .collect()
    }

    /// What the replay changed, hidden values hidden: the headers added, removed or
    /// changed, and the payload's JSON leaves (or its sizes, when not JSON).
    fn diff(&self, original: &Message, replay: &Message) -> Value {
        let mut changes = Vec::new();
        let shown_before = self.redaction.headers(&original.headers);
        let shown_after = self.redaction.headers(&replay.headers);
        for name in shown_before.keys().chain(shown_after.keys()) {
            // Set by the replay itself, not an edit: the target names both ids.
            if name == outbox_ports::REPLAY_OF_HEADER {
                continue;
            }
            let (a, b) = (original.headers.get(name), replay.headers.get(name));
            if a != b && !changes.iter().any(|c: &Value| c["header"] == *name) {
                changes.push(json!({
                    "header": name,
                    "from": shown_before.get(name).map(|v| cut(v)),
                    "to": shown_after.get(name).map(|v| cut(v)),
                }));
            }
        }
        let before = serde_json::from_slice::<Value>(&original.payload).ok();
        let after = serde_json::from_slice::<Value>(&replay.payload).ok();
        match (before, after) {
            (Some(a), Some(b)) => {
                let (a, b) = (self.redaction.json(a), self.redaction.json(b));
                leaves_changed(&a, &b, &mut String::new(), &mut changes);
            }
            _ if original.payload != replay.payload => changes.push(json!({
                "payload": "",
                "from_bytes": original.payload.len(),
                "to_bytes": replay.payload.len(),
            })),
            _ => {}
        }
        let more = changes.len().saturating_sub(MAX_DIFF_ENTRIES);
        changes.truncate(MAX_DIFF_ENTRIES);
        if more > 0 {
            changes.push(json!({ "more": more }));
        }
        Value::Array(changes)
    }
}

/// A 409: the edit does not fit the original as it is stored (the same request
/// may fit another message).
fn conflict(code: &'static str, message: String) -> AdminError {
    AdminError::Conflict { code, message }
}

fn cut(value: &str) -> String {
    if value.chars().count() > MAX_DIFF_VALUE_CHARS {
        let mut s: String = value.chars().take(MAX_DIFF_VALUE_CHARS).collect();
        s.push('…');
        s
    } else {
        value.to_owned()
    }
}

fn shown(value: Option<&Value>) -> Value {
    value.map_or(Value::Null, |v| match v {
        Value::String(s) => Value::String(cut(s)),
        other => Value::String(cut(&other.to_string())),
    })
}

/// The JSON pointers under which `a` and `b` differ, down to the leaves (an object
/// key or array item present on one side only is one change).
fn leaves_changed(a: &Value, b: &Value, path: &mut String, out: &mut Vec<Value>) {
    if out.len() > MAX_DIFF_ENTRIES {
        return;
    }
    let mut child = |key: &str, x: Option<&Value>, y: Option<&Value>, out: &mut Vec<Value>| {
        let len = path.len();
        path.push('/');
        path.push_str(&key.replace('~', "~0").replace('/', "~1"));
        match (x, y) {
            (Some(x), Some(y)) => leaves_changed(x, y, path, out),
            (x, y) => {
                out.push(json!({ "payload": path.clone(), "from": shown(x), "to": shown(y) }))
            }
        }
        path.truncate(len);
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                child(key, x.get(key), y.get(key), out);
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                child(&i.to_string(), x.get(i), y.get(i), out);
            }
        }
        (x, y) if x != y => out.push(json!({
            "payload": if path.is_empty() { "/".to_owned() } else { path.clone() },
            "from": shown(Some(x)),
            "to": shown(Some(y)),
        })),
        _ => {}
    }
}
