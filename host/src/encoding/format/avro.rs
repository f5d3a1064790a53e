//! Avro: a plugin's JSON turned into Avro binary against a schema, with every mismatch named by
//! its field path. The mapping is Avro's own JSON encoding (what `kafka-avro-console-producer`
//! reads), plus plain values where a union or a logical type leaves no doubt:
//!
//! - `null`, `boolean`, `string`: the JSON value; `int`/`long`: an integer in range;
//!   `float`/`double`: any number
//! - `bytes`/`fixed`: a string whose characters U+0000–U+00FF are the bytes (Avro's JSON
//!   encoding)
//! - `enum`: one of the symbols; `array`, `map`: a JSON array, a JSON object
//! - `record`: an object; a missing field takes its default (or is an error), fields the schema
//!   does not name are left out
//! - union: `{"<branch type>": value}` (Avro's JSON encoding), or a plain value: `null` picks the
//!   null branch, anything else the first branch it fits
//! - `decimal`: a number or a numeric string (`"12.30"`), scaled to the schema's scale without
//!   rounding; `date`: days since 1970-01-01 or `"YYYY-MM-DD"`; `timestamp-*`: an integer in the
//!   schema's unit or an RFC 3339 string; `uuid`: its text

use std::collections::HashMap;

use apache_avro::schema::{DecimalSchema, Name, RecordSchema, UnionSchema};
use apache_avro::types::Value as Avro;
use apache_avro::{Decimal, Schema};
use serde_json::Value as Json;

/// A parsed Avro schema with its named types, ready to encode.
#[derive(Debug)]
pub struct AvroSchema {
    schema: Schema,
    names: HashMap<Name, Schema>,
}

impl AvroSchema {
    /// Parses schema text (Avro JSON).
    pub fn parse(text: &str) -> Result<Self, String> {
        let schema = Schema::parse_str(text).map_err(|e| format!("not an Avro schema: {e}"))?;
        let names = apache_avro::schema::ResolvedSchema::try_from(&schema)
            .map_err(|e| format!("not an Avro schema: {e}"))?
            .get_names()
            .iter()
            .map(|(name, schema)| (name.clone(), (*schema).clone()))
            .collect();
        Ok(Self { schema, names })
    }

    /// The top-level record's (or enum's, fixed's) full name.
    pub fn full_name(&self) -> Option<String> {
        match &self.schema {
            Schema::Record(RecordSchema { name, .. }) => Some(name.fullname(None)),
            Schema::Enum(e) => Some(e.name.fullname(None)),
            Schema::Fixed(f) => Some(f.name.fullname(None)),
            _ => None,
        }
    }

    /// Whether the schema is a plain string: a key the plugin returned as text, not JSON, is
    /// taken as that string.
    pub fn takes_text(&self) -> bool {
        matches!(self.schema, Schema::String | Schema::Uuid)
    }

    /// Avro binary of `json` (no framing), or where and why it does not fit.
    pub fn encode(&self, json: &Json) -> Result<Vec<u8>, String> {
        let value = self.convert(&self.schema, json, &mut Path::root())?;
        apache_avro::to_avro_datum(&self.schema, value).map_err(|e| format!("{e}"))
    }

    fn convert(&self, schema: &Schema, json: &Json, path: &mut Path) -> Result<Avro, String> {
        let mismatch = |expected: &str| Err(path.mismatch(expected, json));
        Ok(match (schema, json) {
            (Schema::Ref { name }, _) => match self.names.get(name) {
                Some(named) => return self.convert(named, json, path),
                None => return Err(format!("{path}: the schema names an unknown type {name}")),
            },
            (Schema::Null, Json::Null) => Avro::Null,
            (Schema::Boolean, Json::Bool(b)) => Avro::Boolean(*b),
            (Schema::Int, Json::Number(n)) => Avro::Int(int(n).ok_or_else(|| path.range(json))?),
            (Schema::Long, Json::Number(n)) => {
                Avro::Long(n.as_i64().ok_or_else(|| path.range(json))?)
            }
            (Schema::Float, Json::Number(n)) => Avro::Float(number(n) as f32),
            (Schema::Double, Json::Number(n)) => Avro::Double(number(n)),
            (Schema::String, Json::String(s)) => Avro::String(s.clone()),
            (Schema::Bytes, Json::String(s)) => Avro::Bytes(latin1(s).ok_or_else(|| {
                format!("{path}: a bytes string may only hold characters U+0000 to U+00FF")
            })?),
            (Schema::Fixed(f), Json::String(s)) => {
                let bytes = latin1(s).ok_or_else(|| {
                    format!("{path}: a fixed string may only hold characters U+0000 to U+00FF")
                })?;
                if bytes.len() != f.size {
                    return Err(format!(
                        "{path}: {} bytes for fixed {} of {} bytes",
                        bytes.len(),
                        f.name.fullname(None),
                        f.size
                    ));
                }
                Avro::Fixed(f.size, bytes)
            }
            (Schema::Enum(e), Json::String(s)) => match e.symbols.iter().position(|x| x == s) {
                Some(i) => Avro::Enum(i as u32, s.clone()),
                None => {
                    return Err(format!(
                        "{path}: unknown symbol {s:?} of enum {} (symbols: {})",
                        e.name.fullname(None),
                        e.symbols.join(", ")
                    ));
                }
            },
            (Schema::Array(a), Json::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    path.push(Step::Index(i));
                    out.push(self.convert(&a.items, item, path)?);
                    path.pop();
                }
                Avro::Array(out)
            }
            (Schema::Map(m), Json::Object(entries)) => {
                let mut out = HashMap::with_capacity(entries.len());
                for (k, v) in entries {
                    path.push(Step::Field(k.clone()));
                    out.insert(k.clone(), self.convert(&m.types, v, path)?);
                    path.pop();
                }
                Avro::Map(out)
            }
            (Schema::Record(r), Json::Object(_)) => self.record(r, json, path)?,
            (Schema::Union(u), _) => self.union(u, json, path)?,
            (Schema::Decimal(d), Json::Number(_) | Json::String(_)) => decimal(d, json, path)?,
            (Schema::Uuid, Json::String(s)) => Avro::Uuid(
                s.parse()
                    .map_err(|_| format!("{path}: {s:?} is not a UUID"))?,
            ),
            (Schema::Date, Json::Number(n)) => Avro::Date(int(n).ok_or_else(|| path.range(json))?),
            (Schema::Date, Json::String(s)) => Avro::Date(
                days(s).ok_or_else(|| format!("{path}: {s:?} is not a date (YYYY-MM-DD)"))?,
            ),
            (Schema::TimeMillis, Json::Number(n)) => {
                Avro::TimeMillis(int(n).ok_or_else(|| path.range(json))?)
            }
            (Schema::TimeMicros, Json::Number(n)) => {
                Avro::TimeMicros(n.as_i64().ok_or_else(|| path.range(json))?)
            }
            (
                Schema::TimestampMillis
                | Schema::TimestampMicros
                | Schema::TimestampNanos
                | Schema::LocalTimestampMillis
                | Schema::LocalTimestampMicros
                | Schema::LocalTimestampNanos,
                Json::Number(_) | Json::String(_),
            ) => timestamp(schema, json, path)?,
            (Schema::Null, _) => return mismatch("null"),
            (Schema::Boolean, _) => return mismatch("a boolean"),
            (Schema::Int | Schema::Long | Schema::TimeMillis | Schema::TimeMicros, _) => {
                return mismatch("an integer");
            }
            (Schema::Float | Schema::Double, _) => return mismatch("a number"),
            (Schema::Enum(e), _) => {
                return mismatch(&format!("a symbol of enum {}", e.name.fullname(None)));
            }
            (Schema::Record(r), _) => {
                return mismatch(&format!("an object (record {})", r.name.fullname(None)));
            }
            (Schema::Array(_), _) => return mismatch("an array"),
            (Schema::Map(_), _) => return mismatch("an object (map)"),
            (Schema::Date, _) => return mismatch("a date"),
            (Schema::Decimal(_), _) => return mismatch("a decimal number"),
            _ => return mismatch(&format!("a value of type {}", type_name(schema))),
        })
    }

    fn record(&self, r: &RecordSchema, json: &Json, path: &mut Path) -> Result<Avro, String> {
        let Json::Object(object) = json else {
            return Err(path.mismatch("an object", json));
        };
        let mut fields = Vec::with_capacity(r.fields.len());
        for field in &r.fields {
            path.push(Step::Field(field.name.clone()));
            let value = match object.get(&field.name) {
                Some(v) => self.convert(&field.schema, v, path)?,
                None => match &field.default {
                    Some(default) => self.convert(&field.schema, default, path).or_else(|_| {
                        // A union's default is written for its first branch, plainly.
                        match &field.schema {
                            Schema::Union(u) => self.branch(u, 0, default, path),
                            _ => Err(format!("{path}: the schema's default does not fit")),
                        }
                    })?,
                    None => {
                        return Err(format!(
                            "{path}: missing field (record {} has no default for it)",
                            r.name.fullname(None)
                        ));
                    }
                },
            };
            path.pop();
            fields.push((field.name.clone(), value));
        }
        Ok(Avro::Record(fields))
    }

    fn union(&self, u: &UnionSchema, json: &Json, path: &mut Path) -> Result<Avro, String> {
        let variants = u.variants();
        // Avro's JSON encoding of a union: {"<type name>": value}.
        if let Json::Object(object) = json
            && object.len() == 1
            && let Some((tag, inner)) = object.iter().next()
            && let Some(i) = variants.iter().position(|v| self.branch_name(v) == *tag)
        {
            return self.branch(u, i, inner, path);
        }
        if json.is_null() {
            return match variants.iter().position(|v| matches!(v, Schema::Null)) {
                Some(i) => Ok(Avro::Union(i as u32, Box::new(Avro::Null))),
                None => Err(path.mismatch("a value (the union has no null branch)", json)),
            };
        }
        let mut reasons = Vec::new();
        for (i, variant) in variants.iter().enumerate() {
            if matches!(variant, Schema::Null) {
                continue;
            }
            match self.convert(variant, json, path) {
                Ok(v) => return Ok(Avro::Union(i as u32, Box::new(v))),
                Err(e) => reasons.push(e),
            }
        }
        Err(match reasons.as_slice() {
            [one] => one.clone(),
            _ => format!(
                "{path}: fits no branch of the union [{}]",
                variants
                    .iter()
                    .map(|v| self.branch_name(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    fn branch(
        &self,
        u: &UnionSchema,
        i: usize,
        json: &Json,
        path: &mut Path,
    ) -> Result<Avro, String> {
        let variant = &u.variants()[i];
        Ok(Avro::Union(
            i as u32,
            Box::new(self.convert(variant, json, path)?),
        ))
    }

    /// How Avro's JSON encoding names a union branch: a named type's full name, else the
    /// primitive type's name.
    fn branch_name(&self, schema: &Schema) -> String {
        match schema {
            Schema::Record(r) => r.name.fullname(None),
            Schema::Enum(e) => e.name.fullname(None),
            Schema::Fixed(f) => f.name.fullname(None),
            Schema::Ref { name } => name.fullname(None),
            other => type_name(other).to_owned(),
        }
    }
}

fn type_name(schema: &Schema) -> &'static str {
    match schema {
        Schema::Null => "null",
        Schema::Boolean => "boolean",
        Schema::Int | Schema::Date | Schema::TimeMillis => "int",
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => "long",
        Schema::Float => "float",
        Schema::Double => "double",
        Schema::Bytes | Schema::BigDecimal => "bytes",
        Schema::String | Schema::Uuid => "string",
        Schema::Array(_) => "array",
        Schema::Map(_) => "map",
        Schema::Union(_) => "union",
        Schema::Record(_) => "record",
        Schema::Enum(_) => "enum",
        Schema::Fixed(_) | Schema::Duration => "fixed",
        Schema::Decimal(d) => match *d.inner {
            Schema::Fixed(_) => "fixed",
            _ => "bytes",
        },
        Schema::Ref { .. } => "named type",
    }
}

fn int(n: &serde_json::Number) -> Option<i32> {
    n.as_i64().and_then(|v| i32::try_from(v).ok())
}

fn number(n: &serde_json::Number) -> f64 {
    n.as_f64().unwrap_or(f64::NAN)
}

fn latin1(s: &str) -> Option<Vec<u8>> {
    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

fn days(s: &str) -> Option<i32> {
    let date = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()?;
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)?;
    i32::try_from((date - epoch).num_days()).ok()
}

fn timestamp(schema: &Schema, json: &Json, path: &Path) -> Result<Avro, String> {
    let value = match json {
        Json::Number(n) => n.as_i64().ok_or_else(|| path.range(json))?,
        Json::String(s) => {
            let local = matches!(
                schema,
                Schema::LocalTimestampMillis
                    | Schema::LocalTimestampMicros
                    | Schema::LocalTimestampNanos
            );
            let at = if local {
                chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
                    .map(|t| t.and_utc())
                    .ok()
            } else {
                chrono::DateTime::parse_from_rfc3339(s)
                    .map(|t| t.to_utc())
                    .ok()
            };
            let at = at.ok_or_else(|| {
                format!(
                    "{path}: {s:?} is not a timestamp ({})",
                    if local {
                        "YYYY-MM-DDTHH:MM:SS[.fff], no offset"
                    } else {
                        "RFC 3339"
                    }
                )
            })?;
            let out_of_range = || format!("{path}: {s:?} is out of range");
            match schema {
                Schema::TimestampMillis | Schema::LocalTimestampMillis => at.timestamp_millis(),
                Schema::TimestampMicros | Schema::LocalTimestampMicros => at.timestamp_micros(),
                _ => at.timestamp_nanos_opt().ok_or_else(out_of_range)?,
            }
        }
        _ => return Err(path.mismatch("a timestamp", json)),
    };
    Ok(match schema {
        Schema::TimestampMillis => Avro::TimestampMillis(value),
        Schema::TimestampMicros => Avro::TimestampMicros(value),
        Schema::TimestampNanos => Avro::TimestampNanos(value),
        Schema::LocalTimestampMillis => Avro::LocalTimestampMillis(value),
        Schema::LocalTimestampMicros => Avro::LocalTimestampMicros(value),
        _ => Avro::LocalTimestampNanos(value),
    })
}

/// A decimal number or numeric string as the two's-complement big-endian unscaled integer
/// Avro's `decimal` holds (up to 38 digits).
fn decimal(d: &DecimalSchema, json: &Json, path: &Path) -> Result<Avro, String> {
    let text = match json {
        Json::Number(n) => n.to_string(),
        Json::String(s) => s.trim().to_owned(),
        _ => return Err(path.mismatch("a decimal number", json)),
    };
    let unscaled = unscaled(&text, d.scale).ok_or_else(|| {
        format!(
            "{path}: {text:?} is not a decimal with at most {} digits after the point",
            d.scale
        )
    })?;
    let digits = unscaled.unsigned_abs().to_string().len();
    if unscaled != 0 && digits > d.precision {
        return Err(format!(
            "{path}: {text} has {digits} digits; the decimal's precision is {}",
            d.precision
        ));
    }
    let bytes = unscaled.to_be_bytes();
    // Minimal two's complement: drop leading bytes that only repeat the sign.
    let sign = if unscaled < 0 { 0xff } else { 0x00 };
    let mut start = 0;
    while start < bytes.len() - 1
        && bytes[start] == sign
        && (bytes[start + 1] & 0x80) == (sign & 0x80)
    {
        start += 1;
    }
    let mut bytes = bytes[start..].to_vec();
    if let Schema::Fixed(f) = &*d.inner {
        if bytes.len() > f.size {
            return Err(format!("{path}: {text} does not fit fixed({})", f.size));
        }
        let mut padded = vec![sign; f.size - bytes.len()];
        padded.extend_from_slice(&bytes);
        bytes = padded;
    }
    Ok(Avro::Decimal(Decimal::from(bytes)))
}

/// `"-12.3"` at scale 2 → -1230; `None` for more fraction digits than `scale` or not a number.
fn unscaled(text: &str, scale: usize) -> Option<i128> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let fraction = fraction.trim_end_matches('0');
    if fraction.len() > scale {
        return None;
    }
    let mut value: i128 = 0;
    for b in whole.bytes().chain(fraction.bytes()) {
        value = value.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
    }
    value = value.checked_mul(10i128.checked_pow(u32::try_from(scale - fraction.len()).ok()?)?)?;
    Some(if negative { -value } else { value })
}

/// Where in the JSON a value is: `$.order.lines[2].sku`.
pub(crate) struct Path(Vec<Step>);

pub(crate) enum Step {
    Field(String),
    Index(usize),
}

impl Path {
    fn root() -> Self {
        Self(Vec::new())
    }

    fn push(&mut self, step: Step) {
        self.0.push(step);
    }

    fn pop(&mut self) {
        self.0.pop();
    }

    fn mismatch(&self, expected: &str, found: &Json) -> String {
        format!("{self}: expected {expected}, found {}", json_kind(found))
    }

    fn range(&self, found: &Json) -> String {
        format!("{self}: {found} is out of the type's range")
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("$")?;
        for step in &self.0 {
            match step {
                Step::Field(name) => write!(f, ".{name}")?,
                Step::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

/// What a JSON value is, for errors (never its content: payloads may be personal data).
pub(crate) fn json_kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const ORDER: &str = r#"{
        "type": "record", "name": "OrderCreated", "namespace": "com.acme",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
            {"name": "note", "type": ["null", "string"], "default": null},
            {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
            {"name": "lines", "type": {"type": "array", "items": {
                "type": "record", "name": "Line", "fields": [
                    {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}}
        ]}"#;

    fn schema() -> AvroSchema {
        AvroSchema::parse(ORDER).unwrap()
    }

    #[test]
    fn a_fitting_payload_encodes_to_avros_binary_layout() {
        let bytes = schema()
            .encode(&json!({
                "id": 7, "status": "PAID", "total": "12.30",
                "lines": [{"sku": "A", "qty": 2}], "extra": "dropped"
            }))
            .unwrap();
        // id 7 → zigzag 14; enum index 1 → 2; union null branch → 0; decimal 1230 = 0x04CE,
        // 2 bytes → 4; array of 1 → 2, "A" (len 1 → 2, 0x41), qty 2 → 4; array end 0.
        assert_eq!(bytes, [14, 2, 0, 4, 0x04, 0xCE, 2, 2, 0x41, 4, 0]);
    }

    #[test]
    fn mismatches_name_the_field_path() {
        let s = schema();
        let missing = s.encode(&json!({"status": "NEW", "total": 1, "lines": []}));
        assert_eq!(
            missing.unwrap_err(),
            "$.id: missing field (record com.acme.OrderCreated has no default for it)"
        );
        let symbol = s.encode(&json!({"id": 1, "status": "SHIPPED", "total": 1, "lines": []}));
        assert!(
            symbol
                .unwrap_err()
                .starts_with("$.status: unknown symbol \"SHIPPED\" of enum com.acme.Status"),
        );
        let wrong = s.encode(&json!({"id": 1, "status": "NEW", "total": 1,
            "lines": [{"sku": "A", "qty": "two"}]}));
        assert_eq!(
            wrong.unwrap_err(),
            "$.lines[0].qty: expected an integer, found a string"
        );
        let range = s.encode(&json!({"id": 1, "status": "NEW", "total": 1,
            "lines": [{"sku": "A", "qty": 3_000_000_000u64}]}));
        assert!(
            range
                .unwrap_err()
                .starts_with("$.lines[0].qty: 3000000000 is out")
        );
        let precise = s.encode(&json!({"id": 1, "status": "NEW", "total": "0.125", "lines": []}));
        assert!(
            precise
                .unwrap_err()
                .starts_with("$.total: \"0.125\" is not a decimal")
        );
    }

    #[test]
    fn unions_take_avros_json_encoding_or_a_plain_value() {
        let s = schema();
        let tagged = s
            .encode(&json!({"id": 1, "status": "NEW", "note": {"string": "hi"}, "total": 0, "lines": []}))
            .unwrap();
        let plain = s
            .encode(&json!({"id": 1, "status": "NEW", "note": "hi", "total": 0, "lines": []}))
            .unwrap();
        assert_eq!(tagged, plain);
        assert_eq!(&plain[2..6], [2, 4, b'h', b'i']);
    }

    #[test]
    fn decimals_are_scaled_without_rounding_and_negatives_keep_their_sign() {
        assert_eq!(unscaled("12.3", 2), Some(1230));
        assert_eq!(unscaled("-0.01", 2), Some(-1));
        assert_eq!(unscaled("5", 0), Some(5));
        assert_eq!(unscaled("1.234", 2), None);
        assert_eq!(unscaled("1e3", 2), None);
        let d = DecimalSchema {
            precision: 4,
            scale: 2,
            inner: Box::new(Schema::Bytes),
        };
        let bytes = |v: Value| match decimal(&d, &v, &Path::root()).unwrap() {
            Avro::Decimal(d) => Vec::<u8>::try_from(d).unwrap(),
            other => panic!("not a decimal: {other:?}"),
        };
        // Minimal two's complement, big-endian: -128 fits one byte, -129 and 128 need two.
        assert_eq!(bytes(json!(-1.28)), [0x80]);
        assert_eq!(bytes(json!(-1.29)), [0xff, 0x7f]);
        assert_eq!(bytes(json!("1.28")), [0x00, 0x80]);
        assert_eq!(bytes(json!(0)), [0x00]);
    }

    #[test]
    fn timestamps_take_integers_or_rfc3339() {
        let s = AvroSchema::parse(
            r#"{"type":"record","name":"T","fields":[{"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#,
        )
        .unwrap();
        let text = s.encode(&json!({"at": "1970-01-01T00:00:01.5Z"})).unwrap();
        let number = s.encode(&json!({"at": 1500})).unwrap();
        assert_eq!(text, number);
    }
}
