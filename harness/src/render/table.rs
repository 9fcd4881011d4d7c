//! Plain tables for terminals: aligned text, wrapped to a width (markdown tables are
//! `attn_results::markdown::table`).

/// Columns padded to their widest cell, a dashed rule under the header.
pub fn text(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    out.push_str(&line(header.to_vec()));
    out.push('\n');
    out.push_str(
        &widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  "),
    );
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// `text` wrapped at word boundaries to fit `width` columns: the widest columns give way
/// first (to no less than 12), and a cell too long for its column continues on the next
/// lines, indented under it.
pub fn text_wrapped(header: &[&str], rows: &[Vec<String>], width: usize) -> String {
    const GAP: usize = 2;
    const MIN: usize = 12;
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let total = |w: &[usize]| w.iter().sum::<usize>() + GAP * w.len().saturating_sub(1);
    while total(&widths) > width {
        let Some((i, &widest)) = widths.iter().enumerate().max_by_key(|&(_, w)| *w) else {
            break;
        };
        if widest <= MIN {
            break;
        }
        widths[i] -= 1;
    }
    let mut out = String::new();
    let mut emit = |cells: &[&str]| {
        let wrapped: Vec<Vec<String>> = cells
            .iter()
            .zip(&widths)
            .map(|(c, &w)| wrap(c, w))
            .collect();
        let height = wrapped.iter().map(Vec::len).max().unwrap_or(1);
        for line in 0..height {
            let text = wrapped
                .iter()
                .zip(&widths)
                .map(|(cell, &w)| format!("{:<w$}", cell.get(line).map_or("", String::as_str)))
                .collect::<Vec<_>>()
                .join(&" ".repeat(GAP));
            out.push_str(text.trim_end());
            out.push('\n');
        }
    };
    emit(header);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    emit(&rule.iter().map(String::as_str).collect::<Vec<_>>());
    for r in rows {
        emit(&r.iter().map(String::as_str).collect::<Vec<_>>());
    }
    out
}

/// `text` in lines of at most `width` characters, broken after spaces (a word longer than
/// `width` is cut).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_inclusive(' ') {
        let mut word = word;
        while word.trim_end().chars().count() > width {
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line).trim_end().to_string());
            }
            let cut = word
                .char_indices()
                .nth(width)
                .map_or(word.len(), |(i, _)| i);
            lines.push(word[..cut].to_string());
            word = &word[cut..];
        }
        if line.chars().count() + word.trim_end().chars().count() > width && !line.is_empty() {
            lines.push(std::mem::take(&mut line).trim_end().to_string());
        }
        line.push_str(word);
    }
    if !line.trim().is_empty() || lines.is_empty() {
        lines.push(line.trim_end().to_string());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapped_tables_fit_their_width() {
        let rows = vec![
            vec!["cpu".to_string(), "a b c ".repeat(40), "short".into()],
            vec!["x".to_string(), "y".repeat(150), String::new()],
        ];
        let t = text_wrapped(&["name", "long", "last"], &rows, 60);
        for line in t.lines() {
            assert!(line.chars().count() <= 60, "{line}");
        }
        assert!(t.contains("cpu") && t.contains("short"), "{t}");
        let all: String = t.split_whitespace().collect();
        assert_eq!(all.matches('y').count(), 150, "nothing is lost: {t}");
        let narrow = text_wrapped(&["a", "b"], &[vec!["1".into(), "2".into()]], 60);
        assert_eq!(narrow, text(&["a", "b"], &[vec!["1".into(), "2".into()]]));
    }

    #[test]
    fn words_wrap_at_spaces() {
        assert_eq!(wrap("alpha beta gamma", 11), vec!["alpha beta", "gamma"]);
        assert_eq!(wrap("", 5), vec![""]);
        assert_eq!(wrap("abcdefgh", 3), vec!["abc", "def", "gh"]);
    }
}
