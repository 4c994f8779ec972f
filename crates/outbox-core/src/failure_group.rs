//! When two failures are the same failure: their errors are equal once ids,
//! numbers and quoted values are taken out. An operator sees "exchange \"orders-7\"
//! not found" and "exchange \"orders-9\" not found" as one group of two, not as two
//! errors of one each.

/// How much of an error is looked at: longer ones are grouped by their first
/// this many characters (an error that long differs early, if at all).
pub const GROUPED_CHARS: usize = 4_096;

/// `error` (its first [`GROUPED_CHARS`] characters) with what varies between
/// occurrences of one failure replaced by a placeholder: text in double or single
/// quotes by `"…"` (its quotes kept; a quote right after a letter or digit is an
/// apostrophe, kept as it is; a quote left open runs to the end), UUIDs by `<id>`,
/// `0x` numbers and runs of 8 or more hexadecimal digits holding both a digit and a
/// letter by `<hex>`, other runs of digits by `<n>` (digits that end a word, as in
/// `v2`, stay); whitespace runs become one space and the ends are trimmed. The same
/// text always gives the same group, a group's text gives itself again, and the
/// work is linear in the text's length.
///
/// Letters, digits and whitespace are ASCII's (`[A-Za-z0-9_]` is a word,
/// ` \t\n\x0C\r` is space; any other character is kept as written): PostgreSQL
/// computes the same function for rows written by plain SQL (the adapter's
/// `outbox_failure_group`, migrations 20261222000001 to 3), without depending on the
/// database's locale, and the adapter's tests hold the two equal.
#[must_use]
pub fn failure_group(error: &str) -> String {
    let chars: Vec<char> = error.chars().take(GROUPED_CHARS).collect();
    let mut out = String::with_capacity(error.len().min(GROUPED_CHARS));
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
        if c.is_ascii_whitespace() {
            if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
            i += 1;
            continue;
        }
        if c.is_ascii_hexdigit()
            && !word_before(&out)
            && let Some(end) = hex_value_at(&chars, i)
        {
            out.push_str(if end - i == UUID_CHARS && is_uuid(&chars[i..end]) {
                "<id>"
            } else {
                "<hex>"
            });
            i = end;
            continue;
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
    out.trim_end_matches(' ').to_owned()
}

const UUID_CHARS: usize = 36;

/// The longest hexadecimal run looked at (a longer one is a word, kept as written).
const HEX_LOOKAHEAD: usize = 64;

/// Where a UUID, a `0x` number or a long hexadecimal run starting at `i` ends, if
/// one does (and is not followed by more of a word).
fn hex_value_at(chars: &[char], i: usize) -> Option<usize> {
    let end = (i + UUID_CHARS).min(chars.len());
    if end - i == UUID_CHARS && is_uuid(&chars[i..end]) && !word_after(chars, end) {
        return Some(end);
    }
    let run_end = |from: usize| {
        from + chars[from..]
            .iter()
            .take(HEX_LOOKAHEAD)
            .take_while(|d| d.is_ascii_hexdigit())
            .count()
    };
    if chars[i] == '0' && chars.get(i + 1) == Some(&'x') {
        let end = run_end(i + 2);
        if end > i + 2 && !word_after(chars, end) {
            return Some(end);
        }
    }
    let end = run_end(i);
    let run = &chars[i..end];
    (run.len() >= 8
        && run.iter().any(char::is_ascii_digit)
        && run.iter().any(char::is_ascii_alphabetic)
        && !word_after(chars, end))
    .then_some(end)
}

/// The text written so far ends in a letter or digit: what comes next is inside a
/// word (`v2`, `abc123`, `can't`). Judged on what was written, not on the input, so
/// that a group's text is grouped as itself (`7"x"` gives `<n>"…"` both times).
fn word_before(out: &str) -> bool {
    out.chars()
        .next_back()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A letter or digit at `i`: the run before it is part of a word.
fn word_after(chars: &[char], i: usize) -> bool {
    chars
        .get(i)
        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
}

/// `8-4-4-4-12` hexadecimal digits.
fn is_uuid(chars: &[char]) -> bool {
    chars.len() == UUID_CHARS
        && chars.iter().enumerate().all(|(k, c)| {
            if matches!(k, 8 | 13 | 18 | 23) {
                *c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
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
            ("at 0x7f3a9c00 and 0xFF", "at <hex> and <hex>"),
            ("row 9999999 and row 10000000", "row <n> and row <n>"),
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

        /// Of any number of digits (a random u64 shifted right by a random amount).
        #[test]
        fn numbers_never_tell_two_errors_apart(
            a in any::<u64>(), b in any::<u64>(), sa in 0_u32..64, sb in 0_u32..64,
        ) {
            let (a, b) = (a >> sa, b >> sb);
            prop_assert_eq!(
                failure_group(&format!("handler failed with status {a} at row {b}")),
                failure_group(&format!("handler failed with status {b} at row {a}"))
            );
        }
    }
}

#[cfg(test)]
mod bounds {
    use super::*;

    #[test]
    fn long_texts_are_grouped_by_their_start_in_linear_time() {
        // Dashes restart no scan: 200,000 characters of `a-1-` take no time.
        let long = "a-1-".repeat(50_000);
        let started = std::time::Instant::now();
        let group = failure_group(&long);
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert!(
            group.chars().count() <= GROUPED_CHARS * 3,
            "{}",
            group.len()
        );
        assert_eq!(failure_group(&long), failure_group(&format!("{long}tail")));
        // A hexadecimal word longer than the lookahead stays a word.
        let word = "a1".repeat(40);
        assert_eq!(failure_group(&word), word);
    }
}
