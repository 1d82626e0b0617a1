//! Text that fits the terminal: its width, words wrapped with a hanging indent, and tables
//! whose columns are as wide as their content.

/// Width used when neither the terminal nor `$COLUMNS` says: wide enough for the tables, narrow
/// enough for a split window.
pub const DEFAULT_WIDTH: usize = 100;

/// The width of the terminal on stdout, else `$COLUMNS`, else [`DEFAULT_WIDTH`].
pub fn width() -> usize {
    width_from(terminal_columns(libc::STDOUT_FILENO), std::env::var("COLUMNS").ok().as_deref())
}

/// The same for what goes to stderr (the plans printed before a run).
pub fn stderr_width() -> usize {
    width_from(terminal_columns(libc::STDERR_FILENO), std::env::var("COLUMNS").ok().as_deref())
}

/// The terminal's answer first, then `$COLUMNS` (a positive number), then the default.
pub fn width_from(terminal: Option<usize>, columns: Option<&str>) -> usize {
    terminal
        .or_else(|| columns.and_then(|c| c.trim().parse::<usize>().ok()).filter(|&c| c > 0))
        .unwrap_or(DEFAULT_WIDTH)
}

/// Columns of the terminal on `fd`, when it is one and knows its size.
fn terminal_columns(fd: libc::c_int) -> Option<usize> {
    // SAFETY: TIOCGWINSZ only writes a winsize into the zeroed struct we own; on a file or pipe
    // it fails with ENOTTY and writes nothing.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0).then_some(size.ws_col as usize)
}

/// Characters as the terminal counts them (every character mm-probe prints is one column wide).
fn columns(text: &str) -> usize {
    text.chars().count()
}

/// `text` (one line, its own leading indentation kept) broken at spaces into lines of at most
/// `width` columns, each continuation indented by `indent` spaces (fewer where a word would not
/// fit after them); every line ends with a newline. A word longer than a whole line stays whole:
/// cutting a path or symbol helps nobody.
pub fn wrap(text: &str, width: usize, indent: usize) -> String {
    let mut out = String::new();
    let mut rest = text.trim_end();
    let mut prefix = String::new();
    loop {
        let room = width.saturating_sub(columns(&prefix));
        if columns(rest) <= room {
            out += &prefix;
            out += rest;
            out.push('\n');
            return out;
        }
        let (line, tail) = split_at_room(rest, room);
        out += &prefix;
        out += line.trim_end();
        out.push('\n');
        rest = tail.trim_start();
        if rest.is_empty() {
            return out;
        }
        // Indent less where a word would not fit after the full indent (a narrow terminal
        // under a wide table column).
        let longest = rest.split(' ').map(columns).max().unwrap_or(0);
        prefix = " ".repeat(indent.min(width.saturating_sub(longest)));
    }
}

/// How far past its own indentation a wrapped line's continuations start: enough to see that
/// they continue it, little enough to keep the room.
const CONTINUATION_INDENT: usize = 2;

/// Every line of `text` that is wider than `width` wrapped at spaces, its continuations indented
/// past the line's own indentation; lines that fit (tables, already fitted) are left as they are.
/// The one pass every command's text output goes through before it is printed.
pub fn fit(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if columns(line) <= width {
            out += line;
            out.push('\n');
        } else {
            let own_indent = line.len() - line.trim_start_matches(' ').len();
            out += &wrap(line, width, own_indent + CONTINUATION_INDENT);
        }
    }
    if !text.ends_with('\n') && out.ends_with('\n') {
        out.pop();
    }
    out
}

/// Prints `text` on stdout, fitted to the terminal ([`width`]).
pub fn print(text: &str) {
    print!("{}", fit(text, width()));
}

/// Prints `text` on stdout as one line block, fitted, with a newline after it.
pub fn println(text: &str) {
    println!("{}", fit(text, width()));
}

/// Prints `text` on stderr, fitted to the terminal there ([`stderr_width`]).
pub fn eprint(text: &str) {
    eprint!("{}", fit(text, stderr_width()));
}

/// A note on stderr (what happened to the run, not a failure), fitted, with a newline after it.
pub fn eprintln(text: &str) {
    eprintln!("{}", fit(text, stderr_width()));
}

/// The longest start of `text` that ends before a space and fits `room` columns, and the rest;
/// when even the first word does not fit, that word. Spaces at the start (indentation) never
/// count as a break.
fn split_at_room(text: &str, room: usize) -> (&str, &str) {
    let body_start = text.len() - text.trim_start().len();
    let mut last_fit = None;
    let mut first_after = None;
    for (column, (index, c)) in text.char_indices().enumerate() {
        if c != ' ' || index <= body_start {
            continue;
        }
        if column <= room {
            last_fit = Some(index);
        } else {
            first_after = Some(index);
            break;
        }
    }
    match last_fit.or(first_after) {
        Some(index) => text.split_at(index),
        None => (text, ""),
    }
}

/// The columns of a table: every column but the last as wide as its widest cell (header
/// included), two spaces apart, after `indent` spaces; the last column takes what is left and
/// wraps under its own start.
#[derive(Clone, Debug)]
pub struct Columns {
    widths: Vec<usize>,
    indent: usize,
}

impl Columns {
    pub fn fit<S: AsRef<str>>(header: &[&str], rows: &[Vec<S>], indent: usize) -> Self {
        let mut widths: Vec<usize> = header.iter().map(|h| columns(h)).collect();
        let fixed = widths.len().saturating_sub(1);
        for row in rows {
            for (i, cell) in row.iter().enumerate().take(fixed) {
                widths[i] = widths[i].max(columns(cell.as_ref()));
            }
        }
        Self { widths, indent }
    }

    /// Where column `n` (from 0) starts: notes under a row are indented to a column.
    pub fn start(&self, n: usize) -> usize {
        self.indent + self.widths.iter().take(n).map(|w| w + 2).sum::<usize>()
    }

    /// One row (or the header), wrapped to `width`.
    pub fn line<S: AsRef<str>>(&self, cells: &[S], width: usize) -> String {
        let mut text = " ".repeat(self.indent);
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 < cells.len() {
                text += &format!("{:<w$}  ", cell.as_ref(), w = self.widths.get(i).copied().unwrap_or(0));
            } else {
                text += cell.as_ref();
            }
        }
        wrap(&text, width, self.start(cells.len().saturating_sub(1)))
    }
}

/// A whole table: the header, then the rows, each wrapped to `width`.
pub fn table<S: AsRef<str>>(header: &[&str], rows: &[Vec<S>], width: usize, indent: usize) -> String {
    let columns = Columns::fit(header, rows, indent);
    let mut out = columns.line(header, width);
    for row in rows {
        out += &columns.line(row, width);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_width_is_the_terminal_then_columns_then_a_hundred() {
        assert_eq!(width_from(Some(132), Some("80")), 132);
        assert_eq!(width_from(None, Some("80")), 80);
        assert_eq!(width_from(None, Some(" 72\n")), 72);
        assert_eq!(width_from(None, Some("0")), DEFAULT_WIDTH);
        assert_eq!(width_from(None, Some("wide")), DEFAULT_WIDTH);
        assert_eq!(width_from(None, None), DEFAULT_WIDTH);
    }

    #[test]
    fn wrapping_keeps_every_line_within_the_width_and_indents_continuations() {
        let text = "  MISS  kvm_age_hva  lost: how often KVM ages guest memory, and which VMs keep pages young";
        let wrapped = wrap(text, 40, 8);
        for line in wrapped.lines() {
            assert!(columns(line) <= 40, "{line:?} is wider than 40: {wrapped}");
        }
        let lines: Vec<&str> = wrapped.lines().collect();
        assert!(lines[0].starts_with("  MISS  kvm_age_hva  lost:"), "the first line keeps its spacing: {wrapped}");
        assert!(lines[1..].iter().all(|l| l.starts_with("        ") && !l.starts_with("         ")), "{wrapped}");
        let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(words(&wrapped), words(text), "no word lost or cut");
    }

    #[test]
    fn a_line_that_fits_is_left_alone_and_a_long_word_stays_whole() {
        assert_eq!(wrap("  ok  short", 40, 4), "  ok  short\n");
        let path = "/sys/kernel/debug/tracing/events/kvm/kvm_age_hva/format";
        let wrapped = wrap(&format!("see {path} for it"), 20, 2);
        assert!(wrapped.lines().any(|l| l.trim() == path), "{wrapped}");
        assert_eq!(wrapped.lines().count(), 3, "{wrapped}");
    }

    #[test]
    fn a_long_word_under_a_deep_indent_moves_left_rather_than_past_the_width() {
        let wrapped = wrap("  ok  walk  tracepoint on mmu_notifier:invalidate_range_start", 40, 30);
        assert!(wrapped.lines().all(|l| columns(l) <= 40), "{wrapped}");
        assert!(wrapped.lines().any(|l| l.trim() == "mmu_notifier:invalidate_range_start"), "{wrapped}");
    }

    #[test]
    fn fitting_wraps_only_the_lines_that_are_too_wide_and_keeps_their_indentation() {
        let long = format!("    verdict: {}", "the walk held the CPU ".repeat(8));
        let text = format!("short\n{long}\n  also short\n");
        let fitted = fit(&text, 40);
        assert!(fitted.lines().all(|l| columns(l) <= 40), "{fitted}");
        let lines: Vec<&str> = fitted.lines().collect();
        assert_eq!(lines[0], "short");
        assert!(lines[1].starts_with("    verdict: the walk"), "{fitted}");
        assert!(lines[2].starts_with("      ") && !lines[2].starts_with("       "), "{fitted}");
        assert_eq!(*lines.last().unwrap(), "  also short");
        assert!(fitted.ends_with('\n'));
        let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(words(&fitted), words(&text), "no word lost or cut");
        assert_eq!(fit("no newline at the end", 40), "no newline at the end");
        assert_eq!(fit("a\n\nb\n", 40), "a\n\nb\n", "blank lines stay");
    }

    #[test]
    fn table_columns_start_where_their_header_starts() {
        let rows = vec![
            vec!["ok".to_string(), "hmm_range_fault walk".into(), "kprobe on hmm_range_fault".into()],
            vec!["MISS".to_string(), "kvm_age_hva".into(), "lost: aging of guest memory".into()],
        ];
        let header = ["STATUS", "PROBE", "ATTACHED AS"];
        let text = table(&header, &rows, 100, 2);
        let lines: Vec<&str> = text.lines().collect();
        let starts = |line: &str, cells: &[&str]| -> Vec<usize> {
            let mut from = 0;
            cells
                .iter()
                .map(|c| {
                    let at = from + line[from..].find(c).unwrap();
                    from = at + c.len();
                    at
                })
                .collect()
        };
        let header_starts = starts(lines[0], &header);
        for (line, row) in lines[1..].iter().zip(&rows) {
            let cells: Vec<&str> = row.iter().map(String::as_str).collect();
            assert_eq!(starts(line, &cells), header_starts, "{text}");
        }
        assert_eq!(header_starts, [2, 10, 32]);
        assert_eq!(Columns::fit(&header, &rows, 2).start(2), 32);
    }

    #[test]
    fn a_wrapped_last_column_continues_under_its_own_start() {
        let rows = vec![vec!["fentry".to_string(), "unavailable: the kernel refused to load it (EPERM)".into()]];
        let text = table(&["TYPE", "RESULT"], &rows, 40, 2);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() > 2, "{text}");
        let start = Columns::fit(&["TYPE", "RESULT"], &rows, 2).start(1);
        for line in &lines[2..] {
            assert_eq!(line.len() - line.trim_start().len(), start, "{text}");
        }
        assert!(lines.iter().all(|l| columns(l) <= 40), "{text}");
    }
}
