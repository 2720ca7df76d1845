//! Table keys: the order the backfill reads a table in, and the bytes of a
//! backfill position.
//!
//! A backfill position holds the key of the last row read, encoded so that
//! byte order is the order the backfill reads rows in: the position then
//! means "every key up to here" in every run, whatever was deleted in
//! between (a chunk or row counter would shift and skip rows on a re-read).

use super::decode::{PgKind, decode, ident, literal};
use super::table::Table;
use crate::change::Value;

/// How a key column orders the backfill, and so how its position bytes are made.
#[derive(Clone, Debug)]
pub(super) enum KeyOrder {
    /// The column's own order, encoded from its value.
    Native(PgKind),
    /// The byte order of its text form.
    Text,
    /// `ctid`, for append tables without a key.
    Tid,
}

impl Table {
    /// How each key column orders the backfill.
    pub fn key_orders(&self) -> Vec<KeyOrder> {
        if self.info.key.is_empty() {
            return vec![KeyOrder::Tid];
        }
        self.info
            .key
            .iter()
            .map(|&i| match &self.info.columns[i].kind {
                k @ (PgKind::Int32
                | PgKind::Int64
                | PgKind::Date
                | PgKind::Time
                | PgKind::Uuid
                | PgKind::Timestamp
                | PgKind::TimestampTz
                | PgKind::Decimal { .. }
                | PgKind::Bool) => KeyOrder::Native(k.clone()),
                _ => KeyOrder::Text,
            })
            .collect()
    }

    /// The backfill's order: expressions on the table aliased `w`
    /// (qualified, so ORDER BY never picks an output column of that name).
    /// Keys without a native order we can encode are ordered by their text
    /// form in byte order (`COLLATE "C"`).
    pub fn key_order_exprs(&self) -> Vec<String> {
        if self.info.key.is_empty() {
            return vec!["w.ctid".to_string()];
        }
        self.info
            .key
            .iter()
            .zip(self.key_orders())
            .map(|(&i, order)| {
                let column = format!("w.{}", ident(&self.info.columns[i].name));
                match order {
                    KeyOrder::Text => format!("({column}::text) COLLATE \"C\""),
                    _ => column,
                }
            })
            .collect()
    }

    /// Literals comparable with [`Table::key_order_exprs`].
    pub fn key_order_literals(&self, texts: &[String]) -> Vec<String> {
        texts
            .iter()
            .zip(self.key_orders())
            .enumerate()
            .map(|(n, (text, order))| match order {
                KeyOrder::Tid => format!("{}::tid", literal(text)),
                KeyOrder::Text => format!("{} COLLATE \"C\"", literal(text)),
                KeyOrder::Native(_) => format!(
                    "{}::{}",
                    literal(text),
                    self.info.columns[self.info.key[n]].sql_type
                ),
            })
            .collect()
    }

    /// The key columns as plain expressions on the table aliased `w`.
    pub fn key_exprs(&self) -> Vec<String> {
        self.info
            .key
            .iter()
            .map(|&i| format!("w.{}", ident(&self.info.columns[i].name)))
            .collect()
    }

    /// The key columns' SQL types, for casting looked-up key literals.
    pub fn key_types(&self) -> Vec<String> {
        self.info
            .key
            .iter()
            .map(|&i| self.info.columns[i].sql_type.clone())
            .collect()
    }
}

/// The backfill position's key bytes: an order-preserving encoding of the
/// key (self-delimiting per column), then the key's text forms (for the
/// resume query; never reached by a comparison, the encoding is unique).
#[cfg(test)]
pub(super) fn encode_key(orders: &[KeyOrder], texts: &[String]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for (order, text) in orders.iter().zip(texts) {
        encode_key_part(order, None, text, &mut out)?;
    }
    append_key_texts(texts.iter().map(String::as_str), &mut out);
    Ok(out)
}

/// Appends the order-preserving bytes of one key column (see
/// [`encode_key`]). A `Native` order encodes `value` when the caller has
/// decoded it already, else decodes `text`.
pub(super) fn encode_key_part(
    order: &KeyOrder,
    value: Option<&Value>,
    text: &str,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    match order {
        KeyOrder::Native(kind) => match value {
            Some(value) => encode_native(kind, value, out),
            None => encode_native(kind, &decode(kind, text)?, out),
        },
        KeyOrder::Text => {
            // 0 is escaped as 0 ff, so 0 0 ends the column and sorts first.
            for &b in text.as_bytes() {
                out.push(b);
                if b == 0 {
                    out.push(0xff);
                }
            }
            out.extend_from_slice(&[0, 0]);
            Ok(())
        }
        KeyOrder::Tid => {
            let inner = text.trim_start_matches('(').trim_end_matches(')');
            let (block, offset) = inner.split_once(',').ok_or("bad ctid")?;
            let block: u32 = block.parse().map_err(|_| "bad ctid")?;
            let offset: u16 = offset.parse().map_err(|_| "bad ctid")?;
            out.extend_from_slice(&block.to_be_bytes());
            out.extend_from_slice(&offset.to_be_bytes());
            Ok(())
        }
    }
}

/// Appends the key's text forms after its encoded columns (see [`encode_key`]).
pub(super) fn append_key_texts<'a>(texts: impl Iterator<Item = &'a str>, out: &mut Vec<u8>) {
    for text in texts {
        out.extend_from_slice(&(text.len() as u32).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }
}

/// Numbers, dates and times in byte order as numeric order; uuids as
/// their bytes.
fn encode_native(kind: &PgKind, value: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    if value.push_ordered(out) {
        return Ok(());
    }
    match value {
        // Postgres orders uuids by their bytes.
        Value::Binary(v) if *kind == PgKind::Uuid && v.len() == 16 => out.extend_from_slice(v),
        other => return Err(format!("key value {other:?} has no encoding")),
    }
    Ok(())
}

/// The key's text forms back from [`encode_key`]'s bytes.
pub(super) fn decode_key_texts(orders: &[KeyOrder], bytes: &[u8]) -> Option<Vec<String>> {
    let mut rest = bytes;
    for order in orders {
        let skip = match order {
            KeyOrder::Native(PgKind::Bool) => 1,
            KeyOrder::Native(PgKind::Int32 | PgKind::Date) => 4,
            KeyOrder::Native(PgKind::Decimal { .. } | PgKind::Uuid) => 16,
            KeyOrder::Native(_) => 8,
            KeyOrder::Tid => 6,
            KeyOrder::Text => {
                let mut i = 0;
                loop {
                    match (rest.get(i)?, rest.get(i + 1)?) {
                        (0, 0) => break i + 2,
                        (0, _) => i += 2,
                        _ => i += 1,
                    }
                }
            }
        };
        rest = rest.get(skip..)?;
    }
    let mut texts = Vec::new();
    for _ in orders {
        let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        texts.push(String::from_utf8(rest.get(4..4 + len)?.to_vec()).ok()?);
        rest = &rest[4 + len..];
    }
    Some(texts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backfill_key_bytes_sort_like_the_backfill_reads_and_give_the_key_back() {
        let orders = vec![
            KeyOrder::Native(PgKind::Int64),
            KeyOrder::Text,
            KeyOrder::Native(PgKind::Decimal {
                precision: 10,
                scale: 2,
            }),
        ];
        let key = |a: &str, b: &str, c: &str| {
            encode_key(&orders, &[a.into(), b.into(), c.into()]).unwrap()
        };
        let sorted = [
            key("-5", "zz", "1.00"),
            key("9", "", "1.00"),
            key("9", "a", "-2.50"),
            key("9", "a", "1.00"),
            key("9", "ab", "0.00"),
            key("10", "a", "0.00"),
        ];
        for pair in sorted.windows(2) {
            assert!(pair[0] < pair[1], "{:?} !< {:?}", pair[0], pair[1]);
        }
        assert_eq!(
            decode_key_texts(&orders, &key("9", "ab", "0.00")).unwrap(),
            vec!["9".to_string(), "ab".into(), "0.00".into()]
        );
        let tid = [KeyOrder::Tid];
        assert!(
            encode_key(&tid, &["(1,10)".into()]).unwrap()
                < encode_key(&tid, &["(2,1)".into()]).unwrap()
        );
    }

    #[test]
    fn uuid_and_time_keys_sort_as_postgres_orders_them() {
        let orders = vec![
            KeyOrder::Native(PgKind::Uuid),
            KeyOrder::Native(PgKind::Time),
        ];
        let key = |u: &str, t: &str| encode_key(&orders, &[u.into(), t.into()]).unwrap();
        let sorted = [
            key("00000000-0000-0000-0000-0000000000ff", "23:59:59"),
            key("00000000-0000-0000-0000-000000000100", "00:00:00"),
            key("00000000-0000-0000-0000-000000000100", "00:00:00.000001"),
            key("ff000000-0000-0000-0000-000000000000", "00:00:00"),
        ];
        for pair in sorted.windows(2) {
            assert!(pair[0] < pair[1], "{:?} !< {:?}", pair[0], pair[1]);
        }
        assert_eq!(
            decode_key_texts(&orders, &sorted[2]).unwrap(),
            vec![
                "00000000-0000-0000-0000-000000000100".to_string(),
                "00:00:00.000001".into()
            ]
        );
    }

    #[test]
    fn text_keys_with_nul_bytes_still_sort_and_round_trip() {
        let orders = [KeyOrder::Text];
        let a = encode_key(&orders, &["a".into()]).unwrap();
        let a_nul = encode_key(&orders, &["a\0".into()]).unwrap();
        let b = encode_key(&orders, &["b".into()]).unwrap();
        assert!(a < a_nul && a_nul < b);
        assert_eq!(
            decode_key_texts(&orders, &a_nul).unwrap(),
            vec!["a\0".to_string()]
        );
    }

    #[test]
    fn a_uuid_key_position_of_the_text_order_does_not_decode_as_the_value_order() {
        // Builds before uuid keys were ordered by value wrote their text;
        // such a position must fail to resume, not resume at a wrong key.
        let uuid = "4de195d1-ec3f-4994-bfe8-09fe0b1504e7";
        let old = encode_key(&[KeyOrder::Text], &[uuid.into()]).unwrap();
        assert_eq!(
            decode_key_texts(&[KeyOrder::Native(PgKind::Uuid)], &old),
            None
        );
        let new = encode_key(&[KeyOrder::Native(PgKind::Uuid)], &[uuid.into()]).unwrap();
        assert_eq!(
            decode_key_texts(&[KeyOrder::Native(PgKind::Uuid)], &new),
            Some(vec![uuid.to_string()])
        );
    }

    #[test]
    fn bad_key_bytes_give_nothing_back() {
        let orders = [KeyOrder::Native(PgKind::Int32)];
        assert!(decode_key_texts(&orders, &[0, 1]).is_none());
        assert!(encode_key(&[KeyOrder::Tid], &["(x,1)".into()]).is_err());
    }
}
