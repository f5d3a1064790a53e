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
/// Longest `tracestate` passed on, in bytes: the length the specification asks every vendor
/// to propagate at least, and past which the OpenTelemetry SDKs (Java's, for one) drop the
/// header on extraction; a longer one is dropped here rather than cut mid-member.
const MAX_TRACESTATE: usize = 512;
/// Most list-members of a `tracestate` (the specification's bound).
const MAX_TRACESTATE_MEMBERS: usize = 32;
/// Longest value [`from_column`] hands on as it came: a `trace_context` column may hold
/// anything, and its values become the row's headers, which a plugin may copy into its messages
/// (where they count towards `max_message_bytes`). Far above any valid value.
pub const MAX_COLUMN_VALUE: usize = 1_024;

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
    /// The row has several `traceparent` headers (names differing in case) that disagree;
    /// the specification treats a repeated `traceparent` as invalid.
    #[error("the row has several traceparent headers that disagree")]
    Repeated,
}

/// Why a `tracestate` value was not passed on (its `traceparent` still is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTraceState {
    /// Longer than [`MAX_TRACESTATE`] bytes.
    #[error("tracestate is longer than 512 bytes")]
    TooLong,
    /// More than 32 list-members.
    #[error("tracestate has more than 32 list-members")]
    TooManyMembers,
    /// A list-member is not `key=value` with a key and a value the specification allows
    /// (lower-case keys, printable ASCII values without `,` or `=`), or the value is not text.
    #[error("tracestate has a list-member that is not a valid key=value")]
    Member,
    /// Two list-members with the same key.
    #[error("tracestate has the same key twice")]
    DuplicateKey,
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
    /// `tracestate`, passed on as it came when valid.
    pub state: Option<String>,
    /// Why the row's `tracestate` was dropped, if it had one that is not valid.
    pub invalid_state: Option<InvalidTraceState>,
}

/// The trace context found in a row's headers: `Ok(None)` when it has no `traceparent`,
/// `Err` when it has one that does not parse, or several that disagree (names compared
/// without regard to ASCII case, as HTTP header names are). Several `tracestate` headers are
/// one list, joined with commas as HTTP joins repeated fields; an invalid one is dropped and
/// named in [`RowContext::invalid_state`].
pub fn from_headers(
    headers: &[(String, Vec<u8>)],
) -> Result<Option<RowContext>, InvalidTraceParent> {
    let values = |name: &'static str| {
        headers
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    };
    let parse = |value: &[u8]| {
        std::str::from_utf8(value)
            .map_err(|_| InvalidTraceParent::Shape)
            .and_then(TraceParent::parse)
    };
    let mut parents = values(TRACEPARENT);
    let Some(first) = parents.next() else {
        return Ok(None);
    };
    let parent = parse(first)?;
    for other in parents {
        if parse(other)? != parent {
            return Err(InvalidTraceParent::Repeated);
        }
    }
    let (state, invalid_state) = match tracestate(values(TRACESTATE)) {
        Ok(state) => (state, None),
        Err(why) => (None, Some(why)),
    };
    Ok(Some(RowContext {
        parent,
        state,
        invalid_state,
    }))
}

/// The `tracestate` list of `values` (its headers, in order): `None` when empty.
fn tracestate<'a>(
    values: impl Iterator<Item = &'a [u8]>,
) -> Result<Option<String>, InvalidTraceState> {
    let mut parts = Vec::new();
    for value in values {
        let text = std::str::from_utf8(value).map_err(|_| InvalidTraceState::Member)?;
        let text = text.trim_matches(|c: char| c.is_ascii_whitespace());
        if !text.is_empty() {
            parts.push(text);
        }
    }
    // Checked before joining: a huge value is refused without being copied.
    if parts.iter().map(|p| p.len() + 1).sum::<usize>() > MAX_TRACESTATE + 1 {
        return Err(InvalidTraceState::TooLong);
    }
    let state = parts.join(",");
    check_tracestate(&state)?;
    Ok((!state.is_empty()).then_some(state))
}

/// Whether `value` is a `tracestate` the specification allows: at most [`MAX_TRACESTATE`]
/// bytes and 32 list-members, each `key=value` with a valid key and value, keys unique; empty
/// list-members (and spaces or tabs around commas) allowed.
pub fn check_tracestate(value: &str) -> Result<(), InvalidTraceState> {
    if value.len() > MAX_TRACESTATE {
        return Err(InvalidTraceState::TooLong);
    }
    let mut keys: Vec<&str> = Vec::new();
    for member in value.split(',').map(|m| m.trim_matches([' ', '\t'])) {
        if member.is_empty() {
            continue;
        }
        let Some((key, value)) = member.split_once('=') else {
            return Err(InvalidTraceState::Member);
        };
        if !valid_key(key) || !valid_value(value) {
            return Err(InvalidTraceState::Member);
        }
        if keys.contains(&key) {
            return Err(InvalidTraceState::DuplicateKey);
        }
        if keys.len() == MAX_TRACESTATE_MEMBERS {
            return Err(InvalidTraceState::TooManyMembers);
        }
        keys.push(key);
    }
    Ok(())
}

/// A `tracestate` key: `simple-key` (a lower-case letter, then up to 255 of lower-case
/// letters, digits and `_-*/`) or `tenant@system` (up to 241 such characters starting with a
/// letter or digit, `@`, up to 14 starting with a letter).
fn valid_key(key: &str) -> bool {
    let starts = |s: &str, digit_ok: bool| {
        s.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || (digit_ok && b.is_ascii_digit()))
    };
    let rest = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/".contains(&b))
    };
    match key.split_once('@') {
        None => key.len() <= 256 && starts(key, false) && rest(key),
        Some((tenant, system)) => {
            tenant.len() <= 241
                && starts(tenant, true)
                && rest(tenant)
                && system.len() <= 14
                && starts(system, false)
                && rest(system)
        }
    }
}

/// A `tracestate` value: 1 to 256 printable ASCII characters other than `,` and `=`, the last
/// not a space.
fn valid_value(value: &str) -> bool {
    (1..=256).contains(&value.len())
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
        && !value.ends_with(' ')
}

/// The `traceparent` and `tracestate` values in a `trace_context` column: a bare `traceparent`
/// value, or Debezium's Java-properties form (`java.util.Properties.store`: `traceparent=00-…`
/// and `tracestate=…`, one per line, `=`, `:` and `\` in values escaped with `\`), read as
/// `Properties.load` reads it — `#`/`!` comment lines, `=`, `:` or white space between key and
/// value, `\` escapes (`\=`, `\:`, `\t`, `\uXXXX`, …), lines continued by a trailing `\`, any
/// line ending; a repeated key's last value counts. Keys are compared ignoring ASCII case.
/// `(None, None)` for an empty column.
///
/// Values are returned as written; [`TraceParent::parse`] and [`check_tracestate`] judge them.
/// One longer than [`MAX_COLUMN_VALUE`] bytes is returned shortened, with the same verdict: a
/// `traceparent` that parses as its version 00 form, anything else as a short text that
/// does not parse. So does a column Java could not load (a malformed `\u` escape).
pub fn from_column(text: &str) -> (Option<String>, Option<String>) {
    let text = text.trim();
    if text.is_empty() {
        return (None, None);
    }
    if !text.contains(['=', ':']) {
        return (Some(bounded_parent(text.to_owned())), None);
    }
    let (mut parent, mut state) = (None, None);
    for line in logical_lines(text) {
        let (key, value) = split_property(&line);
        let (Some(key), Some(value)) = (unescape(key), unescape(value)) else {
            return (Some(NOT_LOADABLE.to_owned()), None);
        };
        if key.eq_ignore_ascii_case(TRACEPARENT) {
            parent = Some(value);
        } else if key.eq_ignore_ascii_case(TRACESTATE) {
            state = Some(value);
        }
    }
    (parent.map(bounded_parent), state.map(bounded_state))
}

/// What [`from_column`] gives for a `traceparent` of a column Java's `Properties.load` refuses.
const NOT_LOADABLE: &str = "(trace_context is not in Java-properties form: malformed \\u escape)";

/// `parent`, or a short stand-in with the same verdict when it is longer than
/// [`MAX_COLUMN_VALUE`].
fn bounded_parent(parent: String) -> String {
    if parent.trim().len() <= MAX_COLUMN_VALUE {
        return parent;
    }
    TraceParent::parse(&parent).map_or_else(
        |_| format!("(traceparent not valid, longer than {MAX_COLUMN_VALUE} bytes)"),
        |p| p.to_string(),
    )
}

/// `state`, or a short stand-in that is not valid either when it is longer than
/// [`MAX_COLUMN_VALUE`] (so longer than [`MAX_TRACESTATE`]: never valid).
fn bounded_state(state: String) -> String {
    if state.trim().len() <= MAX_COLUMN_VALUE {
        return state;
    }
    format!("(tracestate not valid, longer than {MAX_COLUMN_VALUE} bytes)")
}

/// The logical lines of a properties text as `Properties.load` reads them: natural lines end
/// at `\n`, `\r` or `\r\n`; leading white space is skipped; blank and comment lines are
/// skipped; a line ending in an odd number of `\` continues on the next one (that `\` and the
/// next line's leading white space dropped).
fn logical_lines(text: &str) -> Vec<String> {
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\u{c}');
    let mut lines = Vec::new();
    let mut pending: Option<String> = None;
    // `\r\n` is one line end, not two (an empty line between would end a continued line).
    for natural in text.replace("\r\n", "\n").split(['\n', '\r']) {
        let natural = natural.trim_start_matches(is_space);
        let mut line = match pending.take() {
            Some(line) => line,
            None if natural.is_empty() || natural.starts_with(['#', '!']) => continue,
            None => String::new(),
        };
        let backslashes = natural.len() - natural.trim_end_matches('\\').len();
        if backslashes % 2 == 1 {
            line.push_str(&natural[..natural.len() - 1]);
            pending = Some(line);
        } else {
            line.push_str(natural);
            lines.push(line);
        }
    }
    lines.extend(pending);
    lines
}

/// A logical line's key and value, still escaped: the key ends at the first unescaped `=`,
/// `:` or white space; white space, one `=` or `:`, and white space again separate it from
/// the value.
fn split_property(line: &str) -> (&str, &str) {
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\u{c}');
    let mut escaped = false;
    let mut key_end = line.len();
    let mut separator = false;
    for (i, c) in line.char_indices() {
        if !escaped && (c == '=' || c == ':' || is_space(c)) {
            key_end = i;
            separator = c != '=' && c != ':';
            break;
        }
        escaped = c == '\\' && !escaped;
    }
    let key = &line[..key_end];
    let mut rest = line[key_end..].chars();
    // Past the key's own terminator (if it was `=`/`:`, that is the one separator allowed).
    let mut value = rest.as_str();
    if rest.next().is_some() {
        value = rest.as_str().trim_start_matches(is_space);
        if separator && let Some(after) = value.strip_prefix(['=', ':']) {
            value = after.trim_start_matches(is_space);
        }
    }
    (key, value)
}

/// `text` with `Properties.load`'s escapes resolved (`\t`, `\n`, `\r`, `\f`, `\uXXXX` as a
/// UTF-16 unit, any other `\c` as `c`); `None` for a malformed `\u` escape, which Java refuses.
fn unescape(text: &str) -> Option<String> {
    if !text.contains('\\') {
        return Some(text.to_owned());
    }
    let mut units: Vec<u16> = Vec::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        let c = match c {
            '\\' => match chars.next() {
                Some('u') => {
                    let hex: String = chars.by_ref().take(4).collect();
                    if hex.len() != 4 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return None;
                    }
                    units.push(u16::from_str_radix(&hex, 16).ok()?);
                    continue;
                }
                Some('t') => '\t',
                Some('n') => '\n',
                Some('r') => '\r',
                Some('f') => '\u{c}',
                Some(other) => other,
                None => break,
            },
            c => c,
        };
        let mut buffer = [0; 2];
        units.extend_from_slice(c.encode_utf16(&mut buffer));
    }
    Some(String::from_utf16_lossy(&units))
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

    #[test]
    fn repeated_traceparents_count_only_when_they_agree() {
        let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let same = from_headers(&headers(&[("traceparent", VALID), ("TRACEPARENT", VALID)]));
        assert_eq!(same.unwrap().unwrap().parent.to_string(), VALID);
        assert_eq!(
            from_headers(&headers(&[("traceparent", VALID), ("Traceparent", other)])),
            Err(InvalidTraceParent::Repeated)
        );
        assert_eq!(
            from_headers(&headers(&[("traceparent", VALID), ("Traceparent", "x")])),
            Err(InvalidTraceParent::Shape)
        );
    }

    #[test]
    fn a_later_version_may_carry_more_fields_version_00_may_not() {
        for value in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "fe-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-a-b-c",
        ] {
            assert_eq!(
                TraceParent::parse(value).unwrap().to_string(),
                VALID,
                "{value}"
            );
        }
        for value in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n-x",
        ] {
            assert!(TraceParent::parse(value).is_err(), "{value:?}");
        }
    }

    #[test]
    fn tracestate_is_checked_against_the_specification() {
        let ok = |s: &str| check_tracestate(s).is_ok();
        assert!(ok("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"));
        assert!(ok("a=1 , b=2,,\t"));
        assert!(ok("tenant1@sys=x,0t@s-1=v a l"));
        assert!(ok(""));
        let members = |n: usize| {
            (0..n)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert!(ok(&members(32)));
        use InvalidTraceState::*;
        for (value, why) in [
            (members(33), TooManyMembers),
            (format!("a={}", "x".repeat(511)), TooLong),
            ("Congo=x".to_owned(), Member),
            ("1abc=x".to_owned(), Member),
            ("a@b@c=x".to_owned(), Member),
            ("t@system-too-long=x".to_owned(), Member),
            ("a=".to_owned(), Member),
            ("a=b=c".to_owned(), Member),
            ("a=b\r\nx=y".to_owned(), Member),
            ("a=caf\u{e9}".to_owned(), Member),
            ("novalue".to_owned(), Member),
            ("a=1,a=2".to_owned(), DuplicateKey),
        ] {
            assert_eq!(check_tracestate(&value), Err(why), "{value:?}");
        }
    }

    #[test]
    fn an_invalid_tracestate_is_dropped_and_named_the_traceparent_kept() {
        let found = from_headers(&headers(&[
            ("traceparent", VALID),
            ("tracestate", "a=b\nc=d"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(found.parent.to_string(), VALID);
        assert_eq!(found.state, None);
        assert_eq!(found.invalid_state, Some(InvalidTraceState::Member));
        // Two tracestate headers are one list, as HTTP joins them.
        let joined = from_headers(&headers(&[
            ("traceparent", VALID),
            ("tracestate", "a=1 "),
            ("TraceState", "b=2"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(joined.state.as_deref(), Some("a=1,b=2"));
        assert_eq!(joined.invalid_state, None);
        let long = format!("a={}", "x".repeat(1 << 20));
        let huge = from_headers(&headers(&[("traceparent", VALID), ("tracestate", &long)]));
        assert_eq!(
            huge.unwrap().unwrap().invalid_state,
            Some(InvalidTraceState::TooLong)
        );
    }

    #[test]
    fn the_column_is_read_as_javas_properties_load_reads_it() {
        let parent = || Some(VALID.to_owned());
        // What `Properties.store` writes: `=` (and `:`, `#`, `!`) in values escaped.
        let stored = format!(
            "#Sun Dec 06 17:54:30 UTC 2026\r\ntraceparent={VALID}\r\ntracestate=congo\\=t61rcWkgMzE,rojo\\=00f067aa0ba902b7\r\n"
        );
        assert_eq!(
            from_column(&stored),
            (
                parent(),
                Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7".to_owned())
            )
        );
        // Separators: white space, `:`; a lone CR ends a line; `\u` escapes; continued lines.
        assert_eq!(
            from_column(&format!(
                "tracestate a\\u003d1\rtraceparent:{}\\\n   {}",
                &VALID[..20],
                &VALID[20..]
            )),
            (parent(), Some("a=1".to_owned()))
        );
        // A continued line's next line is not a comment, even if it starts with `#`.
        assert_eq!(
            from_column("tracestate=a\\=1,\\\n#b\\=2"),
            (None, Some("a=1,#b=2".to_owned()))
        );
        // Repeated: the last value counts, as in Java.
        let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert_eq!(
            from_column(&format!("traceparent={other}\ntraceparent={VALID}")).0,
            parent()
        );
        // An escaped separator belongs to the key.
        assert_eq!(from_column(&format!("traceparent\\={VALID}")), (None, None));
        // A malformed `\u` escape: Java refuses the whole text; not a valid context here.
        let (bad, state) = from_column(&format!("traceparent={VALID}\ntracestate=a\\u00"));
        assert!(TraceParent::parse(&bad.unwrap()).is_err());
        assert_eq!(state, None);
    }

    #[test]
    fn a_huge_column_value_is_shortened_keeping_its_verdict() {
        let padded = format!("{VALID}{}x", " ".repeat(1 << 20));
        let (bad, _) = from_column(&format!("traceparent={padded}"));
        let bad = bad.unwrap();
        assert!(bad.len() <= MAX_COLUMN_VALUE, "{}", bad.len());
        assert!(TraceParent::parse(&bad).is_err());
        let later = format!("01-{}-{}", &VALID[3..], "x".repeat(1 << 20));
        let (good, _) = from_column(&later);
        assert_eq!(good.as_deref(), Some(VALID));
        let (_, state) = from_column(&format!(
            "traceparent={VALID}\ntracestate=a={}",
            "x".repeat(1 << 20)
        ));
        let state = state.unwrap();
        assert!(state.len() <= MAX_COLUMN_VALUE);
        assert!(check_tracestate(&state).is_err());
    }
}
