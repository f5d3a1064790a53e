//! Making text that came from outside Sluice — a plugin's error message or topic name, a row's
//! column — safe to store in the database and to write to logs and terminals.
//!
//! PostgreSQL refuses a NUL byte in `text`; a terminal interprets escape sequences; a log
//! collector chokes on multi-megabyte lines. Every guest-influenced string goes through
//! [`bounded`] before it is stored or logged. And [`toml_scalar`]: configuration values as
//! the text libraries expect; [`error_chain`]: an error with the causes its message leaves out.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Longest guest-influenced text kept in a log line or an error message, in bytes.
pub const MAX_LOGGED: usize = 1_024;
/// Longest text stored in `last_error`, in bytes.
pub const MAX_STORED: usize = 2_000;

/// `text` scrubbed of the configuration's secrets (see [`crate::secret`]; first, while a
/// secret is still whole), with control characters (NUL, escapes, C1 controls; tab and newline
/// become a space) written as `\u{…}` escapes, cut to at most `max` bytes (plus a trailing
/// `…` and the number of bytes left out). Borrowed when nothing needed changing.
pub fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    match crate::secret::scrub(text) {
        Cow::Borrowed(text) => escaped_and_cut(text, max),
        Cow::Owned(scrubbed) => Cow::Owned(escaped_and_cut(&scrubbed, max).into_owned()),
    }
}

fn escaped_and_cut(text: &str, max: usize) -> Cow<'_, str> {
    let clean = text.len() <= max && !text.chars().any(needs_escape);
    if clean {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(max) + 16);
    let mut consumed = 0;
    for c in text.chars() {
        let before = out.len();
        match c {
            '\t' | '\n' | '\r' => out.push(' '),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
        if out.len() > max {
            out.truncate(before);
            break;
        }
        consumed += c.len_utf8();
    }
    if consumed < text.len() {
        let _ = write!(out, "… ({} more bytes)", text.len() - consumed);
    }
    Cow::Owned(out)
}

/// Like [`bounded`], but keeps the *end* of `text` (where a traceback's message is): at most
/// `max` bytes, after a leading `…` and the number of bytes left out.
pub fn bounded_tail(text: &str, max: usize) -> String {
    let escaped = bounded(text, usize::MAX);
    if escaped.len() <= max {
        return escaped.into_owned();
    }
    let mut start = escaped.len() - max;
    while !escaped.is_char_boundary(start) {
        start += 1;
    }
    format!("…({} bytes before) {}", start, &escaped[start..])
}

/// A TOML scalar (string, number, boolean) as the text a library expects (librdkafka
/// properties, a plugin's `configure` pairs); `None` for tables, arrays and dates.
pub fn toml_scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn needs_escape(c: char) -> bool {
    c.is_control()
}

/// The error and its causes, `: `-separated, each cause left out when the text so far already
/// says it. Many errors (sqlx's, and ours that wrap them) repeat their cause in their own
/// message, and `{:#}` would print it two or three times; others (reqwest's) leave out the
/// cause that says what went wrong, e.g. `certificate verify failed`.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut next = Some(error);
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Like reqwest's errors: the message does not say why; the cause does.
    #[derive(Debug, thiserror::Error)]
    #[error("error sending request")]
    struct Terse(#[source] std::io::Error);

    /// Like sqlx's: the message repeats its cause.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect: {0}")]
    struct Verbose(#[source] Terse);

    #[test]
    fn an_error_chain_adds_the_causes_a_message_leaves_out_and_no_cause_twice() {
        let io = || std::io::Error::other("certificate verify failed");
        assert_eq!(
            error_chain(&Terse(io())),
            "error sending request: certificate verify failed"
        );
        assert_eq!(
            error_chain(&Verbose(Terse(io()))),
            "cannot connect: error sending request: certificate verify failed"
        );
        assert_eq!(error_chain(&io()), "certificate verify failed");
    }

    #[test]
    fn secrets_are_scrubbed_before_newlines_are_folded_and_long_text_is_cut() {
        // A PEM-like secret: several lines, longer than what is kept.
        let secret = format!("Bounded-Secret\n{}\nEND", "k".repeat(1_500));
        crate::secret::register([&secret]);
        let text = format!("upstream refused key {secret} for row 1");
        for max in [MAX_LOGGED, MAX_STORED] {
            let out = bounded(&text, max);
            assert_eq!(out, "upstream refused key [redacted] for row 1", "{max}");
        }
    }

    #[test]
    fn clean_short_text_is_borrowed() {
        assert!(matches!(bounded("order 42 failed", 100), Cow::Borrowed(_)));
    }

    #[test]
    fn nul_and_escape_sequences_are_escaped() {
        let t = bounded("bad\0row \u{1b}[31mred", 100);
        assert_eq!(t, "bad\\u{0}row \\u{1b}[31mred");
        assert!(!t.contains('\0'));
        assert_eq!(bounded("a\nb\tc", 100), "a b c");
    }

    #[test]
    fn a_tail_keeps_the_end_escaped() {
        assert_eq!(bounded_tail("short", 100), "short");
        let t = bounded_tail(&format!("{}\0end", "é".repeat(100)), 12);
        assert!(t.ends_with("é\\u{0}end"), "{t}");
        assert!(t.starts_with("…(") && t.contains("bytes before"), "{t}");
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary_and_says_how_much() {
        let s = "é".repeat(1000);
        let t = bounded(&s, 11);
        assert!(t.starts_with("ééééé…"), "{t}");
        assert!(t.ends_with("(1990 more bytes)"), "{t}");
        let nuls = "\0".repeat(10_000);
        assert!(bounded(&nuls, 100).len() < 140);
    }
}
