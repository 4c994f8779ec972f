//! Human-readable durations for configuration files: `"250ms"`, `"3s"`, `"1m"`,
//! `"2h"`, `"7d"`, or a bare number of milliseconds.
//!
//! Kept here (a dozen lines) rather than as a dependency because outbox-core must stay
//! tiny; `serde(with = "outbox_core::duration")` uses it on config fields.

use std::time::Duration;

/// Parses a duration written as an integer followed by `ms`, `s`, `m`, `h` or `d`.
/// A bare integer is taken as milliseconds.
///
/// # Errors
/// Returns a message naming the input when it is empty, not a number, has an unknown
/// unit, or overflows.
pub fn parse(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "invalid duration {text:?}: expected a number with a unit such as 500ms, 3s, 1m, 2h, 7d"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: number too large"))?;
    let millis_per_unit: u64 = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(format!(
                "invalid duration {text:?}: unknown unit {other:?} (use ms, s, m, h or d)"
            ));
        }
    };
    n.checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("invalid duration {text:?}: too large"))
}

/// Formats a duration in the largest unit that represents it exactly.
#[must_use]
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms != 0 && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Serde `serialize` half of `#[serde(with = "outbox_core::duration")]`.
///
/// # Errors
/// Only those of the serializer.
pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(*d))
}

/// Serde `deserialize` half of `#[serde(with = "outbox_core::duration")]`: accepts a
/// string such as `"3s"` or an integer number of milliseconds.
///
/// # Errors
/// When the value is neither, or does not parse (see [`parse`]).
pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = Duration;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as \"500ms\", \"3s\", \"1m\", \"7d\"")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
            parse(v).map_err(E::custom)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
            Ok(Duration::from_millis(v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
            u64::try_from(v)
                .map(Duration::from_millis)
                .map_err(|_| E::custom("a duration cannot be negative"))
        }
    }
    d.deserialize_any(V)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse("42"), Ok(Duration::from_millis(42)));
    }

    #[test]
    fn rejects_garbage_with_the_input_in_the_message() {
        for bad in ["", "s", "3 weeks", "-1s", "1.5s", "99999999999999999999d"] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(ms in 0u64..10_000_000_000) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
