//! Comparing what sinks hold with the generator's oracle.

use std::path::Path;

use weir_source::change::TableSchema;
use weir_source::generator::oracle::{ExpectedState, Rows, apply_change, row_key, shop_tables};

use crate::read::{ReadChange, changes, read_parquet, read_positioned};

/// What reducing a change log read from a destination gave, and what was
/// odd about it.
pub struct Reduced {
    pub state: Rows,
    /// Changes seen more than once (same position).
    pub duplicates: usize,
}

/// Applies changes in position order with [`apply_change`], counting the
/// changes a destination holds more than once.
pub fn reduce(table: &TableSchema, mut log: Vec<ReadChange>) -> Reduced {
    log.sort_by(|a, b| a.pos.cmp(&b.pos));
    let before = log.len();
    log.dedup_by(|a, b| a.pos == b.pos);
    let duplicates = before - log.len();
    let mut state = Rows::new();
    for change in log {
        let key = row_key(table, &change.values);
        apply_change(&mut state, key, change.op, change.values);
    }
    Reduced { state, duplicates }
}

/// Compares a destination table with the expected state, with a readable
/// account of the first differences.
pub fn assert_table_matches(label: &str, expected: &ExpectedState, table: &str, actual: &Rows) {
    let want = &expected.tables[table];
    if want == actual {
        return;
    }
    let missing: Vec<_> = want
        .keys()
        .filter(|k| !actual.contains_key(*k))
        .take(3)
        .collect();
    let extra: Vec<_> = actual
        .keys()
        .filter(|k| !want.contains_key(*k))
        .take(3)
        .collect();
    let differ: Vec<_> = want
        .iter()
        .filter(|(k, v)| actual.get(*k).is_some_and(|a| a != *v))
        .take(2)
        .map(|(k, v)| format!("{k:?}: want {v:?}, got {:?}", actual[k]))
        .collect();
    panic!(
        "{label}, table {table}: {} rows expected, {} found; missing {missing:?}; extra {extra:?}; differing {differ:?}",
        want.len(),
        actual.len()
    );
}

/// How a destination differs from the oracle, counted over every table
/// rather than stopping at the first difference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OracleDifferences {
    /// Changes held more than once (same position).
    pub duplicates: usize,
    /// Keys the oracle has that the destination lacks: changes lost.
    pub missing: usize,
    /// Keys the destination has that the oracle does not.
    pub extra: usize,
    /// Keys both have, with other values: a change that never arrived, or
    /// one applied out of order.
    pub differing: usize,
}

impl OracleDifferences {
    pub fn none(&self) -> bool {
        *self == OracleDifferences::default()
    }
}

/// Compares every generator table of a positioned-fixture root with the
/// oracle, counting the differences.
pub fn positioned_differences(root: &Path, expected: &ExpectedState) -> OracleDifferences {
    let mut found = OracleDifferences::default();
    for table in shop_tables() {
        let reduced = reduce(&table, changes(&table, &read_positioned(root, &table.name)));
        let want = &expected.tables[&table.name];
        found.duplicates += reduced.duplicates;
        found.missing += want
            .keys()
            .filter(|k| !reduced.state.contains_key(*k))
            .count();
        found.extra += reduced
            .state
            .keys()
            .filter(|k| !want.contains_key(*k))
            .count();
        found.differing += want
            .iter()
            .filter(|(k, v)| reduced.state.get(*k).is_some_and(|held| held != *v))
            .count();
    }
    found
}

/// Checks every generator table of a positioned-fixture root against the
/// oracle: exact contents and no change applied twice.
pub fn assert_positioned_exact(root: &Path, expected: &ExpectedState) {
    for table in shop_tables() {
        let reduced = reduce(&table, changes(&table, &read_positioned(root, &table.name)));
        assert_eq!(
            reduced.duplicates, 0,
            "the positioned sink holds {} duplicated changes in {}",
            reduced.duplicates, table.name
        );
        assert_table_matches("positioned sink", expected, &table.name, &reduced.state);
    }
}

/// Checks every generator table of a Parquet-sink root against the oracle:
/// complete by key. Returns how many duplicated changes replays left behind.
pub fn assert_parquet_complete(root: &Path, expected: &ExpectedState) -> usize {
    let mut duplicates = 0;
    for table in shop_tables() {
        let reduced = reduce(&table, changes(&table, &read_parquet(root, &table.name)));
        duplicates += reduced.duplicates;
        assert_table_matches("parquet sink", expected, &table.name, &reduced.state);
    }
    duplicates
}
