//! Postgres values in their text form (what pgoutput sends by default and
//! what `COPY ... TO STDOUT` writes) into [`Value`]s of the column's Arrow type.
//!
//! Both the stream and the backfill go through these functions, so a row
//! read by the backfill and the same row streamed decode to the same values.
//! The sessions pin the settings the text forms depend on (see
//! [`SESSION_SETTINGS`]).

use arrow_schema::{DataType, TimeUnit};

use crate::change::Value;

/// Settings every session of ours runs with, so the text forms are fixed:
/// ISO dates, UTC offsets, hex bytea, floats that round-trip.
pub const SESSION_SETTINGS: &[(&str, &str)] = &[
    ("DateStyle", "ISO"),
    ("TimeZone", "UTC"),
    ("bytea_output", "hex"),
    ("extra_float_digits", "3"),
    ("IntervalStyle", "postgres"),
];

/// How a Postgres type is carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PgKind {
    Bool,
    /// int2 and int4.
    Int32,
    Int64,
    /// float4 and float8 (float4 widens exactly).
    Float64,
    /// numeric(p, s) with p <= 38, and unconstrained numeric as
    /// [`UNCONSTRAINED_NUMERIC`].
    Decimal {
        precision: u8,
        scale: i8,
    },
    Bytea,
    /// 16 bytes, in the order Postgres prints and sorts them.
    Uuid,
    Date,
    /// Time of day without a zone, microseconds since midnight.
    Time,
    Timestamp,
    TimestampTz,
    /// Everything kept as its text form: text, varchar, char, name, json,
    /// jsonb, enums, numeric wider than 38 digits, timetz, interval, ...
    Text,
    /// A one-dimensional array of an element kind.
    Array(Box<PgKind>),
}

impl PgKind {
    pub fn data_type(&self) -> DataType {
        match self {
            PgKind::Bool => DataType::Boolean,
            PgKind::Int32 => DataType::Int32,
            PgKind::Int64 => DataType::Int64,
            PgKind::Float64 => DataType::Float64,
            PgKind::Decimal { precision, scale } => DataType::Decimal128(*precision, *scale),
            PgKind::Bytea => DataType::Binary,
            PgKind::Uuid => crate::change::uuid_type(),
            PgKind::Date => DataType::Date32,
            PgKind::Time => DataType::Time64(TimeUnit::Microsecond),
            PgKind::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            PgKind::TimestampTz => {
                DataType::Timestamp(TimeUnit::Microsecond, Some(crate::change::UTC_ZONE.into()))
            }
            PgKind::Text => DataType::Utf8,
            PgKind::Array(item) => DataType::List(std::sync::Arc::new(crate::change::field(
                "item",
                item.data_type(),
                true,
            ))),
        }
    }

    /// Whether a value of this kind can be part of a backfill key (ordered
    /// and compared the same way by Postgres and by its text form).
    pub fn keyable(&self) -> bool {
        !matches!(self, PgKind::Float64 | PgKind::Array(_))
    }
}

/// The decimal an unconstrained `numeric` is carried as: 38 digits (the most
/// Iceberg and Arrow's Decimal128 hold), 18 of them after the point, as
/// Spark reads an unconstrained Postgres numeric. A value with more digits
/// on either side cannot be carried exactly and stops the pipeline.
pub const UNCONSTRAINED_NUMERIC: PgKind = PgKind::Decimal {
    precision: 38,
    scale: 18,
};

/// The kind of a base type, by name (`pg_type.typname`), with its typmod.
pub fn kind_of(typname: &str, typmod: i32) -> PgKind {
    match typname {
        "bool" => PgKind::Bool,
        "int2" | "int4" => PgKind::Int32,
        "int8" => PgKind::Int64,
        "float4" | "float8" => PgKind::Float64,
        "numeric" => {
            // typmod = ((precision << 16) | scale) + 4; -1 when unconstrained.
            if typmod >= 4 {
                let precision = ((typmod - 4) >> 16) & 0xffff;
                let scale = (((typmod - 4) & 0xffff) as i16) as i32;
                if (1..=38).contains(&precision) && (0..=precision).contains(&scale) {
                    return PgKind::Decimal {
                        precision: precision as u8,
                        scale: scale as i8,
                    };
                }
                // Wider than 38 digits, or a negative scale (PG15+): exact
                // only as text.
                return PgKind::Text;
            }
            UNCONSTRAINED_NUMERIC
        }
        "bytea" => PgKind::Bytea,
        "uuid" => PgKind::Uuid,
        "date" => PgKind::Date,
        "time" => PgKind::Time,
        "timestamp" => PgKind::Timestamp,
        "timestamptz" => PgKind::TimestampTz,
        _ => PgKind::Text,
    }
}

/// Decodes one non-null value from its text form. A value the column's
/// type cannot hold exactly (a numeric NaN, an infinite date, an array of
/// more than one dimension) is an error saying why; the caller names the
/// table, column and key.
pub fn decode(kind: &PgKind, text: &str) -> Result<Value, String> {
    let bad = |what: &str| format!("`{}` is not a valid {what}", clip(text));
    Ok(match kind {
        PgKind::Bool => match text {
            // The output function says t/f; a cast to text says true/false.
            "t" | "true" => Value::Bool(true),
            "f" | "false" => Value::Bool(false),
            _ => return Err(bad("boolean")),
        },
        PgKind::Int32 => Value::Int32(text.parse().map_err(|_| bad("integer"))?),
        PgKind::Int64 => Value::Int64(text.parse().map_err(|_| bad("bigint"))?),
        PgKind::Float64 => Value::Float64(match text {
            "NaN" => f64::NAN,
            "Infinity" => f64::INFINITY,
            "-Infinity" => f64::NEG_INFINITY,
            _ => text.parse().map_err(|_| bad("float"))?,
        }),
        PgKind::Decimal { precision, scale } => {
            if matches!(text, "NaN" | "Infinity" | "-Infinity") {
                return Err(not_finite_numeric(text));
            }
            let value = parse_decimal(text, *scale)
                .filter(|v| v.unsigned_abs() < 10u128.pow(u32::from(*precision)))
                .ok_or_else(|| unfit_decimal(&clip(text), *precision, *scale))?;
            Value::Decimal128(value)
        }
        PgKind::Bytea => Value::Binary(parse_bytea(text).ok_or_else(|| bad("hex bytea"))?),
        PgKind::Uuid => Value::Binary(parse_uuid(text).ok_or_else(|| bad("uuid"))?.to_vec()),
        PgKind::Date => Value::Date32(match text {
            "infinity" | "-infinity" => return Err(infinite("date", text)),
            _ => parse_date(text).ok_or_else(|| bad("date"))?,
        }),
        PgKind::Time => Value::Int64(parse_time(text).ok_or_else(|| {
            if text.starts_with("24:") {
                end_of_day(text)
            } else {
                bad("time")
            }
        })?),
        PgKind::Timestamp | PgKind::TimestampTz => {
            let zoned = *kind == PgKind::TimestampTz;
            let name = if zoned { "timestamptz" } else { "timestamp" };
            Value::TimestampMicros(match text {
                "infinity" | "-infinity" => return Err(infinite(name, text)),
                _ => parse_timestamp(text, zoned).ok_or_else(|| bad(name))?,
            })
        }
        PgKind::Text => Value::Utf8(text.to_string()),
        PgKind::Array(item) => {
            let items = parse_array(text).ok_or_else(|| match dimensions(text) {
                n if n > 1 => format!(
                    "a {n}-dimensional array; weir carries one-dimensional arrays only (Postgres \
                     does not hold a column to the dimensions it declares)"
                ),
                _ => bad("one-dimensional array"),
            })?;
            Value::List(
                items
                    .into_iter()
                    .map(|i| match i {
                        None => Ok(Value::Null),
                        Some(t) => decode(item, &t).map_err(|e| format!("array item: {e}")),
                    })
                    .collect::<Result<_, _>>()?,
            )
        }
    })
}

// Why a value cannot be carried, in the same words whether it came as text
// or in binary COPY (`copy_binary.rs`).

pub(super) fn infinite(type_name: &str, text: &str) -> String {
    format!(
        "{type_name} {text} has no equivalent in Arrow or Iceberg (a sentinel date would \
         read back as a real one)"
    )
}

pub(super) fn not_finite_numeric(text: &str) -> String {
    format!(
        "numeric {text} has no decimal form (Arrow and Iceberg decimals hold finite numbers only)"
    )
}

pub(super) fn unfit_decimal(text: &str, precision: u8, scale: i8) -> String {
    format!("numeric {text} does not fit decimal({precision}, {scale}) exactly")
}

pub(super) fn end_of_day(text: &str) -> String {
    format!("time {text} is the end of the day, which Iceberg's time cannot hold")
}

/// The number of dimensions an array's text form has: its leading braces
/// (a quoted item's braces are behind a quote).
fn dimensions(text: &str) -> usize {
    let body = match text.find('=') {
        Some(i) if text.starts_with('[') => &text[i + 1..],
        _ => text,
    };
    body.bytes().take_while(|&b| b == b'{').count()
}

/// `a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11` (how Postgres prints every uuid)
/// -> its 16 bytes.
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let bytes = text.as_bytes();
    if bytes.len() != 36 || [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
        return None;
    }
    let digits: String = text.chars().filter(|&c| c != '-').collect();
    let mut out = [0u8; 16];
    hex::decode_to_slice(digits, &mut out).ok()?;
    Some(out)
}

/// `HH:MM:SS[.ffffff]` -> microseconds since midnight; None past the day's
/// end (Postgres allows `24:00:00`).
fn parse_time(text: &str) -> Option<i64> {
    let (micros, rest) = parse_clock(text)?;
    (rest.is_empty() && micros < 86_400_000_000).then_some(micros)
}

/// `HH:MM:SS[.ffffff]` at the start of `text` -> (microseconds, the rest).
fn parse_clock(text: &str) -> Option<(i64, &str)> {
    if text.as_bytes().get(2) != Some(&b':') || text.as_bytes().get(5) != Some(&b':') {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let hour = number(0..2)?;
    let minute = number(3..5)?;
    let second = number(6..8)?;
    if hour > 24 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[8..];
    let mut micros: i64 = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let end = frac
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(frac.len());
        let digits = &frac[..end];
        if digits.is_empty() || digits.len() > 6 {
            return None;
        }
        // Scaled as read: `.5` is 500000 us. Parsing runs per row of a
        // backfill, so no string is built for it.
        micros = digits.bytes().fold(0, |n, b| n * 10 + i64::from(b - b'0'))
            * 10_i64.pow(6 - digits.len() as u32);
        rest = &frac[end..];
    }
    Some((
        ((hour * 60 + minute) * 60 + second) * 1_000_000 + micros,
        rest,
    ))
}

fn clip(text: &str) -> String {
    if text.len() <= 64 {
        return text.to_string();
    }
    let mut end = 64;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// `-123.45` at scale 3 -> -123450. None when it does not fit the scale.
pub(crate) fn parse_decimal(text: &str, scale: i8) -> Option<i128> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let scale = scale.max(0) as usize;
    let (kept, dropped) = frac.split_at(frac.len().min(scale));
    if dropped.bytes().any(|b| b != b'0') {
        return None;
    }
    let mut value: i128 = 0;
    for b in whole.bytes().chain(kept.bytes()) {
        value = value.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
    }
    for _ in kept.len()..scale {
        value = value.checked_mul(10)?;
    }
    Some(if negative { -value } else { value })
}

fn parse_bytea(text: &str) -> Option<Vec<u8>> {
    let hex = text.strip_prefix("\\x")?;
    hex::decode(hex).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (year 0 = 1 BC).
pub(crate) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD[ BC]` -> (days, rest after the date).
fn parse_date_prefix(text: &str) -> Option<(i64, &str)> {
    let (year, rest) = text.split_once('-')?;
    let year: i64 = year.parse().ok()?;
    let month: u32 = rest.get(0..2)?.parse().ok()?;
    if rest.as_bytes().get(2) != Some(&b'-') {
        return None;
    }
    let day: u32 = rest.get(3..5)?.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let rest = &rest[5..];
    let bc = text.ends_with(" BC");
    let year = if bc { 1 - year } else { year };
    Some((days_from_civil(year, month, day), rest))
}

fn parse_date(text: &str) -> Option<i32> {
    let (days, rest) = parse_date_prefix(text)?;
    if !(rest.is_empty() || rest == " BC") {
        return None;
    }
    i32::try_from(days).ok()
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]][ BC]` -> microseconds since
/// the epoch (UTC when zoned).
fn parse_timestamp(text: &str, zoned: bool) -> Option<i64> {
    let (days, rest) = parse_date_prefix(text)?;
    let rest = rest.strip_suffix(" BC").unwrap_or(rest);
    let rest = rest.strip_prefix(' ')?;
    let (clock, rest) = parse_clock(rest)?;
    let mut offset_seconds: i64 = 0;
    if zoned {
        let sign = match rest.as_bytes().first()? {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let mut seconds = 0;
        for (i, part) in rest[1..].split(':').enumerate() {
            let n: i64 = part.parse().ok()?;
            seconds += n * [3600, 60, 1].get(i)?;
        }
        offset_seconds = sign * seconds;
    } else if !rest.is_empty() {
        return None;
    }
    (days * 86_400 - offset_seconds)
        .checked_mul(1_000_000)?
        .checked_add(clock)
}

/// The items of a one-dimensional array's text form (`{1,NULL,"a b"}`);
/// None for anything else (nested arrays included).
pub fn parse_array(text: &str) -> Option<Vec<Option<String>>> {
    // A non-default lower bound is written as `[2:3]={...}`.
    let body = match text.find('=') {
        Some(i) if text.starts_with('[') => &text[i + 1..],
        _ => text,
    };
    let inner = body.strip_prefix('{')?.strip_suffix('}')?;
    let mut items = Vec::new();
    if inner.is_empty() {
        return Some(items);
    }
    let mut chars = inner.chars().peekable();
    loop {
        let mut item = String::new();
        let quoted = chars.peek() == Some(&'"');
        if quoted {
            chars.next();
            loop {
                match chars.next()? {
                    '\\' => item.push(chars.next()?),
                    '"' => break,
                    c => item.push(c),
                }
            }
            items.push(Some(item));
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                if c == '{' || c == '"' {
                    return None;
                }
                if c == '\\' {
                    chars.next();
                    item.push(chars.next()?);
                    continue;
                }
                item.push(c);
                chars.next();
            }
            let item = item.trim().to_string();
            items.push(if item.eq_ignore_ascii_case("NULL") {
                None
            } else {
                Some(item)
            });
        }
        match chars.next() {
            None => return Some(items),
            Some(',') => continue,
            Some(_) => return None,
        }
    }
}

/// Splits one line of `COPY ... TO STDOUT` text format into fields (None = `\N`).
pub fn copy_fields(line: &[u8]) -> Result<Vec<Option<String>>, String> {
    let mut split = CopyLine::default();
    let fields = split.split(line)?;
    Ok((0..fields.len())
        .map(|i| fields.get(i).map(str::to_owned))
        .collect())
}

/// Splits lines of `COPY ... TO STDOUT` text format into fields without a
/// copy per field: a line without a backslash is borrowed as it is, and
/// only a line with one is unescaped, into a buffer kept from line to line.
#[derive(Default)]
pub struct CopyLine {
    unescaped: Vec<u8>,
    /// Each field's byte range in the text, None for `\N`.
    ranges: Vec<Option<(usize, usize)>>,
}

/// The fields of one line, borrowed from the line or the [`CopyLine`].
pub struct CopyFields<'a> {
    text: &'a str,
    ranges: &'a [Option<(usize, usize)>],
}

impl CopyFields<'_> {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Field `i` (None for `\N`); panics past [`CopyFields::len`].
    pub fn get(&self, i: usize) -> Option<&str> {
        self.ranges[i].map(|(start, end)| &self.text[start..end])
    }
}

impl CopyLine {
    /// The fields of `line` (without its newline).
    pub fn split<'a>(&'a mut self, line: &'a [u8]) -> Result<CopyFields<'a>, String> {
        self.ranges.clear();
        let text = if line.contains(&b'\\') {
            self.unescaped.clear();
            for raw in line.split(|&b| b == b'\t') {
                if raw == b"\\N" {
                    self.ranges.push(None);
                    continue;
                }
                let start = self.unescaped.len();
                unescape_into(raw, &mut self.unescaped);
                self.ranges.push(Some((start, self.unescaped.len())));
                // Keeps fields apart for the UTF-8 check below: escapes
                // could spell a sequence across two fields.
                self.unescaped.push(b'\t');
            }
            &self.unescaped[..]
        } else {
            let mut start = 0;
            for raw in line.split(|&b| b == b'\t') {
                // Without a backslash there is no `\N` either.
                self.ranges.push(Some((start, start + raw.len())));
                start += raw.len() + 1;
            }
            line
        };
        // A tab never sits inside a UTF-8 sequence, so every range of a
        // valid text is valid too.
        let text = std::str::from_utf8(text).map_err(|_| "COPY field is not UTF-8".to_string())?;
        Ok(CopyFields {
            text,
            ranges: &self.ranges,
        })
    }
}

/// Appends one field of COPY text with its backslash escapes undone.
fn unescape_into(raw: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'\\' || i + 1 == raw.len() {
            out.push(b);
            i += 1;
            continue;
        }
        let e = raw[i + 1];
        i += 2;
        match e {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                let mut n = 1;
                while n < 3 && i < raw.len() && (b'0'..=b'7').contains(&raw[i]) {
                    v = v * 8 + u32::from(raw[i] - b'0');
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 && i < raw.len() && raw[i].is_ascii_hexdigit() {
                    v = v * 16 + (raw[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
}

/// A string literal for SQL text (standard_conforming_strings is on since
/// Postgres 9.1, so only quotes need doubling).
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A quoted identifier.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_text_forms() {
        let d = |k: &PgKind, t: &str| decode(k, t).unwrap();
        assert_eq!(d(&PgKind::Bool, "t"), Value::Bool(true));
        assert_eq!(
            d(
                &PgKind::Decimal {
                    precision: 12,
                    scale: 2
                },
                "-123.4"
            ),
            Value::Decimal128(-12340)
        );
        assert_eq!(
            d(
                &PgKind::Decimal {
                    precision: 5,
                    scale: 0
                },
                "42"
            ),
            Value::Decimal128(42)
        );
        assert_eq!(d(&PgKind::Bytea, "\\x00ff"), Value::Binary(vec![0, 255]));
        assert_eq!(d(&PgKind::Date, "1970-01-02"), Value::Date32(1));
        assert_eq!(d(&PgKind::Date, "2000-03-01"), Value::Date32(11017));
        assert_eq!(
            d(&PgKind::Timestamp, "1970-01-01 00:00:01.5"),
            Value::TimestampMicros(1_500_000)
        );
        assert_eq!(
            d(&PgKind::TimestampTz, "1970-01-01 01:00:00+01"),
            Value::TimestampMicros(0)
        );
        assert_eq!(
            d(&PgKind::TimestampTz, "1969-12-31 23:59:59.999999+00"),
            Value::TimestampMicros(-1)
        );
        assert_eq!(
            d(&PgKind::Array(Box::new(PgKind::Int32)), "{1,NULL,3}"),
            Value::List(vec![Value::Int32(1), Value::Null, Value::Int32(3)])
        );
        assert_eq!(
            d(
                &PgKind::Array(Box::new(PgKind::Text)),
                r#"{"a,b","c\"d",e}"#
            ),
            Value::List(vec![
                Value::Utf8("a,b".into()),
                Value::Utf8("c\"d".into()),
                Value::Utf8("e".into())
            ])
        );
        assert!(decode(&PgKind::Array(Box::new(PgKind::Int32)), "{{1},{2}}").is_err());
        assert!(
            decode(
                &PgKind::Decimal {
                    precision: 5,
                    scale: 1
                },
                "1.25"
            )
            .is_err()
        );
    }

    #[test]
    fn numeric_typmods() {
        assert_eq!(
            kind_of("numeric", (12 << 16 | 2) + 4),
            PgKind::Decimal {
                precision: 12,
                scale: 2
            }
        );
        assert_eq!(kind_of("numeric", -1), UNCONSTRAINED_NUMERIC);
        // Wider than a Decimal128, or a negative scale: text.
        assert_eq!(kind_of("numeric", (50 << 16 | 2) + 4), PgKind::Text);
        assert_eq!(kind_of("numeric", (5 << 16 | 0xfffe) + 4), PgKind::Text);
    }

    #[test]
    fn values_a_column_cannot_hold_are_refused_with_the_reason() {
        let unconstrained = UNCONSTRAINED_NUMERIC;
        for nan in ["NaN", "Infinity", "-Infinity"] {
            let why = decode(&unconstrained, nan).unwrap_err();
            assert!(why.contains("no decimal form"), "{why}");
        }
        assert_eq!(
            decode(&unconstrained, "-12345678901234567890.123456789012345678").unwrap(),
            Value::Decimal128(-12_345_678_901_234_567_890_123_456_789_012_345_678)
        );
        for too_big in ["123456789012345678901", "0.0000000000000000001"] {
            let why = decode(&unconstrained, too_big).unwrap_err();
            assert!(why.contains("does not fit decimal(38, 18)"), "{why}");
        }
        let four_two = PgKind::Decimal {
            precision: 4,
            scale: 2,
        };
        assert!(decode(&four_two, "100.00").is_err());
        assert_eq!(decode(&four_two, "99.99").unwrap(), Value::Decimal128(9999));
        for (kind, text) in [
            (PgKind::Date, "infinity"),
            (PgKind::Timestamp, "-infinity"),
            (PgKind::TimestampTz, "infinity"),
        ] {
            let why = decode(&kind, text).unwrap_err();
            assert!(why.contains("no equivalent"), "{why}");
        }
        let why = decode(&PgKind::Time, "24:00:00").unwrap_err();
        assert!(why.contains("end of the day"), "{why}");
        let ints = PgKind::Array(Box::new(PgKind::Int32));
        let why = decode(&ints, "{{1,2},{3,4}}").unwrap_err();
        assert!(why.contains("2-dimensional"), "{why}");
        let why = decode(&ints, "[1:1][1:2]={{1,2}}").unwrap_err();
        assert!(why.contains("2-dimensional"), "{why}");
        let why = decode(&PgKind::Array(Box::new(unconstrained)), "{1,NaN}").unwrap_err();
        assert!(why.starts_with("array item: numeric NaN"), "{why}");
    }

    #[test]
    fn uuids_times_and_arrays_of_them() {
        assert_eq!(
            decode(&PgKind::Uuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11").unwrap(),
            Value::Binary(hex::decode("a0eebc999c0b4ef8bb6d6bb9bd380a11").unwrap())
        );
        assert!(decode(&PgKind::Uuid, "a0eebc999c0b4ef8bb6d6bb9bd380a11").is_err());
        assert!(decode(&PgKind::Uuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g").is_err());
        assert_eq!(decode(&PgKind::Time, "00:00:00").unwrap(), Value::Int64(0));
        assert_eq!(
            decode(&PgKind::Time, "23:59:59.999999").unwrap(),
            Value::Int64(86_399_999_999)
        );
        assert_eq!(
            decode(&PgKind::Time, "01:02:03.4").unwrap(),
            Value::Int64(3_723_400_000)
        );
        assert!(decode(&PgKind::Time, "1:02:03").is_err());
        assert!(decode(&PgKind::Time, "01:02:03+02").is_err());
        assert_eq!(
            decode(
                &PgKind::Array(Box::new(PgKind::Uuid)),
                "{00000000-0000-0000-0000-000000000001,NULL}"
            )
            .unwrap(),
            Value::List(vec![
                Value::Binary([vec![0; 15], vec![1]].concat()),
                Value::Null
            ])
        );
        assert_eq!(
            decode(&PgKind::Array(Box::new(PgKind::Int32)), "{}").unwrap(),
            Value::List(vec![])
        );
        assert_eq!(
            decode(&PgKind::Array(Box::new(PgKind::Bytea)), r#"{"\\x00ff"}"#).unwrap(),
            Value::List(vec![Value::Binary(vec![0, 255])])
        );
        assert_eq!(
            decode(&PgKind::TimestampTz, "0001-01-01 00:00:00+00 BC").unwrap(),
            Value::TimestampMicros(-62_167_219_200_000_000)
        );
    }

    #[test]
    fn copy_text_fields() {
        assert_eq!(
            copy_fields(b"1\t\\N\ta\\tb\\\\c\\n").unwrap(),
            vec![Some("1".into()), None, Some("a\tb\\c\n".into())]
        );
        let mut split = CopyLine::default();
        let plain = split.split(b"1\t\t\xc3\xa9").unwrap();
        assert_eq!(
            (0..plain.len()).map(|i| plain.get(i)).collect::<Vec<_>>(),
            vec![Some("1"), Some(""), Some("\u{e9}")]
        );
        // Reused for the next line; `\\N` is a backslash and an N, not a null.
        let escaped = split.split(b"\\\\N\t\\N\t\\303\\251").unwrap();
        assert_eq!(
            (0..escaped.len())
                .map(|i| escaped.get(i))
                .collect::<Vec<_>>(),
            vec![Some("\\N"), None, Some("\u{e9}")]
        );
        assert!(split.split(b"\xff").is_err());
        assert!(split.split(b"a\t\\377").is_err());
        assert!(split.split(b"\\303\t\\251").is_err());
    }
}
