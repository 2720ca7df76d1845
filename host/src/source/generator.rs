//! The built-in deterministic generator: an OLTP-like shop (customers, orders
//! and their items) whose change stream depends on nothing but a seed.
//!
//! It is the quickstart's default source and the test suite's source of
//! truth, so the same seed must give the same stream on every machine, in
//! every build and from every resume position. Hence:
//!
//! - The stream's *shape* (which rows change, and how) comes from a small
//!   simulation of the shop driven by one SplitMix64 stream. SplitMix64 is
//!   written out here rather than taken from `rand` so that a dependency
//!   upgrade can never change the stream.
//! - A row's *values* are a pure function of the seed, its key, the position
//!   of the write and the few facts the simulation tracks (an order's
//!   customer, status and placing transaction). Skipping ahead on resume and
//!   computing the final state therefore only run the cheap simulation and
//!   materialize just the rows they need.

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_schema::{DataType, TimeUnit};

use super::{Source, SourceError};
use crate::change::{Change, Column, Op, TableSchema, Transaction, Value};
use crate::position::{PHASE_STREAM, Position};

pub const CUSTOMERS: &str = "shop.customers";
pub const ORDERS: &str = "shop.orders";
pub const ORDER_ITEMS: &str = "shop.order_items";

/// Key spaces are small so that updates and deletes hit existing rows often,
/// and deleted keys come back.
const CUSTOMER_KEYS: u32 = 1_000;
const ORDER_KEYS: u32 = 3_000;
const MAX_LINES: u8 = 5;
const MAX_TX_CHANGES: usize = 6;
/// 2024-01-01T00:00:00Z; transaction `n` commits `n` milliseconds later.
const BASE_COMMIT_MICROS: i64 = 1_704_067_200_000_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratorConfig {
    pub seed: u64,
    /// Stop after the transaction that reaches this many changes; None = endless.
    pub max_changes: Option<u64>,
}

pub struct Generator {
    config: GeneratorConfig,
    tables: ShopTables,
    sim: Simulator,
    /// Set by `resume_after` until the first transaction past it is emitted.
    after: Option<Position>,
    /// The last position emitted: the head of an endless stream.
    last: Option<Position>,
    /// The final position of a bounded stream, found by simulating it once.
    bounded_head: OnceCell<Option<Position>>,
}

impl Generator {
    pub fn new(config: GeneratorConfig) -> Generator {
        Generator {
            sim: Simulator::new(config.seed),
            config,
            tables: ShopTables::new(),
            after: None,
            last: None,
            bounded_head: OnceCell::new(),
        }
    }

    fn exhausted(&self) -> bool {
        self.config
            .max_changes
            .is_some_and(|max| self.sim.total >= max)
    }
}

impl Source for Generator {
    fn tables(&self) -> Vec<Arc<TableSchema>> {
        self.tables.all()
    }

    fn resume_after(&mut self, after: Option<&Position>) -> Result<(), SourceError> {
        // Positions from a later phase than streaming would make an endless
        // generator skip forever.
        if let Some(first) = after.and_then(|p| p.as_bytes().first())
            && *first > PHASE_STREAM
        {
            return Err(SourceError::Resume {
                position: after.cloned().unwrap_or_default(),
                reason: "not a position of the generator".into(),
            });
        }
        self.sim = Simulator::new(self.config.seed);
        self.after = after.cloned();
        Ok(())
    }

    fn next_transaction(&mut self) -> Result<Option<Transaction>, SourceError> {
        loop {
            if self.exhausted() {
                return Ok(None);
            }
            let tx = self.sim.step();
            let count = self.sim.plan.len() as u32;
            let end = Position::stream(tx, count - 1);
            let first = match &self.after {
                Some(after) if end <= *after => continue,
                Some(after) => (0..count)
                    .find(|&ordinal| Position::stream(tx, ordinal) > *after)
                    .unwrap_or(0),
                None => 0,
            };
            self.after = None;
            let changes = (first..count)
                .map(|ordinal| {
                    let planned = &self.sim.plan[ordinal as usize];
                    self.tables.change(self.config.seed, planned, tx, ordinal)
                })
                .collect();
            self.last = Some(end.clone());
            return Ok(Some(Transaction { changes, end }));
        }
    }

    fn head(&self) -> Option<Position> {
        let Some(max) = self.config.max_changes else {
            return self.last.clone();
        };
        self.bounded_head
            .get_or_init(|| {
                let mut sim = Simulator::new(self.config.seed);
                while sim.total < max {
                    sim.step();
                }
                (sim.tx > 0).then(|| Position::stream(sim.tx, sim.plan.len() as u32 - 1))
            })
            .clone()
    }

    fn acknowledge(&mut self, _pos: &Position) -> Result<(), SourceError> {
        Ok(())
    }
}

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

/// What a destination should hold: table name -> key -> full row (values in
/// the table's column order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpectedState {
    pub tables: BTreeMap<String, BTreeMap<Vec<KeyPart>, Vec<Value>>>,
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

    /// Applies one change as an upsert sink would: deletes remove the key,
    /// everything else replaces the row. Panics on a null or float key.
    pub fn apply(&mut self, change: &Change) {
        let key = row_key(&change.table, &change.values);
        let rows = self.tables.entry(change.table.name.clone()).or_default();
        match change.op {
            Op::Delete => rows.remove(&key),
            _ => rows.insert(key, change.values.clone()),
        };
    }

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

fn row_key(table: &TableSchema, values: &[Value]) -> Vec<KeyPart> {
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

/// The contents of every table after the whole bounded stream `(seed, max_changes)`.
pub fn expected_state(seed: u64, max_changes: u64) -> ExpectedState {
    let mut sim = Simulator::new(seed);
    while sim.total < max_changes {
        sim.step();
    }
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

// ---------------------------------------------------------------- schemas

struct ShopTables {
    customers: Arc<TableSchema>,
    orders: Arc<TableSchema>,
    items: Arc<TableSchema>,
}

impl ShopTables {
    fn new() -> Self {
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some(crate::change::UTC_ZONE.into()));
        let table = |name: &str, columns: Vec<(&str, DataType, bool)>, key: Vec<usize>| {
            let columns = columns
                .into_iter()
                .map(|(name, data_type, nullable)| Column {
                    name: name.into(),
                    data_type,
                    nullable,
                })
                .collect();
            Arc::new(TableSchema {
                name: name.into(),
                columns,
                key,
            })
        };
        ShopTables {
            customers: table(
                CUSTOMERS,
                vec![
                    ("id", DataType::Int64, false),
                    ("name", DataType::Utf8, false),
                    ("email", DataType::Utf8, true),
                    ("tier", DataType::Utf8, true),
                    ("balance", DataType::Decimal128(12, 2), true),
                    ("active", DataType::Boolean, false),
                    ("signup_date", DataType::Date32, false),
                    ("updated_at", utc, false),
                ],
                vec![0],
            ),
            orders: table(
                ORDERS,
                vec![
                    ("id", DataType::Int64, false),
                    ("customer_id", DataType::Int64, false),
                    ("status", DataType::Utf8, false),
                    ("amount", DataType::Float64, false),
                    ("note", DataType::Utf8, true),
                    (
                        "placed_at",
                        DataType::Timestamp(TimeUnit::Microsecond, None),
                        false,
                    ),
                    ("payload", DataType::Binary, true),
                ],
                vec![0],
            ),
            items: table(
                ORDER_ITEMS,
                vec![
                    ("order_id", DataType::Int64, false),
                    ("line", DataType::Int32, false),
                    ("sku", DataType::Utf8, false),
                    ("qty", DataType::Int32, false),
                    ("unit_price", DataType::Decimal128(10, 2), false),
                ],
                vec![0, 1],
            ),
        }
    }

    fn all(&self) -> Vec<Arc<TableSchema>> {
        vec![
            self.customers.clone(),
            self.orders.clone(),
            self.items.clone(),
        ]
    }

    fn change(&self, seed: u64, planned: &Planned, tx: u64, ordinal: u32) -> Change {
        let table = match planned.table {
            Table::Customers => &self.customers,
            Table::Orders => &self.orders,
            Table::Items => &self.items,
        };
        Change {
            table: table.clone(),
            op: planned.op,
            pos: Position::stream(tx, ordinal),
            commit_ts_micros: commit_ts(tx),
            snapshot: false,
            values: row(seed, planned, Write { tx, ordinal }),
        }
    }
}

fn commit_ts(tx: u64) -> i64 {
    BASE_COMMIT_MICROS + tx as i64 * 1_000
}

// ----------------------------------------------------------------- values

const FIRST_NAMES: &[&str] = &[
    "Ada",
    "Zoë",
    "José",
    "Łukasz",
    "Søren",
    "Aoife",
    "Mei",
    "Иван",
    "Fatima",
    "Ngozi",
    "Björk",
    "Ana-María",
    "Siobhán",
    "Kenji",
    "Noor",
    "Émile",
];
const LAST_NAMES: &[&str] = &[
    "Lovelace",
    "Ångström",
    "Núñez",
    "Wójcik",
    "O'Brien",
    "Nguyễn",
    "李",
    "Петрова",
    "Al-Hassan",
    "Okafor",
    "Guðmundsdóttir",
    "Müller",
    "Tanaka",
    "van der Berg",
    "Smith",
    "🦀 Crab",
];
const DOMAINS: &[&str] = &["example.com", "example.org", "exämple.de", "例え.jp"];
const TIERS: &[&str] = &["bronze", "silver", "gold", "platinum"];
const STATUSES: &[&str] = &[
    "pending",
    "paid",
    "shipped",
    "delivered",
    "cancelled",
    "refunded",
];
const PENDING: u8 = 0;
const PAID: u8 = 1;
const SHIPPED: u8 = 2;
const DELIVERED: u8 = 3;
const CANCELLED: u8 = 4;
const REFUNDED: u8 = 5;
const NOTES: &[&str] = &[
    "",
    "leave at the door 🚪",
    "Größe: XL",
    "gift wrap, please",
    "配達前に電話してください",
    "line one\nline two",
    "quote \"this\", then 'that'",
    "tab\tseparated",
    "  padded  ",
];
const SKU_PREFIXES: &[&str] = &["SKU", "ÄPFEL", "BOOK", "TEE", "ЧАЙ", "MUG"];
/// The largest unscaled values of Decimal128(12, 2) and Decimal128(10, 2).
const MAX_BALANCE: i128 = 999_999_999_999;
const MAX_UNIT_PRICE: i128 = 9_999_999_999;

/// The values of one written row: a pure function of the seed, the planned
/// write and where it happened, so the final state can be recomputed
/// without replaying every write.
fn row(seed: u64, planned: &Planned, at: Write) -> Vec<Value> {
    use Value::*;
    let id = Int64(planned.id.into());
    let table = planned.table as u64;
    let deleted = |key: Vec<Value>, columns: usize| {
        let nulls = columns - key.len();
        key.into_iter()
            .chain(std::iter::repeat_n(Null, nulls))
            .collect()
    };
    // Facts about the key that survive updates (a customer keeps their name).
    let mut stable = SplitMix64::new(mix(&[seed, table, planned.id.into(), planned.line.into()]));
    let mut rng = SplitMix64::new(mix(&[
        seed,
        table,
        planned.id.into(),
        planned.line.into(),
        at.tx,
        at.ordinal.into(),
    ]));
    match (planned.table, planned.op) {
        (Table::Customers, Op::Delete) => deleted(vec![id], 8),
        (Table::Orders, Op::Delete) => deleted(vec![id], 7),
        (Table::Items, Op::Delete) => deleted(vec![id, Int32(planned.line.into())], 5),
        (Table::Customers, _) => {
            let first = stable.pick(FIRST_NAMES);
            let last = stable.pick(LAST_NAMES);
            let domain = stable.pick(DOMAINS);
            let signup_days = if stable.chance(3) {
                -(stable.below(20_000) as i32) // before 1970
            } else {
                15_000 + stable.below(5_000) as i32
            };
            let email = if rng.chance(15) {
                Null
            } else {
                Utf8(format!("{}.{}@{domain}", first.to_lowercase(), planned.id))
            };
            let tier = if rng.chance(30) {
                Null
            } else {
                Utf8(rng.pick(TIERS).to_string())
            };
            let balance = match rng.below(100) {
                0..20 => Null,
                20 => Decimal128(MAX_BALANCE),
                21 => Decimal128(-MAX_BALANCE),
                _ => Decimal128(rng.below(30_000_000) as i128 - 5_000_000),
            };
            vec![
                id,
                Utf8(format!("{first} {last}")),
                email,
                tier,
                balance,
                Bool(!rng.chance(15)),
                Date32(signup_days),
                TimestampMicros(commit_ts(at.tx)),
            ]
        }
        (Table::Orders, _) => {
            let order = planned.order;
            let cents = 100 + rng.below(500_000) as i64;
            let cents = if order.status == REFUNDED {
                -cents
            } else {
                cents
            };
            let note = if rng.chance(60) {
                Null
            } else {
                Utf8(rng.pick(NOTES).to_string())
            };
            let payload = if rng.chance(50) {
                Null
            } else {
                Binary((0..rng.below(25)).map(|_| rng.next() as u8).collect())
            };
            vec![
                id,
                Int64(order.customer.into()),
                Utf8(STATUSES[order.status as usize].to_string()),
                Float64(cents as f64 / 100.0),
                note,
                TimestampMicros(commit_ts(order.placed_tx)),
                payload,
            ]
        }
        (Table::Items, _) => {
            let sku = format!("{}-{:05}", stable.pick(SKU_PREFIXES), stable.below(100_000));
            let qty = match rng.below(100) {
                0..5 => -1 - rng.below(3) as i32, // a return
                5..7 => 0,
                _ => 1 + rng.below(12) as i32,
            };
            let unit_price = match rng.below(100) {
                0..3 => 0,
                3..6 => -(rng.below(10_000) as i128), // a discount line
                6 => MAX_UNIT_PRICE,
                _ => 1 + rng.below(99_999) as i128,
            };
            vec![
                id,
                Int32(planned.line.into()),
                Utf8(sku),
                Int32(qty),
                Decimal128(unit_price),
            ]
        }
    }
}

// ------------------------------------------------------------- simulation

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Table {
    Customers = 1,
    Orders = 2,
    Items = 3,
}

/// Where a row was last written.
#[derive(Clone, Copy, Debug, Default)]
struct Write {
    tx: u64,
    ordinal: u32,
}

/// What the simulation remembers about an order beyond its key.
#[derive(Clone, Copy, Debug, Default)]
struct OrderRow {
    customer: u32,
    status: u8,
    lines: u8,
    placed_tx: u64,
}

/// One change of the transaction being simulated; `order` is the order's
/// state right after this change (orders only).
#[derive(Clone, Copy, Debug)]
struct Planned {
    table: Table,
    op: Op,
    id: u32,
    line: u8,
    order: OrderRow,
}

fn item_slot(order: u32, line: u8) -> usize {
    (order as usize - 1) * MAX_LINES as usize + (line as usize - 1)
}

/// Keys `1..=capacity`, kept in one array partitioned into live keys, deleted
/// keys (used before) and never-used keys, with each key's index alongside:
/// picking a random key of a region and moving a key between regions are O(1).
struct KeySpace {
    keys: Vec<u32>,
    index: Vec<u32>,
    live: usize,
    used: usize,
}

impl KeySpace {
    fn new(capacity: u32) -> Self {
        KeySpace {
            keys: (1..=capacity).collect(),
            index: (0..=capacity).map(|k| k.saturating_sub(1)).collect(),
            live: 0,
            used: 0,
        }
    }

    fn live(&self) -> &[u32] {
        &self.keys[..self.live]
    }

    fn is_live(&self, key: u32) -> bool {
        (self.index[key as usize] as usize) < self.live
    }

    fn random_live(&self, rng: &mut SplitMix64) -> Option<u32> {
        (self.live > 0).then(|| self.keys[rng.below(self.live as u64) as usize])
    }

    /// True with probability live / capacity.
    fn crowded(&self, rng: &mut SplitMix64) -> bool {
        rng.below(self.keys.len() as u64) < self.live as u64
    }

    /// A key that is not live: usually the next never-used one (like a
    /// sequence), sometimes a deleted one coming back.
    fn insertable(&self, rng: &mut SplitMix64) -> Option<u32> {
        let deleted = self.used - self.live;
        let fresh = self.keys.len() - self.used;
        if deleted > 0 && (fresh == 0 || rng.chance(30)) {
            Some(self.keys[self.live + rng.below(deleted as u64) as usize])
        } else {
            (fresh > 0).then(|| self.keys[self.used])
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.keys.swap(a, b);
        self.index[self.keys[a] as usize] = a as u32;
        self.index[self.keys[b] as usize] = b as u32;
    }

    fn insert(&mut self, key: u32) {
        let at = self.index[key as usize] as usize;
        debug_assert!(at >= self.live, "key {key} is already live");
        if at >= self.used {
            self.swap(at, self.used);
            self.used += 1;
        }
        self.swap(self.index[key as usize] as usize, self.live);
        self.live += 1;
    }

    fn delete(&mut self, key: u32) {
        let at = self.index[key as usize] as usize;
        debug_assert!(at < self.live, "key {key} is not live");
        self.swap(at, self.live - 1);
        self.live -= 1;
    }
}

struct Shop {
    customers: KeySpace,
    orders: KeySpace,
    order_rows: Vec<OrderRow>,
    customer_writes: Vec<Write>,
    order_writes: Vec<Write>,
    item_writes: Vec<Write>,
}

/// Plays the shop forward one transaction at a time, recording only the
/// shape of each change.
struct Simulator {
    rng: SplitMix64,
    shop: Shop,
    /// Number of the last simulated transaction (0 before the first).
    tx: u64,
    /// Changes simulated so far, including those of `plan`.
    total: u64,
    /// The last simulated transaction.
    plan: Vec<Planned>,
}

impl Simulator {
    fn new(seed: u64) -> Self {
        Simulator {
            rng: SplitMix64::new(mix(&[seed, 0x5107])),
            shop: Shop {
                customers: KeySpace::new(CUSTOMER_KEYS),
                orders: KeySpace::new(ORDER_KEYS),
                order_rows: vec![OrderRow::default(); ORDER_KEYS as usize + 1],
                customer_writes: vec![Write::default(); CUSTOMER_KEYS as usize + 1],
                order_writes: vec![Write::default(); ORDER_KEYS as usize + 1],
                item_writes: vec![Write::default(); ORDER_KEYS as usize * MAX_LINES as usize],
            },
            tx: 0,
            total: 0,
            plan: Vec::with_capacity(MAX_TX_CHANGES),
        }
    }

    /// Simulates the next transaction into `plan` (1..=6 changes) and returns its number.
    fn step(&mut self) -> u64 {
        self.tx += 1;
        self.plan.clear();
        // Growth turns into pruning as a table fills up, so the tables hover
        // well below capacity and inserts, deletes and re-inserts keep coming
        // however long the stream runs.
        match self.rng.below(100) {
            0..25 if self.shop.orders.crowded(&mut self.rng) => self.delete_order(),
            0..25 => self.new_order(),
            25..45 => self.progress_order(),
            45..55 if self.shop.customers.crowded(&mut self.rng) => self.delete_customer(),
            45..55 => self.signup(),
            55..70 => self.update_customers(),
            70..83 => self.change_items(),
            83..91 => self.delete_order(),
            91..95 => self.delete_customer(),
            _ => self.mixed(),
        }
        if self.plan.is_empty() {
            // The chosen story had nothing to act on; a customer can always change.
            self.touch_customer();
        }
        debug_assert!((1..=MAX_TX_CHANGES).contains(&self.plan.len()));
        self.total += self.plan.len() as u64;
        self.tx
    }

    fn emit(&mut self, table: Table, op: Op, id: u32, line: u8) {
        let at = Write {
            tx: self.tx,
            ordinal: self.plan.len() as u32,
        };
        let shop = &mut self.shop;
        let mut order = OrderRow::default();
        match table {
            Table::Customers => shop.customer_writes[id as usize] = at,
            Table::Orders => {
                shop.order_writes[id as usize] = at;
                order = shop.order_rows[id as usize];
            }
            Table::Items => shop.item_writes[item_slot(id, line)] = at,
        }
        self.plan.push(Planned {
            table,
            op,
            id,
            line,
            order,
        });
    }

    fn random_order(&mut self) -> Option<u32> {
        self.shop.orders.random_live(&mut self.rng)
    }

    fn insert_customer(&mut self) -> Option<u32> {
        let id = self.shop.customers.insertable(&mut self.rng)?;
        self.shop.customers.insert(id);
        self.emit(Table::Customers, Op::Insert, id, 0);
        Some(id)
    }

    /// Updates a random customer, or signs one up if there is none.
    fn touch_customer(&mut self) {
        match self.shop.customers.random_live(&mut self.rng) {
            Some(id) => self.emit(Table::Customers, Op::Update, id, 0),
            None => {
                self.insert_customer();
            }
        }
    }

    fn add_line(&mut self, order: u32) {
        let row = &mut self.shop.order_rows[order as usize];
        row.lines += 1;
        let line = row.lines;
        self.emit(Table::Items, Op::Insert, order, line);
    }

    fn update_random_line(&mut self, order: u32) {
        let lines = self.shop.order_rows[order as usize].lines;
        if lines > 0 {
            let line = 1 + self.rng.below(lines.into()) as u8;
            self.emit(Table::Items, Op::Update, order, line);
        }
    }

    fn advance_status(&mut self, order: u32) {
        let row = &mut self.shop.order_rows[order as usize];
        row.status = match row.status {
            PENDING | PAID if self.rng.chance(10) => CANCELLED,
            status @ (PENDING | PAID | SHIPPED) => status + 1,
            DELIVERED if self.rng.chance(20) => REFUNDED,
            final_status => final_status, // only the note and amount change
        };
        self.emit(Table::Orders, Op::Update, order, 0);
    }

    /// A new order with its items, sometimes from a customer signing up in the same transaction.
    fn new_order(&mut self) {
        let Some(order) = self.shop.orders.insertable(&mut self.rng) else {
            return;
        };
        let existing = self.shop.customers.random_live(&mut self.rng);
        let customer = match existing {
            Some(id) if !self.rng.chance(15) => id,
            _ => match self.insert_customer().or(existing) {
                Some(id) => id,
                None => return,
            },
        };
        self.shop.orders.insert(order);
        self.shop.order_rows[order as usize] = OrderRow {
            customer,
            status: PENDING,
            lines: 0,
            placed_tx: self.tx,
        };
        self.emit(Table::Orders, Op::Insert, order, 0);
        let room = (MAX_TX_CHANGES - self.plan.len()).min(MAX_LINES.into());
        for _ in 0..=self.rng.below(room as u64) {
            self.add_line(order);
        }
    }

    /// An order moves on, often together with a change to its customer.
    fn progress_order(&mut self) {
        let Some(order) = self.random_order() else {
            return;
        };
        let customer = self.shop.order_rows[order as usize].customer;
        if self.shop.customers.is_live(customer) && self.rng.chance(50) {
            self.emit(Table::Customers, Op::Update, customer, 0);
        }
        self.advance_status(order);
    }

    fn signup(&mut self) {
        for _ in 0..=self.rng.below(2) {
            self.insert_customer();
        }
    }

    /// Several customer updates, sometimes to the same customer twice.
    fn update_customers(&mut self) {
        for _ in 0..=self.rng.below(3) {
            if let Some(id) = self.shop.customers.random_live(&mut self.rng) {
                self.emit(Table::Customers, Op::Update, id, 0);
            }
        }
    }

    /// An item is added, removed or changed, and the order's amount often follows.
    fn change_items(&mut self) {
        let Some(order) = self.random_order() else {
            return;
        };
        let lines = self.shop.order_rows[order as usize].lines;
        if lines == 0 || (lines < MAX_LINES && self.rng.chance(40)) {
            self.add_line(order);
        } else if self.rng.chance(30) {
            self.emit(Table::Items, Op::Delete, order, lines);
            self.shop.order_rows[order as usize].lines -= 1;
        } else {
            self.update_random_line(order);
        }
        if self.rng.chance(50) {
            self.emit(Table::Orders, Op::Update, order, 0);
        }
    }

    /// An order is deleted together with its items.
    fn delete_order(&mut self) {
        let Some(order) = self.random_order() else {
            return;
        };
        for line in (1..=self.shop.order_rows[order as usize].lines).rev() {
            self.emit(Table::Items, Op::Delete, order, line);
        }
        self.shop.order_rows[order as usize].lines = 0;
        self.shop.orders.delete(order);
        self.emit(Table::Orders, Op::Delete, order, 0);
    }

    fn delete_customer(&mut self) {
        if let Some(id) = self.shop.customers.random_live(&mut self.rng) {
            self.shop.customers.delete(id);
            self.emit(Table::Customers, Op::Delete, id, 0);
        }
    }

    /// Unrelated single-row changes that happened to commit together.
    fn mixed(&mut self) {
        for _ in 0..2 + self.rng.below(4) {
            match self.rng.below(4) {
                0 => self.touch_customer(),
                1 => {
                    self.insert_customer();
                }
                2 => {
                    if let Some(order) = self.random_order() {
                        self.advance_status(order);
                    }
                }
                _ => {
                    if let Some(order) = self.random_order() {
                        self.update_random_line(order);
                    }
                }
            }
        }
    }
}

// -------------------------------------------------------------- randomness

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and fixed forever.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        finalize(self.0)
    }

    /// Uniform enough in `0..n` (n > 0), by widening multiplication.
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn mix(parts: &[u64]) -> u64 {
    parts.iter().fold(0x243F_6A88_85A3_08D3, |h, &p| {
        finalize(h ^ finalize(p.wrapping_add(0x9E37_79B9_7F4A_7C15)))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::time::Instant;

    use super::*;

    fn bounded(seed: u64, max_changes: u64) -> Generator {
        Generator::new(GeneratorConfig {
            seed,
            max_changes: Some(max_changes),
        })
    }

    fn transactions(generator: &mut Generator) -> Vec<Transaction> {
        std::iter::from_fn(|| generator.next_transaction().unwrap()).collect()
    }

    #[test]
    fn same_seed_same_stream() {
        let a: Vec<Change> = change_log(42, 2_000).collect();
        let b: Vec<Change> = change_log(42, 2_000).collect();
        assert_eq!(a, b);
        let c: Vec<Change> = change_log(43, 2_000).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn stream_shape() {
        let txs = transactions(&mut bounded(1, 1_000));
        let total: usize = txs.iter().map(|tx| tx.changes.len()).sum();
        // Transactions are never cut: the last one may pass the count.
        assert!((1_000..1_000 + MAX_TX_CHANGES).contains(&total), "{total}");
        let mut previous = Position::default();
        for (n, tx) in txs.iter().enumerate() {
            assert!((1..=MAX_TX_CHANGES).contains(&tx.changes.len()));
            assert_eq!(tx.end, tx.changes.last().unwrap().pos);
            for (ordinal, change) in tx.changes.iter().enumerate() {
                assert_eq!(change.pos, Position::stream(n as u64 + 1, ordinal as u32));
                assert!(change.pos > previous);
                previous = change.pos.clone();
                assert_eq!(
                    change.commit_ts_micros,
                    BASE_COMMIT_MICROS + (n as i64 + 1) * 1_000
                );
                assert!(!change.snapshot);
                assert_eq!(change.values.len(), change.table.columns.len());
            }
        }
        // The stream without a bound goes on with the very same transactions.
        let mut endless = Generator::new(GeneratorConfig {
            seed: 1,
            max_changes: None,
        });
        for tx in &txs {
            assert_eq!(
                endless.next_transaction().unwrap().unwrap().changes,
                tx.changes
            );
        }
        assert_eq!(endless.head(), txs.last().map(|tx| tx.end.clone()));
        assert!(endless.next_transaction().unwrap().is_some());
    }

    #[test]
    fn resume_from_every_position_yields_the_suffix() {
        let log: Vec<Change> = change_log(7, 300).collect();
        for (i, change) in log.iter().enumerate() {
            let mut generator = bounded(7, 300);
            generator.resume_after(Some(&change.pos)).unwrap();
            let txs = transactions(&mut generator);
            if let Some(first) = txs.first() {
                // A resume inside a transaction gets the rest of it, not a new one.
                let (tx, _) = change.pos.as_stream().unwrap();
                let (first_tx, _) = first.changes[0].pos.as_stream().unwrap();
                let rest_of_tx = log[i + 1..]
                    .iter()
                    .take_while(|c| c.pos.as_stream().unwrap().0 == tx);
                if rest_of_tx.clone().count() > 0 {
                    assert_eq!(first_tx, tx);
                    assert_eq!(first.changes.len(), rest_of_tx.count());
                } else {
                    assert_eq!(first_tx, tx + 1);
                }
            }
            let resumed: Vec<Change> = txs.into_iter().flat_map(|tx| tx.changes).collect();
            assert_eq!(resumed, log[i + 1..], "resume after {}", change.pos);
        }
        let mut generator = bounded(7, 300);
        generator.resume_after(None).unwrap();
        assert_eq!(
            transactions(&mut generator)
                .into_iter()
                .flat_map(|tx| tx.changes)
                .count(),
            log.len()
        );
        let mut generator = bounded(7, 300);
        generator
            .resume_after(Some(&Position::from_bytes(vec![0x00, 0xff])))
            .unwrap();
        assert_eq!(
            transactions(&mut generator).len(),
            transactions(&mut bounded(7, 300)).len()
        );
        let beyond = Position::from_bytes(vec![PHASE_STREAM + 1]);
        assert!(matches!(
            bounded(7, 300).resume_after(Some(&beyond)),
            Err(SourceError::Resume { .. })
        ));
    }

    #[test]
    fn head_is_the_final_change() {
        let generator = bounded(9, 500);
        let last = change_log(9, 500).last().unwrap();
        assert_eq!(generator.head(), Some(last.pos));
        assert_eq!(bounded(9, 0).head(), None);
        assert!(transactions(&mut bounded(9, 0)).is_empty());
    }

    #[test]
    fn expected_state_is_the_applied_change_log() {
        for (seed, max) in [(3, 1), (3, 300), (11, 20_000), (12, 150_000)] {
            let mut applied = ExpectedState::with_tables(&ShopTables::new().all());
            for change in change_log(seed, max) {
                applied.apply(&change);
            }
            let expected = expected_state(seed, max);
            assert_eq!(expected.tables.len(), 3);
            assert_eq!(expected, applied, "seed {seed}, {max} changes");
        }
    }

    #[test]
    fn updates_and_deletes_only_touch_live_keys() {
        let mut live: HashMap<&str, HashSet<Vec<KeyPart>>> = HashMap::new();
        let mut reinserted = HashSet::new();
        let mut deleted: HashMap<&str, HashSet<Vec<KeyPart>>> = HashMap::new();
        let log: Vec<Change> = change_log(5, 50_000).collect();
        for change in &log {
            let key = row_key(&change.table, &change.values);
            let name = change.table.name.as_str();
            let keys = live.entry(name).or_default();
            match change.op {
                Op::Insert => {
                    assert!(
                        keys.insert(key.clone()),
                        "{name} insert of live key {key:?}"
                    );
                    if deleted.entry(name).or_default().contains(&key) {
                        reinserted.insert(name);
                    }
                }
                Op::Update => assert!(keys.contains(&key), "{name} update of missing key {key:?}"),
                Op::Delete => {
                    assert!(keys.remove(&key), "{name} delete of missing key {key:?}");
                    deleted.entry(name).or_default().insert(key);
                }
                Op::Read => panic!("the generator does not snapshot"),
            }
        }
        assert_eq!(reinserted.len(), 3, "deleted keys come back in every table");
    }

    #[test]
    fn small_stream_exercises_everything() {
        let txs = transactions(&mut bounded(2, 300));
        let changes: Vec<&Change> = txs.iter().flat_map(|tx| &tx.changes).collect();
        for table in [CUSTOMERS, ORDERS, ORDER_ITEMS] {
            for op in [Op::Insert, Op::Update, Op::Delete] {
                assert!(
                    changes.iter().any(|c| c.table.name == table && c.op == op),
                    "no {op:?} in {table}"
                );
            }
        }
        let spanning = txs
            .iter()
            .filter(|tx| {
                tx.changes
                    .iter()
                    .map(|c| &c.table.name)
                    .collect::<HashSet<_>>()
                    .len()
                    > 1
            })
            .count();
        assert!(spanning > 10, "{spanning} multi-table transactions");
        let deletes_carry_keys_only = changes.iter().filter(|c| c.op == Op::Delete).all(|c| {
            c.values
                .iter()
                .enumerate()
                .all(|(i, v)| c.table.key.contains(&i) != (*v == Value::Null))
        });
        assert!(deletes_carry_keys_only);

        // Nulls in every nullable column of live rows, and no null where the schema forbids it.
        let live: Vec<&Change> = changes
            .iter()
            .copied()
            .filter(|c| c.op != Op::Delete)
            .collect();
        for table in ShopTables::new().all() {
            for (i, column) in table.columns.iter().enumerate() {
                let nulls = live
                    .iter()
                    .filter(|c| c.table.name == table.name && c.values[i] == Value::Null)
                    .count();
                assert_eq!(column.nullable, nulls > 0, "{}.{}", table.name, column.name);
            }
        }
        let text = |c: &&Change| {
            c.values
                .iter()
                .any(|v| matches!(v, Value::Utf8(s) if !s.is_ascii()))
        };
        assert!(live.iter().any(text), "unicode text");
        assert!(
            live.iter().any(|c| c
                .values
                .iter()
                .any(|v| matches!(v, Value::Decimal128(d) if *d < 0))),
            "negative decimals"
        );
    }

    #[test]
    fn a_million_changes_simulate_quickly() {
        let started = Instant::now();
        let state = expected_state(1, 1_000_000);
        let elapsed = started.elapsed();
        eprintln!(
            "expected_state(1, 1_000_000): {elapsed:?}, {} rows",
            state.rows()
        );
        assert!(state.tables.values().all(|rows| !rows.is_empty()));
    }
}
