//! `Message` to AMQP properties and back.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use outbox_core::{Headers, Message, MessageError, Timestamp};
use outbox_ports::{Death, EXCHANGE_HEADER, Envelope, ORDERING_KEY_HEADER};

/// Persistent delivery, id, type, content type, timestamp, correlation id, source
/// (`app_id`) and every header (a `traceparent` among them when present).
///
/// # Errors
/// [`MessageError`] naming the field AMQP cannot carry (lapin's `ShortString`
/// panics on more than 255 bytes, so nothing is converted before this check).
/// `sharded`: published to a shard of `m.exchange`, which the header
/// [`EXCHANGE_HEADER`] then names.
pub(crate) fn properties(m: &Message, sharded: bool) -> Result<BasicProperties, MessageError> {
    m.check_amqp()?;
    let mut headers = FieldTable::default();
    // Reserved: set below for a sharded publish only, never taken from a producer
    // (a consumer reads it as the message's exchange).
    for (k, v) in m
        .headers
        .iter()
        .filter(|(k, _)| k.as_str() != EXCHANGE_HEADER)
    {
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
    if sharded {
        headers.insert(
            ShortString::from(EXCHANGE_HEADER),
            AMQPValue::LongString(m.exchange.as_str().into()),
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

fn number(v: &AMQPValue) -> Option<u64> {
    match v {
        AMQPValue::LongLongInt(i) => u64::try_from(*i).ok(),
        AMQPValue::LongInt(i) => u64::try_from(*i).ok(),
        AMQPValue::LongUInt(i) => Some(u64::from(*i)),
        AMQPValue::ShortInt(i) => u64::try_from(*i).ok(),
        AMQPValue::ShortUInt(i) => Some(u64::from(*i)),
        AMQPValue::Timestamp(i) => Some(*i),
        _ => None,
    }
}

/// The newest entry of RabbitMQ's `x-death` header (an array of tables, newest
/// first), with the delivery's `x-delivery-count`. `None` when there is no such
/// header, or it is not shaped as RabbitMQ writes it.
fn death(headers: &FieldTable) -> Option<Death> {
    let AMQPValue::FieldArray(entries) = headers.inner().get("x-death")? else {
        return None;
    };
    let AMQPValue::FieldTable(first) = entries.as_slice().first()? else {
        return None;
    };
    let field = |k: &str| first.inner().get(k);
    let routing_keys = match field("routing-keys") {
        Some(AMQPValue::FieldArray(keys)) => keys.as_slice().iter().filter_map(text).collect(),
        _ => Vec::new(),
    };
    Some(Death {
        reason: field("reason").and_then(text).unwrap_or_default(),
        count: field("count").and_then(number).unwrap_or(0),
        queue: field("queue").and_then(text).unwrap_or_default(),
        exchange: field("exchange").and_then(text).unwrap_or_default(),
        routing_keys,
        delivery_count: headers.inner().get("x-delivery-count").and_then(number),
    })
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
    let mut death = p.headers().as_ref().and_then(death);
    // Published to a shard: the exchange the message was written for, also where
    // the broker dead-lettered it from (a shard, the same one).
    let written_for = headers.remove(EXCHANGE_HEADER);
    if let (Some(x), Some(death)) = (&written_for, death.as_mut()) {
        death.exchange.clone_from(x);
    }
    Envelope {
        message_id: p.message_id().as_ref().map(|s| s.as_str().to_owned()),
        exchange: written_for.unwrap_or_else(|| d.exchange.as_str().to_owned()),
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
        death,
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldArray;

    use super::*;

    #[test]
    fn the_newest_x_death_entry_is_read() {
        let entry = |reason: &str, count: i64| {
            let mut t = FieldTable::default();
            t.insert("reason".into(), AMQPValue::LongString(reason.into()));
            t.insert("count".into(), AMQPValue::LongLongInt(count));
            t.insert("queue".into(), AMQPValue::LongString("billing".into()));
            t.insert("exchange".into(), AMQPValue::LongString("shop".into()));
            t.insert(
                "routing-keys".into(),
                AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString(
                    "order.created".into(),
                )])),
            );
            AMQPValue::FieldTable(t)
        };
        let mut headers = FieldTable::default();
        headers.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![
                entry("delivery_limit", 1),
                entry("rejected", 2),
            ])),
        );
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(4));
        let d = death(&headers).expect("x-death");
        assert_eq!(d.reason, "delivery_limit");
        assert_eq!(d.count, 1);
        assert_eq!((d.queue.as_str(), d.exchange.as_str()), ("billing", "shop"));
        assert_eq!(d.routing_keys, ["order.created"]);
        assert_eq!(d.delivery_count, Some(4));
        let text = d.to_string();
        assert!(
            text.contains("delivery_limit") && text.contains("count 1"),
            "{text}"
        );
        let mut odd = FieldTable::default();
        odd.insert(
            "x-death".into(),
            AMQPValue::LongString("not an array".into()),
        );
        assert_eq!(death(&odd), None, "an x-death of another shape is ignored");
        assert_eq!(death(&FieldTable::default()), None);
    }

    #[test]
    fn the_exchange_header_is_the_relays_alone() {
        let at = Timestamp::from_unix_timestamp(1_700_000_000).expect("valid");
        let m = outbox_core::NewMessage::new("orders", "order.created", b"{}".to_vec())
            .with_header(EXCHANGE_HEADER, "payments")
            .with_header("seq", "1")
            .into_message(outbox_core::MessageId::v7(at, [1; 10]), at);
        let header = |sharded: bool| {
            properties(&m, sharded)
                .expect("converts")
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get(EXCHANGE_HEADER).and_then(text))
        };
        // A producer's value never goes out: a consumer would take it as the exchange.
        assert_eq!(header(false), None);
        assert_eq!(header(true).as_deref(), Some("orders"));
    }
}
