//! The test oracle: what a destination must hold after the generator's
//! stream, computed without running a pipeline. Only tests need it, so it is
//! compiled for this crate's tests and behind the `test-support` feature
//! (which the `weir-test-support` crate turns on), never into the binary.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::schema::ShopTables;
use super::simulator::{OrderRow, Planned, Simulator, Table, item_slot};
use super::values::row;
use super::{Generator, GeneratorConfig};
use crate::Source;
use crate::change::{Change, Op, TableSchema, Value};

/// Every change of the bounded stream `(seed, max_changes)`, in order.
pub fn change_log(seed: u64, max_changes: u64) -> impl Iterator<Item = Change> {
    let mut generator = Generator::new(GeneratorConfig {
        seed,
        max_changes: Some(max_changes),
    });
    std::iter::from_fn(move || {
        generator
            .next_transaction()
            .expect("the generator cannot fail")
    })
    .flat_map(|tx| tx.changes)
}

/// The generator's tables, as its source reports them.
pub fn shop_tables() -> Vec<Arc<TableSchema>> {
    ShopTables::new().all()
}

/// One part of a row key, ordered like the value it came from. Keys of
/// [`ExpectedState`] are the key columns' values in key order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyPart {
    Bool(bool),
    Int32(i32),
    Int64(i64),
    Decimal128(i128),
    Utf8(String),
    Binary(Vec<u8>),
    Date32(i32),
    TimestampMicros(i64),
}

impl KeyPart {
    /// None for values that cannot identify a row (null, floats).
    pub fn from_value(value: &Value) -> Option<KeyPart> {
        Some(match value {
            Value::Bool(v) => KeyPart::Bool(*v),
            Value::Int32(v) => KeyPart::Int32(*v),
            Value::Int64(v) => KeyPart::Int64(*v),
            Value::Decimal128(v) => KeyPart::Decimal128(*v),
            Value::Utf8(v) => KeyPart::Utf8(v.clone()),
            Value::Binary(v) => KeyPart::Binary(v.clone()),
            Value::Date32(v) => KeyPart::Date32(*v),
            Value::TimestampMicros(v) => KeyPart::TimestampMicros(*v),
            Value::Null | Value::Float64(_) | Value::List(_) => return None,
        })
    }
}

/// The key of a row of `table`: its key columns' values in key order.
/// Panics on a null or float key, which no source may produce.
pub fn row_key(table: &TableSchema, values: &[Value]) -> Vec<KeyPart> {
    table
        .key
        .iter()
        .map(|&i| {
            KeyPart::from_value(&values[i]).unwrap_or_else(|| {
                panic!(
                    "{}: key value {:?} cannot identify a row",
                    table.name, values[i]
                )
            })
        })
        .collect()
}

/// One table's rows by key; `R` is what is kept per key (the row's values,
/// or anything derived from them).
pub type Rows<R = Vec<Value>> = BTreeMap<Vec<KeyPart>, R>;

/// The reducer every test uses: applies one change to a table's rows as an
/// upsert sink must. A delete removes the key (a missing key is fine),
/// anything else replaces the row. Applying a change log in position order
/// gives the table's final rows.
pub fn apply_change<R>(rows: &mut Rows<R>, key: Vec<KeyPart>, op: Op, row: R) {
    match op {
        Op::Delete => rows.remove(&key),
        Op::Insert | Op::Update | Op::Read => rows.insert(key, row),
    };
}

/// What a destination should hold: table name -> key -> full row (values in
/// the table's column order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpectedState {
    pub tables: BTreeMap<String, Rows>,
}

impl ExpectedState {
    /// An empty state listing `tables`, so that an emptied table still compares.
    pub fn with_tables(tables: &[Arc<TableSchema>]) -> Self {
        let tables = tables
            .iter()
            .map(|t| (t.name.clone(), BTreeMap::new()))
            .collect();
        ExpectedState { tables }
    }

    /// Applies one change with [`apply_change`]. Panics on a null or float key.
    pub fn apply(&mut self, change: &Change) {
        let rows = self.tables.entry(change.table.name.clone()).or_default();
        let key = row_key(&change.table, &change.values);
        apply_change(rows, key, change.op, change.values.clone());
    }

    /// How many rows all tables hold together.
    pub fn rows(&self) -> usize {
        self.tables.values().map(BTreeMap::len).sum()
    }

    fn put(&mut self, table: &TableSchema, values: Vec<Value>) {
        let key = row_key(table, &values);
        self.tables
            .entry(table.name.clone())
            .or_default()
            .insert(key, values);
    }
}

/// The contents of every table after the whole bounded stream `(seed,
/// max_changes)`. Only the simulation runs over the whole stream; values are
/// computed for the rows still live at its end.
pub fn expected_state(seed: u64, max_changes: u64) -> ExpectedState {
    let mut sim = Simulator::new(seed);
    sim.run_to(max_changes);
    let tables = ShopTables::new();
    let mut state = ExpectedState::with_tables(&tables.all());
    let shop = &sim.shop;
    let current = |table, id, line, order| Planned {
        table,
        op: Op::Update,
        id,
        line,
        order,
    };
    for &id in shop.customers.live() {
        let planned = current(Table::Customers, id, 0, OrderRow::default());
        state.put(
            &tables.customers,
            row(seed, &planned, shop.customer_writes[id as usize]),
        );
    }
    for &id in shop.orders.live() {
        let order = shop.order_rows[id as usize];
        let planned = current(Table::Orders, id, 0, order);
        state.put(
            &tables.orders,
            row(seed, &planned, shop.order_writes[id as usize]),
        );
        for line in 1..=order.lines {
            let planned = current(Table::Items, id, line, OrderRow::default());
            state.put(
                &tables.items,
                row(seed, &planned, shop.item_writes[item_slot(id, line)]),
            );
        }
    }
    state
}
