//! Positions: where a change sits in its source's order, as order-preserving bytes.
//!
//! Every source encodes its positions so that comparing the bytes compares
//! source order. The commit core, the position store and the sinks only ever
//! compare and copy them, so none of them needs to know which source made one.

use std::fmt;

/// An order-preserving position. `Ord` is byte-lexicographic, which is the
/// source's order by construction of each source's encoding.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position(Vec<u8>);

/// The first byte of every position says which phase of a table's life it
/// belongs to, so that backfill (snapshot) positions sort before streaming
/// positions of the same source.
pub const PHASE_SNAPSHOT: u8 = 0x00;
pub const PHASE_STREAM: u8 = 0x01;

impl Position {
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Position(bytes)
    }

    /// A streaming position whose order within the source's log is the
    /// byte order of `order`. How `order` is laid out is the source's
    /// business: the core, the store and the sinks only compare it.
    pub fn streaming(order: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(1 + order.len());
        bytes.push(PHASE_STREAM);
        bytes.extend_from_slice(order);
        Position(bytes)
    }

    /// Whether this is a backfill (snapshot) position, which sorts before
    /// every streaming one.
    pub fn is_snapshot(&self) -> bool {
        self.0.first() == Some(&PHASE_SNAPSHOT)
    }

    /// The source's order bytes of a streaming position (what follows
    /// the phase byte); `None` for a backfill position.
    pub fn stream_order(&self) -> Option<&[u8]> {
        self.0.strip_prefix(&[PHASE_STREAM])
    }

    /// A backfill (snapshot) position: the table's name, then the row's
    /// key in a byte encoding whose order is the order the backfill reads
    /// rows in (the source's business, like anything it appends after it).
    /// Sorts before every streaming position, tables in byte order of their
    /// names.
    pub fn snapshot(table: &str, key: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(2 + table.len() + key.len());
        Position::write_snapshot(table, key, &mut bytes);
        Position(bytes)
    }

    /// The bytes of [`Position::snapshot`] into `out`, replacing what it
    /// held: for a source that makes a position per row without an
    /// allocation per row.
    pub fn write_snapshot(table: &str, key: &[u8], out: &mut Vec<u8>) {
        debug_assert!(!table.as_bytes().contains(&0));
        out.clear();
        out.push(PHASE_SNAPSHOT);
        out.extend_from_slice(table.as_bytes());
        out.push(0);
        out.extend_from_slice(key);
    }

    /// Decodes a position made by [`Position::snapshot`]: (table, key).
    pub fn as_snapshot(&self) -> Option<(&str, &[u8])> {
        let rest = self.0.strip_prefix(&[PHASE_SNAPSHOT])?;
        let end = rest.iter().position(|&b| b == 0)?;
        let table = std::str::from_utf8(&rest[..end]).ok()?;
        Some((table, &rest[end + 1..]))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }

    pub fn from_hex(text: &str) -> Result<Self, hex::FromHexError> {
        hex::decode(text).map(Position)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((table, _)) = self.as_snapshot() {
            return write!(f, "backfill {table}");
        }
        // The layout of a streaming position's bytes is its source's
        // (weir_source::commit_order::describe reads the shared one).
        match self.stream_order() {
            Some(order) => write!(f, "stream 0x{}", hex::encode(order)),
            None if self.0.is_empty() => write!(f, "(start)"),
            None => write!(f, "0x{}", self.to_hex()),
        }
    }
}

impl fmt::Debug for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Position({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_positions_sort_by_table_then_key_and_before_streaming() {
        let a = Position::snapshot("public.a", &[0, 5]);
        let a2 = Position::snapshot("public.a", &[1, 0]);
        let ab = Position::snapshot("public.ab", &[]);
        let stream = Position::streaming(&[0]);
        assert!(a < a2 && a2 < ab && ab < stream);
        assert_eq!(a.as_snapshot(), Some(("public.a", [0u8, 5].as_slice())));
        assert_eq!(a.to_string(), "backfill public.a");
        let unordered = Position::from_bytes(vec![PHASE_SNAPSHOT, 0xff, 0xff]);
        assert!(unordered < stream);
    }

    #[test]
    fn a_source_lays_out_its_own_streaming_bytes() {
        let early = Position::streaming(b"binlog.000002:0009");
        let late = Position::streaming(b"binlog.000010:0004");
        assert!(early < late && !early.is_snapshot());
        assert!(Position::snapshot("t", b"k") < early);
        assert!(Position::snapshot("t", b"k").is_snapshot());
        assert_eq!(early.stream_order(), Some(b"binlog.000002:0009".as_slice()));
        assert_eq!(Position::from_hex(&early.to_hex()).unwrap(), early);
        assert_eq!(Position::streaming(&[0xab]).to_string(), "stream 0xab");
    }
}
