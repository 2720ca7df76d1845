//! Row images of a binlog rows event, decoded straight into the pipeline's
//! values with what the table map says of each column worked out once per
//! map, not once per value.
//!
//! The common column types (integers, floats, exact decimals up to 38
//! digits, DATETIME2, TIMESTAMP2, VARCHAR and the TEXT/BLOB types) are read
//! from their binlog bytes here. Every other type, and every value the fast
//! path does not take as it is (a zero date, say), is read by the client
//! library's own decoder and turned into a value by [`convert`], which also
//! serves the backfill: the two paths meet the same type tests. The client
//! library's own row reader built a column description for every value of
//! every row, and decimals and timestamps went through text on the way
//! (docs/mysql.md, Performance).

use mysql_async::Value as My;
use mysql_async::binlog::events::{OptionalMetadataField, RowsEventData, TableMapEvent};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_common::io::ParseBuf;

use super::types::{Charset, Kind, Origin, convert, latin1};
use crate::change::Value;

/// Why a row image could not be read.
#[derive(Debug, PartialEq)]
pub(super) enum RowError {
    /// The bytes do not hold what the table map says.
    Read(String),
    /// The image leaves out column `.0`, which is wanted.
    Missing(usize),
    /// Column `.0`'s value has no value in its destination type.
    Convert(usize, String),
}

/// How a column's binlog bytes are read.
#[derive(Clone, Copy, Debug)]
enum Fast {
    /// Little-endian integer of `bytes` bytes, into the kind's value.
    Int {
        bytes: u8,
        unsigned: bool,
    },
    Float,
    Double,
    /// MySQL's binary decimal, precision at most 38.
    Decimal {
        precision: u8,
        scale: u8,
    },
    /// DATETIME2 with `fsp` fractional digits.
    DateTime2 {
        fsp: u8,
    },
    /// TIMESTAMP2 with `fsp` fractional digits.
    Timestamp2 {
        fsp: u8,
    },
    /// A length of `prefix` bytes, then the bytes: as text in `charset`,
    /// or as bytes when None.
    Counted {
        prefix: u8,
        text: Option<Charset>,
    },
    /// Read by the client library, turned into a value by [`convert`].
    Library,
}

#[derive(Clone, Debug)]
struct Column {
    ty: ColumnType,
    meta: Vec<u8>,
    unsigned: bool,
    kind: Kind,
    fast: Fast,
}

/// Each column of a table map: its binlog type, metadata, signedness, and
/// the kind the source reads it as.
#[derive(Clone, Debug, Default)]
pub(super) struct RowLayout {
    columns: Vec<Column>,
    /// The table's width: a map older than an ADD COLUMN has fewer
    /// columns, and the rest read null.
    width: usize,
}

/// Which columns of an image to turn into values; the others are read
/// past and left null.
#[derive(Clone, Copy)]
pub(super) enum Wanted<'a> {
    All,
    /// Only these columns (a before image needs only the key).
    Only(&'a [usize]),
}

impl Wanted<'_> {
    fn wants(&self, i: usize) -> bool {
        match self {
            Wanted::All => true,
            Wanted::Only(columns) => columns.contains(&i),
        }
    }
}

impl RowLayout {
    /// The layout of `map`, whose columns `kinds` begins with (the map was
    /// checked against the table's columns before).
    pub fn of(map: &TableMapEvent<'_>, kinds: &[Kind]) -> Result<RowLayout, String> {
        let mut unsigned: Vec<bool> = Vec::new();
        for field in map.iter_optional_meta() {
            if let Ok(OptionalMetadataField::Signedness(bits)) = field {
                unsigned = bits.iter().map(|b| *b).collect();
            }
        }
        let count = map.columns_count() as usize;
        if count > kinds.len() {
            return Err(format!(
                "the table map has {count} columns, the table {}",
                kinds.len()
            ));
        }
        let mut numeric = 0;
        let mut columns = Vec::new();
        for (i, kind) in kinds.iter().enumerate().take(count) {
            let ty = match map.get_column_type(i) {
                Ok(Some(ty)) => ty,
                _ => return Err(format!("column {i} has no type in the table map")),
            };
            let meta = map.get_column_metadata(i).unwrap_or(&[]).to_vec();
            let is_unsigned = if ty.is_numeric_type() {
                numeric += 1;
                unsigned.get(numeric - 1).copied().unwrap_or(false)
            } else {
                false
            };
            let fast = fast_of(ty, &meta, is_unsigned, kind);
            columns.push(Column {
                ty,
                meta,
                unsigned: is_unsigned,
                kind: kind.clone(),
                fast,
            });
        }
        Ok(RowLayout {
            columns,
            width: kinds.len(),
        })
    }

    /// The rows of `event`: (before image, after image), each with one
    /// value per column of the table (null where not wanted), or None
    /// where the event has no such image.
    pub fn rows(
        &self,
        event: &RowsEventData<'_>,
        before: Wanted<'_>,
        after: Wanted<'_>,
    ) -> Result<Vec<RowPair>, RowError> {
        if matches!(event, RowsEventData::PartialUpdateRowsEvent(_)) {
            return Err(RowError::Read(
                "the binlog holds a partial JSON update: set binlog_row_value_options='' on the \
                 server"
                    .into(),
            ));
        }
        let before_present: Option<Vec<bool>> = event
            .columns_before_image()
            .map(|b| b.iter().map(|x| *x).collect());
        let after_present: Option<Vec<bool>> = event
            .columns_after_image()
            .map(|b| b.iter().map(|x| *x).collect());
        let mut buf = event.rows_data();
        let mut rows = Vec::new();
        while !buf.is_empty() {
            let old = match &before_present {
                Some(present) => Some(self.image(present, &mut buf, before)?),
                None => None,
            };
            let new = match &after_present {
                Some(present) => Some(self.image(present, &mut buf, after)?),
                None => None,
            };
            rows.push((old, new));
        }
        Ok(rows)
    }

    /// One image: a bitmap of which present columns are null, then the
    /// values of the others, in column order.
    fn image(
        &self,
        present: &[bool],
        buf: &mut &[u8],
        wanted: Wanted<'_>,
    ) -> Result<Vec<Value>, RowError> {
        let is_present = |i: usize| present.get(i).copied().unwrap_or(false);
        let count = (0..self.columns.len()).filter(|&i| is_present(i)).count();
        let nulls = take(buf, count.div_ceil(8))
            .map_err(|e| RowError::Read(format!("a row's null bitmap: {e}")))?;
        let mut values = Vec::with_capacity(self.width);
        let mut in_image = 0;
        for (i, column) in self.columns.iter().enumerate() {
            let wants = wanted.wants(i);
            if !is_present(i) {
                if wants {
                    return Err(RowError::Missing(i));
                }
                values.push(Value::Null);
                continue;
            }
            let is_null = nulls[in_image / 8] & (1 << (in_image % 8)) != 0;
            in_image += 1;
            if is_null {
                values.push(Value::Null);
                continue;
            }
            let value = column.read(buf, wants).map_err(|e| e.at(i, column.ty))?;
            values.push(value);
        }
        // Columns added after the map was written: null in its rows.
        values.resize(self.width, Value::Null);
        Ok(values)
    }
}

/// The fast reading of a column logged as `ty` and read as `kind`, where
/// there is one.
fn fast_of(ty: ColumnType, meta: &[u8], unsigned: bool, kind: &Kind) -> Fast {
    use ColumnType::*;
    match (ty, kind) {
        (MYSQL_TYPE_TINY, Kind::Int { .. }) => Fast::Int { bytes: 1, unsigned },
        (MYSQL_TYPE_SHORT, Kind::Int { .. }) => Fast::Int { bytes: 2, unsigned },
        (MYSQL_TYPE_INT24, Kind::Int { .. }) => Fast::Int { bytes: 3, unsigned },
        (MYSQL_TYPE_LONG, Kind::Int { .. }) => Fast::Int { bytes: 4, unsigned },
        (MYSQL_TYPE_LONGLONG, Kind::Int { .. }) => Fast::Int { bytes: 8, unsigned },
        (MYSQL_TYPE_FLOAT, Kind::Float) => Fast::Float,
        (MYSQL_TYPE_DOUBLE, Kind::Double) => Fast::Double,
        (MYSQL_TYPE_NEWDECIMAL, Kind::Decimal { precision, scale })
            if *precision <= 38
                && *scale <= *precision
                && meta.first() == Some(precision)
                && meta.get(1) == Some(scale) =>
        {
            Fast::Decimal {
                precision: *precision,
                scale: *scale,
            }
        }
        (MYSQL_TYPE_DATETIME2, Kind::DateTime) => Fast::DateTime2 {
            fsp: meta.first().copied().unwrap_or(0),
        },
        (MYSQL_TYPE_TIMESTAMP2, Kind::Timestamp) => Fast::Timestamp2 {
            fsp: meta.first().copied().unwrap_or(0),
        },
        (
            MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING,
            Kind::Text { .. } | Kind::Binary { pad_to: None },
        ) if meta.len() >= 2 => {
            let max = u16::from_le_bytes([meta[0], meta[1]]);
            Fast::Counted {
                prefix: if max < 256 { 1 } else { 2 },
                text: text_of(kind),
            }
        }
        (
            MYSQL_TYPE_TINY_BLOB | MYSQL_TYPE_BLOB | MYSQL_TYPE_MEDIUM_BLOB | MYSQL_TYPE_LONG_BLOB,
            Kind::Text { .. } | Kind::Binary { pad_to: None },
        ) if matches!(meta.first(), Some(1..=4)) => Fast::Counted {
            prefix: meta[0],
            text: text_of(kind),
        },
        _ => Fast::Library,
    }
}

fn text_of(kind: &Kind) -> Option<Charset> {
    match kind {
        Kind::Text { charset } => Some(*charset),
        _ => None,
    }
}

/// A column's failure before the column is known.
enum ReadError {
    Bytes(String),
    Convert(String),
}

impl ReadError {
    fn at(self, column: usize, ty: ColumnType) -> RowError {
        match self {
            ReadError::Bytes(e) => RowError::Read(format!("column {column} ({ty:?}): {e}")),
            ReadError::Convert(e) => RowError::Convert(column, e),
        }
    }
}

impl Column {
    /// The value at the front of `buf`, which moves past it; Null when the
    /// value is not wanted.
    fn read(&self, buf: &mut &[u8], wanted: bool) -> Result<Value, ReadError> {
        let value = match self.fast {
            Fast::Int { bytes: n, unsigned } => {
                let raw = bytes(buf, usize::from(n))?;
                if !wanted {
                    return Ok(Value::Null);
                }
                int_value(raw, unsigned)
            }
            Fast::Float => {
                let raw = bytes(buf, 4)?;
                let f = f32::from_le_bytes(raw.try_into().expect("four bytes"));
                Value::Float64(f64::from(f))
            }
            Fast::Double => {
                let raw = bytes(buf, 8)?;
                Value::Float64(f64::from_le_bytes(raw.try_into().expect("eight bytes")))
            }
            Fast::Decimal { precision, scale } => {
                let raw = bytes(buf, decimal_size(precision, scale))?;
                if !wanted {
                    return Ok(Value::Null);
                }
                match decimal_value(raw, precision, scale) {
                    Some(v) => Value::Decimal128(v),
                    None => {
                        return Err(ReadError::Convert(format!(
                            "the binlog's bytes {raw:02x?} hold no decimal({precision},{scale})"
                        )));
                    }
                }
            }
            Fast::DateTime2 { fsp } => {
                let raw = bytes(buf, 5 + fraction_size(fsp))?;
                if !wanted {
                    return Ok(Value::Null);
                }
                match datetime2_micros(raw, fsp) {
                    Some(micros) => Value::TimestampMicros(micros),
                    // A zero or odd date: the library's reading, for the
                    // error the backfill gives too.
                    None => return self.by_library(&mut &raw[..]),
                }
            }
            Fast::Timestamp2 { fsp } => {
                let raw = bytes(buf, 4 + fraction_size(fsp))?;
                if !wanted {
                    return Ok(Value::Null);
                }
                let secs = i64::from(u32::from_be_bytes(raw[..4].try_into().expect("four")));
                let micros = secs * 1_000_000 + i64::from(fraction(&raw[4..], fsp));
                if micros == 0 {
                    return self.by_library(&mut &raw[..]);
                }
                Value::TimestampMicros(micros)
            }
            Fast::Counted { prefix, text } => {
                let len = bytes(buf, usize::from(prefix))?;
                let mut n = [0u8; 4];
                n[..len.len()].copy_from_slice(len);
                let raw = bytes(buf, u32::from_le_bytes(n) as usize)?;
                if !wanted {
                    return Ok(Value::Null);
                }
                match text {
                    Some(Charset::Utf8) => Value::Utf8(
                        std::str::from_utf8(raw)
                            .map_err(|e| {
                                ReadError::Convert(format!("text that is not valid UTF-8 ({e})"))
                            })?
                            .to_owned(),
                    ),
                    Some(Charset::Latin1) => Value::Utf8(latin1(raw)),
                    None => Value::Binary(raw.to_vec()),
                }
            }
            Fast::Library => {
                let value = self.by_library(buf)?;
                if !wanted {
                    return Ok(Value::Null);
                }
                value
            }
        };
        Ok(value)
    }

    /// The value read by the client library's decoder and [`convert`].
    fn by_library(&self, buf: &mut &[u8]) -> Result<Value, ReadError> {
        // Read from a copy of the slice, whose lifetime may be as short as
        // the metadata's; then move the slice past what it read.
        let mut here = ParseBuf(buf);
        let value: BinlogValue<'_> = here
            .parse((self.ty, self.meta.as_slice(), self.unsigned, false))
            .map_err(|e| ReadError::Bytes(e.to_string()))?;
        let read = buf.len() - here.0.len();
        *buf = &buf[read..];
        let value = match value {
            BinlogValue::Value(v) => v,
            json @ BinlogValue::Jsonb(_) => {
                My::try_from(json).map_err(|e| ReadError::Bytes(format!("JSON value: {e}")))?
            }
            BinlogValue::JsonDiff(_) => {
                return Err(ReadError::Bytes("a partial JSON update".into()));
            }
        };
        convert(&self.kind, value, Origin::Binlog).map_err(ReadError::Convert)
    }
}

fn bytes<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], ReadError> {
    take(buf, n).map_err(ReadError::Bytes)
}

/// The first `n` bytes of `buf`, which moves past them.
fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if buf.len() < n {
        return Err(format!("the row ends {} bytes early", n - buf.len()));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// A binlog integer (little-endian, `raw.len()` bytes) as the source's
/// value for its width: BIGINT UNSIGNED an exact decimal, INT UNSIGNED and
/// BIGINT 64 bits, the rest 32.
fn int_value(raw: &[u8], unsigned: bool) -> Value {
    let mut le = [0u8; 8];
    le[..raw.len()].copy_from_slice(raw);
    let bits = u64::from_le_bytes(le);
    let width = 8 * raw.len() as u32;
    if unsigned {
        return match raw.len() {
            8 => Value::Decimal128(i128::from(bits)),
            4 => Value::Int64(bits as i64),
            _ => Value::Int32(bits as i32),
        };
    }
    // Sign-extend from the value's width.
    let signed = ((bits << (64 - width)) as i64) >> (64 - width);
    match raw.len() {
        8 => Value::Int64(signed),
        _ => Value::Int32(signed as i32),
    }
}

/// Bytes that hold `digits` decimal digits (under nine) in MySQL's binary
/// decimal.
const DIGIT_BYTES: [usize; 10] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4];

fn decimal_size(precision: u8, scale: u8) -> usize {
    let whole = usize::from(precision - scale);
    let frac = usize::from(scale);
    (whole / 9) * 4 + DIGIT_BYTES[whole % 9] + (frac / 9) * 4 + DIGIT_BYTES[frac % 9]
}

/// MySQL's binary decimal (`raw`, `decimal_size` bytes) as its unscaled
/// value. Digits come in groups of nine, four big-endian bytes each, with
/// the leftover whole digits first and the leftover fraction digits last in
/// fewer bytes; the first byte's top bit is set for a positive number, and
/// a negative one has every byte inverted. None when the bytes hold more
/// digits than the precision (a group over 999,999,999, say).
fn decimal_value(raw: &[u8], precision: u8, scale: u8) -> Option<i128> {
    let whole = usize::from(precision - scale);
    let frac = usize::from(scale);
    let negative = raw.first()? & 0x80 == 0;
    let mut at = 0;
    // The next group of `digits` digits, None when it holds more.
    let mut group = |digits: usize| -> Option<i128> {
        let n = if digits == 9 { 4 } else { DIGIT_BYTES[digits] };
        let mut v: u32 = 0;
        for (j, &b) in raw.get(at..at + n)?.iter().enumerate() {
            let b = if j + at == 0 { b ^ 0x80 } else { b };
            let b = if negative { !b } else { b };
            v = (v << 8) | u32::from(b);
        }
        at += n;
        (v < 10u32.pow(digits as u32)).then_some(i128::from(v))
    };
    let mut value: i128 = 0;
    if whole % 9 > 0 {
        value = group(whole % 9)?;
    }
    for _ in 0..whole / 9 + frac / 9 {
        value = value.checked_mul(1_000_000_000)?.checked_add(group(9)?)?;
    }
    if frac % 9 > 0 {
        value = value
            .checked_mul(10i128.pow((frac % 9) as u32))?
            .checked_add(group(frac % 9)?)?;
    }
    if value >= 10i128.pow(u32::from(precision)) {
        return None;
    }
    Some(if negative { -value } else { value })
}

fn fraction_size(fsp: u8) -> usize {
    usize::from(fsp).div_ceil(2)
}

/// The microseconds of a DATETIME2/TIMESTAMP2 fraction of `fsp` digits
/// (big-endian, one byte per two digits).
fn fraction(raw: &[u8], fsp: u8) -> u32 {
    let n = raw
        .iter()
        .take(fraction_size(fsp))
        .fold(0u32, |v, &b| (v << 8) | u32::from(b));
    match fraction_size(fsp) {
        1 => n * 10_000,
        2 => n * 100,
        _ => n,
    }
}

/// DATETIME2: five big-endian bytes (less 2^39) packing year*13+month,
/// day, hour, minute and second, then the fraction. None for a zero or
/// otherwise odd date, which the library's reading reports.
fn datetime2_micros(raw: &[u8], fsp: u8) -> Option<i64> {
    let packed = raw[..5].iter().fold(0i64, |v, &b| (v << 8) | i64::from(b)) - (1i64 << 39);
    if packed < 0 {
        return None;
    }
    let ymd = packed >> 17;
    let ym = ymd >> 5;
    let (year, month, day) = (ym / 13, (ym % 13) as u32, (ymd & 31) as u32);
    let hms = packed & 0x1_ffff;
    let (hour, minute, second) = (hms >> 12, (hms >> 6) & 63, hms & 63);
    if !(1..=12).contains(&month) || day == 0 || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let days = crate::postgres::decode::days_from_civil(year, month, day);
    let secs = days * 86_400 + (hour * 60 + minute) * 60 + second;
    Some(secs * 1_000_000 + i64::from(fraction(&raw[5..], fsp)))
}

/// A row's (before, after) images.
pub(super) type RowPair = (Option<Vec<Value>>, Option<Vec<Value>>);

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_common::binlog::decimal::Decimal;

    /// A decimal written by the client library at `precision`, `scale`
    /// (`text` has exactly `precision - scale` whole digits, the first not
    /// zero, and `scale` fraction digits), read back by the library and by
    /// us, both as text.
    fn both(text: &str, precision: u8, scale: u8) -> (String, String) {
        let decimal = Decimal::parse_str_bytes(text.as_bytes()).expect("a decimal");
        let mut raw = Vec::new();
        decimal.write_bin(&mut raw).expect("write");
        assert_eq!(raw.len(), decimal_size(precision, scale), "{text}");
        let theirs = Decimal::read_bin(&raw[..], precision.into(), scale.into(), false)
            .expect("read")
            .to_string();
        let ours = decimal_value(&raw, precision, scale).expect("in range");
        (theirs, show_unscaled(ours, scale))
    }

    /// A decimal's text without leading or trailing zeros, and without a
    /// sign on zero: the library and we may pad differently.
    fn canonical(text: &str) -> String {
        let negative = text.starts_with('-');
        let (whole, frac) = text
            .trim_start_matches('-')
            .split_once('.')
            .unwrap_or((text.trim_start_matches('-'), ""));
        let (whole, frac) = (whole.trim_start_matches('0'), frac.trim_end_matches('0'));
        let sign = if negative && !(whole.is_empty() && frac.is_empty()) {
            "-"
        } else {
            ""
        };
        format!("{sign}{whole}.{frac}")
    }

    fn show_unscaled(v: i128, scale: u8) -> String {
        let sign = if v < 0 { "-" } else { "" };
        let digits = v.unsigned_abs().to_string();
        let scale = usize::from(scale);
        if scale == 0 {
            return format!("{sign}{digits}");
        }
        let digits = format!("{digits:0>width$}", width = scale + 1);
        let (whole, frac) = digits.split_at(digits.len() - scale);
        format!("{sign}{whole}.{frac}")
    }

    #[test]
    fn binary_decimals_read_as_the_client_library_reads_them() {
        let cases: &[(&str, u8, u8)] = &[
            ("12345678.99", 10, 2),
            ("-12345678.99", 10, 2),
            (".01", 2, 2),
            ("-.01", 2, 2),
            ("999999999", 9, 0),
            ("-999999999", 9, 0),
            ("1234567890123456789", 19, 0),
            ("123456789.123456789", 18, 9),
            ("-123456789.123456789", 18, 9),
            ("99999999999999999999999999999.999999999", 38, 9),
            ("-99999999999999999999999999999.999999999", 38, 9),
            ("12345678901234567890123456789012345678", 38, 0),
            (".12345678901234567890123456789012345678", 38, 38),
            ("-.00000000000000000000000000000000000001", 38, 38),
            ("7.1", 2, 1),
            ("-3", 1, 0),
            ("42.4242", 6, 4),
        ];
        for &(text, precision, scale) in cases {
            let (theirs, ours) = both(text, precision, scale);
            assert_eq!(
                canonical(&ours),
                canonical(&theirs),
                "decimal({precision},{scale}) {text}"
            );
            assert_eq!(
                canonical(&ours),
                canonical(text),
                "decimal({precision},{scale}) {text}"
            );
        }
        // Random values of random shapes, against the library.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let precision = (next() % 38 + 1) as u8;
            let scale = (next() % (u64::from(precision) + 1)) as u8;
            let whole: String = (0..precision - scale)
                .map(|i| char::from(b'0' + (next() % 10) as u8).max(if i == 0 { '1' } else { '0' }))
                .collect();
            let frac: String = (0..scale)
                .map(|_| char::from(b'0' + (next() % 10) as u8))
                .collect();
            let sign = if next() % 2 == 0 { "-" } else { "" };
            let text = if scale > 0 {
                format!("{sign}{whole}.{frac}")
            } else {
                format!("{sign}{whole}")
            };
            let (theirs, ours) = both(&text, precision, scale);
            assert_eq!(
                canonical(&ours),
                canonical(&theirs),
                "decimal({precision},{scale}) {text}"
            );
        }
    }

    #[test]
    fn integers_of_every_width_and_sign() {
        assert_eq!(int_value(&[0xff], false), Value::Int32(-1));
        assert_eq!(int_value(&[0xff], true), Value::Int32(255));
        assert_eq!(int_value(&[0x00, 0x80], false), Value::Int32(-32768));
        assert_eq!(
            int_value(&[0xff, 0xff, 0x7f], false),
            Value::Int32(8_388_607)
        );
        assert_eq!(
            int_value(&[0x00, 0x00, 0x80], false),
            Value::Int32(-8_388_608)
        );
        assert_eq!(
            int_value(&[0xff, 0xff, 0xff], true),
            Value::Int32(16_777_215)
        );
        assert_eq!(int_value(&[0xff; 4], true), Value::Int64(4_294_967_295));
        assert_eq!(int_value(&[0xff; 4], false), Value::Int32(-1));
        assert_eq!(int_value(&[0xff; 8], false), Value::Int64(-1));
        assert_eq!(
            int_value(&[0xff; 8], true),
            Value::Decimal128(18_446_744_073_709_551_615)
        );
    }

    #[test]
    fn datetimes_and_timestamps_read_as_the_library_reads_them() {
        use mysql_common::binlog::misc::{datetime_from_packed, my_datetime_packed_from_binary};
        // 2024-02-29 23:59:58.123456 packed as DATETIME2(6), and at other
        // precisions.
        let (y, mo, d, h, mi, s) = (2024i64, 2i64, 29i64, 23i64, 59i64, 58i64);
        let ymd = ((y * 13 + mo) << 5) | d;
        let hms = (h << 12) | (mi << 6) | s;
        let int_part = ((ymd << 17) | hms) + (1i64 << 39);
        for (fsp, frac_bytes, micros) in [
            (0u8, vec![], 0u32),
            (2, vec![12u8], 120_000),
            (4, vec![0x04, 0xd2], 123_400),
            (6, vec![0x01, 0xe2, 0x40], 123_456),
        ] {
            let mut raw = int_part.to_be_bytes()[3..].to_vec();
            raw.extend(&frac_bytes);
            let theirs =
                datetime_from_packed(my_datetime_packed_from_binary(&raw[..], fsp.into()).unwrap());
            let My::Date(ty, tmo, td, th, tmi, ts, tus) = theirs else {
                panic!("{theirs:?}")
            };
            assert_eq!(
                (ty, tmo, td, th, tmi, ts, tus),
                (2024, 2, 29, 23, 59, 58, micros)
            );
            let expected = crate::postgres::decode::days_from_civil(2024, 2, 29) * 86_400_000_000
                + ((23 * 60 + 59) * 60 + 58) * 1_000_000
                + i64::from(micros);
            assert_eq!(datetime2_micros(&raw, fsp), Some(expected), "fsp {fsp}");
        }
        // A zero date goes to the library's reading.
        let zero = (1i64 << 39).to_be_bytes()[3..].to_vec();
        assert_eq!(datetime2_micros(&zero, 0), None);
        assert_eq!(fraction(&[0x01, 0xe2, 0x40], 5), 123_456);
        assert_eq!(fraction(&[99], 1), 990_000);
    }

    #[test]
    fn a_short_row_is_an_error_not_a_panic() {
        let mut buf: &[u8] = &[1, 2];
        assert!(take(&mut buf, 3).is_err());
        let column = Column {
            ty: ColumnType::MYSQL_TYPE_VARCHAR,
            meta: vec![10, 0],
            unsigned: false,
            kind: Kind::Text {
                charset: Charset::Utf8,
            },
            fast: Fast::Counted {
                prefix: 1,
                text: Some(Charset::Utf8),
            },
        };
        let mut buf: &[u8] = &[5, b'a', b'b'];
        assert!(matches!(
            column.read(&mut buf, true),
            Err(ReadError::Bytes(_))
        ));
        let mut buf: &[u8] = &[2, 0xff, 0xfe];
        assert!(matches!(
            column.read(&mut buf, true),
            Err(ReadError::Convert(_))
        ));
        let mut buf: &[u8] = &[2, b'h', b'i', 9];
        assert_eq!(
            column.read(&mut buf, true).ok(),
            Some(Value::Utf8("hi".into()))
        );
        assert_eq!(buf, &[9]);
    }
}
