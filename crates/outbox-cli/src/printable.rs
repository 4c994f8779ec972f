//! What the CLI prints of producers' and handlers' text (headers, bodies, errors):
//! control characters escaped, so that no terminal escape reaches the terminal.

/// `text` (a payload, a body, an error) on lines of its own: control characters
/// shown escaped as in [`printable`] (terminal escapes, carriage returns, DEL, C1),
/// but line breaks and tabs kept, which make the text readable.
pub(crate) fn printable_text(text: &str) -> String {
    text.split_inclusive(['\n', '\t'])
        .map(|piece| {
            let (body, end) = match piece.char_indices().last() {
                Some((at, c @ ('\n' | '\t'))) => (&piece[..at], Some(c)),
                _ => (piece, None),
            };
            let mut shown = printable(body);
            shown.extend(end);
            shown
        })
        .collect()
}

/// `text` on one line of a tab-separated listing: control characters (tabs,
/// newlines, terminal escapes) shown escaped.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}
