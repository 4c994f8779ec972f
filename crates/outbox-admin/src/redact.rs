//! What payload and header views hide: configured header names and JSON object keys
//! (at any depth), case-insensitively, shown as `***`.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use outbox_core::Headers;
use serde_json::Value;

/// What stands in for a hidden value.
pub const REDACTED: &str = "***";

/// What stands in for a whole body that cannot be redacted field by field (not
/// JSON, shown as base64 or hex) while JSON keys are hidden: withheld on every
/// view.
pub const WITHHELD: &str =
    "*** (withheld: JSON keys are redacted here and this body cannot be redacted field by field)";

/// The redaction lists.
#[derive(Debug, Clone, Default)]
pub struct Redaction {
    headers: Vec<String>,
    json_fields: Vec<String>,
}

/// A payload (or a preview of one) ready to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownBytes {
    /// Text, or base64.
    pub text: String,
    /// Whether `text` is base64.
    pub base64: bool,
    /// Whether redaction changed or withheld it.
    pub redacted: bool,
}

impl Redaction {
    /// Hides these header names and JSON keys (compared case-insensitively).
    #[must_use]
    pub fn new(
        headers: impl IntoIterator<Item = impl Into<String>>,
        json_fields: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            headers: headers
                .into_iter()
                .map(|h| h.into().to_lowercase())
                .collect(),
            json_fields: json_fields
                .into_iter()
                .map(|f| f.into().to_lowercase())
                .collect(),
        }
    }

    /// Whether header `name`'s value is hidden.
    #[must_use]
    pub(crate) fn hides_header(&self, name: &str) -> bool {
        self.headers.contains(&name.to_lowercase())
    }

    /// Whether the values of JSON key `key` are hidden.
    #[must_use]
    pub(crate) fn hides_field(&self, key: &str) -> bool {
        self.json_fields.contains(&key.to_lowercase())
    }

    /// `value` with the hidden keys' values replaced (for the audit log's diff).
    #[must_use]
    pub(crate) fn json(&self, mut value: Value) -> Value {
        self.redact_value(&mut value);
        value
    }

    /// `headers` with the redacted ones' values replaced.
    #[must_use]
    pub fn headers(&self, headers: &Headers) -> BTreeMap<String, String> {
        headers
            .iter()
            .map(|(name, value)| {
                let shown = if self.headers.contains(&name.to_lowercase()) {
                    REDACTED.to_owned()
                } else {
                    value.clone()
                };
                (name.clone(), shown)
            })
            .collect()
    }

    /// `bytes` (a whole payload, or the start of one when `truncated`) as text when
    /// it is UTF-8 (and `as_text` allows it), else base64; redacted JSON keys hidden.
    #[must_use]
    pub fn bytes(&self, bytes: &[u8], truncated: bool, as_text: bool) -> ShownBytes {
        let text = match std::str::from_utf8(bytes) {
            Ok(text) => Some(text),
            // A preview may end inside a character: show the whole characters.
            Err(e) if truncated && e.error_len().is_none() => {
                std::str::from_utf8(&bytes[..e.valid_up_to()]).ok()
            }
            Err(_) => None,
        };
        match text.filter(|_| as_text) {
            Some(text) => self.text(text),
            None if self.json_fields.is_empty() => ShownBytes {
                text: STANDARD.encode(bytes),
                base64: true,
                redacted: false,
            },
            None => self.opaque(bytes, text),
        }
    }

    /// A body not shown as text (binary, or a content type that is not text)
    /// while JSON keys are hidden: hidden means hidden on every view, base64 and
    /// hex included. A whole JSON document (its content type did not say so) is
    /// redacted key by key and shown as text when a hidden key was in it, as
    /// base64 when none was; anything else cannot be redacted field by field
    /// (protobuf, compressed, a cut preview) and is withheld whole, as
    /// [`WITHHELD`].
    fn opaque(&self, bytes: &[u8], text: Option<&str>) -> ShownBytes {
        let whole = text.filter(|t| t.len() == bytes.len());
        if let Some(mut value) = whole.and_then(|t| serde_json::from_str::<Value>(t).ok()) {
            return if self.redact_value(&mut value) {
                ShownBytes {
                    text: value.to_string(),
                    base64: false,
                    redacted: true,
                }
            } else {
                ShownBytes {
                    text: STANDARD.encode(bytes),
                    base64: true,
                    redacted: false,
                }
            };
        }
        ShownBytes {
            text: WITHHELD.to_owned(),
            base64: false,
            redacted: true,
        }
    }

    fn text(&self, text: &str) -> ShownBytes {
        let plain = |text: String, redacted| ShownBytes {
            text,
            base64: false,
            redacted,
        };
        if self.json_fields.is_empty() {
            return plain(text.to_owned(), false);
        }
        match serde_json::from_str::<Value>(text) {
            Ok(mut value) => {
                if self.redact_value(&mut value) {
                    plain(value.to_string(), true)
                } else {
                    plain(text.to_owned(), false)
                }
            }
            // Not JSON as a whole (often a preview cut short): it cannot be redacted
            // key by key, so it is withheld when a redacted key name appears in it,
            // and when it is not text at all (control characters other than line
            // breaks and tabs: a binary format such as protobuf carries a hidden
            // value without its key's name; list previews do not know the content
            // type).
            Err(_) => {
                let lower = text.to_lowercase();
                if self.json_fields.iter().any(|f| lower.contains(f.as_str())) {
                    plain(REDACTED.to_owned(), true)
                } else if text
                    .chars()
                    .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
                {
                    plain(WITHHELD.to_owned(), true)
                } else {
                    plain(text.to_owned(), false)
                }
            }
        }
    }

    fn redact_value(&self, value: &mut Value) -> bool {
        let mut changed = false;
        match value {
            Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    if self.json_fields.contains(&key.to_lowercase()) {
                        *inner = Value::String(REDACTED.to_owned());
                        changed = true;
                    } else {
                        changed |= self.redact_value(inner);
                    }
                }
            }
            Value::Array(items) => {
                for inner in items {
                    changed |= self.redact_value(inner);
                }
            }
            _ => {}
        }
        changed
    }
}

/// Whether a payload of `content_type` is shown as text (when it decodes).
#[must_use]
pub(crate) fn is_textual(content_type: &str) -> bool {
    let ct = content_type.to_ascii_lowercase();
    ct.starts_with("text/")
        || ct.contains("json")
        || ct.contains("xml")
        || ct.starts_with("application/x-www-form-urlencoded")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redaction() -> Redaction {
        Redaction::new(["Authorization"], ["password", "CardNumber"])
    }

    #[test]
    fn nested_json_keys_are_hidden_case_insensitively() {
        let shown = redaction().bytes(
            br#"{"user":{"Password":"hunter2","items":[{"cardnumber":"4111"}]},"ok":1}"#,
            false,
            true,
        );
        assert!(shown.redacted);
        assert!(!shown.text.contains("hunter2") && !shown.text.contains("4111"));
        assert!(shown.text.contains(r#""ok":1"#), "{}", shown.text);
    }

    #[test]
    fn a_cut_preview_naming_a_hidden_key_is_withheld() {
        let shown = redaction().bytes(br#"{"password":"hunter2","x":"#, true, true);
        assert_eq!(shown.text, REDACTED);
        assert!(shown.redacted);
        let other = redaction().bytes(br#"{"name":"a","x":"#, true, true);
        assert!(!other.redacted);
    }

    #[test]
    fn binary_is_base64_and_a_cut_character_is_dropped() {
        let none = Redaction::new(["authorization"], Vec::<String>::new());
        let shown = none.bytes(&[0xff, 0x00], false, true);
        assert!(shown.base64);
        let cut = "é".as_bytes()[..1].to_vec();
        let mut preview = b"ab".to_vec();
        preview.extend(cut);
        let shown = redaction().bytes(&preview, true, true);
        assert_eq!((shown.text.as_str(), shown.base64), ("ab", false));
    }

    #[test]
    fn a_body_that_cannot_be_redacted_field_by_field_is_withheld_whole() {
        // Protobuf-like: the value with no key name in it, not UTF-8.
        let proto = b"\x0a\x07hunter2\xff";
        for as_text in [true, false] {
            let shown = redaction().bytes(proto, false, as_text);
            assert_eq!(
                (shown.text.as_str(), shown.base64, shown.redacted),
                (WITHHELD, false, true)
            );
        }
        // Valid UTF-8 under a content type that is not text: no hex or base64.
        let shown = redaction().bytes(b"\x0a\x07hunter2", false, false);
        assert_eq!(shown.text, WITHHELD);
        // JSON under a binary content type: redacted key by key.
        let shown = redaction().bytes(br#"{"password":"hunter2","n":1}"#, false, false);
        assert!(shown.redacted && !shown.base64, "{shown:?}");
        assert!(!shown.text.contains("hunter2") && shown.text.contains(r#""n":1"#));
        let clean = redaction().bytes(br#"{"n":1}"#, false, false);
        assert_eq!((clean.base64, clean.redacted), (true, false));
        // Without JSON keys to hide, binary is base64 as before.
        let none = Redaction::new(["authorization"], Vec::<String>::new());
        assert!(none.bytes(proto, false, false).base64);
    }

    #[test]
    fn headers_are_hidden_by_name() {
        let headers = Headers::from([
            ("authorization".to_owned(), "Bearer x".to_owned()),
            ("trace".to_owned(), "t".to_owned()),
        ]);
        let shown = redaction().headers(&headers);
        assert_eq!(shown["authorization"], REDACTED);
        assert_eq!(shown["trace"], "t");
    }
}
