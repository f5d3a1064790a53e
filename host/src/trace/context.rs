//! W3C Trace Context as an outbox row carries it: the `traceparent` and `tracestate` values
//! (<https://www.w3.org/TR/trace-context/>), read from the row's `headers` or from a mapped
//! `trace_context` column in Debezium's Java-properties form (`traceparent=…` and
//! `tracestate=…` on separate lines) or as a bare `traceparent` value.
//!
//! Everything here is the application's input: a value that does not parse is not an error
//! of the row, only a context that is not passed on.

use std::fmt;

/// The header (and properties key) of the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The header (and properties key) of vendor trace state.
pub const TRACESTATE: &str = "tracestate";
/// Longest `tracestate` passed on: 32 members of at most 256 bytes plus commas is the
/// specification's bound; anything longer is dropped rather than cut mid-member.
const MAX_TRACESTATE: usize = 8_448;

/// A parsed `traceparent`: version 00's fields (a later version is read by its first four
/// fields, as the specification asks, and written back as version 00).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// The parent span: 8 bytes, not all zero.
    pub span_id: [u8; 8],
    /// Trace flags; bit 0 is `sampled`.
    pub flags: u8,
}

/// Why a `traceparent` value was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTraceParent {
    /// Not `version-traceid-spanid-flags` with the right lengths.
    #[error("traceparent is not version-traceid-spanid-flags")]
    Shape,
    /// A field is not lower-case hexadecimal.
    #[error("traceparent has a field that is not lower-case hex")]
    NotHex,
    /// Version `ff` is forbidden; version `00` must have exactly four fields.
    #[error("traceparent has an invalid version")]
    Version,
    /// The trace id or the parent id is all zeros.
    #[error("traceparent has an all-zero trace or span id")]
    ZeroId,
}

impl TraceParent {
    /// Whether the parent's sampled flag is set.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// Parses a `traceparent` value (surrounding whitespace ignored).
    pub fn parse(value: &str) -> Result<Self, InvalidTraceParent> {
        let value = value.trim();
        let mut fields = value.split('-');
        let (Some(version), Some(trace), Some(span), Some(flags)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(InvalidTraceParent::Shape);
        };
        if version.len() != 2 || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return Err(InvalidTraceParent::Shape);
        }
        let version = hex::<1>(version)?[0];
        // Version 00 has exactly four fields; a future version may add fields after them.
        if version == 0xff || (version == 0 && fields.next().is_some()) {
            return Err(InvalidTraceParent::Version);
        }
        let parent = Self {
            trace_id: hex(trace)?,
            span_id: hex(span)?,
            flags: hex::<1>(flags)?[0],
        };
        if parent.trace_id == [0; 16] || parent.span_id == [0; 8] {
            return Err(InvalidTraceParent::ZeroId);
        }
        Ok(parent)
    }

    /// The same trace with `span_id` as the parent (the relay's own span).
    pub fn child(&self, span_id: [u8; 8]) -> Self {
        Self { span_id, ..*self }
    }
}

impl fmt::Display for TraceParent {
    /// The version 00 header value, lower-case hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        self.trace_id
            .iter()
            .try_for_each(|b| write!(f, "{b:02x}"))?;
        f.write_str("-")?;
        self.span_id.iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        write!(f, "-{:02x}", self.flags)
    }
}

/// Lower-case hex of exactly `N` bytes (upper case is refused, as the specification says).
fn hex<const N: usize>(text: &str) -> Result<[u8; N], InvalidTraceParent> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(InvalidTraceParent::NotHex),
    };
    let bytes = text.as_bytes();
    if bytes.len() != 2 * N {
        return Err(InvalidTraceParent::Shape);
    }
    let mut out = [0; N];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Ok(out)
}

/// A row's trace context: its parent and the vendor state that travels with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowContext {
    /// The application's span the row was written in.
    pub parent: TraceParent,
    /// `tracestate`, passed on as it came (if within the specification's length).
    pub state: Option<String>,
}

/// The trace context found in a row's headers: `Ok(None)` when it has no `traceparent`,
/// `Err` when it has one that does not parse (names compared without regard to ASCII case,
/// as HTTP header names are).
pub fn from_headers(
    headers: &[(String, Vec<u8>)],
) -> Result<Option<RowContext>, InvalidTraceParent> {
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    };
    let Some(parent) = find(TRACEPARENT) else {
        return Ok(None);
    };
    let parent = std::str::from_utf8(parent)
        .map_err(|_| InvalidTraceParent::Shape)
        .and_then(TraceParent::parse)?;
    let state = find(TRACESTATE)
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE && s.is_ascii())
        .map(str::to_owned);
    Ok(Some(RowContext { parent, state }))
}

/// The `traceparent` and `tracestate` values in a `trace_context` column: Debezium's
/// Java-properties form (`traceparent=00-…`, `tracestate=…`, one per line; `#`/`!` comment
/// lines and `:` separators allowed), or a bare `traceparent` value. Values are returned as
/// written; [`TraceParent::parse`] judges them. `(None, None)` for an empty column.
pub fn from_column(text: &str) -> (Option<String>, Option<String>) {
    let text = text.trim();
    if text.is_empty() {
        return (None, None);
    }
    if !text.contains(['=', ':']) {
        return (Some(text.to_owned()), None);
    }
    let (mut parent, mut state) = (None, None);
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with(['#', '!']) {
            continue;
        }
        let Some(split) = line.find(['=', ':']) else {
            continue;
        };
        let (key, value) = (line[..split].trim(), line[split + 1..].trim());
        if key.eq_ignore_ascii_case(TRACEPARENT) {
            parent = Some(value.to_owned());
        } else if key.eq_ignore_ascii_case(TRACESTATE) {
            state = Some(value.to_owned());
        }
    }
    (parent, state)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn a_valid_traceparent_parses_and_prints_back_unchanged() {
        let parent = TraceParent::parse(VALID).unwrap();
        assert_eq!(parent.trace_id[0], 0x4b);
        assert_eq!(parent.span_id[7], 0xb7);
        assert!(parent.sampled());
        assert_eq!(parent.to_string(), VALID);
        let unsampled = TraceParent::parse(&VALID.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled());
        assert_eq!(TraceParent::parse(&format!("  {VALID}\n")).unwrap(), parent);
    }

    #[test]
    fn a_child_keeps_the_trace_and_flags_and_names_the_new_parent() {
        let parent = TraceParent::parse(VALID).unwrap();
        let child = parent.child([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            child.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0102030405060708-01"
        );
    }

    #[test]
    fn invalid_traceparents_are_refused_with_their_reason() {
        use InvalidTraceParent::*;
        for (value, why) in [
            ("", Shape),
            ("garbage", Shape),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                Shape,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                Shape,
            ),
            (
                "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Shape,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                NotHex,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
                NotHex,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                NotHex,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Version,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                Version,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                ZeroId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                ZeroId,
            ),
        ] {
            assert_eq!(TraceParent::parse(value), Err(why), "{value:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields_and_written_as_00() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever";
        assert_eq!(TraceParent::parse(later).unwrap().to_string(), VALID);
    }

    #[test]
    fn headers_give_the_context_names_compared_without_case() {
        let found = from_headers(&headers(&[
            ("a", "1"),
            ("TraceParent", VALID),
            ("tracestate", "congo=t61rcWkgMzE"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(found.parent.to_string(), VALID);
        assert_eq!(found.state.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(from_headers(&headers(&[("a", "1")])), Ok(None));
        assert_eq!(
            from_headers(&headers(&[("traceparent", "00-zz")])),
            Err(InvalidTraceParent::Shape)
        );
        let no_state = from_headers(&headers(&[("traceparent", VALID), ("tracestate", " ")]));
        assert_eq!(no_state.unwrap().unwrap().state, None);
    }

    #[test]
    fn the_column_is_read_in_debeziums_properties_form_or_bare() {
        let properties =
            format!("#Mon Dec 07 10:00:00 UTC 2026\ntraceparent={VALID}\ntracestate=congo=t61\n");
        assert_eq!(
            from_column(&properties),
            (Some(VALID.to_owned()), Some("congo=t61".to_owned()))
        );
        assert_eq!(
            from_column(&format!("tracestate = a=b\r\ntraceparent : {VALID}")),
            (Some(VALID.to_owned()), Some("a=b".to_owned()))
        );
        assert_eq!(from_column(VALID), (Some(VALID.to_owned()), None));
        assert_eq!(from_column("  "), (None, None));
        assert_eq!(from_column("other=1"), (None, None));
    }
}
