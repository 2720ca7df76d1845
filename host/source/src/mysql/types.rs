//! Column types: what each MySQL/MariaDB type becomes in Arrow, and one
//! conversion of a server value into a [`Value`] for the backfill (binary
//! protocol, session time zone UTC, connection charset utf8mb4) and the
//! binlog (row events as `mysql_common` decodes them) alike. The table in
//! docs/mysql.md follows this file.

use arrow_schema::{DataType, TimeUnit};
use mysql_async::Value as My;
use mysql_async::consts::ColumnType;

use crate::change::{UTC_ZONE, Value};
use crate::postgres::decode::{days_from_civil, parse_decimal};

/// What a column holds, as the source reads it.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// TINYINT .. BIGINT; `bytes` is the storage width (1, 2, 3, 4, 8).
    Int {
        bytes: u8,
        unsigned: bool,
    },
    Decimal {
        precision: u8,
        scale: u8,
    },
    Float,
    Double,
    Date,
    /// DATETIME: a wall-clock time, no zone.
    DateTime,
    /// TIMESTAMP: an instant (the server keeps UTC).
    Timestamp,
    /// TIME, within one day (MySQL's longer durations are refused).
    Time,
    Year,
    /// CHAR, VARCHAR, TEXT, JSON (MariaDB's JSON is text), in `charset`.
    Text {
        charset: Charset,
    },
    /// BINARY(n) (right-padded with zero bytes to `pad_to`), VARBINARY, BLOB.
    Binary {
        pad_to: Option<usize>,
    },
    Enum(Vec<String>),
    Set(Vec<String>),
    Bit {
        bits: u16,
    },
}

/// The character sets whose bytes the source turns into text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charset {
    /// utf8mb4, utf8mb3 (utf8) and ascii: UTF-8 bytes.
    Utf8,
    /// MySQL's latin1, which is Windows-1252.
    Latin1,
}

impl Kind {
    /// The kind of an `information_schema.COLUMNS` row, or why the source
    /// cannot read the column.
    pub fn of_column(
        data_type: &str,
        column_type: &str,
        precision: Option<u64>,
        scale: Option<u64>,
        charset: Option<&str>,
        char_length: Option<u64>,
    ) -> Result<Kind, String> {
        let unsigned = column_type.contains("unsigned");
        let int = |bytes| Kind::Int { bytes, unsigned };
        Ok(match data_type {
            "tinyint" => int(1),
            "smallint" => int(2),
            "mediumint" => int(3),
            "int" | "integer" => int(4),
            "bigint" => int(8),
            "decimal" | "numeric" => Kind::Decimal {
                precision: precision.unwrap_or(10).min(65) as u8,
                scale: scale.unwrap_or(0).min(38) as u8,
            },
            "float" => Kind::Float,
            "double" | "real" => Kind::Double,
            "date" => Kind::Date,
            "datetime" => Kind::DateTime,
            "timestamp" => Kind::Timestamp,
            "time" => Kind::Time,
            "year" => Kind::Year,
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "json" => {
                Kind::Text {
                    charset: charset_of(charset.unwrap_or("utf8mb4"))?,
                }
            }
            "binary" => Kind::Binary {
                pad_to: char_length.map(|n| n as usize),
            },
            "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
                Kind::Binary { pad_to: None }
            }
            "enum" => Kind::Enum(members(column_type, "enum")?),
            "set" => Kind::Set(members(column_type, "set")?),
            "bit" => Kind::Bit {
                bits: precision.unwrap_or(1).clamp(1, 64) as u16,
            },
            "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
            | "multipolygon" | "geometrycollection" => {
                return Err(format!(
                    "{data_type} columns are not supported (spatial types have no column type \
                     in the destinations); leave the table out of `tables`, or keep the value \
                     in a column of another type"
                ));
            }
            other => {
                return Err(format!(
                    "type `{column_type}` ({other}) is not supported yet; leave the table out \
                     of `tables`"
                ));
            }
        })
    }

    pub fn data_type(&self) -> DataType {
        match self {
            Kind::Int {
                bytes: 8,
                unsigned: true,
            } => DataType::Decimal128(20, 0),
            Kind::Int { bytes: 8, .. }
            | Kind::Int {
                bytes: 4,
                unsigned: true,
            } => DataType::Int64,
            Kind::Int { .. } | Kind::Year => DataType::Int32,
            Kind::Decimal { precision, scale } if *precision <= 38 => {
                DataType::Decimal128(*precision, *scale as i8)
            }
            Kind::Decimal { .. } => DataType::Utf8,
            Kind::Float | Kind::Double => DataType::Float64,
            Kind::Date => DataType::Date32,
            Kind::DateTime => DataType::Timestamp(TimeUnit::Microsecond, None),
            Kind::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some(UTC_ZONE.into())),
            Kind::Time => DataType::Time64(TimeUnit::Microsecond),
            Kind::Text { .. } | Kind::Enum(_) | Kind::Set(_) => DataType::Utf8,
            Kind::Binary { .. } => DataType::Binary,
            Kind::Bit { bits: 1 } => DataType::Boolean,
            Kind::Bit { .. } => DataType::Binary,
        }
    }

    /// Whether the server orders the column by the value the source reads
    /// (numbers, times, bytes); text, enums and sets it orders by their
    /// collation or member number instead.
    pub fn orders_by_value(&self) -> bool {
        match self {
            Kind::Text { .. } | Kind::Enum(_) | Kind::Set(_) => false,
            // Read as text: ordered by the text's bytes like text.
            Kind::Decimal { precision, .. } => *precision <= 38,
            _ => true,
        }
    }

    /// Whether the binlog's table map logs a column of this kind as `ty`
    /// (with its metadata and signedness): a column whose type changed
    /// would be read wrong by this kind.
    pub fn logged_as(&self, ty: ColumnType, meta: &[u8], unsigned_now: bool) -> bool {
        use ColumnType::*;
        match self {
            Kind::Int { bytes, unsigned } => {
                let width = match ty {
                    MYSQL_TYPE_TINY => 1,
                    MYSQL_TYPE_SHORT => 2,
                    MYSQL_TYPE_INT24 => 3,
                    MYSQL_TYPE_LONG => 4,
                    MYSQL_TYPE_LONGLONG => 8,
                    _ => return false,
                };
                width == *bytes && *unsigned == unsigned_now
            }
            Kind::Decimal { precision, scale } => {
                ty == MYSQL_TYPE_NEWDECIMAL
                    && meta.first() == Some(precision)
                    && meta.get(1) == Some(scale)
            }
            Kind::Float => ty == MYSQL_TYPE_FLOAT,
            Kind::Double => ty == MYSQL_TYPE_DOUBLE,
            Kind::Date => matches!(ty, MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE),
            Kind::DateTime => matches!(ty, MYSQL_TYPE_DATETIME | MYSQL_TYPE_DATETIME2),
            Kind::Timestamp => matches!(ty, MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2),
            Kind::Time => matches!(ty, MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2),
            Kind::Year => ty == MYSQL_TYPE_YEAR,
            Kind::Text { .. } | Kind::Binary { .. } => matches!(
                ty,
                MYSQL_TYPE_VARCHAR
                    | MYSQL_TYPE_VAR_STRING
                    | MYSQL_TYPE_STRING
                    | MYSQL_TYPE_TINY_BLOB
                    | MYSQL_TYPE_BLOB
                    | MYSQL_TYPE_MEDIUM_BLOB
                    | MYSQL_TYPE_LONG_BLOB
                    | MYSQL_TYPE_JSON
            ),
            Kind::Enum(_) => ty == MYSQL_TYPE_ENUM,
            Kind::Set(_) => ty == MYSQL_TYPE_SET,
            Kind::Bit { bits } => {
                ty == MYSQL_TYPE_BIT
                    && meta.len() == 2
                    && u16::from(meta[1]) * 8 + u16::from(meta[0]) == *bits
            }
        }
    }

    /// A literal to compare a key column with a bound parameter in the
    /// column's own terms (a decimal compared with a string would be
    /// compared as a double).
    pub fn parameter(&self) -> String {
        match self {
            Kind::Decimal { precision, scale } => {
                format!("CAST(? AS DECIMAL({precision},{scale}))")
            }
            _ => "?".to_string(),
        }
    }
}

fn charset_of(name: &str) -> Result<Charset, String> {
    match name {
        "utf8mb4" | "utf8mb3" | "utf8" | "ascii" => Ok(Charset::Utf8),
        "latin1" => Ok(Charset::Latin1),
        other => Err(format!(
            "character set {other} is not supported yet (utf8mb4, utf8mb3, ascii and latin1 are); \
             convert the column or leave the table out of `tables`"
        )),
    }
}

/// The members of `enum('a','b')` or `set(...)`, unquoted.
fn members(column_type: &str, word: &str) -> Result<Vec<String>, String> {
    let inner = column_type
        .strip_prefix(word)
        .and_then(|t| t.strip_prefix('('))
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| format!("cannot read the members of `{column_type}`"))?;
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut member = String::new();
        loop {
            match chars.next() {
                Some('\'') if chars.peek() == Some(&'\'') => {
                    chars.next();
                    member.push('\'');
                }
                Some('\'') => break,
                Some('\\') => {
                    if let Some(escaped) = chars.next() {
                        member.push(escaped);
                    }
                }
                Some(c) => member.push(c),
                None => return Err(format!("cannot read the members of `{column_type}`")),
            }
        }
        out.push(member);
    }
    Ok(out)
}

/// Where a value came from: its shape differs for some types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A backfill query (binary protocol, UTC session, utf8mb4 results).
    Query,
    /// A binlog row event.
    Binlog,
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// Converts one server value of a column of kind `kind`.
pub fn convert(kind: &Kind, value: My, origin: Origin) -> Result<Value, String> {
    if value == My::NULL {
        return Ok(Value::Null);
    }
    let shape = |what: &str| format!("cannot read {} as {what}", show(&value));
    Ok(match kind {
        Kind::Int { bytes, unsigned } => {
            let n: i128 = match &value {
                My::Int(i) => i128::from(*i),
                My::UInt(u) => i128::from(*u),
                My::Bytes(b) => std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| shape("an integer"))?,
                _ => return Err(shape("an integer")),
            };
            // The binlog gives an unsigned column's value as its bits.
            let n = if *unsigned && n < 0 {
                n + (1i128 << (8 * u32::from(*bytes)))
            } else {
                n
            };
            match (bytes, unsigned) {
                (8, true) => Value::Decimal128(n),
                (8, false) | (4, true) => {
                    Value::Int64(i64::try_from(n).map_err(|_| shape("a 64-bit integer"))?)
                }
                _ => Value::Int32(i32::try_from(n).map_err(|_| shape("a 32-bit integer"))?),
            }
        }
        Kind::Year => match &value {
            My::Int(i) => Value::Int32(*i as i32),
            My::UInt(u) => Value::Int32(*u as i32),
            My::Bytes(b) => Value::Int32(
                std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| shape("a year"))?,
            ),
            _ => return Err(shape("a year")),
        },
        Kind::Decimal { precision, scale } => {
            let My::Bytes(b) = &value else {
                return Err(shape("a decimal"));
            };
            let text = std::str::from_utf8(b).map_err(|_| shape("a decimal"))?;
            if *precision > 38 {
                Value::Utf8(text.to_string())
            } else {
                let v = parse_decimal(text, *scale as i8)
                    .filter(|v| v.unsigned_abs() < 10u128.pow(u32::from(*precision)))
                    .ok_or_else(|| shape(&format!("decimal({precision},{scale})")))?;
                Value::Decimal128(v)
            }
        }
        Kind::Float | Kind::Double => Value::Float64(match &value {
            My::Float(f) => f64::from(*f),
            My::Double(f) => *f,
            My::Bytes(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| shape("a float"))?,
            _ => return Err(shape("a float")),
        }),
        Kind::Date => match value {
            My::Date(y, m, d, ..) => Value::Date32(days(y, m, d)? as i32),
            _ => return Err(shape("a date")),
        },
        Kind::DateTime => match value {
            My::Date(y, m, d, h, mi, s, us) => {
                Value::TimestampMicros(micros(y, m, d, h, mi, s, us)?)
            }
            _ => return Err(shape("a datetime")),
        },
        Kind::Timestamp => match (&value, origin) {
            // The backfill's session is in UTC, so its wall clock is UTC.
            (My::Date(y, m, d, h, mi, s, us), _) => {
                Value::TimestampMicros(micros(*y, *m, *d, *h, *mi, *s, *us)?)
            }
            // The binlog holds seconds (and microseconds) since the epoch.
            (My::Bytes(b), Origin::Binlog) => {
                let text = std::str::from_utf8(b).map_err(|_| shape("a timestamp"))?;
                let (secs, frac) = text.split_once('.').unwrap_or((text, "0"));
                let secs: i64 = secs.parse().map_err(|_| shape("a timestamp"))?;
                let frac: i64 = format!("{frac:0<6}")[..6]
                    .parse()
                    .map_err(|_| shape("a timestamp"))?;
                if secs == 0 && frac == 0 {
                    return Err(zero_date("timestamp"));
                }
                Value::TimestampMicros(secs * 1_000_000 + frac)
            }
            (My::Int(secs), Origin::Binlog) => {
                if *secs == 0 {
                    return Err(zero_date("timestamp"));
                }
                Value::TimestampMicros(secs * 1_000_000)
            }
            _ => return Err(shape("a timestamp")),
        },
        Kind::Time => match value {
            My::Time(negative, days, h, mi, s, us) => {
                let t = i64::from(days) * MICROS_PER_DAY
                    + ((i64::from(h) * 60 + i64::from(mi)) * 60 + i64::from(s)) * 1_000_000
                    + i64::from(us);
                if negative && t != 0 || t >= MICROS_PER_DAY {
                    return Err(format!(
                        "time {} lies outside one day (00:00:00 to 23:59:59.999999), which is \
                         what a time column holds in the destinations",
                        show(&value)
                    ));
                }
                Value::Int64(t)
            }
            _ => return Err(shape("a time")),
        },
        Kind::Text { charset } => {
            let My::Bytes(b) = value else {
                return Err(shape("text"));
            };
            match (charset, origin) {
                (Charset::Latin1, Origin::Binlog) => Value::Utf8(latin1(&b)),
                _ => Value::Utf8(
                    String::from_utf8(b)
                        .map_err(|e| format!("text that is not valid UTF-8 ({e})"))?,
                ),
            }
        }
        Kind::Binary { pad_to } => {
            let My::Bytes(mut b) = value else {
                return Err(shape("bytes"));
            };
            if let Some(n) = pad_to
                && b.len() < *n
            {
                b.resize(*n, 0);
            }
            Value::Binary(b)
        }
        Kind::Enum(members) => match (&value, origin) {
            (My::Bytes(b), Origin::Query) => {
                Value::Utf8(String::from_utf8(b.clone()).map_err(|_| shape("an enum member"))?)
            }
            (My::Int(i), Origin::Binlog) => match usize::try_from(*i) {
                // 0 is the server's "invalid value" member, the empty string.
                Ok(0) => Value::Utf8(String::new()),
                Ok(i) if i <= members.len() => Value::Utf8(members[i - 1].clone()),
                _ => {
                    return Err(format!(
                        "enum member number {i} is not one of {} members",
                        members.len()
                    ));
                }
            },
            _ => return Err(shape("an enum member")),
        },
        Kind::Set(members) => match (&value, origin) {
            (My::Bytes(b), Origin::Query) => {
                Value::Utf8(String::from_utf8(b.clone()).map_err(|_| shape("a set"))?)
            }
            (My::Bytes(bits), Origin::Binlog) => {
                let mut chosen = Vec::new();
                for (i, member) in members.iter().enumerate() {
                    if bits
                        .get(i / 8)
                        .is_some_and(|byte| byte & (1 << (i % 8)) != 0)
                    {
                        chosen.push(member.as_str());
                    }
                }
                Value::Utf8(chosen.join(","))
            }
            _ => return Err(shape("a set")),
        },
        Kind::Bit { bits } => {
            let My::Bytes(b) = value else {
                return Err(shape("bits"));
            };
            let width = usize::from(*bits).div_ceil(8);
            // Big-endian, as the server gives them; left-padded to the width.
            let mut out = vec![0u8; width.saturating_sub(b.len())];
            out.extend_from_slice(&b[b.len().saturating_sub(width)..]);
            if *bits == 1 {
                Value::Bool(out.iter().any(|&x| x != 0))
            } else {
                Value::Binary(out)
            }
        }
    })
}

fn zero_date(what: &str) -> String {
    format!(
        "a zero {what} (0000-00-00) has no value in the destinations; weir does not make one \
         up: set the rows to NULL or a real date (and NO_ZERO_DATE in sql_mode keeps them out)"
    )
}

fn days(y: u16, m: u8, d: u8) -> Result<i64, String> {
    if y == 0 && m == 0 && d == 0 {
        return Err(zero_date("date"));
    }
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(format!(
            "date {y:04}-{m:02}-{d:02} is not a calendar date (a zero month or day)"
        ));
    }
    Ok(days_from_civil(i64::from(y), u32::from(m), u32::from(d)))
}

fn micros(y: u16, m: u8, d: u8, h: u8, mi: u8, s: u8, us: u32) -> Result<i64, String> {
    Ok(days(y, m, d)? * MICROS_PER_DAY
        + ((i64::from(h) * 60 + i64::from(mi)) * 60 + i64::from(s)) * 1_000_000
        + i64::from(us))
}

/// MySQL's latin1 is Windows-1252: 0x80..0x9F are the typographic marks,
/// the rest is ISO 8859-1.
pub(super) fn latin1(bytes: &[u8]) -> String {
    const HIGH: [char; 32] = [
        '€', '\u{81}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{8d}', 'Ž',
        '\u{8f}', '\u{90}', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', '\u{9d}',
        'ž', 'Ÿ',
    ];
    bytes
        .iter()
        .map(|&b| match b {
            0x80..=0x9f => HIGH[usize::from(b - 0x80)],
            _ => char::from(b),
        })
        .collect()
}

/// A value for an error message, clipped.
pub fn show(value: &My) -> String {
    let text = match value {
        My::Bytes(b) => format!("'{}'", String::from_utf8_lossy(&b[..b.len().min(64)])),
        My::Int(i) => i.to_string(),
        My::UInt(u) => u.to_string(),
        My::Float(f) => f.to_string(),
        My::Double(f) => f.to_string(),
        other => other.as_sql(false),
    };
    text.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(data_type: &str, column_type: &str) -> Kind {
        Kind::of_column(
            data_type,
            column_type,
            Some(10),
            Some(2),
            Some("utf8mb4"),
            Some(4),
        )
        .unwrap()
    }

    #[test]
    fn integers_keep_their_range_signed_and_unsigned() {
        let tiny_u = kind("tinyint", "tinyint(3) unsigned");
        // The binlog hands an unsigned TINYINT's 255 as its bits, -1.
        assert_eq!(
            convert(&tiny_u, My::Int(-1), Origin::Binlog),
            Ok(Value::Int32(255))
        );
        assert_eq!(
            convert(&tiny_u, My::UInt(255), Origin::Query),
            Ok(Value::Int32(255))
        );
        let int_u = kind("int", "int(10) unsigned");
        assert_eq!(int_u.data_type(), DataType::Int64);
        assert_eq!(
            convert(&int_u, My::UInt(4_294_967_295), Origin::Binlog),
            Ok(Value::Int64(4_294_967_295))
        );
        let medium_u = kind("mediumint", "mediumint unsigned");
        assert_eq!(
            convert(&medium_u, My::Int(-1), Origin::Binlog),
            Ok(Value::Int32(16_777_215))
        );
        let big_u = kind("bigint", "bigint(20) unsigned");
        assert_eq!(big_u.data_type(), DataType::Decimal128(20, 0));
        assert_eq!(
            convert(&big_u, My::UInt(u64::MAX), Origin::Binlog),
            Ok(Value::Decimal128(i128::from(u64::MAX)))
        );
        let big = kind("bigint", "bigint(20)");
        assert_eq!(
            convert(&big, My::Int(i64::MIN), Origin::Query),
            Ok(Value::Int64(i64::MIN))
        );
        assert_eq!(convert(&big, My::NULL, Origin::Query), Ok(Value::Null));
    }

    #[test]
    fn decimals_are_exact_or_refused() {
        let d = kind("decimal", "decimal(10,2)");
        assert_eq!(d.data_type(), DataType::Decimal128(10, 2));
        assert_eq!(
            convert(&d, My::Bytes(b"-12345678.90".to_vec()), Origin::Binlog),
            Ok(Value::Decimal128(-1_234_567_890))
        );
        assert!(convert(&d, My::Bytes(b"1.234".to_vec()), Origin::Binlog).is_err());
        let wide = Kind::Decimal {
            precision: 65,
            scale: 30,
        };
        assert_eq!(wide.data_type(), DataType::Utf8);
        assert_eq!(
            convert(&wide, My::Bytes(b"1.5".to_vec()), Origin::Query),
            Ok(Value::Utf8("1.5".into()))
        );
    }

    #[test]
    fn times_from_both_origins_agree() {
        let ts = Kind::Timestamp;
        let from_query =
            convert(&ts, My::Date(2024, 2, 29, 12, 0, 1, 250_000), Origin::Query).unwrap();
        let from_binlog =
            convert(&ts, My::Bytes(b"1709208001.25".to_vec()), Origin::Binlog).unwrap();
        assert_eq!(from_query, Value::TimestampMicros(1_709_208_001_250_000));
        assert_eq!(from_query, from_binlog);
        assert!(
            convert(&ts, My::Bytes(b"0".to_vec()), Origin::Binlog)
                .unwrap_err()
                .contains("zero")
        );
        assert_eq!(
            convert(
                &Kind::DateTime,
                My::Date(1969, 12, 31, 23, 59, 59, 999_999),
                Origin::Binlog
            ),
            Ok(Value::TimestampMicros(-1))
        );
        assert_eq!(
            convert(&Kind::Date, My::Date(1970, 1, 2, 0, 0, 0, 0), Origin::Query),
            Ok(Value::Date32(1))
        );
        assert!(
            convert(&Kind::Date, My::Date(0, 0, 0, 0, 0, 0, 0), Origin::Query)
                .unwrap_err()
                .contains("zero date")
        );
        assert!(convert(&Kind::Date, My::Date(2024, 0, 1, 0, 0, 0, 0), Origin::Query).is_err());
        assert_eq!(
            convert(
                &Kind::Time,
                My::Time(false, 0, 23, 59, 59, 999_999),
                Origin::Binlog
            ),
            Ok(Value::Int64(MICROS_PER_DAY - 1))
        );
        assert!(
            convert(&Kind::Time, My::Time(false, 1, 0, 0, 0, 0), Origin::Binlog)
                .unwrap_err()
                .contains("one day")
        );
        assert!(convert(&Kind::Time, My::Time(true, 0, 1, 0, 0, 0), Origin::Binlog).is_err());
    }

    #[test]
    fn text_enum_set_and_bits() {
        let latin =
            Kind::of_column("varchar", "varchar(10)", None, None, Some("latin1"), None).unwrap();
        assert_eq!(
            convert(&latin, My::Bytes(vec![b'a', 0xe9, 0x80]), Origin::Binlog),
            Ok(Value::Utf8("aé€".into()))
        );
        assert!(
            Kind::of_column("varchar", "varchar(10)", None, None, Some("sjis"), None)
                .unwrap_err()
                .contains("sjis")
        );
        let e = kind("enum", "enum('small','it''s','l\\\\x')");
        assert_eq!(
            e,
            Kind::Enum(vec!["small".into(), "it's".into(), "l\\x".into()])
        );
        assert_eq!(
            convert(&e, My::Int(2), Origin::Binlog),
            Ok(Value::Utf8("it's".into()))
        );
        assert_eq!(
            convert(&e, My::Bytes(b"small".to_vec()), Origin::Query),
            Ok(Value::Utf8("small".into()))
        );
        assert!(convert(&e, My::Int(4), Origin::Binlog).is_err());
        let s = kind("set", "set('a','b','c')");
        assert_eq!(
            convert(&s, My::Bytes(vec![0b101]), Origin::Binlog),
            Ok(Value::Utf8("a,c".into()))
        );
        let bit1 = Kind::of_column("bit", "bit(1)", Some(1), None, None, None).unwrap();
        assert_eq!(bit1.data_type(), DataType::Boolean);
        assert_eq!(
            convert(&bit1, My::Bytes(vec![1]), Origin::Binlog),
            Ok(Value::Bool(true))
        );
        let bit12 = Kind::of_column("bit", "bit(12)", Some(12), None, None, None).unwrap();
        assert_eq!(
            convert(&bit12, My::Bytes(vec![0x0a]), Origin::Query),
            Ok(Value::Binary(vec![0, 0x0a]))
        );
        let fixed = kind("binary", "binary(4)");
        assert_eq!(
            convert(&fixed, My::Bytes(b"ab".to_vec()), Origin::Binlog),
            Ok(Value::Binary(b"ab\0\0".to_vec()))
        );
        assert!(
            Kind::of_column("point", "point", None, None, None, None)
                .unwrap_err()
                .contains("spatial")
        );
    }
}
