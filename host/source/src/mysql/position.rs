//! Positions of the MySQL/MariaDB source.
//!
//! **Streaming.** A transaction's place is the binlog coordinate of its
//! first event (its GTID event, or `BEGIN`): the binlog file's number in the
//! high 32 bits, the offset in the file in the low 32, which orders exactly
//! as the server wrote its transactions, that is in commit order (a server
//! writes one binlog; the files' numbers grow, and an event's offset fits
//! 32 bits, as its header holds it). Then the change's ordinal in the
//! transaction, from 1. The bytes are the shared `commit/ordinal` layout of
//! [`crate::commit_order`]. Ordinal 0 at a coordinate is "standing before
//! whatever starts there": where an idle or caught-up stream stands, and
//! where a resumed stream starts reading without skipping anything.
//!
//! Several GTID domains change nothing here: the binlog of one server is
//! one sequence whatever the domains of its transactions. A position is a
//! place in *this* server's binlog; after a fail-over to another server the
//! numbers mean nothing (docs/mysql.md).
//!
//! **Backfill.** `Position::snapshot(table, …)` followed by: the binlog
//! coordinate the stream will start from once the backfill is done (the
//! first snapshot's, kept by every later run of the pipeline), the row's key
//! in an encoding whose byte order is the order the backfill reads rows in
//! (so a position means "every key up to here" in every run, whatever was
//! deleted in between), and the key's values as the server gave them,
//! which a resumed backfill reads on after.

use crate::commit_order::{StreamPosition, stream_position};
use weir_core::position::Position;

/// A place in the server's binlog: a file's number (`binlog.000003` is 3)
/// and a byte offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BinlogCoord {
    pub file: u32,
    pub offset: u32,
}

impl BinlogCoord {
    /// The number of a binlog file from its name (`binlog.000003` -> 3).
    pub fn file_number(name: &str) -> Result<u32, String> {
        let (_, digits) = name
            .rsplit_once('.')
            .ok_or_else(|| format!("binlog file `{name}` has no `.<number>` suffix"))?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("binlog file `{name}` has no `.<number>` suffix"));
        }
        digits
            .parse()
            .map_err(|_| format!("binlog file `{name}`: the number is too big"))
    }

    /// `<file>:<offset>` as an error names a transaction.
    pub fn parse_file_and_offset(text: &str) -> Result<BinlogCoord, String> {
        let (file, offset) = text
            .trim()
            .rsplit_once(':')
            .ok_or("is not `<binlog file>:<offset>`")?;
        let file = BinlogCoord::file_number(file)?;
        let offset = offset
            .parse()
            .map_err(|_| format!("`{offset}` is not an offset"))?;
        Ok(BinlogCoord { file, offset })
    }

    pub fn at(file: &str, offset: u64) -> Result<BinlogCoord, String> {
        let offset = u32::try_from(offset)
            .map_err(|_| format!("offset {offset} in {file} does not fit 32 bits"))?;
        Ok(BinlogCoord {
            file: BinlogCoord::file_number(file)?,
            offset,
        })
    }

    fn commit(self) -> u64 {
        (u64::from(self.file) << 32) | u64::from(self.offset)
    }

    fn from_commit(commit: u64) -> BinlogCoord {
        BinlogCoord {
            file: (commit >> 32) as u32,
            offset: commit as u32,
        }
    }

    /// The position of change `ordinal` (from 1) of the transaction that
    /// starts here; ordinal 0 stands before it, `u32::MAX` after it.
    pub fn position(self, ordinal: u32) -> Position {
        stream_position(self.commit(), ordinal)
    }

    /// Reads a streaming position back as (coordinate, ordinal).
    pub fn of(position: &Position) -> Option<(BinlogCoord, u32)> {
        let (commit, ordinal) = position.as_stream()?;
        Some((BinlogCoord::from_commit(commit), ordinal))
    }

    /// This coordinate in a file named like `like` (same base name).
    pub fn file_name(self, like: &str) -> String {
        let base = like.rsplit_once('.').map_or(like, |(base, _)| base);
        format!("{base}.{:06}", self.file)
    }
}

/// What a backfill position holds after the table's name.
#[derive(Clone, Debug, PartialEq)]
pub struct BackfillPlace {
    /// Where the stream starts once the backfill is done.
    pub stream_from: BinlogCoord,
    /// The key in read order: each column's order bytes ([`write_order_bytes`])
    /// escaped and ended, so that any number of them compare as the
    /// columns' tuple does.
    pub order: Vec<u8>,
    /// The row's key values, to read on after.
    pub key: Vec<mysql_async::Value>,
}

/// The end of one key column's bytes, and of the whole key, in
/// [`BackfillPlace::order`]; a zero byte inside a column is `0x00 0xff`.
const COLUMN_END: [u8; 2] = [0, 1];
const KEY_END: [u8; 2] = [0, 0];

impl BackfillPlace {
    /// The order bytes of a key whose columns' own order bytes are `columns`.
    /// (With [`BackfillPlace::position`], the reference [`PositionWriter`]
    /// is checked against.)
    #[cfg(test)]
    pub fn order_of<'a>(columns: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        for column in columns {
            push_order_column(column, &mut out);
        }
        out.extend_from_slice(&KEY_END);
        out
    }

    #[cfg(test)]
    pub fn position(&self, table: &str) -> Position {
        let mut bytes = Vec::with_capacity(8 + self.order.len() + 16 * self.key.len());
        bytes.extend_from_slice(&self.stream_from.commit().to_be_bytes());
        bytes.extend_from_slice(&self.order);
        for value in &self.key {
            write_value(value, &mut bytes);
        }
        Position::snapshot(table, &bytes)
    }

    /// The place a backfill position of `table` holds; None when it is not
    /// one of this source's.
    pub fn of(position: &Position) -> Option<(String, BackfillPlace)> {
        let (table, bytes) = position.as_snapshot()?;
        let commit = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
        let rest = &bytes[8..];
        // The order bytes run to the first 0x00 0x00 outside an escape.
        let mut i = 0;
        let order_end = loop {
            match (rest.get(i)?, rest.get(i + 1)) {
                (0, Some(0)) => break i + 2,
                (0, Some(_)) => i += 2,
                _ => i += 1,
            }
        };
        let order = rest[..order_end].to_vec();
        let mut raw = &rest[order_end..];
        let mut key = Vec::new();
        while !raw.is_empty() {
            key.push(read_value(&mut raw)?);
        }
        Some((
            table.to_string(),
            BackfillPlace {
                stream_from: BinlogCoord::from_commit(commit),
                order,
                key,
            },
        ))
    }
}

/// [`write_order_bytes`]'s bytes on their own.
#[cfg(test)]
pub fn order_bytes(value: &crate::change::Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_order_bytes(value, &mut out);
    out
}

/// Appends a key column's value as bytes whose order is the value's order
/// (the order the backfill's `ORDER BY` reads in: numbers and times by
/// value, text and bytes by their bytes).
fn write_order_bytes(value: &crate::change::Value, out: &mut Vec<u8>) {
    use crate::change::Value as V;
    if value.push_ordered(out) {
        return;
    }
    match value {
        V::Float64(f) => {
            let bits = f.to_bits();
            let ordered = if bits >> 63 == 1 {
                !bits
            } else {
                bits ^ (1 << 63)
            };
            out.extend_from_slice(&ordered.to_be_bytes())
        }
        V::Utf8(s) => out.extend_from_slice(s.as_bytes()),
        V::Binary(b) => out.extend_from_slice(b),
        // Numbers and times are written above; a key is never a list or null.
        _ => {}
    }
}

/// One key column's order bytes in [`BackfillPlace::order`]: escaped and
/// ended.
fn push_order_column(column: &[u8], out: &mut Vec<u8>) {
    // Runs without a zero byte are copied whole.
    for (i, run) in column.split(|&b| b == 0).enumerate() {
        if i > 0 {
            out.extend_from_slice(&[0, 0xff]);
        }
        out.extend_from_slice(run);
    }
    out.extend_from_slice(&COLUMN_END);
}

/// The backfill positions of one table's rows, in the bytes of
/// [`BackfillPlace::position`], written into buffers kept from row to row:
/// a chunk's positions cost no allocation per row. A row's key is given
/// twice: as the server sent it (before the values are converted, which
/// consumes them) and converted (its order bytes).
pub struct PositionWriter<'a> {
    table: &'a str,
    commit: [u8; 8],
    /// The key as read, written by [`PositionWriter::read_key`].
    key: Vec<u8>,
    /// One column's order bytes, before escaping.
    column: Vec<u8>,
    body: Vec<u8>,
    out: Vec<u8>,
}

impl<'a> PositionWriter<'a> {
    pub fn new(table: &'a str, stream_from: BinlogCoord) -> PositionWriter<'a> {
        PositionWriter {
            table,
            commit: stream_from.commit().to_be_bytes(),
            key: Vec::new(),
            column: Vec::new(),
            body: Vec::new(),
            out: Vec::new(),
        }
    }

    /// The next row's key values as the server sent them, in key order.
    pub fn read_key<'v>(&mut self, values: impl Iterator<Item = &'v mysql_async::Value>) {
        self.key.clear();
        for value in values {
            write_value(value, &mut self.key);
        }
    }

    /// The key given to [`PositionWriter::read_key`], for a message.
    pub fn key_values(&self) -> Vec<mysql_async::Value> {
        let mut raw = self.key.as_slice();
        std::iter::from_fn(|| read_value(&mut raw)).collect()
    }

    /// The position of the row whose key [`PositionWriter::read_key`] was
    /// given, its key's converted values being `order`, in key order.
    pub fn position<'v>(&mut self, order: impl Iterator<Item = &'v crate::change::Value>) -> &[u8] {
        self.body.clear();
        self.body.extend_from_slice(&self.commit);
        for value in order {
            self.column.clear();
            write_order_bytes(value, &mut self.column);
            push_order_column(&self.column, &mut self.body);
        }
        self.body.extend_from_slice(&KEY_END);
        self.body.extend_from_slice(&self.key);
        Position::write_snapshot(self.table, &self.body, &mut self.out);
        &self.out
    }
}

const NULL: u8 = 0;
const BYTES: u8 = 1;
const INT: u8 = 2;
const UINT: u8 = 3;
const FLOAT: u8 = 4;
const DOUBLE: u8 = 5;
const DATE: u8 = 6;
const TIME: u8 = 7;

fn write_value(value: &mysql_async::Value, out: &mut Vec<u8>) {
    use mysql_async::Value as V;
    match value {
        V::NULL => out.push(NULL),
        V::Bytes(b) => {
            out.push(BYTES);
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            out.extend_from_slice(b);
        }
        V::Int(i) => {
            out.push(INT);
            out.extend_from_slice(&i.to_be_bytes());
        }
        V::UInt(u) => {
            out.push(UINT);
            out.extend_from_slice(&u.to_be_bytes());
        }
        V::Float(f) => {
            out.push(FLOAT);
            out.extend_from_slice(&f.to_be_bytes());
        }
        V::Double(f) => {
            out.push(DOUBLE);
            out.extend_from_slice(&f.to_be_bytes());
        }
        V::Date(y, mo, d, h, mi, s, us) => {
            out.push(DATE);
            out.extend_from_slice(&y.to_be_bytes());
            out.extend_from_slice(&[*mo, *d, *h, *mi, *s]);
            out.extend_from_slice(&us.to_be_bytes());
        }
        V::Time(neg, days, h, mi, s, us) => {
            out.push(TIME);
            out.push(u8::from(*neg));
            out.extend_from_slice(&days.to_be_bytes());
            out.extend_from_slice(&[*h, *mi, *s]);
            out.extend_from_slice(&us.to_be_bytes());
        }
    }
}

fn read_value(input: &mut &[u8]) -> Option<mysql_async::Value> {
    use mysql_async::Value as V;
    fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = input.split_at_checked(n)?;
        *input = rest;
        Some(head)
    }
    fn array<const N: usize>(input: &mut &[u8]) -> Option<[u8; N]> {
        take(input, N)?.try_into().ok()
    }
    let tag = take(input, 1)?[0];
    Some(match tag {
        NULL => V::NULL,
        BYTES => {
            let len = u32::from_be_bytes(array(input)?) as usize;
            V::Bytes(take(input, len)?.to_vec())
        }
        INT => V::Int(i64::from_be_bytes(array(input)?)),
        UINT => V::UInt(u64::from_be_bytes(array(input)?)),
        FLOAT => V::Float(f32::from_be_bytes(array(input)?)),
        DOUBLE => V::Double(f64::from_be_bytes(array(input)?)),
        DATE => {
            let y = u16::from_be_bytes(array(input)?);
            let [mo, d, h, mi, s] = array(input)?;
            V::Date(y, mo, d, h, mi, s, u32::from_be_bytes(array(input)?))
        }
        TIME => {
            let neg = take(input, 1)?[0] != 0;
            let days = u32::from_be_bytes(array(input)?);
            let [h, mi, s] = array(input)?;
            V::Time(neg, days, h, mi, s, u32::from_be_bytes(array(input)?))
        }
        _ => return None,
    })
}

/// A position as an operator reads it: `binlog.000003:1234/2` (the file is
/// named by number only, the base name being the server's).
pub fn describe(position: &Position) -> String {
    if let Some((coord, ordinal)) = BinlogCoord::of(position) {
        return format!(
            "binlog file {} offset {} change {ordinal}",
            coord.file, coord.offset
        );
    }
    position.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_async::Value as V;

    #[test]
    fn positions_order_as_file_then_offset_then_ordinal() {
        let at = |file, offset| BinlogCoord { file, offset };
        let ordered = [
            at(1, 4).position(0),
            at(1, 4).position(1),
            at(1, 4).position(u32::MAX),
            at(1, 900).position(0),
            at(1, u32::MAX).position(7),
            at(2, 4).position(0),
            at(300_000, 4).position(1),
        ];
        for pair in ordered.windows(2) {
            assert!(pair[0] < pair[1], "{:?} < {:?}", pair[0], pair[1]);
        }
        assert!(Position::snapshot("shop.z", &[0xff; 20]) < at(0, 0).position(0));
        assert_eq!(
            BinlogCoord::of(&at(5, 1234).position(9)),
            Some((at(5, 1234), 9))
        );
    }

    #[test]
    fn file_names_and_coordinates_read_back() {
        assert_eq!(BinlogCoord::file_number("mysql-bin.000042"), Ok(42));
        assert_eq!(BinlogCoord::file_number("a.b.1000000"), Ok(1_000_000));
        assert!(BinlogCoord::file_number("binlog").is_err());
        assert!(BinlogCoord::file_number("binlog.").is_err());
        assert!(BinlogCoord::file_number("binlog.12a").is_err());
        let c = BinlogCoord::parse_file_and_offset("binlog.000003:1234").unwrap();
        assert_eq!(
            c,
            BinlogCoord {
                file: 3,
                offset: 1234
            }
        );
        assert_eq!(c.file_name("binlog.000001"), "binlog.000003");
        assert!(BinlogCoord::parse_file_and_offset("binlog.000003").is_err());
        assert!(BinlogCoord::at("binlog.000001", 1 << 40).is_err());
    }

    #[test]
    fn key_order_bytes_order_as_the_keys_do() {
        use crate::change::Value as W;
        let key = |cols: &[W]| {
            let bytes: Vec<Vec<u8>> = cols.iter().map(order_bytes).collect();
            BackfillPlace::order_of(bytes.iter().map(Vec::as_slice))
        };
        let ascending = [
            vec![W::Int64(i64::MIN), W::Utf8(String::new())],
            vec![W::Int64(-1), W::Utf8("a".into())],
            vec![W::Int64(-1), W::Utf8("a\0".into())],
            vec![W::Int64(-1), W::Utf8("a\0\0".into())],
            vec![W::Int64(-1), W::Utf8("a\u{1}".into())],
            vec![W::Int64(-1), W::Utf8("ab".into())],
            vec![W::Int64(0), W::Utf8(String::new())],
            vec![W::Int64(i64::MAX), W::Utf8("z".into())],
        ];
        for pair in ascending.windows(2) {
            assert!(
                key(&pair[0]) < key(&pair[1]),
                "{:?} < {:?}",
                pair[0],
                pair[1]
            );
        }
        let floats = [
            f64::NEG_INFINITY,
            -2.5,
            -0.0,
            0.0,
            1e-300,
            3.0,
            f64::INFINITY,
        ];
        for pair in floats.windows(2) {
            assert!(order_bytes(&W::Float64(pair[0])) <= order_bytes(&W::Float64(pair[1])));
        }
        let decimals = [i128::MIN, -10, 0, 7, i128::MAX];
        for pair in decimals.windows(2) {
            assert!(order_bytes(&W::Decimal128(pair[0])) < order_bytes(&W::Decimal128(pair[1])));
        }
    }

    #[test]
    fn the_position_writer_writes_what_a_place_reads_back() {
        use crate::change::Value as W;
        let coord = BinlogCoord {
            file: 12,
            offset: 4096,
        };
        let rows: Vec<(Vec<V>, Vec<W>)> = vec![
            (vec![V::Int(7)], vec![W::Int64(7)]),
            (
                vec![V::Bytes(b"a\0b\0".to_vec()), V::Int(-3)],
                vec![W::Utf8("a\0b\0".into()), W::Int32(-3)],
            ),
            (
                vec![V::Bytes(Vec::new()), V::Bytes(b"\0\0x".to_vec())],
                vec![W::Utf8(String::new()), W::Binary(b"\0\0x".to_vec())],
            ),
            (
                vec![V::Date(2024, 2, 29, 1, 2, 3, 4), V::Double(-0.5)],
                vec![W::TimestampMicros(1_709_168_523_000_004), W::Float64(-0.5)],
            ),
        ];
        let mut writer = PositionWriter::new("shop.orders", coord);
        for (read, converted) in rows {
            writer.read_key(read.iter());
            assert_eq!(writer.key_values(), read);
            let written = Position::from_bytes(writer.position(converted.iter()).to_vec());
            let bytes: Vec<Vec<u8>> = converted.iter().map(order_bytes).collect();
            let place = BackfillPlace {
                stream_from: coord,
                order: BackfillPlace::order_of(bytes.iter().map(Vec::as_slice)),
                key: read.clone(),
            };
            assert_eq!(written, place.position("shop.orders"), "{read:?}");
            assert_eq!(
                BackfillPlace::of(&written),
                Some(("shop.orders".to_string(), place))
            );
        }
    }

    #[test]
    fn a_backfill_place_round_trips_and_orders_by_key() {
        let key = vec![
            V::Int(-5),
            V::UInt(u64::MAX),
            V::Bytes(b"k\0\xff".to_vec()),
            V::Date(2024, 2, 29, 23, 59, 58, 999_999),
            V::Time(true, 1, 2, 3, 4, 5),
            V::Double(-0.5),
            V::Float(1.25),
            V::NULL,
        ];
        let place = BackfillPlace {
            stream_from: BinlogCoord {
                file: 7,
                offset: 99,
            },
            order: BackfillPlace::order_of([b"a\0b".as_slice(), &[0, 0, 1]]),
            key: key.clone(),
        };
        let pos = place.position("shop.orders");
        let (table, back) = BackfillPlace::of(&pos).unwrap();
        assert_eq!(table, "shop.orders");
        assert_eq!(back, place);
        // Order bytes decide, whatever the raw values after them.
        let later = BackfillPlace {
            order: BackfillPlace::order_of([b"a\0b".as_slice(), &[0, 0, 2]]),
            key: vec![V::Int(-1000)],
            ..place.clone()
        };
        assert!(pos < later.position("shop.orders"));
        // Foreign bytes are not read as a place.
        assert_eq!(
            BackfillPlace::of(&Position::snapshot("t", &[1, 2, 3])),
            None
        );
        // Cut inside the last but one value (the float before the NULL).
        let mut truncated = pos.as_bytes().to_vec();
        truncated.truncate(truncated.len() - 3);
        assert_eq!(BackfillPlace::of(&Position::from_bytes(truncated)), None);
    }
}
