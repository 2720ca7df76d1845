//! Where things live in Redis.
//!
//! Parts are joined with `:`. Every part but the operator's prefix is
//! escaped: `\` becomes `\\` and `:` becomes `\:`, so an unescaped `:` only
//! ever separates parts and two different rows never share a key:
//!
//! - an upsert row: `<prefix>:<destination>:<key 1>:<key 2>...` (a hash),
//! - an append table: `<prefix>:<destination>` (a stream),
//! - a table's position: `<prefix>:__weir:<pipeline>:<table>` (a hash).
//!
//! The destination `__weir` is reserved so that no row key can be a
//! position key.

/// The destination name that would share its keys with the position hashes.
pub const RESERVED_DESTINATION: &str = "__weir";

/// Builds the keys of one sink, under its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    /// Keys under `prefix`, which is used as is (the operator's, not escaped).
    pub fn new(prefix: &str) -> Layout {
        Layout {
            prefix: prefix.to_string(),
        }
    }

    /// The hash holding one row of an upsert table, from its rendered key
    /// values in key order.
    pub fn row_key<'a>(
        &self,
        destination: &str,
        key_values: impl IntoIterator<Item = &'a [u8]>,
    ) -> Vec<u8> {
        let mut key = self.stream_key(destination);
        for value in key_values {
            key.push(b':');
            escape_into(&mut key, value);
        }
        key
    }

    /// The stream holding every change of an append table.
    pub fn stream_key(&self, destination: &str) -> Vec<u8> {
        let mut key = self.prefix.as_bytes().to_vec();
        key.push(b':');
        escape_into(&mut key, destination.as_bytes());
        key
    }

    /// The hash holding a table's committed position and epoch for one
    /// pipeline.
    pub fn position_key(&self, pipeline: &str, table: &str) -> Vec<u8> {
        let mut key = self.stream_key(RESERVED_DESTINATION);
        key.push(b':');
        escape_into(&mut key, pipeline.as_bytes());
        key.push(b':');
        escape_into(&mut key, table.as_bytes());
        key
    }
}

fn escape_into(out: &mut Vec<u8>, part: &[u8]) {
    for &b in part {
        if b == b'\\' || b == b':' {
            out.push(b'\\');
        }
        out.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(layout: &Layout, destination: &str, keys: &[&str]) -> String {
        String::from_utf8(layout.row_key(destination, keys.iter().map(|k| k.as_bytes()))).unwrap()
    }

    #[test]
    fn layout_and_escaping() {
        let l = Layout::new("weir");
        assert_eq!(row(&l, "sales.orders", &["42"]), "weir:sales.orders:42");
        assert_eq!(row(&l, "t", &["a:b", "c"]), r"weir:t:a\:b:c");
        assert_eq!(row(&l, "t", &["a", "b:c"]), r"weir:t:a:b\:c");
        assert_eq!(row(&l, "t", &[r"a\", ":b"]), r"weir:t:a\\:\:b");
        assert_eq!(row(&l, "t", &[r"a\:", "b"]), r"weir:t:a\\\::b");
        assert_eq!(row(&l, "a:b", &["c"]), r"weir:a\:b:c");
        assert_eq!(row(&l, "a", &["b:c"]), r"weir:a:b\:c");
        assert_eq!(l.stream_key("log:x"), br"weir:log\:x");
        assert_eq!(
            l.position_key("p:1", "public.t"),
            br"weir:__weir:p\:1:public.t"
        );
        assert_eq!(row(&Layout::new("app:cdc"), "t", &["1"]), "app:cdc:t:1");
    }

    #[test]
    fn distinct_rows_get_distinct_keys() {
        // Every split of the same characters into two key values, and every
        // placement of separators and backslashes, gives its own key.
        let l = Layout::new("p");
        let alphabet = ["", "a", ":", r"\", r"\:", r":\", "::", r"\\"];
        let mut seen = std::collections::HashMap::new();
        for x in alphabet {
            for y in alphabet {
                let key = row(&l, "t", &[x, y]);
                if let Some(earlier) = seen.insert(key.clone(), (x, y)) {
                    panic!("{key} for both {earlier:?} and {:?}", (x, y));
                }
            }
        }
    }
}
