//! The streaming positions the generator and the Postgres source share: a
//! transaction's commit order (Postgres: its commit LSN; the generator: its
//! number), then the change's ordinal inside that transaction, both big
//! endian so that byte order is source order.
//!
//! This layout is the sources' business. The core, the stores and the sinks
//! only compare positions; a source with another log (a binlog file and
//! offset, a GTID) lays out its own bytes behind [`Position::streaming`].

use weir_core::position::Position;

/// The streaming position of the `ordinal`th change of the transaction
/// committed at `commit`.
pub fn stream_position(commit: u64, ordinal: u32) -> Position {
    let mut order = [0u8; 12];
    order[..8].copy_from_slice(&commit.to_be_bytes());
    order[8..].copy_from_slice(&ordinal.to_be_bytes());
    Position::streaming(&order)
}

/// Reads a position back as (commit, ordinal).
pub trait StreamPosition {
    /// `None` for a backfill position or one another layout made.
    fn as_stream(&self) -> Option<(u64, u32)>;
}

impl StreamPosition for Position {
    fn as_stream(&self) -> Option<(u64, u32)> {
        let order = self.stream_order()?;
        if order.len() != 12 {
            return None;
        }
        let commit = u64::from_be_bytes(order[..8].try_into().ok()?);
        let ordinal = u32::from_be_bytes(order[8..].try_into().ok()?);
        Some((commit, ordinal))
    }
}

/// A position as an operator reads it: `commit/ordinal` for this layout,
/// the core's rendering (backfill table, or the raw bytes) otherwise.
pub fn describe(position: &Position) -> String {
    match position.as_stream() {
        Some((commit, ordinal)) => format!("{commit}/{ordinal}"),
        None => position.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_order_is_commit_then_ordinal_order() {
        let cases = [
            (stream_position(1, 0), stream_position(1, 1)),
            (stream_position(1, u32::MAX), stream_position(2, 0)),
            (stream_position(255, 7), stream_position(256, 0)),
            (
                stream_position(u64::MAX - 1, 9),
                stream_position(u64::MAX, 0),
            ),
        ];
        for (lo, hi) in cases {
            assert!(lo < hi, "{lo} should sort before {hi}");
            assert!(lo.as_bytes() < hi.as_bytes());
        }
        assert!(Position::snapshot("public.t", &[0xff, 0xff]) < stream_position(0, 0));
    }

    #[test]
    fn round_trips_and_reads_as_commit_slash_ordinal() {
        let p = stream_position(123_456_789, 42);
        assert_eq!(p.as_stream(), Some((123_456_789, 42)));
        assert_eq!(Position::from_hex(&p.to_hex()).unwrap(), p);
        assert_eq!(describe(&p), "123456789/42");
        assert_eq!(
            describe(&Position::snapshot("public.a", b"k")),
            "backfill public.a"
        );
    }

    #[test]
    fn another_layout_is_not_read_as_this_one() {
        let binlog = Position::streaming(b"binlog.000002:0009");
        assert_eq!(binlog.as_stream(), None);
        assert!(describe(&binlog).starts_with("stream 0x"));
    }
}
