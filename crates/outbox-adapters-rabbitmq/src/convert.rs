//! `Message` to AMQP properties and back.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use outbox_core::{Headers, Message, MessageError, Timestamp};
use outbox_ports::{Envelope, ORDERING_KEY_HEADER};

/// Persistent delivery, id, type, content type, timestamp, correlation id, source
/// (`app_id`) and every header (a `traceparent` among them when present).
///
/// # Errors
/// [`MessageError`] naming the field AMQP cannot carry (lapin's `ShortString`
/// panics on more than 255 bytes, so nothing is converted before this check).
pub(crate) fn properties(m: &Message) -> Result<BasicProperties, MessageError> {
    m.check_amqp()?;
    let mut headers = FieldTable::default();
    for (k, v) in &m.headers {
        headers.insert(
            ShortString::from(k.as_str()),
            AMQPValue::LongString(v.as_str().into()),
        );
    }
    if let Some(k) = &m.ordering_key {
        headers.insert(
            ShortString::from(ORDERING_KEY_HEADER),
            AMQPValue::LongString(k.as_str().into()),
        );
    }
    let mut p = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(m.id.to_string().into())
        .with_content_type(m.content_type.as_str().into())
        .with_timestamp(u64::try_from(m.created_at.unix_timestamp()).unwrap_or(0))
        .with_headers(headers);
    if let Some(t) = &m.message_type {
        p = p.with_type(t.as_str().into());
    }
    if let Some(c) = &m.correlation_id {
        p = p.with_correlation_id(c.as_str().into());
    }
    if let Some(s) = &m.source {
        p = p.with_app_id(s.as_str().into());
    }
    Ok(p)
}

fn text(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        AMQPValue::Boolean(b) => Some(b.to_string()),
        AMQPValue::LongLongInt(i) => Some(i.to_string()),
        AMQPValue::LongInt(i) => Some(i.to_string()),
        AMQPValue::LongUInt(i) => Some(i.to_string()),
        AMQPValue::ShortInt(i) => Some(i.to_string()),
        AMQPValue::ShortUInt(i) => Some(i.to_string()),
        _ => None,
    }
}

/// The envelope of a delivery: everything the consumer worker needs, untrusted.
pub(crate) fn envelope(d: &lapin::message::Delivery) -> Envelope {
    let p = &d.properties;
    let mut headers: Headers = p
        .headers()
        .as_ref()
        .map(|t| {
            t.inner()
                .iter()
                .filter_map(|(k, v)| text(v).map(|v| (k.as_str().to_owned(), v)))
                .collect()
        })
        .unwrap_or_default();
    let ordering_key = headers.remove(ORDERING_KEY_HEADER);
    Envelope {
        message_id: p.message_id().as_ref().map(|s| s.as_str().to_owned()),
        exchange: d.exchange.as_str().to_owned(),
        routing_key: d.routing_key.as_str().to_owned(),
        message_type: p.kind().as_ref().map(|s| s.as_str().to_owned()),
        headers,
        body: d.data.clone(),
        content_type: p.content_type().as_ref().map(|s| s.as_str().to_owned()),
        correlation_id: p.correlation_id().as_ref().map(|s| s.as_str().to_owned()),
        source: p.app_id().as_ref().map(|s| s.as_str().to_owned()),
        timestamp: p
            .timestamp()
            .and_then(|t| i64::try_from(t).ok())
            .and_then(|t| Timestamp::from_unix_timestamp(t).ok()),
        ordering_key,
    }
}
