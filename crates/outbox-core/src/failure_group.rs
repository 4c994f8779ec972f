//! When two failures are the same failure: their errors are equal once ids,
//! numbers and quoted values are taken out. An operator sees "exchange \"orders-7\"
//! not found" and "exchange \"orders-9\" not found" as one group of two, not as two
//! errors of one each.

/// `error` with what varies between occurrences of one failure replaced by a
/// placeholder: text in double or single quotes by `"…"` (its quotes kept; a quote
/// right after a letter is an apostrophe, kept as it is), UUIDs
/// by `<id>`, runs of hexadecimal digits of 8 or more that hold a digit by `<hex>`,
/// other runs of digits by `<n>` (digits that end a word, as in `v2`, stay);
/// whitespace runs become one space and the ends are
/// trimmed. A quote left open runs to the end of the text. The same text always
/// gives the same group, and a group's text gives itself again.
#[must_use]
pub fn failure_group(error: &str) -> String {
    let chars: Vec<char> = error.chars().collect();
    let mut out = String::with_capacity(error.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        // An opening quote, not an apostrophe inside a word ("can't").
        if (c == '"' || c == '\'') && !word_before(&out) {
            // To the closing quote (or the end).
            let close = chars[i + 1..].iter().position(|d| *d == c);
            out.push(c);
            out.push('…');
            out.push(c);
            i = close.map_or(chars.len(), |p| i + 1 + p + 1);
            continue;
        }
        if c.is_whitespace() {
            if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
            i += 1;
            continue;
        }
        if c.is_ascii_hexdigit() && !word_before(&out) {
            let end = chars[i..]
                .iter()
                .position(|d| !(d.is_ascii_hexdigit() || *d == '-'))
                .map_or(chars.len(), |p| i + p);
            let run: String = chars[i..end].iter().collect();
            let run = run.trim_end_matches('-');
            let len = run.chars().count();
            if !word_after(&chars, i + len) {
                if is_uuid(run) {
                    out.push_str("<id>");
                    i += len;
                    continue;
                }
                let hex = run.split('-').next().unwrap_or_default();
                let hex_len = hex.chars().count();
                if hex_len >= 8
                    && hex.chars().any(|d| d.is_ascii_digit())
                    && !word_after(&chars, i + hex_len)
                {
                    out.push_str("<hex>");
                    i += hex_len;
                    continue;
                }
            }
        }
        if c.is_ascii_digit() && !word_before(&out) {
            let end = chars[i..]
                .iter()
                .position(|d| !d.is_ascii_digit())
                .map_or(chars.len(), |p| i + p);
            out.push_str("<n>");
            i = end;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out.trim_end().to_owned()
}

/// The text written so far ends in a letter or digit: what comes next is inside a
/// word (`v2`, `abc123`, `can't`). Judged on what was written, not on the input, so
/// that a group's text is grouped as itself (`7"x"` gives `<n>"…"` both times).
fn word_before(out: &str) -> bool {
    out.chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// A letter or digit at `i`: the run before it is part of a word.
fn word_after(chars: &[char], i: usize) -> bool {
    chars
        .get(i)
        .is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// `8-4-4-4-12` hexadecimal digits.
fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn what_varies_is_taken_out() {
        let cases = [
            (
                "exchange \"orders-7\" not found",
                "exchange \"…\" not found",
            ),
            (
                "message 0190a3c4-5b6d-7e8f-9a0b-1c2d3e4f5a6b failed after 3 attempts",
                "message <id> failed after <n> attempts",
            ),
            (
                "timeout after 30s on 10.0.0.7:5672",
                "timeout after <n>s on <n>.<n>.<n>.<n>:<n>",
            ),
            ("key 'customer-42' is held", "key '…' is held"),
            ("couldn't reach 'db1'", "couldn't reach '…'"),
            ("  two   spaces\tand a tab  ", "two spaces and a tab"),
            ("trace deadbeef01 broken", "trace <hex> broken"),
            // Words with digits stay words; a short hex word stays.
            (
                "v2 of handler abc123 refused cafe",
                "v2 of handler abc123 refused cafe",
            ),
            ("unterminated \"quote runs on", "unterminated \"…\""),
            ("", ""),
        ];
        for (error, group) in cases {
            assert_eq!(failure_group(error), group, "{error:?}");
        }
    }

    #[test]
    fn errors_that_differ_in_values_share_a_group() {
        let a = failure_group("duplicate key value violates \"orders_pkey\": (id)=(17)");
        let b = failure_group("duplicate key value violates \"orders_pkey\": (id)=(90210)");
        assert_eq!(a, b);
        assert_ne!(a, failure_group("connection refused"));
    }

    proptest! {
        #[test]
        fn a_group_is_its_own_group(error in "\\PC{0,80}") {
            let group = failure_group(&error);
            prop_assert_eq!(failure_group(&group), group);
        }

        #[test]
        fn numbers_never_tell_two_errors_apart(a in 0_u64..u64::MAX, b in 0_u64..u64::MAX) {
            prop_assert_eq!(
                failure_group(&format!("handler failed with status {a} at row {b}")),
                failure_group(&format!("handler failed with status {b} at row {a}"))
            );
        }
    }
}
