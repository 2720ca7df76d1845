//! Arrow values as the strings Redis stores.
//!
//! Every value becomes text, the same text for the same value on every run
//! and platform (docs/sinks/redis.md has the table):
//!
//! | Arrow | Redis |
//! | --- | --- |
//! | Utf8, LargeUtf8, Utf8View | the string itself |
//! | Boolean | `true` / `false` |
//! | Int*, UInt* | decimal digits, `-` for negatives |
//! | Float16/32/64 | the shortest text that reads back as the same number: plain (`1.5`, `100`, `-0`) for 1e-5 <= abs < 1e16, else scientific (`1e300`, `2.5e-7`); `NaN`, `inf`, `-inf`. Float16 goes through Float32 |
//! | Decimal32/64/128/256(p, s) | exact, with `s` digits after the point (`12.30`, `-0.05`); a negative scale appends zeros |
//! | Binary, LargeBinary, BinaryView, FixedSizeBinary | lowercase hex |
//! | Date32, Date64 | `YYYY-MM-DD` (years beyond 0..=9999 signed: `+10000-01-01`); Date32's i32::MAX / i32::MIN are `infinity` / `-infinity` |
//! | Time32/64 | `HH:MM:SS` plus as many fraction digits as the unit has (`.123`, `.123456`, `.123456789`) |
//! | Timestamp(unit) | `YYYY-MM-DDTHH:MM:SS` plus the unit's fraction digits; with a time zone the instant in UTC with `Z`; i64::MAX / i64::MIN are `infinity` / `-infinity` |
//! | List, LargeList, FixedSizeList | a JSON array |
//! | Struct | a JSON object, fields in schema order |
//!
//! Inside JSON, numbers and booleans are bare (a non-finite float is a
//! string), `null` is null, everything else is a JSON string of the text
//! above. The infinities are the values weir's Postgres source uses for
//! Postgres' `infinity`. Other types (Duration, Interval, Map, Union,
//! Dictionary, ...) are refused when the batch is written.

use std::fmt::{Display, LowerExp};
use std::io::Write as _;

use chrono::{Datelike, NaiveDate, Timelike};
use weir_sdk::arrow_array::cast::AsArray;
use weir_sdk::arrow_array::types::*;
use weir_sdk::arrow_array::{Array, ArrowPrimitiveType};
use weir_sdk::arrow_schema::{DataType, TimeUnit};

/// Whether `data_type` can be rendered; the error names the first part
/// that cannot.
pub fn check_type(data_type: &DataType) -> Result<(), String> {
    use DataType::*;
    match data_type {
        Null | Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64
        | Float16 | Float32 | Float64 | Decimal32(..) | Decimal64(..) | Decimal128(..)
        | Decimal256(..) | Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView
        | FixedSizeBinary(_) | Date32 | Date64 | Time32(_) | Time64(_) | Timestamp(..) => Ok(()),
        List(item) | LargeList(item) | FixedSizeList(item, _) => check_type(item.data_type()),
        Struct(fields) => fields.iter().try_for_each(|f| check_type(f.data_type())),
        other => Err(format!("Arrow type {other} has no Redis rendering")),
    }
}

/// The text of `array[row]`, or `None` for a null (the field is left out).
/// The array's type must have passed [`check_type`].
pub fn field(array: &dyn Array, row: usize) -> Result<Option<Vec<u8>>, String> {
    if is_null(array, row) {
        return Ok(None);
    }
    let mut out = Vec::new();
    write_value(array, row, &mut out, Style::Field)?;
    Ok(Some(out))
}

/// A top-level field, or a value inside JSON.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Field,
    Json,
}

fn is_null(array: &dyn Array, row: usize) -> bool {
    // A NullArray has no validity buffer: `is_null` would say "valid".
    matches!(array.data_type(), DataType::Null) || array.is_null(row)
}

fn write_value(
    array: &dyn Array,
    row: usize,
    out: &mut Vec<u8>,
    style: Style,
) -> Result<(), String> {
    use DataType::*;
    // Strings, hex, dates and times: bare as a field, a JSON string inside
    // JSON.
    let quoted = |text: &str, out: &mut Vec<u8>| match style {
        Style::Field => out.extend_from_slice(text.as_bytes()),
        Style::Json => json_string(text, out),
    };
    match array.data_type() {
        Null => out.extend_from_slice(b"null"),
        Boolean => {
            let value = array.as_boolean().value(row);
            out.extend_from_slice(if value { b"true" } else { b"false" });
        }
        Int8 => number(out, primitive::<Int8Type>(array, row)),
        Int16 => number(out, primitive::<Int16Type>(array, row)),
        Int32 => number(out, primitive::<Int32Type>(array, row)),
        Int64 => number(out, primitive::<Int64Type>(array, row)),
        UInt8 => number(out, primitive::<UInt8Type>(array, row)),
        UInt16 => number(out, primitive::<UInt16Type>(array, row)),
        UInt32 => number(out, primitive::<UInt32Type>(array, row)),
        UInt64 => number(out, primitive::<UInt64Type>(array, row)),
        Float16 => float(out, primitive::<Float16Type>(array, row).to_f32(), style),
        Float32 => float(out, primitive::<Float32Type>(array, row), style),
        Float64 => float(out, primitive::<Float64Type>(array, row), style),
        Decimal32(_, scale) => decimal(out, primitive::<Decimal32Type>(array, row), *scale),
        Decimal64(_, scale) => decimal(out, primitive::<Decimal64Type>(array, row), *scale),
        Decimal128(_, scale) => decimal(out, primitive::<Decimal128Type>(array, row), *scale),
        Decimal256(_, scale) => decimal(out, primitive::<Decimal256Type>(array, row), *scale),
        Utf8 => quoted(array.as_string::<i32>().value(row), out),
        LargeUtf8 => quoted(array.as_string::<i64>().value(row), out),
        Utf8View => quoted(array.as_string_view().value(row), out),
        Binary => quoted(&hex::encode(array.as_binary::<i32>().value(row)), out),
        LargeBinary => quoted(&hex::encode(array.as_binary::<i64>().value(row)), out),
        BinaryView => quoted(&hex::encode(array.as_binary_view().value(row)), out),
        FixedSizeBinary(_) => quoted(&hex::encode(array.as_fixed_size_binary().value(row)), out),
        Date32 => quoted(&date32(primitive::<Date32Type>(array, row))?, out),
        Date64 => {
            let millis = primitive::<Date64Type>(array, row);
            let days = i32::try_from(millis.div_euclid(86_400_000))
                .map_err(|_| format!("date {millis} ms lies outside the calendar"))?;
            quoted(&date_from_days(days)?, out)
        }
        Time32(unit) => {
            let value = match unit {
                TimeUnit::Second => i64::from(primitive::<Time32SecondType>(array, row)),
                _ => i64::from(primitive::<Time32MillisecondType>(array, row)),
            };
            quoted(&time_of_day(value, *unit)?, out)
        }
        Time64(unit) => {
            let value = match unit {
                TimeUnit::Microsecond => primitive::<Time64MicrosecondType>(array, row),
                _ => primitive::<Time64NanosecondType>(array, row),
            };
            quoted(&time_of_day(value, *unit)?, out)
        }
        Timestamp(unit, zone) => {
            let value = match unit {
                TimeUnit::Second => primitive::<TimestampSecondType>(array, row),
                TimeUnit::Millisecond => primitive::<TimestampMillisecondType>(array, row),
                TimeUnit::Microsecond => primitive::<TimestampMicrosecondType>(array, row),
                TimeUnit::Nanosecond => primitive::<TimestampNanosecondType>(array, row),
            };
            quoted(&timestamp(value, *unit, zone.is_some())?, out)
        }
        List(_) => items(array.as_list::<i32>().value(row).as_ref(), out)?,
        LargeList(_) => items(array.as_list::<i64>().value(row).as_ref(), out)?,
        FixedSizeList(..) => items(array.as_fixed_size_list().value(row).as_ref(), out)?,
        Struct(fields) => {
            let record = array.as_struct();
            out.push(b'{');
            for (i, (field, column)) in fields.iter().zip(record.columns()).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_string(field.name(), out);
                out.push(b':');
                json_value(column.as_ref(), row, out)?;
            }
            out.push(b'}');
        }
        other => return Err(format!("Arrow type {other} has no Redis rendering")),
    }
    Ok(())
}

fn primitive<T: ArrowPrimitiveType>(array: &dyn Array, row: usize) -> T::Native {
    array.as_primitive::<T>().value(row)
}

fn json_value(array: &dyn Array, row: usize, out: &mut Vec<u8>) -> Result<(), String> {
    if is_null(array, row) {
        out.extend_from_slice(b"null");
        Ok(())
    } else {
        write_value(array, row, out, Style::Json)
    }
}

fn items(values: &dyn Array, out: &mut Vec<u8>) -> Result<(), String> {
    out.push(b'[');
    for i in 0..values.len() {
        if i > 0 {
            out.push(b',');
        }
        json_value(values, i, out)?;
    }
    out.push(b']');
    Ok(())
}

fn json_string(text: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(out, text).expect("a string always serializes to JSON");
}

fn number(out: &mut Vec<u8>, value: impl Display) {
    write!(out, "{value}").expect("writing to memory");
}

/// Shortest round-trip text; scientific only where plain text gets long.
fn float<F: Display + LowerExp + Into<f64> + Copy>(out: &mut Vec<u8>, value: F, style: Style) {
    let wide: f64 = value.into();
    if wide.is_finite() {
        let size = wide.abs();
        if size != 0.0 && !(1e-5..1e16).contains(&size) {
            write!(out, "{value:e}")
        } else {
            write!(out, "{value}")
        }
        .expect("writing to memory");
        return;
    }
    let text = if wide.is_nan() {
        "NaN"
    } else if wide > 0.0 {
        "inf"
    } else {
        "-inf"
    };
    match style {
        Style::Field => out.extend_from_slice(text.as_bytes()),
        Style::Json => json_string(text, out),
    }
}

/// The unscaled integer with the decimal point put in, every scale digit
/// kept, nothing rounded.
fn decimal(out: &mut Vec<u8>, unscaled: impl Display, scale: i8) {
    let digits = unscaled.to_string();
    let (sign, digits) = match digits.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", digits.as_str()),
    };
    out.extend_from_slice(sign.as_bytes());
    if scale <= 0 {
        out.extend_from_slice(digits.as_bytes());
        if digits != "0" {
            out.extend(std::iter::repeat_n(b'0', usize::from(scale.unsigned_abs())));
        }
        return;
    }
    let scale = usize::from(scale.unsigned_abs());
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    write!(out, "{whole}.{fraction}").expect("writing to memory");
}

fn date32(days: i32) -> Result<String, String> {
    match days {
        i32::MAX => Ok("infinity".into()),
        i32::MIN => Ok("-infinity".into()),
        days => date_from_days(days),
    }
}

/// Days since 1970-01-01 as `YYYY-MM-DD`.
fn date_from_days(days: i32) -> Result<String, String> {
    // 719163 days lie between 0001-01-01 (day 1 of the common era) and 1970-01-01.
    days.checked_add(719_163)
        .and_then(NaiveDate::from_num_days_from_ce_opt)
        .map(|date| format_date(&date))
        .ok_or_else(|| format!("date {days} (days since 1970-01-01) lies outside the calendar"))
}

fn format_date(date: &impl Datelike) -> String {
    let year = date.year();
    if (0..=9999).contains(&year) {
        format!("{year:04}-{:02}-{:02}", date.month(), date.day())
    } else {
        format!("{year:+05}-{:02}-{:02}", date.month(), date.day())
    }
}

/// Splits a count of `unit` into whole seconds and the fraction's digits.
fn split(value: i64, unit: TimeUnit) -> (i64, i64, usize) {
    let (per_second, digits) = match unit {
        TimeUnit::Second => (1, 0),
        TimeUnit::Millisecond => (1_000, 3),
        TimeUnit::Microsecond => (1_000_000, 6),
        TimeUnit::Nanosecond => (1_000_000_000, 9),
    };
    (
        value.div_euclid(per_second),
        value.rem_euclid(per_second),
        digits,
    )
}

fn fraction(fraction: i64, digits: usize) -> String {
    if digits == 0 {
        String::new()
    } else {
        format!(".{fraction:0digits$}")
    }
}

fn time_of_day(value: i64, unit: TimeUnit) -> Result<String, String> {
    let (seconds, part, digits) = split(value, unit);
    if !(0..86_400).contains(&seconds) {
        return Err(format!(
            "time of day {value} ({unit:?}) is not within one day"
        ));
    }
    Ok(format!(
        "{:02}:{:02}:{:02}{}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        fraction(part, digits)
    ))
}

fn timestamp(value: i64, unit: TimeUnit, zoned: bool) -> Result<String, String> {
    match value {
        i64::MAX => return Ok("infinity".into()),
        i64::MIN => return Ok("-infinity".into()),
        _ => {}
    }
    let (seconds, part, digits) = split(value, unit);
    let nanos = part * 10_i64.pow(9 - digits as u32);
    let instant = chrono::DateTime::from_timestamp(seconds, nanos as u32)
        .ok_or_else(|| format!("timestamp {value} ({unit:?}) lies outside the calendar"))?
        .naive_utc();
    Ok(format!(
        "{}T{:02}:{:02}:{:02}{}{}",
        format_date(&instant),
        instant.hour(),
        instant.minute(),
        instant.second(),
        fraction(part, digits),
        if zoned { "Z" } else { "" }
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use weir_sdk::arrow_array::builder::{Int32Builder, ListBuilder};
    use weir_sdk::arrow_array::*;
    use weir_sdk::arrow_schema::{Field, Fields};

    use super::*;

    fn texts(array: &dyn Array) -> Vec<Option<String>> {
        check_type(array.data_type()).unwrap();
        (0..array.len())
            .map(|row| {
                field(array, row)
                    .unwrap()
                    .map(|b| String::from_utf8(b).unwrap())
            })
            .collect()
    }

    fn some(values: &[&str]) -> Vec<Option<String>> {
        values.iter().map(|v| Some(v.to_string())).collect()
    }

    #[test]
    fn scalars() {
        assert_eq!(
            texts(&BooleanArray::from(vec![Some(true), Some(false), None])),
            [Some("true".into()), Some("false".into()), None]
        );
        assert_eq!(
            texts(&Int64Array::from(vec![i64::MIN, 0, 42])),
            some(&["-9223372036854775808", "0", "42"])
        );
        assert_eq!(
            texts(&UInt64Array::from(vec![u64::MAX])),
            some(&["18446744073709551615"])
        );
        assert_eq!(texts(&Int8Array::from(vec![-128])), some(&["-128"]));
        assert_eq!(
            texts(&Float64Array::from(vec![
                0.1,
                100.0,
                -0.0,
                1.5,
                1e300,
                2.5e-7,
                1e16,
                9_999_999_999_999_998.0,
                0.00001,
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY
            ])),
            some(&[
                "0.1",
                "100",
                "-0",
                "1.5",
                "1e300",
                "2.5e-7",
                "1e16",
                "9999999999999998",
                "0.00001",
                "NaN",
                "inf",
                "-inf"
            ])
        );
        assert_eq!(
            texts(&Float32Array::from(vec![0.1f32, 3.4e38])),
            some(&["0.1", "3.4e38"])
        );
        assert_eq!(
            texts(&StringArray::from(vec![Some("a:b\\c"), Some(""), None])),
            [Some("a:b\\c".into()), Some(String::new()), None]
        );
        assert_eq!(texts(&LargeStringArray::from(vec!["x"])), some(&["x"]));
        assert_eq!(
            texts(&BinaryArray::from_iter_values([[0xde, 0xad], [0x00, 0x0f]])),
            some(&["dead", "000f"])
        );
        assert_eq!(texts(&NullArray::new(2)), [None, None]);
    }

    #[test]
    fn decimals_keep_their_scale() {
        let array = Decimal128Array::from(vec![1230, -5, 0, 7, i128::from(i64::MAX)])
            .with_precision_and_scale(38, 2)
            .unwrap();
        assert_eq!(
            texts(&array),
            some(&["12.30", "-0.05", "0.00", "0.07", "92233720368547758.07"])
        );
        let whole = Decimal128Array::from(vec![12, 0, -3])
            .with_precision_and_scale(10, -2)
            .unwrap();
        assert_eq!(texts(&whole), some(&["1200", "0", "-300"]));
        let big = Decimal256Array::from(vec![
            <Decimal256Type as ArrowPrimitiveType>::Native::from_i128(-1),
        ])
        .with_precision_and_scale(76, 3)
        .unwrap();
        assert_eq!(texts(&big), some(&["-0.001"]));
    }

    #[test]
    fn dates_times_and_timestamps() {
        assert_eq!(
            texts(&Date32Array::from(vec![
                0,
                19_723,
                -719_162,
                2_932_897,
                i32::MAX,
                i32::MIN
            ])),
            some(&[
                "1970-01-01",
                "2024-01-01",
                "0001-01-01",
                "+10000-01-01",
                "infinity",
                "-infinity"
            ])
        );
        // Year 0 is a leap year; the one before it is written -0001.
        assert_eq!(
            texts(&Date32Array::from(vec![-719_528, -719_529])),
            some(&["0000-01-01", "-0001-12-31"])
        );
        assert_eq!(
            texts(&Date64Array::from(vec![86_400_000 * 31 + 5])),
            some(&["1970-02-01"])
        );
        let micros = 1_704_164_645_123_456; // 2024-01-02T03:04:05.123456
        assert_eq!(
            texts(&TimestampMicrosecondArray::from(vec![
                micros,
                -1,
                i64::MAX,
                i64::MIN
            ])),
            some(&[
                "2024-01-02T03:04:05.123456",
                "1969-12-31T23:59:59.999999",
                "infinity",
                "-infinity"
            ])
        );
        assert_eq!(
            texts(&TimestampMicrosecondArray::from(vec![micros]).with_timezone("+02:00")),
            some(&["2024-01-02T03:04:05.123456Z"])
        );
        assert_eq!(
            texts(&TimestampSecondArray::from(vec![0])),
            some(&["1970-01-01T00:00:00"])
        );
        assert_eq!(
            texts(&TimestampMillisecondArray::from(vec![1])),
            some(&["1970-01-01T00:00:00.001"])
        );
        assert_eq!(
            texts(&TimestampNanosecondArray::from(vec![5])),
            some(&["1970-01-01T00:00:00.000000005"])
        );
        assert_eq!(
            texts(&Time64MicrosecondArray::from(vec![3_723_000_042])),
            some(&["01:02:03.000042"])
        );
        assert_eq!(
            texts(&Time32SecondArray::from(vec![86_399])),
            some(&["23:59:59"])
        );
        let bad = Time32SecondArray::from(vec![86_400]);
        assert!(field(&bad, 0).unwrap_err().contains("within one day"));
        let far = Date64Array::from(vec![i64::MAX]);
        assert!(field(&far, 0).unwrap_err().contains("outside the calendar"));
    }

    #[test]
    fn lists_and_structs_are_json() {
        let mut builder = ListBuilder::new(Int32Builder::new());
        builder.append_value([Some(1), None, Some(3)]);
        builder.append_null();
        builder.append_value([]);
        let ints = builder.finish();
        assert_eq!(
            texts(&ints),
            [Some("[1,null,3]".into()), None, Some("[]".into())]
        );

        let words = ListArray::from_iter_primitive::<Int32Type, _, _>([Some(vec![Some(1)])]);
        assert_eq!(texts(&words), some(&["[1]"]));

        let strings: ArrayRef = Arc::new(StringArray::from(vec![Some("a\"b"), None]));
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![f64::NAN, 2.0]));
        let stamps: ArrayRef =
            Arc::new(TimestampMicrosecondArray::from(vec![0, 1]).with_timezone("UTC"));
        let fields = Fields::from(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("f", DataType::Float64, false),
            Field::new("t", stamps.data_type().clone(), false),
        ]);
        let record = StructArray::new(fields, vec![strings, floats, stamps], None);
        assert_eq!(
            texts(&record),
            some(&[
                r#"{"s":"a\"b","f":"NaN","t":"1970-01-01T00:00:00.000000Z"}"#,
                r#"{"s":null,"f":2,"t":"1970-01-01T00:00:00.000001Z"}"#
            ])
        );
    }

    #[test]
    fn unsupported_types_are_named() {
        let e = check_type(&DataType::Duration(TimeUnit::Second)).unwrap_err();
        assert!(e.contains("Duration"), "{e}");
        let nested = DataType::List(Arc::new(Field::new(
            "item",
            DataType::Interval(weir_sdk::arrow_schema::IntervalUnit::DayTime),
            true,
        )));
        assert!(check_type(&nested).unwrap_err().contains("Interval"));
    }
}
