//! `COPY ... TO STDOUT (FORMAT binary)`: its framing, and the values of the
//! built-in types the backfill reads in it. Binary spares the server its
//! output functions (a timestamptz or a numeric printed as text) and weir
//! the parsing back; a table with a column of any other type, or one whose
//! key would need a text form Postgres prints by its session settings, is
//! read as text (`decode.rs`).
//!
//! The formats are Postgres' `*send` functions: big-endian integers,
//! timestamps in microseconds and dates in days since 2000-01-01, numerics
//! as base-10000 digits, text as its bytes.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::Bytes;

use super::decode::{PgKind, end_of_day, infinite, not_finite_numeric, unfit_decimal};
use crate::change::Value;

/// What a binary COPY starts with, before its flags and header extension.
const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";
/// Microseconds and days from 1970-01-01 to 2000-01-01, Postgres' epoch.
const EPOCH_MICROS: i64 = 946_684_800_000_000;
const EPOCH_DAYS: i32 = 10_957;
const DAY_MICROS: i64 = 86_400_000_000;

/// Built-in type OIDs (`pg_type.oid`, fixed since Postgres began).
mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const FLOAT8: u32 = 701;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
}

/// Whether a column of type `type_oid` (a domain has its own OID, and is
/// read as text) comes in binary COPY as [`decode_binary`] reads it into
/// `kind`. Not `real`: a float4 widened from its bits is not the double
/// its text form parses to, which is what the stream (text) carries.
pub fn reads_binary(type_oid: u32, kind: &PgKind) -> bool {
    use oid::*;
    matches!(
        (type_oid, kind),
        (BOOL, PgKind::Bool)
            | (INT2 | INT4, PgKind::Int32)
            | (INT8, PgKind::Int64)
            | (FLOAT8, PgKind::Float64)
            | (NUMERIC, PgKind::Decimal { .. })
            | (BYTEA, PgKind::Bytea)
            | (UUID, PgKind::Uuid)
            | (DATE, PgKind::Date)
            | (TIME, PgKind::Time)
            | (TIMESTAMP, PgKind::Timestamp)
            | (TIMESTAMPTZ, PgKind::TimestampTz)
            | (TEXT | VARCHAR | BPCHAR | NAME, PgKind::Text)
    )
}

/// Whether a key column of this kind gets its text form (kept in the
/// backfill's positions, read back as a literal on resume) from its binary
/// value exactly as Postgres prints it, whatever the session's settings.
pub fn prints_key(kind: &PgKind) -> bool {
    matches!(kind, PgKind::Int32 | PgKind::Int64 | PgKind::Uuid)
}

/// The text form Postgres prints for a key value [`prints_key`] accepts.
pub fn key_text(value: &Value, out: &mut String) {
    out.clear();
    match value {
        Value::Int32(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Int64(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Binary(bytes) if bytes.len() == 16 => {
            for (i, b) in bytes.iter().enumerate() {
                if matches!(i, 4 | 6 | 8 | 10) {
                    out.push('-');
                }
                let _ = write!(out, "{b:02x}");
            }
        }
        _ => {}
    }
}

/// Splits a binary COPY's data into rows, wherever the server's messages
/// end (it sends a row per message, but the protocol promises nothing).
#[derive(Default)]
pub struct BinaryRows {
    data: Bytes,
    /// Where the unread part of `data` starts.
    at: usize,
    header_read: bool,
    ended: bool,
    /// The fields of the row last returned: byte ranges in `data`, None
    /// for NULL.
    fields: Vec<Option<Range<usize>>>,
}

/// The fields of one row, borrowed from its [`BinaryRows`].
pub struct BinaryFields<'a> {
    data: &'a [u8],
    ranges: &'a [Option<Range<usize>>],
}

impl BinaryFields<'_> {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Field `i` (None for NULL); panics past [`BinaryFields::len`].
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.ranges[i].clone().map(|r| &self.data[r])
    }
}

fn be_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl BinaryRows {
    /// Adds one message of the COPY's data.
    pub fn push(&mut self, data: Bytes) {
        if self.at >= self.data.len() {
            self.data = data;
        } else {
            // A row continues from the last message: join the two.
            let mut joined = Vec::with_capacity(self.data.len() - self.at + data.len());
            joined.extend_from_slice(&self.data[self.at..]);
            joined.extend_from_slice(&data);
            self.data = joined.into();
        }
        self.at = 0;
    }

    /// The next whole row; None when the data pushed so far ends before
    /// one does, or at the trailer.
    pub fn next_row(&mut self) -> Result<Option<BinaryFields<'_>>, String> {
        if !self.header_read && !self.read_header()? {
            return Ok(None);
        }
        let rest = &self.data[self.at..];
        if rest.is_empty() {
            return Ok(None);
        }
        if self.ended {
            return Err(format!("{} bytes after the trailer", rest.len()));
        }
        let Some(count) = be_u16(rest, 0) else {
            return Ok(None);
        };
        if count == u16::MAX {
            self.ended = true;
            self.at += 2;
            return match self.data.len() - self.at {
                0 => Ok(None),
                n => Err(format!("{n} bytes after the trailer")),
            };
        }
        if count > 1600 {
            // MaxTupleAttributeNumber: more is no row Postgres can send.
            return Err(format!("a row of {count} fields"));
        }
        self.fields.clear();
        let mut at = 2;
        for _ in 0..count {
            let Some(len) = be_u32(rest, at) else {
                return Ok(None);
            };
            at += 4;
            if len == u32::MAX {
                self.fields.push(None);
                continue;
            }
            let len = len as usize;
            if len > rest.len() - at {
                if len > 1 << 30 {
                    return Err(format!("a field of {len} bytes"));
                }
                return Ok(None);
            }
            self.fields.push(Some(self.at + at..self.at + at + len));
            at += len;
        }
        self.at += at;
        Ok(Some(BinaryFields {
            data: &self.data,
            ranges: &self.fields,
        }))
    }

    /// Reads the signature, flags and header extension; false when the
    /// data so far is shorter.
    fn read_header(&mut self) -> Result<bool, String> {
        let rest = &self.data[self.at..];
        let known = rest.len().min(SIGNATURE.len());
        if rest[..known] != SIGNATURE[..known] {
            return Err("the data does not start with the binary COPY signature".into());
        }
        let (Some(flags), Some(extension)) = (be_u32(rest, 11), be_u32(rest, 15)) else {
            return Ok(false);
        };
        // Bit 16 says each row carries its OID; bits 17-31 are flags a
        // reader must understand. The backfill asks for neither.
        if flags >> 16 != 0 {
            return Err(format!(
                "header flags {flags:#x}, which this reader does not know"
            ));
        }
        let header = 19 + extension as usize;
        if rest.len() < header {
            return Ok(false);
        }
        self.at += header;
        self.header_read = true;
        Ok(true)
    }

    /// After the last message: the data ended with the trailer.
    pub fn finish(&self) -> Result<(), String> {
        if self.ended {
            Ok(())
        } else if self.at < self.data.len() {
            Err("the data ended inside a row".into())
        } else {
            Err("the data ended without the binary COPY trailer".into())
        }
    }
}

/// Decodes one non-null value of a type [`reads_binary`] accepts. As with
/// text, a value the column's Arrow type cannot hold exactly is an error
/// saying why; the caller names the table, column and key.
pub fn decode_binary(kind: &PgKind, b: &[u8]) -> Result<Value, String> {
    let sized = |n: usize, what: &str| {
        if b.len() == n {
            Ok(())
        } else {
            Err(format!("a binary {what} of {} bytes, not {n}", b.len()))
        }
    };
    Ok(match kind {
        PgKind::Bool => {
            sized(1, "boolean")?;
            Value::Bool(b[0] != 0)
        }
        PgKind::Int32 => match b.len() {
            2 => Value::Int32(i16::from_be_bytes([b[0], b[1]]).into()),
            _ => {
                sized(4, "integer")?;
                Value::Int32(i32::from_be_bytes(b.try_into().expect("4 bytes")))
            }
        },
        PgKind::Int64 => {
            sized(8, "bigint")?;
            Value::Int64(i64::from_be_bytes(b.try_into().expect("8 bytes")))
        }
        PgKind::Float64 => {
            sized(8, "double precision")?;
            Value::Float64(f64::from_be_bytes(b.try_into().expect("8 bytes")))
        }
        PgKind::Decimal { precision, scale } => Value::Decimal128(numeric(b, *precision, *scale)?),
        PgKind::Bytea => Value::Binary(b.to_vec()),
        PgKind::Uuid => {
            sized(16, "uuid")?;
            Value::Binary(b.to_vec())
        }
        PgKind::Date => {
            sized(4, "date")?;
            let days = i32::from_be_bytes(b.try_into().expect("4 bytes"));
            match days {
                i32::MAX => return Err(infinite("date", "infinity")),
                i32::MIN => return Err(infinite("date", "-infinity")),
                _ => {
                    Value::Date32(days.checked_add(EPOCH_DAYS).ok_or_else(|| {
                        format!("date {days} days after 2000-01-01 is out of range")
                    })?)
                }
            }
        }
        PgKind::Time => {
            sized(8, "time")?;
            let micros = i64::from_be_bytes(b.try_into().expect("8 bytes"));
            if micros == DAY_MICROS {
                return Err(end_of_day("24:00:00"));
            }
            if !(0..DAY_MICROS).contains(&micros) {
                return Err(format!(
                    "time of {micros} microseconds is not a time of day"
                ));
            }
            Value::Int64(micros)
        }
        PgKind::Timestamp | PgKind::TimestampTz => {
            let name = if *kind == PgKind::TimestampTz {
                "timestamptz"
            } else {
                "timestamp"
            };
            sized(8, name)?;
            let micros = i64::from_be_bytes(b.try_into().expect("8 bytes"));
            match micros {
                i64::MAX => return Err(infinite(name, "infinity")),
                i64::MIN => return Err(infinite(name, "-infinity")),
                _ => Value::TimestampMicros(micros.checked_add(EPOCH_MICROS).ok_or_else(|| {
                    format!("{name} {micros} microseconds after 2000-01-01 is out of range")
                })?),
            }
        }
        PgKind::Text => Value::Utf8(
            std::str::from_utf8(b)
                .map_err(|e| format!("text that is not UTF-8 ({e})"))?
                .to_string(),
        ),
        PgKind::Array(_) => return Err("an array, which the backfill reads as text".into()),
    })
}

/// A binary numeric as the unscaled value of a decimal(`precision`,
/// `scale`), when it is one exactly.
fn numeric(b: &[u8], precision: u8, scale: i8) -> Result<i128, String> {
    let header = |at| be_u16(b, at).ok_or("a binary numeric shorter than its header");
    let ndigits = usize::from(header(0)?);
    let weight = i32::from(header(2)? as i16);
    let sign = header(4)?;
    let dscale = header(6)?;
    if b.len() != 8 + 2 * ndigits {
        return Err(format!(
            "a binary numeric of {} bytes with {ndigits} digits",
            b.len()
        ));
    }
    let digits: Vec<u16> = (0..ndigits)
        .map(|i| be_u16(b, 8 + 2 * i).expect("length checked"))
        .collect();
    if let Some(d) = digits.iter().find(|&&d| d >= 10_000) {
        return Err(format!("a binary numeric digit {d}, past base 10000"));
    }
    let negative = match sign {
        0x0000 => false,
        0x4000 => true,
        0xC000 | 0xD000 | 0xF000 => {
            let text = match sign {
                0xC000 => "NaN",
                0xD000 => "Infinity",
                _ => "-Infinity",
            };
            return Err(not_finite_numeric(text));
        }
        _ => return Err(format!("a binary numeric with sign {sign:#x}")),
    };
    let unfit = || {
        let text = numeric_text(negative, weight, dscale, &digits);
        unfit_decimal(&text, precision, scale)
    };
    let scale = i32::from(scale.max(0));
    let mut value: i128 = 0;
    for (i, &d) in digits.iter().enumerate() {
        if d == 0 {
            continue;
        }
        // Digit i stands for d * 10000^(weight - i): at the decimal's
        // scale, d * 10^exponent.
        let exponent = 4 * (weight - i as i32) + scale;
        let term = if exponent >= 0 {
            10i128
                .checked_pow(exponent as u32)
                .and_then(|p| p.checked_mul(i128::from(d)))
                .ok_or_else(unfit)?
        } else {
            let divisor = 10i128
                .checked_pow(exponent.unsigned_abs())
                .unwrap_or(i128::MAX);
            if i128::from(d) % divisor != 0 {
                return Err(unfit());
            }
            i128::from(d) / divisor
        };
        value = value.checked_add(term).ok_or_else(unfit)?;
    }
    if value.unsigned_abs() >= 10u128.pow(u32::from(precision)) {
        return Err(unfit());
    }
    Ok(if negative { -value } else { value })
}

/// A binary numeric's text form, as Postgres prints it (for errors).
fn numeric_text(negative: bool, weight: i32, dscale: u16, digits: &[u16]) -> String {
    let digit = |i: i32| {
        usize::try_from(i)
            .ok()
            .and_then(|i| digits.get(i))
            .copied()
            .unwrap_or(0)
    };
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    }
    for i in 0..=weight {
        if i == 0 {
            let _ = write!(out, "{}", digit(i));
        } else {
            let _ = write!(out, "{:04}", digit(i));
        }
    }
    if dscale > 0 {
        out.push('.');
        let mut fraction = String::new();
        let mut i = weight + 1;
        while fraction.len() < usize::from(dscale) {
            let _ = write!(fraction, "{:04}", digit(i));
            i += 1;
        }
        out.push_str(&fraction[..usize::from(dscale)]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary numeric from its parts.
    fn numeric_bytes(weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(digits.len() as u16).to_be_bytes());
        b.extend_from_slice(&weight.to_be_bytes());
        b.extend_from_slice(&sign.to_be_bytes());
        b.extend_from_slice(&dscale.to_be_bytes());
        for d in digits {
            b.extend_from_slice(&d.to_be_bytes());
        }
        b
    }

    #[test]
    fn numerics_become_unscaled_decimals_when_they_fit_exactly() {
        let dec = |precision, scale| PgKind::Decimal { precision, scale };
        // 12345.67 = [1, 2345, 6700], weight 1.
        let b = numeric_bytes(1, 0, 2, &[1, 2345, 6700]);
        assert_eq!(
            decode_binary(&dec(10, 2), &b),
            Ok(Value::Decimal128(1_234_567))
        );
        assert_eq!(
            decode_binary(&dec(10, 4), &b),
            Ok(Value::Decimal128(123_456_700))
        );
        assert_eq!(
            decode_binary(&dec(10, 1), &b),
            Err("numeric 12345.67 does not fit decimal(10, 1) exactly".into())
        );
        assert_eq!(
            decode_binary(&dec(6, 2), &b),
            Err("numeric 12345.67 does not fit decimal(6, 2) exactly".into())
        );
        // -0.0005 = [5], weight -1 (0.0005 is 5 * 10000^-1).
        let small = numeric_bytes(-1, 0x4000, 4, &[5]);
        assert_eq!(
            decode_binary(&dec(10, 4), &small),
            Ok(Value::Decimal128(-5))
        );
        assert_eq!(
            decode_binary(&dec(10, 3), &small),
            Err("numeric -0.0005 does not fit decimal(10, 3) exactly".into())
        );
        // 20000 = [2], weight 1; zero has no digits.
        assert_eq!(
            decode_binary(&dec(10, 0), &numeric_bytes(1, 0, 0, &[2])),
            Ok(Value::Decimal128(20_000))
        );
        assert_eq!(
            decode_binary(&dec(10, 2), &numeric_bytes(0, 0, 2, &[])),
            Ok(Value::Decimal128(0))
        );
        let nan = decode_binary(&dec(10, 2), &numeric_bytes(0, 0xC000, 0, &[])).unwrap_err();
        assert!(nan.starts_with("numeric NaN has no decimal form"), "{nan}");
        assert!(decode_binary(&dec(10, 2), &b[..9]).is_err());
    }

    #[test]
    fn times_count_from_2000_and_infinities_are_refused() {
        let micros = |v: i64| v.to_be_bytes().to_vec();
        assert_eq!(
            decode_binary(&PgKind::TimestampTz, &micros(1_000_000)),
            Ok(Value::TimestampMicros(EPOCH_MICROS + 1_000_000))
        );
        assert_eq!(
            decode_binary(&PgKind::Date, &(-1i32).to_be_bytes()),
            Ok(Value::Date32(EPOCH_DAYS - 1))
        );
        let inf = decode_binary(&PgKind::Timestamp, &micros(i64::MAX)).unwrap_err();
        assert!(
            inf.starts_with("timestamp infinity has no equivalent"),
            "{inf}"
        );
        let end = decode_binary(&PgKind::Time, &micros(DAY_MICROS)).unwrap_err();
        assert!(end.starts_with("time 24:00:00"), "{end}");
        assert_eq!(
            decode_binary(&PgKind::Int32, &(-7i16).to_be_bytes()),
            Ok(Value::Int32(-7))
        );
        assert!(decode_binary(&PgKind::Int64, &[0; 4]).is_err());
        assert!(decode_binary(&PgKind::Text, &[0xff]).is_err());
    }

    #[test]
    fn key_texts_are_what_postgres_prints() {
        let mut out = String::new();
        key_text(&Value::Int64(-42), &mut out);
        assert_eq!(out, "-42");
        let uuid: Vec<u8> = (0u8..16).collect();
        key_text(&Value::Binary(uuid), &mut out);
        assert_eq!(out, "00010203-0405-0607-0809-0a0b0c0d0e0f");
    }

    /// A binary COPY of rows `(int4, text)`, the text null in the second.
    fn copy_data() -> Vec<u8> {
        let mut b = SIGNATURE.to_vec();
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&0u32.to_be_bytes());
        for (id, text) in [(1i32, Some("one")), (2, None)] {
            b.extend_from_slice(&2u16.to_be_bytes());
            b.extend_from_slice(&4u32.to_be_bytes());
            b.extend_from_slice(&id.to_be_bytes());
            match text {
                Some(t) => {
                    b.extend_from_slice(&(t.len() as u32).to_be_bytes());
                    b.extend_from_slice(t.as_bytes());
                }
                None => b.extend_from_slice(&u32::MAX.to_be_bytes()),
            }
        }
        b.extend_from_slice(&u16::MAX.to_be_bytes());
        b
    }

    /// Every row of `messages`, as (int4, text) pairs.
    fn rows_of(messages: &[&[u8]]) -> Result<Vec<(i32, Option<String>)>, String> {
        let mut rows = BinaryRows::default();
        let mut out = Vec::new();
        for m in messages {
            rows.push(Bytes::copy_from_slice(m));
            while let Some(fields) = rows.next_row()? {
                assert_eq!(fields.len(), 2);
                let id = i32::from_be_bytes(fields.get(0).unwrap().try_into().unwrap());
                let text = fields
                    .get(1)
                    .map(|t| String::from_utf8(t.to_vec()).unwrap());
                out.push((id, text));
            }
        }
        rows.finish()?;
        Ok(out)
    }

    #[test]
    fn rows_are_found_wherever_the_messages_split_them() {
        let data = copy_data();
        let want = vec![(1, Some("one".to_string())), (2, None)];
        assert_eq!(rows_of(&[&data]), Ok(want.clone()));
        for cut in 1..data.len() {
            let (a, b) = data.split_at(cut);
            assert_eq!(rows_of(&[a, b]), Ok(want.clone()), "split at {cut}");
        }
        let one_byte: Vec<&[u8]> = data.chunks(1).collect();
        assert_eq!(rows_of(&one_byte), Ok(want));
    }

    #[test]
    fn a_copy_cut_short_or_not_binary_is_an_error() {
        let data = copy_data();
        assert_eq!(
            rows_of(&[&data[..data.len() - 2]]),
            Err("the data ended without the binary COPY trailer".into())
        );
        assert_eq!(
            rows_of(&[&data[..data.len() - 5]]),
            Err("the data ended inside a row".into())
        );
        assert!(rows_of(&[b"1\tone\n"]).is_err());
        let mut extra = data.clone();
        extra.push(0);
        assert_eq!(rows_of(&[&extra]), Err("1 bytes after the trailer".into()));
    }
}
