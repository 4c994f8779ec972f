//! The operator commands' tables. As `gh` does: on a terminal, a header row and
//! aligned columns for a person; piped, tab-separated rows without a header, so
//! `cut -f1 | xargs ...` never meets a column name (`--json` is the stable form).
//! An empty table prints nothing either way.

use std::io::IsTerminal as _;

/// A table to print on stdout: its column names, then its rows.
pub(crate) struct Table {
    header: &'static [&'static str],
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &'static [&'static str]) -> Self {
        Self {
            header,
            rows: Vec::new(),
        }
    }

    /// A row; each cell's control characters are shown escaped (a cell is on
    /// one line, and no producer's text reaches the terminal as escapes).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(
            cells
                .iter()
                .map(|c| crate::printable::printable(c))
                .collect(),
        );
    }

    /// On stdout, as [`Table::render`] makes it for stdout.
    #[allow(clippy::print_stdout)] // the command's output
    pub(crate) fn print(&self) {
        print!("{}", self.render(std::io::stdout().is_terminal()));
    }

    /// The text: for a `terminal`, a header row and columns padded to their
    /// widest cell (two spaces between; the last column unpadded); else the rows
    /// tab-separated. Nothing for no rows.
    pub(crate) fn render(&self, terminal: bool) -> String {
        if self.rows.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        if !terminal {
            for row in &self.rows {
                out.push_str(&row.join("\t"));
                out.push('\n');
            }
            return out;
        }
        let header: Vec<String> = self.header.iter().map(|h| (*h).to_owned()).collect();
        let lines: Vec<&Vec<String>> = std::iter::once(&header).chain(&self.rows).collect();
        let columns = lines.iter().map(|l| l.len()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                lines
                    .iter()
                    .filter_map(|l| l.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for line in lines {
            let last = line.len().saturating_sub(1);
            let mut text = String::new();
            for (c, cell) in line.iter().enumerate() {
                text.push_str(cell);
                if c < last {
                    let pad = widths[c] - cell.chars().count() + 2;
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    fn sample() -> Table {
        let mut t = Table::new(&["ID", "STATUS", "ERROR"]);
        t.row(vec!["0190aa".into(), "dead".into(), "no route".into()]);
        t.row(vec!["01".into(), "publish_failed".into(), String::new()]);
        t
    }

    #[test]
    fn a_terminal_gets_a_header_and_aligned_columns() {
        assert_eq!(
            sample().render(true),
            "ID      STATUS          ERROR\n\
             0190aa  dead            no route\n\
             01      publish_failed\n"
        );
    }

    #[test]
    fn a_pipe_gets_tab_separated_rows_without_a_header() {
        assert_eq!(
            sample().render(false),
            "0190aa\tdead\tno route\n01\tpublish_failed\t\n"
        );
    }

    #[test]
    fn a_cell_never_carries_a_terminal_escape() {
        let mut t = Table::new(&["ERROR"]);
        t.row(vec!["\u{1b}[2Jgone\r\u{9b}31m".into()]);
        for terminal in [true, false] {
            let text = t.render(terminal);
            assert!(
                !text.chars().any(|c| c.is_control() && c != '\n'),
                "{text:?}"
            );
            assert!(text.contains(r"\u{1b}[2Jgone\r\u{9b}31m"), "{text:?}");
        }
    }

    #[test]
    fn an_empty_table_prints_nothing() {
        let t = Table::new(&["ID"]);
        assert_eq!(
            (t.render(true), t.render(false)),
            (String::new(), String::new())
        );
    }
}
