//! Text cleaning and the quality signals the filters use.

use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// Unicode NFC; control characters dropped (tab and newline kept, `\r\n` and lone `\r` become
/// `\n`); runs of spaces and tabs become one space; lines lose leading and trailing spaces;
/// more than one blank line in a row becomes one; the document is trimmed.
pub fn clean(text: &str) -> String {
    // Controls go first: one between a letter and its combining mark would block composition.
    let out = strip_controls_and_spaces(text);
    match is_nfc_quick(out.chars()) {
        IsNormalized::Yes => out,
        _ => out.nfc().collect(),
    }
}

fn strip_controls_and_spaces(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pending_space = false;
    let mut newlines = 0usize; // newlines pending since the last visible character
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let c = match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    continue;
                }
                '\n'
            }
            c => c,
        };
        if c == '\n' {
            newlines += 1;
            pending_space = false;
        } else if c.is_whitespace() {
            pending_space = true;
        } else if c.is_control() {
            // Dropped: NUL, escape sequences, form feeds …
        } else {
            if !out.is_empty() {
                if newlines > 0 {
                    out.push_str(if newlines > 1 { "\n\n" } else { "\n" });
                } else if pending_space {
                    out.push(' ');
                }
            }
            newlines = 0;
            pending_space = false;
            out.push(c);
        }
    }
    out
}

/// Fraction of non-whitespace characters that are neither letters nor digits.
pub fn non_alnum_fraction(text: &str) -> f64 {
    let (mut visible, mut other) = (0usize, 0usize);
    for c in text.chars().filter(|c| !c.is_whitespace()) {
        visible += 1;
        if !c.is_alphanumeric() {
            other += 1;
        }
    }
    if visible == 0 {
        1.0
    } else {
        other as f64 / visible as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn normalises_whitespace_controls_and_composition() {
        assert_eq!(clean("  a \t b\r\nc\u{0}d\n\n\n\n  e  \n"), "a b\ncd\n\ne");
        // "e" + combining acute becomes the precomposed "é".
        assert_eq!(clean("cafe\u{301}"), "caf\u{e9}");
        assert_eq!(clean("x\u{1b}[31my"), "x[31my");
        assert_eq!(clean("\u{a0}non\u{2003}breaking"), "non breaking");
    }

    #[test]
    fn non_alnum_fraction_counts_visible_characters() {
        assert_eq!(non_alnum_fraction("ab c"), 0.0);
        assert_eq!(non_alnum_fraction("a-b-"), 0.5);
        assert_eq!(non_alnum_fraction("  "), 1.0);
    }

    proptest! {
        #[test]
        fn cleaning_is_idempotent(s in "\\PC{0,200}|[ \\t\\r\\n\\x00-\\x1fa-z\u{301}]{0,100}") {
            let once = clean(&s);
            prop_assert_eq!(clean(&once), once.clone());
            prop_assert!(!once.starts_with(char::is_whitespace));
            prop_assert!(!once.contains("\n\n\n"));
            prop_assert!(!once.chars().any(|c| c.is_control() && c != '\n'));
        }
    }
}
